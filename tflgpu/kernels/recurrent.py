"""UNIDIRECTIONAL_SEQUENCE_LSTM on the device: one launch for the whole sequence, or one per time step.

Work-item (b, u) computes unit u's four gates for batch b: the input and recurrent products, the
bias, then c = f*c + i*g (clipped), h = o*tanh(c). The previous h is read from the output sequence
itself (step t-1), so no ping-pong buffer is needed; c is updated in place (one work-item per unit).
With ``sequence`` (LstmKnobs) one work-group per batch row runs every step, a barrier between steps (c stays
in a register): one launch instead of one per step, where a small LSTM's launches cost more than its math.
The state tensors are variables the kernels update, so state carries over between invokes as on the CPU
path (the executor keeps them on the device and moves them only when the host reads or writes them). A state
that is constant instead (graph.lstm_loop's rewrite of a Keras time loop) is each invoke's initial state: the
one-launch form reads it from constant arguments and writes no state.
Plain LSTMs only (optional cell clipping): peephole, CIFG, projection and layer norm stay on the CPU.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import numpy as np

from .base import GenContext, Unsupported, generator, require_float
from .common import Arg, KernelSpec, c_float
from .knobs import Knobs, one_of
from .lanes import offset

MAX_STEPS = 20_000  # one launch per step: a longer sequence runs on the CPU (its plan would hold a kernel per step)
SEQUENCE_UNITS = 256  # a work-group of one work-item per unit: at most this many (every device's groups take it)


@dataclass(frozen=True)
class LstmShape:
    units: int
    steps: int
    initial: bool = False  # the state is a constant initial state, not variables: one launch only


@dataclass(frozen=True)
class LstmKnobs(Knobs):
    # one launch for the whole sequence (a work-group per batch row, a barrier between steps), else one per step
    # (the tuner leaves stateful kernels alone: an explicit parameter picks the per-step form)
    sequence: bool = False

    @classmethod
    def default(cls, shape: LstmShape) -> LstmKnobs:
        """One launch where the units fit a work-group: a 16-step, 64-unit LSTM on the Intel CPU device ran its
        16 step launches in 0.25 ms, the math in them ~0.1 ms."""
        return cls(sequence=(shape.steps > 1 or shape.initial) and shape.units <= SEQUENCE_UNITS)

    @classmethod
    def space(cls, shape: LstmShape) -> dict[str, list]:
        if shape.initial:
            return {"sequence": [True]}
        return {"sequence": [False, True] if shape.units <= SEQUENCE_UNITS else [False]}

    def problems(self, shape: LstmShape) -> list[str]:
        bad = one_of("sequence", self.sequence, (False, True))
        if not bad and shape.initial and not self.sequence:
            bad.append("a constant initial state (no state variables) runs in the one-launch form only")
        if not bad and self.sequence and shape.units > SEQUENCE_UNITS:
            bad.append(f"one launch for the sequence needs at most {SEQUENCE_UNITS} units (a work-group), "
                       f"this LSTM has {shape.units}")
        return bad


@generator("UNIDIRECTIONAL_SEQUENCE_LSTM", "LSTM")
def unidirectional_sequence_lstm(ctx: GenContext) -> list[KernelSpec]:
    """Also the one-step LSTM op: a sequence of length 1 whose input/output have no time axis."""
    op = ctx.op
    if op.name == "LSTM" and (op.options.get("kernel_type", 0) != 0 or len(op.outputs) != 1):
        raise Unsupported("BASIC LSTM kernel or the 4-output LSTM form")
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    if len(op.inputs) < 20:
        raise Unsupported("LSTM without state inputs")
    absent = [i for i in (1, 5, 9, 10, 11, 16, 17) if ctx.input_tensor(i) is None]
    if absent != [9, 10, 11, 16, 17] or any(ctx.input_tensor(i) is not None for i in range(20, len(op.inputs))):
        raise Unsupported("peephole/CIFG/projection/layer-norm LSTM variants run on the CPU")
    if op.options.get("fused_activation_function", 4) != 4:  # (a proj_clip clips no projection: there is none)
        raise Unsupported("LSTM activation other than TANH")
    ws = [ctx.const(i) for i in (1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 14, 15)]
    if any(w is None for w in ws) or any(w.dtype != np.float32 for w in ws):
        raise Unsupported("LSTM weights must be float32 constants")
    h_idx, c_idx = op.inputs[18], op.inputs[19]
    initial = [ctx.const(18), ctx.const(19)]  # (a constant initial state, else variables)
    if any(v is None for v in initial):
        if h_idx not in ctx.subgraph_variables or c_idx not in ctx.subgraph_variables:
            raise Unsupported("LSTM state is neither variable tensors nor constants")
        initial = None
    if initial is not None and any(np.asarray(v).dtype != np.float32 for v in initial):
        raise Unsupported("a constant LSTM state must be float32")
    wx = np.concatenate(ws[0:4], axis=0)  # [4U, In], gates i, f, g, o
    wh = np.concatenate(ws[4:8], axis=0)  # [4U, U]
    bias = np.concatenate(ws[8:12])
    units, n_in = ws[0].shape
    if ws[4].shape[1] != units:
        raise Unsupported("recurrent weights with a projection")
    time_major = op.options.get("time_major", False)
    shape = x_t.shape
    single = op.name == "LSTM"
    if single:
        steps, batch = 1, shape[0]
    else:
        steps, batch = (shape[0], shape[1]) if time_major else (shape[1], shape[0])
    if steps > MAX_STEPS:
        raise Unsupported(f"a sequence of {steps} steps: one launch each, at most {MAX_STEPS} on the device")
    clip = float(op.options.get("cell_clip", 0.0) or 0.0)

    def state(buf: str, index: str) -> str:  # a state value: from the tensor, or from its constant argument
        return f"LD1({buf}, {index})" if initial is None else f"{buf}[{index}]"

    def seq(t, b, k, tensor_shape):
        if single:
            return offset(tensor_shape, [b, k])
        return offset(tensor_shape, [t, b, k] if time_major else [b, t, k])

    hs, cs = ctx.tensor(h_idx).shape, ctx.tensor(c_idx).shape
    name = ctx.name
    # step t's four gates of unit u (both kernels): the input and recurrent products, the bias, the activations
    gates = f"""float g[4];
for (int q = 0; q < 4; ++q) {{
  const int row = q * {units} + u;
  float s = bias[row];
  for (int k = 0; k < {n_in}; ++k) s += LD1(x, {seq('t', 'b', 'k', shape)}) * wx[k * {4 * units} + row];
  for (int k = 0; k < {units}; ++k) {{
    const float hp = t == 0 ? {state('hstate', offset(hs, ['b', 'k']))} : LD1(y, {seq('(t - 1)', 'b', 'k', out.shape)});
    s += hp * wh[k * {4 * units} + row];
  }}
  g[q] = s;
}}
const float ig = 1.0f / (1.0f + exp(-g[0])), fg = 1.0f / (1.0f + exp(-g[1]));
const float gg = tanh(g[2]), og = 1.0f / (1.0f + exp(-g[3]));"""
    clip_c = f"c = clamp(c, {c_float(-clip)}, {c_float(clip)});" if clip > 0 else ""
    src = f"""__kernel void {name}(__global const STORE_T* x, __global const float* wx, __global const float* wh,
    __global const float* bias, __global STORE_T* hstate, __global STORE_T* cstate, __global STORE_T* y,
    const int t) {{
  const int u = get_global_id(0); const int b = get_global_id(1);
  if (u >= {units} || b >= {batch}) return;
{textwrap.indent(gates, "  ")}
  float c = fg * LD1(cstate, {offset(cs, ['b', 'u'])}) + ig * gg;
  {clip_c}
  const float h = og * tanh(c);
#ifdef TFLGPU_FP16
  vstore_half(c, {offset(cs, ['b', 'u'])}, cstate);
  vstore_half(h, {seq('t', 'b', 'u', out.shape)}, y);
#else
  cstate[{offset(cs, ['b', 'u'])}] = c;
  y[{seq('t', 'b', 'u', out.shape)}] = h;
#endif
}}

// after the last step: the final h becomes the state (a separate launch: during a step every
// work-item may still read the old h)
__kernel void {name}_final(__global const STORE_T* y, __global STORE_T* hstate) {{
  const int u = get_global_id(0); const int b = get_global_id(1);
  if (u >= {units} || b >= {batch}) return;
#ifdef TFLGPU_FP16
  vstore_half(LD1(y, {seq(str(steps - 1), 'b', 'u', out.shape)}), {offset(hs, ['b', 'u'])}, hstate);
#else
  hstate[{offset(hs, ['b', 'u'])}] = y[{seq(str(steps - 1), 'b', 'u', out.shape)}];
#endif
}}"""
    # the weights stay float32 whatever the storage precision: pass them as float32 blobs
    consts = [Arg("const32", np.ascontiguousarray(wx.T, np.float32).reshape(-1)),  # [k][gate row]: work-items
              Arg("const32", np.ascontiguousarray(wh.T, np.float32).reshape(-1)),  # (units) read adjacent weights
              Arg("const32", np.ascontiguousarray(bias, np.float32))]
    lstm_shape = LstmShape(units, steps, initial is not None)
    knobs = LstmKnobs.resolve(lstm_shape, ctx.params)
    flops = 8 * batch * units * (n_in + units)
    if knobs.sequence:
        # every step in one work-group (work-item u: unit u of batch row b): a step's h goes to the output
        # sequence, then a barrier (global memory: the next step reads every unit's h there); the state is written
        # after the last step (h was read only at step 0)
        state_t = "STORE_T" if initial is None else "const float"
        final_state = "" if initial is not None else f"""
  ST1(cstate, {offset(cs, ['b', 'u'])}, c);
  ST1(hstate, {offset(hs, ['b', 'u'])}, LD1(y, {seq(str(steps - 1), 'b', 'u', out.shape)}));"""
        seq_src = f"""__kernel void {name}_seq(__global const STORE_T* x, __global const float* wx,
    __global const float* wh, __global const float* bias, __global {state_t}* hstate, __global {state_t}* cstate,
    __global STORE_T* y) {{
  const int u = get_global_id(0); const int b = get_global_id(1);
  float c = {state('cstate', offset(cs, ['b', 'u']))};
  for (int t = 0; t < {steps}; ++t) {{
{textwrap.indent(gates, "    ")}
    c = fg * c + ig * gg;
    {clip_c}
    const float h = og * tanh(c);
    ST1(y, {seq('t', 'b', 'u', out.shape)}, h);
    barrier(CLK_GLOBAL_MEM_FENCE);
  }}{final_state}
}}"""
        if initial is not None:  # (reads the constants; writes only the sequence)
            return [KernelSpec(f"{name}_seq", seq_src, (units, batch), (units, 1),
                               [Arg("tensor", op.inputs[0]), *consts,
                                *(Arg("const32", np.ascontiguousarray(v, np.float32).reshape(-1)) for v in initial),
                                Arg("tensor", op.outputs[0])],
                               [op.inputs[0]], [op.outputs[0]], knobs.params(), space=LstmKnobs.space(lstm_shape),
                               flops=flops * steps)]
        return [KernelSpec(f"{name}_seq", seq_src, (units, batch), (units, 1),
                           [Arg("tensor", op.inputs[0]), *consts, Arg("tensor", h_idx), Arg("tensor", c_idx),
                            Arg("tensor", op.outputs[0])],
                           [op.inputs[0], h_idx, c_idx], [op.outputs[0], h_idx, c_idx], knobs.params(),
                           space=LstmKnobs.space(lstm_shape), state=[h_idx, c_idx], flops=flops * steps)]
    specs = []
    for t in range(steps):
        specs.append(KernelSpec(name, src, (units, batch), None,
                                [Arg("tensor", op.inputs[0]), *consts, Arg("tensor", h_idx), Arg("tensor", c_idx),
                                 Arg("tensor", op.outputs[0]), Arg("int", t)],
                                [op.inputs[0], h_idx, c_idx], [op.outputs[0], h_idx, c_idx], knobs.params(),
                                space=LstmKnobs.space(lstm_shape), state=[h_idx, c_idx], flops=flops))
    specs.append(KernelSpec(f"{name}_final", src, (units, batch), None,
                            [Arg("tensor", op.outputs[0]), Arg("tensor", h_idx)], [op.outputs[0]], [h_idx],
                            knobs.params(), space=LstmKnobs.space(lstm_shape), state=[h_idx, c_idx]))
    return specs

