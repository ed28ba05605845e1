"""Integer kernels for quantized (int8 / uint8 / int16) tensors, with TFLite's arithmetic.

An op is *quantized* when one of its non-constant inputs or outputs is an integer tensor
with affine quantization (``real = scale * (q - zero_point)``). For such an op the
executor picks, in this order:

1. an integer kernel (``register_int``): from this module CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, ADD,
   SUB, MUL, the pools, CONCATENATION, QUANTIZE/DEQUANTIZE and table-driven unary ops; SVDF (cpu.svdf) and
   TFLite_Detection_PostProcess (cpu.detection) from theirs. Products are
   accumulated exactly (int32 sums of int8 products, computed in float64, which holds them
   exactly). Convolutions and matrix products are rescaled as LiteRT's default (XNNPACK) path does
   (float32 scale, round to nearest even); ADD/SUB/MUL/requantization with TFLite's fixed-point
   multipliers (``QuantizeMultiplier`` / ``MultiplyByQuantizedMultiplier``). On MobileNet v2 int8
   every intermediate tensor equals LiteRT's bit for bit;
2. for ops that only move values (RESHAPE, TRANSPOSE, GATHER, MAX over values, ...), the float
   kernel on the raw integers, when every quantized tensor of the op has the same scale and zero
   point (as TFLite requires for them); CAST always converts the raw integers, as TFLite's does;
3. otherwise the float kernel on dequantized inputs, its outputs rounded (half away from zero,
   as ``TfLiteRound``) and clamped: within one step of an integer implementation.

Hybrid (dynamic-range) ops — float activations, int8 weights — are not quantized ops. CONV_2D,
DEPTHWISE_CONV_2D and FULLY_CONNECTED run LiteRT's hybrid arithmetic here (``hybrid_factory``: the input
quantized per row or image, integer products); BATCH_MATMUL, TRANSPOSE_CONV and the recurrent ops in their
float kernels (cpu.hybrid's helpers); EMBEDDING_LOOKUP dequantizes the rows it picks.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..ops.attributes import activation_bounds, conv_options, conv_padding
from ..ops.jit import cached_or_not, materialize, njit, prange, readonly
from ..ops.quantization import QParams, dequantize_values, qparams, quantize_values, tfl_round
from ..ops.traits import traits
from .conv import _bias, _depthwise, border_taps, conv_product, window_rows
from .elementwise import dequantize, quantize
from .gemm import conv_requantize, gemm_bias_clamp
from .hybrid import quantize_images, quantize_rows_qd8
from .pool import window
from .registry import KernelError, OpContext, check_geometry, factory_for, once

INT32_MIN, INT32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)  # (no clamp: int32 sums)

_KERNELS: dict = {}



def register_int(*names: str):
    def deco(factory):
        for n in names:
            _KERNELS[n] = factory
        return factory

    return deco


def is_quantized_op(op, sg) -> bool:
    for i in list(op.inputs) + list(op.outputs):
        if i < 0:
            continue
        t = sg.tensors[i]
        if t.data is None and qparams(t) is not None:
            return True
    return False


def quantized_factory(ctx: OpContext):
    """The factory to use for a quantized op (see the module docstring), or None if there is none."""
    name = ctx.op.name
    if name in _KERNELS:
        return _KERNELS[name]
    float_factory = factory_for(name)
    if float_factory is None:
        return None
    if traits(name).raw_integers or (traits(name).quant_transparent and _uniform(ctx)):
        return float_factory
    return _emulated(float_factory)


def _uniform(ctx: OpContext) -> bool:
    ps = [qparams(ctx.input_tensor(i)) for i in range(len(ctx.op.inputs))
          if ctx.input_tensor(i) is not None and ctx.input_tensor(i).data is None]
    ps += [qparams(ctx.output_tensor(i)) for i in range(len(ctx.op.outputs)) if ctx.op.outputs[i] >= 0]
    ps = [p for p in ps if p is not None]
    return all(p.same(ps[0]) for p in ps)


# -- TFLite's fixed-point rescaling -------------------------------------------

def quantize_multiplier(m) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's QuantizeMultiplier: real multipliers (float64) -> (Q31 int64, shift) per element."""
    m = np.atleast_1d(np.asarray(m, np.float64))
    frac, shift = np.frexp(m)
    q = np.round(frac * (1 << 31)).astype(np.int64)  # std::round: half away from zero (frac > 0)
    full = q == (1 << 31)
    q[full] //= 2
    shift = shift.astype(np.int64) + full
    tiny = shift < -31
    q[tiny], shift[tiny] = 0, 0
    q[m == 0] = 0
    return q, shift


@njit(cache=True, inline="always")
def _mbqm(x, q, shift):
    """MultiplyByQuantizedMultiplier on one value (int64 holding the int32 arithmetic): x * 2^max(shift, 0),
    saturated to int32, SaturatingRoundingDoublingHighMul by q, then RoundingDivideByPOT by max(-shift, 0)
    (half away from zero). Without branches (selects and arithmetic shifts), so a loop over it vectorizes:
    a quantized ADD 1.5x faster than the branching form, identical results."""
    one = np.int64(1)
    low31 = (one << 31) - 1
    right = max(-shift, 0)
    v = min(max(x << max(shift, 0), -(one << 31)), low31)
    ab = v * q
    s = ab + ((one << 30) - ((ab >> 63) & low31))  # + 2^30, or + 1 - 2^30 below zero
    r = (s + ((s >> 63) & low31)) >> 31  # s / 2^31 truncated toward zero, as C's division
    r = low31 if (v == q) & (v == -(one << 31)) else r  # (the one product that saturates)
    mask = (one << right) - 1
    threshold = (mask >> 1) + ((r >> 63) & 1)
    return (r >> right) + ((r & mask) > threshold)


def _mbqm_elementwise(x, q, shift):
    return _mbqm(x, q, shift)


# made at the first quantized op, not at import: a signature-typed ufunc compiles (or loads from numba's cache)
# when it is made, and that woke numba's compiler for every model, 0.5 s of a float model's start
def _make_mbqm_ufunc():
    from numba import vectorize

    materialize()  # (the ufunc's body calls _mbqm: a dispatcher by the time it compiles)
    return cached_or_not(lambda cache: vectorize(["int64(int64, int64, int64)"], cache=cache)(_mbqm_elementwise))


_mbqm_ufunc = once(_make_mbqm_ufunc)


def multiply_by_quantized_multiplier(x: np.ndarray, q: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier elementwise, with numpy broadcasting (``q``/``shift``: one value
    or one per channel); one compiled pass, no temporaries."""
    return _mbqm_ufunc()(np.asarray(x, np.int64), np.asarray(q, np.int64), np.asarray(shift, np.int64))


@njit(cache=True)
def _add_sub(a, b, out, za, zb, left, ma, sa, mb, sb, mo, so, zo, lo, hi, sign):
    """Quantized ADD/SUB over flat arrays of one size, as TFLite's reference: each input's offset value shifted
    left, rescaled to twice the larger input scale, summed, rescaled to the output, offset, clamped."""
    for i in range(out.size):
        va = _mbqm((np.int64(a[i]) - za) << left, ma, sa)
        vb = _mbqm((np.int64(b[i]) - zb) << left, mb, sb)
        out[i] = min(max(_mbqm(va + sign * vb, mo, so) + zo, lo), hi)


def requantize(acc: np.ndarray, real_multiplier, zero_point: int, lo: int, hi: int, dtype) -> np.ndarray:
    """Output value = clamp(MultiplyByQuantizedMultiplier(acc, M) + zero_point, lo, hi); ``real_multiplier``
    is one value or one per last-axis channel."""
    q, shift = quantize_multiplier(real_multiplier)
    if len(q) == 1:
        q, shift = q[0], shift[0]
    out = multiply_by_quantized_multiplier(acc, q, shift) + zero_point
    return np.clip(out, lo, hi).astype(dtype)


def activation_range(code: int, p: QParams) -> tuple[int, int]:
    """TFLite's CalculateActivationRangeQuantized."""
    lo, hi = p.qmin, p.qmax

    def q(v):
        return p.z + int(tfl_round(np.float64(v) / np.float64(np.float32(p.s))))

    if code == 1:
        lo = max(lo, q(0.0))
    elif code == 3:
        lo, hi = max(lo, q(0.0)), min(hi, q(6.0))
    elif code == 2:
        lo, hi = max(lo, q(-1.0)), min(hi, q(1.0))
    return lo, hi


def _require(ctx: OpContext, t, what: str) -> QParams:
    p = qparams(t)
    if p is None:
        raise ctx.fail(f"{what} '{t.name if t is not None else '?'}' must be a quantized integer tensor")
    return p


def _check_input(ctx: OpContext, x: np.ndarray, p: QParams, ndim: int | None = None) -> None:
    if x.dtype != p.dtype:
        raise KernelError(f"{ctx.op.name}: input is {x.dtype}, the model declares {p.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise KernelError(f"{ctx.op.name}: input must be {ndim}-D, got shape {x.shape}")


# -- convolutions and matrix products -------------------------------------------

def _weights(ctx: OpContext, idx: int, what: str) -> tuple[np.ndarray, QParams]:
    w = ctx.const(idx)
    t = ctx.input_tensor(idx)
    if w is None:
        raise ctx.fail(f"quantized {ctx.op.name} needs constant {what}")
    p = _require(ctx, t, what)
    return w, p


def _int_bias(ctx: OpContext, idx: int, n: int) -> np.ndarray:
    if not ctx.has_input(idx):
        return np.zeros(n, np.int64)
    b = ctx.const(idx)
    if b is None:
        raise ctx.fail("quantized ops need a constant bias")
    b = np.asarray(b).reshape(-1)
    if not np.issubdtype(b.dtype, np.integer) or b.size != n:
        raise ctx.fail(f"bias must be {n} integers, got {b.size} of {b.dtype}")
    return b.astype(np.int64)


def _exact_dtype(w_mat: np.ndarray, pi: QParams):
    """float32 when every partial sum of (input - zero point) x weight products over a column of ``w_mat``
    stays below 2^24 (then float32 sums are exact integers), else float64 (exact below 2^53)."""
    worst_input = max(pi.z - pi.qmin, pi.qmax - pi.z)
    bound = float(np.abs(w_mat).sum(axis=0).max(initial=0)) * worst_input
    return np.float32 if bound < 2 ** 24 else np.float64


def _gemm_weights(w_mat: np.ndarray, pi: QParams) -> np.ndarray:
    """[K, N] weights minus their zero point, contiguous, in the dtype whose sums are exact."""
    return np.ascontiguousarray(w_mat, dtype=_exact_dtype(w_mat, pi))


def _multipliers(pi: QParams, pw: QParams, po: QParams, n: int) -> np.ndarray:
    """Per output channel: input_scale * filter_scale / output_scale, in float32 (as XNNPACK)."""
    ws = pw.scale.astype(np.float32)
    if len(ws) not in (1, n):
        raise ValueError(f"filter has {len(ws)} scales for {n} output channels")
    return (np.float32(pi.s) * np.broadcast_to(ws, (n,)) / np.float32(po.s)).astype(np.float32)


@njit(cache=True, parallel=True)
def _requant_rows(acc, bias, scale, zero_point, lo, hi, out):
    rows, n = acc.shape
    vlo, vhi = np.float32(lo - zero_point), np.float32(hi - zero_point)
    for r in prange(rows):
        for c in range(n):
            v = np.float32(acc[r, c] + bias[c]) * scale[c]
            out[r, c] = np.int32(np.rint(min(max(v, vlo), vhi))) + zero_point


def requantize_fp32(acc: np.ndarray, bias: np.ndarray, scale: np.ndarray, zero_point: int, lo: int, hi: int,
                    dtype) -> np.ndarray:
    """XNNPACK's "fp32" requantization, which LiteRT applies to quantized convolutions and matrix
    products: float32(acc + bias) * scale, clamped, rounded to nearest even, plus the zero point.
    ``acc``: [rows, channels] exact integer sums (int64, or float64 holding integers)."""
    acc2 = acc.reshape(-1, acc.shape[-1])
    out = np.empty(acc2.shape, dtype)
    b = np.ascontiguousarray(np.broadcast_to(bias, (acc2.shape[1],)), np.float64 if acc2.dtype.kind == "f" else np.int64)
    s = np.ascontiguousarray(np.broadcast_to(scale, (acc2.shape[1],)), np.float32)
    _requant_rows(np.ascontiguousarray(acc2), b, s, int(zero_point), int(lo), int(hi), out)
    return out.reshape(acc.shape)


@register_int("CONV_2D")
def conv2d_q(ctx: OpContext):
    sh, sw, dh, dw, pad = conv_options(ctx.op.options)
    pi, po = _require(ctx, ctx.input_tensor(0), "input"), _require(ctx, ctx.output_tensor(0), "output")
    w, pw = _weights(ctx, 1, "filter")
    if w.ndim != 4:
        raise ctx.fail(f"filter must be 4-D [out, kh, kw, in], got {list(w.shape)}")
    oc, kh, kw, ic = w.shape
    check_geometry(ctx, stride_h=sh, stride_w=sw, dilation_h=dh, dilation_w=dw, filter_h=kh, filter_w=kw,
                   filter_depth=ic, out_channels=oc)
    _, wz = pw.broadcast(4)
    w_mat = once(lambda: _gemm_weights((w.astype(np.float64) - np.asarray(wz, np.float64)).reshape(oc, -1).T, pi))
    bias_f = _int_bias(ctx, 2, oc).astype(np.float64)
    mult = _multipliers(pi, pw, po, oc)
    lo, hi = activation_range(ctx.opt("fused_activation_function", 0), po)

    def run(xs):
        x = np.asarray(xs[0])
        _check_input(ctx, x, pi, 4)
        n, h, wd, c = x.shape
        if c != ic:
            raise KernelError(f"CONV_2D: input has {c} channels, the filter {ic} (grouped int8 conv unsupported)")
        oh, pt = conv_padding(h, kh, sh, dh, pad)
        ow, pl = conv_padding(wd, kw, sw, dw, pad)
        if oh <= 0 or ow <= 0:
            raise KernelError(f"CONV_2D: empty output for input {x.shape}")
        wm = w_mat()
        y = conv_requantize(x, pi.z, wm, bias_f, mult, po.z, lo, hi, po.dtype, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
        if y is None:  # (no usable BLAS)
            exact = wm.dtype.type
            xf = x.astype(exact) - exact(pi.z)  # padding then holds real zero, as TFLite's input offset does
            acc = conv_product(xf, wm, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)  # exact integers (see _exact_dtype)
            y = requantize_fp32(acc, bias_f, mult, po.z, lo, hi, po.dtype)
        return [y.reshape(n, oh, ow, oc)]

    return run


@njit(cache=True, parallel=True)
def _depthwise_requantize(x, xz, w, bias, scale, oz, lo, hi, sh, sw, dh, dw, pt, pl, oh, ow, mult, out):
    """An integer depthwise convolution into ``out`` [n, oh, ow, oc] (8- or 16-bit): int32 sums of
    (x - xz) * w from ``bias`` on, then XNNPACK's fp32 requantization, one output pixel at a time (the input is
    read as it is, no converted copy; no int32 tensor of sums)."""
    n, h, wd, c = x.shape
    kh, kw, oc = w.shape[1], w.shape[2], w.shape[3]
    vlo, vhi = np.float32(lo - oz), np.float32(hi - oz)
    for row in prange(n * oh):
        b = row // oh
        oy = row % oh
        acc = np.empty(oc, np.int32)
        for ox in range(ow):
            for o in range(oc):
                acc[o] = bias[o]
            for ky in range(kh):
                iy = oy * sh - pt + ky * dh
                if iy < 0 or iy >= h:
                    continue
                for kx in range(kw):
                    ix = ox * sw - pl + kx * dw
                    if ix < 0 or ix >= wd:
                        continue
                    src, wk = x[b, iy, ix], w[0, ky, kx]
                    if mult == 1:
                        for ch in range(c):
                            acc[ch] += (np.int32(src[ch]) - xz) * wk[ch]
                    else:
                        for ch in range(c):
                            xv = np.int32(src[ch]) - xz
                            for m in range(mult):
                                acc[ch * mult + m] += xv * wk[ch * mult + m]
            dst = out[b, oy, ox]
            for o in range(oc):
                v = np.float32(acc[o]) * scale[o]
                dst[o] = np.int32(np.rint(min(max(v, vlo), vhi))) + oz
    return out


@njit(cache=True, parallel=True)
def _depthwise3x3_requantize(x, xz, w, bias, scale, oz, lo, hi, sh, sw, dh, dw, pt, pl, oh, ow, out):
    """``_depthwise_requantize`` for a 3x3 filter ``w`` [3, 3, c] of multiplier 1: where a pixel's nine taps are
    all inside the input, its sums in one pass over them, in int32 throughout (numba's scalar arithmetic widens
    to int64 unless told, and int64 products vectorize poorly). The same sums (exact), so the same outputs.
    MobileNet v2 int8's 112x112x32 layer: 300 -> 196 us, 56x56x144: 200 -> 142 us (2 threads)."""
    n, _, wd, c = x.shape
    vlo, vhi = np.float32(lo - oz), np.float32(hi - oz)
    i32 = np.int32
    for row in prange(n * oh):
        b = row // oh
        oy = row % oh
        iy0 = oy * sh - pt
        rows_in, r0, r1, r2 = window_rows(x, b, iy0, dh)
        acc = np.empty(c, np.int32)
        for ox in range(ow):
            ix0 = ox * sw - pl
            if rows_in and ix0 >= 0 and ix0 + 2 * dw < wd:
                j0, j1, j2 = ix0, ix0 + dw, ix0 + 2 * dw
                for ch in range(c):
                    s = i32(bias[ch] + i32(i32(i32(r0[j0, ch]) - xz) * w[0, 0, ch]))
                    s = i32(s + i32(i32(i32(r0[j1, ch]) - xz) * w[0, 1, ch]))
                    s = i32(s + i32(i32(i32(r0[j2, ch]) - xz) * w[0, 2, ch]))
                    s = i32(s + i32(i32(i32(r1[j0, ch]) - xz) * w[1, 0, ch]))
                    s = i32(s + i32(i32(i32(r1[j1, ch]) - xz) * w[1, 1, ch]))
                    s = i32(s + i32(i32(i32(r1[j2, ch]) - xz) * w[1, 2, ch]))
                    s = i32(s + i32(i32(i32(r2[j0, ch]) - xz) * w[2, 0, ch]))
                    s = i32(s + i32(i32(i32(r2[j1, ch]) - xz) * w[2, 1, ch]))
                    acc[ch] = i32(s + i32(i32(i32(r2[j2, ch]) - xz) * w[2, 2, ch]))
            else:
                for ch in range(c):
                    acc[ch] = bias[ch]
                border_taps(x, w, b, iy0, ix0, dh, dw, xz, acc)
            dst = out[b, oy, ox]
            for ch in range(c):
                v = np.float32(acc[ch]) * scale[ch]
                dst[ch] = np.int32(np.rint(min(max(v, vlo), vhi))) + oz
    return out


@register_int("DEPTHWISE_CONV_2D")
def depthwise_q(ctx: OpContext):
    sh, sw, dh, dw, pad = conv_options(ctx.op.options)
    pi, po = _require(ctx, ctx.input_tensor(0), "input"), _require(ctx, ctx.output_tensor(0), "output")
    w, pw = _weights(ctx, 1, "filter")
    if w.ndim != 4 or w.shape[0] != 1:
        raise ctx.fail(f"filter must be [1, kh, kw, out], got {list(w.shape)}")
    _, kh, kw, oc = w.shape
    check_geometry(ctx, stride_h=sh, stride_w=sw, dilation_h=dh, dilation_w=dw, filter_h=kh, filter_w=kw,
                   out_channels=oc)
    _, wz = pw.broadcast(4)
    w_i = np.ascontiguousarray(w.astype(np.int32) - np.asarray(wz, np.int32))
    bias = _int_bias(ctx, 2, oc).astype(np.int32)  # int32 sums, as TFLite's (|sums| < 2^31 for 8-bit values)
    mult = _multipliers(pi, pw, po, oc)
    lo, hi = activation_range(ctx.opt("fused_activation_function", 0), po)

    def run(xs):
        x = np.asarray(xs[0])
        _check_input(ctx, x, pi, 4)
        _, h, wd, c = x.shape
        if c == 0 or oc % c:
            raise KernelError(f"DEPTHWISE_CONV_2D: output channels {oc} not a multiple of input channels {c}")
        oh, pt = conv_padding(h, kh, sh, dh, pad)
        ow, pl = conv_padding(wd, kw, sw, dw, pad)
        out = np.empty((x.shape[0], max(oh, 0), max(ow, 0), oc), po.dtype)
        if kh == kw == 3 and oc == c and oh > 0 and ow > 0:
            return [_depthwise3x3_requantize(np.ascontiguousarray(x), np.int32(pi.z), w_i[0], bias, mult, po.z, lo, hi,
                                             sh, sw, dh, dw, pt, pl, oh, ow, out)]
        return [_depthwise_requantize(np.ascontiguousarray(x), np.int32(pi.z), w_i, bias, mult, po.z, lo, hi, sh, sw,
                                      dh, dw, pt, pl, max(oh, 0), max(ow, 0), oc // c, out)]

    return run


FEW_ROWS = 8  # an integer product of at most this many rows is int32 dot products (a classifier's one row: the
# float product's sgemm packs all of the weights, as float64 where float32 sums could be inexact, at every call)


@njit(cache=True, parallel=True)
def _rows_requantize(x, xz, w, bias, scale, oz, lo, hi, out):
    """out [m, n] (8- or 16-bit) = XNNPACK's fp32 requantization of int32 sums (x - xz) . w[j] + bias[j], for a
    few rows of integer ``x`` [m, k] and int16 ``w`` [n, k] (weights minus their zero point); the output
    channels split between the threads, each row's dot products in int32 (they vectorize)."""
    m, k = x.shape
    n = w.shape[0]
    vlo, vhi = np.float32(lo - oz), np.float32(hi - oz)
    xs = np.empty((m, k), np.int16)
    for r in range(m):
        for i in range(k):
            xs[r, i] = np.int16(np.int32(x[r, i]) - xz)
    for j in prange(n):
        wj = w[j]
        for r in range(m):
            xr = xs[r]
            s = np.int32(0)
            for i in range(k):
                s += np.int32(xr[i]) * np.int32(wj[i])
            v = np.float32(np.int64(s) + bias[j]) * scale[j]
            out[r, j] = np.int32(np.rint(min(max(v, vlo), vhi))) + oz
    return out


@register_int("FULLY_CONNECTED")
def fully_connected_q(ctx: OpContext):
    pi, po = _require(ctx, ctx.input_tensor(0), "input"), _require(ctx, ctx.output_tensor(0), "output")
    w, pw = _weights(ctx, 1, "weights")
    if w.ndim != 2:
        raise ctx.fail(f"weights must be 2-D [units, depth], got {list(w.shape)}")
    units, depth = w.shape
    _, wz = pw.broadcast(2)
    w_t = once(lambda: _gemm_weights((w.astype(np.float64) - np.asarray(wz, np.float64)).T, pi))
    w_rows = once(lambda: np.ascontiguousarray(w.astype(np.int16) - np.asarray(wz, np.int16).reshape(-1, 1)))
    int_bias = _int_bias(ctx, 2, units)
    bias = int_bias.astype(np.float64)
    mult = _multipliers(pi, pw, po, units)
    lo, hi = activation_range(ctx.opt("fused_activation_function", 0), po)
    keep = ctx.opt("keep_num_dims", False)
    worst_input = max(pi.z - pi.qmin, pi.qmax - pi.z)
    sums_fit = (np.abs(w.astype(np.int64) - np.asarray(wz, np.int64).reshape(-1, 1)).sum(axis=1).max(initial=0)
                * worst_input + np.abs(int_bias).max(initial=0)) < 2 ** 31 if w.size else False

    def run(xs):
        x = np.asarray(xs[0])
        _check_input(ctx, x, pi)
        if x.size % depth:
            raise KernelError(f"FULLY_CONNECTED: input of {x.size} values is not a multiple of depth {depth}")
        x2 = x.reshape(-1, depth)
        if sums_fit and x2.shape[0] <= FEW_ROWS:
            y = np.empty((x2.shape[0], units), po.dtype)
            _rows_requantize(np.ascontiguousarray(x2), np.int32(pi.z), w_rows(), int_bias, mult, po.z, lo, hi, y)
        else:
            wt = w_t()
            exact = wt.dtype.type
            acc = gemm_bias_clamp(x2.astype(exact) - exact(pi.z), wt, None, -np.inf, np.inf)
            y = requantize_fp32(acc, bias, mult, po.z, lo, hi, po.dtype)
        return [y.reshape(x.shape[:-1] + (units,)) if keep else y]

    return run


# -- elementwise arithmetic ---------------------------------------------------------

def _broadcast(ctx: OpContext, a: np.ndarray, b: np.ndarray):
    """``a`` and ``b`` broadcast to one shape, read-only views (as NumPy 2 makes them; NumPy 1's warn when their
    flag is read, and a write through one lands in every element it repeats)."""
    try:
        views = np.broadcast_arrays(a, b)
    except ValueError as e:
        raise KernelError(f"{ctx.op.name}: cannot broadcast {a.shape} with {b.shape}") from e
    for v in views:
        v.flags.writeable = False
    return views


BLOCK_ELEMENTS = 1 << 20


def _blockwise(fn, a: np.ndarray, b: np.ndarray, dtype) -> np.ndarray:
    """``fn(a, b)`` on two broadcast views of one shape, a block of at most about BLOCK_ELEMENTS at a time: what
    ``fn`` makes per element (contiguous copies of broadcast views, MUL's int64 temporaries) stays bounded however
    large the tensor (a 268M-element ADD needed over 8 GB at once). Small tensors are one call."""
    shape = a.shape
    if a.size <= BLOCK_ELEMENTS or not shape:
        return fn(a, b)
    axis = 0  # block along the outermost axis whose inner part fits a block
    while axis < len(shape) - 1 and math.prod(shape[axis + 1 :]) > BLOCK_ELEMENTS:
        axis += 1
    step = max(1, BLOCK_ELEMENTS // max(1, math.prod(shape[axis + 1 :])))
    out = np.empty(shape, dtype)
    for lead in np.ndindex(*shape[:axis]):
        for i in range(0, shape[axis], step):
            sl = (*lead, slice(i, i + step))
            out[sl] = fn(a[sl], b[sl])
    return out


@register_int("ADD", "SUB")
def add_sub_q(ctx: OpContext):
    """TFLite's quantized ADD/SUB: both inputs shifted left (20 bits for 8-bit, 15 for int16), scaled to
    twice the larger input scale, summed, then rescaled to the output."""
    p1 = _require(ctx, ctx.input_tensor(0), "input 0")
    p2 = _require(ctx, ctx.input_tensor(1), "input 1")
    po = _require(ctx, ctx.output_tensor(0), "output")
    left = 15 if po.dtype == np.int16 else 20
    twice_max = 2.0 * max(np.float64(p1.s), np.float64(p2.s))
    m1, s1 = quantize_multiplier(np.float64(p1.s) / twice_max)
    m2, s2 = quantize_multiplier(np.float64(p2.s) / twice_max)
    mo, so = quantize_multiplier(twice_max / ((1 << left) * np.float64(po.s)))
    lo, hi = activation_range(ctx.opt("fused_activation_function", 0), po)
    sign = -1 if ctx.op.name == "SUB" else 1

    fixed = tuple(int(v) for v in (p1.z, p2.z, left, m1[0], s1[0], m2[0], s2[0], mo[0], so[0], po.z, lo, hi, sign))

    def block(a, b):
        out = np.empty(a.shape, po.dtype)
        flat = lambda v: readonly(np.ascontiguousarray(v).reshape(-1))
        _add_sub(flat(a), flat(b), out.reshape(-1), *fixed)
        return out

    def run(xs):
        a, b = _broadcast(ctx, np.asarray(xs[0]), np.asarray(xs[1]))
        return [_blockwise(block, a, b, po.dtype)]

    return run


@register_int("MUL")
def mul_q(ctx: OpContext):
    p1 = _require(ctx, ctx.input_tensor(0), "input 0")
    p2 = _require(ctx, ctx.input_tensor(1), "input 1")
    po = _require(ctx, ctx.output_tensor(0), "output")
    m = np.float64(p1.s) * np.float64(p2.s) / np.float64(po.s)
    lo, hi = activation_range(ctx.opt("fused_activation_function", 0), po)

    def block(a, b):
        return requantize((a.astype(np.int64) - p1.z) * (b.astype(np.int64) - p2.z), m, po.z, lo, hi, po.dtype)

    def run(xs):
        a, b = _broadcast(ctx, np.asarray(xs[0]), np.asarray(xs[1]))
        return [_blockwise(block, a, b, po.dtype)]

    return run


# -- pooling, concatenation, (de)quantization --------------------------------------

@njit(cache=True, parallel=True)
def _pool_int(x, is_max, kh, kw, sh, sw, pt, pl, oh, ow, lo, hi):
    n, h, w, c = x.shape
    out = np.empty((n, oh, ow, c), dtype=np.int64)
    for row in prange(n * oh):
        b = row // oh
        oy = row % oh
        y0, y1 = window(oy, sh, pt, kh, h)
        for ox in range(ow):
            x0, x1 = window(ox, sw, pl, kw, w)
            count = (y1 - y0) * (x1 - x0)
            for ch in range(c):
                if is_max:
                    acc = lo
                    for iy in range(y0, y1):
                        for ix in range(x0, x1):
                            acc = max(acc, x[b, iy, ix, ch])
                else:
                    acc = 0
                    for iy in range(y0, y1):
                        for ix in range(x0, x1):
                            acc += x[b, iy, ix, ch]
                    if count > 0:  # TFLite: round half away from zero
                        acc = (acc + count // 2) // count if acc > 0 else -((-acc + count // 2) // count)
                out[b, oy, ox, ch] = min(max(acc, lo), hi)
    return out


def _pool_q(is_max: bool):
    def factory(ctx: OpContext):
        pi, po = _require(ctx, ctx.input_tensor(0), "input"), _require(ctx, ctx.output_tensor(0), "output")
        if not pi.same(po):  # TFLite requires it; anything else goes through the float emulation
            return _emulated(factory_for(ctx.op.name))(ctx)
        o = ctx.op.options
        kh, kw = o.get("filter_height", 1), o.get("filter_width", 1)
        sh, sw = o.get("stride_h", 1), o.get("stride_w", 1)
        pad = o.get("padding", 0)
        check_geometry(ctx, filter_h=kh, filter_w=kw, stride_h=sh, stride_w=sw)
        lo, hi = activation_range(o.get("fused_activation_function", 0), po)

        def run(xs):
            x = np.asarray(xs[0])
            _check_input(ctx, x, pi, 4)
            oh, pt = conv_padding(x.shape[1], kh, sh, 1, pad)
            ow, pl = conv_padding(x.shape[2], kw, sw, 1, pad)
            y = _pool_int(np.ascontiguousarray(x.astype(np.int64)), is_max, kh, kw, sh, sw, pt, pl,
                          max(oh, 0), max(ow, 0), lo, hi)
            return [y.astype(po.dtype)]

        return run

    return factory


register_int("MAX_POOL_2D")(_pool_q(True))
register_int("AVERAGE_POOL_2D")(_pool_q(False))


@register_int("CONCATENATION")
def concatenation_q(ctx: OpContext):
    """Inputs with other parameters than the output are requantized as TFLite does (in float)."""
    from .registry import normalize_axis

    po = _require(ctx, ctx.output_tensor(0), "output")
    axis = ctx.opt("axis", 0)
    ps = [qparams(ctx.input_tensor(i)) for i in range(len(ctx.op.inputs))]
    inv_out = np.float32(1.0) / np.float32(po.s)

    def convert(x, p):
        if p is None or p.same(po):
            return x
        scale = np.float32(p.s) * inv_out
        bias = np.float32(-p.z) * scale
        v = tfl_round(x.astype(np.float32) * scale + bias) + po.z
        return np.clip(v, po.qmin, po.qmax).astype(po.dtype)

    def run(xs):
        arrs = [convert(np.asarray(x), p) for x, p in zip(xs, ps)]
        try:
            return [np.concatenate(arrs, axis=normalize_axis(axis, arrs[0].ndim))]
        except ValueError as e:
            raise KernelError(f"CONCATENATION: {e}") from e

    return run


@register_int("QUANTIZE")
def quantize_q(ctx: OpContext):
    pi, po = qparams(ctx.input_tensor(0)), _require(ctx, ctx.output_tensor(0), "output")
    if pi is None:  # float -> int: the float kernel's rounding is LiteRT's
        return quantize(ctx)
    m = np.float64(pi.s) / np.float64(po.s)  # requantization (TFLite's Requantize)

    def run(xs):
        x = np.asarray(xs[0])
        return [requantize(x.astype(np.int64) - pi.z, m, po.z, po.qmin, po.qmax, po.dtype)]

    return run


register_int("DEQUANTIZE")(dequantize)  # (int -> float: the float kernel dequantizes with the tensor's params)


# -- unary ops by lookup table ------------------------------------------------------

_LUT_OPS = ("LOGISTIC", "TANH", "HARD_SWISH", "ELU", "RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1",
            "LEAKY_RELU", "GELU", "EXP", "LOG", "SQRT", "RSQRT", "ABS", "NEG", "SQUARE")


def _lut_factory(ctx: OpContext):
    """8-bit unary ops: a 256-entry table of quantize(f(dequantize(q))), as TFLite's LUT kernels build it."""
    pi, po = qparams(ctx.input_tensor(0)), qparams(ctx.output_tensor(0))
    if pi is None or po is None or pi.dtype != po.dtype or pi.dtype == np.int16:
        return _emulated(factory_for(ctx.op.name))(ctx)
    f = factory_for(ctx.op.name)(_float_ctx(ctx))
    levels = np.arange(pi.qmin, pi.qmax + 1, dtype=np.int64)
    real = ((levels - pi.z).astype(np.float32) * np.float32(pi.s)).astype(np.float32)
    with np.errstate(all="ignore"):
        transformed = np.asarray(f([real])[0], np.float32)
    table = quantize_values(transformed, po)  # (NaN as zero)
    offset = -pi.qmin

    def run(xs):
        x = np.asarray(xs[0])
        _check_input(ctx, x, pi)
        return [table[x.astype(np.int64) + offset]]

    return run


register_int(*_LUT_OPS)(_lut_factory)


# -- everything else: the float kernel between dequantize and quantize --------------------

def _float_ctx(ctx: OpContext) -> OpContext:
    """The op's context with its quantized tensors seen as float32 (constants dequantized)."""
    sg = ctx.subgraph
    idx = {i for i in ctx.op.inputs if i >= 0} | {i for i in ctx.op.outputs if i >= 0}
    tensors = list(sg.tensors)
    consts = {}
    for i in idx:
        t = tensors[i]
        p = qparams(t)
        if p is None:
            continue
        data = dequantize_values(t.data, p) if t.data is not None else None
        tensors[i] = replace(t, dtype=np.dtype(np.float32), type_name="FLOAT32", data=data)
        if data is not None:
            consts[i] = data
    return OpContext(ctx.op, replace(sg, tensors=tensors), ctx.runtime, _ConstView(consts, ctx))


class _ConstView:
    """The runner's constants, with this op's quantized constants replaced by their float values."""

    def __init__(self, overrides, ctx):
        self.overrides, self.ctx = overrides, ctx

    def get(self, key, default=None):
        if key in self.overrides:
            return self.overrides[key]
        if self.ctx.consts is not None:
            v = self.ctx.consts.get(key)
        else:
            v = self.ctx.runtime.constant_value(self.ctx.subgraph.index, key)
        return default if v is None else v


def _emulated(float_factory):
    def factory(ctx: OpContext):
        if float_factory is None:
            raise ctx.fail("no kernel")
        fn = float_factory(_float_ctx(ctx))
        in_q = [qparams(ctx.input_tensor(i)) if ctx.input_tensor(i) is not None
                and ctx.input_tensor(i).data is None else None for i in range(len(ctx.op.inputs))]
        out_q = [qparams(ctx.output_tensor(i)) if ctx.op.outputs[i] >= 0 else None
                 for i in range(len(ctx.op.outputs))]
        # quantized state variables (an integer LSTM's): the float kernel updates their dequantized copies, which
        # are quantized back into the variables, so the state carries over to the next invoke
        states = [i for i, p in enumerate(in_q) if p is not None and ctx.input_tensor(i).is_variable]

        def run(xs):
            fx = [dequantize_values(x, p) if p is not None and x is not None else x for x, p in zip(xs, in_q)]
            with np.errstate(all="ignore"):
                ys = fn(fx)
                for i in states:
                    if xs[i] is not None and xs[i].flags.writeable and fx[i].shape == xs[i].shape:
                        np.copyto(xs[i], quantize_values(fx[i], in_q[i]))
            return [quantize_values(np.asarray(y), p) if p is not None else y  # (NaN as zero)
                    for y, p in zip(ys, out_q)]

        return run

    return factory


# -- hybrid (dynamic-range) ops: float activations, int8 weights ----------------------------------

HYBRID = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def is_hybrid_op(op, sg) -> bool:
    """A conv / matrix product with float activations and constant int8 weights (dynamic-range models)."""
    if op.name not in HYBRID or len(op.inputs) < 2 or op.inputs[0] < 0 or op.inputs[1] < 0:
        return False
    x, w = sg.tensors[op.inputs[0]], sg.tensors[op.inputs[1]]
    return x.dtype == np.float32 and w.data is not None and w.dtype == np.int8 and qparams(w) is not None


@njit(cache=True, parallel=True)
def _hybrid_scale(acc, row_scale, w_scale, bias, lo, hi):
    """float32(acc) * (row_scale[r] * w_scale[c]) + bias[c], clamped to [lo, hi] (a NaN kept): the hybrid
    kernels' return to float, one parallel pass (numpy took four)."""
    m, n = acc.shape
    out = np.empty((m, n), np.float32)
    for r in prange(m):
        s = row_scale[r]
        for c in range(n):
            v = np.float32(acc[r, c]) * np.float32(s * w_scale[c]) + bias[c]
            if v < lo:  # noqa: PLR1730
                v = lo
            if v > hi:  # noqa: PLR1730
                v = hi
            out[r, c] = v
    return out


def hybrid_factory(ctx: OpContext):
    """LiteRT's hybrid kernels: the float input quantized to int8, an exact integer product with the
    int8 weights, then scaled back to float. How the input is quantized follows what LiteRT runs:
    1×1 convolutions and FULLY_CONNECTED go to XNNPACK's dynamically quantized GEMM (each row — pixel
    or batch row — asymmetrically on its own range); other convolutions stay on TFLite's per-channel
    hybrid kernels (each image asymmetrically). Products are summed in float32 where every partial sum
    provably stays below 2^24 (exact), else in float64."""
    name = ctx.op.name
    w, pw = _weights(ctx, 1, "filter")
    act = ctx.opt("fused_activation_function", 0)
    if act not in (0, 1, 2, 3):
        raise ctx.fail(f"fused activation {act} is not supported by the hybrid kernel")
    _, wz = pw.broadcast(w.ndim)
    full_range = QParams(np.ones(1, np.float32), np.zeros(1, np.int64), 0, np.dtype(np.uint8))  # |q - zp| <= 255

    def centered():
        return w.astype(np.float64) - np.asarray(wz, np.float64)

    # weight re-layouts wait for the first CPU run (under a GpuDelegate most never come)
    if name == "FULLY_CONNECTED":
        if w.ndim != 2:
            raise ctx.fail(f"weights must be 2-D [units, depth], got {list(w.shape)}")
        units, depth = w.shape
        n_out = units
        w_mat = once(lambda: _gemm_weights(centered().T, full_range))
    elif name == "CONV_2D":
        if w.ndim != 4:
            raise ctx.fail(f"filter must be 4-D [out, kh, kw, in], got {list(w.shape)}")
        oc, kh, kw, ic = w.shape
        n_out = oc
        w_mat = once(lambda: _gemm_weights(centered().reshape(oc, -1).T, full_range))
    else:
        if w.ndim != 4 or w.shape[0] != 1:
            raise ctx.fail(f"filter must be [1, kh, kw, out], got {list(w.shape)}")
        _, kh, kw, oc = w.shape
        n_out = oc
        w_i = once(lambda: np.ascontiguousarray(centered().astype(np.int32)))
    w_scale = readonly(np.ascontiguousarray(np.broadcast_to(pw.scale.astype(np.float32), (n_out,))))
    bias = _bias(ctx, 2, n_out)
    lo, hi = (np.float32(v) for v in activation_bounds(act))
    sh, sw, dh, dw, pad = conv_options(ctx.op.options)
    keep = ctx.opt("keep_num_dims", False)
    pointwise = name == "CONV_2D" and kh == kw == sh == sw == 1

    def run(xs):
        x = np.asarray(xs[0], np.float32)
        if name == "FULLY_CONNECTED" or (pointwise and x.ndim == 4):
            d = depth if name == "FULLY_CONNECTED" else ic
            if x.size % d:
                raise KernelError(f"{name}: input of {x.size} values is not a multiple of depth {d}")
            qz, scales = quantize_rows_qd8(np.ascontiguousarray(x.reshape(-1, d)))
            wm = w_mat()
            acc = gemm_bias_clamp(qz.astype(wm.dtype, copy=False), wm, None, -np.inf, np.inf)
            y = _hybrid_scale(acc, scales, w_scale, bias, lo, hi)
            if name == "CONV_2D":
                return [y.reshape(x.shape[:-1] + (oc,))]
            return [y.reshape(x.shape[:-1] + (units,)) if keep else y]
        if x.ndim != 4:
            raise KernelError(f"{name}: input must be 4-D, got shape {x.shape}")
        n, h, wd, c = x.shape
        qz, scales = quantize_images(x)  # padding then holds the real zero, as the offset does
        oh, pt = conv_padding(h, kh, sh, dh, pad)
        ow, pl = conv_padding(wd, kw, sw, dw, pad)
        if name == "CONV_2D":
            if c != ic:
                raise KernelError(f"CONV_2D: input has {c} channels, the filter {ic}")
            wm = w_mat()
            acc = conv_product(qz.astype(wm.dtype, copy=False), wm, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
            acc = acc.reshape(n, oh, ow, oc)
        else:
            if c == 0 or oc % c:
                raise KernelError(f"DEPTHWISE_CONV_2D: output channels {oc} not a multiple of input channels {c}")
            acc = _depthwise(np.ascontiguousarray(qz.astype(np.int32)), w_i(), np.zeros(oc, np.int32), sh, sw,
                             dh, dw, pt, pl, max(oh, 0), max(ow, 0), oc // c, INT32_MIN, INT32_MAX)
        per_pixel = np.repeat(scales, acc.size // max(1, n * oc))
        y = _hybrid_scale(np.ascontiguousarray(acc).reshape(-1, oc), per_pixel, w_scale, bias, lo, hi)
        return [y.reshape(acc.shape)]

    return run
