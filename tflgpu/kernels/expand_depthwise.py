"""EXPAND_DEPTHWISE (graph.passes.fuse_expand_depthwise): a pointwise conv of a narrow input (a MobileNet v2 block's
expansion: ``MAX_INPUTS``) and the depthwise conv reading it, as one kernel: the pointwise conv's output lives in a
work-group's local memory only, and a launch goes.

Where the separable pass's fused form does not pay on a GPU (depthwise convs of more than 384 channels:
``SeparableKnobs.default``), a MobileNet v2 block takes three launches: expansion, depthwise, projection (a v1
block two, depthwise and projection, for one op's work each). The projection sums
over every expanded channel, so it needs the whole depthwise output first; the depthwise conv needs only a window
of each expanded channel. So the cut that costs nothing in parallelism is between the depthwise conv and the
projection, and this kernel takes the other two:

1. a work-group takes ``rows`` output rows (every column) of one image and ``slices`` expanded slices; it computes
   the expansion (bias and activation included) of the input rows those output rows' windows read, every column,
   into local memory (zeros where the window leaves the image: the depthwise conv's zero padding);
2. then each depthwise output of its rows and slices from local memory, stored.

Neighbouring row tiles recompute the rows their windows share (none where a tile is the whole image: MobileNet v2's
14x14 and 7x7 blocks, the ones with 576 and 960 expanded channels); no value is recomputed between slices. Its
work-groups are ``images x row tiles x expanded slices / slices``: a 7x7 block of 960 channels at 2 slices a group
has 120, at least as many as the expansion's own kernel.

``fused=False`` launches the two convs' own kernels, each as its own step would have them (its record, else its
heuristics: kernels.base.unfused), as without the pass. A GPU's plan starts every block that way, the code it ran
before the pass, and its tuner (which times a candidate's host enqueues too, autotune.measure) fuses a block where
that measures faster; the search tries the fused kernel first. On the H100 (2026-11-27) the search fused MobileNet
v2's blocks (0.631 -> 0.454 ms with the other changes since its last row) and, before ``MAX_INPUTS``, MobileNet v1's
too, at a cost the tuner's per-step measure did not see (see there).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..graph.passes import BETWEEN, EXPAND_DEPTHWISE
from .base import GenContext, Part, Target, Unsupported, composite, generator, unfused
from .common import Arg, KernelSpec, activation, pad_lanes_mask, vec_slices, weights_oi
from .conv import MAX_GROUP, _bias_const, _float_const, _geometry, _store, depthwise_weights
from .epilogue import first_values
from .knobs import Knobs, one_of, positive_int
from .separable import SeparableKnobs, SeparableShape, _Geometry

# local memory the expanded rows may take (within the 32 KB OpenCL 1.2 guarantees a work-group)
EXPANDED_LOCAL_BYTES = 30 * 1024
EXPAND_DW_SPACE = {
    "fused": [False, True],
    # output rows a group (at most the image's; ExpandDepthwiseKnobs.space adds the even tilings in 8 and 16 rows)
    "rows": [1, 2, 4, 8, 16],
    "slices": [1, 2, 4, 8],  # expanded slices a group
    "group": [64, 128, 256],  # work-items a group
}
# a default's work-groups at least, where its slices allow (an H100 has 132 multiprocessors)
MIN_GROUPS = 128


# the most input channels an expansion the pass merges may have: each work-item of the fused kernel sums them
# serially for one expanded slice (no register tile, no split sum: the expansion's own GEMM kernel has both). On the
# H100 that paid at MobileNet v2's 96 and 160 inputs (14-17 us a block against 26-34 us for the two kernels, by the
# tuner's cost) and not at MobileNet v1's 256-1,024: there, in the plan, 41-87 us a kernel against about 20 us for
# the pair, MobileNet v1 0.599 ms with its 7 blocks merged against 0.330 ms without (bench_gpu.py, 2026-11-27)
MAX_INPUTS = 192


def wanted(target: Target, channels: int, inputs: int) -> bool:
    """Whether the pass merges a block expanding ``inputs`` channels to ``channels`` on ``target``: on a GPU, where
    the separable pass's default for the depthwise conv and its projection is their own two kernels
    (SeparableKnobs.default), so the block would take three launches, and where the expansion is narrow enough for
    the fused kernel's serial sums (``MAX_INPUTS``: MobileNet v2's expansions, not MobileNet v1's projections); not on
    a CPU device, whose separable blocks are fused."""
    if not target.gpu or inputs > MAX_INPUTS:
        return False
    sin = -(-channels // 4)
    return not SeparableKnobs.default(SeparableShape(sin, 1, 1, target.float_lanes, True, pixels=1)).fused


def even_rows(rows: int, most: int) -> int:
    """The rows of each tile where ``rows`` are cut into the fewest tiles of at most ``most`` rows, evenly."""
    return -(-rows // -(-rows // most))


@dataclass(frozen=True)
class ExpandDepthwiseShape:
    """What the fused pair's knobs depend on: the expanded slices, the depthwise conv's output rows and the input
    rows its window spans (stride, kernel height, dilation), the input's width, and the images."""

    sexp: int
    oh: int
    iw: int
    sh: int = 1
    kh: int = 3
    dh: int = 1
    batch: int = 1
    ow: int = 0  # output columns (0: as many as the input's)


@dataclass(frozen=True)
class ExpandDepthwiseKnobs(Knobs):
    fused: bool = False
    rows: int = 8
    slices: int = 2
    group: int = 128

    def tile_rows(self, shape: ExpandDepthwiseShape) -> int:
        """Output rows a group computes (``rows``, at most the image's)."""
        return min(self.rows, shape.oh)

    def input_rows(self, shape: ExpandDepthwiseShape) -> int:
        """Input rows a group expands: those its output rows' windows read."""
        return (self.tile_rows(shape) - 1) * shape.sh + (shape.kh - 1) * shape.dh + 1

    def local_bytes(self, shape: ExpandDepthwiseShape) -> int:
        return 16 * self.input_rows(shape) * shape.iw * self.slices

    def groups(self, shape: ExpandDepthwiseShape) -> int:
        return shape.batch * -(-shape.oh // self.tile_rows(shape)) * -(-shape.sexp // self.slices)

    @classmethod
    def default(cls, shape: ExpandDepthwiseShape) -> ExpandDepthwiseKnobs:
        """Unfused (the start a GPU's plan had before the pass; its tuner tries the fused kernel first), its fused
        point: a whole image a group where it has at most 16 rows (no rows expanded twice), else the image in even
        tiles of at most 16 rows (17 rows: 9 and 8, whose windows expand 22 input rows where tiles of 8 expand 30;
        fewer where local memory needs it); the most
        slices a group (of 4, 2, 1) that keeps MIN_GROUPS groups and fits local memory; 128 work-items, 64 where
        a group has fewer outputs than that."""
        point = cls(False, even_rows(shape.oh, 16), 1, 128)
        for s in (4, 2):
            wider = replace(point, slices=s)
            if wider.groups(shape) >= MIN_GROUPS and wider.local_bytes(shape) <= EXPANDED_LOCAL_BYTES:
                point = wider
                break
        while point.local_bytes(shape) > EXPANDED_LOCAL_BYTES and point.rows > 1:
            point = replace(point, rows=point.rows // 2)
        outputs = point.tile_rows(shape) * (shape.ow or shape.iw) * point.slices
        return replace(point, group=64 if outputs < 128 else 128)

    @classmethod
    def space(cls, shape: ExpandDepthwiseShape) -> dict[str, list]:
        space = dict(EXPAND_DW_SPACE)
        # (rows past the image's are the whole image: one value of them)
        space["rows"] = sorted({min(r, shape.oh) for r in EXPAND_DW_SPACE["rows"]}
                               | {even_rows(shape.oh, 16), even_rows(shape.oh, 8)})
        space["slices"] = [s for s in EXPAND_DW_SPACE["slices"] if s == 1 or s // 2 < shape.sexp]
        return space

    @classmethod
    def resolve(cls, shape: ExpandDepthwiseShape, params: dict | None = None) -> ExpandDepthwiseKnobs:
        """As ``Knobs.resolve``; ``fused=False`` launches the two convs' own kernels (with their own records), so
        its other knobs are the default's whatever ``params`` says."""
        knobs = super().resolve(shape, params)
        return knobs if knobs.fused else cls.default(shape)

    def problems(self, shape: ExpandDepthwiseShape) -> list[str]:
        bad = one_of("fused", self.fused, (False, True)) + positive_int("rows", self.rows)
        bad += positive_int("slices", self.slices) + one_of("group", self.group, EXPAND_DW_SPACE["group"])
        if bad or not self.fused:
            return bad
        if self.group > MAX_GROUP:
            bad.append(f"a group of {self.group} work-items is over {MAX_GROUP}")
        if self.local_bytes(shape) > EXPANDED_LOCAL_BYTES:
            bad.append(f"{self.input_rows(shape)} expanded rows of {shape.iw} pixels x {self.slices} slices take "
                       f"{self.local_bytes(shape)} bytes of local memory, over {EXPANDED_LOCAL_BYTES}")
        return bad


def _fused_source(name: str, g: _Geometry, knobs: ExpandDepthwiseKnobs, shape: ExpandDepthwiseShape, *, sx: int,
                  cexp: int, act_ex: int, act_dw: int, epilogue, between=()) -> str:
    """The fused kernel (see the module's docstring): ``g`` the depthwise conv's geometry, its input the expansion
    of ``src`` ([n][sx][ih][iw] slices) to ``cexp`` channels. Arguments: ``src``, the expansion's filter
    ``wex`` (``weights_oi``) and bias ``bex``, the depthwise filter ``dww`` (``depthwise_weights``) and bias
    ``dwb``, the epilogue's parameters and ``dst``, the depthwise output (after the fused ops: ``epilogue``);
    ``between``: the unary ops applied to the expanded values after the expansion's activation
    (graph.passes.BETWEEN)."""
    th, rh, cs, nt = knobs.tile_rows(shape), knobs.input_rows(shape), knobs.slices, knobs.group
    tiles, cgroups = -(-g.oh // th), -(-shape.sexp // cs)
    region, outs, iplane, oplane = rh * g.iw, th * g.ow, g.ih * g.iw, g.oh * g.ow
    L = [f"__attribute__((reqd_work_group_size({nt}, 1, 1)))",
         f"__kernel void {name}(__global const STORE_T* src, __global const STORE_T* wex,",
         "    __global const STORE_T* bex, __global const STORE_T* dww, __global const STORE_T* dwb,",
         f"    {''.join(f'{p}, ' for p in epilogue.params)}__global STORE_T* dst) {{",
         f"  __local float4 es[{region * cs}];",
         "  const int lid = get_local_id(0); const int G = get_group_id(0);",
         f"  const int c0 = (G % {cgroups}) * {cs}; const int r0 = ((G / {cgroups}) % {tiles}) * {th};",
         f"  const int b = G / {cgroups * tiles};",
         f"  const int iy0 = r0 * {g.sh} - {g.pt};",
         # 1. the expansion of the input rows the tile's windows read, every column, `cs` slices
         f"  for (int e = lid; e < {region * cs}; e += {nt}) {{",
         f"    const int c = e / {region}; const int at = e % {region};",
         f"    const int iy = iy0 + at / {g.iw}; const int s = c0 + c;",
         "    float4 v = (float4)(0.0f);",
         f"    if (s < {shape.sexp} && iy >= 0 && iy < {g.ih}) {{",
         "      v = LD4(bex, s);",
         f"      const int x0 = b * {sx * iplane} + iy * {g.iw} + at % {g.iw}; const int w0 = s * {sx * 4};",
         f"      for (int k = 0; k < {sx}; ++k) {{",
         f"        const float4 x = LD4(src, x0 + k * {iplane}); const int w = w0 + k * 4;",
         ("        v = mad((float4)(x.x), LD4(wex, w), mad((float4)(x.y), LD4(wex, w + 1), "
          "mad((float4)(x.z), LD4(wex, w + 2), mad((float4)(x.w), LD4(wex, w + 3), v))));"),
         "      }",
         "      " + first_values(act_ex, between, "v"),
         "    }",
         "    es[e] = v;",
         "  }",
         "  barrier(CLK_LOCAL_MEM_FENCE);",
         # 2. the depthwise conv of the tile's rows from local memory
         f"  for (int e = lid; e < {outs * cs}; e += {nt}) {{",
         f"    const int c = e / {outs}; const int at = e % {outs};",
         f"    const int oyl = at / {g.ow}; const int ox = at % {g.ow};",
         "    const int oy = r0 + oyl; const int s = c0 + c;",
         f"    if (oy >= {g.oh} || s >= {shape.sexp}) continue;",
         "    float4 v = LD4(dwb, s);",
         f"    for (int ky = 0; ky < {g.kh}; ++ky) {{",
         f"      const int row = (c * {rh} + oyl * {g.sh} + ky * {g.dh}) * {g.iw};",
         f"      for (int kx = 0; kx < {g.kw}; ++kx) {{",
         f"        const int ix = ox * {g.sw} - {g.pl} + kx * {g.dw};",
         f"        if (ix >= 0 && ix < {g.iw}) v = mad(es[row + ix], LD4(dww, (s * {g.kh} + ky) * {g.kw} + kx), v);",
         "      }",
         "    }",
         "    " + activation(act_dw, "v"),
         "    " + _store(f"(b * {shape.sexp} + s) * {oplane} + oy * {g.ow} + ox", "s", epilogue.code,
                        pad_lanes_mask(cexp, "s", "v")),
         "  }",
         "}"]
    return "\n".join(L)


@composite(EXPAND_DEPTHWISE)
def _parts(op, epilogue: list) -> list[Part]:
    return [Part(op.options["expand"], list(op.options.get(BETWEEN, ())), "ex"),
            Part(op.options["depthwise"], epilogue, "dw")]


@generator(EXPAND_DEPTHWISE)
def expand_depthwise(ctx: GenContext) -> list[KernelSpec]:
    ex_op, dw_op = ctx.opt("expand"), ctx.opt("depthwise")
    n, ih, iw, cin = ctx.layout(ctx.input_tensor(0)).dims
    we, wd = _float_const(ctx, 1), _float_const(ctx, 3)
    cexp, (_, kh, kw, cdw) = we.shape[0], wd.shape
    if we.shape[1:] != (1, 1, cin) or cdw != cexp:
        raise Unsupported("not a pointwise conv read by a depthwise conv of channel multiplier 1")
    sh, sw, dh, dw, oh, ow, pt, pl = _geometry(replace(ctx, op=dw_op, epilogue=[], params={}), ih, iw, kh, kw)
    g = _Geometry(n, ih, iw, kh, kw, sh, sw, dh, dw, oh, ow, pt, pl)
    shape = ExpandDepthwiseShape((cexp + 3) // 4, oh, iw, sh, kh, dh, n, ow)
    knobs = ExpandDepthwiseKnobs.resolve(shape, ctx.params)
    space, params = ExpandDepthwiseKnobs.space(shape), knobs.params()
    if not knobs.fused:  # the two convs' own kernels
        return unfused(ctx, params, space)
    ep = ctx.epilogue_code(cexp)
    src = _fused_source(ctx.name, g, knobs, shape, sx=(cin + 3) // 4, cexp=cexp,
                        act_ex=ex_op.options.get("fused_activation_function", 0),
                        act_dw=dw_op.options.get("fused_activation_function", 0), epilogue=ep,
                        between=ctx.opt(BETWEEN, ()))
    args = [Arg("tensor", ctx.op.inputs[0]), Arg("const", weights_oi(we)),
            Arg("const", vec_slices(_bias_const(ctx, 2, cexp), cexp)), Arg("const", depthwise_weights(wd, 1)),
            Arg("const", vec_slices(_bias_const(ctx, 4, cexp), cexp)), *ep.args, Arg("tensor", ctx.final_output)]
    flops = 2 * n * (knobs.groups(shape) // n * knobs.input_rows(shape) * iw * knobs.slices * 4 * cin
                     + oh * ow * cexp * kh * kw)
    return [KernelSpec(ctx.name, src, (knobs.groups(shape) * knobs.group,), (knobs.group,), args,
                       [ctx.op.inputs[0], *ep.inputs], [ctx.final_output], params, space=space, flops=flops)]
