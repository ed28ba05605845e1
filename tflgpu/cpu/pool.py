"""Pooling (average, max, L2) and MediaPipe's argmax pooling / unpooling."""

from __future__ import annotations

import numpy as np

from ..ops.attributes import activation_bounds, conv_padding
from ..ops.custom_options import pool_params
from ..ops.jit import njit, prange
from .registry import KernelError, OpContext, check_geometry, register

AVG, MAX, L2 = 0, 1, 2


@njit(cache=True, inline="always")
def window(o, stride, pad, k, size):
    """The input range [first, end) of output index ``o``'s pooling window along one axis, clipped to the input."""
    start = o * stride - pad
    return max(start, 0), min(start + k, size)


@njit(cache=True, parallel=True)
def _pool(x, kind, kh, kw, sh, sw, pt, pl, oh, ow, lo, hi):
    """AVERAGE_POOL_2D (``kind`` AVG: a float64 sum), MAX_POOL_2D (MAX) and L2_POOL_2D (L2), clamped to [lo, hi],
    with the channels innermost: each window pixel's channels in one contiguous pass over the output pixel's (or its
    float64 sums'), the same max() or sum in the same order per channel as a channel at a time, strided, took
    (BlazeFace's 2x2 max pools of 64x64x28: 95 -> 20 us; a squeeze-and-excitation block's global average pool of
    128x128x16: 122 -> 39)."""
    n, h, w, c = x.shape
    out = np.empty((n, oh, ow, c), dtype=np.float32)
    for row in prange(n * oh):
        b = row // oh
        oy = row % oh
        y0, y1 = window(oy, sh, pt, kh, h)
        acc = np.empty(c, np.float64)
        for ox in range(ow):
            x0, x1 = window(ox, sw, pl, kw, w)
            dst = out[b, oy, ox]
            if kind == 1:
                for ch in range(c):
                    dst[ch] = -np.inf
                for iy in range(y0, y1):
                    for ix in range(x0, x1):
                        src = x[b, iy, ix]
                        for ch in range(c):
                            dst[ch] = max(dst[ch], src[ch])
                for ch in range(c):
                    dst[ch] = min(max(dst[ch], lo), hi)
                continue
            count = (y1 - y0) * (x1 - x0)
            for ch in range(c):
                acc[ch] = 0.0
            for iy in range(y0, y1):
                for ix in range(x0, x1):
                    src = x[b, iy, ix]
                    if kind == 2:
                        for ch in range(c):
                            acc[ch] += np.float64(src[ch] * src[ch])
                    else:
                        for ch in range(c):
                            acc[ch] += src[ch]
            for ch in range(c):
                v = acc[ch]
                if count > 0:
                    v = np.sqrt(v / count) if kind == 2 else v / count
                dst[ch] = min(max(v, lo), hi)
    return out


def _pool_factory(kind: int, opts=None):
    def factory(ctx: OpContext):
        o = opts(ctx) if opts else ctx.op.options
        kh, kw = o.get("filter_height", 1), o.get("filter_width", 1)
        sh, sw = o.get("stride_h", 1), o.get("stride_w", 1)
        pad, act = o.get("padding", 0), o.get("fused_activation_function", 0)
        check_geometry(ctx, filter_h=kh, filter_w=kw, stride_h=sh, stride_w=sw)
        lo, hi = activation_bounds(act)

        def run(xs):
            x = np.ascontiguousarray(xs[0], dtype=np.float32)
            if x.ndim != 4:
                raise KernelError(f"{ctx.op.name}: input must be 4-D, got {x.shape}")
            oh, pt = conv_padding(x.shape[1], kh, sh, 1, pad)
            ow, pl = conv_padding(x.shape[2], kw, sw, 1, pad)
            return [_pool(x, kind, kh, kw, sh, sw, pt, pl, max(oh, 0), max(ow, 0), lo, hi)]

        return run

    return factory


register("AVERAGE_POOL_2D")(_pool_factory(AVG))
register("MAX_POOL_2D")(_pool_factory(MAX))
register("L2_POOL_2D")(_pool_factory(L2))


@njit(cache=True)
def _max_pool_argmax(x, kh, kw, sh, sw, pt, pl, oh, ow):
    n, h, w, c = x.shape
    out = np.empty((n, oh, ow, c), dtype=np.float32)
    idx = np.zeros((n, oh, ow, c), dtype=np.int32)
    for b in range(n):
        for oy in range(oh):
            for ox in range(ow):
                for ch in range(c):
                    best = -np.inf
                    best_i = 0
                    for ky in range(kh):
                        iy = oy * sh - pt + ky
                        if iy < 0 or iy >= h:
                            continue
                        for kx in range(kw):
                            ix = ox * sw - pl + kx
                            if ix < 0 or ix >= w:
                                continue
                            v = x[b, iy, ix, ch]
                            if v > best:
                                best = v
                                best_i = (iy * w + ix) * c + ch
                    out[b, oy, ox, ch] = best
                    idx[b, oy, ox, ch] = best_i
    return out, idx


@register("MaxPoolingWithArgmax2D")
def max_pool_with_argmax(ctx: OpContext):
    """Outputs the max and, per element, the flat index (y * W + x) * C + c within its image."""
    o = pool_params(ctx)

    def run(xs):
        x = np.ascontiguousarray(xs[0], dtype=np.float32)
        oh, pt = conv_padding(x.shape[1], o["filter_height"], o["stride_h"], 1, o["padding"])
        ow, pl = conv_padding(x.shape[2], o["filter_width"], o["stride_w"], 1, o["padding"])
        y, idx = _max_pool_argmax(x, o["filter_height"], o["filter_width"], o["stride_h"], o["stride_w"], pt, pl, oh, ow)
        return [y, idx.astype(ctx.output_tensor(1).dtype)]

    return run


@njit(cache=True)
def _unpool(x, idx, oh, ow):
    n, h, w, c = x.shape
    out = np.zeros((n, oh, ow, c), dtype=np.float32)
    flat = out.reshape(n, oh * ow * c)
    size = oh * ow * c
    for b in range(n):
        for y in range(h):
            for xx in range(w):
                for ch in range(c):
                    i = idx[b, y, xx, ch]
                    if i < 0 or i >= size:
                        return out, False
                    flat[b, i] = x[b, y, xx, ch]
    return out, True


@register("MaxUnpooling2D")
def max_unpooling(ctx: OpContext):
    """Scatter each input value to the position its argmax index names (see MaxPoolingWithArgmax2D)."""
    pool_params(ctx)  # validates; the output size comes from the output tensor
    _, oh, ow, _ = ctx.output_tensor(0).shape

    def run(xs):
        x = np.ascontiguousarray(xs[0], dtype=np.float32)
        idx = np.ascontiguousarray(xs[1], dtype=np.int64)
        if idx.shape != x.shape:
            raise KernelError(f"MaxUnpooling2D: indices shape {idx.shape} differs from input {x.shape}")
        out, ok = _unpool(x, idx, oh, ow)
        if not ok:
            raise KernelError("MaxUnpooling2D: an index lies outside the output")
        return [out]

    return run
