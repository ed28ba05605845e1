"""CONV_3D and CONV_3D_TRANSPOSE (video and volume models): float32, TFLite's layouts (filter [depth, height,
width, in, out] for CONV_3D, [depth, height, width, out, in] for the transpose) and SAME / VALID padding per axis,
as products of the input's windows (im2col) with the filter, one BLAS call each."""

from __future__ import annotations

import numpy as np

from ..ops.attributes import conv_padding
from .registry import KernelError, OpContext, apply_activation, register

F = np.float32
_AXES = ("d", "h", "w")


def _options(ctx: OpContext) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    o = ctx.op.options
    strides = tuple(int(o.get(f"stride_{a}", 1)) for a in _AXES)
    dilations = tuple(int(o.get(f"dilation_{a}_factor", 1) or 1) for a in _AXES)
    if min(strides) < 1 or min(dilations) < 1:
        raise ctx.fail(f"strides {list(strides)} and dilations {list(dilations)} must be >= 1")
    return strides, dilations, int(o.get("padding", 0))


def _bias(ctx: OpContext, i: int, channels: int) -> np.ndarray | None:
    if not ctx.has_input(i):
        return None
    b = ctx.const(i)
    if b is not None and b.size != channels:
        raise ctx.fail(f"bias of {b.size} values for {channels} output channels")
    return None if b is None else np.asarray(b, F).reshape(-1)


def _biased(y: np.ndarray, bias: np.ndarray | None, xs, i: int, act) -> np.ndarray:
    """``y`` plus the bias (the constant one, else input ``i``'s where given), through the fused activation."""
    b = bias if bias is not None else (np.asarray(xs[i], F).reshape(-1) if len(xs) > i and xs[i] is not None
                                       else None)
    if b is not None:
        y += b
    return apply_activation(y, act)


def _windows(x: np.ndarray, kernel: tuple, strides: tuple, dilations: tuple, pads: tuple, out: tuple) -> np.ndarray:
    """[N, OD, OH, OW, KD * KH * KW * C]: each output position's window of the zero-padded input, in the
    filter's (kd, kh, kw, c) order."""
    n, c = x.shape[0], x.shape[4]
    need = [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(out, strides, kernel, dilations)]
    padded = np.zeros((n, *(max(p + size, nd) for p, size, nd in zip(pads, x.shape[1:4], need)), c), F)
    padded[:, pads[0]:pads[0] + x.shape[1], pads[1]:pads[1] + x.shape[2], pads[2]:pads[2] + x.shape[3]] = x
    cols = np.empty((n, *out, *kernel, c), F)
    for tap in np.ndindex(*kernel):  # (kd, kh, kw)
        window = tuple(slice(t * d, t * d + (o - 1) * st + 1, st)
                       for t, d, o, st in zip(tap, dilations, out, strides))
        cols[(slice(None),) * 4 + tap] = padded[(slice(None), *window)]
    return cols.reshape(n, *out, -1)


@register("CONV_3D")
def conv3d(ctx: OpContext):
    strides, dilations, padding = _options(ctx)
    act = ctx.opt("fused_activation_function", 0)
    w_t = ctx.input_tensor(1)
    channels = w_t.shape[4] if len(w_t.shape) == 5 else 0
    bias = _bias(ctx, 2, channels)

    def run(xs):
        x, w = np.asarray(xs[0], F), np.asarray(xs[1], F)
        if x.ndim != 5 or w.ndim != 5 or x.shape[4] != w.shape[3]:
            raise KernelError(f"CONV_3D: input {list(x.shape)} and filter {list(w.shape)} (kd, kh, kw, in, out): "
                              "the channels must match")
        geometry = [conv_padding(size, k, s, d, padding)
                    for size, k, s, d in zip(x.shape[1:4], w.shape[:3], strides, dilations)]
        out, pads = tuple(max(g[0], 0) for g in geometry), tuple(g[1] for g in geometry)
        y = _windows(x, w.shape[:3], strides, dilations, pads, out).reshape(-1, int(np.prod(w.shape[:4])))
        y = (y @ w.reshape(-1, w.shape[4])).reshape(x.shape[0], *out, w.shape[4])
        return [_biased(y, bias, xs, 2, act)]

    return run


@register("CONV_3D_TRANSPOSE")
def conv3d_transpose(ctx: OpContext):
    """Each input position's channels through the filter, added into the output at stride steps; the output's
    shape is input 0's values, its padding the one a CONV_3D from that shape back to the input's would have."""
    strides, dilations, padding = _options(ctx)
    act = ctx.opt("fused_activation_function", 0)
    w_t = ctx.input_tensor(1)
    bias = _bias(ctx, 3, w_t.shape[3] if len(w_t.shape) == 5 else 0)

    def run(xs):
        shape = [int(v) for v in np.asarray(xs[0]).reshape(-1)]
        w, x = np.asarray(xs[1], F), np.asarray(xs[2], F)
        if len(shape) != 5 or min(shape) < 0 or x.ndim != 5 or w.ndim != 5 or x.shape[4] != w.shape[4] or \
                shape[0] != x.shape[0] or shape[4] != w.shape[3]:
            raise KernelError(f"CONV_3D_TRANSPOSE: output shape {shape}, filter {list(w.shape)} (kd, kh, kw, out, "
                              f"in) and input {list(x.shape)} do not fit together")
        geometry = [conv_padding(size, k, s, d, padding)
                    for size, k, s, d in zip(shape[1:4], w.shape[:3], strides, dilations)]
        if tuple(g[0] for g in geometry) != x.shape[1:4]:
            raise KernelError(f"CONV_3D_TRANSPOSE: a CONV_3D of the output shape {shape} gives "
                              f"{[g[0] for g in geometry]}, not the input's {list(x.shape[1:4])}")
        pads = [g[1] for g in geometry]
        span = [(i - 1) * s + (k - 1) * d + 1 for i, s, k, d in zip(x.shape[1:4], strides, w.shape[:3], dilations)]
        big = np.zeros((x.shape[0], *(max(sp, p + o) for sp, p, o in zip(span, pads, shape[1:4])), shape[4]), F)
        rows = x.reshape(-1, x.shape[4])
        for tap in np.ndindex(*w.shape[:3]):  # (kd, kh, kw)
            part = (rows @ w[tap].T).reshape(*x.shape[:4], shape[4])
            at = tuple(slice(t * d, t * d + (i - 1) * st + 1, st)
                       for t, d, i, st in zip(tap, dilations, x.shape[1:4], strides))
            big[(slice(None), *at)] += part
        y = np.ascontiguousarray(big[:, pads[0]:pads[0] + shape[1], pads[1]:pads[1] + shape[2],
                                     pads[2]:pads[2] + shape[3]])
        return [_biased(y, bias, xs, 3, act)]

    return run
