"""Pooling, spatial reductions (MEAN, SUM, REDUCE_MAX / MIN / PROD) and the normalizations over channels
(SOFTMAX, LOG_SOFTMAX, L2_NORMALIZATION)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph.conv_arg import ranks_channels
from ..graph.passes import LAYER_NORM
from ..model.ir import Tensor
from ..ops.attributes import conv_padding
from ..ops.custom_options import pool_params
from .base import GenContext, Target, Unsupported, generator, require_float
from .channel_rank import arg_init, arg_lanes, arg_pick, channel_arg
from .common import Arg, KernelSpec, activation, c_float, dense_store4, pad_lanes_mask, store_element
from .elementwise import grid, grid_prologue
from .epilogue import stored_at_slice
from .knobs import Knobs, one_of
from .lanes import lane_kernel, offset

# a window's start, its fold of a float4 ``xv``, and its finish (``cnt``: the window's pixels inside the image)
WINDOWS = {"MAX_POOL_2D": ("(float4)(-INFINITY)", "acc = fmax(acc, xv);", ""),
           "AVERAGE_POOL_2D": ("(float4)(0.0f)", "acc += xv;", "acc = acc / (float)max(cnt, 1);"),
           # (TFLite's sqrt of the mean square over the window's pixels inside the image)
           "L2_POOL_2D": ("(float4)(0.0f)", "acc = mad(xv, xv, acc);", "acc = sqrt(acc / (float)max(cnt, 1));")}


@dataclass(frozen=True)
class PoolShape:
    """What a pooling window's knobs depend on: the output row's pixels, whether the device is a GPU."""

    row: int
    gpu: bool = Target.gpu


@dataclass(frozen=True)
class PoolKnobs(Knobs):
    # one work-item per output row of a slice, folding its pixels in a loop of float4s (vec_type_hint(float4): the
    # CPU runtime's SIMD lanes along the row's float4s), instead of one work-item per output float4 (a GPU's
    # work-items, which a CPU runtime gathers 16 at a time, each a float4 two pixels apart in a 2 x 2 pool)
    rows: bool = False

    @classmethod
    def default(cls, shape: PoolShape) -> PoolKnobs:
        """Rows on a CPU device: openWakeWord's embedding model's 2 x 2 max pool of 72 x 32 x 24 channels took
        28.3 us a float4 a work-item, 14.6 with the window unrolled (``static_window``), 7.0 a row a work-item
        (Intel's OpenCL CPU runtime on 2 Xeon cores, 300 launches each, bench of the three kernels alone)."""
        return cls(rows=not shape.gpu and shape.row > 1)

    @classmethod
    def space(cls, shape: PoolShape) -> dict[str, list]:
        return {"rows": [False, True]} if shape.row > 1 else {}

    def problems(self, shape: PoolShape) -> list[str]:
        return one_of("rows", self.rows, (False, True))


def static_window(size: int, kernel: int, stride: int, before: int, out: int) -> bool:
    """Whether every output's window along one axis lies inside the input (VALID padding, or SAME's that pads
    nothing): the window's taps are then constant offsets, with no bounds to compute."""
    return before == 0 and (out - 1) * stride + kernel <= size


# the most taps of a window inside the input that a pool's source spells out one by one; a larger window loops.
# Selfie segmentation's 64x64 AVERAGE_POOL_2D (its squeeze-and-excitation gates' pooling, the gate's unfused
# form) spelled out was 216 KB of source, 9.8 s to compile on the Intel CPU runtime (0.07 s as this loop), and a
# fast search of the gate 226 s; a 7x7 global pool (49 taps) stays unrolled
UNROLLED_TAPS = 64


@generator(*WINDOWS)
def pool2d(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    _, ih, iw, c = ctx.layout(x_t).dims
    kh, kw = ctx.opt("filter_height", 1), ctx.opt("filter_width", 1)
    sh, sw = ctx.opt("stride_h", 1), ctx.opt("stride_w", 1)
    pad = ctx.opt("padding", 0)
    oh, pt = conv_padding(ih, kh, sh, 1, pad)
    ow, pl = conv_padding(iw, kw, sw, 1, pad)
    lay = ctx.layout(out)
    s = lay.s
    shape = PoolShape(lay.w, ctx.target.gpu)
    knobs = PoolKnobs.resolve(shape, ctx.params)
    init, acc, fin = WINDOWS[ctx.op.name]
    plane = f"(b * {s} + S) * {ih}"
    if static_window(ih, kh, sh, pt, oh) and static_window(iw, kw, sw, pl, ow):
        if kh * kw <= UNROLLED_TAPS:
            taps = " ".join(f"{{ const float4 xv = LD4(src, r + {ky * iw + kx}); {acc} }}"
                            for ky in range(kh) for kx in range(kw))
        else:  # (the same taps in the same order)
            taps = (f"for (int ky = 0; ky < {kh}; ++ky) for (int kx = 0; kx < {kw}; ++kx) {{ "
                    f"const float4 xv = LD4(src, r + ky * {iw} + kx); {acc} }}")
        window = f"""const int cnt = {kh * kw}; const int r = ({plane} + y * {sh}) * {iw} + x * {sw};
    {taps}"""
    else:
        window = f"""int cnt = 0;
    const int y0 = max(y * {sh} - {pt}, 0), y1 = min(y * {sh} - {pt} + {kh}, {ih});
    const int x0 = max(x * {sw} - {pl}, 0), x1 = min(x * {sw} - {pl} + {kw}, {iw});
    for (int iy = y0; iy < y1; ++iy) for (int ix = x0; ix < x1; ++ix) {{
      const float4 xv = LD4(src, ({plane} + iy) * {iw} + ix); {acc} ++cnt; }}"""
    body = f"""float4 acc = {init};
    {window}
    {fin}
    float4 v = acc; {activation(ctx.opt("fused_activation_function", 0), "v")}
    {pad_lanes_mask(c, "S", "v")}
    ST4(dst, o, v);"""
    if knobs.rows:
        src = f"""__attribute__((vec_type_hint(float4))) __kernel void {ctx.name}(__global const STORE_T* src, __global STORE_T* dst) {{
  const int Y = get_global_id(0); const int S = get_global_id(1);
  if (Y >= {lay.b * lay.h} || S >= {s}) return;
  const int b = Y / {lay.h}; const int y = Y % {lay.h};
  for (int x = 0; x < {lay.w}; ++x) {{
    const int o = ((b * {s} + S) * {lay.h} + y) * {lay.w} + x;
    {body}
  }}
}}"""
        gsize = (lay.b * lay.h, s)
    else:
        src = f"""__kernel void {ctx.name}(__global const STORE_T* src, __global STORE_T* dst) {{
{grid_prologue(lay)}  {{
    {body}
  }}
}}"""
        gsize = grid(lay)
    return [KernelSpec(ctx.name, src, gsize, None, [Arg("tensor", ctx.op.inputs[0]), Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0]], [ctx.op.outputs[0]], knobs.params(), space=PoolKnobs.space(shape))]


REDUCE_GROUPS = (1, 32, 64, 128, 256)  # work-items sharing one reduction (a work-group; 1: one work-item alone)


_MERGE = {"add": "{a} + {b}", "max": "fmax({a}, {b})", "min": "fmin({a}, {b})", "mul": "{a} * {b}"}
_SUBGROUP_KINDS = ("add", "max", "min")  # (sub_group_reduce_*: none takes a product)


def group_reduce(g: int, var: str, kind: str, subgroups: bool = False, lanes: int = 1) -> str:
    """Statements that reduce each work-item's ``var`` (a float, or a float4 where ``lanes`` is 4) over a
    work-group of ``g`` (local id ``l``, a ``__local`` array ``red`` of ``g``) with ``kind`` (a key of ``_MERGE``;
    only ``_SUBGROUP_KINDS`` have a sub-group form),
    leaving the result in every ``var``: a tree in local memory, or (``subgroups``) each sub-group's reduction
    (sub_group_reduce_*: the work-items of a SIMD unit, no barrier) with one value per sub-group through local
    memory."""
    if g == 1:
        return ""
    if subgroups:
        fn = f"sub_group_reduce_{kind}"
        red = f"{fn}({var})" if lanes == 1 else f"(float4)({', '.join(f'{fn}({var}.s{j})' for j in range(4))})"
        merge = _MERGE[kind].format(a=var, b="red[k]")
        return (f"{var} = {red};\n"
                f"  if (get_sub_group_local_id() == 0) red[get_sub_group_id()] = {var};\n"
                f"  barrier(CLK_LOCAL_MEM_FENCE);\n"
                f"  {var} = red[0]; for (uint k = 1; k < get_num_sub_groups(); ++k) {var} = {merge};\n"
                f"  barrier(CLK_LOCAL_MEM_FENCE);")
    op = _MERGE[kind].format(a="red[l]", b="red[l + k]")
    return (f"red[l] = {var}; barrier(CLK_LOCAL_MEM_FENCE);\n"
            f"  for (int k = {g // 2}; k > 0; k >>= 1) {{ if (l < k) red[l] = {op}; barrier(CLK_LOCAL_MEM_FENCE); }}\n"
            f"  {var} = red[0]; barrier(CLK_LOCAL_MEM_FENCE);")


def subgroup_pragma(knobs: ReduceKnobs, target: Target) -> str:
    """The line enabling the sub-group functions a kernel with ``knobs`` calls ("" where it calls none)."""
    return f"#pragma OPENCL EXTENSION {target.subgroups} : enable\n" if knobs.subgroups else ""


@dataclass(frozen=True)
class ReduceShape:
    """What a reduction's knobs depend on: the float4 terms of one reduction, whether the device is a GPU."""

    length: int
    gpu: bool = Target.gpu
    subgroups: bool = False  # the device has sub-group functions (Target.subgroups)

    @classmethod
    def of(cls, length: int, target: Target, kind: str = "add") -> ReduceShape:
        """(``kind``: group_reduce's; only some have a sub-group form)"""
        return cls(length, target.gpu, target.subgroups is not None and kind in _SUBGROUP_KINDS)


@dataclass(frozen=True)
class ReduceKnobs(Knobs):
    # work-items per reduction: 1 = one work-item sums its terms alone; more = a work-group shares them (group
    # apart) and reduces in local memory
    group: int = 1
    # a work-group's reduction through sub-group functions (each SIMD unit's, then one value per sub-group in
    # local memory) instead of a tree of barriers: where the device has them (cl_khr_subgroups, cl_intel_subgroups)
    subgroups: bool = False

    @classmethod
    def default(cls, shape: ReduceShape) -> ReduceKnobs:
        """On a GPU, for at least 16 terms, a work-group of a power of two up to 256, about a term each. On an NVIDIA
        H200 one work-item alone ran a spatial MEAN of 32 x 32 pixels in 89 us, half of fallback_ops' kernel
        time, and a classifier's 1,001-channel SOFTMAX row in 61 us (three serial passes of 251 float4 loads), a
        tenth of MobileNet v1's kernel time, which fell by 56 us with the group form. On a CPU device one
        work-item, which keeps a core's loop."""
        if shape.gpu and shape.length >= 16:  # (16 terms: the space's smallest group, 32)
            return cls(group=min(256, max(REDUCE_GROUPS[1], 1 << (shape.length - 1).bit_length())))
        return cls()

    @classmethod
    def space(cls, shape: ReduceShape) -> dict[str, list]:
        space = {"group": [g for g in REDUCE_GROUPS if g == 1 or g < 2 * shape.length]}
        if shape.subgroups and len(space["group"]) > 1:
            space["subgroups"] = [False, True]
        return space

    def problems(self, shape: ReduceShape) -> list[str]:
        bad = one_of("group", self.group, REDUCE_GROUPS) + one_of("subgroups", self.subgroups, (False, True))
        if self.subgroups and not shape.subgroups:
            bad.append("sub-group reductions need a device with cl_khr_subgroups or cl_intel_subgroups")
        elif self.subgroups and self.group == 1:
            bad.append("sub-group reductions need a work-group (group > 1)")
        return bad


# a spatial reduction's start and its kind (_MERGE's: how a work-item folds its pixels and the group its work-items'
# results; REDUCE_MAX / MIN over the pixels after the last NaN: see AFTER_LAST_NAN)
SPATIAL = {"MEAN": ("0.0f", "add"), "SUM": ("0.0f", "add"), "REDUCE_MAX": ("-INFINITY", "max"),
           "REDUCE_MIN": ("INFINITY", "min"), "REDUCE_PROD": ("1.0f", "mul")}


# LiteRT's REDUCE_MAX / MIN (XNNPACK and the builtin kernels alike) fold ``acc > x ? acc : x`` in pixel order:
# a NaN replaces what came before it and is itself replaced by the next value. So the answer is the extreme of
# the pixels after the last NaN, and NaN where the last pixel is one: two passes (the last NaN's index, then the
# fold past it), whatever the work-group's share of the pixels.
AFTER_LAST_NAN = ("REDUCE_MAX", "REDUCE_MIN")


# a reduction over the last axis, one row of channels in order: its start, its fold of one channel's ``x`` into
# ``acc`` (REDUCE_MAX / MIN: TFLite's acc > x ? acc : x, so a NaN is kept only when no value follows it), its finish
OVER_CHANNELS = {"MEAN": ("0.0f", "acc += x;", "acc * (1.0f / {n}.0f)"), "SUM": ("0.0f", "acc += x;", "acc"),
                 "REDUCE_MAX": ("-INFINITY", "acc = acc > x ? acc : x;", "acc"),
                 "REDUCE_MIN": ("INFINITY", "acc = acc < x ? acc : x;", "acc"),
                 "REDUCE_PROD": ("1.0f", "acc *= x;", "acc")}


def _over_channels(ctx: GenContext, x_t, out, keep: bool) -> list[KernelSpec]:
    """A reduction over the last axis (a layer norm's MEAN, a per-token SUM / max): each output value one row of
    the input's channels folded in order by one work-item (a C function the lane kernel calls per output value)."""
    ishape, oshape = tuple(x_t.shape), tuple(out.shape)
    lay = ctx.layout(x_t)
    if oshape != (ishape[:-1] + (1,) if keep else ishape[:-1]) or not 1 < len(ishape) <= 4 or not oshape:
        raise Unsupported(f"{ctx.op.name} of {list(ishape)} to {list(oshape)} over the last axis")
    init, fold, finish = OVER_CHANNELS[ctx.op.name]
    c, plane = lay.c, lay.h * lay.w
    fn = f"row_{ctx.name}"
    lanes = "".join(f"if (S * 4 + {j} < {c}) {{ const float x = v.s{j}; {fold} }} " for j in range(4))
    helpers = (f"float {fn}(__global const STORE_T* p, const int at) {{\n  float acc = {init};\n"
               f"  for (int S = 0; S < {lay.s}; ++S) {{ const float4 v = LD4(p, at + S * {plane}); {lanes}}}\n"
               f"  return {finish.format(n=c)};\n}}\n")

    def value(coords):
        row = (coords[:-1] if keep else coords) + ["0"]
        return f"{fn}(in0, ({offset(ishape, row)}) / 4)"

    return lane_kernel(ctx, oshape, [ctx.op.inputs[0]], value, helpers=helpers)


def _over_all(ctx: GenContext, x_t: Tensor, out: Tensor) -> list[KernelSpec]:
    """A reduction of each image over every axis but the batch (and over the batch too where there is one image):
    an audio model's normalization by its spectrogram's minimum and maximum. One work-group per output slice
    reduces the images of its lanes in turn (an output of shape [n] holds four images' values a slice; one kept
    as [n, 1, ...] one a slice), its work-items taking the input's float4s in memory order with the lanes past the
    last channel left out; REDUCE_MAX / MIN take the values after the last NaN in TFLite's row-major order
    (AFTER_LAST_NAN), whose index a float holds exactly below 2^24 values an image."""
    n, h, w, c = ctx.layout(x_t).dims
    s, hw = ctx.layout(x_t).s, h * w
    total = hw * c
    olay = ctx.layout(out)
    per_slice = 4 if len(out.shape) == 1 and n > 1 else 1  # (the images whose values one output slice holds)
    if olay.h * olay.w != 1 or olay.b * olay.s * per_slice < n or (per_slice == 1 and olay.c != 1):
        raise Unsupported(f"{ctx.op.name} of {list(x_t.shape)} to {list(out.shape)}")
    if ctx.op.name in AFTER_LAST_NAN and total >= 1 << 24:
        raise Unsupported(f"{ctx.op.name} over {total} values an image")
    init, kind = SPATIAL[ctx.op.name]
    shape = ReduceShape.of(s * hw, ctx.target, kind)
    knobs = ReduceKnobs.resolve(shape, ctx.params)
    g = knobs.group
    merge = _MERGE[kind]
    nan = ctx.op.name in AFTER_LAST_NAN
    # each float4's channels and row-major indices within its image: pixel p of slice S holds channels 4S..4S+3
    lanes = f"""      const float4 ch = (float4)(4 * S) + (float4)(0.0f, 1.0f, 2.0f, 3.0f);
      const int4 in_ = isless(ch, (float4)({c}.0f));
      const float4 idx = (float4)(p * {c}) + ch;"""
    walk = f"for (int i = l; i < {s * hw}; i += {g}) {{\n      const int S = i / {hw}; const int p = i - S * {hw};"
    find = (f"    float4 last4 = (float4)(-1.0f);\n    {walk}\n{lanes}\n"
            f"      const float4 x = LD4(src, base + i);\n"
            f"      last4 = fmax(last4, select((float4)(-1.0f), idx, in_ & isnan(x)));\n    }}\n"
            f"    float last = fmax(fmax(last4.x, last4.y), fmax(last4.z, last4.w));\n"
            f"    {group_reduce(g, 'last', 'max', knobs.subgroups)}\n") if nan else ""
    keep = "in_ & isgreater(idx, (float4)(last))" if nan else "in_"
    finish = (f" * (1.0f / {total}.0f)" if ctx.op.name == "MEAN" else "")
    batch = "4 * O + j" if per_slice == 4 else "O"
    src = f"""{subgroup_pragma(knobs, ctx.target)}__kernel void {ctx.name}(__global const STORE_T* src, __global STORE_T* dst) {{
  const int l = get_local_id(0); const int O = get_global_id(1);
  {f"__local float red[{g}];" if g > 1 else ""}
  float4 v = (float4)(0.0f);
  for (int j = 0; j < {per_slice}; ++j) {{
    const int b = {batch};
    if (b >= {n}) break;
    const int base = b * {s * hw};
{find}    float4 acc = (float4)({init});
    {walk}
{lanes}
      const float4 x = select((float4)({init}), LD4(src, base + i), {keep});
      acc = {merge.format(a="acc", b="x")};
    }}
    float r = {merge.format(a=merge.format(a="acc.x", b="acc.y"), b=merge.format(a="acc.z", b="acc.w"))};
    {group_reduce(g, "r", kind, knobs.subgroups)}
    {f"if (last == {total - 1}.0f) r = NAN;" if nan else ""}
    r = r{finish};
    if (j == 0) v.x = r; else if (j == 1) v.y = r; else if (j == 2) v.z = r; else v.w = r;
  }}
  if (l == 0) ST4(dst, O, v);
}}"""
    slices = olay.b * olay.s
    return [KernelSpec(ctx.name, src, (g, slices), (g, 1), [Arg("tensor", ctx.op.inputs[0]), Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0]], [ctx.op.outputs[0]], knobs.params(), space=ReduceKnobs.space(shape))]


@generator(*SPATIAL)
def mean(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    axes = ctx.const(1)
    rank = len(x_t.shape)
    reduced = {int(a) % rank for a in axes.reshape(-1)} if axes is not None and 1 < rank <= 4 else None
    if reduced == {rank - 1}:
        return _over_channels(ctx, x_t, out, bool(ctx.opt("keep_dims", False)))
    if reduced is not None and reduced >= set(range(1, rank)) and (0 not in reduced or x_t.shape[0] == 1):
        return _over_all(ctx, x_t, out)
    if axes is None or len(x_t.shape) != 4:
        raise Unsupported(f"{ctx.op.name} needs constant axes on a 4-D input")
    ax = sorted({int(a) % 4 for a in axes.reshape(-1)})
    if ax != [1, 2]:
        raise Unsupported(f"{ctx.op.name} over axes {ax} (only spatial [1, 2] on the OpenCL path)")
    n, ih, iw, c = ctx.layout(x_t).dims
    lay = ctx.layout(out)
    if lay.dims != (n, 1, 1, c):
        raise Unsupported("MEAN output layout")
    s, hw = lay.s, ih * iw
    init, kind = SPATIAL[ctx.op.name]
    shape = ReduceShape.of(hw, ctx.target, kind)
    knobs = ReduceKnobs.resolve(shape, ctx.params)
    g = knobs.group
    scale = f" * (1.0f / {hw}.0f)" if ctx.op.name == "MEAN" else ""
    if g == 1:
        head = f"""  const int S = get_global_id(0); const int b = get_global_id(1);
  if (S >= {s} || b >= {n}) return;
  const int l = 0;"""
        gsize, local = (s, n), None
    else:  # (a work-group per (image, slice): every work-item reaches every barrier)
        head = f"""  const int l = get_local_id(0); const int S = get_global_id(1) % {s}; const int b = get_global_id(1) / {s};
  __local float4 red[{g}];"""
        gsize, local = (g, s * n), (g, 1)
    if ctx.op.name in AFTER_LAST_NAN:  # (the last NaN's pixel, per lane, first: the fold takes the pixels after it)
        x = f"select((float4)({init}), x, isgreater((float4)(i), last))"
        find = (f"  float4 last = (float4)(-1.0f);\n  for (int i = l; i < {hw}; i += {g}) "
                f"last = select(last, (float4)(i), isnan(LD4(src, base + i)));\n"
                f"  {group_reduce(g, 'last', 'max', knobs.subgroups, lanes=4)}\n")
        finish = f"acc = select(acc, (float4)(NAN), last == (float4)({hw - 1}.0f));"
    else:
        x, find, finish = "x", "", ""
    fold = f"acc = {_MERGE[kind].format(a='acc', b=x)};"
    src = f"""{subgroup_pragma(knobs, ctx.target)}__kernel void {ctx.name}(__global const STORE_T* src, __global STORE_T* dst) {{
{head}
  const int base = (b * {s} + S) * {hw};
{find}  float4 acc = (float4)({init});
  for (int i = l; i < {hw}; i += {g}) {{ const float4 x = LD4(src, base + i); {fold} }}
  {group_reduce(g, "acc", kind, knobs.subgroups, lanes=4)}
  {finish}
  if (l == 0) {{ float4 v = acc{scale}; ST4(dst, b * {s} + S, v); }}
}}"""
    return [KernelSpec(ctx.name, src, gsize, local, [Arg("tensor", ctx.op.inputs[0]), Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0]], [ctx.op.outputs[0]], knobs.params(), space=ReduceKnobs.space(shape))]


@dataclass(frozen=True)
class RowForm:
    """A normalization over each row of channels (the last axis) in three passes: the row's maximum (``first``
    "peak") or mean ("mean"), or neither (None), a sum of ``term`` over the row, then each value's ``value``;
    ``term`` and ``value`` are float4 expressions over ``xv`` (a slice), ``m`` (that maximum or mean) and, in
    ``value``, ``sum``; BETA, EPS and CHANNELS stand for the op's beta, its epsilon and the row's channels."""

    first: str | None
    term: str
    value: str


ROW_FORMS = {
    "SOFTMAX": RowForm("peak", "exp((xv - m) * BETA)", "exp((xv - m) * BETA) * (1.0f / sum)"),
    "LOG_SOFTMAX": RowForm("peak", "exp(xv - m)", "xv - m - log(sum)"),
    # (TFLite's x / max(sqrt(sum of squares), 1e-6): the norm clamped, not its square; std::max keeping a NaN norm
    # where fmax would drop it)
    "L2_NORMALIZATION": RowForm(None, "xv * xv", "xv / (sqrt(sum) < 1e-6f ? 1e-6f : sqrt(sum))"),
    # (graph.passes.fuse_layer_norms: MEAN, SUB, MUL, MEAN, ADD, RSQRT, MUL as their ops compute them, the mean of
    # the squared differences plus epsilon under the RSQRT)
    LAYER_NORM: RowForm("mean", "(xv - m) * (xv - m)", "(xv - m) * rsqrt(sum * (1.0f / CHANNELS) + EPS)"),
}


@generator(*ROW_FORMS)
def softmax(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    lay = ctx.layout(x_t)
    form = ROW_FORMS[ctx.op.name]
    beta, eps, n = c_float(ctx.opt("beta", 1.0)), c_float(ctx.opt("epsilon", 0.0)), c_float(float(lay.c))
    term, value = (e.replace("BETA", beta).replace("EPS", eps).replace("CHANNELS", n) for e in (form.term, form.value))
    ep = ctx.epilogue_code(lay.c)  # (the fused ops after it: a quantized model's QUANT_SIM of its probabilities)
    final = ctx.final_output
    s, c = lay.s, lay.c
    shape = ReduceShape.of(s, ctx.target)
    knobs = ReduceKnobs.resolve(shape, ctx.params)
    g, rows = knobs.group, lay.b * lay.h * lay.w
    valid = f"(int4)(S * 4) + (int4)(0, 1, 2, 3) < (int4)({c})"
    at = f"((b * {s} + S) * {lay.h} + y) * {lay.w} + x"
    # a graph output (a classifier's probabilities) written as its dense boundary buffer (KernelSpec.dense) where
    # the plan asks: no conversion kernel after it
    dense = final in ctx.dense
    store = (dense_store4("dst", f"((b * {lay.h} + y) * {lay.w} + x) * {c}", c, "S", "v") if dense
             else "ST4(dst, o, v);")
    if g == 1:
        head = f"""  const int x = get_global_id(0); const int Y = get_global_id(1);
  if (x >= {lay.w} || Y >= {lay.b * lay.h}) return;
  const int b = Y / {lay.h}; const int y = Y % {lay.h};"""
        gsize, local = (lay.w, lay.b * lay.h), None
    else:  # (a row per work-group: every work-item reaches every barrier, the grid has no partial group)
        head = f"""  const int l = get_local_id(0); const int r = get_global_id(1);
  const int x = r % {lay.w}; const int b = r / {lay.w * lay.h}; const int y = (r / {lay.w}) % {lay.h};
  __local float red[{g}];"""
        gsize, local = (g, rows), (g, 1)
    first, step = ("0", "1") if g == 1 else ("l", str(g))
    peak = f"""  for (int S = {first}; S < {s}; S += {step}) {{
    const float4 v = select((float4)(-INFINITY), LD4(src, {at}), {valid});
    m = fmax(m, fmax(fmax(v.x, v.y), fmax(v.z, v.w)));
  }}
  {group_reduce(g, "m", "max", knobs.subgroups)}
""" if form.first == "peak" else f"""  m = 0.0f;
  for (int S = {first}; S < {s}; S += {step}) {{
    const float4 v = select((float4)(0.0f), LD4(src, {at}), {valid});
    m += v.x + v.y + v.z + v.w;
  }}
  {group_reduce(g, "m", "add", knobs.subgroups)}
  m = m * (1.0f / {n});
""" if form.first == "mean" else ""
    src = f"""{subgroup_pragma(knobs, ctx.target)}__kernel void {ctx.name}(__global const STORE_T* src, {"".join(f"{p}, " for p in ep.params)}__global {"float" if dense else "STORE_T"}* dst) {{
{head}
  float m = -INFINITY;
{peak}  float sum = 0.0f;
  for (int S = {first}; S < {s}; S += {step}) {{
    const float4 xv = LD4(src, {at});
    const float4 e = select((float4)(0.0f), {term}, {valid});
    sum += e.x + e.y + e.z + e.w;
  }}
  {group_reduce(g, "sum", "add", knobs.subgroups)}
  for (int S = {first}; S < {s}; S += {step}) {{
    const int o = {at};
    const float4 xv = LD4(src, o);
    float4 v = select((float4)(0.0f), {value}, {valid});
    {activation(ctx.opt("fused_activation_function", 0), "v")}
{stored_at_slice(ep, c)}    {store}
  }}
}}"""
    return [KernelSpec(ctx.name, src, gsize, local, [Arg("tensor", ctx.op.inputs[0]), *ep.args, Arg("tensor", final)],
                       [ctx.op.inputs[0], *ep.inputs], [final], knobs.params(), space=ReduceKnobs.space(shape),
                       dense=frozenset([final] if dense else []))]


@generator("ARG_MAX", "ARG_MIN")
def arg_over_channels(ctx: GenContext) -> list[KernelSpec]:
    """The index of each pixel's largest (smallest) channel: a work-item per pixel walks its slices."""
    x_t = ctx.input_tensor(0)
    require_float(ctx, x_t)
    if not ranks_channels(ctx.op, ctx.subgraph, ctx.consts):
        raise Unsupported(f"{ctx.op.name} over an axis other than the last (a pixel's channels), or into "
                          f"{ctx.output_tensor().type_name} indices")
    greater, out_lay = channel_arg(ctx, ctx.op.name, ctx.output_tensor(), x_t.shape[-1])
    lay = ctx.layout(x_t)
    s = lay.s
    src = f"""__kernel void {ctx.name}(__global const STORE_T* src, __global STORE_T* dst) {{
  const int x = get_global_id(0); const int Y = get_global_id(1);
  if (x >= {lay.w} || Y >= {lay.b * lay.h}) return;
  const int b = Y / {lay.h}; const int y = Y % {lay.h};
  {arg_init(greater, "best", "arg")}
  for (int S = 0; S < {s}; ++S) {{
    const float4 v = LD4(src, ((b * {s} + S) * {lay.h} + y) * {lay.w} + x);
    {arg_lanes("v", "S", lay.c, greater, "best", "arg")}
  }}
  {arg_pick(greater, "best", "arg", "first")}
  {store_element(out_lay, "Y * " + str(lay.w) + " + x", "(float)first")}
}}"""
    return [KernelSpec(ctx.name, src, (lay.w, lay.b * lay.h), None, [Arg("tensor", ctx.op.inputs[0]),
                                                                      Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0]], [ctx.op.outputs[0]])]


def _index_tensor_ok(ctx: GenContext, t) -> None:
    """int32 index tensors live on the device as floats: exact in FP32 storage (< 2^24), not in FP16."""
    if t.dtype != np.int32:
        raise Unsupported(f"tensor '{t.name}' is {t.type_name}")
    if ctx.fp16:
        raise Unsupported("int32 indices are not exact in FP16 storage")
    lay = ctx.layout(t)
    if lay.h * lay.w * lay.c >= 1 << 24:
        raise Unsupported("indices beyond 2^24")


@generator("MaxPoolingWithArgmax2D")
def max_pool_with_argmax(ctx: GenContext) -> list[KernelSpec]:
    x_t, out, idx_t = ctx.input_tensor(0), ctx.output_tensor(0), ctx.output_tensor(1)
    require_float(ctx, x_t, out)
    _index_tensor_ok(ctx, idx_t)
    o = pool_params(ctx)
    n, ih, iw, c = ctx.layout(x_t).dims
    kh, kw, sh, sw = o["filter_height"], o["filter_width"], o["stride_h"], o["stride_w"]
    oh, pt = conv_padding(ih, kh, sh, 1, o["padding"])
    ow, pl = conv_padding(iw, kw, sw, 1, o["padding"])
    lay = ctx.layout(out)
    s = lay.s
    src = f"""__kernel void {ctx.name}(__global const STORE_T* src, __global STORE_T* dst, __global STORE_T* idx) {{
{grid_prologue(lay)}  float4 best = (float4)(-INFINITY); float4 arg = (float4)(0.0f);
  for (int ky = 0; ky < {kh}; ++ky) {{
    const int iy = y * {sh} - {pt} + ky;
    if (iy < 0 || iy >= {ih}) continue;
    for (int kx = 0; kx < {kw}; ++kx) {{
      const int ix = x * {sw} - {pl} + kx;
      if (ix < 0 || ix >= {iw}) continue;
      const float4 v = LD4(src, ((b * {s} + S) * {ih} + iy) * {iw} + ix);
      const float4 at = (float4)((iy * {iw} + ix) * {c} + S * 4) + (float4)(0.0f, 1.0f, 2.0f, 3.0f);
      const int4 better = isgreater(v, best);
      best = select(best, v, better);
      arg = select(arg, at, better);
    }}
  }}
  {pad_lanes_mask(c, "S", "best")} {pad_lanes_mask(c, "S", "arg")}
  ST4(dst, o, best);
  ST4(idx, o, arg);
}}"""
    del oh, ow
    return [KernelSpec(ctx.name, src, grid(lay), None, [Arg("tensor", ctx.op.inputs[0]), Arg("tensor", ctx.op.outputs[0]),
                                                         Arg("tensor", ctx.op.outputs[1])],
                       [ctx.op.inputs[0]], [ctx.op.outputs[0], ctx.op.outputs[1]])]


@generator("MaxUnpooling2D")
def max_unpooling(ctx: GenContext) -> list[KernelSpec]:
    """Gather form: output (y, x, c) takes the pooled value whose index names it (filter == stride)."""
    x_t, idx_t, out = ctx.input_tensor(0), ctx.input_tensor(1), ctx.output_tensor()
    require_float(ctx, x_t, out)
    _index_tensor_ok(ctx, idx_t)
    o = pool_params(ctx)
    kh, kw, sh, sw = o["filter_height"], o["filter_width"], o["stride_h"], o["stride_w"]
    if (kh, kw) != (sh, sw):
        raise Unsupported("overlapping pooling windows (filter != stride)")
    n, ih, iw, c = ctx.layout(x_t).dims
    lay = ctx.layout(out)
    _, pt = conv_padding(lay.h, kh, sh, 1, o["padding"])
    _, pl = conv_padding(lay.w, kw, sw, 1, o["padding"])
    s = lay.s
    src = f"""__kernel void {ctx.name}(__global const STORE_T* vals, __global const STORE_T* idx, __global STORE_T* dst) {{
{grid_prologue(lay)}  float4 v = (float4)(0.0f);
  const int py = (y + {pt}) / {sh}, px = (x + {pl}) / {sw};
  if (py < {ih} && px < {iw}) {{
    const int src_o = ((b * {s} + S) * {ih} + py) * {iw} + px;
    const float4 want = (float4)((y * {lay.w} + x) * {c} + S * 4) + (float4)(0.0f, 1.0f, 2.0f, 3.0f);
    v = select((float4)(0.0f), LD4(vals, src_o), isequal(LD4(idx, src_o), want));
  }}
  {pad_lanes_mask(c, "S", "v")}
  ST4(dst, o, v);
}}"""
    return [KernelSpec(ctx.name, src, grid(lay), None, [Arg("tensor", ctx.op.inputs[0]), Arg("tensor", ctx.op.inputs[1]),
                                                         Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0], ctx.op.inputs[1]], [ctx.op.outputs[0]])]


MAX_TOPK = 1024  # (each element counts the elements ranked before it: quadratic in the axis' length)


@generator("TOPK_V2")
def topk(ctx: GenContext) -> list[KernelSpec]:
    """TOPK_V2 over the last axis (of at most MAX_TOPK values, a constant k): a work-item per element counts the
    elements ranked before it (larger, or equal at a lower index: TFLite's order; NaN after every number, as the
    CPU kernel sorts) and, where that rank is below k, stores its value and index at that place. The ranks are a
    permutation, so every output is written once, and the rank k - 1 zeroes the lanes past the last."""
    x_t, vals, idx = ctx.input_tensor(0), ctx.output_tensor(0), ctx.output_tensor(1)
    require_float(ctx, x_t, vals)
    k = ctx.const(1)
    if k is None or np.asarray(k).size != 1:
        raise Unsupported("a non-constant k")
    k = int(np.asarray(k).reshape(-1)[0])
    shape = tuple(x_t.shape)
    n = shape[-1] if shape else 0
    if idx.dtype not in (np.int32, np.int64) or not 0 < k <= n or n > MAX_TOPK:
        raise Unsupported(f"k={k} of {n} values into {idx.type_name} indices (k > 0, at most {MAX_TOPK} values)")
    if tuple(vals.shape) != shape[:-1] + (k,) or tuple(idx.shape) != tuple(vals.shape):
        raise Unsupported("output shapes")
    lay, out_lay = ctx.layout(x_t), ctx.layout(vals)
    hw, rows = lay.h * lay.w, lay.b * lay.h * lay.w
    # (no helper functions: NVIDIA's OpenCL failed to build this kernel with two C99 `inline` ones, whose
    # definitions provide no symbol where the compiler does not inline them, as in the quick build's -cl-opt-disable)
    src = f"""__kernel void {ctx.name}(__global const STORE_T* src, __global STORE_T* values, __global STORE_T* indices) {{
  const int i = get_global_id(0); const int r = get_global_id(1);
  if (i >= {n} || r >= {rows}) return;
  const int base = ((r / {hw}) * {lay.s * hw} + r % {hw}) * 4;
  const float v = LD1(src, base + (i / 4) * {hw * 4} + i % 4);
  int rank = 0;
  for (int j = 0; j < {n}; ++j) {{
    const float u = LD1(src, base + (j / 4) * {hw * 4} + j % 4);
    rank += (!isnan(u) && (isnan(v) || u > v)) || (j < i && (u == v || (isnan(u) && isnan(v))));
  }}
  if (rank >= {k}) return;
  {store_element(out_lay, f"r * {k} + rank", "v", "values")}
  {store_element(out_lay, f"r * {k} + rank", "(float)i", "indices")}
}}"""
    x, (v_t, i_t) = ctx.op.inputs[0], ctx.op.outputs[:2]
    return [KernelSpec(ctx.name, src, (n, rows), None, [Arg("tensor", x), Arg("tensor", v_t), Arg("tensor", i_t)],
                       [x], [v_t, i_t])]
