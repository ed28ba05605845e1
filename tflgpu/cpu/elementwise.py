"""Elementwise ops: unary math, binary arithmetic with TFLite broadcasting, logic, casts.

numpy's ufuncs already run these as compiled vector loops, and its
broadcasting rules are TFLite's (align from the right, size-1 dims stretch).
"""

from __future__ import annotations

import math

import numpy as np

from ..graph.float_view import sim_grid
from ..model import reader
from ..ops.attributes import activation_bounds
from ..ops.jit import PARALLEL_ELEMENTS, njit, prange, readonly
from ..ops.quantization import RAW_MEAN_SNAP, tfl_round
from .registry import KernelError, OpContext, apply_activation, fits, register, static_shape


def _unary(fn):
    def factory(ctx: OpContext):
        return lambda xs: [fn(xs[0])]

    return factory


@njit(cache=True, inline="always")
def _hard_swish_one(v):
    return (v * np.float32(1.0 / 6.0)) * min(max(v + np.float32(3.0), np.float32(0.0)), np.float32(6.0))


@njit(cache=True)
def _hard_swish_serial(x, out):
    for i in range(x.size):
        out[i] = _hard_swish_one(x[i])


@njit(cache=True, parallel=True)
def _hard_swish_parallel(x, out):
    for i in prange(x.size):
        out[i] = _hard_swish_one(x[i])


def _one_pass(x: np.ndarray, serial, parallel, *args) -> np.ndarray:
    """A float32 elementwise kernel's output for ``x``: ``kernel(x's values, *args, out's values)``, run by
    ``parallel`` over both cores from PARALLEL_ELEMENTS values, else by ``serial`` on this thread."""
    out = np.empty(x.shape, np.float32)
    (parallel if x.size >= PARALLEL_ELEMENTS else serial)(readonly(np.ascontiguousarray(x).reshape(-1)), *args,
                                                          out.reshape(-1))
    return out


def _hard_swish(x):
    """(x / 6) * relu6(x + 3), in TFLite's order: x * 6 would overflow near float32's largest."""
    if x.dtype == np.float32 and x.ndim:  # (one pass; numpy's takes four)
        return _one_pass(x, _hard_swish_serial, _hard_swish_parallel)
    return (x * np.float32(1.0 / 6.0)) * np.clip(x + 3.0, 0.0, 6.0)


@njit(cache=True, inline="always")
def _clamped(v, lo, hi):
    """TFLite's clamp, min(max(v, lo), hi) with max(a, b) = a < b ? b : a: -0.0 and NaN pass."""
    v = lo if v < lo else v
    return hi if hi < v else v


@njit(cache=True, parallel=True)
def _clamp_parallel(x, lo, hi, out):
    for i in prange(x.size):
        out[i] = _clamped(x[i], lo, hi)


@njit(cache=True)
def _clamp_serial(x, lo, hi, out):
    for i in range(x.size):
        out[i] = _clamped(x[i], lo, hi)


NUMBA_ELEMENTS = 1 << 12  # from this many values a float32 elementwise op's numba pass beats numpy's (its clip and
# where() are slow; a call into numba costs a few microseconds more than numpy's)


def _clamp(x, lo: float, hi: float):
    """An activation op's clamp: one numba pass for a float32 tensor of NUMBA_ELEMENTS values or more (over both cores
    from PARALLEL_ELEMENTS; numpy's clip took 2-3x as long on one core), else numpy's clip in the tensor's dtype."""
    if x.dtype == np.float32 and x.size >= NUMBA_ELEMENTS:
        return _one_pass(x, _clamp_serial, _clamp_parallel, np.float32(lo), np.float32(hi))
    return np.clip(x, lo, hi).astype(x.dtype, copy=False)


LOGISTIC_FLOOR = np.float32(-87.0)  # LOGISTIC's input is clamped here: exp(-x) overflows float32 below -88.7, and
# 1 / (1 + exp(-x)) is a denormal below -87.3, its division a microcode assist of ~100 cycles (a segmentation mask's
# background, 65,536 values, took 452 us). 1 / (1 + exp(87)) is 1.6e-38, 0 to within float32's smallest normal
# (LiteRT's XNNPACK path gives 0 below -87.3, its builtin kernels the denormals); no overflow warning needs numpy's
# slow errstate.


def _logistic(x):
    if x.dtype == np.float32:
        return np.float32(1.0) / (np.float32(1.0) + np.exp(-np.maximum(x, LOGISTIC_FLOOR)))
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype)


@njit(cache=True, parallel=True)
def _gelu_f32(x, approximate):
    """GELU of float32 values over both cores: 0.5 x (1 + erf(x / sqrt 2)), or (``approximate``) TFLite's
    0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) in float32. numpy has no erf (a Python
    call per value took 18 ms for 200K values), and its x ** 3 and tanh took 10 ms there for the tanh form."""
    out = np.empty(x.size, np.float32)
    for i in prange(x.size):
        v = x[i]
        if approximate:  # (in float32, as TFLite's: float64's tanh took 2 ms for 200K values)
            out[i] = np.float32(0.5) * v * (np.float32(1.0) + math.tanh(
                np.float32(0.7978845608028654) * (v + np.float32(0.044715) * v * v * v)))
        else:
            w = np.float64(v)
            out[i] = np.float32(0.5 * w * (1.0 + math.erf(w * 0.7071067811865476)))
    return out


def _gelu(x, approximate: bool):
    """(TFLite's GELU is float32: an 8-bit one reaches here as a table's float32 reals)"""
    y = _gelu_f32(np.ascontiguousarray(x, dtype=np.float32).reshape(-1), approximate).reshape(x.shape)
    return y.astype(x.dtype, copy=False)


UNARY = {
    "EXP": np.exp,
    "LOG": np.log,
    "TANH": np.tanh,
    "LOGISTIC": _logistic,
    # (TFLite's rule: ops.attributes.activation_bounds)
    "RELU": lambda x: _clamp(x, 0, np.inf),
    "RELU6": lambda x: _clamp(x, 0, 6),
    "RELU_N1_TO_1": lambda x: _clamp(x, -1, 1),
    "RELU_0_TO_1": lambda x: _clamp(x, 0, 1),
    "HARD_SWISH": _hard_swish,
    "SQRT": np.sqrt,
    "RSQRT": lambda x: (1.0 / np.sqrt(x)).astype(x.dtype),
    "ABS": np.abs,
    "NEG": np.negative,
    "SIN": np.sin,
    "COS": np.cos,
    "SQUARE": np.square,
    "FLOOR": np.floor,
    "CEIL": np.ceil,
    "ROUND": np.rint,  # TFLite rounds half to even
    "SIGN": np.sign,
    "LOGICAL_NOT": np.logical_not,
    "ZEROS_LIKE": np.zeros_like,
    "ONES_LIKE": np.ones_like,
}
for _name, _fn in UNARY.items():
    register(_name)(_unary(_fn))


@njit(cache=True)
def _leaky_serial(x, alpha, out):
    for i in range(x.size):
        v = x[i]
        out[i] = v if v >= 0 else v * alpha


@njit(cache=True, parallel=True)
def _leaky_parallel(x, alpha, out):
    for i in prange(x.size):
        v = x[i]
        out[i] = v if v >= 0 else v * alpha


@register("LEAKY_RELU")
def leaky_relu(ctx: OpContext):
    alpha = np.float32(ctx.opt("alpha", 0.2))

    def run(xs):
        x = xs[0]
        if x.dtype != np.float32:
            return [np.where(x >= 0, x, x * alpha).astype(x.dtype)]
        # (one pass: numpy's where() over a mixed-sign tensor took ~8x as long)
        return [_one_pass(x, _leaky_serial, _leaky_parallel, alpha)]

    return run


@register("ELU")
def elu(ctx: OpContext):
    def run(xs):
        x = xs[0]
        return [np.where(x > 0, x, np.expm1(np.where(x > 0, 0, x))).astype(x.dtype)]  # (-0.0 stays -0.0)

    return run


@register("GELU")
def gelu(ctx: OpContext):
    approximate = bool(ctx.opt("approximate", False))
    return lambda xs: [_gelu(xs[0], approximate)]


@njit(cache=True, inline="always")
def _prelu_row(x, alpha, out):
    for j in range(x.size):
        v = x[j]
        out[j] = v if v >= 0 else v * alpha[j]


@njit(cache=True, parallel=True)
def _prelu_channels(x, alpha):
    """x [rows, c] float32, alpha [c]: one pass over both cores (numpy's where() takes four)."""
    out = np.empty_like(x)
    for r in prange(x.shape[0]):
        _prelu_row(x[r], alpha, out[r])
    return out


@njit(cache=True)
def _prelu_channels_serial(x, alpha):
    """``_prelu_channels`` on the calling thread (a tensor too small to share)."""
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        _prelu_row(x[r], alpha, out[r])
    return out


def _per_channel(alpha: np.ndarray, x: np.ndarray) -> np.ndarray | None:
    """``alpha`` as one float32 value per channel of ``x`` (its last axis), where it is that (or one value for
    all) and both are float32; else None."""
    if x.dtype != np.float32 or alpha.dtype != np.float32 or x.ndim == 0 or alpha.ndim > x.ndim:
        return None
    c = x.shape[-1]
    if alpha.size not in (1, c) or alpha.size != (alpha.shape[-1] if alpha.ndim else 1):
        return None
    return np.ascontiguousarray(np.broadcast_to(alpha.reshape(-1), (c,)))


@register("PRELU")
def prelu(ctx: OpContext):
    def run(xs):
        x, alpha = xs[0], xs[1]
        a = _per_channel(alpha, x) if x.size else None
        if a is not None:  # (one pass: numpy's where() over a mixed-sign tensor took ~8x as long)
            x2 = readonly(np.ascontiguousarray(x).reshape(-1, x.shape[-1]))
            run = _prelu_channels if x.size >= PARALLEL_ELEMENTS else _prelu_channels_serial
            return [run(x2, readonly(a)).reshape(x.shape)]
        return [np.where(x >= 0, x, x * alpha).astype(x.dtype)]

    return run


def _int_div(a, b):
    if np.any(b == 0):
        raise KernelError("integer division by zero")
    return np.trunc(np.true_divide(a, b)).astype(np.result_type(a, b))


def _floor_div(a, b):
    if np.issubdtype(np.result_type(a, b), np.integer) and np.any(b == 0):
        raise KernelError("integer division by zero")
    return np.floor_divide(a, b)


def _floor_mod(a, b):
    if np.issubdtype(np.result_type(a, b), np.integer):
        if np.any(b == 0):
            raise KernelError("integer division by zero")
        return np.mod(a, b)
    # (TFLite's: fmod, then the divisor added where the remainder is nonzero and their signs differ; np.mod gives
    # a zero the divisor's sign)
    m = np.fmod(a, b)
    return np.where((m != 0) & ((b < 0) != (m < 0)), m + b, m).astype(m.dtype)


def _div(a, b):
    if np.issubdtype(np.result_type(a, b), np.integer):
        return _int_div(a, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.true_divide(a, b)


BINARY = {
    "ADD": np.add,
    "SUB": np.subtract,
    "MUL": np.multiply,
    "DIV": _div,
    # (TFLite's a > b ? a : b: the second of two equal zeros, the second where either is NaN; np.maximum propagates
    # every NaN)
    "MAXIMUM": lambda a, b: np.where(a > b, a, b),
    "MINIMUM": lambda a, b: np.where(a < b, a, b),
    "SQUARED_DIFFERENCE": lambda a, b: np.square(a - b),
    "POW": np.power,
    "FLOOR_DIV": _floor_div,
    "FLOOR_MOD": _floor_mod,
    "LESS": np.less,
    "LESS_EQUAL": np.less_equal,
    "GREATER": np.greater,
    "GREATER_EQUAL": np.greater_equal,
    "EQUAL": np.equal,
    "NOT_EQUAL": np.not_equal,
    "LOGICAL_AND": np.logical_and,
    "LOGICAL_OR": np.logical_or,
    "ATAN2": np.arctan2,
}


@njit(cache=True, inline="always")
def _arith_row(x, y, o, op, lo, hi):
    if op == 0:
        for j in range(o.size):
            o[j] = _clamped(x[j] + y[j], lo, hi)
    elif op == 1:
        for j in range(o.size):
            o[j] = _clamped(x[j] - y[j], lo, hi)
    elif op == 2:
        for j in range(o.size):
            o[j] = _clamped(x[j] * y[j], lo, hi)
    elif op == 3:
        for j in range(o.size):
            o[j] = x[j] if x[j] > y[j] else y[j]
    else:
        for j in range(o.size):
            o[j] = x[j] if x[j] < y[j] else y[j]


@njit(cache=True, parallel=True)
def _arith_rows(a, b, op, lo, hi, out):
    """``ROW_OPS``' op ``op`` of float32 rows over both cores: ``out`` [rows, c], each operand [rows, c] or one row [1,
    c] for every row (a per-channel operand: a squeeze-and-excitation gate's scale; a single value repeated); ADD,
    SUB and MUL clamped (``_clamped``), MAXIMUM / MINIMUM as TFLite's ``a > b ? a : b`` (``<``: the second of two
    equal zeros, the second where either is NaN)."""
    sa, sb = int(a.shape[0] > 1), int(b.shape[0] > 1)
    for r in prange(out.shape[0]):
        _arith_row(a[r * sa], b[r * sb], out[r], op, lo, hi)


@njit(cache=True)
def _arith_rows_serial(a, b, op, lo, hi, out):
    """``_arith_rows`` on the calling thread."""
    sa, sb = int(a.shape[0] > 1), int(b.shape[0] > 1)
    for r in range(out.shape[0]):
        _arith_row(a[r * sa], b[r * sb], out[r], op, lo, hi)


ROW_OPS = {"ADD": 0, "SUB": 1, "MUL": 2, "MAXIMUM": 3, "MINIMUM": 4}  # (_arith_row's op codes)


ROW = 256  # values a row of ``_arith_rows`` gathers at least where no operand is per channel (a short row loops slowly)


def _as_rows(t: np.ndarray, shape: tuple[int, ...], k: int) -> np.ndarray | None:
    """Float32 operand ``t`` of a binary op whose output has ``shape`` as ``_arith_rows`` takes it, in rows of ``k``
    values (the last axis, or several trailing axes): [rows, k] where it has the output's shape, [1, k] where it is
    one value, or one value per channel (the last axis, ``k`` its length); None otherwise."""
    if t.shape == shape:
        return readonly(np.ascontiguousarray(t).reshape(-1, k))
    if t.size == 1:
        return readonly(np.full((1, k), t.reshape(-1)[0], np.float32))
    if t.ndim and t.shape[-1] == k == shape[-1] and t.size == k:
        return readonly(np.ascontiguousarray(t).reshape(1, k))
    return None


def _row_arith(op: int, a: np.ndarray, b: np.ndarray, lo: float, hi: float) -> np.ndarray | None:
    """``_arith_rows`` of float32 operands whose result has NUMBA_ELEMENTS values or more: over both cores where it has
    PARALLEL_ELEMENTS or more in rows of at least 8 (a residual sum, a gate's scale: numpy's one core and the clamp's
    second pass took 3-4x as long), else on this thread (numpy's where() over a mixed-sign tensor took ~8x as long,
    an ADD and its clip 2-3x); None where it does not apply (numpy's ufuncs then)."""
    size = max(a.size, b.size)
    if size < NUMBA_ELEMENTS or a.dtype != np.float32 or b.dtype != np.float32:
        return None  # (first: a small model's sums cost their checks)
    shape = a.shape if a.shape == b.shape else np.broadcast_shapes(a.shape, b.shape)
    if not shape or shape[-1] == 0:
        return None
    k = shape[-1]
    if a.size in (1, size) and b.size in (1, size):  # (no operand per channel: rows of several trailing axes)
        for d in reversed(shape[:-1]):
            if k >= ROW:
                break
            k *= d
    both = k >= 8 and size >= PARALLEL_ELEMENTS
    ra, rb = _as_rows(a, shape, k), _as_rows(b, shape, k)
    if ra is None or rb is None:
        return None
    out = np.empty(shape, np.float32)
    (_arith_rows if both else _arith_rows_serial)(ra, rb, op, np.float32(lo), np.float32(hi), out.reshape(-1, k))
    return out


def _binary(fn):
    def factory(ctx: OpContext):
        act = ctx.opt("fused_activation_function", 0)
        lo, hi = activation_bounds(act)
        clamps = (lo, hi) != (-np.inf, np.inf)
        out_dtype = ctx.output_tensor(0).dtype
        small = reader.DEFAULT_MAX_TENSOR_BYTES // max(1, out_dtype.itemsize)
        rows = ROW_OPS.get(ctx.op.name) if out_dtype == np.float32 else None

        def run(xs):
            a, b = xs[0], xs[1]
            try:
                if rows is not None:
                    out = _row_arith(rows, a, b, lo, hi)
                    if out is not None:
                        return [out]
                # two small tensors can broadcast to one no tensor may be (never more than a.size * b.size)
                if a.shape != b.shape and a.size * b.size > small:
                    fits(np.broadcast_shapes(a.shape, b.shape), out_dtype, ctx.op.name)
                r = fn(a, b)
            except ValueError as e:  # shapes that do not broadcast
                raise KernelError(f"{ctx.op.name}: cannot broadcast {a.shape} with {b.shape}") from e
            r = np.asarray(r)
            if r.dtype != out_dtype:
                r = r.astype(out_dtype)
            return [apply_activation(r, act) if clamps else r]

        return run

    return factory


for _name, _fn in BINARY.items():
    register(_name)(_binary(_fn))


@register("SELECT", "SELECT_V2")
def select(ctx: OpContext):
    def run(xs):
        cond, a, b = xs
        if ctx.op.name == "SELECT" and cond.ndim == 1 and a.ndim > 1 and cond.shape[0] == a.shape[0]:
            cond = cond.reshape(cond.shape + (1,) * (a.ndim - 1))  # v1: a rank-1 condition picks rows
        return [np.where(cond, a, b)]

    return run


@register("CAST")
def cast(ctx: OpContext):
    dtype = ctx.output_tensor(0).dtype

    def run(xs):
        x = xs[0]
        if np.iscomplexobj(x) and not np.issubdtype(dtype, np.complexfloating):
            x = x.real  # (TFLite's cast of a complex value keeps its real part, as TensorFlow's)
        if np.issubdtype(dtype, np.integer) and np.issubdtype(x.dtype, np.floating):
            with np.errstate(invalid="ignore"):
                return [np.trunc(x).astype(dtype)]
        return [x.astype(dtype)]

    return run


def dequant_params(q, ndim: int):
    """(scale, zero point) of a Quantization, shaped to broadcast over a rank-``ndim`` tensor."""
    scale = q.scales.astype(np.float32)
    zp = q.zero_points.astype(np.float32)
    if len(scale) > 1:
        shape = [1] * ndim
        shape[q.quantized_dimension] = len(scale)
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    else:
        scale, zp = scale[0], zp[0]
    return scale, zp


@register("DEQUANTIZE")
def dequantize(ctx: OpContext):
    t = ctx.input_tensor(0)
    if t.dtype == np.float16 or t.quantization is None:
        return lambda xs: [xs[0].astype(np.float32)]
    scale, zp = dequant_params(t.quantization, len(t.shape))
    return lambda xs: [((xs[0].astype(np.float32) - zp) * scale).astype(np.float32)]


@register("QUANTIZE")
def quantize(ctx: OpContext):
    t_in, t_out = ctx.input_tensor(0), ctx.output_tensor(0)
    q = t_out.quantization
    if q is None:
        raise ctx.fail("output tensor has no quantization parameters")
    info = np.iinfo(t_out.dtype)
    scale, zp = dequant_params(q, len(t_out.shape))
    if t_in.quantization is not None and np.issubdtype(t_in.dtype, np.integer):
        in_scale, in_zp = dequant_params(t_in.quantization, len(t_in.shape))

        def requant(xs):
            real = (xs[0].astype(np.float64) - in_zp) * in_scale
            return [np.clip(np.round(real / scale) + zp, info.min, info.max).astype(t_out.dtype)]

        return requant

    inv_scale = (np.float32(1.0) / np.asarray(scale, np.float32)).astype(np.float32)
    lo, hi = np.float32(info.min), np.float32(info.max)

    def run(xs):
        # LiteRT's default (XNNPACK) path multiplies by the reciprocal scale and rounds half to even
        x = np.asarray(xs[0])
        if inv_scale.ndim == 0 and x.ndim > 0:  # (one pass, no temporaries; NaN as zero)
            out = np.empty(x.shape, t_out.dtype)
            _quantize_rint(np.ascontiguousarray(x, np.float32).reshape(-1), inv_scale, np.float32(zp), lo, hi,
                           out.reshape(-1))
            return [out]
        r = np.rint(x.astype(np.float32) * inv_scale)
        return [np.clip(r + zp, info.min, info.max).astype(t_out.dtype)]

    return run


@njit(cache=True)
def _quantize_rint(x, inv_scale, zp, lo, hi, out):
    """out = clamp(rint(x * inv_scale) + zp, lo, hi) in float32, as LiteRT's float -> 8-bit QUANTIZE; NaN as zp."""
    for i in range(x.size):
        v = np.rint(x[i] * inv_scale) + zp
        if np.isnan(v):
            v = zp
        out[i] = min(max(v, lo), hi)


@register("QUANT_SIM")
def quant_sim(ctx: OpContext):
    """tflgpu's quantization simulator (inserted by graph.float_view): float values rounded to a quantized
    tensor's grid — ``(clamp(rint(x * (1 / scale)) + zero_point, qmin, qmax) - zero_point) * scale``, in the
    steps the OpenCL snippet takes (``ops.quantization.SimGrid``) — or copied."""
    o = ctx.op.options
    if not o.get("tflgpu_sim"):
        raise ctx.fail("QUANT_SIM is tflgpu's internal op; this model's custom op of that name is not supported")
    if "scale" not in o:
        return lambda xs: [np.asarray(xs[0], np.float32)]
    scale, inv = np.float32(o["scale"]), np.float32(1.0) / np.float32(o["scale"])
    zp, lo, hi = np.float32(o["zero_point"]), np.float32(o["qmin"]), np.float32(o["qmax"])

    if o.get("rounding") == "raw_mean":  # (kernels.expressions: the stored integer, half away from zero)
        snap = np.float32(RAW_MEAN_SNAP)

        def run(xs):
            x = np.rint((np.asarray(xs[0], np.float32) * inv + zp) * snap) / snap
            q = np.clip(np.sign(x) * np.floor(np.abs(x) + np.float32(0.5)), lo, hi)
            return [((q - zp) * scale).astype(np.float32)]

        return run

    grid = sim_grid(o)
    return lambda xs: [grid.apply(xs[0])]


@register("ADD_N")
def add_n(ctx: OpContext):
    """The sum of its inputs, all of one shape, added left to right (LiteRT's order)."""
    shapes = [static_shape(ctx, i) for i in range(len(ctx.op.inputs))]
    if None not in shapes and len(set(shapes)) > 1:
        raise ctx.fail(f"its inputs' shapes differ: {[list(s) for s in shapes]}")

    def run(xs):
        if any(x.shape != xs[0].shape for x in xs):
            raise KernelError(f"ADD_N: its inputs' shapes differ: {[list(x.shape) for x in xs]}")
        out = np.array(xs[0], copy=True)
        for x in xs[1:]:
            out += x
        return [out]

    return run


@register("FAKE_QUANT")
def fake_quant(ctx: OpContext):
    """TFLite's FakeQuant: [min, max] nudged so that zero is on the grid of ``num_bits``, each value clamped to it
    and rounded to its nearest step, in float32 as there. ``narrow_range`` is refused, as LiteRT refuses it."""
    o = ctx.op.options
    if o.get("narrow_range"):
        raise ctx.fail("narrow_range FakeQuant is not currently supported at runtime (as in LiteRT: it is meant "
                       "for weights, not activations)")
    lo_q, hi_q = 0, (1 << int(o.get("num_bits", 8))) - 1
    f = np.float32
    lo, hi = f(o.get("min", 0.0)), f(o.get("max", 0.0))
    if not lo <= hi or hi_q <= lo_q:
        raise ctx.fail(f"min {lo} must not exceed max {hi}, and num_bits {o.get('num_bits')} must give a grid")
    scale = (hi - lo) / (f(hi_q) - f(lo_q))
    from_min = f(lo_q) - lo / scale if scale else f(lo_q)
    zero = lo_q if from_min < lo_q else hi_q if from_min > hi_q else int(tfl_round(np.float64(from_min)))
    nudged_lo, nudged_hi = (f(lo_q) - f(zero)) * scale, (f(hi_q) - f(zero)) * scale
    inv = f(1.0) / scale if scale else f(np.inf)

    def run(xs):
        x = np.asarray(xs[0], np.float32)
        shifted = np.minimum(nudged_hi, np.maximum(nudged_lo, x)) - nudged_lo
        with np.errstate(invalid="ignore"):
            # (std::round of float32 values, in float64: a float32 plus one half is exact there)
            steps = tfl_round((shifted * inv).astype(np.float64)).astype(np.float32)
            return [(steps * scale + nudged_lo).astype(np.float32)]

    return run


@register("BUCKETIZE")
def bucketize(ctx: OpContext):
    """The index of each value's bucket: how many boundaries are at most the value (std::upper_bound)."""
    bounds = np.asarray(ctx.opt("boundaries", ()), np.float32)
    if np.any(bounds[1:] < bounds[:-1]):
        raise ctx.fail(f"boundaries {bounds.tolist()} must be sorted")

    def run(xs):
        x = np.asarray(xs[0])
        x = x.astype(np.float32) if x.dtype.kind in "iu" else x  # (an int compared with a float boundary)
        return [np.searchsorted(bounds.astype(x.dtype), x, side="right").astype(np.int32)]

    return run


@register("BITWISE_XOR")
def bitwise_xor(ctx: OpContext):
    return lambda xs: [np.bitwise_xor(xs[0], xs[1])]


@register("RIGHT_SHIFT")
def right_shift(ctx: OpContext):
    """An arithmetic shift for signed types (C++'s >> on them), logical for unsigned; shifts past the width give
    what the C++ kernel's clamp to width - 1 gives."""

    def run(xs):
        x, s = np.broadcast_arrays(np.asarray(xs[0]), np.asarray(xs[1]))
        bits = x.dtype.itemsize * 8
        return [np.right_shift(x, np.clip(s, 0, bits - 1).astype(x.dtype)).astype(x.dtype)]

    return run
