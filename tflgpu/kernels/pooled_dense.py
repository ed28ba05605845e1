"""POOLED_DENSE (graph.passes.fuse_pooled_dense): a spatial MEAN and the FULLY_CONNECTED (or 1x1 CONV_2D) reading
it, a classifier's head, as one kernel: one launch instead of two on a GPU, where a launch costs the host more
than either kernel takes the device (NVIDIA's OpenCL on an H100: 10-16 us to enqueue one).

A work-group of ``L`` work-items computes the mean of every input slice of its image into local memory (each
group recomputes it: 7 x 7 x 1,280 values of MobileNet v2, 250 KB read from the cache; ``MEAN_LANES`` work-items a
slice, adjacent ones reading adjacent pixels, their sums added in local memory), then ``G`` output slices
from it, each summed by ``R = L / G`` work-items over every R-th input slice (adjacent work-items reading adjacent
weights) and reduced in local memory. ``fused=False`` launches the two ops' own kernels (each with its own record, else
its heuristics), the form a CPU device keeps (its runtime runs a work-group's barriers on one core).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..graph.passes import BETWEEN, GATE, HIDDEN_FUSED, POOLED_DENSE
from . import elementwise, pool  # noqa: F401  (its parts' generators, MEAN's and a unary op's: base.generator_version)
from .base import GenContext, Part, Target, Unsupported, composite, generator, require_float, unfused
from .common import Arg, KernelSpec, activation, pad_lanes_mask, vec_slices, weights_oi
from .conv import _bias_const, _float_const, _store
from .epilogue import first_values
from .knobs import Knobs, one_of

POOLED_SPACE = {
    "fused": [False, True],
    # (G out slices, L items); those of more than 256 work-items where the device's work-groups take them
    # (Target.max_group: an H100's take 1,024)
    "group": [(8, 128), (4, 64), (8, 64), (16, 128), (4, 128), (16, 256), (32, 256), (8, 256), (4, 256),
              (8, 512), (4, 512), (8, 1024), (4, 1024)],
}
# the means are taken ``MEAN_LANES`` work-items a slice, each summing every MEAN_LANES-th pixel (at most, and a power
# of two: fewer for fewer pixels), adjacent work-items reading adjacent pixels of the slice: on a GPU a warp's loads
# then fall in a few runs of memory, where a work-item a slice (each walking its 49 pixels alone) spread them
# over as many runs as work-items
MEAN_LANES = 8
POOLED_LOCAL_BYTES = 30 * 1024  # (the input's means and the reduction: within OpenCL 1.2's 32 KB)
# on a CPU device, the pixels from which a gate runs as its three ops' own kernels (GateKnobs.default)
GATE_FUSED_PIXELS = 1024


@dataclass(frozen=True)
class PooledShape:
    sin: int  # input slices (channels / 4)
    sout: int  # output slices
    gpu: bool = Target.gpu
    max_group: int = Target.max_group  # the work-items the device's work-groups take
    hidden: int = 0  # a gate's hidden slices (GATE: held in local memory beside the means)
    pixels: int = 0  # the pixels of an image the means run over

    @property
    def most_items(self) -> int:
        """The most work-items a group may take: 256 (what every GPU's work-groups take), more where the device's
        do."""
        return max(256, self.max_group)


@dataclass(frozen=True)
class PooledKnobs(Knobs):
    fused: bool = True
    group: tuple = (8, 256)

    @classmethod
    def default(cls, shape: PooledShape) -> PooledKnobs:
        """On a GPU 8 output slices by 256 work-items a group (MobileNet's 1,001 classes: 32 groups, each summing
        an output slice's 1,024-1,280 terms 32 ways). Each group's means are a chain of steps, each a barrier
        apart, of ``L / MEAN_LANES`` input slices: MobileNet v2's 320 take 10 steps at 256 work-items, 20 at
        the 128 this default had (when an H100 timed the head at 31 us of MobileNet v2's 514 us, before
        ``MEAN_LANES``), and with 32 groups on a GPU of 100+ multiprocessors no other group's work hides them.
        Not measured on a GPU yet; larger groups are in the space where the device takes them. On a CPU device
        the two ops' own kernels."""
        return cls(fused=shape.gpu and cls(True).problems(shape) == [])

    @classmethod
    def space(cls, shape: PooledShape) -> dict[str, list]:
        return {**POOLED_SPACE, "group": [g for g in POOLED_SPACE["group"] if g[1] <= shape.most_items]}

    @classmethod
    def resolve(cls, shape: PooledShape, params: dict | None = None) -> PooledKnobs:
        """As ``Knobs.resolve``; ``fused=False``'s other knob is the default's."""
        knobs = super().resolve(shape, params)
        return knobs if knobs.fused else replace(cls.default(shape), fused=False)

    def problems(self, shape: PooledShape) -> list[str]:
        bad = one_of("fused", self.fused, (False, True))
        if not self.fused or bad:
            return bad
        g = self.group
        if not (isinstance(g, tuple) and len(g) == 2 and all(isinstance(v, int) and v >= 1 for v in g)):
            return [f"group={g!r} is not 2 positive ints"]
        per, rest = divmod(g[1], g[0])
        if rest or per & (per - 1) or g[1] > shape.most_items:
            bad.append(f"group={g!r}: the work-items ({g[1]}, at most {shape.most_items}) must be a power-of-two "
                       f"multiple of the output slices ({g[0]})")
        if 16 * (shape.sin + shape.hidden + g[1]) > POOLED_LOCAL_BYTES:
            bad.append(f"the means of {shape.sin} input slices and {shape.hidden} hidden ones do not fit "
                       f"{POOLED_LOCAL_BYTES} bytes of local memory")
        return bad


def _fused_source(name: str, *, n_pixels: int, sin: int, sout: int, cout: int, g: int, items: int, act: int,
                  epilogue, between=()) -> str:
    """The fused kernel (see the module's docstring); ``between``: the unary ops applied to the means
    (graph.passes.BETWEEN: a quantized model's QUANT_SIM after its MEAN)."""
    per = items // g
    extra = "".join(f"{p}, " for p in epilogue.params)
    return "\n".join([
        f"__attribute__((reqd_work_group_size({items}, 1, 1)))",
        (f"__kernel void {name}(__global const STORE_T* src, __global const STORE_T* wts, "
         f"__global const STORE_T* bias, {extra}__global STORE_T* dst) {{"),
        f"  __local float4 xm[{sin}];",
        f"  __local float4 red[{items}];",
        "  const int lid = get_local_id(0); const int b = get_global_id(1);",
        *_mean_lines(n_pixels, sin, items, between),
        f"  const int o = get_group_id(0) * {g} + lid / {per}; const int r = lid % {per};",
        *_dense_lines("xm", "wts", sin, sout, per),
        *_output_lines(sout, cout, act, epilogue),
        "}"])


def _gate_source(name: str, *, n_pixels: int, sin: int, hidden: int, sout: int, c_hidden: int, cout: int, g: int,
                 items: int, act_hidden: int, hidden_fused, act: int, epilogue) -> str:
    """A squeeze-and-excitation gate (GATE) in one kernel: the means (``xm``), then every hidden slice (``hm``, the
    hidden dense op's activation and fused ops applied, the lanes past ``c_hidden`` zeroed) ``g`` slices a step,
    then the group's ``g`` gate slices from them, as POOLED_DENSE's dense op."""
    per = items // g
    extra = "".join(f"{p}, " for p in epilogue.params)
    return "\n".join([
        f"__attribute__((reqd_work_group_size({items}, 1, 1)))",
        (f"__kernel void {name}(__global const STORE_T* src, __global const STORE_T* w1, "
         f"__global const STORE_T* b1, __global const STORE_T* wts, __global const STORE_T* bias, {extra}"
         f"__global STORE_T* dst) {{"),
        f"  __local float4 xm[{sin}];",
        f"  __local float4 hm[{hidden}];",
        f"  __local float4 red[{items}];",
        "  const int lid = get_local_id(0); const int b = get_global_id(1);",
        *_mean_lines(n_pixels, sin, items, ()),
        f"  const int r = lid % {per};",
        f"  for (int h0 = 0; h0 < {hidden}; h0 += {g}) {{",
        f"    const int o = h0 + lid / {per};",
        *("  " + line for line in _dense_lines("xm", "w1", sin, hidden, per)),
        f"    if (r == 0 && o < {hidden}) {{",
        f"      float4 v = red[lid] + LD4(b1, o); {first_values(act_hidden, hidden_fused, 'v')}",
        f"      {pad_lanes_mask(c_hidden, 'o', 'v')} hm[o] = v;",
        "    }",
        "    barrier(CLK_LOCAL_MEM_FENCE);",
        "  }",
        f"  const int o = get_group_id(0) * {g} + lid / {per};",
        *_dense_lines("hm", "wts", hidden, sout, per),
        *_output_lines(sout, cout, act, epilogue),
        "}"])


def _output_lines(sout: int, cout: int, act: int, epilogue) -> list[str]:
    """Output slice ``o``'s store by its first work-item: its sum in ``red[lid]``, the bias, the dense op's
    activation, its fused ops, the lanes past ``cout`` zeroed."""
    return [f"  if (r == 0 && o < {sout}) {{",
            "    float4 v = red[lid] + LD4(bias, o);",
            "    " + activation(act, "v"),
            "    " + _store(f"b * {sout} + o", "o", epilogue.code, pad_lanes_mask(cout, "o", "v")),
            "  }"]


def _dense_lines(xs: str, wts: str, sin: int, sout: int, per: int) -> list[str]:
    """Output slice ``o``'s sum over the ``sin`` slices of local ``xs``, ``per`` work-items (``r``, adjacent ones
    reading adjacent weights) a slice, left in ``red[lid]`` of the slice's first work-item (its other work-items'
    partial sums added there), the group past its barriers."""
    red = [f"  for (int h = {per // 2}; h > 0; h >>= 1) {{",
           "    if (r < h) red[lid] += red[lid + h];",
           "    barrier(CLK_LOCAL_MEM_FENCE);",
           "  }"] if per > 1 else []
    return [
        "  float4 acc = (float4)(0.0f);",
        f"  if (o < {sout}) {{",
        f"    for (int k = r; k < {sin}; k += {per}) {{",
        f"      const float4 x = {xs}[k];",
        f"      const int wb = (o * {sin} + k) * 4;",
        (f"      acc = mad((float4)(x.x), LD4({wts}, wb), mad((float4)(x.y), LD4({wts}, wb + 1), "
         f"mad((float4)(x.z), LD4({wts}, wb + 2), mad((float4)(x.w), LD4({wts}, wb + 3), acc))));"),
        "    }",
        "  }",
        "  red[lid] = acc;",
        "  barrier(CLK_LOCAL_MEM_FENCE);",
        *red]


def _mean_lines(n_pixels: int, sin: int, items: int, between) -> list[str]:
    """The group's means of every input slice of image ``b`` into local ``xm`` (``between`` applied), through
    ``red``, ``MEAN_LANES`` work-items a slice."""
    lanes = min(MEAN_LANES, 1 << (n_pixels.bit_length() - 1))  # (a power of two: it divides the group's items)
    rows = items // lanes
    return [
        f"  for (int s0 = 0; s0 < {sin}; s0 += {rows}) {{",
        f"    const int s = s0 + lid / {lanes}; const int p = lid % {lanes};",
        "    float4 acc = (float4)(0.0f);",
        f"    const int base = (b * {sin} + s) * {n_pixels};",
        f"    if (s < {sin}) for (int i = p; i < {n_pixels}; i += {lanes}) acc += LD4(src, base + i);",
        "    red[lid] = acc;",
        "    barrier(CLK_LOCAL_MEM_FENCE);",
        f"    if (p == 0 && s < {sin}) {{",
        f"      for (int j = 1; j < {lanes}; ++j) acc += red[lid + j];",
        # (the MEAN's own kernel stores its means, rounded; the ops between them are one kernel: rounded again)
        f"      float4 m = acc * (1.0f / {n_pixels}.0f); {'m = RND4(m); ' if between else ''}"
        f"{first_values(None, between, 'm')}",
        "      xm[s] = m;",
        "    }",
        "    barrier(CLK_LOCAL_MEM_FENCE);",
        "  }"]


def _dense_weights(ctx: GenContext, i: int, cin: int) -> tuple[np.ndarray, int]:
    """Input ``i``, a dense op's weights over ``cin`` channels, as [O, 1, 1, cin], and O."""
    w = _float_const(ctx, i)
    cout = w.shape[0]
    if w.size != cout * cin:
        raise Unsupported("the dense op's weights do not take its input's channels")
    return w.reshape(cout, 1, 1, cin), cout


@composite(POOLED_DENSE)
def _parts(op, epilogue: list) -> list[Part]:
    # (a MEAN's kernel takes no fused ops: the unary ops after it, a quantized model's QUANT_SIM, are the first one's
    # own kernel with the others fused, as the plan ran them before the pass)
    between = op.options.get(BETWEEN, ())
    post = [Part(between[0].op, list(between[1:]), "post")] if between else []
    return [Part(op.options["mean"], [], "mean"), *post, Part(op.options["dense"], epilogue, "dense")]


@generator(POOLED_DENSE)
def pooled_dense(ctx: GenContext) -> list[KernelSpec]:
    x_t = ctx.input_tensor(0)
    require_float(ctx, x_t, ctx.output_tensor())
    n, ih, iw, cin = ctx.layout(x_t).dims
    w, cout = _dense_weights(ctx, 1, cin)
    sin, sout = (cin + 3) // 4, (cout + 3) // 4
    shape = PooledShape(sin, sout, ctx.target.gpu, ctx.target.max_group)
    knobs = PooledKnobs.resolve(shape, ctx.params)
    space, params = PooledKnobs.space(shape), knobs.params()
    if not knobs.fused:  # the two ops' own kernels
        return unfused(ctx, params, space)
    act = ctx.opt("fused_activation_function", 0)
    ep = ctx.epilogue_code(cout)
    g, items = knobs.group
    src = _fused_source(ctx.name, n_pixels=ih * iw, sin=sin, sout=sout, cout=cout, g=g, items=items, act=act,
                        epilogue=ep, between=ctx.opt(BETWEEN, ()))
    args = [Arg("tensor", ctx.op.inputs[0]), Arg("const", weights_oi(w)),
            Arg("const", vec_slices(_bias_const(ctx, 2, cout), cout)), *ep.args, Arg("tensor", ctx.final_output)]
    return [KernelSpec(ctx.name, src, (-(-sout // g) * items, n), (items, 1), args, [ctx.op.inputs[0], *ep.inputs],
                       [ctx.final_output], params, space=space, flops=2 * n * (cin * ih * iw + cout * cin))]


@dataclass(frozen=True)
class GateKnobs(PooledKnobs):
    @classmethod
    def default(cls, shape: PooledShape) -> GateKnobs:
        """Fused. On a GPU as POOLED_DENSE's; on a CPU device (its runtime runs a work-group on one core) one group
        takes every gate slice, so the means and the hidden slices are summed once: ``g`` the first power of two
        that is at least the gate's slices (every group recomputes them), 64 work-items or ``g``; unfused from
        ``GATE_FUSED_PIXELS`` pixels, whose means the MEAN's own kernel takes on every core where the one group
        takes one. MediaPipe's selfie segmentation, whole plans (tuning none, Intel's CPU runtime on 2 Xeon cores,
        6 rounds of 20 invokes in shuffled order), its 4 gates of 32 x 32 to 128 x 128 pixels unfused: 2.62 ->
        2.51 ms and 2.56 -> 2.51 in a second run (from 4,096 pixels 2.49, 16,384 2.50; every gate 2.58); its
        landscape form 1.74 -> 1.68 (from 4,096 pixels 1.68)."""
        g = 1 << max(shape.sout - 1, 0).bit_length()
        one_group = cls(True, (g, max(g, 64)))
        if not shape.gpu and shape.pixels >= GATE_FUSED_PIXELS:
            return cls(fused=False)
        if not shape.gpu and one_group.problems(shape) == []:
            return one_group
        return cls(fused=cls(True).problems(shape) == [])


@composite(GATE)
def _gate_parts(op, epilogue: list) -> list[Part]:
    return [Part(op.options["mean"], [], "mean"), Part(op.options["hidden"], list(op.options[HIDDEN_FUSED]), "hidden"),
            Part(op.options["dense"], epilogue, "dense")]


@generator(GATE)
def gate(ctx: GenContext) -> list[KernelSpec]:
    """A squeeze-and-excitation gate (graph.passes.fuse_gates): _gate_source, or its three ops' own kernels."""
    x_t = ctx.input_tensor(0)
    require_float(ctx, x_t, ctx.output_tensor())
    n, ih, iw, cin = ctx.layout(x_t).dims
    w1, c_hidden = _dense_weights(ctx, 1, cin)
    w2, cout = _dense_weights(ctx, 3, c_hidden)
    sin, hidden, sout = (cin + 3) // 4, (c_hidden + 3) // 4, (cout + 3) // 4
    shape = PooledShape(sin, sout, ctx.target.gpu, ctx.target.max_group, hidden, ih * iw)
    knobs = GateKnobs.resolve(shape, ctx.params)
    space, params = GateKnobs.space(shape), knobs.params()
    if not knobs.fused:
        return unfused(ctx, params, space)
    ep = ctx.epilogue_code(cout)
    g, items = knobs.group
    hidden_op = ctx.op.options["hidden"]
    src = _gate_source(ctx.name, n_pixels=ih * iw, sin=sin, hidden=hidden, sout=sout, c_hidden=c_hidden, cout=cout,
                       g=g, items=items, act_hidden=hidden_op.options.get("fused_activation_function", 0),
                       hidden_fused=ctx.opt(HIDDEN_FUSED, ()), act=ctx.opt("fused_activation_function", 0),
                       epilogue=ep)
    args = [Arg("tensor", ctx.op.inputs[0]), Arg("const", weights_oi(w1)),
            Arg("const", vec_slices(_bias_const(ctx, 2, c_hidden), c_hidden)), Arg("const", weights_oi(w2)),
            Arg("const", vec_slices(_bias_const(ctx, 4, cout), cout)), *ep.args, Arg("tensor", ctx.final_output)]
    groups = -(-sout // g)
    return [KernelSpec(ctx.name, src, (groups * items, n), (items, 1), args, [ctx.op.inputs[0], *ep.inputs],
                       [ctx.final_output], params, space=space,
                       flops=2 * n * (cin * ih * iw + groups * c_hidden * cin + cout * c_hidden))]
