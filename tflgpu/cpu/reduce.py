"""Reductions and normalizations: MEAN/SUM/REDUCE_*, SOFTMAX, ARG_MAX/MIN, TOPK_V2, CUMSUM."""

from __future__ import annotations

import numpy as np

from ..ops.jit import njit, prange
from .elementwise import PARALLEL_ELEMENTS
from .registry import KernelError, OpContext, apply_activation, normalize_axis, register


def _axes(ctx: OpContext, xs, ndim: int) -> tuple[int, ...]:
    c = ctx.const(1)
    raw = np.asarray(c if c is not None else xs[1]).reshape(-1)
    return tuple(sorted({normalize_axis(int(a), ndim) for a in raw}))


def _reducer(fn):
    def factory(ctx: OpContext):
        keep = ctx.opt("keep_dims", False)
        out_dtype = ctx.output_tensor(0).dtype

        def run(xs):
            x = xs[0]
            axes = _axes(ctx, xs, x.ndim)
            r = fn(x, axis=axes, keepdims=keep)
            return [np.asarray(r).astype(out_dtype, copy=False)]

        return run

    return factory


def _mean(x, axis, keepdims):
    if np.issubdtype(x.dtype, np.integer):  # integer means round toward zero in TFLite
        return np.trunc(np.mean(x, axis=axis, keepdims=keepdims, dtype=np.float64))
    return np.mean(x, axis=axis, keepdims=keepdims, dtype=np.float32)


for _name, _fn in {
    "MEAN": _mean,
    "SUM": np.sum,
    "REDUCE_MAX": np.max,
    "REDUCE_MIN": np.min,
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
        norm = np.sqrt(np.maximum(np.sum(x * x, axis=-1, keepdims=True), np.float32(1e-6)))
        return [apply_activation((x / norm).astype(np.float32), act)]

    return run


def _arg(fn):
    def factory(ctx: OpContext):
        dtype = ctx.output_tensor(0).dtype

        def run(xs):
            x = xs[0]
            a = normalize_axis(int(np.asarray(xs[1]).reshape(-1)[0]), x.ndim)
            return [fn(x, axis=a).astype(dtype)]

        return run

    return factory


register("ARG_MAX")(_arg(np.argmax))
register("ARG_MIN")(_arg(np.argmin))


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


@register("CUMSUM")
def cumsum(ctx: OpContext):
    exclusive, reverse = ctx.opt("exclusive", False), ctx.opt("reverse", False)

    def run(xs):
        x = xs[0]
        a = normalize_axis(int(np.asarray(xs[1]).reshape(-1)[0]), x.ndim)
        v = np.flip(x, a) if reverse else x
        c = np.cumsum(v, axis=a, dtype=x.dtype)
        if exclusive:
            c = c - v
        return [np.ascontiguousarray(np.flip(c, a) if reverse else c)]

    return run
