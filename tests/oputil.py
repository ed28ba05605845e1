"""Models for tests (single ops, and a few small graphs shared by several test files): build, run through
tflgpu and LiteRT, compare."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, litert, run_model
from .verdicts import wrapped_bug


@dataclass
class In:
    """A runtime input of the op (fed at invoke)."""

    value: np.ndarray
    quant: dict | None = None  # quantization parameters (ModelBuilder's form)


@dataclass
class Const:
    """A constant input with quantization parameters (plain arrays are constants too)."""

    value: np.ndarray
    quant: dict | None = None


@dataclass
class Out:
    dtype: Any = np.float32
    shape: Sequence[int] = (1,)
    quant: dict | None = None


def op_model(op: str, inputs: Sequence[Any], outputs: Sequence[Out] | int = 1, *,
             custom_options: bytes | None = None, version: int = 1, **options: Any) -> tuple[bytes, list]:
    """A model with one op. ``inputs``: In(array) for graph inputs, arrays or Const for constants, None for
    omitted.

    Returns the model bytes and the runtime input arrays (in graph-input order).
    """
    b = ModelBuilder()
    idx, feeds = [], []
    for i, v in enumerate(inputs):
        if v is None:
            idx.append(-1)
        elif isinstance(v, In):
            arr = np.asarray(v.value)
            idx.append(b.input(f"in{i}", arr.shape, arr.dtype, quant=v.quant))
            feeds.append(arr)
        else:
            arr = np.asarray(v.value if isinstance(v, Const) else v)
            idx.append(b.const(f"const{i}", arr, dtype=arr.dtype, quant=v.quant if isinstance(v, Const) else None))
    outs = [Out() for _ in range(outputs)] if isinstance(outputs, int) else list(outputs)
    out_idx = [b.tensor(f"out{i}", o.shape, o.dtype, quant=o.quant) for i, o in enumerate(outs)]
    b.op(op, idx, out_idx, custom_options=custom_options, version=version, **options)
    b.output(*out_idx)
    return b.build(), feeds


def check_op(op: str, inputs: Sequence[Any], outputs: Sequence[Out] | int = 1, *, rtol_scale: float = 1e-4,
             delegate: Any = None, expect_on_device: bool = True, **options: Any) -> list[np.ndarray]:
    """Run a single-op model through both runtimes; outputs must match within tolerance.

    With ``delegate`` (a GpuDelegate) tflgpu runs the op through it, and the op must have been
    placed on the OpenCL device unless ``expect_on_device`` is False.
    """
    from tflgpu import Interpreter

    model, feeds = op_model(op, inputs, outputs, **options)
    want = run_model(litert(), model, feeds)
    if delegate is None:
        got = run_model(Interpreter, model, feeds)
    else:
        it = Interpreter(model_content=model, delegate=delegate)
        assert it.gpu_plan is not None, "no OpenCL plan was built"
        if expect_on_device:
            assert it.gpu_plan.cpu_op_count == 0, [s.reason for s in it.gpu_plan.steps if s.device == "cpu"]
        got = run_model(lambda **kw: it, model, feeds)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, rtol_scale, what=f"{op} output {i}")
    return got


_POOL = None


def run_litert(model: bytes, feeds: list, builtin_only: bool = False) -> list[np.ndarray]:
    """LiteRT's outputs (``run_model``); ``builtin_only``: TFLite's own kernels, without the XNNPACK delegate LiteRT
    applies by default."""
    kw = {}
    if builtin_only:
        from ai_edge_litert.interpreter import OpResolverType

        kw["experimental_op_resolver_type"] = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    return run_model(litert(), model, feeds, **kw)


def _litert_worker(model: bytes, feeds: list, builtin_only: bool = False) -> tuple[str, Any]:
    try:
        return "ok", run_litert(model, feeds, builtin_only)
    except (RuntimeError, ValueError) as e:
        return "error", str(e)


def litert_isolated(model: bytes, feeds: list, builtin_only: bool = False) -> tuple[str, Any]:
    """Run LiteRT in a worker process: ("ok", outputs), ("error", message) or ("crashed", None).

    LiteRT segfaults on some inputs (e.g. unusual STRIDED_SLICE specs); a fuzz test must survive that.
    """
    global _POOL
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    if _POOL is None:
        _POOL = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        return _POOL.submit(_litert_worker, model, feeds, builtin_only).result(timeout=120)
    except BrokenProcessPool:
        _POOL = None
        return "crashed", None


def both_fail_or_match(op: str, inputs, outputs=1, *, isolated: bool = False, builtin_only: bool = False,
                       **options) -> str:
    """For inputs LiteRT may reject: if LiteRT fails, tflgpu must fail too; else results must match.

    With ``isolated`` the reference runs in a worker process and "reference crashed" is returned
    when LiteRT itself crashes (there is then nothing to compare against).
    """
    from tflgpu import Interpreter

    model, feeds = op_model(op, inputs, outputs, **options)
    if isolated:
        status, want = litert_isolated(model, feeds, builtin_only)
        if status == "crashed":
            return "reference crashed"
    else:
        try:
            status, want = "ok", run_model(litert(), model, feeds)
        except (RuntimeError, ValueError):
            status = "error"
    if status == "error":
        try:
            run_model(Interpreter, model, feeds)
        except (RuntimeError, ValueError) as e:
            bug = wrapped_bug(e)
            assert bug is None, f"tflgpu's refusal of this {op} wraps an internal error: {e!r} <- {bug!r}"
            return "both rejected"
        raise AssertionError(f"LiteRT rejects this {op}, tflgpu accepted it")
    got = run_model(Interpreter, model, feeds)
    assert len(got) == len(want), f"{op}: {len(got)} outputs, LiteRT {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, what=f"{op} output {i}")
    return "matched"


def rand(rng, shape, lo=-1.0, hi=1.0, dtype=np.float32) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(dtype)


def hybrid_const(b: ModelBuilder, name: str, value: np.ndarray) -> int:
    """A constant int8 weight tensor quantized symmetrically from ``value`` (one scale), as a dynamic-range
    quantizer writes one."""
    scale = float(np.abs(value).max() / 127) or 1.0
    q = np.clip(np.round(value / scale), -127, 127).astype(np.int8)
    return b.const(name, q, np.int8, quant={"scale": np.float32([scale]), "zero_point": np.int64([0])})


def lstm_model(op: str, rng, *, batch=2, steps=5, n_in=6, units=7, n_out=None, peephole=False, cifg=False,
                layer_norm=False, cell_clip=0.0, proj_clip=0.0, time_major=False, peephole_size=None,
                hybrid=False, asymmetric=False):
    """An LSTM op with every optional input switchable; state inputs are variable tensors (``peephole_size``: a
    peephole vector of another length than ``units``, a malformed model). ``hybrid``: int8 weights (input,
    recurrent, peephole, projection; biases and layer norm stay float), inputs quantized ``asymmetric``-ally or
    not, as a dynamic-range quantized model has them."""
    n_out = n_out or units
    b = ModelBuilder()
    shape = (steps, batch, n_in) if time_major else (batch, steps, n_in)
    x = b.input("x", shape if op == "UNIDIRECTIONAL_SEQUENCE_LSTM" else (batch, n_in))

    def w(name, s):
        value = rand(rng, s, -0.5, 0.5)
        if hybrid and name[0] in "wrp" and name != "proj_bias":
            return hybrid_const(b, name, value)
        return b.const(name, value)

    ins = [x]
    ins += [-1 if cifg else w("wi", (units, n_in))] + [w(f"w{g}", (units, n_in)) for g in "fco"]
    ins += [-1 if cifg else w("ri", (units, n_out))] + [w(f"r{g}", (units, n_out)) for g in "fco"]
    peep = (peephole_size or units,)
    ins += [-1 if (cifg or not peephole) else w("pi", peep)]
    ins += [w(f"p{g}", peep) if peephole else -1 for g in "fo"]
    ins += [-1 if cifg else w("bi", (units,))] + [w(f"b{g}", (units,)) for g in "fco"]
    if n_out != units:
        ins += [w("proj", (n_out, units)), w("proj_bias", (n_out,))]
    else:
        ins += [-1, -1]
    ins += [b.tensor("h", (batch, n_out), is_variable=True), b.tensor("c", (batch, units), is_variable=True)]
    if layer_norm:
        ins += [-1 if cifg else w("lni", (units,))] + [w(f"ln{g}", (units,)) for g in "fco"]
    out_shape = (shape[0], shape[1], n_out) if op == "UNIDIRECTIONAL_SEQUENCE_LSTM" else (batch, n_out)
    y = b.tensor("y", out_shape)
    opts = {"fused_activation_function": "TANH", "cell_clip": cell_clip, "proj_clip": proj_clip}
    if hybrid:
        opts["asymmetric_quantize_inputs"] = asymmetric
    if op == "UNIDIRECTIONAL_SEQUENCE_LSTM":
        opts["time_major"] = time_major
    b.op(op, ins, [y], **opts)
    b.output(y)
    return b.build(), [rand(rng, shape if op == "UNIDIRECTIONAL_SEQUENCE_LSTM" else (batch, n_in))]


VARIANTS = {
    "plain": {},
    "peephole": {"peephole": True},
    "cifg": {"cifg": True},
    "projection": {"n_out": 4, "proj_clip": 0.3},
    "layer_norm": {"layer_norm": True},
    "cifg_peephole_layer_norm": {"cifg": True, "peephole": True, "layer_norm": True},
    "cell_clip_time_major": {"cell_clip": 0.2, "time_major": True},
}


def while_model(rng, static_counter: bool = True, float_cond: bool = False):
    """x_{i+1} = x_i * 1.5 + table[i] for i = 0..4 (a time loop: GATHER of a step's row by the counter)."""
    b = ModelBuilder()
    x0 = b.input("x", (2, 3))
    i0 = b.const("i0", np.array(0, np.int32)) if static_counter else b.input("i", (), np.int32)
    i_out, x_out = b.tensor("i_out", (), np.int32), b.tensor("x_out", (2, 3))
    cond_idx, cond = b.subgraph("cond")
    ci, cx = cond.input("i", (), np.int32), cond.input("x", (2, 3))
    flag = cond.tensor("flag", (), np.bool_)
    if float_cond:  # loop while sum(x) < 40: not countable ahead of time
        total = cond.tensor("total", ())
        cond.op("SUM", [cx, cond.const("axes", np.array([0, 1], np.int32))], [total], keep_dims=False)
        cond.op("LESS", [total, cond.const("limit", np.array(40.0, np.float32))], [flag])
    else:
        cond.op("LESS", [ci, cond.const("limit", np.array(5, np.int32))], [flag])
    cond.output(flag)
    body_idx, body = b.subgraph("body")
    bi, bx = body.input("i", (), np.int32), body.input("x", (2, 3))
    one, k = body.const("one", np.array(1, np.int32)), body.const("k", np.array([1.5], np.float32))
    table = body.const("table", rng.uniform(0, 2, (8, 3)).astype(np.float32))
    row, scaled = body.tensor("row", (3,)), body.tensor("scaled", (2, 3))
    bi2, bx2 = body.tensor("i2", (), np.int32), body.tensor("x2", (2, 3))
    body.op("ADD", [bi, one], [bi2])
    body.op("GATHER", [table, bi], [row], axis=0, batch_dims=0)
    body.op("MUL", [bx, k], [scaled])
    body.op("ADD", [scaled, row], [bx2])
    body.output(bi2, bx2)
    b.op("WHILE", [i0, x0], [i_out, x_out], cond_subgraph_index=cond_idx, body_subgraph_index=body_idx)
    b.output(x_out, i_out)
    return b.build(), ([rng.uniform(0, 1, (2, 3)).astype(np.float32)] if static_counter
                       else [rng.uniform(0, 1, (2, 3)).astype(np.float32), np.array(0, np.int32)])


def conv_model(rng):
    return op_model("CONV_2D", [In(rand(rng, (1, 12, 12, 8))), rand(rng, (16, 3, 3, 8)), rand(rng, (16,))],
                    padding="SAME", stride_w=1, stride_h=1, fused_activation_function="RELU")


def interior_conv_model(rng):
    """``conv_model``'s conv between two pools, so that neither its input nor its output crosses the device
    boundary (runtime.selection.dense_boundary leaves it every form, Winograd included); (model, feeds)."""
    from tflgpu.model.builder import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (1, 13, 13, 8))
    pooled, conv, out = b.tensor("pooled", (1, 12, 12, 8)), b.tensor("conv", (1, 12, 12, 16)), b.tensor("out", (1, 6, 6, 16))
    b.op("AVERAGE_POOL_2D", [x], [pooled], padding="VALID", stride_w=1, stride_h=1, filter_width=2, filter_height=2)
    b.op("CONV_2D", [pooled, b.const("w", rand(rng, (16, 3, 3, 8))), b.const("b", rand(rng, (16,)))], [conv],
         padding="SAME", stride_w=1, stride_h=1, fused_activation_function="RELU")
    b.op("MAX_POOL_2D", [conv], [out], padding="VALID", stride_w=2, stride_h=2, filter_width=2, filter_height=2)
    b.output(out)
    return b.build(), [rand(rng, (1, 13, 13, 8))]


# an op the OpenCL path leaves to the CPU kernels, for the tests of the device / CPU boundary: float FLOOR_DIV (TFLite
# floors the correctly rounded quotient, which OpenCL's division may miss: kernels.expressions)
CPU_OP = "FLOOR_DIV"


def cpu_op(b: ModelBuilder, x: int, y: int) -> None:
    """y = floor(x / 0.25), a step of the CPU kernels (``CPU_OP``), its output the shape of its input."""
    b.op(CPU_OP, [x, b.const(f"cpu_op_divisor{y}", np.float32(0.25))], [y])


# special values: NaN, the infinities, both zeros, near float32's largest, a denormal
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3e38, -3e38, 1e-40], np.float32)


def check_special_values(op: str, delegate: Any = None) -> None:
    """``op`` of NaN, infinities, signed zeros and values near float32's largest (FLOOR_MOD: of the finite ones by
    divisors of either sign) as LiteRT's builtin kernels give them, the sign of each zero included (assert_close
    sees neither); with ``delegate``, every op on the device."""
    from tflgpu import Interpreter

    if op == "FLOOR_MOD":
        a, b = np.meshgrid(SPECIAL[3:9], np.array([1.0, -1.0, 0.5, -0.25, 2.0], np.float32))
        inputs = [In(a.reshape(1, *a.shape)), In(b.reshape(1, *b.shape))]
    else:
        inputs = [In(SPECIAL.reshape(1, 3, 4))]
    model, feeds = op_model(op, inputs)
    it = Interpreter(model_content=model, **({"delegate": delegate} if delegate else {}))
    if delegate:
        assert it.gpu_plan.cpu_op_count == 0
    got, want = run_model(lambda **kw: it, model, feeds)[0], run_litert(model, feeds, builtin_only=True)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)  # (NaN where NaN, infinities equal; expm1's last bit apart)
    np.testing.assert_array_equal(np.signbit(got[got == 0]), np.signbit(want[want == 0]))


def device_cpu_device_model(shape=(1, 6, 6, 4)) -> bytes:
    """A device ADD, a CPU step (``cpu_op``), a device ADD: values cross the device boundary mid-invoke, a
    download before the CPU step and an upload after it."""
    b = ModelBuilder()
    x = b.input("x", shape)
    one = b.const("one", np.ones(shape, np.float32))
    y, z, w = (b.tensor(n, shape) for n in "yzw")
    b.op("ADD", [x, one], [y])
    cpu_op(b, y, z)
    b.op("ADD", [z, one], [w])
    b.output(w)
    return b.build()


def widened_block(rng, *, cin=5, cout=12, batch=1, pool=True, pad_first=False, pad_rows=None, pad_readers=1):
    """A residual block widening its skip branch (BlazeFace's): out = RELU(conv(x) + PAD(skip, zero channels after
    the last)), the skip a stride-2 MAX_POOL of x (``pool``) or x itself; the PAD before the conv in op order
    (``pad_first``) or after it; ``pad_rows`` other paddings; ``pad_readers`` 2: a second op reads the PAD."""
    hw = 4 if pool else 8
    b = ModelBuilder()
    x = b.input("x", (batch, 8, 8, cin))
    rows = pad_rows if pad_rows is not None else [[0, 0], [0, 0], [0, 0], [0, cout - cin]]
    wide_shape = tuple(d + a + z for d, (a, z) in zip((batch, hw, hw, cin), rows))

    def skip_branch():
        s = x
        if pool:
            s = b.tensor("pooled", (batch, hw, hw, cin))
            b.op("MAX_POOL_2D", [x], [s], padding="VALID", stride_w=2, stride_h=2, filter_width=2, filter_height=2)
        wide = b.tensor("wide", wide_shape)
        b.op("PAD", [s, b.const("p", np.array(rows, np.int32))], [wide])
        return wide

    wide = skip_branch() if pad_first else None
    y = b.tensor("y", (batch, hw, hw, cout))
    b.op("CONV_2D", [x, b.const("w", rng.standard_normal((cout, 2, 2, cin)).astype(np.float32) if pool else
                               rng.standard_normal((cout, 1, 1, cin)).astype(np.float32)),
                     b.const("b", rng.standard_normal(cout).astype(np.float32))], [y], padding="VALID",
         stride_w=2 if pool else 1, stride_h=2 if pool else 1)
    if wide is None:
        wide = skip_branch()
    z, out = b.tensor("z", (batch, hw, hw, cout)), b.tensor("out", (batch, hw, hw, cout))
    b.op("ADD", [y, wide], [z])
    b.op("RELU", [z], [out])
    outs = [out]
    if pad_readers == 2:
        twice = b.tensor("twice", wide_shape)
        b.op("MUL", [wide, b.const("two", np.array(2.0, np.float32))], [twice])
        outs.append(twice)
    b.output(*outs)
    return b, wide


def stored_too_small_model(rng) -> bytes:
    """A model whose dynamic input is stored at a size its op cannot take (as openWakeWord's melspectrogram, [-1, -1]
    stored as [1, 1], its callers resizing it first): x [1, -1, -1, 1] stored [1, 1, 1, 1], a 3x3 VALID CONV_2D."""
    from tflgpu.model.builder import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (1, 1, 1, 1), shape_signature=(1, -1, -1, 1))
    y = b.tensor("y", (1, 1, 1, 4), shape_signature=(1, -1, -1, 4))
    b.op("CONV_2D", [x, b.const("w", rand(rng, (4, 3, 3, 1))), b.const("b", rand(rng, (4,)))], [y],
         padding="VALID", stride_w=1, stride_h=1)
    b.output(y)
    return b.build()


def add_mul_model(dynamic_batch: bool = False) -> bytes:
    """x, y: [1, 3] ([-1, 3] with ``dynamic_batch``) -> sum = x + y, prod = sum * x, both outputs, with a
    signature (serving_default: x, y -> prod, sum)."""
    b = ModelBuilder()
    sig = (-1, 3) if dynamic_batch else None
    x = b.input("x", (1, 3), shape_signature=sig)
    y = b.input("y", (1, 3), shape_signature=sig)
    z = b.tensor("z", (1, 3), shape_signature=sig)
    b.op("ADD", [x, y], [z])
    w = b.tensor("w", (1, 3), shape_signature=sig)
    b.op("MUL", [z, x], [w])
    b.output(w, z)
    b.signature("serving_default", {"x": x, "y": y}, {"prod": w, "sum": z})
    return b.build()
