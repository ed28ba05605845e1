"""SEPARABLE_CONV (graph.passes.fuse_separable): a depthwise conv and the pointwise conv reading it, as one
kernel that computes each depthwise value where the pointwise conv reads it, so the intermediate tensor is
never stored and a launch goes.

Two fused variants, and the unfused pair:

- direct: a work-item takes ``tile_x`` adjacent output pixels of a row by ``tile_s`` output slices (``lanes``
  output channels per accumulator, as CONV_2D's direct kernel); per step it computes ``per`` depthwise slices of
  its pixels side by side in one float4 / float8 / float16 (as DEPTHWISE_CONV_2D's ``slices``) and adds each of
  their channels into its accumulators. A work-item recomputes the depthwise values its pixels need, so the
  work-items of one pixel compute them ``sout / tile_s`` times: cheap next to the pointwise sum
  (``kh*kw`` multiply-adds a value against ``4 * tile_s`` of the pointwise conv per work-item).
- group tile (a GPU's way): CONV_2D's local-memory GEMM (``ConvKnobs.group_tile``) whose input tile, staged
  ``k_chunk`` slices at a time, is the depthwise conv computed by the work-group's work-items.
- ``fused=False``: the two convs' own kernels, each with the parameters it would have as a step of its own (its
  tuning record, else its heuristics: kernels.base.unfused), as before the pass; what the tuner falls back to
  where fusing measures slower.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..graph.passes import BETWEEN, SEPARABLE_CONV
from .base import GenContext, Part, Target, Unsupported, composite, generator, unfused
from .common import Arg, KernelSpec, handed_over, vec_slices, weights_oi
from .conv import (
    MAX_GROUP,
    NEEDS_FP16_PLAN,
    GroupStage,
    GroupTiled,
    _bias_const,
    _float_const,
    _geometry,
    _group_tile_source,
    depthwise_weights,
    group_shares,
    group_tile_grid,
    tile_stores,
)
from .epilogue import first_values
from .knobs import Knobs, one_of, positive_int

SEPARABLE_SPACE = {
    "fused": [False, True],
    "tile_x": [1, 2, 4, 8],
    "tile_s": [1, 2, 4, 8],
    "lanes": [4, 8, 16],
    "per": [1, 2, 4],  # depthwise slices computed together (float4 / float8 / float16 math)
    "whole": [False, True],  # a work-item runs over every output slice of its pixels (direct variant)
    "group_tile": [None, (32, 8), (16, 4), (8, 8), (64, 4)],
    "k_chunk": [4, 8],
    "prefetch": [False, True],  # (ConvKnobs.prefetch: the group tile's next depthwise step computed ahead)
}
# the shares of its group tile's sum (ConvKnobs.k_split's, within the work-items its group tile checks for)
SEPARABLE_SHARES = group_shares(SEPARABLE_SPACE["group_tile"], MAX_GROUP)


@dataclass(frozen=True)
class SeparableShape:
    """What the separable conv's knobs depend on."""

    sin: int  # depthwise slices (the pointwise conv's input slices)
    sout: int  # pointwise output slices
    ow: int  # output row width
    float_lanes: int = Target.float_lanes
    gpu: bool = Target.gpu
    pixels: int = 0  # output pixels of an image (oh * ow)
    fp16: bool = False  # the kernel stores half (an FP16 plan, on a device with cl_khr_fp16)


# on a CPU device, the pointwise output slices up to which a block runs fused whatever its depthwise channels
# (SeparableKnobs.default)
FUSED_SLICES = 64


@dataclass(frozen=True)
class SeparableKnobs(GroupTiled, Knobs):
    fused: bool = True
    tile_x: int = 4  # adjacent output pixels of a row per work-item (direct variant)
    tile_s: int = 4  # output slices per work-item
    lanes: int = 4  # output channels per accumulator vector (tile_s a multiple of lanes / 4)
    per: int = 1  # depthwise slices per step, side by side in one vector (a divisor of the depthwise slices)
    # a work-item runs over every output slice of its pixels, its depthwise values computed once (a private array
    # of sin x tile_x float4): no work-item recomputes another's
    whole: bool = False
    # (LX, LS): the group-tile variant (kernels.conv.ConvKnobs.group_tile), staging k_chunk depthwise slices a step
    group_tile: tuple | None = None
    k_chunk: int = 8
    # the group tile's sum (the block's depthwise slices) shared by k_split work-items per output
    # (kernels.conv.ConvKnobs.k_split): a GPU's variant
    k_split: int = 1
    # FP16 arithmetic in the group tile's pointwise sum (kernels.conv.ConvKnobs.half_math): an FP16 plan on a GPU
    half_math: bool = False
    # the group tile computes each step's depthwise values one step ahead, into registers (ConvKnobs.prefetch): a
    # GPU's variant
    prefetch: bool = False

    @classmethod
    def default(cls, shape: SeparableShape) -> SeparableKnobs:
        """On a GPU the group tile of CONV_2D's pointwise default (8 slices a step) where the block has at most 384
        input channels, and the two convs' own kernels above. The fused kernel's time grows with the depthwise
        slices each step stages, whatever the pixels. On an NVIDIA H200 (bench/gpu_sweep.py, the 21 blocks of
        MobileNet v1 / v2, kernel time alone) fused ran 11-21 us against 18-20 unfused up to 144 channels, 21-24
        against 19 at 192, 30-35 against 22-28 at 256-384, and 44-85 against 31-50 from 512 on. The pair's second
        launch costs its own gap there: MobileNet v1's invoke took 0.74 ms over 0.53 ms of kernel time in 17
        launches, so a launch saved is worth up to about 10 us, which keeps 256-384 channels fused. The tile is
        8 x 8 where an image has at most 1,024 output pixels (the stride-2 blocks to 28 x 28 and below: 15.0 us
        against 20.1 at 144 channels, 19.4 against 24.3 at 192) and 32 px x 8 slices above (19.5 against 22.3 at
        112 -> 56).

        On a CPU device the direct variant with CONV_2D's tile for the device's vector width (16 lanes, 4 pixels
        x 8 slices, on a 16-wide device), four depthwise slices a step, ``whole`` where one tile does not cover a
        pixel's output slices; fused where one does, or where the depthwise output is at least twice the pointwise
        output (a projection, whose large intermediate the fusion never stores), or up to 256 output channels
        (``FUSED_SLICES``). (In an FP16 plan the fused kernel rounds the depthwise values to half as the pair's
        storage does: epilogue.first_values.)
        Per layer on the Intel CPU device (Zen 5, heuristics only, one process): MobileNet v2 (its 17 blocks all
        fused by this rule) ran 2.51 ms of kernel time vs 2.67 unfused, its first block 92 vs 143 us; a 512 -> 512
        block of MobileNet v1 ran 350 us fused vs 280, its work-items either recomputing each other's depthwise
        values or each streaming the whole pointwise filter (``whole``). The blocks of up to 256 channels gain:
        a fast search of seven MediaPipe models (Xeon, Sapphire Rapids) fused 44 of the 46 blocks of 16-128 output
        channels it searched, 1.5-2.8x faster than unfused at up to 32 x 32 pixels. Whole plans (tuning "none",
        same host, 6 rounds of 20 invokes in shuffled order; models whose plans did not change moved by 0.98-1.05x):
        BlazeFace 1.12 -> 0.95 ms, face landmark 1.33 -> 1.15, palm detection lite 5.23 -> 4.87, MobileNet v1
        8.59 -> 7.37 (its blocks to 256 channels fused; to 512 as well, 7.74)."""
        if shape.gpu:
            tile = (8, 8) if 0 < shape.pixels <= 1024 else (32, 8)
            return cls(fused=shape.sin <= 96, tile_x=1, tile_s=1, lanes=4, per=1, group_tile=tile, k_chunk=8)
        per = max(p for p in SEPARABLE_SPACE["per"] if shape.sin % p == 0 and p <= max(1, shape.float_lanes // 4))
        if shape.float_lanes >= 16 and shape.sout >= 4:
            tx, ts, lanes = (8, 4, 16) if shape.sout == 4 else (4, 8, 16)
        elif shape.sout >= 2:
            tx, ts, lanes = 2, (8 if shape.sout >= 8 else 2), 8
        else:
            tx, ts, lanes = 4, 1, 4
        fused = shape.sout <= ts or shape.sin >= 2 * shape.sout or shape.sout <= FUSED_SLICES
        return cls(fused=fused, tile_x=tx, tile_s=ts, lanes=lanes, per=per, whole=shape.sout > ts)

    @classmethod
    def space(cls, shape: SeparableShape) -> dict[str, list]:
        space = dict(SEPARABLE_SPACE)
        space["tile_x"] = [v for v in SEPARABLE_SPACE["tile_x"] if v == 1 or v < 2 * shape.ow]
        space["tile_s"] = [v for v in SEPARABLE_SPACE["tile_s"] if v == 1 or v < 2 * shape.sout]
        space["per"] = [v for v in SEPARABLE_SPACE["per"] if shape.sin % v == 0]
        if shape.fp16 and shape.gpu:  # (a GPU's variant: a CPU runtime emulates half)
            space["half_math"] = [False, True]
        if shape.gpu:  # (GPU's variants, as CONV_2D's)
            space["k_split"] = list(SEPARABLE_SHARES)
        else:
            del space["prefetch"]
        return space

    @classmethod
    def resolve(cls, shape: SeparableShape, params: dict | None = None) -> SeparableKnobs:
        """As ``Knobs.resolve``; ``fused=False`` launches the two convs' own kernels (with their own records), so
        its other knobs are the default's whatever ``params`` says: a record of the pair carried to a shape whose
        fused default differs (another group tile) still applies, and the search's points of the pair are one
        kernel."""
        knobs = super().resolve(shape, params)
        return knobs if knobs.fused else replace(cls.default(shape), fused=False)

    def problems(self, shape: SeparableShape) -> list[str]:
        bad = positive_int("tile_x", self.tile_x) + positive_int("tile_s", self.tile_s)
        bad += one_of("fused", self.fused, (False, True)) + one_of("whole", self.whole, (False, True))
        bad += one_of("lanes", self.lanes, SEPARABLE_SPACE["lanes"])
        bad += one_of("per", self.per, SEPARABLE_SPACE["per"]) + one_of("k_chunk", self.k_chunk,
                                                                        SEPARABLE_SPACE["k_chunk"])
        bad += one_of("half_math", self.half_math, (False, True)) + one_of("k_split", self.k_split,
                                                                           SEPARABLE_SHARES)
        if self.half_math is True and not shape.fp16:
            bad.append(NEEDS_FP16_PLAN)
        if bad:
            return bad
        if not self.fused:  # (resolve sets the other knobs to the default's)
            return bad
        bad += self.lane_problems()
        if shape.sin % self.per:
            bad.append(f"per={self.per} does not divide the {shape.sin} depthwise slices")
        if self.group_tile is not None:
            tile_bad = self.group_tile_problems()
            if tile_bad is None:
                return bad + [f"group_tile={self.group_tile!r} is not None or 2 positive ints"]
            if self.lanes != 4 or self.per != 1 or self.whole:
                bad.append("a group tile stages float4 slices: lanes 4, per 1, not whole")
            bad += tile_bad
        elif self.half_math or self.k_split != 1:
            bad.append("FP16 arithmetic and a split sum are the group tile's: not with the direct fused kernel")
        return bad + self.prefetch_problems()


@dataclass(frozen=True)
class _Geometry:
    n: int
    ih: int
    iw: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    oh: int
    ow: int
    pt: int
    pl: int


def _direct_source(name: str, g: _Geometry, *, sin: int, sout: int, cout: int, tx: int, ts: int, lanes: int,
                   per: int, act_dw: int, act_pw: int, epilogue, whole: bool, between=(),
                   dense_in: bool = False) -> str:
    """The direct fused kernel (see the module's docstring): work-item (X, Y, Z) takes pixels X*tx.. of output row Y
    and output slices Z*ts.. (``whole``: every output slice, ts at a time, its depthwise values computed once into
    a private array); its depthwise input is ``src`` ([B][sin][ih][iw][4]), filter ``dww`` / ``dwb``
    (``depthwise_weights`` with ``per``), the pointwise filter ``wts`` (``weights_oi`` with ``lanes``); ``between``:
    the unary ops applied to the depthwise values after its activation (graph.passes.BETWEEN); ``dense_in``: ``src``
    holds whole slices pixel by pixel ([B][ih][iw][sin][4], a dense NHWC buffer), each step's ``per`` slices of a
    pixel one vector load."""
    vt, vd = f"float{lanes}", f"float{4 * per}"
    nacc, out_per = ts // (lanes // 4), lanes // 4
    plane = g.ih * g.iw
    cols = (tx - 1) * g.sw + (g.kw - 1) * g.dw + 1
    hint = f"__attribute__((vec_type_hint({vt}))) "
    ep_code, ep_params = epilogue.code, epilogue.params
    extra = "".join(f"{p}, " for p in ep_params)
    L = [f"{hint}__kernel void {name}(__global const STORE_T* src, __global const STORE_T* dww,",
         "                     __global const STORE_T* dwb, __global const STORE_T* wts,",
         f"                     __global const STORE_T* bias, {extra}__global STORE_T* dst) {{",
         f"  const int X = get_global_id(0) * {tx}; const int Y = get_global_id(1);",
         f"  if (X >= {g.ow} || Y >= {g.n * g.oh}) return;",
         f"  const int b = Y / {g.oh}; const int oy = Y % {g.oh};",
         f"  const int ix0 = X * {g.sw} - {g.pl};"]
    parts = ", ".join("LD4(src, at)" if j == 0 else f"LD4(src, at + {j * plane})" for j in range(per))

    def depthwise(indent: str) -> list[str]:  # d0.. = the depthwise values of step P's slices at the tile's pixels
        D = [] if dense_in else [f"const int src0 = (b * {sin} + P * {per}) * {plane};"]
        D += [f"{vd} d{t} = LD{4 * per}(dwb, P);" for t in range(tx)]
        D += [f"for (int ky = 0; ky < {g.kh}; ++ky) {{",
              f"  const int iy = oy * {g.sh} - {g.pt} + ky * {g.dh};",
              f"  if (iy < 0 || iy >= {g.ih}) continue;",
              f"  const int row = {f'(b * {g.ih} + iy) * {g.iw}' if dense_in else f'src0 + iy * {g.iw}'};"]
        load = f"LD{4 * per}(src, at * {sin // per} + P)" if dense_in else f"({vd})({parts})"
        for c in range(cols):
            D += [f"  {vd} x{c} = ({vd})(0.0f);",
                  f"  if (ix0 + {c} >= 0 && ix0 + {c} < {g.iw}) {{ const int at = row + ix0 + {c}; x{c} = {load}; }}"]
        for k in range(g.kw):
            D.append(f"  {{ const {vd} w = LD{4 * per}(dww, (P * {g.kh} + ky) * {g.kw} + {k});")
            D += [f"    d{t} = mad(x{t * g.sw + k * g.dw}, w, d{t});" for t in range(tx)]
            D.append("  }")
        D.append("}")
        D += [c for t in range(tx) if (c := first_values(act_dw, between, f"d{t}", vd))]
        return [indent + line for line in D]

    def pointwise(indent: str) -> list[str]:  # the pointwise sum over step P's 4*per channels (lane c: slice c/4)
        D = []
        for c in range(4 * per):
            lane = f".s{'0123456789abcdef'[c]}"
            for a in range(nacc):
                grp = f"S + {a}" if out_per == 1 else f"S / {out_per} + {a}"
                D.append(f"{{ const {vt} w = LD{lanes}(wts, (({grp}) * {sin} + P * {per} + {c // 4}) * 4 + {c % 4});")
                D += [f"  acc{a}_{t} = mad(({vt})(d{t}{lane}), w, acc{a}_{t});" for t in range(tx)]
                D.append("}")
        return [indent + line for line in D]

    steps = sin // per
    if whole:
        L.append(f"  {vd} dv[{steps * tx}];")
        L.append(f"  for (int P = 0; P < {steps}; ++P) {{")
        L += depthwise("    ")
        L += [f"    dv[P * {tx} + {t}] = d{t};" for t in range(tx)]
        L.append("  }")
        L.append(f"  for (int S = 0; S < {sout}; S += {ts}) {{")
    else:
        L.append(f"  {{ const int S = get_global_id(2) * {ts};")
    L += [f"  {vt} acc{a}_{t} = ({vt})(0.0f);" for a in range(nacc) for t in range(tx)]
    L.append(f"  for (int P = 0; P < {steps}; ++P) {{")
    if whole:
        L += [f"    const {vd} d{t} = dv[P * {tx} + {t}];" for t in range(tx)]
    else:
        L += depthwise("    ")
    L += pointwise("    ")
    L.append("  }")
    L += tile_stores(tx=tx, ts=ts, per=out_per, px=lambda t: f"X + {t}", sout=sout, oh=g.oh, ow=g.ow, act=act_pw,
                     ep_code=ep_code, cout=cout)
    L += ["  }", "}"]
    return "\n".join(L)


def _depthwise_stage(g: _Geometry, sin: int, act_dw: int, between=()) -> GroupStage:
    """The group tile's staging code computing depthwise slice ``slice`` of output pixel ``pixel`` (float4), its
    activation and the unary ops ``between`` (graph.passes.BETWEEN) applied."""

    def load(slice_: str, pixel: str, var: str) -> str:
        return (f"const int sl_ = {slice_}; const int oy_ = ({pixel}) / {g.ow}; const int ox_ = ({pixel}) % {g.ow}; "
                f"const int base_ = (b * {sin} + sl_) * {g.ih * g.iw}; {var} = LD4(dwb, sl_); "
                f"for (int ky = 0; ky < {g.kh}; ++ky) {{ const int iy = oy_ * {g.sh} - {g.pt} + ky * {g.dh}; "
                f"if (iy < 0 || iy >= {g.ih}) continue; "
                f"for (int kx = 0; kx < {g.kw}; ++kx) {{ const int ix = ox_ * {g.sw} - {g.pl} + kx * {g.dw}; "
                f"if (ix >= 0 && ix < {g.iw}) {var} = mad(LD4(src, base_ + iy * {g.iw} + ix), "
                f"LD4(dww, (sl_ * {g.kh} + ky) * {g.kw} + kx), {var}); }} }} " + first_values(act_dw, between, var))

    return GroupStage("__global const STORE_T* dww, __global const STORE_T* dwb, ", load)


@composite(SEPARABLE_CONV)
def _parts(op, epilogue: list) -> list[Part]:
    return [Part(op.options["depthwise"], list(op.options.get(BETWEEN, ())), "dw"),
            Part(op.options["pointwise"], epilogue, "pw")]


def _unfused(ctx: GenContext, params: dict, space: dict) -> list[KernelSpec]:
    """The two convs' own kernels; on a CPU device, in an FP32 plan, the depthwise output they pass on as a dense
    NHWC buffer where both kernels take it so (the depthwise conv writing whole slices pixel by pixel, the pointwise
    conv reading it as it reads a graph input): there each work-item of the pointwise conv reads its pixels'
    channels as a few runs of memory, not one short piece of every slice plane of the image. On the Intel CPU
    runtime (2 Xeon cores, kernels profiled in a chain of five 14x14 512 -> 512 pointwise convs, the first reading
    the graph input densely) the pointwise kernels reading slices ran 397-415 us, the one reading densely 332-337,
    its input rewritten by the device just before it or not. Each kernel keeps the identity (tuning key) and the
    parameters it has as a step of its own (runtime.selection.dense_boundary keeps such a tensor out of the plan's
    dense set): a search of the part times that form, which differs from this one in how the tensor is indexed."""
    mid = ctx.opt("pointwise").inputs[0]
    if ctx.target.gpu or ctx.fp16 or mid in ctx.half_outputs:
        return unfused(ctx, params, space)
    specs = unfused(replace(ctx, dense=ctx.dense | {mid}), params, space)
    written = any(mid in s.dense for s in specs if mid in s.outputs)
    read = all(mid in s.dense for s in specs if mid in s.inputs)
    return specs if written and read else unfused(ctx, params, space)


@generator(SEPARABLE_CONV)
def separable_conv(ctx: GenContext) -> list[KernelSpec]:
    dw_op = ctx.opt("depthwise")
    x_t = ctx.input_tensor(0)
    n, ih, iw, cin = ctx.layout(x_t).dims
    wd, wp = _float_const(ctx, 1), _float_const(ctx, 3)
    _, kh, kw, cdw = wd.shape
    cout = wp.shape[0]
    if cdw != cin or wp.shape[1:] != (1, 1, cin):
        raise Unsupported("not a depthwise conv of channel multiplier 1 read by a pointwise conv")
    dw_ctx = replace(ctx, op=dw_op, epilogue=[], params={})
    sh, sw, dh, dw, oh, ow, pt, pl = _geometry(dw_ctx, ih, iw, kh, kw)
    g = _Geometry(n, ih, iw, kh, kw, sh, sw, dh, dw, oh, ow, pt, pl)
    sin, sout = (cin + 3) // 4, (cout + 3) // 4
    # (the input as a dense NHWC buffer of whole slices where the plan hands it over so from another step:
    # runtime.selection.hand_over; the direct fused kernel reads it so, and so does the unfused form's depthwise
    # conv; a graph input keeps its conversion)
    x = ctx.op.inputs[0]
    dense_in = handed_over(ctx, x, cin) and not ctx.target.gpu
    shape = SeparableShape(sin, sout, ow, ctx.target.float_lanes, ctx.target.gpu, pixels=oh * ow, fp16=ctx.fp16)
    knobs = SeparableKnobs.resolve(shape, ctx.params)
    space, params = SeparableKnobs.space(shape), knobs.params()
    if not knobs.fused:  # the two convs' own kernels
        return _unfused(ctx, params, space)
    act_dw, between = dw_op.options.get("fused_activation_function", 0), ctx.opt(BETWEEN, ())
    act_pw = ctx.opt("fused_activation_function", 0)
    ep = ctx.epilogue_code(cout)
    dwb, pwb = _bias_const(ctx, 2, cin), _bias_const(ctx, 4, cout)
    flops = 2 * n * oh * ow * (cin * kh * kw + cout * cin)
    inputs = [ctx.op.inputs[0], *ep.inputs]
    if knobs.group_tile is not None:
        lx, ls = knobs.group_tile
        tx, ts = knobs.tile_x, knobs.tile_s
        src = _group_tile_source(ctx.name, pixels=oh * ow, sin=sin, sout=sout, batch=n, tx=tx, ts=ts, lx=lx, ls=ls,
                                 kc=knobs.k_chunk, act=act_pw, cout=cout, epilogue=ep,
                                 stage=_depthwise_stage(g, sin, act_dw, between), half_math=knobs.half_math, ks=knobs.k_split,
                                 prefetch=knobs.prefetch)
        gsize, local, pad = group_tile_grid(pixels=oh * ow, batch=n, sout=sout, lx=lx, ls=ls, tx=tx, ts=ts,
                                            ks=knobs.k_split)
        dw_per = 1
    else:
        tx, ts, dw_per = knobs.tile_x, knobs.tile_s, knobs.per
        src = _direct_source(ctx.name, g, sin=sin, sout=sout, cout=cout, tx=tx, ts=ts, lanes=knobs.lanes, per=dw_per,
                             act_dw=act_dw, act_pw=act_pw, epilogue=ep, whole=knobs.whole, between=between,
                             dense_in=dense_in)
        gsize, local, pad = (-(-ow // tx), n * oh, 1 if knobs.whole else -(-sout // ts)), None, ts
    args = [Arg("tensor", ctx.op.inputs[0]), Arg("const", depthwise_weights(wd, dw_per)),
            Arg("const", vec_slices(dwb, cin, dw_per)), Arg("const", weights_oi(wp, knobs.lanes, pad)),
            Arg("const", vec_slices(pwb, cout, pad)), *ep.args, Arg("tensor", ctx.final_output)]
    return [KernelSpec(ctx.name, src, gsize, local, args, inputs, [ctx.final_output], params, space=space,
                       flops=flops, dense=frozenset([ctx.op.inputs[0]] if dense_in else []))]

