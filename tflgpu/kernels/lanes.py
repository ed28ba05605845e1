"""The lane kernel: a kernel computing each output value of a move from its original-rank coordinates (a PAD, a
slice, a concatenation, a pool's spatial forms: reindex, pool), and the slice-layout offset of such coordinates
(recurrent). A module of its own so that a change to the moves (reindex) leaves the records of the kernels built
on it standing (kernels.base.generator_version)."""

from __future__ import annotations

import numpy as np

from ..ops.layout import Layout, bhwc
from .base import GenContext
from .common import Arg, KernelSpec, dense_store4, to_slices
from .elementwise import grid, grid_prologue, pixel_grid, pixel_prologue, slice_loop
from .epilogue import Epilogue, stored_at_slice

ORIG_AXES = {0: [], 1: ["c"], 2: ["b", "c"], 3: ["b", "x", "c"], 4: ["b", "y", "x", "c"]}


def offset(shape: tuple[int, ...], coords: list[str]) -> str:
    """Scalar offset of original-rank ``coords`` in a tensor of ``shape`` stored as slices."""
    lay = bhwc(shape)
    names = dict(zip(ORIG_AXES[len(shape)], coords))
    b, y, x, c = (f"({names.get(k, '0')})" for k in ("b", "y", "x", "c"))
    return f"((({b} * {lay.s} + {c} / 4) * {lay.h} + {y}) * {lay.w} + {x}) * 4 + {c} % 4"


def move_epilogue(ctx: GenContext, lay) -> tuple[str, Epilogue]:
    """The elementwise ops fused after a move (ops.traits: takes_epilogue), applied to the float4 ``v`` stored at
    slice index ``o`` of slice ``S``, then the lanes past the last channel zeroed (a fused op may make them
    nonzero: an ADD of a constant)."""
    ep = ctx.epilogue_code(lay.c)
    return stored_at_slice(ep, lay.c), ep


def lane_kernel(ctx: GenContext, out_shape, inputs: list[int], lane_value, *, name: str | None = None,
                output: int | None = None, helpers: str = "", slice_value=None, slice_load=None,
                dense_inputs: frozenset = frozenset()) -> list[KernelSpec]:
    """lane_value(coords) -> C expression of the output value at original-rank coords; or, where the op knows
    each output slice's lanes statically, ``slice_value(s)`` -> the statements setting float4 ``v`` of output
    slice ``s`` (a branch per slice: a channel concatenation's lanes each from a known input channel). An output in
    ``ctx.half_outputs`` (an FP32 op storing it half: ops.traits' casts_own_output) is written as half; one the plan
    asks for dense (``ctx.dense``: a graph output) as its dense NHWC float buffer. The op's own output (``output``
    None) takes its fused elementwise ops (the kernel stores the last one's output). ``dense_inputs``: inputs read
    as the dense NHWC float buffer the host copies (a graph input's), which ``lane_value`` indexes so. An input the
    plan folded to a constant (a FILL's zeros that a concatenation pads a signal with) is uploaded once in its
    slice layout, which ``lane_value`` reads as it would the tensor. ``slice_load(coords)``: instead of either, a
    float4 expression of the output slice whose first lane is at ``coords`` (every lane a channel: a move whose
    four lanes are four consecutive input values, ``moves``)."""
    name = name or ctx.name
    lay = bhwc(tuple(out_shape))
    ep_code, ep = move_epilogue(ctx, lay) if output is None else ("", Epilogue())
    output = ctx.final_output if output is None else output
    coords = [f"o{i}" for i in range(len(out_shape))]
    names = dict(zip(ORIG_AXES[len(out_shape)], coords))
    params = ", ".join([f"__global const {'float' if t in dense_inputs else 'STORE_T'}* in{i}"
                        for i, t in enumerate(inputs)] + ep.params)
    body = []
    decl = "".join(f"const int {names[k]} = {k};" for k in ORIG_AXES[len(out_shape)] if k != "c")
    if slice_load is not None:
        body.append(f"  {{ const int c = S * 4; {decl} const int {names.get('c', '_c')} = c;\n"
                    f"    v = {slice_load(coords)}; }}")
    elif slice_value is not None:
        body.append("  switch (S) {")
        body += [f"  case {s}: {{ {slice_value(s)} break; }}" for s in range(lay.s)]
        body.append("  }")
    for j, lane in enumerate("xyzw" if slice_value is None and slice_load is None else ""):
        body.append(f"  {{ const int c = S * 4 + {j};\n    if (c < {lay.c}) {{ {decl} "
                    f"const int {names.get('c', '_c')} = c;\n      v.{lane} = {lane_value(coords)}; }} }}")
    half = output in ctx.half_outputs
    dense = output in ctx.dense and not half
    if dense:
        dtype, store = "float", dense_store4("dst", f"((b * {lay.h} + y) * {lay.w} + x) * {lay.c}", lay.c, "S", "v")
    else:
        dtype, store = ("half", "vstore_half4(v, o, dst);") if half else ("STORE_T", "ST4(dst, o, v);")
    per = lane_slices(ctx.target, lay)
    if per == 1:
        head, tail, size = grid_prologue(lay), "", grid(lay)
    else:  # (a loop over the work-item's slices of one pixel)
        head = (pixel_prologue(lay) + slice_loop(lay, per)
                + f"  const int o = ((b * {lay.s} + S) * {lay.h} + y) * {lay.w} + x;\n")
        tail, size = "  }\n", pixel_grid(lay, per)
    src = (helpers + f"__kernel void {name}({params}, __global {dtype}* dst) {{\n"
           + head + "  float4 v = (float4)(0.0f);\n" + "\n".join(body) + "\n" + ep_code
           + f"  {store}\n{tail}}}")
    args = [_lane_input(ctx, t) for t in inputs] + ep.args + [Arg("tensor", output)]
    tensors = [t for t in inputs if ctx.constant(t) is None]
    return [KernelSpec(name, src, size, ctx.target.row_group(size), args, tensors + ep.inputs, [output],
                       dense=frozenset([output] if dense else []) | (dense_inputs & set(inputs)))]


# output slices of one pixel a lane kernel's work-item takes on a CPU device (whose work-items each cost a loop step
# of the runtime's, more than a float4 move). MediaPipe's pose detection, its moves (3 PADs, 3 DEPTH_TO_SPACEs, 2
# RESIZE_BILINEARs, 2 concatenations) summed over 25 interleaved invokes (Intel's CPU runtime, 2 Xeon cores): one a
# work-item 634 us (with the resizes' every slice a work-item), 4 402 us, 8 414 us; selfie segmentation 268 / 230
# / 222 us. A DEPTH_TO_SPACE of 7x7x1152 alone: 59-61 us one a work-item, 41-44 with 4, 47-48 with 8
LANE_SLICES = 4


def lane_slices(target, lay: Layout) -> int:
    """Output slices of one pixel a lane kernel's work-item takes: LANE_SLICES on a CPU device, one on a GPU or
    where the grid runs along the slices first (``elementwise.grid``)."""
    if target.gpu or lay.w == 1:
        return 1
    return max(1, min(LANE_SLICES, lay.s))


def _lane_input(ctx: GenContext, t: int) -> Arg:
    """A lane kernel's input ``t``: the device tensor, or its folded value uploaded in its slice layout."""
    value = ctx.constant(t)
    if value is None:
        return Arg("tensor", t)
    return Arg("const", to_slices(value, ctx.layout(ctx.tensor(t)), np.float32))
