"""An STFT's spectrum on the device: graph.passes.fuse_spectra's ``RFFT_PART`` (an RFFT2D of one row a frame, then
the real part, the imaginary part or the magnitude of each bin).

Each frame's N real samples (its row cropped or zero-padded to N, a power of two) are transformed as N / 2
complex values z[m] = x[2m] + i x[2m + 1]: an iterative radix-2 FFT of those (loaded in bit-reversed order, then
log2(N / 2) stages of butterflies), then the split that gives the real transform's N / 2 + 1 bins,

    X[k] = (Z[k] + conj(Z[N/2 - k])) / 2 - i e^(-2 pi i k / N) (Z[k] - conj(Z[N/2 - k])) / 2,

all in float with twiddles computed in double and rounded once (TFLite transforms in double and rounds the
result: the two agree to a few float roundings of the spectrum's scale). Two forms (``SpectrumKnobs.group``): a
work-item per frame over a private array (a CPU runtime vectorizes its identical loops across frames), or a
work-group per frame sharing the frame in local memory, its butterflies split among the work-items between
barriers (a GPU's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..graph.passes import RFFT_PART
from .base import GenContext, generator, require_float
from .common import Arg, KernelSpec
from .errors import Unsupported
from .knobs import Knobs, one_of

MAX_LENGTH = 8192  # the longest transform (a work-group's frame in local memory: 4 * N bytes, 32 KiB)
MAX_PRIVATE = 4096  # the longest a work-item takes alone (its private array: 4 * N bytes)
GROUPS = (32, 64, 128, 256)  # work-items of a frame's work-group


@dataclass(frozen=True)
class SpectrumShape:
    length: int  # N
    gpu: bool
    max_group: int


@dataclass(frozen=True)
class SpectrumKnobs(Knobs):
    # 0: a work-item per frame; else the work-items of a frame's work-group
    group: int = 0

    @classmethod
    def default(cls, shape: SpectrumShape) -> SpectrumKnobs:
        """A work-group a frame on a GPU (or where a work-item cannot hold the frame), the largest that has a
        butterfly for each work-item (N / 4 of them a stage); a work-item a frame on a CPU device."""
        groups = cls._groups(shape)
        if (shape.gpu or shape.length > MAX_PRIVATE) and groups:
            return cls(group=groups[-1])
        return cls()

    @classmethod
    def space(cls, shape: SpectrumShape) -> dict[str, list]:
        return {"group": ([0] if shape.length <= MAX_PRIVATE else []) + cls._groups(shape)}

    @staticmethod
    def _groups(shape: SpectrumShape) -> list[int]:
        """The work-groups the device takes, none larger than a stage's butterflies (but the smallest)."""
        fit = [g for g in GROUPS if g <= shape.max_group]
        return [g for g in fit if g <= shape.length // 4] or fit[:1]

    def problems(self, shape: SpectrumShape) -> list[str]:
        bad = one_of("group", self.group, (0, *GROUPS))
        if self.group == 0 and shape.length > MAX_PRIVATE:
            bad.append(f"a work-item takes a transform of at most {MAX_PRIVATE} samples, not {shape.length}")
        if self.group > shape.max_group:
            bad.append(f"group={self.group} is more than the device's work-group takes ({shape.max_group})")
        return bad


def twiddles(n: int) -> np.ndarray:
    """e^(-2 pi i k / n) for k = 0 .. n / 2, as float32 (re, im) pairs, computed in double."""
    a = -2.0 * np.pi * np.arange(n // 2 + 1, dtype=np.float64) / n
    return np.stack([np.cos(a), np.sin(a)], axis=1).astype(np.float32).reshape(-1)


def _reverse(name: str, bits: int) -> str:
    """A function reversing the low ``bits`` bits of an int (swapping halves, then quarters, ...)."""
    return f"""static inline int {name}(const int v) {{
  uint u = (uint)v;
  u = ((u >> 1) & 0x55555555u) | ((u & 0x55555555u) << 1);
  u = ((u >> 2) & 0x33333333u) | ((u & 0x33333333u) << 2);
  u = ((u >> 4) & 0x0F0F0F0Fu) | ((u & 0x0F0F0F0Fu) << 4);
  u = ((u >> 8) & 0x00FF00FFu) | ((u & 0x00FF00FFu) << 8);
  u = (u >> 16) | (u << 16);
  return (int)(u >> {32 - bits});
}}
"""


_PARTS = {"real": "X.x", "imag": "X.y", "abs": "hypot(X.x, X.y)"}


def _cmul(a: str, b: str) -> str:
    """The complex product of two float2s."""
    return f"(float2)({a}.x * {b}.x - {a}.y * {b}.y, {a}.x * {b}.y + {a}.y * {b}.x)"


def _pixel_base(var: str, pixel: str, lay) -> str:
    """A declaration of ``var``: the slice-layout float4 index of slice 0 of NHWC pixel ``pixel`` (slice s is
    ``s * h * w`` further)."""
    h, w, s = lay.h, lay.w, lay.s
    return (f"const int {var} = (({pixel}) / {w * h} * {s * h} + (({pixel}) / {w}) % {h}) * {w} "
            f"+ ({pixel}) % {w};")


@generator(RFFT_PART)
def rfft_part(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    n, part = int(ctx.opt("length", 0)), ctx.opt("part", "")
    if part not in _PARTS:
        raise Unsupported(f"no spectrum part {part!r}")
    if n < 4 or n & (n - 1) or n > MAX_LENGTH:
        raise Unsupported(f"a transform of {n} samples (a power of two from 4 to {MAX_LENGTH})")
    if ctx.epilogue:
        raise Unsupported("fused ops after a spectrum")
    shape = tuple(x_t.shape)
    rows, length = int(shape[-2]), int(shape[-1])
    frames = math.prod(shape[:-2])
    bins, m = n // 2 + 1, n // 2
    xl, ol = ctx.layout(x_t), ctx.layout(out)
    if xl.c != length or xl.b * xl.h * xl.w != frames * rows:
        raise Unsupported(f"frames of shape {list(shape)} are not pixels of the slice layout")
    if ol.c != bins or ol.b * ol.h * ol.w != frames:
        raise Unsupported(f"a spectrum of shape {list(out.shape)} is not a row of {bins} bins a frame")
    knobs = SpectrumKnobs.resolve(SpectrumShape(n, ctx.target.gpu, ctx.target.max_group), ctx.params)
    g = knobs.group
    loads = (min(length, n) + 3) // 4  # input slices holding samples (the lanes past the row's end hold zeros)
    rev = f"{ctx.name}_rev"

    def bin_value(k: str) -> str:
        """Statements computing ``X`` (float2), bin ``k`` of the real transform, from the complex FFT ``z``."""
        return (f"{{ const float2 a_ = z[({k}) & {m - 1}]; const float2 c_ = z[({m} - ({k})) & {m - 1}];\n"
                f"        const float2 e_ = 0.5f * (float2)(a_.x + c_.x, a_.y - c_.y);\n"
                f"        const float2 o_ = 0.5f * (float2)(a_.y + c_.y, c_.x - a_.x);\n"
                f"        const float2 t_ = tw[{k}];\n"
                f"        X = e_ + (float2)(t_.x * o_.x - t_.y * o_.y, t_.x * o_.y + t_.y * o_.x); }}")

    def store(s: str) -> str:
        lanes = []
        for j in range(4):
            lanes.append(f"      if (4 * ({s}) + {j} <= {m}) {{ float2 X; {bin_value(f'4 * ({s}) + {j}')}\n"
                         f"        v.s{j} = {_PARTS[part]}; }}")
        return ("      float4 v = (float4)(0.0f);\n" + "\n".join(lanes) + f"\n      ST4(dst, ob + ({s}) * {ol.h * ol.w}, v);")

    def butterfly(i: str, j: str, h: str) -> str:
        """A radix-2 stage's butterfly of z[i] and z[i + h] (span h, twiddle j)."""
        return (f"const float2 w_ = tw[({j}) * ({m} / {h})]; const float2 a_ = z[{i}]; const float2 b_ = z[{i} + {h}];\n"
                f"        const float2 t_ = {_cmul('b_', 'w_')};\n"
                f"        z[{i}] = a_ + t_; z[{i} + {h}] = a_ - t_;")

    def quad(i: str, j: str, h: str) -> str:
        """Two radix-2 stages (spans h and 2h) at once over z[i], z[i + h], z[i + 2h], z[i + 3h] (twiddle j < h):
        half the passes over the frame."""
        return (f"const float2 w1_ = tw[({j}) * ({m} / {h})]; const float2 w2_ = tw[({j}) * ({m} / (2 * {h}))];\n"
                f"        const float2 w3_ = tw[(({j}) + {h}) * ({m} / (2 * {h}))];\n"
                f"        float2 a_ = z[{i}], b_ = z[{i} + {h}], c_ = z[{i} + 2 * {h}], d_ = z[{i} + 3 * {h}];\n"
                f"        float2 t_ = {_cmul('b_', 'w1_')}; b_ = a_ - t_; a_ = a_ + t_;\n"
                f"        t_ = {_cmul('d_', 'w1_')}; d_ = c_ - t_; c_ = c_ + t_;\n"
                f"        t_ = {_cmul('c_', 'w2_')}; c_ = a_ - t_; a_ = a_ + t_;\n"
                f"        t_ = {_cmul('d_', 'w3_')}; d_ = b_ - t_; b_ = b_ + t_;\n"
                f"        z[{i}] = a_; z[{i} + {h}] = b_; z[{i} + 2 * {h}] = c_; z[{i} + 3 * {h}] = d_;")

    odd = (m.bit_length() - 1) % 2  # (log2(M) odd: one radix-2 stage first, of span 1)
    first = 2 if odd else 1  # the first radix-4 pass's span

    load = (f"const float4 x_ = LD4(src, ib + s * {xl.h * xl.w}); "
            f"z[{rev}(2 * s)] = x_.s01; z[{rev}(2 * s + 1)] = x_.s23;")
    if g == 0:
        body = f"""  const int r = get_global_id(0);
  if (r >= {frames}) return;
  {_pixel_base("ib", f"r * {rows}", xl)}
  {_pixel_base("ob", "r", ol)}
  float2 z[{m}];
  for (int s = 0; s < {loads}; ++s) {{ {load} }}
  for (int q = {2 * loads}; q < {m}; ++q) z[{rev}(q)] = (float2)(0.0f);
  for (int i = 0; i < {m * odd}; i += 2) {{
    {butterfly("i", "0", "1")}
  }}
  for (int h = {first}; h < {m}; h <<= 2) {{
    for (int i0 = 0; i0 < {m}; i0 += 4 * h) {{
      for (int j = 0; j < h; ++j) {{
        const int i = i0 + j;
        {quad("i", "j", "h")}
      }}
    }}
  }}
  for (int S = 0; S < {ol.s}; ++S) {{
{store("S")}
  }}"""
        gsize, local = (frames,), None
    else:
        body = f"""  const int l = get_local_id(0); const int r = get_global_id(1);
  {_pixel_base("ib", f"r * {rows}", xl)}
  {_pixel_base("ob", "r", ol)}
  __local float2 z[{m}];
  for (int s = l; s < {m // 2}; s += {g}) {{
    if (s < {loads}) {{ {load} }}
    else {{ z[{rev}(2 * s)] = (float2)(0.0f); z[{rev}(2 * s + 1)] = (float2)(0.0f); }}
  }}
  barrier(CLK_LOCAL_MEM_FENCE);
  if ({odd}) {{
    for (int q = l; q < {m // 2}; q += {g}) {{
      const int i = 2 * q;
      {butterfly("i", "0", "1")}
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
  }}
  for (int h = {first}; h < {m}; h <<= 2) {{
    for (int q = l; q < {m // 4}; q += {g}) {{
      const int j = q & (h - 1); const int i = ((q - j) << 2) + j;
      {quad("i", "j", "h")}
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
  }}
  for (int S = l; S < {ol.s}; S += {g}) {{
{store("S")}
  }}"""
        gsize, local = (g, frames), (g, 1)
    src = (_reverse(rev, max(1, m.bit_length() - 1))
           + f"__kernel void {ctx.name}(__global const STORE_T* src, __global const float2* tw, "
           f"__global STORE_T* dst) {{\n{body}\n}}")
    flops = int(frames * (5 * m * math.log2(m) + 12 * bins))
    return [KernelSpec(ctx.name, src, gsize, local,
                       [Arg("tensor", ctx.op.inputs[0]), Arg("const32", twiddles(n)), Arg("tensor", out.index)],
                       [ctx.op.inputs[0]], [out.index], knobs.params(),
                       space=SpectrumKnobs.space(SpectrumShape(n, ctx.target.gpu, ctx.target.max_group)),
                       flops=flops)]
