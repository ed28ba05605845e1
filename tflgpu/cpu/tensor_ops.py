"""Ops that move data without arithmetic: reshape, concat, slicing, gather, pad, transpose, ..."""

from __future__ import annotations

import math

import numpy as np

from ..ops.attributes import axis_slice
from ..ops.jit import njit
from .registry import (
    KernelError,
    OpContext,
    check_size_at_prepare,
    fits,
    normalize_axis,
    per_input_shape,
    register,
    static_shape,
)


def _value(ctx: OpContext, xs, i: int) -> np.ndarray:
    c = ctx.const(i)
    return np.asarray(c if c is not None else xs[i])


def _ints(a) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


def _infer_shape(shape: list[int], size: int, op: str) -> tuple[int, ...]:
    shape = list(shape)
    if shape.count(-1) > 1:
        raise KernelError(f"{op}: more than one -1 in new shape {shape}")
    known = math.prod(d for d in shape if d != -1)
    if -1 in shape:
        if known == 0 or size % known:
            raise KernelError(f"{op}: cannot infer -1 in {shape} for {size} elements")
        shape[shape.index(-1)] = size // known
    if math.prod(shape) != size:
        raise KernelError(f"{op}: cannot reshape {size} elements into {shape}")
    return tuple(shape)


@register("RESHAPE")
def reshape(ctx: OpContext):
    shape_t = ctx.input_tensor(1)
    from_input = shape_t is not None and len(shape_t.shape) == 1 and shape_t.shape[0] > 0
    opt_shape = ctx.opt("new_shape")

    const_shape = _ints(ctx.const(1)) if from_input and ctx.const(1) is not None else None
    last: list = [None, None]  # (input size, shape) of the last run: a loop body reshapes the same way each time

    def run(xs):
        x = xs[0]
        if const_shape is not None:
            if last[0] != x.size:
                last[:] = [x.size, _infer_shape(const_shape, x.size, "RESHAPE")]
            return [x.reshape(last[1])]
        if from_input:
            new = _ints(_value(ctx, xs, 1))
        elif opt_shape:
            new = list(opt_shape)
        elif shape_t is not None and len(shape_t.shape) == 1 and shape_t.shape[0] == 0:
            new = []  # reshape to a scalar
        else:
            new = list(ctx.output_tensor(0).shape)
        return [x.reshape(_infer_shape(new, x.size, "RESHAPE"))]

    return run


@register("SQUEEZE")
def squeeze(ctx: OpContext):
    dims = ctx.opt("squeeze_dims") or ()

    def run(xs):
        x = xs[0]
        if not dims:
            return [np.squeeze(x)]
        return [np.squeeze(x, axis=tuple(normalize_axis(d, x.ndim) for d in dims))]

    return run


@register("EXPAND_DIMS")
def expand_dims(ctx: OpContext):
    def run(xs):
        axis = _ints(_value(ctx, xs, 1))[0]
        x = xs[0]
        if axis < 0:
            axis += x.ndim + 1
        return [np.expand_dims(x, axis)]

    return run


@register("CONCATENATION")
def concatenation(ctx: OpContext):
    # TFLite's float concatenation ignores its fused activation; LiteRT's outputs are the reference.
    axis = ctx.opt("axis", 0)

    def run(xs):
        arrs = [np.asarray(x) for x in xs]
        try:
            a = normalize_axis(axis, arrs[0].ndim)
            outer = math.prod(arrs[0].shape[:a])
            if outer > 1 and len({x.dtype for x in arrs}) == 1 and arrs[0].dtype.kind in "fiub" \
                    and all(x.ndim == arrs[0].ndim and x.shape[:a] == arrs[0].shape[:a]
                            and x.shape[a + 1:] == arrs[0].shape[a + 1:] for x in arrs):
                return [_concat_rows(arrs, a)]
            y = np.concatenate(arrs, axis=a)
        except ValueError as e:
            raise KernelError(f"CONCATENATION: {e}") from e
        return [y]

    return run


SMALL_ROW_BYTES = 1024  # numpy's concatenate copies a row of each input per step: thin rows cost more per byte


def _concat_rows(arrs: list[np.ndarray], a: int) -> np.ndarray:
    """np.concatenate along axis ``a`` of inputs agreeing on every other axis and dtype, the rows before ``a``
    copied by one compiled loop per input where they are thin (5 inputs of 32x32x16 float32 along the channels:
    31 -> 21 us); numpy's own loop otherwise."""
    first = arrs[0]
    size = first.itemsize
    widths = [math.prod(x.shape[a:]) * size for x in arrs]
    if max(widths) > SMALL_ROW_BYTES:
        return np.concatenate(arrs, axis=a)
    out = np.empty(first.shape[:a] + (sum(x.shape[a] for x in arrs),) + first.shape[a + 1:], first.dtype)
    flat = out.reshape(-1).view(np.uint8)  # (one compiled loop for every dtype: the rows as bytes)
    at, stride = 0, sum(widths)
    for x, width in zip(arrs, widths):
        if width:
            _copy_rows(np.ascontiguousarray(x).reshape(-1).view(np.uint8), flat, at, width, stride)
        at += width
    return out


@njit(cache=True)
def _copy_rows(src, dst, at, width, stride):
    """Row r of ``src`` (``width`` bytes each) to ``dst`` from byte ``r * stride + at`` (unsigned indices: no
    negative-index wrap, so the copy vectorizes)."""
    for r in range(src.size // width):
        d = np.uint64(r * stride + at)
        s = np.uint64(r * width)
        for i in range(width):
            u = np.uint64(i)
            dst[d + u] = src[s + u]


@register("PACK")
def pack(ctx: OpContext):
    axis = ctx.opt("axis", 0)

    def run(xs):
        a = axis + xs[0].ndim + 1 if axis < 0 else axis
        try:
            return [np.stack([np.asarray(x) for x in xs], axis=a)]
        except ValueError as e:
            raise KernelError(f"PACK: {e}") from e

    return run


@register("UNPACK")
def unpack(ctx: OpContext):
    axis = ctx.opt("axis", 0)

    def run(xs):
        x = xs[0]
        a = normalize_axis(axis, x.ndim)
        return [np.take(x, i, axis=a) for i in range(x.shape[a])]

    return run


@register("SPLIT")
def split(ctx: OpContext):
    n = ctx.opt("num_splits", len(ctx.op.outputs))

    const_axis = _ints(ctx.const(0))[0] if ctx.const(0) is not None else None

    def run(xs):
        x = xs[1]
        a = normalize_axis(const_axis if const_axis is not None else _ints(_value(ctx, xs, 0))[0], x.ndim)
        if n <= 0 or x.shape[a] % n:
            raise KernelError(f"SPLIT: dimension {x.shape[a]} not divisible into {n} parts")
        step = x.shape[a] // n
        head = (slice(None),) * a
        return [x[head + (slice(i * step, (i + 1) * step),)] for i in range(n)]  # (np.split: ~10 us)

    return run


@register("SPLIT_V")
def split_v(ctx: OpContext):
    def run(xs):
        x = xs[0]
        sizes = _ints(_value(ctx, xs, 1))
        a = normalize_axis(_ints(_value(ctx, xs, 2))[0], x.ndim)
        if sizes.count(-1) == 1:
            sizes[sizes.index(-1)] = x.shape[a] - (sum(sizes) + 1)
        if sum(sizes) != x.shape[a] or min(sizes) < 0:
            raise KernelError(f"SPLIT_V: sizes {sizes} do not add up to {x.shape[a]}")
        return np.split(x, np.cumsum(sizes)[:-1], axis=a)

    return run


@register("SLICE")
def slice_op(ctx: OpContext):
    def run(xs):
        x = xs[0]
        begin, size = _ints(_value(ctx, xs, 1)), _ints(_value(ctx, xs, 2))
        if len(begin) != x.ndim or len(size) != x.ndim:
            raise KernelError(f"SLICE: begin/size of length {len(begin)}/{len(size)} for rank {x.ndim}")
        idx = []
        for b, s, d in zip(begin, size, x.shape):
            e = d if s == -1 else b + s
            if b < 0 or e > d or e < b:
                raise KernelError(f"SLICE: [{b}, {e}) out of range for dimension {d}")
            idx.append(slice(b, e))
        return [x[tuple(idx)]]

    return run


@register("STRIDED_SLICE")
def strided_slice(ctx: OpContext):
    bm, em = ctx.opt("begin_mask", 0), ctx.opt("end_mask", 0)
    ell, new, shrink = ctx.opt("ellipsis_mask", 0), ctx.opt("new_axis_mask", 0), ctx.opt("shrink_axis_mask", 0)
    offset = ctx.opt("offset", False)
    if ell & (ell - 1):
        raise ctx.fail(f"Multiple ellipses in slice spec not allowed (ellipsis_mask {ell})")

    def run(xs):
        return [np.array(xs[0][index(xs)])]  # a copy that keeps 0-d results 0-d

    def slice_index(xs) -> tuple:
        """The numpy index of this slice of ``xs[0]`` (checked)."""
        x = xs[0]
        begin, end, strides = (_ints(_value(ctx, xs, i)) for i in (1, 2, 3))
        if not len(begin) == len(end) == len(strides):
            raise KernelError("STRIDED_SLICE: begin, end and strides differ in length")
        idx: list = []
        dim = 0  # the input dimension the next spec entry addresses
        n_real = sum(1 for i in range(len(begin)) if not (new >> i) & 1 and not (ell >> i) & 1)
        for i, (b, e, s) in enumerate(zip(begin, end, strides)):
            if (ell >> i) & 1:
                idx.append(Ellipsis)
                dim += x.ndim - n_real
                continue
            if (new >> i) & 1:
                idx.append(None)
                continue
            if s == 0:
                raise KernelError("STRIDED_SLICE: stride 0")
            if dim >= x.ndim:
                raise KernelError("STRIDED_SLICE: more slice entries than input dimensions")
            size = x.shape[dim]
            if (shrink >> i) & 1:
                if (bm >> i) & 1:  # TFLite applies begin_mask even on a shrunk axis
                    b = 0 if s > 0 else size - 1
                bb = b + size if b < 0 else b
                if not 0 <= bb < size:
                    raise KernelError(f"STRIDED_SLICE: index {b} out of range for dimension {size}")
                idx.append(bb)
            else:
                idx.append(axis_slice(b, e, s, size, bool((bm >> i) & 1), bool((em >> i) & 1), offset))
            dim += 1
        return tuple(idx)

    index = per_input_shape(all(ctx.const(i) is not None for i in (1, 2, 3)), slice_index)
    return run


@register("TRANSPOSE")
def transpose(ctx: OpContext):
    def run(xs):
        perm = _ints(_value(ctx, xs, 1))
        if sorted(perm) != list(range(xs[0].ndim)):
            raise KernelError(f"TRANSPOSE: {perm} is not a permutation of rank {xs[0].ndim}")
        return [np.ascontiguousarray(np.transpose(xs[0], perm))]

    return run


def _sized(ctx: OpContext, out_shape, data_input: int = 1):
    """Checks the size of an output whose shape ``out_shape(x_shape, data)`` comes from input ``data_input``'s
    values: at prepare where those are constant and input 0's shape is fixed, and on every run before the
    kernel allocates. Returns the run-time check."""
    dtype = ctx.output_tensor(0).dtype
    data, shape = ctx.const(data_input), static_shape(ctx, 0)
    if data is not None and shape is not None:
        check_size_at_prepare(lambda: fits(out_shape(shape, np.asarray(data)), dtype, ctx.op.name))
    return lambda x_shape, value: fits(out_shape(x_shape, np.asarray(value)), dtype, ctx.op.name)


def _tiled_shape(shape, multiples) -> list[int]:
    m = _ints(multiples)
    if len(m) != len(shape):
        raise KernelError(f"TILE: {len(m)} multiples for an input of rank {len(shape)}")
    return [d * k for d, k in zip(shape, m)]


@register("TILE")
def tile(ctx: OpContext):
    check = _sized(ctx, _tiled_shape)

    def run(xs):
        multiples = _value(ctx, xs, 1)
        check(xs[0].shape, multiples)
        return [np.tile(xs[0], _ints(multiples))]

    return run


@register("BROADCAST_TO")
def broadcast_to(ctx: OpContext):
    check = _sized(ctx, lambda _, target: _ints(target))

    def run(xs):
        target = _value(ctx, xs, 1)
        check(xs[0].shape, target)
        try:
            return [np.ascontiguousarray(np.broadcast_to(xs[0], _ints(target)))]
        except ValueError as e:
            raise KernelError(f"BROADCAST_TO: {e}") from e

    return run


def _check_indices(idx: np.ndarray, limit: int, op: str) -> None:
    if idx.size and (idx.min() < 0 or idx.max() >= limit):
        raise KernelError(f"{op}: index out of range [0, {limit})")


@register("GATHER")
def gather(ctx: OpContext):
    axis, batch_dims = ctx.opt("axis", 0), ctx.opt("batch_dims", 0)

    def run(xs):
        x = xs[0]
        a = normalize_axis(axis, x.ndim)
        if np.ndim(xs[1]) == 0 and batch_dims == 0:  # one index (a loop's step): a view of that slice
            i = int(xs[1])
            if not 0 <= i < x.shape[a]:
                raise KernelError(f"GATHER: index out of range [0, {x.shape[a]})")
            return [x[(slice(None),) * a + (i,)]]
        idx = np.asarray(xs[1]).astype(np.int64)
        bd = batch_dims + idx.ndim if batch_dims < 0 else batch_dims
        _check_indices(idx, x.shape[a], "GATHER")
        if bd == 0:
            return [np.take(x, idx, axis=a)]
        batch = x.shape[:bd]
        xf = x.reshape((-1,) + x.shape[bd:])
        idf = idx.reshape((-1,) + idx.shape[bd:])
        parts = [np.take(xf[i], idf[i], axis=a - bd) for i in range(xf.shape[0])]
        out = np.stack(parts).reshape(batch + parts[0].shape) if parts else np.zeros((0,), x.dtype)
        return [out]

    return run


@register("GATHER_ND")
def gather_nd(ctx: OpContext):
    def run(xs):
        x, idx = xs[0], np.asarray(xs[1]).astype(np.int64)
        k = idx.shape[-1]
        for d in range(k):
            _check_indices(idx[..., d], x.shape[d], "GATHER_ND")
        return [x[tuple(np.moveaxis(idx, -1, 0))]]

    return run


@register("SCATTER_ND")
def scatter_nd(ctx: OpContext):
    def run(xs):
        idx, updates, shape = np.asarray(xs[0]).astype(np.int64), xs[1], _ints(xs[2])
        out = np.zeros(fits(shape, updates.dtype, "SCATTER_ND"), updates.dtype)
        k = idx.shape[-1]
        for d in range(k):
            _check_indices(idx[..., d], shape[d], "SCATTER_ND")
        np.add.at(out, tuple(np.moveaxis(idx, -1, 0)), updates)
        return [out]

    return run


def _check_paddings(name: str, p: np.ndarray, ndim: int) -> list[tuple[int, int]]:
    p = np.asarray(p).astype(np.int64).reshape(-1, 2)
    if p.shape[0] != ndim or np.any(p < 0):
        raise KernelError(f"{name}: paddings {p.tolist()} do not fit rank {ndim}")
    return [(int(a), int(b)) for a, b in p]


def _padded_shape(shape, pads: list[tuple[int, int]]) -> list[int]:
    return [d + a + b for d, (a, b) in zip(shape, pads)]


def _padded(ctx: OpContext) -> None:
    """A padding op's output size checked at prepare, where the paddings are constant."""
    _sized(ctx, lambda shape, p: _padded_shape(shape, _check_paddings(ctx.op.name, p, len(shape))))


def _paddings(ctx: OpContext, xs) -> list[tuple[int, int]]:
    """The run's paddings, checked, and the output's size with them, before anything is allocated."""
    x = xs[0]
    pads = _check_paddings(ctx.op.name, _value(ctx, xs, 1), x.ndim)
    fits(_padded_shape(x.shape, pads), ctx.output_tensor(0).dtype, ctx.op.name)
    return pads


@register("PAD", "PADV2")
def pad(ctx: OpContext):
    _padded(ctx)

    def placement(xs) -> tuple[tuple, tuple]:
        """(the output's shape, the input's index in it), the paddings checked."""
        pads = _paddings(ctx, xs)
        return tuple(_padded_shape(xs[0].shape, pads)), tuple(slice(a, a + d) for d, (a, _) in zip(xs[0].shape, pads))

    placed = per_input_shape(ctx.const(1) is not None, placement)

    def run(xs):
        x = xs[0]
        value = 0
        if len(xs) > 2 and xs[2] is not None:
            value = np.asarray(xs[2]).reshape(-1)[0]
        elif x.dtype != np.float32 and ctx.input_tensor(0).quantization is not None:
            value = int(ctx.input_tensor(0).quantization.zero_points[0])  # quantized zero
        shape, at = placed(xs)
        out = np.full(shape, value, dtype=x.dtype)  # (np.pad costs ~50 us in Python)
        out[at] = x
        return [out]

    return run


@register("MIRROR_PAD")
def mirror_pad(ctx: OpContext):
    mode = "symmetric" if ctx.opt("mode", 0) == 1 else "reflect"
    _padded(ctx)

    def run(xs):
        return [np.pad(xs[0], _paddings(ctx, xs), mode=mode)]

    return run


@register("DEPTH_TO_SPACE")
def depth_to_space(ctx: OpContext):
    bs = ctx.opt("block_size", 1)

    def run(xs):
        x = xs[0]
        n, h, w, c = x.shape
        if bs < 1 or c % (bs * bs):
            raise KernelError(f"DEPTH_TO_SPACE: {c} channels not divisible by block {bs}^2")
        y = x.reshape(n, h, w, bs, bs, c // (bs * bs)).transpose(0, 1, 3, 2, 4, 5)
        return [np.ascontiguousarray(y.reshape(n, h * bs, w * bs, c // (bs * bs)))]

    return run


@register("SPACE_TO_DEPTH")
def space_to_depth(ctx: OpContext):
    bs = ctx.opt("block_size", 1)

    def run(xs):
        x = xs[0]
        n, h, w, c = x.shape
        if bs < 1 or h % bs or w % bs:
            raise KernelError(f"SPACE_TO_DEPTH: {h}x{w} not divisible by block {bs}")
        y = x.reshape(n, h // bs, bs, w // bs, bs, c).transpose(0, 1, 3, 2, 4, 5)
        return [np.ascontiguousarray(y.reshape(n, h // bs, w // bs, bs * bs * c))]

    return run


@register("SPACE_TO_BATCH_ND")
def space_to_batch(ctx: OpContext):
    def run(xs):
        x = xs[0]
        block = _ints(_value(ctx, xs, 1))
        pads = _value(ctx, xs, 2).astype(np.int64).reshape(-1, 2)
        m = len(block)
        padded = np.pad(x, [(0, 0)] + [tuple(p) for p in pads] + [(0, 0)] * (x.ndim - 1 - m))
        n = x.shape[0]
        spatial = padded.shape[1 : 1 + m]
        if any(s % b for s, b in zip(spatial, block)):
            raise KernelError("SPACE_TO_BATCH_ND: padded size not divisible by block")
        shape = [n]
        for s, b in zip(spatial, block):
            shape += [s // b, b]
        y = padded.reshape(shape + list(padded.shape[1 + m :]))
        perm = [2 * i + 2 for i in range(m)] + [0] + [2 * i + 1 for i in range(m)]
        perm += list(range(2 * m + 1, y.ndim))
        y = y.transpose(perm)
        out_shape = [n * int(np.prod(block))] + [s // b for s, b in zip(spatial, block)] + list(padded.shape[1 + m :])
        return [np.ascontiguousarray(y.reshape(out_shape))]

    return run


@register("BATCH_TO_SPACE_ND")
def batch_to_space(ctx: OpContext):
    def run(xs):
        x = xs[0]
        block = _ints(_value(ctx, xs, 1))
        crops = _value(ctx, xs, 2).astype(np.int64).reshape(-1, 2)
        m = len(block)
        prod = int(np.prod(block))
        if x.shape[0] % prod:
            raise KernelError("BATCH_TO_SPACE_ND: batch not divisible by block product")
        n = x.shape[0] // prod
        y = x.reshape(list(block) + [n] + list(x.shape[1:]))
        perm = [m]
        for i in range(m):
            perm += [m + 1 + i, i]
        perm += list(range(2 * m + 1, y.ndim))
        y = y.transpose(perm)
        spatial = [x.shape[1 + i] * block[i] for i in range(m)]
        y = y.reshape([n] + spatial + list(x.shape[1 + m :]))
        idx = [slice(None)] + [slice(int(c[0]), s - int(c[1])) for c, s in zip(crops, spatial)]
        return [np.ascontiguousarray(y[tuple(idx)])]

    return run


@register("SHAPE")
def shape(ctx: OpContext):
    dtype = ctx.output_tensor(0).dtype
    return lambda xs: [np.array(xs[0].shape, dtype=dtype)]


@register("RANK")
def rank(ctx: OpContext):
    return lambda xs: [np.array(xs[0].ndim, dtype=np.int32)]


@register("FILL")
def fill(ctx: OpContext):
    check = _sized(ctx, lambda _, dims: _ints(dims), data_input=0)

    def run(xs):
        check((), xs[0])
        return [np.full(_ints(xs[0]), np.asarray(xs[1]).reshape(-1)[0], dtype=np.asarray(xs[1]).dtype)]

    return run


@register("RANGE")
def range_op(ctx: OpContext):
    def run(xs):
        start, limit, delta = (np.asarray(v).reshape(-1)[0] for v in xs[:3])
        if delta == 0:
            raise KernelError("RANGE: delta is 0")
        fits([max(0, int(np.ceil((float(limit) - float(start)) / float(delta))))], ctx.output_tensor(0).dtype, "RANGE")
        return [np.arange(start, limit, delta, dtype=ctx.output_tensor(0).dtype)]

    return run


@register("REVERSE_V2")
def reverse(ctx: OpContext):
    return lambda xs: [np.ascontiguousarray(np.flip(xs[0], axis=tuple(normalize_axis(a, xs[0].ndim) for a in _ints(xs[1]))))]


@register("DENSIFY")
def densify(ctx: OpContext):
    from ..model.sparse import densify as rebuild

    t = ctx.input_tensor(0)
    if t.sparsity is None or t.data is None:
        raise ctx.fail("DENSIFY needs a constant sparse input")
    dense = rebuild(t.data, ctx.output_tensor(0).shape, t.sparsity)
    return lambda xs: [dense]
