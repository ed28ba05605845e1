"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR with TFLite's exact coordinate rules."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from ..ops.attributes import resize_scale
from ..ops.jit import njit, prange
from .registry import (KernelError, OpContext, check_size_at_prepare, fits, per_input_shape, register,
                       static_shape)


@functools.lru_cache(maxsize=256)
def _bilinear_axis(in_size, out_size, align, half):
    """Per output coordinate: lower index, upper index, and the upper weight (computed once per geometry:
    the loop costs ~5 us an output coordinate; the arrays are read-only)."""
    scale = np.float32(resize_scale(in_size, out_size, align))
    lo = np.empty(out_size, np.int64)
    hi = np.empty(out_size, np.int64)
    frac = np.empty(out_size, np.float32)
    for o in range(out_size):
        v = (np.float32(o) + np.float32(0.5)) * scale - np.float32(0.5) if half else np.float32(o) * scale
        f = math.floor(v)
        lo[o] = max(int(f), 0)
        hi[o] = min(int(math.ceil(v)), in_size - 1)
        frac[o] = v - lo[o]
    for a in (lo, hi, frac):
        a.flags.writeable = False
    return lo, hi, frac


@njit(cache=True, parallel=True)
def _bilinear(x, y0, y1, fy, x0, x1, fx):
    n, h, w, c = x.shape
    oh, ow = y0.shape[0], x0.shape[0]
    out = np.empty((n, oh, ow, c), dtype=np.float32)
    for row in prange(n * oh):
        b = row // oh
        oy = row % oh
        dy = fy[oy]
        for ox in range(ow):
            dx = fx[ox]
            for ch in range(c):
                tl = x[b, y0[oy], x0[ox], ch]
                tr = x[b, y0[oy], x1[ox], ch]
                bl = x[b, y1[oy], x0[ox], ch]
                br = x[b, y1[oy], x1[ox], ch]
                out[b, oy, ox, ch] = (
                    tl * (1 - dy) * (1 - dx) + bl * dy * (1 - dx) + tr * (1 - dy) * dx + br * dy * dx
                )
    return out


@functools.lru_cache(maxsize=256)
def _nearest_axis(in_size, out_size, align, half):
    scale = np.float32(resize_scale(in_size, out_size, align))
    offset = np.float32(0.5) if half else np.float32(0.0)
    idx = np.empty(out_size, np.int64)
    for o in range(out_size):
        v = (np.float32(o) + offset) * scale
        i = int(math.floor(v + 0.5)) if align else int(math.floor(v))  # align: round half up (TfLiteRound)
        i = min(i, in_size - 1)
        idx[o] = max(i, 0) if half else i
    idx.flags.writeable = False
    return idx


def _out_sizes(ctx: OpContext) -> Callable[[list], tuple[int, int]]:
    """The run's output (height, width), checked (once per input shape where the size is constant)."""
    size = ctx.const(1)
    return per_input_shape(size is not None,
                           lambda xs: _checked_size(ctx, size if size is not None else xs[1], xs[0].shape))


def _checked_size(ctx: OpContext, size, x_shape) -> tuple[int, int]:
    if len(x_shape) != 4:
        raise KernelError(f"{ctx.op.name}: input must be 4-D [batch, height, width, channels], got {list(x_shape)}")
    size = np.asarray(size).reshape(-1)
    if size.size != 2 or np.any(size <= 0):
        raise KernelError(f"{ctx.op.name}: size must be two positive ints, got {size.tolist()}")
    fits((x_shape[0], int(size[0]), int(size[1]), x_shape[3]), ctx.output_tensor(0).dtype, ctx.op.name)
    return int(size[0]), int(size[1])


def _check_at_prepare(ctx: OpContext) -> None:
    """A constant size is checked at prepare (an output over one tensor's limit is refused there)."""
    shape = static_shape(ctx, 0)
    if ctx.const(1) is not None and shape is not None:
        check_size_at_prepare(lambda: _checked_size(ctx, ctx.const(1), shape))


@register("RESIZE_BILINEAR")
def resize_bilinear(ctx: OpContext):
    align, half = ctx.opt("align_corners", False), ctx.opt("half_pixel_centers", False)
    _check_at_prepare(ctx)
    out_size = _out_sizes(ctx)

    def run(xs):
        x = np.ascontiguousarray(xs[0], dtype=np.float32)
        oh, ow = out_size(xs)
        y0, y1, fy = _bilinear_axis(x.shape[1], oh, align, half)
        x0, x1, fx = _bilinear_axis(x.shape[2], ow, align, half)
        return [_bilinear(x, y0, y1, fy, x0, x1, fx)]

    return run


@register("RESIZE_NEAREST_NEIGHBOR")
def resize_nearest(ctx: OpContext):
    align, half = ctx.opt("align_corners", False), ctx.opt("half_pixel_centers", False)
    _check_at_prepare(ctx)
    out_size = _out_sizes(ctx)

    def run(xs):
        x = xs[0]
        oh, ow = out_size(xs)
        iy = _nearest_axis(x.shape[1], oh, align, half)
        ix = _nearest_axis(x.shape[2], ow, align, half)
        return [np.ascontiguousarray(x[:, iy][:, :, ix])]

    return run
