"""MediaPipe's face-mesh attention ops on the device (the math is cpu/attention.py's, from MediaPipe's kernels).

- Landmarks2TransformMatrix: one work-item computes the 4x4 matrix; the landmark indices it reads are options,
  so its loop over the crop's landmarks is unrolled into the source.
- TransformTensorBilinear: one work-item per output pixel and slice samples the input's four neighbours.
- TransformLandmarks: v2 landmarks ([1, N, D]) are pixels whose lanes are x, y, z: one float4 each. v1 keeps them
  interleaved in the channels ([1, H, W, C]), so each lane reads its landmark's x and y from the slice layout.

The matrix ([1, 4, 4]) lies as four pixels of one slice: row r is the float4 at index r.
"""

from __future__ import annotations

from ..ops.custom_options import (
    LandmarksToMatrixV1,
    landmarks_read,
    landmarks_to_matrix_params,
    transform_landmarks_params,
    transform_tensor_params,
)
from .base import GenContext, Unsupported, generator, require_float
from .common import Arg, KernelSpec, c_float
from .elementwise import grid, grid_prologue

_MATRIX_V1 = """
  const float2 l = (float2)(LM({left}, 0), LM({left}, 1)), r = (float2)(LM({right}, 0), LM({right}, 1));
  const float a = -atan((r.y - l.y) / (r.x - l.x));
  const float ca = cos(a), sa = sin(a);
  float2 hi = (float2)(-100000.0f), lo = (float2)(100000.0f);
{points}
  const float bw = (hi.x - lo.x) * {mult}, bh = (hi.y - lo.y) * {mult};
  const float2 mid = (hi + lo) / 2.0f;
  const float cn = cos(-a), sn = sin(-a);
  const float rmx = mid.x * cn - mid.y * sn, rmy = mid.x * sn + mid.y * cn;
  /* to_absolute * rotation * scale * to_relative, written out */
  const float ax = {in_w1} / 2.0f, ay = {in_h1} / 2.0f;
  const float tx = rmx / {rng} * 2.0f - 1.0f, ty = rmy / {rng} * 2.0f - 1.0f;
  const float sx = bw / {rng}, sy = bh / {rng}, kx = 2.0f / {out_w1}, ky = 2.0f / {out_h1};
  /* R = to_absolute * rotation: rows (ax*cn, -ax*sn, ax*tx + ax), (ay*sn, ay*cn, ay*ty + ay), (0, 0, 1) */
  const float r00 = ax * cn, r01 = -ax * sn, r02 = ax * tx + ax;
  const float r10 = ay * sn, r11 = ay * cn, r12 = ay * ty + ay;
  /* M = R * diag(sx, sy, 1) * [[kx, 0, -1], [0, ky, -1], [0, 0, 1]] */
  const float m00 = r00 * sx * kx, m01 = r01 * sy * ky, m02 = -r00 * sx - r01 * sy + r02;
  const float m10 = r10 * sx * kx, m11 = r11 * sy * ky, m12 = -r10 * sx - r11 * sy + r12;
  ST4(dst, 0, (float4)(m00, m01, 0.0f, m02));
  ST4(dst, 1, (float4)(m10, m11, 0.0f, m12));
  ST4(dst, 2, (float4)(0.0f, 0.0f, 1.0f, 0.0f));
  ST4(dst, 3, (float4)(0.0f, 0.0f, 0.0f, 1.0f));"""

_MATRIX_V2 = """
  const float2 l = (float2)(LM({left}, 0), LM({left}, 1)), r = (float2)(LM({right}, 0), LM({right}, 1));
  const float rot = {target} - atan2(r.y - l.y, r.x - l.x);
  const float ca = cos(rot), sa = sin(rot);
  float2 hi = (float2)(-INFINITY), lo = (float2)(INFINITY);
{points}
  const float w = hi.x - lo.x, h = hi.y - lo.y;
  const float2 c = (hi + lo) / 2.0f;
  const float cn = cos(-rot), sn = sin(-rot);
  const float cx = c.x * cn - c.y * sn, cy = c.x * sn + c.y * cn;
  const float sx = {scale_x} * w / {out_w}.0f, sy = {scale_y} * h / {out_h}.0f;
  /* shift(cx, cy) * rotation(-rot) * diag(sx, sy) * shift(-out_w / 2, -out_h / 2), written out */
  const float m00 = cn * sx, m01 = -sn * sy, m10 = sn * sx, m11 = cn * sy;
  const float hx = -{out_w}.0f / 2.0f, hy = -{out_h}.0f / 2.0f;
  ST4(dst, 0, (float4)(m00, m01, 0.0f, m00 * hx + m01 * hy + cx));
  ST4(dst, 1, (float4)(m10, m11, 0.0f, m10 * hx + m11 * hy + cy));
  ST4(dst, 2, (float4)(0.0f, 0.0f, 1.0f, 0.0f));
  ST4(dst, 3, (float4)(0.0f, 0.0f, 0.0f, 1.0f));"""


def _one_matrix(ctx: GenContext) -> None:
    out = ctx.output_tensor()
    if tuple(out.shape) != (1, 4, 4):
        raise Unsupported(f"matrix output of shape {list(out.shape)}")


@generator("Landmarks2TransformMatrix")
def landmarks_to_transform_matrix(ctx: GenContext) -> list[KernelSpec]:
    x, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x, out)
    _one_matrix(ctx)
    p = landmarks_to_matrix_params(ctx)
    v1 = isinstance(p, LandmarksToMatrixV1)
    # where landmark i's coordinate k lies: v1 [1, 1, 1, 3N] -> channel 3i + k; v2 [1, N, 3] -> pixel i, lane k
    stride = 3 if v1 else 4
    count = x.shape[-1] // 3 if v1 else x.shape[1]
    if landmarks_read(p) > count:
        raise Unsupported(f"reads landmark {landmarks_read(p) - 1} of {count}")
    points = "\n".join(
        f"  {{ const float px = LM({i}, 0) * ca - LM({i}, 1) * sa, py = LM({i}, 0) * sa + LM({i}, 1) * ca;"
        f" hi = fmax(hi, (float2)(px, py)); lo = fmin(lo, (float2)(px, py)); }}"
        for pair in p.subset for i in pair)
    if v1:
        (in_h, in_w), (out_h, out_w) = p.input_hw, p.output_hw
        body = _MATRIX_V1.format(left=p.left, right=p.right, points=points, mult=c_float(p.bbox_size_multiplier),
                                 rng=c_float(p.landmarks_range), in_w1=f"{in_w - 1}.0f", in_h1=f"{in_h - 1}.0f",
                                 out_w1=f"{out_w - 1}.0f", out_h1=f"{out_h - 1}.0f")
    else:
        body = _MATRIX_V2.format(left=p.left, right=p.right, points=points, target=c_float(p.target_rotation_radians),
                                 scale_x=c_float(p.scale_x), scale_y=c_float(p.scale_y), out_w=p.output_width,
                                 out_h=p.output_height)
    src = f"""#define LM(i, k) LD1(src, (i) * {stride} + (k))
__kernel void {ctx.name}(__global const STORE_T* src, __global STORE_T* dst) {{
  if (get_global_id(0) != 0) return;{body}
}}
#undef LM"""
    return [KernelSpec(ctx.name, src, (1,), None, [Arg("tensor", ctx.op.inputs[0]), Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0]], [ctx.op.outputs[0]])]


def _matrix_rows(ctx: GenContext, i: int) -> None:
    m = ctx.input_tensor(i)
    require_float(ctx, m)
    if m.shape != (1, 4, 4):
        raise Unsupported(f"transform matrix of shape {list(m.shape)} (the device reads [1, 4, 4])")


@generator("TransformTensorBilinear", "TransformTensor")
def transform_tensor_bilinear(ctx: GenContext) -> list[KernelSpec]:
    x, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x, out)
    _matrix_rows(ctx, 1)
    out_h, out_w, align = transform_tensor_params(ctx)
    if x.shape[0] != 1 or tuple(out.shape) != (1, out_h, out_w, x.shape[3]):
        raise Unsupported(f"input {list(x.shape)} to output {list(out.shape)}")
    _, ih, iw, _ = ctx.layout(x).dims
    lay = ctx.layout(out)
    correct = ("  rx.w += rx.x * 0.5f + rx.y * 0.5f - 0.5f; ry.w += ry.x * 0.5f + ry.y * 0.5f - 0.5f;\n"
               if align else "")
    src = f"""#define AT(yy, xx) (((yy) < {ih} && (xx) < {iw}) ? LD4(img, (S * {ih} + (yy)) * {iw} + (xx)) : (float4)(0.0f))
__kernel void {ctx.name}(__global const STORE_T* img, __global const STORE_T* mat, __global STORE_T* dst) {{
{grid_prologue(lay)}  float4 rx = LD4(mat, 0), ry = LD4(mat, 1);
{correct}  const float tx = rx.x * x + rx.y * y + rx.w, ty = ry.x * x + ry.y * y + ry.w;
  float4 v = (float4)(0.0f);
  if (tx >= 0.0f && tx <= {iw - 1}.0f && ty >= 0.0f && ty <= {ih - 1}.0f) {{
    const float fx = floor(tx), fy = floor(ty), ax = tx - fx, ay = ty - fy;
    const int x0 = (int)fx, y0 = (int)fy;
    const float4 upper = (1.0f - ax) * AT(y0, x0) + ax * AT(y0, x0 + 1);
    const float4 lower = (1.0f - ax) * AT(y0 + 1, x0) + ax * AT(y0 + 1, x0 + 1);
    v = ay * lower + (1.0f - ay) * upper;
  }}
  ST4(dst, o, v);
}}
#undef AT"""
    return [KernelSpec(ctx.name, src, grid(lay), None,
                       [Arg("tensor", ctx.op.inputs[0]), Arg("tensor", ctx.op.inputs[1]),
                        Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0], ctx.op.inputs[1]], [ctx.op.outputs[0]])]


@generator("TransformLandmarks")
def transform_landmarks(ctx: GenContext) -> list[KernelSpec]:
    x, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x, out)
    _matrix_rows(ctx, 1)
    dims, scale = transform_landmarks_params(ctx)
    if x.shape[0] != 1 or x.shape[-1] % dims or tuple(out.shape) != tuple(x.shape):
        raise Unsupported(f"landmarks {list(x.shape)} to {list(out.shape)}")
    lay = ctx.layout(x)
    head = (f"{grid_prologue(lay)}  float4 rx = LD4(mat, 0), ry = LD4(mat, 1);\n"
            f"  rx.w *= {c_float(scale)}; ry.w *= {c_float(scale)};\n")
    if ctx.op.version == 2 and len(x.shape) == 3 and lay.s == 1:  # a landmark per pixel: lanes x, y(, z)
        body = ("  float4 v = LD4(src, o);\n"
                "  const float4 p = (float4)(v.x, v.y, 0.0f, 1.0f);\n"
                "  v.x = dot(rx, p); v.y = dot(ry, p);\n"
                "  ST4(dst, o, v);")
    else:  # landmarks interleaved in the channels: each lane finds its landmark's x and y
        body = f"""  float4 v = LD4(src, o);
  float* lanes = (float*)&v;
  for (int j = 0; j < 4; j++) {{
    const int ch = S * 4 + j, k = ch % {dims};
    if (ch >= {lay.c} || k >= 2) continue;
    const int base = ch - k;
    const float lx = LD1(src, CH(base)), ly = LD1(src, CH(base + 1));
    const float4 p = (float4)(lx, ly, 0.0f, 1.0f);
    lanes[j] = k == 0 ? dot(rx, p) : dot(ry, p);
  }}
  ST4(dst, o, v);"""
    src = f"""#define CH(c) ((((b * {lay.s} + (c) / 4) * {lay.h} + y) * {lay.w} + x) * 4 + (c) % 4)
__kernel void {ctx.name}(__global const STORE_T* src, __global const STORE_T* mat, __global STORE_T* dst) {{
{head}{body}
}}
#undef CH"""
    return [KernelSpec(ctx.name, src, grid(lay), None,
                       [Arg("tensor", ctx.op.inputs[0]), Arg("tensor", ctx.op.inputs[1]),
                        Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0], ctx.op.inputs[1]], [ctx.op.outputs[0]])]
