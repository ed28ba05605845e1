"""SEPARABLE_EXPAND (graph.passes.fuse_expansions): a separable conv (a depthwise conv and the pointwise conv
reading it, kernels.separable) and the pointwise conv expanding its output (the next MobileNet v2 block's first
conv), as one kernel: two launches of a block become one.

The fused kernel is the separable conv's group tile (kernels.conv's local-memory GEMM whose input tile is the
depthwise conv, computed by the work-group's work-items) with a work-group covering every output slice of its
pixels, so that a second GEMM can follow in the same work-group:

1. a work-group of ``lx`` x ``ls`` work-items takes ``lx`` pixels of an image, and each work-item ``ts =
   ceil(sout / ls)`` output slices of one of them: the separable conv's sum, staged ``k_chunk`` depthwise slices
   at a time as in kernels.separable;
2. each value (bias, activation and the fused epilogue: a residual ADD) goes into local memory (``ys``: every
   output slice of the group's pixels) and is stored only where another op reads it (``keep``: the next block's
   residual ADD, a graph output);
3. the expanding conv's sum over those slices, from local memory: ``ts2`` output slices per work-item a round,
   ``ls * ts2`` per group. ``split`` work-groups share a pixel tile's expanded slices (each recomputing steps 1-2,
   the first one storing them): more groups where an image has few pixels.

There is no halo and nothing recomputed between pixels (the expansion is pointwise); the price is parallelism:
one group computes every output slice of its pixels. ``fused=False`` launches the separable conv's and the
pointwise conv's own kernels, each as its own step would have them (its record, else its heuristics), as
without the pass.

A GPU's launches cost host time (NVIDIA's OpenCL: 10-16 us each on the H100's host, bench/invoke_anatomy.py), so
fewer of them is what a host-bound plan needs; whether the fused kernel's time costs less than a launch saves
has not been measured on a GPU yet. So a GPU's default plan has the pass with every block starting unfused (the
two convs' own kernels, their records: what the plan ran without the pass), and the tuner, which costs a
candidate its host enqueues too (autotune.measure), fuses a block where that measures faster;
``GpuDelegate(fuse_expansions=True)`` starts each block fused (on any device), ``False`` leaves the pass out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..graph.passes import BETWEEN, SEPARABLE_EXPAND
from .base import GenContext, Part, Target, Unsupported, composite, generator, unfused
from .common import Arg, KernelSpec, activation, pad_lanes_mask, vec_slices, weights_oi
from .conv import (
    MAX_GROUP,
    _bias_const,
    _float_const,
    _geometry,
    _group_stage_lines,
    _store,
    depthwise_weights,
)
from .knobs import Knobs, one_of, positive_int
from .separable import _depthwise_stage, _Geometry

# local memory a fused kernel may stage (its input and weight tiles and the block's output slices): within the
# 32 KB OpenCL 1.2 guarantees a work-group
CHAIN_LOCAL_BYTES = 30 * 1024

EXPAND_SPACE = {
    "fused": [False, True],
    "group_tile": [(32, 8), (16, 8), (8, 8), (4, 8), (8, 16), (4, 16)],
    "k_chunk": [4, 8],
    "ts2": [1, 2, 4],
    "split": [1, 2, 4],
}
# a default's work-groups per image at least (else more groups share the expansion: ``split``)
MIN_GROUPS = 32


@dataclass(frozen=True)
class ExpandShape:
    """What the fused block's knobs depend on."""

    sin: int  # depthwise slices
    sout: int  # the separable conv's output slices (the expansion's input slices)
    sexp: int  # the expansion's output slices
    pixels: int  # output pixels of an image
    batch: int = 1
    gpu: bool = Target.gpu
    # the plan asked for the fused kernel (GpuDelegate(fuse_expansions=True)); False: a GPU's default, which starts
    # from the two convs' own kernels and leaves fusing a block to the tuner
    fused_start: bool = True


@dataclass(frozen=True)
class ExpandKnobs(Knobs):
    fused: bool = True
    group_tile: tuple = (8, 8)  # (lx pixels, ls work-items along the output slices)
    k_chunk: int = 8  # depthwise slices staged a step
    ts2: int = 2  # expanded slices per work-item a round
    split: int = 1  # work-groups sharing one pixel tile's expanded slices

    def slices_per_item(self, shape: ExpandShape) -> int:
        return -(-shape.sout // self.group_tile[1])

    def block_slices(self, shape: ExpandShape) -> int:
        """The output slices a group covers (ls work-items of ``slices_per_item``): the padded width of the
        separable conv's weights and of ``ys``."""
        return self.group_tile[1] * self.slices_per_item(shape)

    def local_bytes(self, shape: ExpandShape) -> int:
        """Local memory: k_chunk depthwise slices of the tile's pixels, their weights for every output slice, and
        every output slice of the pixels (float4 each)."""
        lx, so = self.group_tile[0], self.block_slices(shape)
        return 16 * (self.k_chunk * lx + so * self.k_chunk * 4 + so * lx)

    @classmethod
    def default(cls, shape: ExpandShape) -> ExpandKnobs:
        """Not measured on a GPU yet (see the module's docstring). The pixel tile follows the separable conv's
        GPU default (32 pixels where an image has more than 1,024, 8 to 256, 4 below), 8 work-items along the
        output slices, 8 depthwise slices a step (4 where local memory needs it), and as many groups sharing the
        expansion as give an image at least 32 groups (up to 4). Unfused where no tile fits local memory, and on
        a CPU device, whose runtime runs a group tile's barriers slowly (MobileNet v2 with every block fused: 47
        ms against 5.3 with the CPU's own kernels, Intel CPU runtime, 2 Zen 5 cores), and where the plan did not
        ask for it (``fused_start``: a GPU's default plan, whose tuner fuses a block where it measures faster)."""
        lx = 32 if shape.pixels > 1024 else 8 if shape.pixels > 256 else 4
        tiles = -(-shape.pixels // lx) * shape.batch
        split = next((s for s in EXPAND_SPACE["split"] if tiles * s >= MIN_GROUPS), EXPAND_SPACE["split"][-1])
        split = min(split, max(1, -(-shape.sexp // 8)))
        for kc in (8, 4):
            knobs = cls(True, (lx, 8), kc, 2, split)
            if knobs.local_bytes(shape) <= CHAIN_LOCAL_BYTES:
                return replace(knobs, fused=shape.gpu and shape.fused_start)
        return cls(False, (lx, 8), 4, 2, split)

    @classmethod
    def space(cls, shape: ExpandShape) -> dict[str, list]:
        return dict(EXPAND_SPACE)

    @classmethod
    def resolve(cls, shape: ExpandShape, params: dict | None = None) -> ExpandKnobs:
        """As ``Knobs.resolve``; ``fused=False`` launches the two convs' own kernels (with their own records), so
        its other knobs are the default's whatever ``params`` says."""
        knobs = super().resolve(shape, params)
        return knobs if knobs.fused else replace(cls.default(shape), fused=False)

    def problems(self, shape: ExpandShape) -> list[str]:
        bad = one_of("fused", self.fused, (False, True)) + one_of("k_chunk", self.k_chunk, EXPAND_SPACE["k_chunk"])
        bad += one_of("ts2", self.ts2, EXPAND_SPACE["ts2"]) + positive_int("split", self.split)
        tile = self.group_tile
        if not (isinstance(tile, tuple) and len(tile) == 2 and not any(positive_int("", v) for v in tile)):
            return bad + [f"group_tile={tile!r} is not 2 positive ints"]
        if bad or not self.fused:
            return bad
        if tile[0] * tile[1] > MAX_GROUP:
            bad.append(f"a group of {tile[0] * tile[1]} work-items is over {MAX_GROUP}")
        if self.local_bytes(shape) > CHAIN_LOCAL_BYTES:
            bad.append(f"the fused block stages {self.local_bytes(shape)} bytes of local memory, over "
                       f"{CHAIN_LOCAL_BYTES}")
        if self.split > shape.sexp:
            bad.append(f"split={self.split} is over the {shape.sexp} expanded slices")
        return bad


def _fused_source(name: str, g: _Geometry, shape: ExpandShape, *, cout: int, cexp: int, knobs: ExpandKnobs,
                  act_dw: int, act_pw: int, act_ex: int, epilogue, keep: bool, between=()) -> str:
    """The fused kernel (see the module's docstring). Arguments: ``src`` (the depthwise conv's input), the
    depthwise filter and bias, the separable conv's pointwise filter ``wts`` (``weights_oi`` padded to
    ``ls * ts`` output slices) and bias, the epilogue's parameters, ``dst`` (its output, where ``keep``), the
    expansion's filter ``wts2`` and bias ``bias2``, and ``dst2`` (the expanded output); ``between``: the separable
    conv's unary ops after its depthwise values (graph.passes.BETWEEN)."""
    lx, ls = knobs.group_tile
    kc, ts2, split = knobs.k_chunk, knobs.ts2, knobs.split
    sin, sout, sexp = shape.sin, shape.sout, shape.sexp
    ts, so = knobs.slices_per_item(shape), knobs.block_slices(shape)
    nt, pixels = lx * ls, g.oh * g.ow
    chunk = -(-sexp // split)
    stage = _depthwise_stage(g, sin, act_dw, between)
    ep_code, ep_params = (epilogue.code, epilogue.params) if epilogue else ("", [])
    extra = "".join(f"{p}, " for p in ep_params)
    dst = "__global STORE_T* dst, " if keep else ""
    L = [f"__attribute__((reqd_work_group_size({lx}, 1, {ls})))",
         f"__kernel void {name}(__global const STORE_T* src, {stage.params}__global const STORE_T* wts,",
         f"    __global const STORE_T* bias, {extra}{dst}__global const STORE_T* wts2,",
         "    __global const STORE_T* bias2, __global STORE_T* dst2) {",
         f"  __local float4 xs[{kc * lx}];",
         f"  __local float4 ws[{so * kc * 4}];",
         f"  __local float4 ys[{so * lx}];",
         "  const int lx = get_local_id(0); const int ls = get_local_id(2);",
         f"  const int lid = ls * {lx} + lx;",
         f"  const int p0 = get_group_id(0) * {lx}; const int G = get_group_id(2);",
         "  const int b = get_global_id(1); const int p = p0 + lx;"]
    L += [f"  float4 acc{a} = (float4)(0.0f);" for a in range(ts)]
    # 1. the separable conv: the group tile's GEMM over the depthwise slices, every output slice of the pixels
    L += [f"  for (int k0 = 0; k0 < {sin}; k0 += {kc}) {{",
          f"    for (int e = lid; e < {kc * lx}; e += {nt}) {{",
          f"      const int kc = e / {lx}; const int p = p0 + e % {lx};",
          *_group_stage_lines(sin, pixels, stage),
          "    }",
          f"    for (int e = lid; e < {so * kc * 4}; e += {nt}) {{",
          f"      const int o = e / {kc * 4}; const int kc = (e / 4) % {kc};",
          f"      ws[e] = k0 + kc < {sin} ? LD4(wts, (o * {sin} + k0 + kc) * 4 + e % 4) : (float4)(0.0f);",
          "    }",
          "    barrier(CLK_LOCAL_MEM_FENCE);",
          f"    for (int kc = 0; kc < {kc}; ++kc) {{",
          f"      const float4 x = xs[kc * {lx} + lx];"]
    for a in range(ts):
        L += [f"      {{ const int wb = ((ls * {ts} + {a}) * {kc} + kc) * 4;",
              (f"        acc{a} = mad((float4)(x.x), ws[wb], mad((float4)(x.y), ws[wb + 1], "
               f"mad((float4)(x.z), ws[wb + 2], mad((float4)(x.w), ws[wb + 3], acc{a})))); }}")]
    L += ["    }", "    barrier(CLK_LOCAL_MEM_FENCE);", "  }"]
    # 2. its values: stored where read elsewhere (by the first group of a split), and kept for the expansion
    st = "if (G == 0) ST4(dst, oi, v);" if keep else ""
    for a in range(ts):
        s = f"(ls * {ts} + {a})"
        L += ["  {",
              "    float4 v = (float4)(0.0f);",
              f"    if ({s} < {sout} && p < {pixels}) {{",
              f"      v = acc{a} + LD4(bias, {s});",
              "      " + activation(act_pw, "v"),
              "      " + _store(f"(b * {sout} + {s}) * {pixels} + p", s, ep_code, pad_lanes_mask(cout, s, "v"), st),
              "    }",
              f"    ys[{s} * {lx} + lx] = RND4(v);",  # (as the separable conv's own kernel stores it)
              "  }"]
    L.append("  barrier(CLK_LOCAL_MEM_FENCE);")
    # 3. the expansion over ys: group G's share of the expanded slices, ls * ts2 a round
    L += [f"  if (p >= {pixels}) return;",
          f"  const int lo = G * {chunk}; const int hi = min({sexp}, lo + {chunk});",
          f"  for (int R = lo; R < hi; R += {ls * ts2}) {{"]
    for a in range(ts2):
        L += [f"    const int o{a} = R + {a * ls} + ls;",
              f"    const int wb{a} = min(o{a}, {sexp - 1}) * {sout * 4};",
              f"    float4 c{a} = (float4)(0.0f);"]
    L += [f"    for (int k = 0; k < {sout}; ++k) {{",
          f"      const float4 y = ys[k * {lx} + lx];"]
    for a in range(ts2):
        w = f"wts2, wb{a} + k * 4"
        L.append(f"      c{a} = mad((float4)(y.x), LD4({w}), mad((float4)(y.y), LD4({w} + 1), "
                 f"mad((float4)(y.z), LD4({w} + 2), mad((float4)(y.w), LD4({w} + 3), c{a}))));")
    L.append("    }")
    for a in range(ts2):
        L += [f"    if (o{a} < hi) {{",
              f"      float4 v = c{a} + LD4(bias2, o{a});",
              "      " + activation(act_ex, "v"),
              "      " + pad_lanes_mask(cexp, f"o{a}", "v"),
              f"      ST4(dst2, (b * {sexp} + o{a}) * {pixels} + p, v);",
              "    }"]
    L += ["  }", "}"]
    return "\n".join(L)


@composite(SEPARABLE_EXPAND)
def _parts(op, epilogue: list) -> list[Part]:
    return [Part(op.options["separable"], epilogue, "sep"), Part(op.options["expand"], [], "ex")]


@generator(SEPARABLE_EXPAND)
def separable_expand(ctx: GenContext) -> list[KernelSpec]:
    sep_op, ex_op = ctx.opt("separable"), ctx.opt("expand")
    sep_ctx = replace(ctx, op=sep_op, params={})
    x_t = ctx.input_tensor(0)
    n, ih, iw, cin = ctx.layout(x_t).dims
    wd, wp, we = _float_const(ctx, 1), _float_const(ctx, 3), _float_const(ctx, 5)
    _, kh, kw, cdw = wd.shape
    cout, cexp = wp.shape[0], we.shape[0]
    if cdw != cin or wp.shape[1:] != (1, 1, cin) or we.shape[1:] != (1, 1, cout):
        raise Unsupported("not a separable conv read by a pointwise conv of its channels")
    dw_op = sep_op.options["depthwise"]
    sh, sw, dh, dw, oh, ow, pt, pl = _geometry(replace(ctx, op=dw_op, epilogue=[], params={}), ih, iw, kh, kw)
    g = _Geometry(n, ih, iw, kh, kw, sh, sw, dh, dw, oh, ow, pt, pl)
    sin, sout, sexp = (cin + 3) // 4, (cout + 3) // 4, (cexp + 3) // 4
    shape = ExpandShape(sin, sout, sexp, oh * ow, n, ctx.target.gpu, bool(ctx.opt("fused_start", True)))
    knobs = ExpandKnobs.resolve(shape, ctx.params)
    space, params = ExpandKnobs.space(shape), knobs.params()
    if not knobs.fused:  # the two ops' own kernels
        return unfused(ctx, params, space)
    sep_out, ex_out = sep_ctx.final_output, ex_op.outputs[0]
    keep = bool(ctx.opt("keep"))
    ep = ctx.epilogue_code(cout)
    lx, ls = knobs.group_tile
    so = knobs.block_slices(shape)
    src = _fused_source(ctx.name, g, shape, cout=cout, cexp=cexp, knobs=knobs,
                        act_dw=dw_op.options.get("fused_activation_function", 0),
                        act_pw=sep_op.options.get("fused_activation_function", 0),
                        act_ex=ex_op.options.get("fused_activation_function", 0), epilogue=ep, keep=keep,
                        between=sep_op.options.get(BETWEEN, ()))
    gsize, local = (-(-oh * ow // lx) * lx, n, knobs.split * ls), (lx, 1, ls)
    args = [Arg("tensor", ctx.op.inputs[0]), Arg("const", depthwise_weights(wd, 1)), Arg("const", vec_slices(
        _bias_const(ctx, 2, cin), cin)), Arg("const", weights_oi(wp, 4, so)),
        Arg("const", vec_slices(_bias_const(ctx, 4, cout), cout, so)), *ep.args]
    args += [Arg("tensor", sep_out)] if keep else []
    args += [Arg("const", weights_oi(we)), Arg("const", vec_slices(_bias_const(ctx, 6, cexp), cexp)),
             Arg("tensor", ex_out)]
    flops = 2 * n * oh * ow * (cin * kh * kw + cout * cin + cexp * cout)
    return [KernelSpec(ctx.name, src, gsize, local, args, [ctx.op.inputs[0], *ep.inputs],
                       ([sep_out] if keep else []) + [ex_out], params, space=space, flops=flops)]

