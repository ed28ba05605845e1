"""Ops that move values without arithmetic, as one generic kernel shape.

Each output lane computes its coordinates in the output's *original* rank,
the op maps them to input coordinates (a C expression built here, with every
shape and constant baked in), and the value is read from the input's slices.
RESHAPE/SQUEEZE/EXPAND_DIMS, TRANSPOSE, CONCATENATION, PAD/PADV2, MIRROR_PAD, TILE,
BROADCAST_TO, REVERSE_V2, PACK, UNPACK, STRIDED_SLICE, SLICE, DEPTH_TO_SPACE, SPACE_TO_DEPTH,
SPACE_TO_BATCH_ND and BATCH_TO_SPACE_ND all take this form;
RESIZE_BILINEAR interpolates float4s with TFLite's coordinate rules.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..graph.conv_arg import HALF_EXACT
from ..graph.passes import CONCAT_VIEWS, MOVES
from ..model.ir import Tensor
from ..ops.attributes import axis_slice, resize_scale
from ..ops.layout import Layout, bhwc
from .base import GenContext, Unsupported, generator, require_float
from .common import Arg, KernelSpec, c_float, dense_store4, to_slices
from .elementwise import pixel_grid, pixel_prologue, slice_loop
from .epilogue import stored_at_slice
from .lanes import ORIG_AXES, lane_kernel, move_epilogue, offset

def _constant(ctx: GenContext, i: int, what: str) -> np.ndarray:
    """Input ``i``'s value, which the kernel bakes in (``what`` it is, for the refusal where it is a tensor)."""
    value = ctx.const(i)
    if value is None:
        raise Unsupported(f"non-constant {what}")
    return value


def _check(*shapes) -> None:
    for s in shapes:
        if len(s) > 4:
            raise Unsupported(f"rank {len(s)} > 4")


@dataclass(frozen=True)
class IndexMap:
    """A move whose every output value is one input value (ops.traits' maps_indices): its output coordinates ->
    its input's (C int expressions, original ranks), with the helper code they use (a gather's index table). Moves
    in a row compose (``moves``): the last one's output coordinates go through each map in turn to the first
    one's input, which one load reads."""

    ishape: tuple[int, ...]
    oshape: tuple[int, ...]
    to_input: Callable[[list[str]], list[str]]
    helpers: str = ""

    def load(self, coords: list[str]) -> str:
        """The value at output ``coords``, read from the move's input ``in0`` (its kernel's)."""
        return f"LD1(in0, {offset(self.ishape, self.to_input(coords))})"


def _reshape_map(ctx: GenContext) -> IndexMap:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out, allow_index=True)
    ishape, oshape = tuple(x_t.shape), tuple(out.shape)
    _check(ishape, oshape)
    if int(np.prod(ishape)) != int(np.prod(oshape)):
        raise Unsupported("reshape with inferred/dynamic shape")
    return IndexMap(ishape, oshape, lambda coords: _through(oshape, ishape, coords))


@generator("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
def reshape(ctx: GenContext) -> list[KernelSpec]:
    moved = _reshape_map(ctx)
    ishape, oshape = moved.ishape, moved.oshape
    il, ol = bhwc(tuple(ishape)), bhwc(tuple(oshape))
    x = ctx.op.inputs[0]
    if x in ctx.dense:  # a graph input's dense buffer (runtime.selection.dense_boundary): in the reshape's
        # row-major order already, so each output value reads it at its own row-major index, and the input's
        # conversion to slices goes (a wake-word model's [1, 16, 96] -> [1, 1536])
        strides = [int(np.prod(oshape[i + 1:])) for i in range(len(oshape))]
        return lane_kernel(ctx, oshape, [x], lambda coords: "in0[{}]".format(
            " + ".join(f"{c} * {st}" for c, st in zip(coords, strides)) or "0"), dense_inputs=frozenset([x]))
    if (il.b, il.c, il.h * il.w) == (ol.b, ol.c, ol.h * ol.w):
        # the same slices in the same order (only the pixels' rows change: [1, 32, 32, 80] -> [1, 1024, 80]): a
        # float4 copy, where the lane-by-lane index arithmetic below took 158 us for 80K values (CPU device)
        n4 = ol.b * ol.s * ol.h * ol.w
        ep_code, ep = move_epilogue(ctx, ol)
        params = "".join(f"{p}, " for p in ep.params)
        src = (f"__kernel void {ctx.name}(__global const STORE_T* in0, {params}__global STORE_T* dst) {{\n"
               f"  const int o = get_global_id(0);\n  if (o >= {n4}) return;\n"
               f"  const int S = (o / {ol.h * ol.w}) % {ol.s};\n  float4 v = LD4(in0, o);\n{ep_code}  ST4(dst, o, v);\n}}")
        x, y = ctx.op.inputs[0], ctx.final_output
        return [KernelSpec(ctx.name, src, (n4,), None, [Arg("tensor", x), *ep.args, Arg("tensor", y)],
                           [x, *ep.inputs], [y])]

    return lane_kernel(ctx, oshape, [ctx.op.inputs[0]], moved.load)


def _transpose_map(ctx: GenContext) -> IndexMap:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out, allow_index=True)
    perm = _constant(ctx, 1, "permutation")
    perm = [int(p) for p in perm.reshape(-1)]
    _check(x_t.shape)

    def to_input(coords):
        icoords = ["0"] * len(perm)
        for i, p in enumerate(perm):
            icoords[p] = coords[i]
        return icoords

    return IndexMap(tuple(x_t.shape), tuple(x_t.shape[p] for p in perm), to_input)


@generator("TRANSPOSE")
def transpose(ctx: GenContext) -> list[KernelSpec]:
    moved = _transpose_map(ctx)
    return lane_kernel(ctx, moved.oshape, [ctx.op.inputs[0]], moved.load)


def _through(view: tuple[int, ...], shape: tuple[int, ...], coords: list[str]) -> list[str]:
    """The coordinates in a tensor of ``shape`` of the element at ``coords`` of its reshape to ``view`` (the same
    elements in the same row-major order). Where the view's last dim divides the tensor's (an SSD head's rows of
    91 scores out of a conv's 546 channels), the last coordinate is the view's plus an offset the other
    coordinates give, and those divide without it: an output slice's four lanes share every division (the lane
    by lane form took 430 us for an SSD head's 153K scores on the Intel CPU runtime)."""
    strides = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
    if view and shape and shape[-1] % view[-1] == 0:
        per = shape[-1] // view[-1]  # the view's rows in one of the tensor's last-dim runs
        rows = "0"
        for d, cexpr in zip(view[:-1], coords[:-1]):
            rows = f"({rows}) * {d} + {cexpr}"
        head = [f"((({rows}) / {per}) / {st // shape[-1]}) % {d}" for st, d in zip(strides[:-1], shape[:-1])]
        return [*head, f"(({rows}) % {per}) * {view[-1]} + {coords[-1]}"]
    lin = "0"
    for d, cexpr in zip(view, coords):
        lin = f"({lin}) * {d} + {cexpr}"
    return [f"(({lin}) / {st}) % {d}" for st, d in zip(strides, shape)]


@generator("CONCATENATION", CONCAT_VIEWS)
def concatenation(ctx: GenContext) -> list[KernelSpec]:
    """A concatenation; as CONCAT_VIEWS (graph.passes.fold_reshapes), input k read through its reshape to
    ``views[k]``: the concatenation of the reshapes, in one kernel."""
    out = ctx.output_tensor()
    ins = [ctx.tensor(i) for i in ctx.op.inputs]
    require_float(ctx, out, *ins)
    rank = len(out.shape)
    views = ctx.opt("views") or (None,) * len(ins)
    _check(out.shape, *(t.shape for t in ins))
    axis = ctx.opt("axis", 0) % max(rank, 1)
    if axis == rank - 1 and not any(views) and bhwc(tuple(out.shape)).s <= MAX_STATIC_SLICES:
        channels = [(k, ch) for k, t in enumerate(ins) for ch in range(t.shape[-1] if t.shape else 1)]
        return lane_kernel(ctx, out.shape, list(ctx.op.inputs), None,
                           slice_value=lambda s: _channel_slice(ins, channels, s))

    def value(coords):
        expr, start = "0.0f", 0
        parts = []
        for k, (t, shown) in enumerate(zip(ins, views)):
            ic = list(coords)
            ic[axis] = f"({coords[axis]} - {start})"
            at = ic if shown is None else _through(shown, t.shape, ic)
            size = (t.shape if shown is None else shown)[axis]
            parts.append((start + size, f"LD1(in{k}, {offset(t.shape, at)})"))
            start += size
        for end, rd in reversed(parts):
            expr = f"({coords[axis]} < {end} ? {rd} : {expr})"
        return expr

    return lane_kernel(ctx, out.shape, list(ctx.op.inputs), value)


# a concatenation over channels of at most this many output slices takes a branch per slice (``_channel_slice``)
MAX_STATIC_SLICES = 64


def _channel_slice(ins: list[Tensor], channels: list[tuple[int, int]], s: int) -> str:
    """Statements setting ``v``, output slice ``s`` of the concatenation of ``ins`` over their channels (the last
    axis; every other dim equal, so each input's slice ``t`` at this pixel is its float4 at
    ``((b * S_k + t) * h + y) * w + x``; ``channels``: each output channel's input and its channel there): each of
    the slice's channels is a known lane of a known input slice, so each input slice is loaded once, and a slice
    whose four lanes are one input slice's is a float4 copy, where the lane-by-lane form chose among the inputs per
    lane at run time (8 one-channel inputs: 3.8 ms for 425K values on the Intel CPU runtime)."""
    # per lane: (input, its slice, its lane), or None past the last channel
    owners = [(k, ch // 4, ch % 4) for k, ch in channels[4 * s:4 * s + 4]]
    owners += [None] * (4 - len(owners))
    loads, names = [], {}
    for own in owners:
        if own is not None and own[:2] not in names:
            k, t = own[:2]
            lay = bhwc(tuple(ins[k].shape))
            names[own[:2]] = f"t{len(names)}"
            loads.append(f"const float4 {names[own[:2]]} = LD4(in{k}, ((b * {lay.s} + {t}) * {lay.h} + y) * {lay.w} + x);")
    if len(names) == 1 and owners == [(*owners[0][:2], j) for j in range(4)]:
        return f"{loads[0]} v = {names[owners[0][:2]]};"
    lanes = ", ".join("0.0f" if own is None else f"{names[own[:2]]}.s{own[2]}" for own in owners)
    return " ".join(loads) + f" v = (float4)({lanes});"


@generator("PAD", "PADV2")
def pad(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    p = _constant(ctx, 1, "paddings").reshape(-1, 2).astype(int)
    cval = 0.0
    if ctx.op.name == "PADV2" and ctx.input_tensor(2) is not None:
        cval = float(np.asarray(_constant(ctx, 2, "pad value")).reshape(-1)[0])
    _check(x_t.shape)
    shape = x_t.shape
    oshape = tuple(int(d + a + b) for d, (a, b) in zip(shape, p))

    def read(coords, load: str, fill: str) -> str:
        """``load`` at the input coordinates of output ``coords`` where they lie inside the input, else ``fill``."""
        ic = [f"({c} - {int(a)})" for c, (a, _) in zip(coords, p)]
        inside = " && ".join(f"{c} >= 0 && {c} < {d}" for c, d in zip(ic, shape)) or "1"
        return f"(({inside}) ? {load.format(offset(shape, ic))} : {fill})"

    if shape and _slice_aligned(shape[-1], int(p[-1][0]), oshape[-1], cval):
        # (each output slice is an input slice or all padding: a float4 load; the padding lanes past the input's
        # channels are its zeros, which a zero pad value keeps)
        return lane_kernel(ctx, oshape, [ctx.op.inputs[0]], None,
                           slice_load=lambda co: read(co, "LD4(in0 + {}, 0)", f"(float4)({c_float(cval)})"))
    return lane_kernel(ctx, oshape, [ctx.op.inputs[0]], lambda co: read(co, "LD1(in0, {})", c_float(cval)))


def _slice_aligned(channels: int, before: int, out_channels: int, cval: float) -> bool:
    """Whether a PAD of ``before`` channels ahead of ``channels`` maps each output slice to one input slice or to
    padding alone: ``before`` a multiple of 4, and the lanes past the input's channels (its zeros) the pad value, or
    none in the output (neither tensor has a part-filled slice)."""
    return before % 4 == 0 and (cval == 0.0 or (channels % 4 == 0 and out_channels % 4 == 0))


@generator("MIRROR_PAD")
def mirror_pad(ctx: GenContext) -> list[KernelSpec]:
    """TFLite's one reflection at each edge: REFLECT (mode 0) leaves the edge value out (pads up to d - 1),
    SYMMETRIC (mode 1) repeats it (up to d)."""
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    p = _constant(ctx, 1, "paddings").reshape(-1, 2).astype(int)
    sym = int(ctx.opt("mode", 0) == 1)
    shape = tuple(x_t.shape)
    _check(shape)
    if any(a < 0 or b < 0 or max(a, b) > d - 1 + sym for d, (a, b) in zip(shape, p)):
        raise Unsupported("paddings past one reflection")
    oshape = tuple(int(d + a + b) for d, (a, b) in zip(shape, p))

    def value(coords):
        ic = []
        for c, d, (a, _) in zip(coords, shape, p):
            i = f"({c} - {int(a)})"
            ic.append(f"({i} < 0 ? -{i} - {sym} : ({i} >= {d} ? {2 * d - 2 + sym} - {i} : {i}))")
        return f"LD1(in0, {offset(shape, ic)})"

    return lane_kernel(ctx, oshape, [ctx.op.inputs[0]], value)


@generator("TILE", "BROADCAST_TO")
def tile(ctx: GenContext) -> list[KernelSpec]:
    """Each output coordinate read from the input at that coordinate modulo the input's extent (TILE's repeats,
    BROADCAST_TO's size-1 dims; the input's dims aligned to the output's last ones)."""
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    _constant(ctx, 1, "multiples" if ctx.op.name == "TILE" else "shape")
    shape, oshape = tuple(x_t.shape), tuple(out.shape)
    _check(shape, oshape)
    lead = len(oshape) - len(shape)
    if lead < 0 or any(o % d for o, d in zip(oshape[lead:], shape)):
        raise Unsupported(f"{ctx.op.name} of {list(shape)} to {list(oshape)}")

    def value(coords):
        ic = [c if d == o else ("0" if d == 1 else f"({c} % {d})") for c, d, o in zip(coords[lead:], shape, oshape[lead:])]
        return f"LD1(in0, {offset(shape, ic)})"

    return lane_kernel(ctx, oshape, [ctx.op.inputs[0]], value)


@generator("REVERSE_V2")
def reverse(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    axes = _constant(ctx, 1, "axes")
    shape = tuple(x_t.shape)
    _check(shape)
    flip = {int(a) % len(shape) for a in np.asarray(axes).reshape(-1)}

    def value(coords):
        ic = [f"({d - 1} - {c})" if i in flip else c for i, (c, d) in enumerate(zip(coords, shape))]
        return f"LD1(in0, {offset(shape, ic)})"

    return lane_kernel(ctx, shape, [ctx.op.inputs[0]], value)


@generator("PACK")
def pack(ctx: GenContext) -> list[KernelSpec]:
    """The inputs stacked along a new axis: output coordinate ``axis`` picks the input."""
    out = ctx.output_tensor()
    ins = [ctx.tensor(i) for i in ctx.op.inputs]
    require_float(ctx, out, *ins)
    if any(ctx.consts.get(i) is not None for i in ctx.op.inputs):
        raise Unsupported("constant PACK operand")
    shape = tuple(ins[0].shape)
    _check(tuple(out.shape))
    axis = ctx.opt("axis", 0) % len(out.shape)

    def value(coords):
        ic = coords[:axis] + coords[axis + 1:]
        expr = "0.0f"
        for k in reversed(range(len(ins))):
            expr = f"({coords[axis]} == {k} ? LD1(in{k}, {offset(shape, ic)}) : {expr})"
        return expr

    return lane_kernel(ctx, tuple(out.shape), list(ctx.op.inputs), value)


@generator("UNPACK")
def unpack(ctx: GenContext) -> list[KernelSpec]:
    """One kernel per output: output k is the input at index k of the unpacked axis."""
    x_t = ctx.input_tensor(0)
    outs = [ctx.tensor(t) for t in ctx.op.outputs]
    require_float(ctx, x_t, *outs)
    shape = tuple(x_t.shape)
    _check(shape)
    axis = ctx.opt("axis", 0) % len(shape)
    specs = []
    for k, (t_idx, t) in enumerate(zip(ctx.op.outputs, outs)):
        def value(coords, k=k):
            return f"LD1(in0, {offset(shape, coords[:axis] + [str(k)] + coords[axis:])})"

        specs += lane_kernel(ctx, tuple(t.shape), [ctx.op.inputs[0]], value, name=f"{ctx.name}_{k}", output=t_idx)
    return specs


@generator("SPACE_TO_BATCH_ND", "BATCH_TO_SPACE_ND")
def space_batch(ctx: GenContext) -> list[KernelSpec]:
    """An image's pixels dealt to ``bh x bw`` batches by their offset in each block (SPACE_TO_BATCH_ND, the input
    zero-padded first: batch (sy * bw + sx) * n + b holds pixel (y * bh + sy, x * bw + sx) of image b), and back
    (BATCH_TO_SPACE_ND, then cropped): a dilated conv as older converters wrote it. 4-D tensors."""
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    block, edges = _constant(ctx, 1, "block shape"), _constant(ctx, 2, "paddings / crops")
    shape, oshape = tuple(x_t.shape), tuple(out.shape)
    if len(shape) != 4 or block.size != 2:
        raise Unsupported(f"{ctx.op.name} of rank {len(shape)} (4-D images only)")
    (bh, bw), ((t, _), (left, _)) = (int(v) for v in block.reshape(-1)), edges.reshape(2, 2).astype(int)

    if ctx.op.name == "SPACE_TO_BATCH_ND":
        n = shape[0]

        def value(coords):
            ob, oy, ox, c = coords
            iy, ix = f"({oy} * {bh} + ({ob} / {n}) / {bw} - {t})", f"({ox} * {bw} + ({ob} / {n}) % {bw} - {left})"
            inside = f"{iy} >= 0 && {iy} < {shape[1]} && {ix} >= 0 && {ix} < {shape[2]}"
            return f"(({inside}) ? LD1(in0, {offset(shape, [f'({ob} % {n})', iy, ix, c])}) : 0.0f)"
    else:
        n = oshape[0]

        def value(coords):
            b, oy, ox, c = coords
            y, x = f"({oy} + {t})", f"({ox} + {left})"
            ib = f"((({y} % {bh}) * {bw} + {x} % {bw}) * {n} + {b})"
            return f"LD1(in0, {offset(shape, [ib, f'({y} / {bh})', f'({x} / {bw})', c])})"

    return lane_kernel(ctx, oshape, [ctx.op.inputs[0]], value)


def _slice_map(ctx: GenContext) -> IndexMap:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out, allow_index=True)
    shape = x_t.shape
    _check(shape)
    consts = [ctx.const(i) for i in range(1, len(ctx.op.inputs))]
    if any(c is None for c in consts):
        raise Unsupported("non-constant slice parameters")
    if ctx.op.name == "SLICE":
        begin, size = (list(map(int, c.reshape(-1))) for c in consts)
        starts = begin
        steps = [1] * len(shape)
        keep = list(range(len(shape)))
        counts = [d - b if s == -1 else s for b, s, d in zip(begin, size, shape)]
    else:
        if ctx.opt("ellipsis_mask", 0) or ctx.opt("new_axis_mask", 0):
            raise Unsupported("ellipsis/new-axis masks")
        begin, end, strides = (list(map(int, c.reshape(-1))) for c in consts)
        if len(begin) != len(shape):
            raise Unsupported("partial slice spec")
        bm, em, sm = ctx.opt("begin_mask", 0), ctx.opt("end_mask", 0), ctx.opt("shrink_axis_mask", 0)
        starts, steps, counts, keep = [], [], [], []
        for i, (b, e, s, d) in enumerate(zip(begin, end, strides, shape)):
            if (sm >> i) & 1:
                starts.append((0 if s > 0 else d - 1) if (bm >> i) & 1 else (b + d if b < 0 else b))
                steps.append(1)
                counts.append(1)
                continue
            sl = axis_slice(b, e, s, d, bool((bm >> i) & 1), bool((em >> i) & 1), ctx.opt("offset", False))
            idx = range(d)[sl]
            starts.append(idx.start if len(idx) else 0)
            steps.append(s)
            counts.append(len(idx))
            keep.append(i)
    oshape = tuple(counts[i] for i in keep)
    if tuple(out.shape) != oshape or min(counts, default=1) <= 0:
        raise Unsupported("slice output shape")

    def to_input(coords):
        it = iter(coords)
        return [f"({starts[i]} + {steps[i]} * {next(it)})" if i in keep else str(starts[i]) for i in range(len(shape))]

    return IndexMap(tuple(shape), oshape, to_input)


@generator("STRIDED_SLICE", "SLICE")
def strided_slice(ctx: GenContext) -> list[KernelSpec]:
    moved = _slice_map(ctx)
    return lane_kernel(ctx, moved.oshape, [ctx.op.inputs[0]], moved.load)


@generator("DEPTH_TO_SPACE", "SPACE_TO_DEPTH")
def depth_space(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    bs = ctx.opt("block_size", 1)
    n, h, w, c = x_t.shape
    if ctx.op.name == "DEPTH_TO_SPACE":
        oshape = (n, h * bs, w * bs, c // (bs * bs))
        oc = oshape[3]

        def at(co):
            b, y, x, ch = co
            return offset(x_t.shape, [b, f'{y} / {bs}', f'{x} / {bs}',
                                      f'(({y} % {bs}) * {bs} + {x} % {bs}) * {oc} + {ch}'])
        aligned = oc % 4 == 0
    else:
        oshape = (n, h // bs, w // bs, c * bs * bs)

        def at(co):
            b, y, x, ch = co
            return offset(x_t.shape, [b, f'{y} * {bs} + ({ch} / {c}) / {bs}', f'{x} * {bs} + ({ch} / {c}) % {bs}',
                                      f'{ch} % {c}'])
        aligned = c % 4 == 0
    if aligned:  # (each output slice's four channels are four adjacent channels of one input slice: a float4 load)
        return lane_kernel(ctx, oshape, [ctx.op.inputs[0]], None, slice_load=lambda co: f"LD4(in0 + {at(co)}, 0)")
    return lane_kernel(ctx, oshape, [ctx.op.inputs[0]], lambda co: f"LD1(in0, {at(co)})")


# output slices of one pixel a RESIZE_BILINEAR work-item takes on a CPU device (its coordinates and weights computed
# once for them). Five resizes of MediaPipe's pose detection / selfie segmentation and DeepLab, each as a
# conv -> resize -> conv plan, 21 interleaved rounds (Intel's CPU runtime, 2 Xeon cores), us for 1 / 4 / 8 / 16 /
# every slice: 7x7x1152 -> 14x14 287 / 152 / 116 / 113 / 346; 16x16x128 -> 32x32 129 / 74 / 67 / 102 / 111;
# 14x14x192 -> 28x28 159 / 81 / 71 / 56 / 155; 64x64x16 -> 128x128 207 / 123 / 120 / 119 / 120; 33x33x24 ->
# 257x257 1042 / 482 / 388 / 381 / 389. A GPU takes one slice a work-item: its work-items are many and cheap
RESIZE_SLICES = 8


@generator("RESIZE_BILINEAR")
def resize_bilinear(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    size = _constant(ctx, 1, "size")
    oh, ow = (int(v) for v in size.reshape(-1))
    n, ih, iw, c = ctx.layout(x_t).dims
    align, half = ctx.opt("align_corners", False), ctx.opt("half_pixel_centers", False)
    sy, sx = resize_scale(ih, oh, align), resize_scale(iw, ow, align)
    lay = Layout(n, oh, ow, c)
    s = lay.s

    def coord(var, scale, in_size):
        v = f"(((float){var} + 0.5f) * {c_float(scale)} - 0.5f)" if half else f"((float){var} * {c_float(scale)})"
        return (f"  const float f{var} = {v};\n"
                f"  const int {var}0 = max((int)floor(f{var}), 0);\n"
                f"  const int {var}1 = min((int)ceil(f{var}), {in_size - 1});\n"
                f"  const float d{var} = f{var} - (float){var}0;\n")

    # one work-item per output pixel and RESIZE_SLICES slices: the coordinates and weights once for those, not
    # once per slice; a graph output written as its dense boundary buffer (KernelSpec.dense) where the plan asks.
    # vec_type_hint: Intel's CPU runtime otherwise vectorizes across pixels, turning each pixel's float4 loads and
    # stores into gathers and scatters (DeepLab's 33x33 -> 257x257x21 output: 1130 -> 383 us written densely)
    per = 1 if ctx.target.gpu else min(RESIZE_SLICES, s)
    dense = ctx.op.outputs[0] in ctx.dense
    value = "tl * wtl + bl * wbl + tr * wtr + br * wbr"
    store = (dense_store4("dst", f"((b * {oh} + y) * {ow} + x) * {c}", c, "S", value) if dense else
             f"ST4(dst, ((b * {s} + S) * {oh} + y) * {ow} + x, {value});")
    out_t = "float" if dense else "STORE_T"
    src = (f"__attribute__((vec_type_hint(float4))) __kernel void {ctx.name}(__global const STORE_T* src, "
           f"__global {out_t}* dst) {{\n" + pixel_prologue(lay)
           + coord("y", sy, ih) + coord("x", sx, iw)
           + "  const float wtl = (1.0f - dy) * (1.0f - dx), wbl = dy * (1.0f - dx), wtr = (1.0f - dy) * dx,"
           " wbr = dy * dx;\n" + slice_loop(lay, per)
           + f"    const int base = (b * {s} + S) * {ih};\n"
           f"    const float4 tl = LD4(src, (base + y0) * {iw} + x0), tr = LD4(src, (base + y0) * {iw} + x1);\n"
           f"    const float4 bl = LD4(src, (base + y1) * {iw} + x0), br = LD4(src, (base + y1) * {iw} + x1);\n"
           f"    {store}\n"
           "  }\n}")
    return [KernelSpec(ctx.name, src, pixel_grid(lay, per), None, [Arg("tensor", ctx.op.inputs[0]),
                                                                  Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0]], [ctx.op.outputs[0]],
                       dense=frozenset(ctx.op.outputs[:1] if dense else []))]


@generator("SPLIT", "SPLIT_V")
def split(ctx: GenContext) -> list[KernelSpec]:
    """One reindex kernel per output: output k reads the input shifted along the split axis."""
    x_idx, axis_idx = (1, 0) if ctx.op.name == "SPLIT" else (0, 2)
    x_t = ctx.input_tensor(x_idx)
    outs = [ctx.tensor(t) for t in ctx.op.outputs]
    require_float(ctx, x_t, *outs)
    axis = ctx.const(axis_idx)
    if axis is None:
        raise Unsupported("non-constant split axis")
    _check(x_t.shape)
    a = int(np.asarray(axis).reshape(-1)[0]) % len(x_t.shape)
    specs, start = [], 0
    for k, (t_idx, t) in enumerate(zip(ctx.op.outputs, outs)):
        def value(coords, start=start):
            ic = list(coords)
            ic[a] = f"({coords[a]} + {start})"
            return f"LD1(in0, {offset(x_t.shape, ic)})"

        specs += lane_kernel(ctx, t.shape, [ctx.op.inputs[x_idx]], value, name=f"{ctx.name}_{k}", output=t_idx)
        start += t.shape[a]
    if start != x_t.shape[a]:
        raise Unsupported("split sizes do not cover the axis")
    return specs


@generator("RESIZE_NEAREST_NEIGHBOR")
def resize_nearest(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    size = ctx.const(1)
    if size is None or len(x_t.shape) != 4:
        raise Unsupported("non-constant size or not 4-D")
    oh, ow = (int(v) for v in size.reshape(-1))
    n, ih, iw, c = x_t.shape
    align, half = ctx.opt("align_corners", False), ctx.opt("half_pixel_centers", False)

    def coord(var, in_size, out_size):
        scale = resize_scale(in_size, out_size, align)
        v = f"(((float){var} + {c_float(0.5 if half else 0.0)}) * {c_float(scale)})"
        i = f"(int)round({v})" if align else f"(int)floor({v})"
        i = f"min({i}, {in_size - 1})"
        return f"max({i}, 0)" if half else i

    def value(co):
        b, y, x, ch = co
        return f"LD1(in0, {offset(x_t.shape, [b, coord(y, ih, oh), coord(x, iw, ow), ch])})"

    return lane_kernel(ctx, (n, oh, ow, c), [ctx.op.inputs[0]], value)


MAX_BROADCAST_WEIGHTS = 1 << 22  # values of a constant BATCH_MATMUL operand repeated over the batch (16 MB)
MATMUL_ROWS = 8  # output rows per work-item of the tiled BATCH_MATMUL (4: 0.52-0.62 ms, 8: 0.41-0.49, 16: 0.38 below)


def _matmul_tiles(ctx: GenContext, ash, bsh, osh, adj_y: bool, b_value: np.ndarray | None = None) -> list[KernelSpec]:
    """BATCH_MATMUL of operands with the same batch dims, x not transposed: a work-item takes MATMUL_ROWS rows of
    one output slice (4 columns) and sums over the slices of x's rows, float4 by float4: y's rows one float4 each
    (or, ``adj_y``, y's rows are the columns: a dot product per lane). Attention's two products on the Intel CPU
    device (4 heads x 196 tokens x 64, bench/make_transformer_block.py): 2.8 ms each lane by lane (the general
    form below), 0.41-0.49 ms each this way (profiled, while a fuzz run held a core). ``b_value``: y is that
    constant, of shape ``bsh`` (uploaded once, in slices as a tensor of that shape is stored)."""
    m, k, n = osh[-2], ash[-1], osh[-1]
    batch = int(np.prod(osh[:-2])) if len(osh) > 2 else 1
    ks, ns, tm = -(-k // 4), -(-n // 4), MATMUL_ROWS
    inner = list(osh[1:-2]) if len(osh) > 2 else []
    # the batch coordinates of work-item Z (the leading dims flattened), then the row and slice coordinates
    bc = ["Z"] if len(osh) == 3 else ([f"(Z / {inner[0]})", f"(Z % {inner[0]})"] if len(osh) == 4 else [])

    def at(shape, row: str, col: str) -> str:  # the float4 index of (batch, row, col..col+3)
        return f"(({offset(tuple(shape), bc + [row, col])}) / 4)"

    ep = ctx.epilogue_code(n)
    lines = [f"__kernel void {ctx.name}(__global const STORE_T* in0, __global const STORE_T* in1, "
             + "".join(f"{p}, " for p in ep.params) + "__global STORE_T* dst) {",
             f"  const int S = get_global_id(0); const int R = get_global_id(1) * {tm}; const int Z = get_global_id(2);",
             f"  if (S >= {ns} || R >= {m} || Z >= {batch}) return;"]
    lines += [f"  float4 acc{r} = (float4)(0.0f);" for r in range(tm)]
    lines.append(f"  for (int ks = 0; ks < {ks}; ++ks) {{")
    if adj_y:  # (y is [.., n, k]: output lane j is x's row against y's row 4S + j)
        lines += [f"    const float4 y{j} = (S * 4 + {j} < {n}) ? LD4(in1, {at(bsh, f'S * 4 + {j}', 'ks * 4')}) "
                  f": (float4)(0.0f);" for j in range(4)]
    else:  # (y's rows k..k+3, each one float4 of the output's 4 columns; a row past k is not read)
        lines += [f"    const float4 y{j} = (ks * 4 + {j} < {k}) ? LD4(in1, {at(bsh, f'ks * 4 + {j}', 'S * 4')}) "
                  f": (float4)(0.0f);" for j in range(4)]
    for r in range(tm):
        lines.append(f"    if (R + {r} < {m}) {{ const float4 x = LD4(in0, {at(ash, f'R + {r}', 'ks * 4')});")
        if adj_y:
            lines.append(f"      acc{r} += (float4)(dot(x, y0), dot(x, y1), dot(x, y2), dot(x, y3)); }}")
        else:
            lines.append(f"      acc{r} = mad((float4)(x.x), y0, mad((float4)(x.y), y1, mad((float4)(x.z), y2, "
                         f"mad((float4)(x.w), y3, acc{r})))); }}")
    lines.append("  }")
    for r in range(tm):
        lines.append(f"  if (R + {r} < {m}) {{ const int o = {at(osh, f'R + {r}', 'S * 4')}; float4 v = acc{r};")
        lines.append(stored_at_slice(ep, n) + "    ST4(dst, o, v); }")
    lines.append("}")
    y_arg = Arg("tensor", ctx.op.inputs[1]) if b_value is None else Arg("const", to_slices(b_value, bhwc(bsh), np.float32))
    reads = [ctx.op.inputs[0]] + ([ctx.op.inputs[1]] if b_value is None else [])
    args = [Arg("tensor", ctx.op.inputs[0]), y_arg, *ep.args, Arg("tensor", ctx.final_output)]
    return [KernelSpec(ctx.name, "\n".join(lines), (ns, -(-m // tm), batch), None, args, reads + ep.inputs,
                       [ctx.final_output], flops=2 * batch * m * n * k)]


@generator("BATCH_MATMUL")
def batch_matmul(ctx: GenContext) -> list[KernelSpec]:
    """x @ y over the batch dims. A constant y (a MatMul by a weight matrix, as ONNX converters write it: the
    openWakeWord melspectrogram's mel filter bank) is uploaded once, broadcast over x's batch dims, and takes the
    tiled form; a constant x is left to the CPU kernels."""
    a_t, b_t, out = ctx.input_tensor(0), ctx.input_tensor(1), ctx.output_tensor()
    require_float(ctx, a_t, b_t, out)
    if ctx.const(0) is not None:
        raise Unsupported("constant first operand")
    adj_x, adj_y = ctx.opt("adj_x", False), ctx.opt("adj_y", False)
    ash, bsh, osh = a_t.shape, b_t.shape, out.shape
    if min(len(ash), len(bsh)) < 2 or max(len(ash), len(bsh), len(osh)) > 4:
        raise Unsupported("rank")
    k_dim = ash[-2] if adj_x else ash[-1]
    if (bsh[-1] if adj_y else bsh[-2]) != k_dim:
        raise Unsupported("inner dimensions differ")
    weights = ctx.const(1)
    if weights is not None:
        full = tuple(ash[:-2]) + tuple(bsh[-2:])  # (y repeated over x's batch dims, as the tiles read it)
        if adj_x or tuple(osh[:-2]) != tuple(ash[:-2]) or int(np.prod(full)) > MAX_BROADCAST_WEIGHTS:
            raise Unsupported("constant second operand: x transposed, or its batch too large to repeat it over")
        try:
            value = np.broadcast_to(np.asarray(weights, np.float32).reshape(bsh), full)
        except ValueError:
            raise Unsupported("constant second operand: batch dims that do not broadcast") from None
        return _matmul_tiles(ctx, ash, full, osh, adj_y, value)

    if not adj_x and tuple(ash[:-2]) == tuple(bsh[:-2]) == tuple(osh[:-2]):
        return _matmul_tiles(ctx, ash, bsh, osh, adj_y)

    def batch_coords(shape, coords):
        extra = len(shape) - 2
        lead = coords[len(coords) - 2 - extra: len(coords) - 2]
        return [c if d > 1 else "0" for c, d in zip(lead, shape[:extra])]

    co = [f"c{i}" for i in range(len(osh))]
    m, nn = co[-2], co[-1]
    ab, bb = batch_coords(ash, co), batch_coords(bsh, co)
    a_idx = ab + (["kk", m] if adj_x else [m, "kk"])
    b_idx = bb + ([nn, "kk"] if adj_y else ["kk", nn])
    helper = (f"float {ctx.name}_dot(__global const STORE_T* in0, __global const STORE_T* in1, "
              + ", ".join(f"const int {c}" for c in co) + ") {\n"
              + f"  float s = 0.0f;\n  for (int kk = 0; kk < {k_dim}; ++kk)\n"
              + f"    s += LD1(in0, {offset(ash, a_idx)}) * LD1(in1, {offset(bsh, b_idx)});\n  return s;\n}}\n\n")
    return lane_kernel(ctx, osh, [ctx.op.inputs[0], ctx.op.inputs[1]],
                   lambda coords: f"{ctx.name}_dot(in0, in1, {', '.join(coords)})", helpers=helper)


MAX_INDEX_TABLE = 4096  # entries of a constant index table written into a kernel's source


def _gather_axes(ctx: GenContext) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """A GATHER's input and output shapes and its axis (made non-negative), checked as both its forms need."""
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out, allow_bool=True, allow_index=True)
    if ctx.opt("batch_dims", 0):
        raise Unsupported("batch_dims != 0")
    ishape, oshape = tuple(x_t.shape), tuple(out.shape)
    _check(ishape, oshape)
    axis = ctx.opt("axis", 0)
    return ishape, oshape, axis + len(ishape) if axis < 0 else axis


@generator("GATHER")
def gather(ctx: GenContext) -> list[KernelSpec]:
    """GATHER by a tensor of indices (``_gather_by_tensor``), or by constant ones (``_gather_map``)."""
    if ctx.const(1) is None:
        return _gather_by_tensor(ctx, *_gather_axes(ctx))
    moved = _gather_map(ctx)
    return lane_kernel(ctx, moved.oshape, [ctx.op.inputs[0]], moved.load, helpers=moved.helpers)


def _gather_map(ctx: GenContext) -> IndexMap:
    """GATHER with constant indices (e.g. a time step picked by an unrolled loop): the indices are a
    ``__constant`` table in the source, so the kernel is a plain reindexing; where they are an affine function of
    their position (``_affine``: a signal's frames, tf.signal.frame's hop * frame + sample; a time step), the
    index is computed instead, at any size."""
    ishape, oshape, axis = _gather_axes(ctx)
    idx = ctx.const(1)
    if idx is None:
        raise Unsupported("indices that are a tensor")
    idx = np.asarray(idx, np.int64)
    affine = _affine(idx)
    if not 0 <= axis < len(ishape) or idx.size == 0 or (affine is None and idx.size > MAX_INDEX_TABLE):
        raise Unsupported("axis out of range or index table size")
    if idx.min() < 0 or idx.max() >= ishape[axis]:
        raise Unsupported("indices out of range")
    expect = ishape[:axis] + idx.shape + ishape[axis + 1:]
    if expect != oshape:
        raise Unsupported(f"output shape {oshape} is not {expect}")
    r = idx.ndim
    helpers, table = "", f"gidx_{ctx.name}"
    if affine is None:
        helpers = f"__constant int {table}[{idx.size}] = {{{', '.join(str(int(v)) for v in idx.reshape(-1))}}};\n"
    strides = [int(np.prod(idx.shape[j + 1:])) for j in range(r)]

    def position(coords):
        """The index at the output's coordinates: computed where the table is affine (no table), else read."""
        at = coords[axis:axis + r]
        if affine is not None:
            start, steps = affine
            return " + ".join([str(start)] + [f"({c}) * {step}" for c, step in zip(at, steps) if step])
        return f"{table}[{' + '.join(f'({c}) * {st}' for c, st in zip(at, strides)) or '0'}]"

    return IndexMap(ishape, oshape, lambda coords: coords[:axis] + [f"({position(coords)})"] + coords[axis + r:],
                    helpers)


def _affine(idx: np.ndarray) -> tuple[int, list[int]] | None:
    """(start, steps) where every index is start + sum of its coordinates times the steps (a frame of a signal,
    tf.signal.frame's hop * frame + sample; a strided or reversed pick), else None."""
    if not idx.size:
        return None
    start = int(idx.reshape(-1)[0])
    unit = lambda j: tuple(int(k == j) for k in range(idx.ndim))  # (the index one step along dim j)
    steps = [int(idx[unit(j)]) - start if n > 1 else 0 for j, n in enumerate(idx.shape)]
    grid = np.full(idx.shape, start, np.int64)
    for j, (n, step) in enumerate(zip(idx.shape, steps)):
        grid += (np.arange(n, dtype=np.int64) * step).reshape([-1 if k == j else 1 for k in range(idx.ndim)])
    return (start, steps) if np.array_equal(grid, idx) else None


@generator("GATHER_ND")
def gather_nd(ctx: GenContext) -> list[KernelSpec]:
    """GATHER_ND with constant indices ([..., K]: each row the first K coordinates of a slice of the params) as a
    ``__constant`` table in the source; tensor indices stay on the CPU."""
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out, allow_index=True)
    idx = ctx.const(1)
    if idx is None:
        raise Unsupported("tensor indices")
    idx = np.asarray(idx, np.int64)
    ishape, oshape = tuple(x_t.shape), tuple(out.shape)
    _check(ishape, oshape)
    k = idx.shape[-1] if idx.ndim else 0
    if idx.ndim < 1 or not 0 < k <= len(ishape) or idx.size > MAX_INDEX_TABLE:
        raise Unsupported("index table shape or size")
    if (idx < 0).any() or (idx >= np.array(ishape[:k])).any():
        raise Unsupported("indices out of range")
    rows = idx.shape[:-1]
    if rows + ishape[k:] != oshape:
        raise Unsupported(f"output shape {oshape} is not {rows + ishape[k:]}")
    table = f"gnd_{ctx.name}"
    helpers = f"__constant int {table}[{idx.size}] = {{{', '.join(str(int(v)) for v in idx.reshape(-1))}}};\n"
    strides = [int(np.prod(rows[j + 1:])) for j in range(len(rows))]

    def value(coords):
        row = " + ".join(f"({coords[j]}) * {strides[j]}" for j in range(len(rows))) or "0"
        icoords = [f"{table}[({row}) * {k} + {j}]" for j in range(k)] + coords[len(rows):]
        return f"LD1(in0, {offset(ishape, icoords)})"

    return lane_kernel(ctx, oshape, [ctx.op.inputs[0]], value, helpers=helpers)


def _gather_by_tensor(ctx: GenContext, ishape, oshape, axis: int) -> list[KernelSpec]:
    """GATHER whose indices are a tensor (made on the CPU, e.g. TOPK_V2's, or on the device): a 1-D int32 tensor
    held as float values, exact for every valid index (below 2^24 in float32 storage; below 2,048 in half, so an
    FP16 kernel takes an axis of at most 2,048). An index out of range gives NaN (LiteRT refuses it; a kernel
    cannot raise)."""
    t = ctx.input_tensor(1)
    if t.dtype not in (np.int32, np.int64) or len(t.shape) != 1:
        raise Unsupported("tensor indices that are not one int32 / int64 vector")
    n = ishape[axis]
    if ctx.fp16 and n > HALF_EXACT or n >= 1 << 24:
        raise Unsupported(f"an axis of {n}: its indices would not be exact in the kernel's storage")
    if ishape[:axis] + t.shape + ishape[axis + 1:] != oshape:
        raise Unsupported(f"output shape {oshape}")

    def value(coords):
        k = f"((int)LD1(in1, {offset(t.shape, [coords[axis]])}))"
        inside = f"clamp({k}, 0, {n - 1})"  # (read in bounds whatever the index; NaN where it is out)
        icoords = coords[:axis] + [inside] + coords[axis + 1:]
        return f"(({k} >= 0 && {k} < {n}) ? LD1(in0, {offset(ishape, icoords)}) : NAN)"

    return lane_kernel(ctx, oshape, [ctx.op.inputs[0], ctx.op.inputs[1]], value)


MAX_CUMSUM = 1024  # (each output sums its prefix: quadratic in the axis' length)


@generator("CUMSUM")
def cumsum(ctx: GenContext) -> list[KernelSpec]:
    """CUMSUM along a constant axis of at most MAX_CUMSUM values: each output adds its prefix (or suffix, with
    ``reverse``; without its own value, ``exclusive``) in TFLite's order, one value after the other."""
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    a = ctx.const(1)
    shape = tuple(x_t.shape)
    _check(shape)
    if a is None or np.asarray(a).size != 1 or not shape:
        raise Unsupported("a non-constant axis")
    axis = int(np.asarray(a).reshape(-1)[0]) % len(shape)
    n = shape[axis]
    if n > MAX_CUMSUM:
        raise Unsupported(f"an axis of {n} values (at most {MAX_CUMSUM})")
    exclusive, reverse = bool(ctx.opt("exclusive", False)), bool(ctx.opt("reverse", False))
    if axis != len(shape) - 1:
        return _cumsum_scan(ctx, shape, axis, exclusive, reverse)
    co = [f"c{i}" for i in range(len(shape))]
    at = co[:axis] + ["k"] + co[axis + 1:]
    lo, hi = (f"{co[axis]} + {int(exclusive)}", str(n)) if reverse else ("0", f"{co[axis]} + {1 - int(exclusive)}")
    order = f"for (int j = {hi} - 1; j >= {lo}; --j) {{ const int k = j;" if reverse else \
        f"for (int k = {lo}; k < {hi}; ++k) {{"
    helper = (f"float {ctx.name}_sum(__global const STORE_T* in0, " + ", ".join(f"const int {c}" for c in co)
              + f") {{\n  float s = 0.0f;\n  {order} s += LD1(in0, {offset(shape, at)}); }}\n  return s;\n}}\n\n")
    return lane_kernel(ctx, shape, [ctx.op.inputs[0]], lambda coords: f"{ctx.name}_sum(in0, {', '.join(coords)})",
                   helpers=helper)


def _cumsum_scan(ctx: GenContext, shape: tuple[int, ...], axis: int, exclusive: bool, reverse: bool
                 ) -> list[KernelSpec]:
    """CUMSUM along an axis other than the channels: a work-item per line of float4 slices along it keeps the
    running sum (the same additions in the same order as a sum per output) and stores it at each step."""
    lay = bhwc(shape)
    dims = {"b": lay.b, "s": lay.s, "y": lay.h, "x": lay.w}
    along = ORIG_AXES[len(shape)][axis]
    stride = {"b": lay.s * lay.h * lay.w, "y": lay.w, "x": 1}[along]
    n = dims.pop(along)
    lines = int(np.prod(list(dims.values())))
    decode, rest = [], "g"
    for name, d in reversed(dims.items()):
        decode.append(f"const int {name} = {rest} % {d};")
        rest = f"({rest} / {d})"
    co = {k: (k if k in dims else "0") for k in ("b", "s", "y", "x")}
    step = (f"for (int t = {n - 1}; t >= 0; --t)" if reverse else f"for (int t = 0; t < {n}; ++t)")
    update = "ST4(dst, at, acc); acc += v;" if exclusive else "acc += v; ST4(dst, at, acc);"
    body = f"{{ const int at = base + t * {stride}; const float4 v = LD4(in0, at); {update} }}"
    src = (f"__kernel void {ctx.name}(__global const STORE_T* in0, __global STORE_T* dst) {{\n"
           f"  const int g = get_global_id(0);\n  if (g >= {lines}) return;\n  " + " ".join(decode)
           + f"\n  const int base = (({co['b']} * {lay.s} + {co['s']}) * {lay.h} + {co['y']}) * {lay.w} + {co['x']};\n"
           f"  float4 acc = (float4)(0.0f);\n  {step} {body}\n}}")
    x, y = ctx.op.inputs[0], ctx.op.outputs[0]
    return [KernelSpec(ctx.name, src, (lines,), None, [Arg("tensor", x), Arg("tensor", y)], [x], [y])]


def casts_held_values(x: Tensor, y: Tensor) -> bool:
    """Whether a CAST of ``x`` into ``y`` is one of integers or bools to float32, unquantized: the device holds
    such values as floats already, so the cast only copies them (``cast``; linked where the storage matches:
    runtime.selection.link_reshapes)."""
    return (x.dtype in (np.int32, np.int64, np.bool_) and y.dtype == np.float32 and x.quantization is None
            and y.quantization is None)


@generator("CAST")
def cast(ctx: GenContext) -> list[KernelSpec]:
    """CAST of integers or bools to float32: a device tensor of int32 / int64 / bool holds its values as floats
    already (an ARG_MAX's index, a comparison's 0 / 1, an upload converted as numpy's float32 does), so the cast
    copies them; the float32 result is what TFLite's cast gives. Quantized integers keep their CPU kernel. In an
    FP16 plan the cast reads its input in the storage its maker chose (an index may need FP32) and, where only
    FP16 ops read its output, stores that half (ops.traits: casts_own_output)."""
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    if not casts_held_values(x_t, out):
        raise Unsupported(f"CAST {x_t.type_name} -> {out.type_name} (integers or bools to float32 only)")
    shape = tuple(x_t.shape)
    _check(shape)
    return lane_kernel(ctx, shape, [ctx.op.inputs[0]], lambda coords: f"LD1(in0, {offset(shape, coords)})")


# the moves whose index maps compose (ops.traits' maps_indices)
INDEX_MAPS = {"RESHAPE": _reshape_map, "SQUEEZE": _reshape_map, "EXPAND_DIMS": _reshape_map, "TRANSPOSE": _transpose_map,
              "GATHER": _gather_map, "STRIDED_SLICE": _slice_map, "SLICE": _slice_map}


@generator(MOVES)
def moves(ctx: GenContext) -> list[KernelSpec]:
    """graph.passes.fold_moves' chain of moves as one kernel: each output value's coordinates go through the moves'
    index maps, last to first, in a helper function (one variable a coordinate at each step, so the expressions do
    not nest), and one load reads the first move's input there."""
    maps = []
    for op in ctx.opt("chain", ()):
        make = INDEX_MAPS.get(op.name)
        if make is None:
            raise Unsupported(f"{op.name} is no index map")
        maps.append(make(replace(ctx, op=op, epilogue=[])))
    if not maps:
        raise Unsupported("no moves")
    oshape = maps[-1].oshape
    steps, at = _composed(maps)
    slices = contiguous_slices(maps, steps, at)
    if slices is not None:  # (no helper: one multiply-add a coordinate, a float4 load)
        start, coefs = slices
        base = lambda coords: " + ".join([str(start)] + [f"({c}) * {k}" for c, k in zip(coords, coefs) if k])
        return lane_kernel(ctx, oshape, [ctx.op.inputs[0]], None,
                           slice_load=lambda coords: f"LD4(in0 + {base(coords)}, 0)")
    fn = f"{ctx.name}_at"
    lines = [f"static inline int {fn}({', '.join(f'const int o{d}' for d in range(len(oshape))) or 'void'}) {{"]
    lines += [f"  const int {n} = {e};" for n, e in steps] + [f"  return {at};", "}", ""]
    helpers = "".join(m.helpers for m in maps) + "\n".join(lines)
    return lane_kernel(ctx, oshape, [ctx.op.inputs[0]], lambda coords: f"LD1(in0, {fn}({', '.join(coords)}))",
                       helpers=helpers)


def _composed(maps: list[IndexMap]) -> tuple[list[tuple[str, str]], str]:
    """The moves ``maps`` (first to last) as one index map of the output's coordinates ``o0``, ``o1``...: each
    step's input coordinates, last move first, as (name, C int expression) assignments (one variable a coordinate,
    so the expressions do not nest), and the first move's input offset in its slice layout."""
    names = [f"o{d}" for d in range(len(maps[-1].oshape))]
    steps = []
    for k, m in enumerate(reversed(maps)):
        coords = m.to_input(names)
        names = [f"m{k}_{d}" for d in range(len(coords))]
        steps += zip(names, coords)
    return steps, offset(maps[0].ishape, names)


# the most output values ``contiguous_slices`` evaluates the composed index map at (int32 arrays, a few per step)
MAX_MAPPED_VALUES = 1 << 22


def contiguous_slices(maps: list[IndexMap], steps: list[tuple[str, str]], at: str) -> tuple[int, list[int]] | None:
    """(start, coefficients) where the moves ``maps`` (first to last; ``_composed``'s ``steps`` and offset ``at``)
    read each output value at element start + sum of its coordinates times the coefficients of the first move's
    input in its slice layout, with a coefficient of 1 along the output's
    channels, which are whole slices: each output slice is then four consecutive input values, one float4 load at
    an offset computed by one multiply-add a coordinate (BirdNET's STFT framing, 2 * hop * frame + sample through a
    reshape to pairs, the frames' GATHER and a reshape back, where the lane-by-lane form took 2.55 ms for 1M values
    on the Intel CPU runtime). The map is evaluated at every output coordinate (the same expressions the kernel
    would compute), so this holds exactly or None is returned; None too for a map reading a table or past
    MAX_MAPPED_VALUES values."""
    oshape = maps[-1].oshape
    if not oshape or oshape[-1] % 4 or any(m.helpers for m in maps) or int(np.prod(oshape)) > MAX_MAPPED_VALUES:
        return None
    grid = np.indices(oshape, dtype=np.int32)  # (the kernel's ints)
    env = {f"o{d}": grid[d] for d in range(len(oshape))}
    try:
        for name, expr in steps:
            env[name] = _int_value(expr, env)
        offsets = np.broadcast_to(_int_value(at, env), oshape)
    except (_NotAffine, OverflowError):
        return None
    start = int(offsets.reshape(-1)[0])
    unit = lambda d: tuple(int(k == d) for k in range(len(oshape)))
    coefs = [int(offsets[unit(d)]) - start if n > 1 else 0 for d, n in enumerate(oshape)]
    if coefs[-1] != 1 or not np.array_equal(offsets, start + sum(g * k for g, k in zip(grid, coefs))):
        return None
    return start, coefs


class _NotAffine(Exception):
    """An index expression ``_int_value`` does not evaluate."""


_INT_OPS = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply}


def _int_value(expr: str, env: dict[str, np.ndarray]) -> np.ndarray:
    """One of this module's C int expressions (+ - * / %, parentheses, names, int literals) evaluated over the int32
    arrays of ``env`` (C's int: a literal past it raises OverflowError). Raises _NotAffine at anything else (a
    table's lookup) and at a division of a negative value, where C truncates and Python floors."""

    def value(node):
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = value(node.left), value(node.right)
            if isinstance(node.op, (ast.Div, ast.Mod)):
                if np.any(a < 0) or np.any(b <= 0):
                    raise _NotAffine(expr)
                return a // b if isinstance(node.op, ast.Div) else a % b
            if type(node.op) in _INT_OPS:
                return _INT_OPS[type(node.op)](a, b)
        raise _NotAffine(expr)

    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise _NotAffine(expr) from e
    return value(tree)
