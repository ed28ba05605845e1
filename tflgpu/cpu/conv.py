"""Convolutions and matrix products on the CPU.

Dense convolutions are lowered to im2col (a numba kernel) followed by one
BLAS GEMM; depthwise and transposed convolutions are direct numba loops,
because their arithmetic intensity is too low for GEMM to pay off.
Weights are re-laid out once, in the factory, never per invoke.
"""

from __future__ import annotations

import numpy as np

from ..graph.conv_arg import CONV_ARG
from ..ops.attributes import activation_bounds, conv_options, conv_padding, explicit_padding, pixel_for_pixel
from ..ops.custom_options import transpose_conv_params
from ..ops.jit import njit, prange, readonly
from .elementwise import dequant_params
from .gemm import conv_bias_clamp, gemm_bias_clamp
from .hybrid import int8_weights, is_hybrid, quantize_images, quantize_rows_qd8
from .registry import KernelError, OpContext, apply_activation, check_geometry, once, register


@njit(cache=True, parallel=True)
def _im2col(x, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, row0, row1):
    """The im2col rows of output rows [row0, row1) (counted over batch x output height)."""
    _, h, w, c = x.shape
    cols = np.zeros(((row1 - row0) * ow, kh * kw * c), dtype=x.dtype)
    for i in prange(row1 - row0):
        row = row0 + i
        b = row // oh
        oy = row % oh
        for ox in range(ow):
            r = i * ow + ox
            for ky in range(kh):
                iy = oy * sh - pt + ky * dh
                if iy < 0 or iy >= h:
                    continue
                for kx in range(kw):
                    ix = ox * sw - pl + kx * dw
                    if ix < 0 or ix >= w:
                        continue
                    base = (ky * kw + kx) * c
                    for ch in range(c):
                        cols[r, base + ch] = x[b, iy, ix, ch]
    return cols


IM2COL_BLOCK_BYTES = 32 << 20  # the column matrix is built and multiplied this much at a time


def im2col_matmul(x: np.ndarray, wm: np.ndarray, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow) -> np.ndarray:
    """``im2col(x) @ wm`` ([n*oh*ow, wm columns]), built one block of output rows at a time so the column
    matrix (kh*kw times the input) never takes more than IM2COL_BLOCK_BYTES: a large input costs its time,
    not gigabytes of temporaries. Small convolutions are one block, one GEMM, as before."""
    n, _, _, c = x.shape
    rows = n * oh
    step = max(1, IM2COL_BLOCK_BYTES // max(1, ow * kh * kw * c * x.dtype.itemsize))
    if step >= rows:
        return _im2col(x, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, 0, rows) @ wm
    out = np.empty((rows * ow, wm.shape[1]), dtype=np.result_type(x.dtype, wm.dtype))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        np.matmul(_im2col(x, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, r0, r1), wm, out=out[r0 * ow : r1 * ow])
    return out


def conv_product(x: np.ndarray, wm: np.ndarray, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, bias=None,
                 lo: float = -np.inf, hi: float = np.inf) -> np.ndarray:
    """``clip(im2col(x) @ wm + bias, lo, hi)`` ([n*oh*ow, wm columns]) for NHWC ``x`` and ``wm`` [kh*kw*c, oc]
    (``bias`` None: none). float32 and float64 (the integer kernels' exact sums) products run on every core with
    the bias and clamp fused (``gemm``); mixed dtypes through im2col and numpy."""
    c = x.shape[3]
    pointwise = pixel_for_pixel(kh, kw, sh, sw, pt, pl, x.shape[1:3], (oh, ow))
    if x.dtype == wm.dtype and x.dtype in (np.float32, np.float64):
        b = None if bias is None else np.asarray(bias, x.dtype)
        x, wm = np.ascontiguousarray(x), np.ascontiguousarray(wm)
        y = gemm_bias_clamp(x.reshape(-1, c), wm, b, lo, hi) if pointwise else \
            conv_bias_clamp(x, wm, b, lo, hi, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
        if y is not None:
            return y
    y = x.reshape(-1, c) @ wm if pointwise else im2col_matmul(x, wm, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
    if bias is not None:
        y += bias
    if lo > -np.inf or hi < np.inf:
        np.clip(y, lo, hi, out=y)
    return y


@njit(cache=True, parallel=True)
def _depthwise(x, w, bias, sh, sw, dh, dw, pt, pl, oh, ow, mult, lo, hi):
    """Depthwise convolution accumulated in ``bias``'s dtype (float32, or int32 for the integer kernels)
    and clamped to [lo, hi]."""
    n, h, wd, c = x.shape
    kh, kw, oc = w.shape[1], w.shape[2], w.shape[3]
    out = np.empty((n, oh, ow, oc), dtype=bias.dtype)
    for row in prange(n * oh):
        b = row // oh
        oy = row % oh
        for ox in range(ow):
            acc = out[b, oy, ox]
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
                    if mult == 1:
                        for ch in range(c):
                            acc[ch] += x[b, iy, ix, ch] * w[0, ky, kx, ch]
                    else:
                        for ch in range(c):
                            xv = x[b, iy, ix, ch]
                            for m in range(mult):
                                acc[ch * mult + m] += xv * w[0, ky, kx, ch * mult + m]
            for o in range(oc):
                v = acc[o]
                acc[o] = min(max(v, lo), hi)
    return out


@njit(cache=True, parallel=True)
def _depthwise_rows(x, w_rows, bias_row, sh, sw, dh, dw, pt, pl, oh, ow, lo, hi):
    """Depthwise convolution (multiplier 1, float32) a whole output row at a time: for each tap, the row's
    outputs += the input row's pixels times the tap's weights tiled along the row (``w_rows`` [kh, kw, ow*c],
    ``bias_row`` [ow*c]); at stride 1 that is one contiguous loop over (x, channel). For few channels, where the
    per-pixel loop over the channels is too short for the vector loop (32 channels: 2x as fast)."""
    n, h, wd, c = x.shape
    kh, kw = w_rows.shape[0], w_rows.shape[1]
    length = ow * c
    out = np.empty((n, oh, length), np.float32)
    for row in prange(n * oh):
        b = row // oh
        oy = row % oh
        orow = out[b, oy]
        for j in range(length):
            orow[j] = bias_row[j]
        for ky in range(kh):
            iy = oy * sh - pt + ky * dh
            if iy < 0 or iy >= h:
                continue
            xrow = x[b, iy].reshape(-1)
            for kx in range(kw):
                x0 = max(0, (pl - kx * dw + sw - 1) // sw)  # the outputs whose input pixel is inside
                x1 = min(ow, (wd - 1 + pl - kx * dw) // sw + 1)
                if x1 <= x0:
                    continue
                wrow = w_rows[ky, kx]
                if sw == 1:
                    run = (x1 - x0) * c
                    src = xrow[(x0 - pl + kx * dw) * c:]
                    dst = orow[x0 * c:]
                    wr = wrow[x0 * c:]
                    for j in range(run):
                        dst[j] += src[j] * wr[j]
                else:
                    for ox in range(x0, x1):
                        src = xrow[(ox * sw - pl + kx * dw) * c:]
                        dst = orow[ox * c:]
                        for ch in range(c):
                            dst[ch] += src[ch] * wrow[ch]
        for j in range(length):
            orow[j] = min(max(orow[j], lo), hi)
    return out.reshape(n, oh, ow, c)


@njit(cache=True, inline="always")
def window_rows(x, b, iy0, dh):
    """For a 3x3 window whose top input row is ``iy0`` (rows ``dh`` apart) in image b: whether all three rows are
    inside the input, and the three rows (clamped into it: read only where they are inside)."""
    h = x.shape[1]
    return (iy0 >= 0 and iy0 + 2 * dh < h, x[b, max(iy0, 0)], x[b, min(max(iy0 + dh, 0), h - 1)],
            x[b, min(max(iy0 + 2 * dh, 0), h - 1)])


@njit(cache=True, inline="always")
def border_taps(x, w, b, iy0, ix0, dh, dw, xz, acc):
    """acc += (x - xz) * w over the taps of a 3x3 window (``w`` [3, 3, c], top-left input pixel (iy0, ix0) of image
    b) that fall inside the input: a border pixel of the 3x3 depthwise kernels (float, and integer with its zero
    point; exact in both)."""
    h, wd, c = x.shape[1], x.shape[2], x.shape[3]
    for ky in range(3):
        iy = iy0 + ky * dh
        if iy < 0 or iy >= h:
            continue
        for kx in range(3):
            ix = ix0 + kx * dw
            if ix < 0 or ix >= wd:
                continue
            src = x[b, iy, ix]
            for ch in range(c):
                acc[ch] += (src[ch] - xz) * w[ky, kx, ch]


@njit(cache=True, parallel=True)
def _depthwise3x3(x, w, bias, sh, sw, dh, dw, pt, pl, oh, ow, lo, hi):
    """A 3x3 depthwise convolution (multiplier 1, float32; ``w`` [3, 3, c]): where an output pixel's nine taps
    are all inside the input, its channels are summed in one pass over them, two pixels along the row at a time
    (their taps' weights loaded once), instead of nine passes of read-add-write over the pixel's outputs; the
    same sums in the same order as ``_depthwise``. Border pixels as ``_depthwise``. MobileNet v2's 56x56x144
    stride-1 layer: 224 -> 138 us, 28x28x192: 68 -> 46 us (2 threads)."""
    n, _, wd, c = x.shape
    out = np.empty((n, oh, ow, c), np.float32)
    for row in prange(n * oh):
        b = row // oh
        oy = row % oh
        iy0 = oy * sh - pt
        rows_in, r0, r1, r2 = window_rows(x, b, iy0, dh)
        ox = 0
        while ox < ow:
            ix0 = ox * sw - pl
            dst = out[b, oy, ox]
            if rows_in and ix0 >= 0 and ox + 1 < ow and ix0 + sw + 2 * dw < wd:
                d2 = out[b, oy, ox + 1]
                j0, j1, j2 = ix0, ix0 + dw, ix0 + 2 * dw
                k0, k1, k2 = j0 + sw, j1 + sw, j2 + sw
                for ch in range(c):
                    w00, w01, w02 = w[0, 0, ch], w[0, 1, ch], w[0, 2, ch]
                    w10, w11, w12 = w[1, 0, ch], w[1, 1, ch], w[1, 2, ch]
                    w20, w21, w22 = w[2, 0, ch], w[2, 1, ch], w[2, 2, ch]
                    s = (bias[ch] + r0[j0, ch] * w00 + r0[j1, ch] * w01 + r0[j2, ch] * w02
                         + r1[j0, ch] * w10 + r1[j1, ch] * w11 + r1[j2, ch] * w12
                         + r2[j0, ch] * w20 + r2[j1, ch] * w21 + r2[j2, ch] * w22)
                    t = (bias[ch] + r0[k0, ch] * w00 + r0[k1, ch] * w01 + r0[k2, ch] * w02
                         + r1[k0, ch] * w10 + r1[k1, ch] * w11 + r1[k2, ch] * w12
                         + r2[k0, ch] * w20 + r2[k1, ch] * w21 + r2[k2, ch] * w22)
                    dst[ch] = min(max(s, lo), hi)
                    d2[ch] = min(max(t, lo), hi)
                ox += 2
                continue
            if rows_in and ix0 >= 0 and ix0 + 2 * dw < wd:
                j0, j1, j2 = ix0, ix0 + dw, ix0 + 2 * dw
                for ch in range(c):
                    s = (bias[ch] + r0[j0, ch] * w[0, 0, ch] + r0[j1, ch] * w[0, 1, ch] + r0[j2, ch] * w[0, 2, ch]
                         + r1[j0, ch] * w[1, 0, ch] + r1[j1, ch] * w[1, 1, ch] + r1[j2, ch] * w[1, 2, ch]
                         + r2[j0, ch] * w[2, 0, ch] + r2[j1, ch] * w[2, 1, ch] + r2[j2, ch] * w[2, 2, ch])
                    dst[ch] = min(max(s, lo), hi)
                ox += 1
                continue
            for ch in range(c):
                dst[ch] = bias[ch]
            border_taps(x, w, b, iy0, ix0, dh, dw, np.float32(0), dst)
            for ch in range(c):
                dst[ch] = min(max(dst[ch], lo), hi)
            ox += 1
    return out


ROWS_BELOW_CHANNELS = 32  # depthwise convolutions of fewer channels run a row at a time (_depthwise_rows)


@njit(cache=True)
def _col2im(cols, n, h, w, oh, ow, kh, kw, oc, sh, sw, pt, pl, out):
    # cols: [n*h*w, kh*kw*oc]; scatter-add every input pixel's contribution
    for b in range(n):
        for iy in range(h):
            for ix in range(w):
                r = (b * h + iy) * w + ix
                for ky in range(kh):
                    oy = iy * sh + ky - pt
                    if oy < 0 or oy >= oh:
                        continue
                    for kx in range(kw):
                        ox = ix * sw + kx - pl
                        if ox < 0 or ox >= ow:
                            continue
                        base = (ky * kw + kx) * oc
                        for o in range(oc):
                            out[b, oy, ox, o] += cols[r, base + o]
    return out


def _bias(ctx: OpContext, idx: int, n: int) -> np.ndarray:
    """The constant bias as float32 [n] (zeros where there is none), read-only as the kernels take it."""
    b = ctx.const(idx) if ctx.has_input(idx) else None
    if b is None:
        return readonly(np.zeros(n, np.float32))
    return readonly(np.ascontiguousarray(b, dtype=np.float32).reshape(n))


def _float_weights(ctx: OpContext, idx: int) -> np.ndarray | None:
    """Constant weights as float32 (int8 weights of hybrid models are dequantized once)."""
    w = ctx.const(idx)
    if w is None:
        return None
    t = ctx.input_tensor(idx)
    if np.issubdtype(w.dtype, np.integer) and t.quantization is not None:
        scale, zp = dequant_params(t.quantization, w.ndim)
        return ((w.astype(np.float32) - zp) * scale).astype(np.float32)
    return np.asarray(w, dtype=np.float32)


@register("CONV_2D")
def conv2d(ctx: OpContext):
    sh, sw, dh, dw, pad = conv_options(ctx.op.options)
    et, eb, el, er = explicit_padding(ctx.op.options)
    act = ctx.opt("fused_activation_function", 0)
    w_const = _float_weights(ctx, 1)
    w_shape = ctx.input_tensor(1).shape
    if len(w_shape) != 4:
        raise ctx.fail(f"filter must be 4-D [out, kh, kw, in], got {list(w_shape)}")
    oc, kh, kw, icg = w_shape
    check_geometry(ctx, stride_h=sh, stride_w=sw, dilation_h=dh, dilation_w=dw, filter_h=kh, filter_w=kw,
                   filter_depth=icg, out_channels=oc)
    in_shape = ctx.input_tensor(0).shape
    if len(in_shape) == 4 and (in_shape[3] % icg or oc % (in_shape[3] // icg or 1)):
        raise ctx.fail(f"input channels {in_shape[3]} do not fit filter {list(w_shape)}")
    bias = _bias(ctx, 2, oc)

    def prepare(w):
        # [oc, kh, kw, icg] -> per group [kh*kw*icg, oc_g]
        return np.ascontiguousarray(w.reshape(oc, kh * kw * icg).T)

    w_mat = once(lambda: prepare(w_const)) if w_const is not None else None

    def run(xs):
        if np.ndim(xs[0]) != 4:  # (before ascontiguousarray, which makes a scalar 1-D)
            raise KernelError(f"CONV_2D input must be 4-D, got shape {np.shape(xs[0])}")
        x = np.ascontiguousarray(xs[0], dtype=np.float32)
        wm = w_mat() if w_mat is not None else prepare(np.asarray(xs[1], np.float32))
        n, h, w, c = x.shape
        if c == 0 or c % icg:
            raise KernelError(f"CONV_2D: input channels {c} not a multiple of filter depth {icg}")
        groups = c // icg
        if oc % groups:
            raise KernelError(f"CONV_2D: {oc} output channels do not split into {groups} groups")
        ocg = oc // groups
        oh, pt = conv_padding(h, kh, sh, dh, pad, et, eb)
        ow, pl = conv_padding(w, kw, sw, dw, pad, el, er)
        if oh <= 0 or ow <= 0:
            raise KernelError(f"CONV_2D: empty output for input {x.shape}")
        lo, hi = activation_bounds(act)
        if groups == 1:
            y = conv_product(x, wm, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, bias, lo, hi)
        else:  # each group its own product over its slice of the channels, side by side in the output
            y = np.concatenate([conv_product(x[..., g * icg : (g + 1) * icg], wm[:, g * ocg : (g + 1) * ocg], kh, kw,
                                             sh, sw, dh, dw, pt, pl, oh, ow, bias[g * ocg : (g + 1) * ocg], lo, hi)
                                for g in range(groups)], axis=1)
        return [y.reshape(n, oh, ow, oc)]

    return run


@register(CONV_ARG)
def conv_arg(ctx: OpContext):
    """A CONV_2D and the ARG_MAX / ARG_MIN over its channels (graph.conv_arg): the sums, then their index."""
    conv = conv2d(ctx)
    pick = np.argmax if ctx.op.options["arg"] == "ARG_MAX" else np.argmin
    dtype = ctx.output_tensor(1).dtype

    def run(xs):
        (y,) = conv(xs)
        return [y, pick(y, axis=-1).astype(dtype)]

    return run


@register("DEPTHWISE_CONV_2D")
def depthwise_conv2d(ctx: OpContext):
    sh, sw, dh, dw, pad = conv_options(ctx.op.options)
    et, eb, el, er = explicit_padding(ctx.op.options)
    act = ctx.opt("fused_activation_function", 0)
    w_const = _float_weights(ctx, 1)
    w_shape = ctx.input_tensor(1).shape
    if len(w_shape) != 4 or w_shape[0] != 1:
        raise ctx.fail(f"filter must be [1, kh, kw, out], got {list(w_shape)}")
    _, kh, kw, oc = w_shape
    check_geometry(ctx, stride_h=sh, stride_w=sw, dilation_h=dh, dilation_w=dw, filter_h=kh, filter_w=kw,
                   out_channels=oc)
    bias = _bias(ctx, 2, oc)
    lo, hi = activation_bounds(act)
    w_c = readonly(np.ascontiguousarray(w_const)) if w_const is not None else None

    def run(xs):
        x = np.ascontiguousarray(xs[0], dtype=np.float32)
        w = w_c if w_c is not None else np.ascontiguousarray(xs[1], dtype=np.float32)
        _, h, wd, c = x.shape
        if c == 0 or oc % c:
            raise KernelError(f"DEPTHWISE_CONV_2D: output channels {oc} not a multiple of input channels {c}")
        oh, pt = conv_padding(h, kh, sh, dh, pad, et, eb)
        ow, pl = conv_padding(wd, kw, sw, dw, pad, el, er)
        mult = oc // c
        if mult > 1:  # each input channel repeated for its outputs: the loop over channels then vectorizes
            x, mult = np.repeat(x, mult, axis=3), 1  # (32x32x8, multiplier 2: 106 -> 62 us)
        if oc < ROWS_BELOW_CHANNELS and oh > 0 and ow > 0:
            w_rows, bias_row = tiled(ow, w)
            return [_depthwise_rows(x, w_rows, bias_row, sh, sw, dh, dw, pt, pl, oh, ow, lo, hi)]
        if kh == kw == 3 and oh > 0 and ow > 0:
            return [_depthwise3x3(x, readonly(w[0]), bias, sh, sw, dh, dw, pt, pl, oh, ow, lo, hi)]
        return [_depthwise(x, readonly(w), bias, sh, sw, dh, dw, pt, pl, oh, ow, mult, lo, hi)]

    tiles: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def tiled(ow: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The weights [kh, kw, ow*oc] and bias [ow*oc] tiled along an output row of ``ow`` pixels (once per
        width for constant weights), read-only as the kernel takes them."""
        if w is not w_c:
            return readonly(np.ascontiguousarray(np.tile(w[0], (1, 1, ow)))), readonly(np.tile(bias, ow))
        t = tiles.get(ow)
        if t is None:
            t = tiles[ow] = (readonly(np.ascontiguousarray(np.tile(w[0], (1, 1, ow)))), readonly(np.tile(bias, ow)))
        return t

    return run


def _transpose_conv(ctx: OpContext, x_idx: int, w_idx: int, bias_idx: int, out_shape_fn, pad, sh, sw, act):
    w_const = _float_weights(ctx, w_idx)
    w_shape = ctx.input_tensor(w_idx).shape
    if len(w_shape) != 4:
        raise ctx.fail(f"filter must be 4-D [out, kh, kw, in], got {list(w_shape)}")
    oc, kh, kw, ic = w_shape
    check_geometry(ctx, stride_h=sh, stride_w=sw, filter_h=kh, filter_w=kw, in_channels=ic, out_channels=oc)
    bias = _bias(ctx, bias_idx, oc) if bias_idx >= 0 else np.zeros(oc, np.float32)

    def prepare(w):  # [oc, kh, kw, ic] -> [ic, kh*kw*oc]
        return np.ascontiguousarray(w.transpose(3, 1, 2, 0).reshape(ic, kh * kw * oc))

    w_mat = once(lambda: prepare(w_const)) if w_const is not None else None

    def run(xs):
        x = np.ascontiguousarray(xs[x_idx], dtype=np.float32)
        wm = w_mat() if w_mat is not None else prepare(np.asarray(xs[w_idx], np.float32))
        n, h, w, c = x.shape
        if c != ic:
            raise KernelError(f"{ctx.op.name}: input has {c} channels, filter expects {ic}")
        on, oh, ow, occ = out_shape_fn(xs)
        if on != n or occ != oc:
            raise KernelError(f"{ctx.op.name}: output shape {[on, oh, ow, occ]} does not fit input {x.shape}")
        # TFLite derives the padding from the *output* size (as the forward conv would see it)
        _, pt = conv_padding(oh, kh, sh, 1, pad)
        _, pl = conv_padding(ow, kw, sw, 1, pad)
        cols = x.reshape(-1, ic) @ wm
        out = np.zeros((n, oh, ow, oc), np.float32)
        _col2im(cols, n, h, w, oh, ow, kh, kw, oc, sh, sw, pt, pl, out)
        out += bias
        return [apply_activation(out, act)]

    return run


@njit(cache=True)
def _hybrid_scatter(q, scales, w, ch_scale, sh, sw, pt, pl, out):
    """TFLite's HybridTransposeConv: each input value (``q``, less its image's zero point) times the weights,
    scattered into ``out`` (zeros), each scaled as ``float(acc) * channel scale * image scale`` and added in TFLite's loop order (the
    float sums depend on it)."""
    n, ih, iw, ic = q.shape
    oc, kh, kw, _ = w.shape
    _, oh, ow, _ = out.shape
    for b in range(n):
        s = scales[b]
        for y in range(ih):
            for x in range(iw):
                for c in range(ic):
                    v = q[b, y, x, c]
                    for fy in range(kh):
                        oy = y * sh - pt + fy
                        if oy < 0 or oy >= oh:
                            continue
                        for fx in range(kw):
                            ox = x * sw - pl + fx
                            if ox < 0 or ox >= ow:
                                continue
                            for o in range(oc):
                                term = np.float32(np.float32(v * w[o, fy, fx, c]) * ch_scale[o])
                                out[b, oy, ox, o] += np.float32(term * s)


def _hybrid_transpose_conv(ctx: OpContext, out_shape_fn):
    """TRANSPOSE_CONV of a float input by int8 weights (dynamic-range): LiteRT's hybrid kernel, each image
    quantized asymmetrically on its own range, the integer products scaled back per output channel."""
    shape = ctx.input_tensor(1).shape
    if len(shape) != 4:
        raise ctx.fail(f"filter must be 4-D [out, kh, kw, in], got {list(shape)}")
    w, p = int8_weights(ctx, 1, per_channel=shape[0])
    w = np.ascontiguousarray(w, np.int32)
    oc, kh, kw, ic = w.shape
    ch_scale = np.ascontiguousarray(np.broadcast_to(p.scale.astype(np.float32), (oc,)))
    pad, sh, sw = ctx.opt("padding", 0), ctx.opt("stride_h", 1), ctx.opt("stride_w", 1)
    check_geometry(ctx, stride_h=sh, stride_w=sw, filter_h=kh, filter_w=kw, in_channels=ic, out_channels=oc)
    bias = _bias(ctx, 3, oc) if ctx.has_input(3) else None
    lo, hi = activation_bounds(ctx.opt("fused_activation_function", 0))

    def run(xs):
        x = np.asarray(xs[2], np.float32)
        if x.ndim != 4 or x.shape[3] != ic:
            raise KernelError(f"TRANSPOSE_CONV: input of shape {list(x.shape)} for a filter of {ic} channels")
        n, oh, ow, occ = out_shape_fn(xs)
        if n != x.shape[0] or occ != oc:
            raise KernelError(f"TRANSPOSE_CONV: output shape {[n, oh, ow, occ]} does not fit input {list(x.shape)}")
        _, pt = conv_padding(oh, kh, sh, 1, pad)
        _, pl = conv_padding(ow, kw, sw, 1, pad)
        centered, scales = quantize_images(x)  # (each value less its image's zero point)
        out = np.zeros((n, oh, ow, oc), np.float32)
        _hybrid_scatter(centered.astype(np.int32), scales, w, ch_scale, sh, sw, pt, pl, out)
        if bias is not None:
            out += bias
        return [np.clip(out, lo, hi, out=out) if (lo, hi) != (-np.inf, np.inf) else out]

    return run


@register("TRANSPOSE_CONV")
def transpose_conv(ctx: OpContext):
    shape_const = ctx.const(0)

    def out_shape(xs):
        s = shape_const if shape_const is not None else xs[0]
        return tuple(int(v) for v in np.asarray(s).reshape(-1))

    if is_hybrid(ctx, 1, data=2):
        return _hybrid_transpose_conv(ctx, out_shape)
    return _transpose_conv(
        ctx, 2, 1, 3 if ctx.has_input(3) else -1, out_shape,
        ctx.opt("padding", 0), ctx.opt("stride_h", 1), ctx.opt("stride_w", 1),
        ctx.opt("fused_activation_function", 0),
    )


@register("Convolution2DTransposeBias")
def conv2d_transpose_bias(ctx: OpContext):
    """MediaPipe's transposed conv with bias; options are a TfLiteTransposeConvParams struct."""
    pad, sw, sh = transpose_conv_params(ctx)
    shape = ctx.output_tensor(0).shape
    return _transpose_conv(ctx, 0, 1, 2, lambda xs: shape, pad, sh, sw, 0)


@register("FULLY_CONNECTED")
def fully_connected(ctx: OpContext):
    act = ctx.opt("fused_activation_function", 0)
    if act not in (0, 1, 2, 3):
        raise ctx.fail(f"fused activation {act} is not supported (only NONE and the RELU family)")
    keep = ctx.opt("keep_num_dims", False)
    w_const = _float_weights(ctx, 1)
    units, depth = ctx.input_tensor(1).shape[0], ctx.input_tensor(1).shape[-1]
    bias = _bias(ctx, 2, units) if ctx.has_input(2) else None
    w_t = once(lambda: np.ascontiguousarray(w_const.T)) if w_const is not None else None
    out_dtype = ctx.output_tensor(0).dtype

    def run(xs):
        x = np.asarray(xs[0])
        wt = w_t() if w_t is not None else np.asarray(xs[1], np.float32).T
        if x.size % depth:
            raise KernelError(f"FULLY_CONNECTED: input of {x.size} values is not a multiple of depth {depth}")
        x2 = np.ascontiguousarray(x.reshape(-1, depth), dtype=np.float32)
        if w_t is not None and (bias is not None or not ctx.has_input(2)):
            y = gemm_bias_clamp(x2, wt, bias, *activation_bounds(act))
        else:
            y = x2 @ wt
            if ctx.has_input(2):
                y += np.asarray(xs[2], np.float32)
            y = apply_activation(y, act)
        if keep:
            y = y.reshape(x.shape[:-1] + (units,))
        return [y.astype(out_dtype, copy=False)]

    return run


@register("BATCH_MATMUL")
def batch_matmul(ctx: OpContext):
    adj_x, adj_y = ctx.opt("adj_x", False), ctx.opt("adj_y", False)
    if is_hybrid(ctx, 1):
        return _hybrid_batch_matmul(ctx, adj_x, adj_y)

    def run(xs):
        a, b = xs[0], xs[1]
        if adj_x:
            a = np.swapaxes(a, -1, -2)
        if adj_y:
            b = np.swapaxes(b, -1, -2)
        try:
            return [np.matmul(a, b)]
        except ValueError as e:
            raise KernelError(f"BATCH_MATMUL: {e}") from e

    return run


def _hybrid_batch_matmul(ctx: OpContext, adj_x: bool, adj_y: bool):
    """A float x times constant int8 weights (dynamic-range): LiteRT's hybrid product, each row of x quantized on
    its own range, the integer sums scaled back by (row scale x weight scale)."""
    w, p = int8_weights(ctx, 1)
    w, w_scale = np.asarray(w, np.float64), np.float32(p.s)
    if adj_y:
        w = np.swapaxes(w, -1, -2)

    def run(xs):
        a = np.asarray(xs[0], np.float32)
        if adj_x:
            a = np.swapaxes(a, -1, -2)
        if a.ndim < 2 or a.shape[-1] != w.shape[-2]:
            raise KernelError(f"BATCH_MATMUL: operands of shapes {list(xs[0].shape)} and {list(w.shape)} "
                              f"(adj_x={adj_x}, adj_y={adj_y}) do not multiply")
        q, scales = quantize_rows_qd8(np.ascontiguousarray(a.reshape(-1, a.shape[-1])))
        try:
            dot = np.matmul(q.reshape(a.shape).astype(np.float64), w)
        except ValueError as e:
            raise KernelError(f"BATCH_MATMUL: {e}") from e
        return [dot.astype(np.float32) * (scales * w_scale).reshape(a.shape[:-1])[..., None]]

    return run
