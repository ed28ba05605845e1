"""Reductions and normalizations: MEAN/SUM/REDUCE_*, SOFTMAX, ARG_MAX/MIN, TOPK_V2, CUMSUM,
LOCAL_RESPONSE_NORMALIZATION."""

from __future__ import annotations

import math

import numpy as np

from ..ops.jit import PARALLEL_ELEMENTS, njit, prange
from .registry import KernelError, OpContext, apply_activation, normalize_axis, register


def _axes(ctx: OpContext, xs, ndim: int) -> tuple[int, ...]:
    c = ctx.const(1)
    raw = np.asarray(c if c is not None else xs[1]).reshape(-1)
    return tuple(sorted({normalize_axis(int(a), ndim) for a in raw}))


def _reducer(fn):
    def factory(ctx: OpContext):
        keep = ctx.opt("keep_dims", False)
        out_dtype = ctx.output_tensor(0).dtype
        constant = ctx.const(1) is not None
        known: dict[int, tuple[int, ...]] = {}  # constant axes, by input rank (a small model's op costs their parse)

        def run(xs):
            x = xs[0]
            axes = known.get(x.ndim)
            if axes is None:
                axes = _axes(ctx, xs, x.ndim)
                if constant:
                    known[x.ndim] = axes
            r = fn(x, axis=axes, keepdims=keep)
            return [np.asarray(r).astype(out_dtype, copy=False)]

        return run

    return factory


@njit(cache=True)
def _mean_pixels(x):
    """The mean over the pixels of NHWC float32 ``x``, per image and channel ([n, c]), summed in float64 one
    pixel after another (its channels contiguous): a global average pool in one pass, where numpy's mean over
    two strided axes took ~4x as long."""
    n, h, w, c = x.shape
    out = np.empty((n, c), np.float32)
    acc = np.empty(c, np.float64)
    for b in range(n):
        acc[:] = 0.0
        for i in range(h):
            for j in range(w):
                p = x[b, i, j]
                for k in range(c):
                    acc[k] += p[k]
        for k in range(c):
            out[b, k] = acc[k] / (h * w)
    return out


def _mean(x, axis, keepdims):
    if np.issubdtype(x.dtype, np.integer):  # integer means round toward zero in TFLite
        return np.trunc(np.mean(x, axis=axis, keepdims=keepdims, dtype=np.float64))
    if axis == (1, 2) and x.dtype == np.float32 and x.ndim == 4 and x.shape[1] * x.shape[2] > 0:
        m = _mean_pixels(np.ascontiguousarray(x))
        return m.reshape(m.shape[0], 1, 1, m.shape[1]) if keepdims else m
    count = math.prod(x.shape[a] for a in axis)
    if count == 0:  # (over no values, an empty batch's: NaN, as LiteRT's; numpy's mean would warn of it)
        return np.add.reduce(x, axis=axis, keepdims=keepdims, dtype=np.float32) + np.float32(np.nan)
    if x.dtype != np.float32:
        return np.mean(x, axis=axis, keepdims=keepdims, dtype=np.float32)
    # (numpy's mean, without its Python-level steps: a small model's means took 3.6 us each, this 1.4)
    return np.add.reduce(x, axis=axis, keepdims=keepdims, dtype=np.float32) / np.float32(count)


def _after_last_nan(extreme):
    """REDUCE_MAX / MIN as LiteRT computes them (XNNPACK and the builtin kernels alike): ``acc > x ? acc : x``
    folded in index order, so a NaN replaces what came before it and the next value replaces the NaN: the extreme
    of the values after the last NaN, NaN where the last value is one (``np.max`` gives NaN for any). Over no
    values (an empty batch), the builtin kernels' start: the type's lowest value for a maximum (XNNPACK's -inf)."""

    def reduce(x, axis, keepdims):
        if x.size == 0:  # (over no values: TFLite's builtin kernels' start, the type's lowest / highest value)
            info = np.finfo(x.dtype) if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype)
            return extreme(x, axis=axis, keepdims=keepdims, initial=info.min if extreme is np.max else info.max)
        if not np.issubdtype(x.dtype, np.floating) or not np.isnan(x).any():
            return extreme(x, axis=axis, keepdims=keepdims)
        rest = [a for a in range(x.ndim) if a not in axis]
        flat = np.transpose(x, rest + list(axis)).reshape([x.shape[a] for a in rest] + [-1])
        n = flat.shape[-1]
        last = n - 1 - np.argmax(np.isnan(flat)[..., ::-1], axis=-1)  # (the last NaN's index where there is one)
        last = np.where(np.isnan(flat).any(axis=-1), last, -1)
        fill = np.array(-np.inf if extreme is np.max else np.inf, x.dtype)
        after = np.where(np.arange(n) > last[..., None], flat, fill)
        r = np.where(last == n - 1, np.array(np.nan, x.dtype), extreme(after, axis=-1))
        if keepdims:
            r = np.expand_dims(r, tuple(axis)) if rest else r.reshape([1] * x.ndim)
        return r

    return reduce


for _name, _fn in {
    "MEAN": _mean,
    "SUM": np.sum,
    "REDUCE_MAX": _after_last_nan(np.max),
    "REDUCE_MIN": _after_last_nan(np.min),
    "REDUCE_PROD": np.prod,
    "REDUCE_ANY": np.any,
    "REDUCE_ALL": np.all,
}.items():
    register(_name)(_reducer(_fn))


@njit(cache=True, parallel=True)
def _softmax_rows(x, beta):
    """Softmax of each row of x [rows, c] (float32), rows over both cores: numpy's keepdims reductions over a
    short last axis (a segmentation map's few classes) take ~4 passes at a few elements per call."""
    rows, c = x.shape
    out = np.empty_like(x)
    for r in prange(rows):
        m = x[r, 0]
        for j in range(1, c):
            if x[r, j] > m:  # noqa: PLR1730 (numba's max() drops a NaN that numpy's max keeps)
                m = x[r, j]
        s = np.float32(0)
        for j in range(c):
            e = np.exp((x[r, j] - m) * beta)
            out[r, j] = e
            s += e
        for j in range(c):
            out[r, j] = out[r, j] / s
    return out


@register("SOFTMAX")
def softmax(ctx: OpContext):
    beta = np.float32(ctx.opt("beta", 1.0))

    def run(xs):
        x = xs[0]
        if x.dtype == np.float32 and x.size >= PARALLEL_ELEMENTS and x.ndim >= 1 and x.shape[-1] > 0:
            c = x.shape[-1]
            return [_softmax_rows(np.ascontiguousarray(x).reshape(-1, c), beta).reshape(x.shape)]
        e = np.exp((x - x.max(axis=-1, keepdims=True)) * beta)
        return [(e / e.sum(axis=-1, keepdims=True)).astype(np.float32)]

    return run


@register("LOG_SOFTMAX")
def log_softmax(ctx: OpContext):
    def run(xs):
        x = xs[0]
        s = x - x.max(axis=-1, keepdims=True)
        return [(s - np.log(np.exp(s).sum(axis=-1, keepdims=True))).astype(np.float32)]

    return run


@register("L2_NORMALIZATION")
def l2_norm(ctx: OpContext):
    act = ctx.opt("fused_activation_function", 0)

    def run(xs):
        x = xs[0]
        # (TFLite's reference: the norm clamped to at least 1e-6, not its square: a row of norm 1e-4 is
        # normalized to 1, where clamping the square made it 0.1; NaN kept, as std::max keeps its first argument)
        norm = np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
        norm = np.where(norm < np.float32(1e-6), np.float32(1e-6), norm)
        return [apply_activation((x / norm).astype(np.float32), act)]

    return run


@njit(cache=True)
def _arg_rows(x, largest, out):
    """numpy's argmax / argmin over each row of ``x`` [rows, c] (c > 0): the first extreme, or the first NaN."""
    rows, c = x.shape
    for r in range(rows):
        best, at = x[r, 0], 0
        if not np.isnan(best):
            for j in range(1, c):
                v = x[r, j]
                if np.isnan(v):
                    at = j
                    break
                if (v > best) if largest else (v < best):
                    best, at = v, j
        out[r] = at
    return out


def _arg(largest: bool):
    fn = np.argmax if largest else np.argmin

    def factory(ctx: OpContext):
        dtype = ctx.output_tensor(0).dtype

        def run(xs):
            x = xs[0]
            a = normalize_axis(int(np.asarray(xs[1]).reshape(-1)[0]), x.ndim)
            if a == x.ndim - 1 and x.size and x.dtype.kind == "f":  # (numpy's per-row calls: 1024 rows of 16, 42 us)
                out = np.empty(x.shape[:-1], dtype)
                _arg_rows(np.ascontiguousarray(x).reshape(-1, x.shape[-1]), largest, out.reshape(-1))
                return [out]
            return [fn(x, axis=a).astype(dtype)]

        return run

    return factory


register("ARG_MAX")(_arg(True))
register("ARG_MIN")(_arg(False))


@register("TOPK_V2")
def topk(ctx: OpContext):
    idx_dtype = ctx.output_tensor(1).dtype

    def run(xs):
        x = xs[0]
        k = int(np.asarray(xs[1]).reshape(-1)[0])
        if not 0 <= k <= x.shape[-1]:
            raise KernelError(f"TOPK_V2: k={k} out of range for last dimension {x.shape[-1]}")
        # stable sort on the negated values keeps the lower index first among ties, as TFLite does
        order = np.argsort(-x if not np.issubdtype(x.dtype, np.unsignedinteger) else -x.astype(np.int64),
                           axis=-1, kind="stable")[..., :k]
        return [np.take_along_axis(x, order, axis=-1), order.astype(idx_dtype)]

    return run


@njit(cache=True)
def _cumsum_axis(x, exclusive, reverse, out):
    """TFLite's CUMSUM along the middle axis of ``x`` [outer, n, inner]: a running sum in ``x``'s dtype, from the
    end with ``reverse``, each output before its own value is added with ``exclusive``."""
    outer, n, inner = x.shape
    acc = np.empty(inner, x.dtype)
    for o in range(outer):
        acc[:] = 0
        for k in range(n):
            j = n - 1 - k if reverse else k
            src, dst = x[o, j], out[o, j]
            for i in range(inner):
                if exclusive:
                    dst[i] = acc[i]
                    acc[i] += src[i]
                else:
                    acc[i] += src[i]
                    dst[i] = acc[i]
    return out


@register("CUMSUM")
def cumsum(ctx: OpContext):
    exclusive, reverse = ctx.opt("exclusive", False), ctx.opt("reverse", False)

    def run(xs):
        x = xs[0]
        a = normalize_axis(int(np.asarray(xs[1]).reshape(-1)[0]), x.ndim)
        if x.size and x.dtype.kind in "fi":  # (numpy's: 32x32x8 along the width, 34 us; this 4 us)
            out = np.empty(x.shape, x.dtype)
            three = (math.prod(x.shape[:a]), x.shape[a], math.prod(x.shape[a + 1 :]))
            _cumsum_axis(np.ascontiguousarray(x).reshape(three), exclusive, reverse, out.reshape(three))
            return [out]
        v = np.flip(x, a) if reverse else x
        c = np.cumsum(v, axis=a, dtype=x.dtype)
        if exclusive:
            c = c - v
        return [np.ascontiguousarray(np.flip(c, a) if reverse else c)]

    return run


@njit(cache=True)
def _lrn_denominators(x, radius, alpha, bias, out):
    """bias + alpha * (the squares of each channel's window of ``radius`` either side), per pixel (rows of ``x``),
    as LiteRT's optimized kernel sums them: a running sum over alpha * x^2, each window's next square added and
    its first taken away, in float32."""
    depth = x.shape[1]
    padded = np.zeros(depth + 2 * radius, np.float32)
    for r in range(x.shape[0]):
        for c in range(depth):
            padded[radius + c] = x[r, c] * x[r, c] * alpha
        acc = np.float32(0.0)
        for i in range(2 * radius):
            acc += padded[i]
        for c in range(depth):
            acc += padded[c + 2 * radius]
            out[r, c] = bias + acc
            acc -= padded[c]


@register("LOCAL_RESPONSE_NORMALIZATION")
def local_response_normalization(ctx: OpContext):
    """x / (bias + alpha * sum of x^2 over the ``radius`` channels either side) ^ beta, on 4-D float32."""
    o = ctx.op.options
    radius = int(o.get("radius", 0))
    f = np.float32
    alpha, bias, beta = f(o.get("alpha", 0.0)), f(o.get("bias", 0.0)), f(o.get("beta", 0.0))
    if radius < 0:
        raise ctx.fail(f"radius {radius} must be >= 0")

    def run(xs):
        x = np.ascontiguousarray(xs[0], np.float32)
        if x.ndim != 4:
            raise KernelError(f"LOCAL_RESPONSE_NORMALIZATION takes a 4-D input, got {list(x.shape)}")
        if x.size == 0:
            return [x.copy()]
        rows = x.reshape(-1, x.shape[-1])
        den = np.empty(rows.shape, np.float32)
        _lrn_denominators(rows, radius, alpha, bias, den)
        with np.errstate(all="ignore"):
            if beta == f(1.0):
                scaled = rows * (f(1.0) / den)
            elif beta == f(0.5):
                scaled = rows * (f(1.0) / np.sqrt(den))
            else:
                scaled = rows * np.power(den, -beta)
        return [scaled.astype(np.float32).reshape(x.shape)]

    return run


# REDUCE_WINDOW's reduce_function (ReduceWindowFunction): ADD, MUL, MINIMUM, MAXIMUM, ALL, ANY
_WINDOW_FUNCTIONS = {1: np.add, 2: np.multiply, 3: np.minimum, 4: np.maximum, 5: np.logical_and, 6: np.logical_or}


@register("REDUCE_WINDOW")
def reduce_window(ctx: OpContext):
    """StableHLO's reduce_window as TFLite's REDUCE_WINDOW: each output the window's values folded into
    ``init_value`` one at a time, in the window's row-major order (the float sums follow it); windows strided and
    dilated, no padding. ALL / ANY on numbers: a nonzero value is true, the result 1 or 0."""
    code = int(ctx.opt("reduce_function", 0))
    fn = _WINDOW_FUNCTIONS.get(code)
    if fn is None:
        raise ctx.fail(f"reduce_function {code} is not one REDUCE_WINDOW runs (ADD, MUL, MINIMUM, MAXIMUM, ALL, ANY)")

    def run(xs):
        x = np.asarray(xs[0])
        window, strides, dilations = (np.asarray(v).reshape(-1).astype(np.int64) for v in xs[2:5])
        if not window.size == strides.size == dilations.size == x.ndim or np.any(window < 1) or \
                np.any(strides < 1) or np.any(dilations < 1):
            raise KernelError(f"REDUCE_WINDOW: window {window.tolist()}, strides {strides.tolist()} and dilations "
                              f"{dilations.tolist()} for an input of rank {x.ndim} (one per axis, each >= 1)")
        return [fold_windows(x, np.asarray(xs[1]).reshape(()), fn, window, strides, dilations, code in (5, 6))]

    return run


def fold_windows(x: np.ndarray, init, fn, window, strides, dilations, logical: bool = False) -> np.ndarray:
    """Each output ``init`` folded with its window's values by ``fn`` one at a time, in the window's row-major order
    (the float sums follow it); windows strided and dilated, no padding. ``logical``: a nonzero value is true, the
    result 1 or 0 in ``x``'s type."""
    span = (np.asarray(window) - 1) * np.asarray(dilations) + 1
    dims = [max(0, (n - s) // t + 1) for n, s, t in zip(x.shape, span, strides)]
    acc = np.full(dims, init, dtype=x.dtype)
    if logical:
        acc = acc != 0
    for offset in np.ndindex(*window):
        part = x[tuple(slice(int(o * d), int(o * d + (m - 1) * t + 1), int(t))
                       for o, d, m, t in zip(offset, dilations, dims, strides))]
        acc = fn(acc, part != 0 if logical else part)
    return acc.astype(x.dtype) if logical else acc
