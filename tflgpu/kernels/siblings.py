"""SIBLING_CONVS (graph.passes.merge_sibling_convs): pointwise convs of one input as one GEMM, on a GPU.

A model's heads often read one feature map with several 1x1 convs: PoseNet's heatmaps, offsets and two
displacement maps (17x17x1,024 -> 17 / 34 / 32 / 32 channels), an SSD feature map's box and class convs. Each is
a launch of its own, and each a thin GEMM (a few output slices for hundreds of input slices): on a GPU a launch
costs about as much as such a kernel takes (NVIDIA's OpenCL on an H100: ~5.6 us of device time per launch and
10-16 us of the host's). Side by side their weights make one GEMM of the input, each conv's output channels
padded to whole slices, so that every output slice of the GEMM belongs to one conv: the group tile
(kernels.conv's local-memory GEMM) computes it, and each slice is stored into its conv's output, at its own
layout (``conv.Route``: the slice layout, or a graph output's dense NHWC buffer). ``fused=False`` launches the
convs' own kernels (each with its own record, else its heuristics), the form a CPU device keeps (it runs only
where a GPU's target asks for the pass).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..graph.passes import SIBLING_CONVS
from .base import GenContext, Part, Unsupported, composite, generator, require_float, unfused
from .common import Arg, KernelSpec, round_up, vec_slices, weights_oi
from .conv import ConvKnobs, ConvShape, Route, _bias_const, _float_const, _group_tile_source, group_tile_grid


@dataclass(frozen=True)
class SiblingKnobs(ConvKnobs):
    """The GEMM's knobs (a CONV_2D's, of which a fused sibling conv takes the group tile's) and ``fused``."""

    fused: bool = True

    @classmethod
    def default(cls, shape: ConvShape) -> SiblingKnobs:
        """The pointwise conv's GPU default over all the siblings' output slices, fused where that is a group tile;
        else (a CPU device's target) the convs' own kernels."""
        knobs = cls(**ConvKnobs.default(shape).params())
        return knobs if not knobs.problems(shape) else replace(knobs, fused=False)

    @classmethod
    def space(cls, shape: ConvShape) -> dict[str, list]:
        return {**ConvKnobs.space(shape), "fused": [False, True]}

    @classmethod
    def resolve(cls, shape: ConvShape, params: dict | None = None) -> SiblingKnobs:
        """As ``Knobs.resolve``; ``fused=False``'s other knobs are the default's (the convs take their own)."""
        knobs = super().resolve(shape, params)
        return knobs if knobs.fused else replace(cls.default(shape), fused=False)

    def problems(self, shape: ConvShape) -> list[str]:
        if self.fused is False:
            return []
        bad = super().problems(shape)
        if self.fused is not True:
            bad.append(f"fused={self.fused!r} is not a bool")
        elif self.group_tile is None or self.split != 1 or self.broadcast or self.winograd or self.image_weights:
            bad.append("fused sibling convs run the group tile (no split sum, broadcast, Winograd or image weights)")
        return bad


@composite(SIBLING_CONVS)
def _parts(op, epilogue: list) -> list[Part]:
    return [Part(conv, [], f"c{k}") for k, conv in enumerate(op.options["convs"])]


@generator(SIBLING_CONVS)
def sibling_convs(ctx: GenContext) -> list[KernelSpec]:
    if ctx.epilogue:
        raise Unsupported("sibling convs take no fused ops after them")
    x_t = ctx.input_tensor(0)
    outs = list(ctx.op.outputs)
    require_float(ctx, x_t, *(ctx.output_tensor(k) for k in range(len(outs))))
    n, h, w, cin = ctx.layout(x_t).dims
    weights, biases, routes, s0 = [], [], [], 0
    for k, t in enumerate(outs):
        wk = _float_const(ctx, 1 + 2 * k)
        cout = wk.shape[0]
        if wk.shape != (cout, 1, 1, cin):
            raise Unsupported(f"sibling conv {k}'s filter {wk.shape} is not a pointwise conv of {cin} channels")
        padded = round_up(cout, 4)
        weights.append(np.concatenate([wk, np.zeros((padded - cout, 1, 1, cin), np.float32)]))
        biases.append(np.concatenate([_bias_const(ctx, 2 + 2 * k, cout), np.zeros(padded - cout, np.float32)]))
        routes.append(Route(s0, padded // 4, cout, t in ctx.dense))
        s0 += padded // 4
    sin, sout, pixels = (cin + 3) // 4, s0, h * w
    w_all = np.concatenate(weights)
    shape = ConvShape(1, 1, 1, 1, 1, 1, sin, sout, row=pixels, pixels=pixels,
                      w_bytes=w_all.size * (2 if ctx.fp16 else 4), pointwise=True,
                      float_lanes=ctx.target.float_lanes, gpu=ctx.target.gpu, images=ctx.target.images,
                      fp16=ctx.fp16, subgroups=ctx.target.subgroups, max_group=ctx.target.max_group)
    knobs = SiblingKnobs.resolve(shape, ctx.params)
    space, params = SiblingKnobs.space(shape), knobs.params()
    if not knobs.fused:  # the convs' own kernels
        return unfused(ctx, params, space)
    lx, ls = knobs.group_tile
    src = _group_tile_source(ctx.name, pixels=pixels, sin=sin, sout=sout, batch=n, tx=knobs.tile_x, ts=knobs.tile_s,
                             lx=lx, ls=ls, kc=knobs.k_chunk, act=ctx.opt("fused_activation_function", 0),
                             cout=4 * sout, half_math=knobs.half_math, ks=knobs.k_split, prefetch=knobs.prefetch,
                             routes=routes)
    gsize, local, pad = group_tile_grid(pixels=pixels, batch=n, sout=sout, lx=lx, ls=ls, tx=knobs.tile_x,
                                        ts=knobs.tile_s, ks=knobs.k_split)
    return [KernelSpec(ctx.name, src, gsize, local, [
        Arg("tensor", ctx.op.inputs[0]), Arg("const", weights_oi(w_all, knobs.lanes, pad)),
        Arg("const", vec_slices(np.concatenate(biases), 4 * sout, pad)), *(Arg("tensor", t) for t in outs)],
        [ctx.op.inputs[0]], outs, params, space=space, flops=2 * n * pixels * cin * sum(r.cout for r in routes),
        dense=frozenset(t for t, r in zip(outs, routes) if r.dense))]
