"""Pooling, spatial MEAN and SOFTMAX over channels."""

from __future__ import annotations

from ..cpu.registry import conv_padding
from .base import GenContext, Unsupported, generator, require_float
from .common import Arg, KernelSpec, activation, pad_lanes_mask
from .elementwise import grid, grid_prologue


@generator("AVERAGE_POOL_2D", "MAX_POOL_2D")
def pool2d(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.inp(0), ctx.out()
    require_float(ctx, x_t, out)
    n, ih, iw, c = ctx.layout(x_t).dims
    kh, kw = ctx.opt("filter_height", 1), ctx.opt("filter_width", 1)
    sh, sw = ctx.opt("stride_h", 1), ctx.opt("stride_w", 1)
    pad = ctx.opt("padding", 0)
    oh, pt = conv_padding(ih, kh, sh, 1, pad)
    ow, pl = conv_padding(iw, kw, sw, 1, pad)
    lay = ctx.layout(out)
    s = lay.s
    is_max = ctx.op.name == "MAX_POOL_2D"
    init = "(float4)(-INFINITY)" if is_max else "(float4)(0.0f)"
    acc = "acc = fmax(acc, xv);" if is_max else "acc += xv;"
    fin = "" if is_max else "acc = acc / (float)max(cnt, 1);"
    src = f"""__kernel void {ctx.name}(__global const STORE_T* src, __global STORE_T* dst) {{
{grid_prologue(lay)}  float4 acc = {init}; int cnt = 0;
  const int y0 = max(y * {sh} - {pt}, 0), y1 = min(y * {sh} - {pt} + {kh}, {ih});
  const int x0 = max(x * {sw} - {pl}, 0), x1 = min(x * {sw} - {pl} + {kw}, {iw});
  for (int iy = y0; iy < y1; ++iy) for (int ix = x0; ix < x1; ++ix) {{
    const float4 xv = LD4(src, ((b * {s} + S) * {ih} + iy) * {iw} + ix); {acc} ++cnt; }}
  {fin}
  float4 v = acc; {activation(ctx.opt("fused_activation_function", 0), "v")}
  {pad_lanes_mask(c, "S", "v")}
  ST4(dst, o, v);
}}"""
    del n, oh, ow
    return [KernelSpec(ctx.name, src, grid(lay), None, [Arg("tensor", ctx.op.inputs[0]),
                                                         Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0]], [ctx.op.outputs[0]])]


@generator("MEAN", "SUM")
def mean(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.inp(0), ctx.out()
    require_float(ctx, x_t, out)
    axes = ctx.const(1)
    if axes is None or len(x_t.shape) != 4:
        raise Unsupported("MEAN needs constant axes on a 4-D input")
    ax = sorted({int(a) % 4 for a in axes.reshape(-1)})
    if ax != [1, 2]:
        raise Unsupported(f"{ctx.op.name} over axes {ax} (only spatial [1, 2] on the OpenCL path)")
    n, ih, iw, c = ctx.layout(x_t).dims
    lay = ctx.layout(out)
    if lay.dims != (n, 1, 1, c):
        raise Unsupported("MEAN output layout")
    s = lay.s
    src = f"""__kernel void {ctx.name}(__global const STORE_T* src, __global STORE_T* dst) {{
  const int S = get_global_id(0); const int b = get_global_id(1);
  if (S >= {s} || b >= {n}) return;
  float4 acc = (float4)(0.0f);
  const int base = (b * {s} + S) * {ih * iw};
  for (int i = 0; i < {ih * iw}; ++i) acc += LD4(src, base + i);
  float4 v = acc{' * (1.0f / ' + str(ih * iw) + '.0f)' if ctx.op.name == 'MEAN' else ''};
  ST4(dst, b * {s} + S, v);
}}"""
    return [KernelSpec(ctx.name, src, (s, n), None, [Arg("tensor", ctx.op.inputs[0]),
                                                      Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0]], [ctx.op.outputs[0]])]


@generator("SOFTMAX")
def softmax(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.inp(0), ctx.out()
    require_float(ctx, x_t, out)
    lay = ctx.layout(x_t)
    beta = float(ctx.opt("beta", 1.0))
    s, c = lay.s, lay.c
    valid = f"(int4)(S * 4) + (int4)(0, 1, 2, 3) < (int4)({c})"
    src = f"""__kernel void {ctx.name}(__global const STORE_T* src, __global STORE_T* dst) {{
  const int x = get_global_id(0); const int Y = get_global_id(1);
  if (x >= {lay.w} || Y >= {lay.b * lay.h}) return;
  const int b = Y / {lay.h}; const int y = Y % {lay.h};
  float m = -INFINITY;
  for (int S = 0; S < {s}; ++S) {{
    const float4 v = select((float4)(-INFINITY), LD4(src, ((b * {s} + S) * {lay.h} + y) * {lay.w} + x), {valid});
    m = fmax(m, fmax(fmax(v.x, v.y), fmax(v.z, v.w)));
  }}
  float sum = 0.0f;
  for (int S = 0; S < {s}; ++S) {{
    const float4 e = select((float4)(0.0f),
        exp((LD4(src, ((b * {s} + S) * {lay.h} + y) * {lay.w} + x) - m) * {beta!r}f), {valid});
    sum += e.x + e.y + e.z + e.w;
  }}
  const float inv = 1.0f / sum;
  for (int S = 0; S < {s}; ++S) {{
    const int o = ((b * {s} + S) * {lay.h} + y) * {lay.w} + x;
    const float4 e = select((float4)(0.0f), exp((LD4(src, o) - m) * {beta!r}f) * inv, {valid});
    ST4(dst, o, e);
  }}
}}"""
    return [KernelSpec(ctx.name, src, (lay.w, lay.b * lay.h), None, [Arg("tensor", ctx.op.inputs[0]),
                                                                      Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0]], [ctx.op.outputs[0]])]
