"""The float view of a quantized subgraph, which the OpenCL path runs (TFLite's GPU delegate does the same).

- Quantized constants (int8/uint8/int16 weights, and the int32 biases of convolutions and matrix
  products) are dequantized once, here, into float32 constants.
- Quantized activations become float32 tensors holding the real values ``scale * (q - zero_point)``.
  Graph inputs and outputs keep their integer type for the caller: the plan dequantizes inputs and
  quantizes outputs on the host (:attr:`FloatView.io`).
- QUANTIZE becomes a quantization simulator; DEQUANTIZE disappears (its producer writes the float
  tensor directly), or becomes an exact copy where that is not possible.
- After every op whose outputs are quantized, a *quantization simulator* (``QUANT_SIM``: round to the
  output's scale, add the zero point, clamp to the integer range, map back) makes the float values
  follow the integer model's grid, so results track the integer model rather than drift from it.
  Ops that only move values with equal input/output parameters (RESHAPE, MAX_POOL_2D, ...) need none.
  The simulators are elementwise ops: the fusion pass folds them into their producer's kernel. A simulator
  takes over its producer's fused activation (a RELU family clamp, ``movable_clamp``): the kernel's store
  then clamps once (``ops.quantization.SimGrid``).
- Ops with no float equivalent (CAST of quantized values reads the raw integers) keep their integer
  kernels, on the CPU, between a QUANTIZE and a DEQUANTIZE of their operands.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..model.ir import Operator, Quantization, Subgraph, Tensor
from ..ops.attributes import activation_bounds
from ..ops.quantization import QParams, SimGrid, dequantize_values, qparams
from ..ops.traits import traits

SIM = "QUANT_SIM"


@dataclass
class FloatView:
    sg: Subgraph
    io: dict[int, QParams]  # quantized graph inputs/outputs (and other host-side tensors): their parameters
    simulators: int = 0
    kept_integer: list[str] = field(default_factory=list)  # names of ops left on the integer kernels


def needs_float_view(sg: Subgraph) -> bool:
    return any(qparams(t) is not None for t in sg.tensors)


def sim_options(p: QParams | None, raw_mean: bool = False, clamp: tuple[float, float] | None = None) -> dict:
    """A simulator's options (none: an exact copy); the marker keeps a model's own custom op of that name out.
    ``raw_mean``: it rounds the stored integer (zero point included) half away from zero, as the integer kernel
    of the op before it does (``ops.traits``' ``rounds_raw_mean``), instead of the rescaled value half to even.
    ``clamp``: the bounds of the fused activation it took over from the op before it (``movable_clamp``)."""
    if p is None:
        return {"tflgpu_sim": True}
    return {"tflgpu_sim": True, "scale": float(p.s), "zero_point": int(p.z), "qmin": p.qmin, "qmax": p.qmax,
            **({"rounding": "raw_mean"} if raw_mean else {}), **({"clamp": clamp} if clamp is not None else {})}


def sim_grid(options: dict) -> SimGrid | None:
    """What a simulator with these options (``sim_options``) computes, where it rounds half to even; None for an
    exact copy or a raw mean's rounding."""
    if "scale" not in options or options.get("rounding") == "raw_mean":
        return None
    return SimGrid.of(options["scale"], options["zero_point"], options["qmin"], options["qmax"],
                      options.get("clamp"))


def movable_clamp(op: Operator, params: dict[int, QParams]) -> tuple[float, float] | None:
    """The bounds of ``op``'s fused activation where its one output is quantized and the simulator after it can
    apply them instead (``SimGrid``: one clamp in the kernel's store instead of two, the activation's and the
    grid's); None where the op keeps its activation."""
    if not traits(op.name).clamps_output or traits(op.name).rounds_raw_mean or len(op.outputs) != 1 \
            or op.outputs[0] not in params:
        return None
    bounds = activation_bounds(op.options.get("fused_activation_function", 0))
    if bounds == (-np.inf, np.inf):
        return None
    p = params[op.outputs[0]]
    return bounds if SimGrid.of(p.s, p.z, p.qmin, p.qmax, bounds) is not None else None


def float_view(sg: Subgraph) -> FloatView:
    tensors = list(sg.tensors)
    params: dict[int, QParams] = {}
    for t in sg.tensors:
        p = qparams(t)
        if p is None:
            continue
        if t.data is not None:
            tensors[t.index] = _float_tensor(t, dequantize_values(t.data, p))
        else:
            params[t.index] = p
            tensors[t.index] = _float_tensor(t, None)
    for op in sg.operators:  # int32 biases of quantized convolutions / matrix products
        b = traits(op.name).bias_input
        if b is None or len(op.inputs) <= b or op.inputs[b] < 0:
            continue
        t = tensors[op.inputs[b]]
        if t.data is not None and np.issubdtype(t.dtype, np.integer) and t.quantization is not None \
                and len(t.quantization.scales):
            data = np.asarray(t.data, np.float32).reshape(-1) * np.asarray(t.quantization.scales, np.float32)
            tensors[t.index] = _float_tensor(t, data.reshape(t.shape))

    view = FloatView(sg, dict(params))
    ops: list[Operator] = []

    def new_tensor(like: Tensor, dtype=np.float32, quant: QParams | None = None) -> int:
        idx = len(tensors)
        q = Quantization(quant.scale, quant.zero_point, quant.dim) if quant is not None else None
        tensors.append(replace(like, index=idx, name=f"{like.name}/float_view", dtype=np.dtype(dtype),
                               type_name=np.dtype(dtype).name.upper(), data=None, quantization=q))
        return idx

    def sim(src: int, dst: int, p: QParams | None, raw_mean: bool = False,
            clamp: tuple[float, float] | None = None) -> Operator:
        view.simulators += p is not None
        return Operator(0, SIM, -1, 1, (src,), (dst,), options=sim_options(p, raw_mean, clamp))

    merge: dict[int, int] = {}  # a DEQUANTIZE's input -> its output: the producer writes the float tensor
    graph_io = set(sg.inputs) | set(sg.outputs)
    for op in sg.operators:
        if op.name == "DEQUANTIZE" and op.inputs and op.inputs[0] in params and op.inputs[0] not in graph_io:
            merge[op.inputs[0]] = op.outputs[0]

    def m(t: int) -> int:
        return merge.get(t, t)

    for op in sg.operators:
        ins, outs = tuple(m(t) for t in op.inputs), tuple(m(t) for t in op.outputs)
        quant_outs = [t for t in op.outputs if t in params]
        if op.name == "DEQUANTIZE" and op.inputs and qparams(sg.tensors[op.inputs[0]]) is not None:
            if op.inputs[0] not in merge:
                ops.append(sim(ins[0], outs[0], None))  # an exact copy
            continue
        if op.name == "QUANTIZE" and quant_outs:
            ops.append(sim(ins[0], outs[0], params[op.outputs[0]]))
            continue
        if traits(op.name).raw_integers and any(t in params for t in op.inputs + op.outputs):
            ops.extend(_integer_island(op, ins, outs, params, tensors, new_tensor))
            view.kept_integer.append(op.name)
            continue
        if not quant_outs or _uniform(op, params):
            ops.append(replace(op, inputs=ins, outputs=outs))
            continue
        raw_outs, after = list(outs), []
        clamp = movable_clamp(op, params)
        for k, t in enumerate(op.outputs):
            if t in params:
                raw = new_tensor(tensors[t])
                raw_outs[k] = raw
                after.append(sim(raw, outs[k], params[t], traits(op.name).rounds_raw_mean, clamp))
        options = op.options if clamp is None else {**op.options, "fused_activation_function": 0}
        ops.append(replace(op, inputs=ins, outputs=tuple(raw_outs), options=options))
        ops.extend(after)
    ops = [replace(o, index=i) for i, o in enumerate(ops)]
    view.sg = replace(sg, tensors=tensors, operators=ops)
    return view


def _float_tensor(t: Tensor, data) -> Tensor:
    return replace(t, dtype=np.dtype(np.float32), type_name="FLOAT32", data=data, quantization=None)


def _uniform(op: Operator, params: dict) -> bool:
    """An op that only moves values, all of whose quantized operands share parameters: no simulator."""
    if not traits(op.name).keeps_quant_grid:
        return False
    ps = [params[t] for t in op.inputs + op.outputs if t in params]
    return all(p.same(ps[0]) for p in ps)


def _integer_island(op: Operator, ins, outs, params, tensors, new_tensor) -> list[Operator]:
    """``op`` on its integer kernel: QUANTIZE its quantized inputs, DEQUANTIZE its quantized outputs."""
    out: list[Operator] = []
    new_ins, new_outs, after = list(ins), list(outs), []
    for k, t in enumerate(op.inputs):
        if t in params:
            q = new_tensor(tensors[t], params[t].dtype, params[t])
            out.append(Operator(0, "QUANTIZE", 114, 1, (ins[k],), (q,)))
            new_ins[k] = q
    for k, t in enumerate(op.outputs):
        if t in params:
            q = new_tensor(tensors[t], params[t].dtype, params[t])
            after.append(Operator(0, "DEQUANTIZE", 6, 2, (q,), (outs[k],)))
            new_outs[k] = q
    return out + [replace(op, inputs=tuple(new_ins), outputs=tuple(new_outs))] + after
