"""CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED.

Register tiling: each work-item computes TX adjacent output pixels of TS
output slices (TX*TS float4 accumulators), so each input float4 it loads is
used TS times and each weight float4 TX times. On this machine's OpenCL CPU
device a 1x1 conv (784 px, 256->256) ran at 13 GFLOP/s with one output per
work-item and ~400 GFLOP/s with 16 pixels per work-item.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from ..graph.conv_arg import CONV_ARG
from ..graph.passes import INPUT_SCALE, PROLOGUE
from ..ops.attributes import conv_padding, explicit_padding, pixel_for_pixel
from ..ops.custom_options import transpose_conv_params
from ..ops.layout import Layout
from .base import GenContext, Target, Unsupported, generator, require_float
from .channel_rank import arg_init, arg_lanes, arg_pick, channel_arg
from .common import (
    HALF_ARITHMETIC,
    IMAGE_ROW,
    Arg,
    KernelSpec,
    activation,
    dense_load4,
    dense_store4,
    exact_in_half,
    handed_over,
    image_load,
    pad_lanes_mask,
    slice_part,
    signal_weights,
    store_element,
    summed_lanes,
    vec_slices,
    weights_oi,
)
from .epilogue import unary_chain
from .knobs import Knobs, fitted, one_of, positive_int, work_group


def _float_const(ctx: GenContext, i: int) -> np.ndarray:
    w = ctx.const(i)
    if w is None:
        raise Unsupported(f"input {i} (weights) is not constant")
    t = ctx.input_tensor(i)
    if w.dtype != np.float32:
        if np.issubdtype(w.dtype, np.integer) and t.quantization is not None:
            raise Unsupported("quantized weights (quantization issue)")
        w = w.astype(np.float32)
    return w


def _store(index: str, slice_expr: str, ep_code: str, mask: str, st: str = "ST4(dst, oi, v);") -> str:
    """Apply the fused ops and the pad-lane mask to ``v``, then store it at ``index`` (``st``: the statement)."""
    fused = f"const int S_ep = {slice_expr}; {ep_code}" if ep_code else ""
    return f"{{ const int oi = {index}; {fused} {mask} {st} }}"


@dataclass(frozen=True)
class ChannelArg:
    """A CONV_ARG's rank (graph.conv_arg): each work-item runs over every output slice of its pixels, keeps
    the index of the largest (smallest) channel of each in registers and stores it into ``idx`` (layout
    ``out``); ``sums``: the conv's output is stored too (other ops read it), as half from an FP32 kernel
    where ``half_sums`` (ops.traits' casts_own_output)."""

    greater: bool
    out: Layout
    sums: bool
    half_sums: bool = False
    dense: bool = False  # ``idx`` is the graph output's dense float32 boundary buffer (KernelSpec.dense)


def _bias_const(ctx: GenContext, idx: int, cout: int) -> np.ndarray:
    """The bias input as float32 (zeros when omitted); a non-constant bias cannot be baked in."""
    if idx < 0 or ctx.input_tensor(idx) is None:
        return np.zeros(cout, np.float32)
    bias = ctx.const(idx)
    if bias is None:
        raise Unsupported("bias is not constant")
    return np.asarray(bias, np.float32)


def _winograd(ctx: GenContext, knobs: ConvKnobs, shape: ConvShape, w, bias, *, n, ih, iw, sin, oh, ow, sout, pt,
              pl, cin, cout):
    from .winograd import transform_weights, winograd_source

    ep = ctx.epilogue_code(cout)
    ep_code, ep_params = ep.code, ep.params
    src = winograd_source(ctx.name, ih=ih, iw=iw, sin=sin, oh=oh, ow=ow, sout=sout, pt=pt, pl=pl, batch=n,
                          act_code=activation(ctx.opt("fused_activation_function", 0), "v"),
                          store=lambda index: _store(index, "S", ep_code, pad_lanes_mask(cout, "S", "v")),
                          ep_params=ep_params)
    u = transform_weights(w)  # [O, 6, 6, I]
    b_vec = vec_slices(bias, cout)
    gsize = ((ow + 3) // 4, n * ((oh + 3) // 4), sout)
    return [KernelSpec(ctx.name, src, gsize, None, [
        Arg("tensor", ctx.op.inputs[0]), Arg("const32", weights_oi(u)), Arg("const", b_vec), *ep.args,
        Arg("tensor", ctx.final_output)], [ctx.op.inputs[0], *ep.inputs], [ctx.final_output],
        knobs.params(), space=ConvKnobs.space(shape), flops=2 * n * oh * ow * cout * 9 * cin)]


def _geometry(ctx: GenContext, ih: int, iw: int, kh: int, kw: int) -> tuple[int, ...]:
    """Strides, dilations, output size and leading padding of a conv-like op's options."""
    sh, sw = ctx.opt("stride_h", 1), ctx.opt("stride_w", 1)
    dh, dw = ctx.opt("dilation_h_factor", 1) or 1, ctx.opt("dilation_w_factor", 1) or 1
    pad = ctx.opt("padding", 0)
    et, eb, el, er = explicit_padding(ctx.op.options)  # (a merged PAD's: graph.passes.merge_pad)
    oh, pt = conv_padding(ih, kh, sh, dh, pad, et, eb)
    ow, pl = conv_padding(iw, kw, sw, dw, pad, el, er)
    return sh, sw, dh, dw, oh, ow, pt, pl


CONV_SPACE = {
    "tile_x": [1, 2, 4, 5, 6, 7, 8, 16],  # (5-7: a pointwise tile leaving no ragged last tile, pointwise_tile)
    "tile_s": [1, 2, 4, 6, 8, 12, 16],
    "lanes": [4, 8, 16],  # output channels per accumulator vector (tile_s a multiple of lanes / 4)
    "vec_hint": [None, "float4", "float8", "float16"],
    "strided": [False, True],
    "const_weights": [False, True],  # weights in __constant memory (small filters only)
    "winograd": [False, True],  # F(4x4, 3x3): 3x3, stride 1, undilated only
    "local_size": [None, (8, 1, 1), (16, 1, 1), (32, 1, 1), (8, 4, 1), (16, 2, 1)],
    # a work-group of (pixels, output slices) work-items staging input and weight tiles in local memory (the GPU
    # way to a GEMM; a conv with a window as an implicit GEMM over its taps), with the sum's slices it stages per
    # step
    "group_tile": [None, (16, 4), (32, 2), (8, 8), (64, 1), (16, 16), (32, 8)],
    "k_chunk": [4, 8, 16],
    # a group tile's sum split among this many work-items per output (each its share of every staged step's
    # slices, summed in local memory at the end): a GPU's variant for deep, narrow GEMMs, whose few work-groups
    # otherwise each run the whole sum serially (on an H100, 7x7 960 -> 160 took as long as 17x17 960 -> 320).
    # 8 only where the device's work-groups take 512 work-items (Target.max_group: an H100's take 1024): in the
    # H100's sweep the best split point had 4 shares, the most it offered, on 13 of 15 shapes
    "k_split": [1, 2, 4, 8],
    # a group tile reading each step's share of its input and weights into registers one step ahead (a GPU's
    # variant: where a conv has few work-groups, none other hides a step's reads from global memory)
    "prefetch": [False, True],
    "image_weights": [False, True],  # the direct kernel's weights in a read-only image (where the device has images)
    "half_math": [False, True],  # the direct kernel's or the group tile's sums in half (an FP16 plan)
    # a pointwise conv of one pixel (a classifier written as a 1x1 conv): work-items of a work-group sharing each
    # output slice's sum over the input slices (FULLY_CONNECTED's split)
    "split": [1, 8, 16, 32, 64],
    # a pointwise conv as a GEMM whose work-items share their input through sub-group broadcasts instead of local
    # memory: a work-group of this many work-items along the output slices, one each, every one loading a
    # different input slice of the tile's pixels and broadcasting it to the others (cl_khr_subgroups or
    # cl_intel_subgroups; no barrier); 0: off
    "broadcast": [0, 16, 64],
    # the direct kernel's input lanes loaded one by one, each broadcast by its load (where a tile lies inside the
    # image), or a float4 a pixel broadcast lane by lane in registers
    "mem_lanes": [False, True],
    # the signal form (ConvShape.signal_ok: rows of adjacent taps, at most 8 output channels): this many output
    # pixels a work-item, along the lanes of float16 accumulators, each input row's samples staged in private memory
    # by phase (kernels.conv._signal_source); 0: the direct kernel (a CPU's variant)
    "signal": [0, 16, 32, 64, 128],
}
CONST_WEIGHT_BYTES = 32 * 1024  # __constant weights up to this size (the device's constant buffer is often 64 KB)
NEEDS_FP16_PLAN = "FP16 arithmetic needs an FP16 plan (half storage, a device with cl_khr_fp16)"  # (half_math)
LOCAL_TILE_BYTES = 16 * 1024  # local memory a group tile may stage per step of its sum
LOCAL_GROUP_BYTES = 32 * 1024  # local memory a group tile may use in all (OpenCL 1.2's guaranteed minimum)
MAX_GROUP = 256  # work-items per group tile where the device's limit is not known (kernels.base.Target.max_group)
SIGNAL_WINDOW_FLOATS = 4096  # the signal form's staged samples a work-item, at most (16 KB of private memory)
SIGNAL_UNROLL = 4  # the signal form's steps of a phase's tap loop unrolled
SIGNAL_MIN_TAPS = 9  # the signal form is a CPU device's default for windows of rows this long (signal_default)


@dataclass(frozen=True)
class ConvShape:
    """What the conv knobs' defaults, space and validity depend on."""

    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    sin: int  # input slices
    sout: int  # output slices
    row: int  # output pixels along the kernel's dim 0 (a whole image for a 1x1/s1 unpadded conv)
    pixels: int  # output pixels per image
    w_bytes: int  # the filter's size in the storage precision
    pointwise: bool = False  # 1x1, stride 1, unpadded: a GEMM over the image's pixels
    whole_pixel: bool = False  # a work-item runs over every output slice of its pixels (a CONV_ARG's rank)
    float_lanes: int = Target.float_lanes  # the device's native float vector width (kernels.base.Target)
    gpu: bool = Target.gpu  # (kernels.base.Target)
    # it reads its input / writes its output as a dense NHWC float32 boundary buffer (KernelSpec.dense): only the
    # direct kernel does
    dense: bool = False
    # a GPU's group-tiled conv writes its output as the dense buffer: the group tile and the direct kernel do, not
    # Winograd, a split sum or the broadcast GEMM (its space is the one without: a shipped record still finds it)
    dense_out: bool = False
    # its input is a graph input's dense NHWC buffer, which the direct kernel loads in a form of its own
    # (common.dense_load4: no lanes read from memory one by one)
    dense_in: bool = False
    # it applies unary ops to each input value it loads (graph.passes.PROLOGUE: a quantized model's QUANTIZE of its
    # float input): only the direct kernel does, in float arithmetic
    prologue: bool = False
    # it multiplies each input slice it loads by a gate's (graph.passes.INPUT_SCALE): the direct kernel and the group
    # tile do, in float arithmetic
    scaled: bool = False
    images: bool = Target.images  # the device reads images (kernels.base.Target)
    fp16: bool = False  # the kernel stores half (an FP16 plan, on a device with cl_khr_fp16)
    subgroups: str | None = Target.subgroups  # the extension naming the sub-group functions (kernels.base.Target)
    max_group: int = Target.max_group  # the work-items a work-group may have (kernels.base.Target)
    cin: int = 0  # input channels (0: not known, as the shapes of composite ops' parts; no signal form)

    @property
    def signal_ok(self) -> bool:
        """The signal form applies (ConvKnobs.signal): a window of rows of adjacent taps (undilated along them), at
        most two output slices, its input channels known, as the direct kernel computes it but for the epilogue's
        inputs (no prologue, no gate's scale, no channel rank): an audio model's resampling FIR, a filterbank over
        raw samples, a wide window's narrow conv."""
        return (self.cin >= 1 and self.dw == 1 and self.sout <= 2
                and not (self.prologue or self.scaled or self.whole_pixel))

    def signal_window(self, pixels: int) -> int:
        """The samples the signal form stages for ``pixels`` output pixels a work-item: for each of the stride's
        phases a tap reads, the pixels' samples and the taps' (plus the unrolled loop's overrun)."""
        taps = -(-self.kw // self.sw)
        return min(self.sw, self.kw) * (pixels + taps + SIGNAL_UNROLL)

    @property
    def signal_pixels(self) -> list[int]:
        """The signal knob's values this conv takes (pixels a work-item whose window fits): none where the form
        does not apply."""
        if not self.signal_ok:
            return []
        return [p for p in CONV_SPACE["signal"] if p and self.signal_window(p) <= SIGNAL_WINDOW_FLOATS]

    @property
    def weight_texels(self) -> int:
        """The float4s of the direct kernel's weights, at most (output slices padded to a tile of 16)."""
        return (self.sout + 16) * self.sin * self.kh * self.kw * 4

    @property
    def direct_only(self) -> bool:
        """Only the direct kernel takes this conv: it reads or writes a dense boundary buffer, or applies a
        prologue."""
        return self.dense or self.prologue

    @property
    def float_loads(self) -> bool:
        """Its kernel transforms each input value it loads (an input prologue, a gate's scale) in float arithmetic:
        the direct kernel or the group tile, no Winograd, split sum, sub-group broadcast or FP16 arithmetic."""
        return self.prologue or self.scaled

    @property
    def split_ok(self) -> bool:
        """A pointwise conv of a single pixel (per image): a GEMV, whose sum over the input can be split."""
        return self.pointwise and self.pixels == 1 and not self.whole_pixel

    @property
    def depth(self) -> int:
        """The slices a group tile's sum runs over: every tap's input slices."""
        return self.kh * self.kw * self.sin

    @property
    def broadcast_ok(self) -> bool:
        """A pointwise conv on a device with sub-group functions: the broadcast GEMM applies."""
        return (self.pointwise and self.subgroups is not None and not self.whole_pixel and not self.direct_only
                and not self.float_loads)

    @property
    def winograd_ok(self) -> bool:
        return (self.kh, self.kw, self.sh, self.sw, self.dh, self.dw) == (3, 3, 1, 1, 1, 1)


class GroupTiled:
    """What knobs with register tiles (``tile_x``, ``tile_s``, ``lanes``) and an optional group tile (``group_tile``,
    ``k_chunk``: kernels.conv's local-memory GEMM) check alike: CONV_2D's and the separable conv's."""

    k_split = 1  # (a knob of CONV_2D's and the separable conv's: TRANSPOSE_CONV's group tile does not split its sum)
    prefetch = False  # (likewise)

    def prefetch_problems(self) -> list[str]:
        """Why ``prefetch`` does not go with the rest of the point. (The registers a work-item holds for the next
        step are its share of what the step stages, at most LOCAL_TILE_BYTES over a group tile's 64 or more
        work-items: 16 float4 values and a rounding, which the local-memory check already bounds.)"""
        bad = one_of("prefetch", self.prefetch, (False, True))
        if not bad and self.prefetch and self.group_tile is None:
            bad.append("prefetch reads a group tile's next step ahead: it needs a group_tile")
        return bad

    def local_bytes(self) -> int:
        """The local memory a group tile stages per share of its sum: k_chunk input slices of its pixels, and of
        its output slices' weights (float4 each)."""
        if self.group_tile is None:
            return 0
        lx, ls = self.group_tile
        return 16 * self.k_chunk * (lx * self.tile_x + 4 * ls * self.tile_s)

    def group_bytes(self) -> int:
        """All the local memory a group tile uses: ``k_split`` shares staged, or the shares' sums it adds up."""
        if self.group_tile is None:
            return 0
        lx, ls = self.group_tile
        return self.k_split * max(self.local_bytes(), 16 * lx * ls * self.tile_x * self.tile_s)

    def lane_problems(self) -> list[str]:
        if self.lanes in (8, 16) and not positive_int("tile_s", self.tile_s) and self.tile_s % (self.lanes // 4):
            return [(f"{self.lanes}-lane accumulators need a tile_s that is a multiple of {self.lanes // 4}, "
                     f"got {self.tile_s}")]
        return []

    def group_tile_problems(self, max_group: int = MAX_GROUP) -> list[str] | None:
        """Why the group tile is invalid whatever the shape (None: not even a pair of positive ints), on a device
        whose work-groups take ``max_group`` work-items."""
        if not (isinstance(self.group_tile, tuple) and len(self.group_tile) == 2
                and not any(positive_int("", v) for v in self.group_tile)):
            return None
        bad = []
        items = self.group_tile[0] * self.group_tile[1] * self.k_split
        if items > max_group:
            bad.append(f"a group tile of {items} work-items is over {max_group}, the most this device's "
                       f"work-groups take")
        if not positive_int("", self.k_chunk):
            if self.local_bytes() > LOCAL_TILE_BYTES:
                bad.append(f"the group tile stages {self.local_bytes()} bytes of local memory, over {LOCAL_TILE_BYTES}")
            elif self.group_bytes() > LOCAL_GROUP_BYTES:
                bad.append(f"the group tile's {self.k_split} shares use {self.group_bytes()} bytes of local memory, "
                           f"over {LOCAL_GROUP_BYTES}")
        return bad


def group_shares(tiles: list, max_group: int) -> list[int]:
    """The ``k_split`` values a group of the fewest work-items among ``tiles`` (a space's group tiles) can take on a
    device whose work-groups take ``max_group``."""
    fewest = min(g[0] * g[1] for g in tiles if g)
    return [v for v in CONV_SPACE["k_split"] if fewest * v <= max_group]


# a GPU's pointwise GEMM shares each output's sum among work-items (ConvKnobs.k_split) from this many input slices
DEEP_GEMM_SLICES = 32

# a 16-lane device's pointwise tiles: 4 px by 16 or 8 slices from this many input slices and pixels, else 4 slices
# by 4-8 pixels
DEEP_POINTWISE_SLICES = 16
DEEP_POINTWISE_PIXELS = 128


def _least_waste(total: int, sizes: tuple[int, ...]) -> int:
    """The size of ``sizes`` (in order of preference) whose tiles leave the least ragged remainder of ``total``."""
    return min(sizes, key=lambda t: (-(-total // t) * t - total, sizes.index(t)))


def pointwise_tile(sin: int, sout: int, pixels: int) -> tuple[int, int]:
    """(tile_x, tile_s) of a pointwise conv on a 16-lane device (float16 accumulators, four slices each). A sweep
    of 22 MobileNet v1 / v2, PoseNet and DeepLab shapes on the Intel CPU runtime (AMD EPYC Zen 4, tiles timed in
    alternation): from 64 input channels on maps of >= 128 pixels, 4 px by 16 slices (each weight vector serves
    4 pixels, each input value 4 accumulators: 17x17 1024 -> 1024 at 205 GFLOP/s, 33x33 160 -> 960 206, vs 177
    and 176 with the 4 x 8 tile used before), 8 slices where 16 would leave a ragged last group (33x33 576 -> 96:
    183 vs 165); thin inputs and small maps one accumulator per pixel, 4-8 pixels, as many as leave no ragged
    last tile (56x56 24 -> 144: 168 vs 140, 112x112 16 -> 96: 88 vs 76, 7x7 320 -> 1280: 179 vs 131)."""
    if sin >= DEEP_POINTWISE_SLICES and pixels >= DEEP_POINTWISE_PIXELS:
        return 4, _least_waste(sout, (16, 8))
    return _least_waste(pixels, (8, 7, 6, 5, 4)), 4


# a 16-lane device's windowed conv: its output slices a work-item (tile_s) in order of preference, each with the
# lanes of its accumulators (slice_tile)
SLICE_TILES = {8: 16, 12: 16, 6: 8}


def signal_default(shape: ConvShape) -> int:
    """The signal form's output pixels a work-item (ConvKnobs.signal), where it is the default (rows of at least
    SIGNAL_MIN_TAPS taps): 64, 32 for more than 4 output channels (at most 16 float16 accumulators), or the fewest
    that take a short row whole. Timed as whole one-conv plans against the direct kernel's default, three
    alternating rounds (Intel's CPU runtime on 2 Xeon cores): Basic Pitch's resampling FIR (256 taps at stride 2
    over 44,098 samples, one channel) 2,835 -> 217 us (16 / 32 / 128 pixels 385 / 252 / 209); its 3 x 39 conv of
    8 -> 8 channels over 172 x 264 5.27 -> 3.30 ms (16 pixels 3.51, 64 5.75: 32 accumulators spill); 1 x 9, 4 -> 4
    over 40 x 200 0.10 -> 0.07 (64 pixels 0.08, a quarter of the last tile padding). Not where a row has few taps:
    5 x 5 of 8 -> 1 0.87 against 1.05-1.55, 7 x 3 of 32 -> 1 1.04 against 1.7-2.5, 3 x 3 of 33 -> 1 and of 16 -> 8
    0.8x-0.5x (each staged sample used by 3-5 taps)."""
    fits = shape.signal_pixels
    widest = 64 if shape.sout == 1 else 32
    whole = [p for p in fits if p >= shape.row and p <= widest]
    return min(whole) if whole else max([p for p in fits if p <= widest] or fits[:1])


def slice_tile(sout: int) -> tuple[int, int]:
    """(tile_s, lanes) of a windowed conv on a 16-lane device: 8 slices in two float16 accumulators a pixel, or where
    those leave a ragged last tile, 12 in three, or 6 in three float8s. A sweep of openWakeWord's embedding model
    (1x3 and 3x1 convs of 24, 48, 72 and 96 channels; 17 tiles each, Intel's CPU runtime on 2 Xeon cores): 48
    channels (12 slices) 4 px x 12 slices 34.6-37.6 us against 50.0-53.2 with 4 x 8 (whose second tile is half
    padding); 72 channels (18) 4 x 6 in float8s 36.4-45.8 against 44.5-54.9; 24 channels (6) 47.7-51.8 against
    54.5-55.8. Where 8 leaves nothing unused (U-Net's 3x3 convs of 32 to 128 channels) 12 came within 7% of it, and
    8 stays."""
    ts = _least_waste(sout, tuple(SLICE_TILES))
    return ts, SLICE_TILES[ts]


@dataclass(frozen=True)
class ConvKnobs(GroupTiled, Knobs):
    """The register-tiled conv's knobs (also the FC-free CONV_2D's Winograd switch)."""

    tile_x: int = 4  # adjacent (or strided) output pixels per work-item
    tile_s: int = 4  # output slices per work-item
    # output channels per accumulator vector: 4 (float4, one slice), 8 (float8, two slices) or 16 (float16,
    # four slices: one AVX-512 register); tile_s a multiple of lanes / 4
    lanes: int = 4
    vec_hint: str | None = "float4"  # vec_type_hint; float8 / float16 only with accumulators that wide
    strided: bool = False  # work-item g takes pixels g, g + G, ... instead of tile_x adjacent ones
    const_weights: bool = False  # weights in __constant memory (filters up to CONST_WEIGHT_BYTES)
    winograd: bool = False  # F(4x4, 3x3) instead of the direct kernel (3x3/s1 undilated; the other knobs unused)
    local_size: tuple | None = None
    # (LX, LS): a work-group of LX x LS work-items, each tile_x pixels (LX apart: neighbours read neighbours) by
    # tile_s output slices, stages k_chunk slices of its pixels' sum (input slices; a windowed conv's taps times
    # input slices, kernels.conv.im2col_stage) and its slices' weights in local memory per step
    group_tile: tuple | None = None
    k_chunk: int = 8
    # the group tile's sum split among k_split work-items per output (the work-group's dimension 1): each sums
    # its k_chunk of the k_split * k_chunk slices staged per step, and the shares are added in local memory
    # before the stores
    k_split: int = 1
    split: int = 1  # work-items summing one output slice together (a one-pixel pointwise conv: ConvShape.split_ok)
    # the direct kernel reads its weights from a read-only image (the texture path; float4 accumulators) instead
    # of a buffer: where the device has images
    image_weights: bool = False
    # FP16 arithmetic (not only storage): half accumulators over the FP16 plan's half inputs and weights in the
    # direct kernel or the group tile (whose local tiles then hold half), where the device has cl_khr_fp16; the
    # tuner's output check against the default bounds the error it may add
    half_math: bool = False
    # work-items of a work-group along the output slices sharing the input of tile_x pixels through sub-group
    # broadcasts (the pointwise conv's GEMM without local memory; CONV_SPACE["broadcast"]); 0: off
    broadcast: int = 0
    # the group tile reads each step one step ahead, into registers (GroupTiled.prefetch_problems): a GPU's variant
    prefetch: bool = False
    # the direct kernel reads each input lane of a tile whose pixels all lie inside the image on its own, broadcast
    # as it is loaded (kernels.conv._conv_slice_loop), instead of a float4 a pixel whose lanes are broadcast in
    # registers; in float arithmetic (the other forms, like FP16 arithmetic, have loads of their own: as with
    # strided / const_weights, the knob is the direct kernel's)
    mem_lanes: bool = False
    # the signal form (ConvShape.signal_ok: rows of adjacent taps, at most 8 output channels) computing this many
    # output pixels a work-item along the lanes of float16 accumulators (kernels.conv._signal_source), in place of
    # the direct kernel, whose tile knobs it leaves unused (as Winograd does); 0: off
    signal: int = 0

    @classmethod
    def default(cls, shape: ConvShape) -> ConvKnobs:
        """Heuristic tile from a sweep on the Intel OpenCL CPU device (5 MobileNet-like shapes x 18 tiles):
        float8 accumulators (8 lanes, two output slices per vector) won everywhere but on the 3-channel stem:
        86-108 GFLOP/s vs 39-65 for the best float4 tile. 4 px x 4 slices won on large maps (>= 256 px),
        2 px x 8 slices on small ones and on deep inputs (>= 128 slices, whose weights outgrow the cache:
        17x17 1024->1024 ran at 90 GFLOP/s with (2, 8), 82 with (4, 4)).

        On a device whose native float vector is 16 wide (Intel's runtime on an AVX-512 CPU), float16
        accumulators (four output slices per vector) and 4 px x 8 slices: MobileNet v1's convs ran at 380-440
        GFLOP/s vs 190-235 with the float8 tile above (a Zen 5 core's 512-bit FMA units half idle otherwise);
        also on thin layers (MobileNet v2's 3-channel stem 430 -> 210 us, its 24-channel 1x1s 1.3x faster), 8
        pixels by 4 slices where there are only 4.

        There, a windowed conv of two or more input slices reads its input lanes one by one where a tile lies
        inside the image, each broadcast by its own load (``mem_lanes``). Each direct CONV_2D of U-Net,
        openWakeWord's embedding model, MobileNet v1 / v2 and Basic Pitch, both forms timed in alternation (5
        rounds, KernelBench, Intel's CPU runtime on 2 Zen 4 cores): 3x3 16 -> 16 at 256 x 256 2204 -> 1485 us,
        32 -> 16 4346 -> 2844, 64 -> 64 at 64 x 64 1772 -> 1505, U-Net's others 1.03-1.10x; the embedding's 1x3 /
        3x1 convs of 24-96 channels 0.83-1.26x (15 of 19 faster); Basic Pitch's 3 x 39 conv 8 -> 32 1.16x. Not
        taken: pointwise convs (0.87-1.01x: no padding to select away), one input slice (Basic Pitch's
        one-channel convs 0.75-1.13x, 1 -> 32 channels 0.79x), float4 accumulators (its 3 x 39 8 -> 8 in 4 x 2
        slices: 0.73x), FP16 storage (each lane a half converted on its own: the embedding's convs 0.43-1.00x,
        geomean 0.81x). The space has both forms wherever they differ. With them, a conv of 5-8 output channels
        takes 8 pixels of one float8 each: Basic Pitch's 3 x 39 conv 8 -> 8 over 172 x 264 ran 6.72 / 6.71 ms
        with the 4 x 2-slice float4 tile, 4.54 / 4.67 with 8 x 2 in float8s (an exhaustive search's best point, 7
        x 2, 4.58), 6.02 / 7.09 with that tile's float4 loads.

        A conv of at most 8 output channels over rows of SIGNAL_MIN_TAPS taps or more (an audio model's FIRs and
        wide windows) takes the signal form instead, its pixels along the lanes (``signal_default``).

        Winograd F(4x4,3x3) is off by default: alone, UNet-like 3x3 layers ran 1.1-1.6x faster than the
        direct kernel on the Intel CPU device, yet the whole UNet ran 5% slower with it (103 vs 109 ms, A/B
        in one process), so only a measurement in context should pick it.

        On a GPU (a sweep of 43 points x 59 pointwise and 33 depthwise kernels of five corpus models on an
        NVIDIA H100, bench/gpu_sweep.py): pointwise convs as a GEMM through local memory, 32 pixels x 8 output
        slices per work-group of one output each, 8 input slices per step: within 1.06x of each kernel's best
        point in geomean (1.25x at worst), where the CPU tiles above ran 3-10x slower (7x7 1024->1024: 439 vs
        43 us) for lack of work-items; a one-pixel pointwise conv (MobileNet v1's classifier) splits its sum
        over 32 work-items; other convs 2 strided pixels by one slice (MobileNet v1's stem 16.4 -> 11.3 us).
        From 128 input channels the GEMM's sum is shared by 4 work-items per output in groups of 16 pixels x 4
        slices (``k_split``): in a sweep of 15 MobileNet v1 / v2 pointwise shapes on an H100 (bench/gpu_sweep.py
        --pointwise, 17 points each) that point came within 1.07x of each shape's best in geomean (1.23x at worst)
        where the unsplit 32 x 8 tile was 1.53x off (2.76x): 7x7 960 -> 160 39.0 -> 16.5 us, 7x7 1024 -> 1024 42.0
        -> 21.9, 14x14 576 -> 96 26.8 -> 12.8; at 96 channels (14x14 96 -> 576) the unsplit tile stays ahead,
        12.8 against 14.4.
        """
        if shape.gpu:
            if shape.split_ok and not shape.direct_only and not shape.float_loads:
                return cls(tile_x=1, tile_s=1, lanes=4, vec_hint=None, split=32)
            if shape.pointwise and not shape.whole_pixel and not shape.direct_only:
                if shape.sin >= DEEP_GEMM_SLICES:
                    return cls(tile_x=1, tile_s=1, lanes=4, vec_hint=None, group_tile=(16, 4), k_chunk=8, k_split=4)
                return cls(tile_x=1, tile_s=1, lanes=4, vec_hint=None, group_tile=(32, 8), k_chunk=8)
            return cls(tile_x=2, tile_s=1, lanes=4, vec_hint=None, strided=True)
        if shape.signal_pixels and shape.kw >= SIGNAL_MIN_TAPS:  # (rows of many taps: output pixels along lanes)
            return cls(signal=signal_default(shape))
        # (a 16-lane device's windowed FP32 conv of 2+ input slices: its input lanes from memory, mem_lanes above)
        mem = shape.float_lanes >= 16 and shape.sin >= 2 and not (
            shape.float_loads or shape.dense_in or shape.pointwise or shape.fp16)
        if mem and shape.sout == 2:  # (8 output channels: one float8 a pixel, 8 pixels)
            return cls(tile_x=min(8, shape.row), tile_s=2, lanes=8, vec_hint="float8", mem_lanes=True)
        if shape.float_lanes >= 16 and shape.sout >= 4:
            if shape.pointwise and not shape.whole_pixel:
                tx, ts = pointwise_tile(shape.sin, shape.sout, shape.pixels)
                return cls(tile_x=tx, tile_s=ts, lanes=16, vec_hint="float16")
            if shape.sout == 4:  # (one accumulator per pixel: more pixels)
                return cls(tile_x=8, tile_s=4, lanes=16, vec_hint="float16", mem_lanes=mem)
            ts, lanes = slice_tile(shape.sout)
            return cls(tile_x=min(4, shape.row), tile_s=ts, lanes=lanes, vec_hint=f"float{lanes}", mem_lanes=mem)
        if shape.sout >= 4 and shape.sin >= 2:
            small = not ((shape.pixels >= 256 and shape.sin < 128) or shape.sout < 8)
            return cls(tile_x=2 if small else 4, tile_s=8 if small else 4, lanes=8, vec_hint="float8")
        if shape.sout >= 4:
            return cls(tile_x=2, tile_s=4)
        return cls(tile_x=4, tile_s=max(shape.sout, 1))

    @classmethod
    def space(cls, shape: ConvShape) -> dict[str, list]:
        """CONV_SPACE without the knobs that cannot change this conv's code: Winograd only for 3x3/s1
        undilated, __constant weights only for small filters, tiles no wider than the row / slices."""
        space = dict(CONV_SPACE)
        space["tile_x"] = [v for v in CONV_SPACE["tile_x"] if v == 1 or v < 2 * shape.row]
        space["tile_s"] = [v for v in CONV_SPACE["tile_s"] if v == 1 or v < 2 * shape.sout]
        if not shape.winograd_ok or shape.whole_pixel or shape.direct_only or shape.float_loads:
            del space["winograd"]
        if shape.w_bytes > CONST_WEIGHT_BYTES:
            del space["const_weights"]
        if not shape.split_ok or shape.direct_only or shape.float_loads:
            del space["split"]
        if not (shape.images and shape.gpu and shape.weight_texels <= IMAGE_ROW * IMAGE_ROW):  # (a GPU's variant)
            del space["image_weights"]
        if not (shape.fp16 and shape.gpu) or shape.whole_pixel or shape.float_loads:  # (a GPU's variant: a CPU runtime
            # emulates half)
            del space["half_math"]
        if not (shape.broadcast_ok and shape.gpu):  # (a GPU's variant)
            del space["broadcast"]
        if shape.float_loads or shape.dense_in:  # (loads of their own, which mem_lanes does not change)
            del space["mem_lanes"]
        if shape.gpu or not shape.signal_pixels:  # (a CPU's variant: a GPU's work-items have no such private memory)
            del space["signal"]
        else:
            space["signal"] = [0, *shape.signal_pixels]
        if shape.whole_pixel or shape.direct_only or not (shape.pointwise or shape.gpu):
            # (a conv with a window as an implicit GEMM: a GPU's variant, 3-10x slower than the direct kernel on a
            # CPU runtime in a sweep of UNet's convs, so a CPU's search does not spend its trials on it)
            del space["group_tile"], space["k_chunk"], space["k_split"], space["prefetch"]
        else:
            space["k_chunk"] = [v for v in CONV_SPACE["k_chunk"] if v == 4 or v < 2 * shape.depth]
            if not shape.gpu:  # (a GPU's variant: a CPU runtime's work-items are not what its sum waits on)
                del space["k_split"], space["prefetch"]
            else:
                space["k_split"] = group_shares(CONV_SPACE["group_tile"], shape.max_group)
        return space

    def problems(self, shape: ConvShape) -> list[str]:
        bad = positive_int("tile_x", self.tile_x) + positive_int("tile_s", self.tile_s)
        bad += one_of("vec_hint", self.vec_hint, CONV_SPACE["vec_hint"]) + work_group(self.local_size)
        bad += one_of("lanes", self.lanes, CONV_SPACE["lanes"])
        for name in ("strided", "const_weights", "winograd"):
            bad += one_of(name, getattr(self, name), (False, True))
        bad += self.lane_problems()
        if self.vec_hint in ("float8", "float16") and self.vec_hint != f"float{self.lanes}":
            bad.append(f"vec_hint {self.vec_hint} needs {self.vec_hint[5:]}-lane accumulators")
        if self.const_weights and shape.w_bytes > CONST_WEIGHT_BYTES:
            bad.append(f"__constant weights need a filter of at most {CONST_WEIGHT_BYTES} bytes, "
                       f"this one has {shape.w_bytes}")
        if self.winograd and not shape.winograd_ok:
            bad.append("Winograd needs a 3x3, stride 1, undilated conv")
        if shape.whole_pixel and (self.winograd or self.group_tile is not None):
            bad.append("a conv ranking its channels (CONV_ARG) runs the direct kernel: no Winograd, no group tile")
        if shape.dense and (self.winograd or self.group_tile is not None or self.split != 1):
            bad.append("a conv reading or writing a dense boundary buffer runs the direct kernel: no Winograd, "
                       "group tile or split sum")
        if shape.float_loads and (self.winograd or self.split != 1 or self.broadcast or self.half_math is True):
            bad.append("a conv transforming the values it loads (an input prologue, a gate's scale) runs the direct "
                       "kernel or the group tile in float: no Winograd, split sum, broadcast or FP16 arithmetic")
        if shape.prologue and self.group_tile is not None:
            bad.append("a conv applying an input prologue runs the direct kernel: no group tile")
        if shape.dense_out and (self.winograd or self.split != 1 or self.broadcast):
            bad.append("a conv writing a dense boundary buffer runs the direct kernel or the group tile: no "
                       "Winograd, split sum or broadcast")
        bad += positive_int("k_chunk", self.k_chunk) + one_of("split", self.split, CONV_SPACE["split"])
        bad += one_of("k_split", self.k_split, CONV_SPACE["k_split"])
        if self.k_split != 1 and self.group_tile is None:
            bad.append("k_split splits a group tile's sum: it needs a group_tile")
        bad += one_of("image_weights", self.image_weights, (False, True)) + one_of("half_math", self.half_math,
                                                                                  (False, True))
        if self.half_math is True:
            if not shape.fp16:
                bad.append(NEEDS_FP16_PLAN)
            others = [n for n in ("image_weights", "winograd") if getattr(self, n)]
            if others or shape.whole_pixel or self.split != 1:
                bad.append(f"FP16 arithmetic is the direct kernel's and the group tile's: not with "
                           f"{others or ['a channel rank / split']}")
        if self.image_weights is True:
            if not shape.images:
                bad.append("image weights need a device with image support")
            elif shape.weight_texels > IMAGE_ROW * IMAGE_ROW:
                bad.append(f"image weights of up to {shape.weight_texels} texels do not fit {IMAGE_ROW}x{IMAGE_ROW}")
            others = [n for n in ("const_weights", "winograd") if getattr(self, n)]
            if others or self.lanes != 4 or self.group_tile is not None or self.split != 1:
                bad.append(f"image weights are the direct kernel's with float4 accumulators: not with "
                           f"{others or ['lanes / group_tile / split']}")
        bad += one_of("broadcast", self.broadcast, CONV_SPACE["broadcast"]) + one_of("mem_lanes", self.mem_lanes,
                                                                                      (False, True))
        if self.broadcast and not bad:
            if not shape.broadcast_ok:
                bad.append("sub-group broadcasts need a pointwise conv (no channel rank, no dense boundary) on a "
                           "device with cl_khr_subgroups or cl_intel_subgroups")
            others = [n for n in ("strided", "const_weights", "winograd", "image_weights", "half_math")
                      if getattr(self, n)]
            if others or self.lanes != 4 or self.tile_s != 1 or self.group_tile is not None or self.split != 1 \
                    or self.local_size is not None:
                bad.append(f"a broadcast GEMM sets its own work-group, one output slice per work-item in float4: not "
                           f"with {others or ['lanes / tile_s / group_tile / split / local_size']}")
        bad += one_of("signal", self.signal, CONV_SPACE["signal"])
        if self.signal and not bad:
            if self.signal not in shape.signal_pixels:
                bad.append(f"the signal form needs rows of adjacent taps (undilated), at most 8 output channels, the "
                           f"input channels known, and a row's window of at most {SIGNAL_WINDOW_FLOATS} samples a "
                           f"work-item (signal={self.signal})")
            others = [n for n in ("winograd", "image_weights", "half_math") if getattr(self, n)]
            if others or self.group_tile is not None or self.split != 1 or self.broadcast:
                bad.append(f"the signal form reads its own weights (__constant ones with const_weights): not with "
                           f"{others or ['group_tile / split / broadcast']}")
        if self.split != 1 and not bad:
            if not shape.split_ok:
                bad.append("a split sum needs a pointwise conv of one pixel")
            others = [n for n in ("strided", "const_weights", "winograd") if getattr(self, n)]
            if others or self.lanes != 4 or self.group_tile is not None or self.local_size is not None:
                bad.append(f"a split sum sets its own work-group and float4 accumulators: not with "
                           f"{others or ['lanes / group_tile / local_size']}")
        if self.group_tile is not None:
            tile_bad = self.group_tile_problems(shape.max_group)
            if tile_bad is None:
                return bad + [f"group_tile={self.group_tile!r} is not None or 2 positive ints"]
            others = [n for n in ("strided", "const_weights", "winograd") if getattr(self, n)]
            others += ["lanes"] if self.lanes != 4 else []
            if others or self.local_size is not None or self.vec_hint in ("float8", "float16"):
                bad.append(f"a group tile sets its own work-group and layout: not with {others or ['local_size']}")
            bad += tile_bad
        return bad + self.prefetch_problems()


@dataclass(frozen=True)
class GroupStage:
    """How a group tile stages its input when it does not read the conv's input tensor: ``load(slice, pixel,
    var)`` is the code setting the float4 ``var`` to input slice ``slice`` of pixel ``pixel`` (C expressions;
    ``b`` is the image), and ``params`` the kernel parameters that code reads besides ``src`` (a fused depthwise
    conv, kernels.separable)."""

    params: str
    load: Callable[[str, str, str], str]


def tile_stores(*, tx: int, ts: int, per: int, px: Callable[[int], str], sout: int, oh: int, ow: int, act: int,
                ep_code: str, cout: int, st: str = "ST4(dst, oi, v);",
                after: Callable[[int, int], str] | None = None, dense: bool = False,
                half_acc: bool = False, wide_bias: bool = False) -> list[str]:
    """A register tile's stores: for each of its ``ts`` output slices from ``S`` (``per`` slices an accumulator
    ``acc{a}_{t}``) and ``tx`` pixels (``px(t)``: a pixel's C expression in the output row ``oy`` of image ``b``),
    bias, the fused activation, the epilogue and the store (``st``; ``dense``: into the dense NHWC float ``dst``
    instead); ``after(s, t)``: a line after each store; ``half_acc``: the accumulators are half vectors
    (converted to float for the bias and what follows). ``wide_bias``: the bias is added and the activation
    applied to each float8 / float16 accumulator whole, before its slices part (the caller pads the bias to
    ``ts`` slices, a multiple of ``per``, and ``S`` is a multiple of ``ts``): one vector op where there were
    ``per`` float4 ones (with 16 input channels a 1x1 conv's stores took as long as its sum)."""
    lines = []
    wide = wide_bias and per > 1 and not half_acc
    if wide:
        vt = f"float{4 * per}"
        for a in range(ts // per):
            lines.append(f"  {{ const {vt} bw = LD{4 * per}(bias, (S + {a * per}) / {per});")
            for t in range(tx):
                lines.append(f"    acc{a}_{t} += bw; " + activation(act, f"acc{a}_{t}", vt))
            lines.append("  }")
    for s in range(ts):
        part = "" if per == 1 else slice_part(s % per)
        lines.append(f"  if (S + {s} < {sout}) {{")
        if not wide:
            lines.append(f"    const float4 bv = LD4(bias, S + {s});")
        for t in range(tx):
            lines.append(f"    if ({px(t)} < {ow}) {{")
            acc = f"acc{s // per}_{t}{part}"
            if wide:
                lines.append(f"      float4 v = {acc};")
            else:
                lines.append(f"      float4 v = {f'convert_float4({acc})' if half_acc else acc} + bv;")
                lines.append("      " + activation(act, "v"))
            store = dense_store4("dst", f"((b * {oh} + oy) * {ow} + {px(t)}) * {cout}", cout, f"S + {s}", "v") \
                if dense else st
            lines.append("      " + _store(f"((b * {sout} + S + {s}) * {oh} + oy) * {ow} + {px(t)}", f"(S + {s})",
                                           ep_code, "" if dense else pad_lanes_mask(cout, f"(S + {s})", "v"), store))
            if after is not None:
                lines.append(after(s, t))
            lines.append("    }")
        lines.append("  }")
    return lines


def _conv_source(name, *, ih, iw, sin, oh, ow, sout, kh, kw, sh, sw, dh, dw, pt, pl, batch, tx, ts, act, cout,
                 strided=False, vec_hint: str | None = None, lanes: int = 4, epilogue=None,
                 const_weights: bool = False, arg: ChannelArg | None = None, dense_in: bool = False,
                 dense_out: bool = False, cin: int = 0, image_weights: bool = False, half_math: bool = False,
                 prologue=(), scale: bool = False, mem_lanes: bool = False, half_weights: bool = False) -> str:
    """The tiled conv kernel. A 1x1/stride-1/unpadded conv treats each image as one row of oh*ow pixels.

    ``vec_hint`` (default float4): tells the compiler the kernel is already vectorized. Intel's CPU
    runtime then stops vectorizing across work-items (which turns our float4 loads into gathers):
    1.0-2.0x faster per conv on this machine, never slower in a sweep of 5 shapes x 6 tiles.
    ``lanes``: output channels per accumulator vector (weights from ``weights_oi(w, lanes)``): 8 or 16 put two
    or four output slices in one float8 / float16, so each mad fills an 8- or 16-lane SIMD unit; ``ts`` a
    multiple of lanes / 4.
    ``strided``: work-item g takes pixels g, g + G, g + 2G... (G = the row's work-item count), so
    neighbouring work-items read neighbouring pixels; otherwise it takes tx adjacent pixels.
    ``arg``: a CONV_ARG's rank (``ChannelArg``): the work-item loops over the output slices ts at a time.
    ``dense_in``: the input is a dense NHWC float32 buffer of ``cin`` channels (a graph input's boundary
    buffer: no conversion pass before); ``dense_out``: so is the output (a graph output's: none after).
    ``prologue``: unary ops (graph.passes.Fused) applied to each input value loaded inside the image, in float
    (the padding stays zero: it pads their output). ``scale``: each input slice is multiplied by that slice of the
    image's gate ``gsc`` ([batch, slices], graph.passes.INPUT_SCALE: a squeeze-and-excitation gate's MUL) as it
    is loaded, in float (the padding's zeros stay zero). ``half_weights``: the weights are a "const16" argument
    (every value a half: a float16 model's), read with vload_half in a float32 kernel.
    """
    trivial = pixel_for_pixel(kh, kw, sh, sw, pt, pl, (ih, iw), (oh, ow))
    # the input lanes the sum takes: a single slice of fewer than 4 channels (an RGB stem) leaves the rest out
    # (they hold zeros): 3 mads per tap instead of 4, and its weights hold only those lanes (``weights_oi``)
    used = summed_lanes(cin)
    if trivial:  # one long row per image: more work-items along dim 0 for small maps
        ih, iw, oh, ow = 1, ih * iw, 1, oh * ow
    groups = (ow + tx - 1) // tx
    px = (lambda t: f"(X + {t} * {groups})") if strided else (lambda t: f"(X * {tx} + {t})")
    hint = f"__attribute__((vec_type_hint({vec_hint}))) " if vec_hint else ""
    per = lanes // 4  # output slices per accumulator
    if ts % per:
        raise ValueError(f"{lanes}-lane accumulators need a tile_s that is a multiple of {per}")
    # half_math: FP16 arithmetic (an FP16 plan's half tensors and weights read as half vectors, half accumulators)
    vt, nacc = f"{'half' if half_math else 'float'}{lanes}", ts // per
    # one output slice of fewer than 4 channels (a mask's, a heatmap's, a note's last conv) over whole input
    # slices: each output channel's sum is a dot product of each input slice with that channel's weights, cout
    # mads a slice and pixel where broadcasting each input lane took 4, and the lanes are summed after the loop
    narrow = cout < 4 and sout == 1 and nacc == 1 and per == 1 and used == 4 and arg is None and not half_math
    ep_code, ep_params = (epilogue.code, epilogue.params) if epilogue else ("", [])
    extra = "".join(f"{p}, " for p in ep_params)
    wdecl = "__read_only image2d_t wts" if image_weights else \
        f"{'__constant' if const_weights else '__global const'} {'half' if half_weights else 'STORE_T'}* wts"
    st = "ST4(dst, oi, v);"
    if arg is None:
        outs = "__global float* dst" if dense_out else "__global STORE_T* dst"
    else:
        sums = ("__global half* dst, " if arg.half_sums else "__global STORE_T* dst, ") if arg.sums else ""
        outs = sums + ("__global float* idx" if arg.dense else "__global STORE_T* idx")
        st = ("vstore_half4(v, oi, dst);" if arg.half_sums else st) if arg.sums else ""
    src_t = "float" if dense_in else "STORE_T"
    gate = "__global const STORE_T* gsc, " if scale else ""
    lines = [f"{hint}__kernel void {name}(__global const {src_t}* src, {gate}{wdecl},",
             f"                     __global const STORE_T* bias, {extra}{outs}) {{",
             "  const int X = get_global_id(0);",
             "  const int Y = get_global_id(1);",
             f"  if (X >= {groups} || Y >= {batch * oh}) return;",
             f"  const int b = Y / {oh}; const int oy = Y % {oh};"]
    if arg is None:
        lines.insert(4, f"  const int S = get_global_id(2) * {ts};")
    else:
        lines += [f"  {arg_init(arg.greater, f'best{t}', f'arg{t}')}" for t in range(tx)]
        lines.append(f"  for (int S = 0; S < {sout}; S += {ts}) {{")
    for a in range(nacc):
        for t in range(tx):
            lines += [f"  float4 dot{o}_{t} = (float4)(0.0f);" for o in range(cout)] if narrow else \
                [f"  {vt} acc{a}_{t} = ({vt})(0.0f);"]
    lines.append(f"  for (int ky = 0; ky < {kh}; ++ky) {{")
    lines.append(f"    const int iy = oy * {sh} - {pt} + ky * {dh};")
    if not trivial:
        lines.append(f"    if (iy < 0 || iy >= {ih}) continue;")
    lines.append(f"    for (int kx = 0; kx < {kw}; ++kx) {{")
    for t in range(tx):
        lines.append(f"      const int ix{t} = {px(t)} * {sw} - {pl} + kx * {dw};")
        if trivial:
            lines.append(f"      const bool ok{t} = {px(t)} < {ow};")
        else:
            lines.append(f"      const bool ok{t} = ix{t} >= 0 && ix{t} < {iw} && {px(t)} < {ow};")
    if dense_in:
        lines.append(f"      const int prow = (b * {ih} + iy) * {iw};")
    # lanes_from_memory: where every pixel of the tile lies inside the image (one branch a tap, the same for the
    # whole work-item), each input lane is loaded on its own and broadcast as it is loaded, instead of a float4
    # loaded and each of its lanes broadcast in registers (the same mads in the same order)
    lanes_from_memory = mem_lanes and not (dense_in or scale or prologue or half_math or narrow)
    if lanes_from_memory:
        lines.append(f"      if ({' && '.join(f'ok{t}' for t in range(tx))}) {{")
        lines += _conv_slice_loop(sin=sin, ih=ih, iw=iw, kh=kh, kw=kw, tx=tx, nacc=nacc, per=per, used=used,
                                  lanes=lanes, vt=vt, image_weights=image_weights, from_memory=True,
                                  half_weights=half_weights)
        lines.append("      } else {")
    lines += _conv_slice_loop(sin=sin, ih=ih, iw=iw, kh=kh, kw=kw, tx=tx, nacc=nacc, per=per, used=used, lanes=lanes,
                              vt=vt, image_weights=image_weights, dense_in=dense_in, cin=cin, scale=scale,
                              prologue=prologue, half_math=half_math, narrow=narrow, cout=cout,
                              half_weights=half_weights)
    if lanes_from_memory:
        lines.append("      }")
    lines += ["    }", "  }"]
    if narrow:
        for t in range(tx):
            sums = [f"dot(dot{o}_{t}, (float4)(1.0f))" for o in range(cout)] + ["0.0f"] * (4 - cout)
            lines.append(f"  const float4 acc0_{t} = (float4)({', '.join(sums)});")
    after = None if arg is None else (
        lambda s, t: "      " + arg_lanes("v", f"(S + {s})", cout, arg.greater, f"best{t}", f"arg{t}"))
    lines += tile_stores(tx=tx, ts=ts, per=per, px=px, sout=sout, oh=oh, ow=ow, act=act, ep_code=ep_code, cout=cout,
                         st=st, after=after, dense=dense_out, half_acc=half_math, wide_bias=True)
    if arg is not None:
        lines.append("  }")
        for t in range(tx):
            lines.append(f"  if ({px(t)} < {ow}) {{ {arg_pick(arg.greater, f'best{t}', f'arg{t}', 'first')}\n  "
                         + (f"idx[Y * {ow} + {px(t)}] = (float)first;" if arg.dense else
                            store_element(arg.out, f"Y * {ow} + {px(t)}", "(float)first", "idx")) + " }")
    lines.append("}")
    return (HALF_ARITHMETIC if half_math else "") + "\n".join(lines)


def _signal_source(name, *, ih, iw, cin, oh, ow, kh, kw, sh, sw, dh, pt, pl, batch, pixels, act, cout,
                   epilogue=None, dense_in=False, dense_out=False, const_weights=False) -> str:
    """A conv of few output channels along rows of adjacent taps, each input channel's row a signal
    (ConvShape.signal_ok): each work-item computes ``pixels`` adjacent output pixels of its row along the lanes of
    float16 accumulators, one per output channel and 16 pixels. For each row of the window and input channel, the
    row's samples it reads are staged once in a private array, split by the stride's phase, so that tap t's
    samples for 16 pixels (x * sw + t) are 16 adjacent values of phase t % sw: one vector load, then a broadcast
    weight and a mad for each output channel, a tap and 16 pixels, where the direct kernel loaded each pixel's
    float4 for a mad of its used lanes. The taps are taken phase by phase, each phase's loop unrolled
    SIGNAL_UNROLL steps (unrolling the phases too made a stride of 160 over 512 taps 13,672 lines, 6.3 s to
    build); the stores are the direct kernel's. Weights: [kh][cin][cout][kw] (``signal_weights``), in __constant
    memory with ``const_weights``."""
    taps = -(-kw // sw)  # steps of a phase's tap loop, at most
    phases = min(sw, kw)
    span = pixels + taps + SIGNAL_UNROLL  # staged samples a phase (the unrolled steps read past the last tap)
    vectors, sin = pixels // 16, (cin + 3) // 4
    ep_code, ep_params = (epilogue.code, epilogue.params) if epilogue else ("", [])
    extra = "".join(f"{p}, " for p in ep_params)
    src_t, out_t = ("float" if dense_in else "STORE_T"), ("float" if dense_out else "STORE_T")
    sample = (f"RND4((float4)(src[(row + i) * {cin} + ci])).x" if dense_in else
              "LD1(src, (row + i) * 4 + ci % 4)")
    row = f"(b * {ih} + iy) * {iw}" if dense_in else f"((b * {sin} + ci / 4) * {ih} + iy) * {iw}"
    lines = [f"__attribute__((vec_type_hint(float16))) __kernel void {name}(__global const {src_t}* src,",
             f"    {'__constant' if const_weights else '__global const'} STORE_T* wts, __global const STORE_T* bias, "
             f"{extra}__global {out_t}* dst) {{",
             "  const int X = get_global_id(0);",
             "  const int Y = get_global_id(1);",
             f"  if (X >= {-(-ow // pixels)} || Y >= {batch * oh}) return;",
             f"  const int b = Y / {oh}; const int oy = Y % {oh};",
             "  const int S = 0;",  # (the stores' output slice)
             f"  const int first = X * {pixels * sw} - {pl};"]
    lines += [f"  float16 a{c}_{v} = (float16)(0.0f);" for c in range(cout) for v in range(vectors)]
    lines += [f"  float win[{phases * span}];",
              f"  for (int ky = 0; ky < {kh}; ++ky) {{",
              f"    const int iy = oy * {sh} - {pt} + ky * {dh};",
              f"    if (iy < 0 || iy >= {ih}) continue;",
              f"    for (int ci = 0; ci < {cin}; ++ci) {{",
              f"      const int row = {row};",
              f"      const int wk = (ky * {cin} + ci) * {cout * kw};",
              f"      for (int r = 0; r < {phases}; ++r) {{",
              f"        for (int m = 0; m < {span}; ++m) {{",
              f"          const int i = first + r + m * {sw};",
              f"          win[r * {span} + m] = i >= 0 && i < {iw} ? {sample} : 0.0f;",
              "        }", "      }",
              f"      for (int r = 0; r < {phases}; ++r) {{",
              f"        for (int q = 0; q < {taps}; q += {SIGNAL_UNROLL}) {{"]
    guard = kw % sw or taps % SIGNAL_UNROLL
    for u in range(SIGNAL_UNROLL):
        lines.append(f"          {{ const int t = (q + {u}) * {sw} + r;")
        lines.append(f"            {'if (t < %d) ' % kw if guard else ''}{{")
        lines += [f"              const float16 w{c} = (float16)(LD1(wts, wk + {c * kw} + t));" for c in range(cout)]
        for v in range(vectors):
            lines.append(f"              const float16 x{v} = vload16(0, win + r * {span} + {16 * v + u} + q);")
            lines += [f"              a{c}_{v} = mad(x{v}, w{c}, a{c}_{v});" for c in range(cout)]
        lines.append("            }")
        lines.append("          }")
    lines += ["        }", "      }", "    }", "  }"]
    slices = -(-cout // 4)
    for s_ in range(slices):
        for t in range(pixels):
            lane = f"s{'0123456789abcdef'[t % 16]}"
            vals = [f"a{c}_{t // 16}.{lane}" for c in range(4 * s_, min(cout, 4 * s_ + 4))]
            vals += ["0.0f"] * (4 - len(vals))
            lines.append(f"  const float4 acc{s_}_{t} = (float4)({', '.join(vals)});")
    lines += tile_stores(tx=pixels, ts=slices, per=1, px=lambda t: f"(X * {pixels} + {t})", sout=slices, oh=oh,
                         ow=ow, act=act, ep_code=ep_code, cout=cout, dense=dense_out)
    lines.append("}")
    return "\n".join(lines)


def _conv_slice_loop(*, sin, ih, iw, kh, kw, tx, nacc, per, used, lanes, vt, image_weights, from_memory=False,
                     dense_in=False, cin=0, scale=False, prologue=(), half_math=False, narrow=False,
                     cout=4, half_weights=False) -> list[str]:
    """The direct conv's loop over the input slices at one tap (``_conv_source``'s arguments): each pixel's input
    slice loaded, each accumulator's weights, the mads. ``from_memory``: every pixel inside the image, each input
    lane read and broadcast from memory as the mad takes it (no float4 of the slice, no select)."""
    lines = [f"      for (int i = 0; i < {sin}; ++i) {{"]
    if not dense_in:
        lines.append(f"        const int row = ((b * {sin} + i) * {ih} + iy) * {iw};")
    if scale:
        lines.append(f"        const float4 g_ = LD4(gsc, b * {sin} + i);")
    xt = "half4" if half_math else "float4"
    for t in range(tx if not from_memory else 0):
        load = dense_load4("src", f"(prow + ix{t}) * {cin}", cin, "i") if dense_in else \
            f"LD4(src, row + ix{t})"
        if scale:
            load = f"{load} * g_"
        if prologue:  # (computed on the padding's zeros too, then selected away: no branch in the loop)
            lines.append(f"        float4 x{t} = ok{t} ? {load} : (float4)(0.0f); {unary_chain(prologue, f'x{t}')}")
            lines.append(f"        x{t} = ok{t} ? x{t} : (float4)(0.0f);")
            continue
        if half_math:  # (an FP16 plan: the tensor is half already; the dense input is rounded to half)
            load = f"convert_half4({load})" if dense_in else f"vload4(row + ix{t}, src)"
        lines.append(f"        const {xt} x{t} = ok{t} ? {load} : ({xt})(0.0f);")
    for a in range(nacc):
        group = f"S + {a}" if per == 1 else f"S / {per} + {a}"
        lines.append(f"        const int wb{a} = (((({group}) * {sin} + i) * {kh} + ky) * {kw} + kx) * {used};")
        for k in range(used):
            load = image_load("wts", f"wb{a} + {k}") if image_weights else \
                f"vload{lanes}(wb{a} + {k}, wts)" if half_math else \
                f"vload_half{lanes}(wb{a} + {k}, wts)" if half_weights else f"LD{lanes}(wts, wb{a} + {k})"
            lines.append(f"        const {vt} w{a}_{k} = {load};")
        if narrow:  # (channel o's weights over the slice's 4 input lanes: lane o of each input lane's row)
            for o in range(cout):
                lines.append(f"        const float4 wd{o} = (float4)({', '.join(f'w0_{k}.s{o}' for k in range(4))});")
                lines += [f"        dot{o}_{t} = mad(x{t}, wd{o}, dot{o}_{t});" for t in range(tx)]
            continue
        for t in range(tx):
            terms = f"acc{a}_{t}"
            for k in reversed(range(used)):
                lane = f"LD1(src, (row + ix{t}) * 4 + {k})" if from_memory else f"x{t}.s{k}"
                terms = f"mad(({vt})({lane}), w{a}_{k}, {terms})"
            lines.append(f"        acc{a}_{t} = {terms};")
    return lines + ["      }"]


def _group_stage_lines(sin: int, pixels: int, stage: GroupStage | None, half: bool = False, dest: str = "xs[e]",
                       k0: str = "k0") -> list[str]:
    """The group tile's statement staging input slice ``k0 + kc`` of pixel ``p`` into ``dest`` (zeros past the
    slices or pixels): read from ``src``, or computed by ``stage``; ``half``: as a half4 (``xs`` holds half)."""
    if stage is None:
        at = f"(b * {sin} + {k0} + kc) * {pixels} + p"
        load, zero = (f"vload4({at}, src)", "(half4)(0.0f)") if half else (f"LD4(src, {at})", "(float4)(0.0f)")
        return [f"      {dest} = ({k0} + kc < {sin} && p < {pixels}) ? {load} : {zero};"]
    return ["      float4 xv = (float4)(0.0f);",
            f"      if ({k0} + kc < {sin} && p < {pixels}) {{ {stage.load(f'{k0} + kc', 'p', 'xv')} }}",
            f"      {dest} = {'convert_half4(xv)' if half else 'xv'};"]


def scaled_stage(stage: GroupStage | None, *, sin: int, pixels: int, taps: int) -> GroupStage:
    """A group tile's staging multiplied by a gate (graph.passes.INPUT_SCALE: ``gsc``, [batch, slices]): slice k of
    ``stage``'s sum (a pointwise conv's input slice where None) is input slice k / ``taps``'s."""

    def load(slice_: str, pixel: str, var: str) -> str:
        base = stage.load(slice_, pixel, var) if stage is not None else \
            f"{var} = LD4(src, (b * {sin} + {slice_}) * {pixels} + {pixel});"
        return f"{base} {var} *= LD4(gsc, b * {sin} + ({slice_}) / {taps});"

    return GroupStage("__global const STORE_T* gsc, " + (stage.params if stage is not None else ""), load)


def im2col_stage(*, sin: int, ih: int, iw: int, ow: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int,
                 pt: int, pl: int, transposed: bool = False) -> GroupStage:
    """The group tile's staging of a conv with a window (an implicit GEMM): its sum runs over kh * kw * sin
    slices ``k = (i * kh + ky) * kw + kx`` (``weights_oi``'s order), and slice ``k`` of output pixel ``p`` is input
    slice ``i`` at the pixel tap (ky, kx) of ``p`` reads, zeros outside the image. ``transposed``: TRANSPOSE_CONV's
    gather form, where tap (ky, kx) of output pixel (oy, ox) reads input pixel ((oy + pt - ky) / sh, ...) if the
    stride divides that offset."""

    def load(slice_: str, pixel: str, var: str) -> str:
        head = (f"const int k_ = {slice_}; const int i_ = k_ / {kh * kw}; const int ky_ = (k_ / {kw}) % {kh}; "
                f"const int kx_ = k_ % {kw}; const int oy_ = ({pixel}) / {ow}; const int ox_ = ({pixel}) % {ow}; ")
        if transposed:
            tap = (f"const int ny_ = oy_ + {pt} - ky_; const int nx_ = ox_ + {pl} - kx_; "
                   f"const int iy_ = ny_ / {sh}; const int ix_ = nx_ / {sw}; "
                   f"if (ny_ >= 0 && nx_ >= 0 && ny_ % {sh} == 0 && nx_ % {sw} == 0 && iy_ < {ih} && ix_ < {iw}) ")
        else:
            tap = (f"const int iy_ = oy_ * {sh} - {pt} + ky_ * {dh}; const int ix_ = ox_ * {sw} - {pl} + kx_ * {dw}; "
                   f"if (iy_ >= 0 && iy_ < {ih} && ix_ >= 0 && ix_ < {iw}) ")
        return head + tap + f"{var} = LD4(src, ((b * {sin} + i_) * {ih} + iy_) * {iw} + ix_);"

    return GroupStage("", load)


@dataclass(frozen=True)
class Route:
    """One output of a group tile writing several (kernels.siblings: convs of one input as one GEMM): its output
    slices are the GEMM's ``s0``.. ``s0 + sout``, ``cout`` channels, stored as dense NHWC floats where ``dense``."""

    s0: int
    sout: int
    cout: int
    dense: bool = False


def _gemm_head(name: str, group: tuple[int, int, int], epilogue, params: str = "", dense: bool = False,
               routes: list[Route] | None = None) -> tuple[str, list[str]]:
    """A GEMM kernel's epilogue code and first lines: its work-group size and signature (``src``, ``params``: a
    stage's own, the weights, bias, the epilogue's parameters, ``dst``: dense NHWC floats where ``dense``; with
    ``routes``, ``dst0``, ``dst1``... one per route)."""
    ep_code, ep_params = (epilogue.code, epilogue.params) if epilogue else ("", [])
    extra = "".join(f"{p}, " for p in ep_params)
    if routes is None:
        dsts = f"__global {'float' if dense else 'STORE_T'}* dst"
    else:
        dsts = ", ".join(f"__global {'float' if r.dense else 'STORE_T'}* dst{k}" for k, r in enumerate(routes))
    return ep_code, [f"__attribute__((reqd_work_group_size({group[0]}, {group[1]}, {group[2]})))",
                     f"__kernel void {name}(__global const STORE_T* src, {params}__global const STORE_T* wts,",
                     f"                     __global const STORE_T* bias, {extra}{dsts}) {{"]


def _routed_store(routes: list[Route], s_expr: str, b: str, p: str, pixels: int) -> str:
    """The statements storing the float4 ``v`` of GEMM slice ``s_expr`` (image ``b``, pixel ``p`` of ``pixels``)
    into the route whose slices hold it, at its own slice and layout (the lanes past its channels zeroed, or not
    stored where it is dense)."""
    branches = []
    for k, r in enumerate(routes):
        sl = f"({s_expr} - {r.s0})"
        if r.dense:
            st = _store(f"({b} * {r.sout} + {sl}) * {pixels} + {p}", sl, "", "",
                        dense_store4(f"dst{k}", f"({b} * {pixels} + {p}) * {r.cout}", r.cout, sl, "v"))
        else:
            st = _store(f"({b} * {r.sout} + {sl}) * {pixels} + {p}", sl, "", pad_lanes_mask(r.cout, sl, "v"),
                        f"ST4(dst{k}, oi, v);")
        last = k == len(routes) - 1
        branches.append(st if last else f"if ({s_expr} < {r.s0 + r.sout}) {st}")
    return " else ".join(branches)


def _group_tile_source(name, *, pixels, sin, sout, batch, tx, ts, lx, ls, kc, act, cout, epilogue=None,
                       stage: GroupStage | None = None, half_math: bool = False, ks: int = 1,
                       prefetch: bool = False, dense: bool = False, routes: list[Route] | None = None) -> str:
    """A conv as a GEMM with local memory (``ConvKnobs.group_tile``; ``stage``: how it reads its input, the
    input slices of a pointwise conv by default): a work-group of lx x ls
    work-items covers lx*tx pixels by ls*ts output slices; per step it stages kc input slices of those pixels and
    the matching weights (``weights_oi4`` padded to ls*ts output slices) in local memory, every work-item loading
    its share, and each work-item accumulates tx pixels (lx apart) by ts slices from there. ``half_math`` (an FP16
    plan): the tiles are staged as half4 (half the local memory traffic) and the sums are half accumulators;
    bias, activation and what follows in float. ``ks`` (``ConvKnobs.k_split``): ks work-items (the work-group's
    dimension 1) share each output's sum, the group staging ks * kc slices per step and share z summing slices
    z*kc.. of them; at the end each adds its sums to local memory, and share 0 adds them up and stores.
    ``prefetch`` (``ConvKnobs.prefetch``): each work-item reads its share of the next step into registers before it
    sums the staged one, and stores them into local memory after the step's second barrier, so that a step's reads
    from global memory (or its stage's computation) overlap the sums instead of preceding them. ``routes``: the GEMM's
    output slices go to several outputs (``Route``; no epilogue), else to ``dst``."""
    px, so, nt = lx * tx, ls * ts, lx * ls
    vt = "half4" if half_math else "float4"
    zero = f"({vt})(0.0f)"
    wload = (lambda at: f"vload4({at}, wts)") if half_math else (lambda at: f"LD4(wts, {at})")
    ep_code, head = _gemm_head(name, (lx, ks, ls), epilogue, stage.params if stage else "", dense, routes)
    if ks == 1:
        lines = [*head,
                 f"  __local {vt} xs[{kc * px}];",
                 f"  __local {vt} ws[{so * kc * 4}];",
                 "  const int lx = get_local_id(0); const int ls = get_local_id(2);",
                 f"  const int lid = ls * {lx} + lx;",
                 f"  const int p0 = get_group_id(0) * {px}; const int S0 = get_group_id(2) * {so};",
                 "  const int b = get_global_id(1);"]
    else:
        staged = ks * kc * (px + so * 4)
        lines = [*head,
                 f"  __local {vt} lm[{max(staged, ks * nt * ts * tx)}];",
                 f"  __local {vt}* xs = lm; __local {vt}* ws = lm + {ks * kc * px};",
                 "  const int lx = get_local_id(0); const int kz = get_local_id(1); const int ls = get_local_id(2);",
                 f"  const int lid = (kz * {ls} + ls) * {lx} + lx;",
                 f"  const int p0 = get_group_id(0) * {px}; const int S0 = get_group_id(2) * {so};",
                 "  const int b = get_group_id(1);"]
    for a in range(ts):
        for t in range(tx):
            lines.append(f"  {vt} acc{a}_{t} = {zero};")
    step, items, wsize = ks * kc, nt * ks, so * kc * 4
    # (share kz's slice kc of a step, in the staged input and weights; ks == 1: the code from before there were shares)
    k_at, w_at = ("kc", "") if ks == 1 else (f"(kz * {kc} + kc)", f"kz * {wsize} + ")
    if ks == 1:
        w_index = f"const int o = e / {kc * 4}; const int kc = (e / 4) % {kc};"
    else:  # (share z's weights: ws[z * wsize..], each output slice's kc slices in a row as without shares)
        w_index = f"const int o = (e % {wsize}) / {kc * 4}; const int kc = e / {wsize} * {kc} + (e / 4) % {kc};"

    def w_stage(dest: str, k0: str) -> str:
        return f"      {dest} = {k0} + kc < {sin} ? {wload(f'((S0 + o) * {sin} + {k0} + kc) * 4 + e % 4')} : {zero};"

    if not prefetch:
        lines += [f"  for (int k0 = 0; k0 < {sin}; k0 += {step}) {{",
                  f"    for (int e = lid; e < {step * px}; e += {items}) {{",
                  f"      const int kc = e / {px}; const int p = p0 + e % {px};",
                  *_group_stage_lines(sin, pixels, stage, half_math),
                  "    }",
                  f"    for (int e = lid; e < {ks * wsize}; e += {items}) {{",
                  f"      {w_index}",
                  w_stage("ws[e]", "k0"),
                  "    }",
                  "    barrier(CLK_LOCAL_MEM_FENCE);"]
    else:  # (a step's share of each work-item in registers rx* / rw*: read one step ahead)
        nx, nw = -(-step * px // items), -(-ks * wsize // items)

        def each(n: int, total: int, body) -> list[str]:
            out = []
            for i in range(n):
                guard = f"if (e < {total}) " if (i + 1) * items > total else ""
                out += [f"    {{ const int e = lid + {i * items}; {guard}{{", *body(i), "    } }"]
            return out

        def reads(k0: str) -> list[str]:
            return (each(nx, step * px, lambda i: [f"      const int kc = e / {px}; const int p = p0 + e % {px};",
                                                   *_group_stage_lines(sin, pixels, stage, half_math, f"rx{i}", k0)])
                    + each(nw, ks * wsize, lambda i: [f"      {w_index}", w_stage(f"rw{i}", k0)]))

        lines += [f"  {vt} " + ", ".join(f"rx{i} = {zero}" for i in range(nx)) + ";",
                  f"  {vt} " + ", ".join(f"rw{i} = {zero}" for i in range(nw)) + ";",
                  *reads("0"),
                  f"  for (int k0 = 0; k0 < {sin}; k0 += {step}) {{",
                  *each(nx, step * px, lambda i: [f"      xs[e] = rx{i};"]),
                  *each(nw, ks * wsize, lambda i: [f"      ws[e] = rw{i};"]),
                  "    barrier(CLK_LOCAL_MEM_FENCE);",
                  f"    const int knext = k0 + {step};",
                  f"    if (knext < {sin}) {{",
                  *reads("knext"),
                  "    }"]
    lines.append(f"    for (int kc = 0; kc < {kc}; ++kc) {{")
    for t in range(tx):
        lines.append(f"      const {vt} x{t} = xs[{k_at} * {px} + lx + {t * lx}];")
    for a in range(ts):
        lines.append(f"      const int wb{a} = {w_at}((ls * {ts} + {a}) * {kc} + kc) * 4;")
        lines.append(f"      const {vt} w{a}_0 = ws[wb{a}], w{a}_1 = ws[wb{a} + 1], w{a}_2 = ws[wb{a} + 2], "
                     f"w{a}_3 = ws[wb{a} + 3];")
        for t in range(tx):
            lines.append(f"      acc{a}_{t} = mad(({vt})(x{t}.x), w{a}_0, mad(({vt})(x{t}.y), w{a}_1, "
                         f"mad(({vt})(x{t}.z), w{a}_2, mad(({vt})(x{t}.w), w{a}_3, acc{a}_{t}))));")
    lines += ["    }", "    barrier(CLK_LOCAL_MEM_FENCE);", "  }"]
    if ks > 1:  # the shares' sums: each its own, then share 0 adds the others' (the staging is done with)
        lines += [f"  lm[lid * {ts * tx} + {a * tx + t}] = acc{a}_{t};" for a in range(ts) for t in range(tx)]
        lines += ["  barrier(CLK_LOCAL_MEM_FENCE);", "  if (kz != 0) return;",
                  f"  for (int z = 1; z < {ks}; ++z) {{"]
        lines += [f"    acc{a}_{t} += lm[(z * {nt} + lid) * {ts * tx} + {a * tx + t}];"
                  for a in range(ts) for t in range(tx)]
        lines.append("  }")
    for a in range(ts):
        s_expr = f"(S0 + ls * {ts} + {a})"
        lines.append(f"  if ({s_expr} < {sout}) {{")
        lines.append(f"    const float4 bv = LD4(bias, {s_expr});")
        for t in range(tx):
            p = f"(p0 + lx + {t * lx})"
            lines.append(f"    if ({p} < {pixels}) {{")
            lines.append(f"      float4 v = {f'convert_float4(acc{a}_{t})' if half_math else f'acc{a}_{t}'} + bv;")
            lines.append("      " + activation(act, "v"))
            if routes is not None:
                lines.append("      " + _routed_store(routes, s_expr, "b", p, pixels))
            elif dense:  # (a graph output's dense NHWC float buffer: lanes past cout not stored)
                lines.append("      " + _store(f"(b * {sout} + {s_expr}) * {pixels} + {p}", s_expr, ep_code, "",
                                               dense_store4("dst", f"(b * {pixels} + {p}) * {cout}", cout, s_expr,
                                                            "v")))
            else:
                lines.append("      " + _store(f"(b * {sout} + {s_expr}) * {pixels} + {p}", s_expr, ep_code,
                                               pad_lanes_mask(cout, s_expr, "v")))
            lines.append("    }")
        lines.append("  }")
    lines.append("}")
    return (HALF_ARITHMETIC if half_math else "") + "\n".join(lines)


def _broadcast_source(name, *, pixels, sin, sout, batch, tx, ls, act, cout, extension: str, epilogue=None) -> str:
    """A pointwise conv as a GEMM sharing its input through sub-group broadcasts (``ConvKnobs.broadcast``): a
    work-group of ls work-items along the output slices (dimension 0, along which runtimes form their sub-groups),
    one slice each, all at the same tx adjacent pixels of one image. Per step each work-item of a sub-group loads
    one input slice of those pixels (the sub-group's size of them: a float4 per pixel), and each such slice is
    broadcast to every work-item in turn, which multiplies it with its own output slice's weights (``weights_oi4``
    padded to ls output slices: every work-item, past the output's slices too, takes part in every broadcast)."""
    ep_code, head = _gemm_head(name, (ls, 1, 1), epilogue)
    L = [f"#pragma OPENCL EXTENSION {extension} : enable", *head,
         f"  const int S = get_global_id(0); const int X = get_global_id(1) * {tx}; const int b = get_global_id(2);",
         "  const int lane = (int)get_sub_group_local_id(); const int sg = (int)get_sub_group_size();"]
    L += [f"  float4 acc{t} = (float4)(0.0f);" for t in range(tx)]
    L += [f"  for (int k0 = 0; k0 < {sin}; k0 += sg) {{",
          f"    const int mine = (b * {sin} + k0 + lane) * {pixels} + X;",
          f"    const bool in = k0 + lane < {sin};"]
    L += [f"    const float4 x{t} = (in && X + {t} < {pixels}) ? LD4(src, mine + {t}) : (float4)(0.0f);"
          for t in range(tx)]
    L += [f"    const int kn = min(sg, {sin} - k0);",
          "    for (int j = 0; j < kn; ++j) {",
          f"      const int wb = (S * {sin} + k0 + j) * 4;",
          "      const float4 w0 = LD4(wts, wb), w1 = LD4(wts, wb + 1), w2 = LD4(wts, wb + 2), w3 = LD4(wts, wb + 3);"]
    for t in range(tx):
        L.append(f"      acc{t} = mad((float4)(sub_group_broadcast(x{t}.x, (uint)j)), w0, "
                 f"mad((float4)(sub_group_broadcast(x{t}.y, (uint)j)), w1, "
                 f"mad((float4)(sub_group_broadcast(x{t}.z, (uint)j)), w2, "
                 f"mad((float4)(sub_group_broadcast(x{t}.w, (uint)j)), w3, acc{t}))));")
    L += ["    }", "  }", f"  if (S >= {sout}) return;", "  const float4 bv = LD4(bias, S);"]
    for t in range(tx):
        L += [f"  if (X + {t} < {pixels}) {{",
              f"    float4 v = acc{t} + bv;",
              "    " + activation(act, "v"),
              "    " + _store(f"(b * {sout} + S) * {pixels} + X + {t}", "S", ep_code, pad_lanes_mask(cout, "S", "v")),
              "  }"]
    L.append("}")
    return "\n".join(L)


def group_tile_grid(*, pixels: int, batch: int, sout: int, lx: int, ls: int, tx: int, ts: int, ks: int = 1) -> tuple:
    """(global size, work-group, output slices the weights and bias are padded to) of a ``_group_tile_source``
    kernel: whole work-groups of lx x ks x ls covering the pixels (tx each) and output slices (ts each) of each
    image (ks: the shares of each sum, ``ConvKnobs.k_split``)."""
    return (-(-pixels // (lx * tx)) * lx, batch * ks, -(-sout // (ls * ts)) * ls), (lx, ks, ls), ls * ts


def conv_grid(*, ow, oh, pointwise: bool, batch, tx, ts, sout) -> tuple[int, int, int]:
    """``_conv_source``'s grid; ``pointwise``: the conv is pixel for pixel (``ops.attributes.pixel_for_pixel``), one
    row of oh*ow pixels per image."""
    if pointwise:
        ow, oh = oh * ow, 1
    return ((ow + tx - 1) // tx, batch * oh, (sout + ts - 1) // ts)


@generator("CONV_2D")
def conv2d(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    return _conv_kernels(ctx, None)


@generator(CONV_ARG)
def conv_arg(ctx: GenContext) -> list[KernelSpec]:
    """A CONV_2D and the ARG_MAX / ARG_MIN over its channels (graph.conv_arg) as one kernel."""
    sums = ctx.op.outputs[0]
    require_float(ctx, ctx.input_tensor(0), ctx.output_tensor(0) if sums >= 0 else None)
    greater, out = channel_arg(ctx, ctx.op.options["arg"], ctx.output_tensor(1), ctx.input_tensor(1).shape[0])
    return _conv_kernels(ctx, ChannelArg(greater, out, sums >= 0, sums in ctx.half_outputs))


def _conv_kernels(ctx: GenContext, arg: ChannelArg | None) -> list[KernelSpec]:
    x_t = ctx.input_tensor(0)
    w = _float_const(ctx, 1)
    n, ih, iw, cin = ctx.layout(x_t).dims
    cout, kh, kw, icg = w.shape
    if icg != cin:
        raise Unsupported("grouped convolution")
    sh, sw, dh, dw, oh, ow, pt, pl = _geometry(ctx, ih, iw, kh, kw)
    sin, sout = (cin + 3) // 4, (cout + 3) // 4
    trivial = pixel_for_pixel(kh, kw, sh, sw, pt, pl, (ih, iw), (oh, ow))
    prologue = ctx.op.options.get(PROLOGUE) or ()  # (graph.passes.fuse_input_prologue)
    scale = ctx.op.options.get(INPUT_SCALE)  # (graph.passes.fold_gate_scales: the gate's tensor)
    shape = ConvShape(kh, kw, sh, sw, dh, dw, sin, sout, row=oh * ow if trivial else ow, pixels=oh * ow,
                      w_bytes=w.size * (2 if ctx.fp16 else 4), pointwise=trivial, whole_pixel=arg is not None,
                      float_lanes=ctx.target.float_lanes, gpu=ctx.target.gpu, images=ctx.target.images,
                      fp16=ctx.fp16, subgroups=ctx.target.subgroups, max_group=ctx.target.max_group,
                      prologue=bool(prologue), scaled=scale is not None, cin=cin)
    # a boundary tensor read / written densely where the plan asks and the default is the direct kernel anyway (a
    # GPU's group-tiled or split pointwise conv keeps its form and the conversion pass; a CONV_ARG writes its own
    # outputs, but reads its input as the direct conv does)
    base = ConvKnobs.default(shape)
    direct = base.group_tile is None and base.split == 1 and not base.winograd
    # (a GPU's group tile writes a graph output densely too: PoseNet's heads, with no conversion pass after them)
    gemm = base.group_tile is not None and base.split == 1 and not base.winograd and not base.broadcast
    dense_in = direct and ctx.op.inputs[0] in ctx.dense
    dense_out = (direct or gemm) and arg is None and ctx.final_output in ctx.dense
    if arg is not None and direct and ctx.op.outputs[1] in ctx.dense:  # (the rank, a graph output: written densely)
        arg = replace(arg, dense=True)
    shape = replace(shape, dense=dense_in or (dense_out and direct) or (arg is not None and arg.dense),
                    dense_out=dense_out and not direct, dense_in=dense_in)
    knobs = ConvKnobs.resolve(shape, ctx.params)
    bias = _bias_const(ctx, 2, cout)
    if knobs.winograd:
        return _winograd(ctx, knobs, shape, w, bias, n=n, ih=ih, iw=iw, sin=sin, oh=oh, ow=ow, sout=sout, pt=pt,
                         pl=pl, cin=cin, cout=cout)
    tx, ts = knobs.tile_x, knobs.tile_s
    ep = ctx.epilogue_code(cout)
    act = ctx.opt("fused_activation_function", 0)
    outs = [ctx.final_output] if arg is None else [t for t in ctx.op.outputs if t >= 0]
    dense = ([ctx.op.inputs[0]] if dense_in else []) + (outs if dense_out else [])
    flops = 2 * n * oh * ow * cout * kh * kw * cin
    if knobs.signal:
        src = _signal_source(ctx.name, ih=ih, iw=iw, cin=cin, oh=oh, ow=ow, kh=kh, kw=kw, sh=sh, sw=sw, dh=dh, pt=pt,
                             pl=pl, batch=n, pixels=knobs.signal, act=act, cout=cout, epilogue=ep,
                             dense_in=dense_in, dense_out=dense_out, const_weights=knobs.const_weights)
        gsize = (-(-ow // knobs.signal), n * oh, 1)
        return [KernelSpec(ctx.name, src, gsize, fitted(gsize, knobs.local_size), [
            Arg("tensor", ctx.op.inputs[0]), Arg("const", signal_weights(w)),
            Arg("const", vec_slices(bias, cout)), *ep.args, *(Arg("tensor", t) for t in outs)],
            [ctx.op.inputs[0], *ep.inputs], outs, knobs.params(), space=ConvKnobs.space(shape), flops=flops,
            dense=frozenset(dense))]
    if knobs.split > 1:
        src = _fc_split_source(ctx.name, sin=sin, sout=sout, ts=ts, split=knobs.split, act=act, cout=cout,
                               epilogue=ep)  # (one pixel: the slice layout is FULLY_CONNECTED's [batch, slice])
        gsize, local, pad = (knobs.split, n, -(-sout // ts)), (knobs.split, 1, 1), ts
        in_lanes = 4  # (the GEMM forms' weight rows are whole slices)
    elif knobs.broadcast:
        ls = knobs.broadcast
        src = _broadcast_source(ctx.name, pixels=oh * ow, sin=sin, sout=sout, batch=n, tx=tx, ls=ls, act=act,
                                cout=cout, extension=shape.subgroups, epilogue=ep)
        gsize, local, pad = (-(-sout // ls) * ls, -(-oh * ow // tx), n), (ls, 1, 1), ls
        in_lanes = 4
    elif knobs.group_tile is not None:
        lx, ls = knobs.group_tile
        stage = None if trivial else im2col_stage(sin=sin, ih=ih, iw=iw, ow=ow, kh=kh, kw=kw, sh=sh, sw=sw, dh=dh,
                                                  dw=dw, pt=pt, pl=pl)
        if scale is not None:
            stage = scaled_stage(stage, sin=sin, pixels=oh * ow, taps=kh * kw)
        src = _group_tile_source(ctx.name, pixels=oh * ow, sin=sin * kh * kw, sout=sout, batch=n, tx=tx, ts=ts,
                                 lx=lx, ls=ls, kc=knobs.k_chunk, act=act, cout=cout, epilogue=ep, stage=stage,
                                 half_math=knobs.half_math, ks=knobs.k_split, prefetch=knobs.prefetch,
                                 dense=dense_out)
        gsize, local, pad = group_tile_grid(pixels=oh * ow, batch=n, sout=sout, lx=lx, ls=ls, tx=tx, ts=ts,
                                            ks=knobs.k_split)
        in_lanes = 4
    else:
        src = _conv_source(ctx.name, ih=ih, iw=iw, sin=sin, oh=oh, ow=ow, sout=sout, kh=kh, kw=kw, sh=sh, sw=sw,
                           dh=dh, dw=dw, pt=pt, pl=pl, batch=n, tx=tx, ts=ts, act=act, cout=cout,
                           strided=knobs.strided, vec_hint=knobs.vec_hint, lanes=knobs.lanes, epilogue=ep,
                           const_weights=knobs.const_weights, arg=arg, dense_in=dense_in,
                           dense_out=dense_out, cin=cin, image_weights=knobs.image_weights,
                           half_math=knobs.half_math, prologue=prologue, scale=scale is not None,
                           mem_lanes=knobs.mem_lanes)
        gsize = conv_grid(ow=ow, oh=oh, pointwise=trivial, batch=n, tx=tx, ts=ts, sout=sout)
        if arg is not None:  # (one work-item runs over every slice group)
            gsize = gsize[:2] + (1,)
        local, pad = fitted(gsize, knobs.local_size), ts
        in_lanes = summed_lanes(cin)  # (its weights hold only the lanes its sum takes: _conv_source's ``used``)
    wts = weights_oi(w, knobs.lanes, pad, in_lanes)
    if arg is not None and arg.dense:
        dense.append(ctx.op.outputs[1])
    gate = [] if scale is None else [scale]
    return [KernelSpec(ctx.name, src, gsize, local, [
        Arg("tensor", ctx.op.inputs[0]), *(Arg("tensor", t) for t in gate),
        Arg("image" if knobs.image_weights else "const", wts),
        Arg("const", vec_slices(bias, cout, pad)), *ep.args, *(Arg("tensor", t) for t in outs)],
        [ctx.op.inputs[0], *gate, *ep.inputs], outs, knobs.params(), space=ConvKnobs.space(shape),
        flops=flops, dense=frozenset(dense))]


DEPTHWISE_SLICES = (1, 2, 4)  # output slices per work-item, in float4 / float8 / float16 math


@dataclass(frozen=True)
class DepthwiseKnobs(Knobs):
    tile_x: int = 4  # adjacent output pixels per work-item
    vec_hint: str | None = "float4"
    local_size: tuple | None = None
    # output slices per work-item, side by side in one float8 / float16 (channel multiplier 1 only): fills an 8- or
    # 16-lane SIMD unit
    slices: int = 1

    @classmethod
    def default(cls, shape: DepthwiseShape) -> DepthwiseKnobs:
        """4 pixels per work-item; two slices in float8 math where the channel multiplier is 1: MobileNet v2's 17
        depthwise layers took 1.34 ms instead of 2.23 (kernel time, Intel CPU device on a Zen 4, whose 512-bit
        units are 256 bits wide; 1 or 8 pixels, or no hint, were slower). Four slices in float16 math where the
        device's float vector is 16 wide (a Zen 5's full-width AVX-512): 0.64 ms instead of 0.82, same run.
        On a GPU, one pixel of one slice per work-item: within 1.04x of each kernel's best of 12 points in
        geomean (33 kernels of five corpus models on an NVIDIA H100, bench/gpu_sweep.py), 4 pixels x 2 slices
        1.45x slower."""
        if shape.gpu:
            return cls(tile_x=1, slices=1, vec_hint=None)
        slices = 1
        if shape.mult == 1 and shape.sout >= 2:
            slices = 4 if shape.float_lanes >= 16 and shape.sout >= 4 else 2
        return cls(tile_x=4 if shape.ow >= 4 else 1, slices=slices,
                   vec_hint="float4" if slices == 1 else f"float{4 * slices}")

    @classmethod
    def space(cls, shape: DepthwiseShape) -> dict[str, list]:
        space = {"tile_x": [v for v in (1, 2, 4, 8) if v == 1 or v < 2 * shape.ow],
                 "vec_hint": [None, "float4", "float8", "float16"], "local_size": [None, (8, 1, 1), (16, 1, 1), (8, 4, 1)],
                 "slices": [v for v in DEPTHWISE_SLICES if v == 1 or v < 2 * shape.sout]}
        if shape.mult != 1 or shape.sout < 2:
            space["vec_hint"], space["slices"] = [None, "float4"], [1]
        return space

    def problems(self, shape: DepthwiseShape) -> list[str]:
        bad = positive_int("tile_x", self.tile_x) + \
            one_of("vec_hint", self.vec_hint, (None, "float4", "float8", "float16")) + \
            work_group(self.local_size) + one_of("slices", self.slices, DEPTHWISE_SLICES)
        if self.vec_hint in ("float8", "float16") and self.vec_hint != f"float{4 * self.slices}":
            bad.append(f"vec_hint {self.vec_hint} needs {int(self.vec_hint[5:]) // 4} slices per work-item")
        if self.slices > 1 and shape.mult != 1:
            bad.append(f"{self.slices} slices per work-item need a channel multiplier of 1")
        return bad


@dataclass(frozen=True)
class DepthwiseShape:
    """What the depthwise knobs depend on: output width, output slices, channel multiplier, the device's float
    vector width."""

    ow: int
    sout: int = 1
    mult: int = 1
    float_lanes: int = Target.float_lanes
    gpu: bool = Target.gpu


def depthwise_weights(w: np.ndarray, per: int) -> np.ndarray:
    """A depthwise filter [1, kh, kw, cout] as [S / per][kh][kw] float4 (float8 / float16 for ``per`` 2 / 4 slices:
    the slices' lanes side by side), the slices padded to a multiple of ``per``."""
    _, kh, kw, cout = w.shape
    groups = -(-cout // (4 * per))
    wk = np.zeros((groups * 4 * per, kh, kw), np.float32)
    wk[:cout] = w[0].transpose(2, 0, 1)
    return np.ascontiguousarray(wk.reshape(groups, 4 * per, kh, kw).transpose(0, 2, 3, 1)).reshape(-1)


@generator("DEPTHWISE_CONV_2D")
def depthwise_conv2d(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    w = _float_const(ctx, 1)
    n, ih, iw, cin = ctx.layout(x_t).dims
    _, kh, kw, cout = w.shape
    mult = cout // cin if cin else 0
    if mult * cin != cout:
        raise Unsupported("output channels not a multiple of input channels")
    sh, sw, dh, dw, oh, ow, pt, pl = _geometry(ctx, ih, iw, kh, kw)
    sin, sout = (cin + 3) // 4, (cout + 3) // 4
    shape = DepthwiseShape(ow, sout, mult, ctx.target.float_lanes, ctx.target.gpu)
    knobs = DepthwiseKnobs.resolve(shape, ctx.params)
    tx, per = knobs.tile_x, knobs.slices
    bias = _bias_const(ctx, 2, cout)
    groups = (sout + per - 1) // per
    wk = depthwise_weights(w, per)
    ep = ctx.epilogue_code(cout)
    head = [(f"__attribute__((vec_type_hint({knobs.vec_hint}))) " if knobs.vec_hint else "")
            + f"__kernel void {ctx.name}(__global const STORE_T* src, __global const STORE_T* wts,",
            (f"                     __global const STORE_T* bias, {''.join(f'{p}, ' for p in ep.params)}"
             "__global STORE_T* dst) {")]
    geometry = {"n": n, "ih": ih, "iw": iw, "kh": kh, "kw": kw, "sh": sh, "sw": sw, "dh": dh, "dw": dw, "oh": oh,
                "ow": ow, "pt": pt, "pl": pl, "cout": cout, "sout": sout, "tx": tx, "ep": ep,
                "act": ctx.opt("fused_activation_function", 0)}
    # the output as a dense NHWC float32 buffer where the plan asks (KernelSpec.dense) and its slices, pixel by
    # pixel, are that order: whole slices, FP32 storage, fused ops reading nothing at the output's index; the input
    # so where the plan hands it over from another step (runtime.selection.hand_over: not a graph input, which keeps
    # its conversion), whole slices, a channel multiplier of 1
    dense = (ctx.final_output in ctx.dense and cout % 4 == 0 and not ep.inputs and not ctx.fp16
             and ctx.final_output not in ctx.half_outputs)
    x = ctx.op.inputs[0]
    dense_in = handed_over(ctx, x, cin) and mult == 1 and sout % per == 0
    geometry["dense"], geometry["dense_in"] = dense, dense_in
    body = (_depthwise_groups(per=per, **geometry) if per > 1 else
            _depthwise_slices(cin=cin, sin=sin, mult=mult, **geometry))
    grid = ((ow + tx - 1) // tx, n * oh, groups)
    return [KernelSpec(ctx.name, "\n".join(head + body), grid, fitted(grid, knobs.local_size), [
        Arg("tensor", ctx.op.inputs[0]), Arg("const", wk), Arg("const", vec_slices(bias, cout, per)), *ep.args,
        Arg("tensor", ctx.final_output)], [ctx.op.inputs[0], *ep.inputs], [ctx.final_output],
        knobs.params(), space=DepthwiseKnobs.space(shape), flops=2 * n * oh * ow * cout * kh * kw,
        dense=frozenset(([ctx.final_output] if dense else []) + ([x] if dense_in else [])))]


def _depthwise_out(dense: bool, *, oh: int, ow: int, sout: int, s_expr: str, px: str) -> str:
    """The index (in float4s) of output slice ``s_expr`` of pixel ``px`` of row ``oy``: in the slice layout, or
    where ``dense``, pixel by pixel (whole slices: a dense NHWC buffer)."""
    if dense:
        return f"((b * {oh} + oy) * {ow} + {px}) * {sout} + {s_expr}"
    return f"((b * {sout} + {s_expr}) * {oh} + oy) * {ow} + {px}"


def _depthwise_slices(*, n, ih, iw, kh, kw, sh, sw, dh, dw, oh, ow, pt, pl, cout, sout, tx, act, ep, cin, sin,
                      mult, dense=False, dense_in=False) -> list[str]:
    """The depthwise kernel's body, one slice per work-item (any channel multiplier: a multiplier above 1 gathers
    the four input lanes an output slice reads)."""
    L = [f"  const int X = get_global_id(0) * {tx}; const int Y = get_global_id(1); const int S = get_global_id(2);",
         f"  if (X >= {ow} || Y >= {n * oh} || S >= {sout}) return;",
         f"  const int b = Y / {oh}; const int oy = Y % {oh};"]
    for t in range(tx):
        L.append(f"  float4 acc{t} = LD4(bias, S);")
    if mult > 1 and 4 % mult == 0:  # lane j of output slice S is lane q * (S % mult) + j / mult of the input slice
        q = 4 // mult
        lanes = ", ".join(f"{q} * (S % {mult}) + {j // mult}" for j in range(4))
        L.append(f"  const uint4 pick = (uint4)({lanes});")
    elif mult > 1:  # each lane's input channel (its slice plane and lane), once
        for j in range(4):
            L.append(f"  const int c{j} = min((S * 4 + {j}) / {mult}, {cin - 1});"
                     f" const int at{j} = (c{j} / 4) * {ih * iw * 4} + c{j} % 4;")
    L.append(f"  for (int ky = 0; ky < {kh}; ++ky) {{")
    L.append(f"    const int iy = oy * {sh} - {pt} + ky * {dh};")
    L.append(f"    if (iy < 0 || iy >= {ih}) continue;")
    L.append(f"    for (int kx = 0; kx < {kw}; ++kx) {{")
    L.append(f"      const float4 w = LD4(wts, (S * {kh} + ky) * {kw} + kx);")
    for t in range(tx):
        L.append(f"      {{ const int ix = (X + {t}) * {sw} - {pl} + kx * {dw};")
        L.append(f"        if (ix >= 0 && ix < {iw}) {{")
        if mult == 1:
            at = (f"((b * {ih} + iy) * {iw} + ix) * {sin} + S" if dense_in else
                  f"((b * {sin} + S) * {ih} + iy) * {iw} + ix")
            L.append(f"          acc{t} = mad(LD4(src, {at}), w, acc{t});")
        elif 4 % mult == 0:  # an output slice's channels read 4 / mult channels of input slice S / mult
            L.append(f"          acc{t} = mad(shuffle(LD4(src, ((b * {sin} + S / {mult}) * {ih} + iy) * {iw} + ix), "
                     f"pick), w, acc{t});")
        else:  # output channel o reads input channel o / mult: gather the four lanes
            L.append("          float4 xv;")
            for j, lane in enumerate("xyzw"):
                L.append(f"          xv.{lane} = LD1(src, (((b * {sin}) * {ih} + iy) * {iw} + ix) * 4 + at{j});")
            L.append(f"          acc{t} = mad(xv, w, acc{t});")
        L.append("        } }")
    L += ["    }", "  }"]
    for t in range(tx):
        store = _store(_depthwise_out(dense, oh=oh, ow=ow, sout=sout, s_expr="S", px=f"X + {t}"), "S", ep.code,
                       pad_lanes_mask(cout, "S", "v"))
        L.append(f"  if (X + {t} < {ow}) {{ float4 v = acc{t}; {activation(act, 'v')} {store} }}")
    L.append("}")
    return L


def _depthwise_groups(*, n, ih, iw, kh, kw, sh, sw, dh, dw, oh, ow, pt, pl, cout, sout, tx, act, ep, per,
                      dense=False, dense_in=False) -> list[str]:
    """The depthwise kernel's body (channel multiplier 1) with ``per`` (2 or 4) slices per work-item in float8 /
    float16 math: slices S .. S+per-1 side by side in each vector (the input's planes S.., the weights' groups)."""
    plane, vt = ih * iw, f"float{4 * per}"
    ng = (sout + per - 1) // per  # slice groups
    ragged = sout % per != 0  # (the last group's upper slices are padding: their planes are not read)
    L = [f"  const int X = get_global_id(0) * {tx}; const int Y = get_global_id(1); const int P = get_global_id(2);",
         f"  if (X >= {ow} || Y >= {n * oh} || P >= {ng}) return;",
         f"  const int b = Y / {oh}; const int oy = Y % {oh}; const int S = P * {per};",
         f"  const int src0 = (b * {sout} + S) * {plane};"]
    for t in range(tx):
        L.append(f"  {vt} acc{t} = LD{4 * per}(bias, P);")
    # per kernel row, each input column the tile's pixels read is loaded once (tx pixels by kw taps read
    # (tx - 1) * sw + (kw - 1) * dw + 1 columns, not tx * kw), and each tap's weights once
    cols = (tx - 1) * sw + (kw - 1) * dw + 1
    parts = ", ".join("LD4(src, at)" if j == 0 else
                      (f"S + {j} < {sout} ? LD4(src, at + {j * plane}) : (float4)(0.0f)" if ragged else
                       f"LD4(src, at + {j * plane})") for j in range(per))
    L += [f"  const int ix0 = X * {sw} - {pl};",
          f"  for (int ky = 0; ky < {kh}; ++ky) {{",
          f"    const int iy = oy * {sh} - {pt} + ky * {dh};",
          f"    if (iy < 0 || iy >= {ih}) continue;",
          f"    const int row = {f'(b * {ih} + iy) * {iw}' if dense_in else f'src0 + iy * {iw}'};"]
    # (dense: a pixel's ``per`` slices side by side in memory, one load; the slice count a multiple of ``per``)
    load = f"LD{4 * per}(src, at * {sout // per} + P)" if dense_in else f"({vt})({parts})"
    for c in range(cols):
        L += [f"    {vt} x{c} = ({vt})(0.0f);",
              f"    if (ix0 + {c} >= 0 && ix0 + {c} < {iw}) {{ const int at = row + ix0 + {c}; x{c} = {load}; }}"]
    for k in range(kw):
        L.append(f"    {{ const {vt} w = LD{4 * per}(wts, (P * {kh} + ky) * {kw} + {k});")
        L += [f"      acc{t} = mad(x{t * sw + k * dw}, w, acc{t});" for t in range(tx)]
        L.append("    }")
    L.append("  }")
    for t in range(tx):
        for j in range(per):
            s_expr = "S" if j == 0 else f"(S + {j})"
            store = _store(_depthwise_out(dense, oh=oh, ow=ow, sout=sout, s_expr=s_expr, px=f"X + {t}"),
                           s_expr, ep.code, pad_lanes_mask(cout, s_expr, "v"))
            cond = f"X + {t} < {ow}" + (f" && S + {j} < {sout}" if j and ragged else "")
            L.append(f"  if ({cond}) {{ float4 v = acc{t}{slice_part(j)}; {activation(act, 'v')} {store} }}")
    L.append("}")
    return L


FC_SPLITS = (1, 8, 16, 32, 64)


@dataclass(frozen=True)
class FcShape:
    """What the FULLY_CONNECTED knobs depend on: output slices, and whether the device is a GPU."""

    sout: int
    gpu: bool = Target.gpu


@dataclass(frozen=True)
class FullyConnectedKnobs(Knobs):
    tile_s: int = 1  # output slices per work-item
    wide: bool = False  # float8 accumulators (needs an even tile_s)
    # work-items sharing one output tile's sum over the input slices, in one work-group, added in local
    # memory (1: one work-item sums it all). A GPU-shaped variant: a classifier's 250 output slices are 125
    # work-items, far too few to fill a GPU, each summing 320 slices in a row; split 32 makes 4,000
    split: int = 1

    @classmethod
    def default(cls, shape: FcShape) -> FullyConnectedKnobs:
        """On a GPU a split sum (32 work-items per output slice): an NVIDIA H100 ran the corpus's FCs 1.4-1.9x
        faster split 8-64 ways than one work-item per slice pair (tflgpu tune, 5 kernels). On a CPU device, as
        many output slices per work-item as leave a few dozen work-items (each reads the input once for all
        of them): Intel's runtime on a Zen 4 EPYC ran a 1280 -> 1001 classifier in 71 us with 8 slices against
        133 with 2, 4 rows of 2048 -> 512 in 181 against 387, 512 -> 128 in 59 with 4 against 64 with 8."""
        if shape.gpu:
            return cls(tile_s=1, wide=False, split=32)
        if shape.sout >= 64:
            return cls(tile_s=8, wide=True)
        if shape.sout >= 8:
            return cls(tile_s=4, wide=True)
        return cls(tile_s=2, wide=True) if shape.sout >= 2 else cls()

    @classmethod
    def space(cls, shape: FcShape) -> dict[str, list]:
        return {"tile_s": [1, 2, 4, 8], "wide": [False, True], "split": list(FC_SPLITS)}

    def problems(self, shape: FcShape) -> list[str]:
        bad = positive_int("tile_s", self.tile_s) + one_of("wide", self.wide, (False, True)) + \
            one_of("split", self.split, FC_SPLITS)
        if not bad and self.wide and self.tile_s % 2:
            bad.append(f"wide accumulators need an even tile_s, got {self.tile_s}")
        if not bad and self.wide and self.split > 1:
            bad.append("a split sum keeps float4 accumulators: wide needs split 1")
        return bad


def _fc_split_source(name: str, *, sin: int, sout: int, ts: int, split: int, act: int, cout: int, epilogue,
                     half_weights: bool = False) -> str:
    """FULLY_CONNECTED with ``split`` work-items of a work-group summing every split-th input slice of one
    output tile, then a tree sum in local memory; the first work-item adds the bias and stores. ``half_weights``:
    as ``_conv_source``'s."""
    ep_code, ep_params = (epilogue.code, epilogue.params) if epilogue else ("", [])
    extra = "".join(f"{p}, " for p in ep_params)
    wt, w4 = (("half", lambda at: f"vload_half4({at}, wts)") if half_weights
              else ("STORE_T", lambda at: f"LD4(wts, {at})"))
    lines = [f"__kernel void {name}(__global const STORE_T* src, __global const {wt}* wts,",
             f"                     __global const STORE_T* bias, {extra}__global STORE_T* dst) {{",
             "  const int L = get_local_id(0);",
             "  const int b = get_global_id(1);",
             f"  const int S = get_global_id(2) * {ts};",
             f"  __local float4 part[{split * ts}];"]
    lines += [f"  float4 acc{a} = (float4)(0.0f);" for a in range(ts)]
    lines.append(f"  for (int i = L; i < {sin}; i += {split}) {{")
    lines.append(f"    const float4 x = LD4(src, b * {sin} + i);")
    for a in range(ts):
        lines.append(f"    {{ const int wb = ((S + {a}) * {sin} + i) * 4;")
        lines.append(f"      acc{a} = mad((float4)(x.x), {w4('wb')}, mad((float4)(x.y), {w4('wb + 1')}, "
                     f"mad((float4)(x.z), {w4('wb + 2')}, mad((float4)(x.w), {w4('wb + 3')}, acc{a})))); }}")
    lines.append("  }")
    lines += [f"  part[{a * split} + L] = acc{a};" for a in range(ts)]
    lines.append("  barrier(CLK_LOCAL_MEM_FENCE);")
    lines.append(f"  for (int h = {split // 2}; h > 0; h >>= 1) {{")
    lines.append("    if (L < h) {")
    lines += [f"      part[{a * split} + L] += part[{a * split} + L + h];" for a in range(ts)]
    lines += ["    }", "    barrier(CLK_LOCAL_MEM_FENCE);", "  }", "  if (L != 0) return;"]
    for a in range(ts):
        lines.append(f"  if (S + {a} < {sout}) {{")
        lines.append(f"    float4 v = part[{a * split}] + LD4(bias, S + {a});")
        lines.append("    " + activation(act, "v"))
        lines.append("    " + _store(f"b * {sout} + S + {a}", f"(S + {a})", ep_code,
                                     pad_lanes_mask(cout, f"(S + {a})", "v")))
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines)


def _per_pixel_fc(ctx: GenContext, w: np.ndarray, lay) -> list[KernelSpec]:
    """A FULLY_CONNECTED over the last axis of a rank-3 / 4 input (a transformer's per-token dense layer:
    [1, tokens, depth], keep_num_dims) is a 1x1 conv over the slice layout's pixels: CONV_2D's kernels, its tiles,
    group-tiled GEMM and tuning knobs included. Its output must keep the input's pixels (keep_num_dims: a
    flattened [rows, units] output orders the slices otherwise)."""
    units, depth = w.shape
    out_lay = ctx.layout(ctx.output_tensor())
    if (out_lay.b, out_lay.h, out_lay.w, out_lay.c) != (lay.b, lay.h, lay.w, units):
        raise Unsupported(f"a FULLY_CONNECTED of {lay.b * lay.h * lay.w} rows whose output flattens them")
    options = {**ctx.op.options, "padding": 1, "stride_h": 1, "stride_w": 1, "dilation_h_factor": 1,
               "dilation_w_factor": 1}
    consts = {**ctx.consts, ctx.op.inputs[1]: w.reshape(units, 1, 1, depth)}
    return _conv_kernels(replace(ctx, op=replace(ctx.op, options=options), consts=consts), None)


@generator("FULLY_CONNECTED")
def fully_connected(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out)
    w = _float_const(ctx, 1)
    units, depth = w.shape
    lay = ctx.layout(x_t)
    if lay.h * lay.w > 1 and lay.c == depth:
        return _per_pixel_fc(ctx, w, lay)
    if lay.h != 1 or lay.w != 1 or lay.c != depth:
        raise Unsupported(f"input shape {list(x_t.shape)} is not [batch, depth]")
    act = ctx.opt("fused_activation_function", 0)
    if act not in (0, 1, 2, 3):
        raise Unsupported("activation")
    out_lay = ctx.layout(out)
    if out_lay.h != 1 or out_lay.w != 1:
        raise Unsupported("keep_num_dims output of rank 3+")
    n = lay.b
    sin, sout = (depth + 3) // 4, (units + 3) // 4
    shape = FcShape(sout, ctx.target.gpu)
    knobs = FullyConnectedKnobs.resolve(shape, ctx.params)
    ts, wide = knobs.tile_s, knobs.wide
    ep = ctx.epilogue_code(units)
    bias = _bias_const(ctx, 2, units)
    wq = w.reshape(units, 1, 1, depth)
    # (the direct kernel's weights hold only the lanes its sum takes, the split sum's whole slices)
    in_lanes = 4 if knobs.split > 1 else summed_lanes(depth)
    # a float16 model's weights in a float32 plan: read as the halves they are (a GEMV's time is its weights' bytes)
    half_w = not ctx.fp16 and exact_in_half(w)
    args = [Arg("tensor", ctx.op.inputs[0]),
            Arg("const16" if half_w else "const", weights_oi(wq, 8 if wide else 4, ts, in_lanes)),
            Arg("const", vec_slices(bias, units, ts)), *ep.args, Arg("tensor", ctx.final_output)]
    if knobs.split > 1:
        src = _fc_split_source(ctx.name, sin=sin, sout=sout, ts=ts, split=knobs.split, act=act, cout=units,
                               epilogue=ep, half_weights=half_w)
        return [KernelSpec(ctx.name, src, (knobs.split, n, (sout + ts - 1) // ts), (knobs.split, 1, 1), args,
                           [ctx.op.inputs[0], *ep.inputs], [ctx.final_output], knobs.params(),
                           space=FullyConnectedKnobs.space(shape), flops=2 * n * units * depth)]
    src = _conv_source(ctx.name, ih=1, iw=1, sin=sin, oh=1, ow=1, sout=sout, kh=1, kw=1, sh=1, sw=1, dh=1, dw=1,
                       pt=0, pl=0, batch=n, cin=depth, tx=1, ts=ts, act=act, cout=units, lanes=8 if wide else 4,
                       vec_hint="float8" if wide else "float4", epilogue=ep, half_weights=half_w)
    return [KernelSpec(ctx.name, src, (1, n, (sout + ts - 1) // ts), None, args, [ctx.op.inputs[0], *ep.inputs],
                       [ctx.final_output], knobs.params(), space=FullyConnectedKnobs.space(shape),
                       flops=2 * n * units * depth)]


@dataclass(frozen=True)
class TransposeConvShape:
    """What the transposed conv's knobs depend on."""

    sout: int  # output slices
    depth: int  # the slices a group tile's sum runs over: every tap's input slices
    gpu: bool = Target.gpu  # (kernels.base.Target)
    # the filter tiles the output (filter = stride, no padding, output = input x stride: each output pixel takes one
    # tap, a segmentation decoder's 2x2 / 2 upsampling): the taps a work-item per input pixel unrolls, else 0
    tiles: int = 0
    # the output is written as the graph output's dense NHWC float32 boundary buffer (KernelSpec.dense): the direct
    # kernels (gather and scatter) do, not the group tile
    dense: bool = False

    @property
    def scatter_ok(self) -> bool:
        """The scatter form applies: the filter tiles the output in at most ``MAX_SCATTER_TAPS`` taps."""
        return 0 < self.tiles <= MAX_SCATTER_TAPS


MAX_SCATTER_TAPS = 16  # (accumulators of a scatter work-item: taps x tile_s float4s)


@dataclass(frozen=True)
class TransposeConvKnobs(GroupTiled, Knobs):
    tile_s: int = 1  # output slices per work-item
    # (LX, LS): the gather form as an implicit GEMM through local memory (kernels.conv.im2col_stage, transposed):
    # a work-group of LX pixels x LS output slice groups stages k_chunk slices of the taps' sum per step
    group_tile: tuple | None = None
    k_chunk: int = 8
    # a work-item per input pixel, writing the output pixels its taps make (``TransposeConvShape.tiles``): each
    # input slice read once for them all, no tap search per output pixel
    scatter: bool = False
    tile_x: ClassVar[int] = 1  # (what GroupTiled's checks read: one pixel, float4 accumulators)
    lanes: ClassVar[int] = 4

    @classmethod
    def default(cls, shape: TransposeConvShape) -> TransposeConvKnobs:
        """Scatter where the filter tiles the output, on a CPU device: MediaPipe's selfie segmentation's last layer
        (128x128x16 -> 256x256x1, 2x2 / 2) on the Intel CPU device ran 357 us as a work-item per output pixel.
        A GPU starts from the gather form (its search tries the scatter)."""
        scatter = shape.scatter_ok and not shape.gpu
        ts = 4 if shape.sout >= 4 else 1
        if scatter:
            ts = max(t for t in (1, 2, 4) if t <= shape.sout and t * shape.tiles <= MAX_SCATTER_TAPS)
        return cls(tile_s=ts, scatter=scatter)

    @classmethod
    def space(cls, shape: TransposeConvShape) -> dict[str, list]:
        space = {"tile_s": [1, 2, 4]}
        if shape.scatter_ok:
            space["scatter"] = [False, True]
        if shape.gpu:  # (the group tile: a GPU's variant, as a windowed CONV_2D's)
            space.update(group_tile=CONV_SPACE["group_tile"],
                         k_chunk=[v for v in CONV_SPACE["k_chunk"] if v == 4 or v < 2 * shape.depth])
        return space

    def problems(self, shape: TransposeConvShape) -> list[str]:
        bad = positive_int("tile_s", self.tile_s) + positive_int("k_chunk", self.k_chunk)
        bad += one_of("scatter", self.scatter, (False, True))
        if self.group_tile is not None:
            tile_bad = self.group_tile_problems()
            bad += [f"group_tile={self.group_tile!r} is not None or 2 positive ints"] if tile_bad is None else tile_bad
        if self.scatter is True:
            if not shape.scatter_ok:
                bad.append(f"scatter needs a filter tiling the output in at most {MAX_SCATTER_TAPS} taps")
            elif self.tile_s * shape.tiles > MAX_SCATTER_TAPS:
                bad.append(f"scatter with tile_s={self.tile_s}: {self.tile_s * shape.tiles} accumulators, at most "
                           f"{MAX_SCATTER_TAPS}")
            if self.group_tile is not None:
                bad.append("scatter is the direct kernel's: not with a group tile")
        if shape.dense and self.group_tile is not None:
            bad.append("a transposed conv writing a dense boundary buffer runs a direct kernel: no group tile")
        return bad


def _transpose_conv(ctx: GenContext, x_idx: int, w_idx: int, bias_idx: int, out_hw, pad, sh, sw, act):
    """Gather form: output pixel (oy, ox) sums input pixels (iy, ix) with iy*sh + ky - pt == oy."""
    x_t = ctx.input_tensor(x_idx)
    require_float(ctx, x_t, ctx.output_tensor())
    w = _float_const(ctx, w_idx)
    n, ih, iw, cin = ctx.layout(x_t).dims
    cout, kh, kw, icw = w.shape
    if icw != cin:
        raise Unsupported("filter depth differs from input channels")
    oh, ow = out_hw
    _, pt = conv_padding(oh, kh, sh, 1, pad)
    _, pl = conv_padding(ow, kw, sw, 1, pad)
    sin, sout = (cin + 3) // 4, (cout + 3) // 4
    tiles = kh * kw if (kh, kw) == (sh, sw) and pt == pl == 0 and (oh, ow) == (ih * sh, iw * sw) else 0
    dense = ctx.final_output in ctx.dense
    shape = TransposeConvShape(sout, sin * kh * kw, ctx.target.gpu, tiles, dense)
    knobs = TransposeConvKnobs.resolve(shape, ctx.params)
    ts = knobs.tile_s
    bias = _bias_const(ctx, bias_idx, cout)
    ep = ctx.epilogue_code(cout)
    narrow = knobs.scatter and narrow_scatter(cout, ep)
    if narrow:
        src = _narrow_scatter_source(ctx.name, ep, n=n, ih=ih, iw=iw, sin=sin, kh=kh, kw=kw, act=act, cout=cout,
                                     dense=dense)
        gsize, local = (iw, n * ih, 1), None
    elif knobs.scatter:
        src = _scatter_source(ctx.name, ep, n=n, ih=ih, iw=iw, sin=sin, sout=sout, kh=kh, kw=kw, ts=ts, act=act,
                              cout=cout, dense=dense)
        gsize, local, padded = (iw, n * ih, (sout + ts - 1) // ts), None, ts
    elif knobs.group_tile is not None:
        lx, ls = knobs.group_tile
        stage = im2col_stage(sin=sin, ih=ih, iw=iw, ow=ow, kh=kh, kw=kw, sh=sh, sw=sw, dh=1, dw=1, pt=pt, pl=pl,
                             transposed=True)
        src = _group_tile_source(ctx.name, pixels=oh * ow, sin=shape.depth, sout=sout, batch=n, tx=1, ts=ts, lx=lx,
                                 ls=ls, kc=knobs.k_chunk, act=act, cout=cout, epilogue=ep, stage=stage)
        gsize, local, padded = group_tile_grid(pixels=oh * ow, batch=n, sout=sout, lx=lx, ls=ls, tx=1, ts=ts)
    else:
        src = _transpose_conv_source(ctx.name, ep, n=n, ih=ih, iw=iw, sin=sin, oh=oh, ow=ow, sout=sout, kh=kh, kw=kw,
                                     sh=sh, sw=sw, pt=pt, pl=pl, ts=ts, act=act, cout=cout, dense=dense)
        gsize, local, padded = (ow, n * oh, (sout + ts - 1) // ts), None, ts
    wts, biases = (narrow_scatter_weights(w), narrow_scatter_bias(bias, kh * kw)) if narrow else \
        (weights_oi(w, 4, padded), vec_slices(bias, cout, padded))
    return [KernelSpec(ctx.name, src, gsize, local, [
        Arg("tensor", ctx.op.inputs[x_idx]), Arg("const", wts), Arg("const", biases), *ep.args,
        Arg("tensor", ctx.final_output)],
        [ctx.op.inputs[x_idx], *ep.inputs], [ctx.final_output], knobs.params(), space=TransposeConvKnobs.space(shape),
        flops=2 * n * ih * iw * cin * cout * kh * kw, dense=frozenset([ctx.final_output] if dense else []))]


def _stored(index: str, slice_expr: str, ep, cout: int, dense_at: str | None) -> str:
    """A transposed conv's store of ``v``, output slice ``slice_expr``: at slice-layout ``index`` (the fused ops'
    operands read there too), or, where ``dense_at`` (the output pixel's first channel in the dense NHWC float
    ``dst``), into the dense buffer."""
    if dense_at is None:
        return _store(index, slice_expr, ep.code, pad_lanes_mask(cout, slice_expr, "v"))
    return _store(index, slice_expr, ep.code, "", dense_store4("dst", dense_at, cout, slice_expr, "v"))


def _transpose_head(name: str, ep, x: str, y: str, width: int, rows: int, height: int, ts: int,
                    dense: bool = False) -> list[str]:
    """A transposed conv kernel's signature and first lines: work-item (``x``, Y) of a grid ``width`` x ``rows``
    (batch x ``height``), ``b`` and row ``y`` from Y, its first output slice ``S`` (``ts`` a work-item); ``dense``:
    ``dst`` is the dense NHWC float32 boundary buffer."""
    extra = "".join(f"{p}, " for p in ep.params)
    return [(f"__attribute__((vec_type_hint(float4))) __kernel void {name}(__global const STORE_T* src, "
             f"__global const STORE_T* wts, __global const STORE_T* bias, {extra}"
             f"__global {'float' if dense else 'STORE_T'}* dst) {{"),
            f"  const int {x} = get_global_id(0); const int Y = get_global_id(1);",
            f"  const int S = get_global_id(2) * {ts};",
            f"  if ({x} >= {width} || Y >= {rows}) return;",
            f"  const int b = Y / {height}; const int {y} = Y % {height};"]


def _transpose_conv_source(name: str, ep, *, n, ih, iw, sin, oh, ow, sout, kh, kw, sh, sw, pt, pl, ts, act,
                           cout, dense=False) -> str:
    """The gather form's direct kernel: a work-item per output pixel and ``ts`` output slices."""
    L = _transpose_head(name, ep, "ox", "oy", ow, n * oh, oh, ts, dense)
    L += [f"  float4 acc{s} = (float4)(0.0f);" for s in range(ts)]
    L += [f"  for (int ky = 0; ky < {kh}; ++ky) {{",
          f"    const int ny = oy + {pt} - ky;",
          f"    if (ny < 0 || ny % {sh} != 0 || ny / {sh} >= {ih}) continue;",
          f"    const int iy = ny / {sh};",
          f"    for (int kx = 0; kx < {kw}; ++kx) {{",
          f"      const int nx = ox + {pl} - kx;",
          f"      if (nx < 0 || nx % {sw} != 0 || nx / {sw} >= {iw}) continue;",
          f"      const int ix = nx / {sw};",
          f"      for (int i = 0; i < {sin}; ++i) {{",
          f"        const float4 x = LD4(src, ((b * {sin} + i) * {ih} + iy) * {iw} + ix);"]
    for s in range(ts):
        L.append(f"        {{ const int wb = ((((S + {s}) * {sin} + i) * {kh} + ky) * {kw} + kx) * 4;")
        L.append(f"          acc{s} = mad((float4)(x.x), LD4(wts, wb), mad((float4)(x.y), LD4(wts, wb + 1), "
                 f"mad((float4)(x.z), LD4(wts, wb + 2), mad((float4)(x.w), LD4(wts, wb + 3), acc{s})))); }}")
    L += ["      }", "    }", "  }"]
    for s in range(ts):
        store = _stored(f"((b * {sout} + S + {s}) * {oh} + oy) * {ow} + ox", f"(S + {s})", ep, cout,
                        f"((b * {oh} + oy) * {ow} + ox) * {cout}" if dense else None)
        L.append(f"  if (S + {s} < {sout}) {{ float4 v = acc{s} + LD4(bias, S + {s}); {activation(act, 'v')} "
                 f"{store} }}")
    L.append("}")
    return "\n".join(L)


def _scatter_source(name: str, ep, *, n, ih, iw, sin, sout, kh, kw, ts, act, cout, dense=False) -> str:
    """The scatter form, where the filter tiles the output (``TransposeConvShape.tiles``): work-item (ix, Y) reads
    input pixel (iy, ix)'s slices once and writes the kh x kw output pixels its taps make, ``ts`` slices each."""
    oh, ow = ih * kh, iw * kw
    taps = [(ky, kx) for ky in range(kh) for kx in range(kw)]
    L = _transpose_head(name, ep, "ix", "iy", iw, n * ih, ih, ts, dense)
    L += [f"  float4 acc{s}_{ky}_{kx} = (float4)(0.0f);" for s in range(ts) for ky, kx in taps]
    L += [f"  for (int i = 0; i < {sin}; ++i) {{",
          f"    const float4 x = LD4(src, ((b * {sin} + i) * {ih} + iy) * {iw} + ix);"]
    for s in range(ts):
        L.append(f"    {{ const int wb = ((S + {s}) * {sin} + i) * {kh * kw * 4};")
        for ky, kx in taps:
            t = (ky * kw + kx) * 4
            L.append(f"      acc{s}_{ky}_{kx} = mad((float4)(x.x), LD4(wts, wb + {t}), mad((float4)(x.y), "
                     f"LD4(wts, wb + {t + 1}), mad((float4)(x.z), LD4(wts, wb + {t + 2}), mad((float4)(x.w), "
                     f"LD4(wts, wb + {t + 3}), acc{s}_{ky}_{kx}))));")
        L.append("    }")
    L.append("  }")
    for s in range(ts):
        L.append(f"  if (S + {s} < {sout}) {{ const float4 bw = LD4(bias, S + {s});")
        for ky, kx in taps:
            at = f"((b * {oh} + iy * {kh} + {ky}) * {ow} + ix * {kw} + {kx}) * {cout}" if dense else None
            store = _stored(f"((b * {sout} + S + {s}) * {oh} + iy * {kh} + {ky}) * {ow} + ix * {kw} + {kx}",
                            f"(S + {s})", ep, cout, at)
            L.append(f"    {{ float4 v = acc{s}_{ky}_{kx} + bw; {activation(act, 'v')} {store} }}")
        L.append("  }")
    L.append("}")
    return "\n".join(L)


def narrow_scatter(cout: int, ep) -> bool:
    """Whether a scatter form takes its narrow kernel (_narrow_scatter_source): fewer than 4 output channels, and
    fused ops that read no operand (lane-wise, whatever a lane holds)."""
    return cout < 4 and not ep.args


def _narrow_scatter_source(name: str, ep, *, n, ih, iw, sin, kh, kw, act, cout, dense) -> str:
    """The scatter form of a transposed conv of fewer than 4 output channels (a segmentation decoder's last layer:
    MediaPipe's selfie segmentation's 128x128x16 -> 256x256x1, 2x2 / 2): the lanes of its float4 accumulators are
    the (tap, channel) values its input pixel makes, ``narrow_scatter_weights``' order, not the channels of one
    output pixel, whose lanes past ``cout`` would be summed and activated for nothing (a sigmoid 4 times over).
    Its fused ops are unary (``ep`` reads no operand), applied to whole accumulators; each value is then stored
    as its own element: into the dense NHWC float ``dst`` where ``dense``, else a pixel's slice at a time (the
    lanes past ``cout`` zero)."""
    oh, ow, values = ih * kh, iw * kw, kh * kw * cout
    nacc = -(-values // 4)
    L = _transpose_head(name, ep, "ix", "iy", iw, n * ih, ih, 1, dense)
    L += [f"  float4 acc{j} = (float4)(0.0f);" for j in range(nacc)]
    L += [f"  for (int i = 0; i < {sin}; ++i) {{",
          f"    const float4 x = LD4(src, ((b * {sin} + i) * {ih} + iy) * {iw} + ix);",
          f"    const int wb = i * {4 * nacc};"]
    for j in range(nacc):
        L.append(f"    acc{j} = mad((float4)(x.x), LD4(wts, wb + {j}), mad((float4)(x.y), LD4(wts, wb + {nacc + j}), "
                 f"mad((float4)(x.z), LD4(wts, wb + {2 * nacc + j}), mad((float4)(x.w), LD4(wts, wb + {3 * nacc + j}), "
                 f"acc{j}))));")
    L.append("  }")
    for j in range(nacc):
        L.append(f"  {{ float4 v = acc{j} + LD4(bias, {j}); {activation(act, 'v')} {ep.code} acc{j} = RND4(v); }}")
    lane = lambda f: f"acc{f // 4}.s{f % 4}"  # (the value of flat (tap, channel) index f)
    for tap in range(kh * kw):
        ky, kx = divmod(tap, kw)
        pixel = f"(b * {oh} + iy * {kh} + {ky}) * {ow} + ix * {kw} + {kx}"
        if dense:
            L += [f"  dst[({pixel}) * {cout} + {c}] = {lane(tap * cout + c)};" for c in range(cout)]
        else:
            lanes = ", ".join([lane(tap * cout + c) for c in range(cout)] + ["0.0f"] * (4 - cout))
            L.append(f"  ST4(dst, {pixel}, (float4)({lanes}));")
    L.append("}")
    return "\n".join(L)


def narrow_scatter_weights(w: np.ndarray) -> np.ndarray:
    """[O, KH, KW, I] (O < 4) -> [Si][k=0..3][A][4]: for input channel 4si+k, accumulator a's 4 lanes hold the
    filter values of flat (tap, channel) indices 4a..4a+3 (tap-major, zero past the last) (_narrow_scatter_source)."""
    o, kh, kw, i = w.shape
    values = kh * kw * o
    si, nacc = (i + 3) // 4, -(-values // 4)
    flat = np.zeros((si * 4, nacc * 4), np.float32)
    flat[:i, :values] = np.transpose(w, (3, 1, 2, 0)).reshape(i, values)
    return flat.reshape(-1)


def narrow_scatter_bias(bias: np.ndarray, taps: int) -> np.ndarray:
    """The bias of each flat (tap, channel) value of ``narrow_scatter_weights``, zero past the last."""
    values = np.tile(np.asarray(bias, np.float32).reshape(-1), taps)
    out = np.zeros(-(-values.size // 4) * 4, np.float32)
    out[:values.size] = values
    return out


@generator("TRANSPOSE_CONV")
def transpose_conv(ctx: GenContext) -> list[KernelSpec]:
    shape = ctx.const(0)
    if shape is None:
        raise Unsupported("non-constant output shape")
    _, oh, ow, _ = (int(v) for v in shape.reshape(-1))
    return _transpose_conv(ctx, 2, 1, 3 if len(ctx.op.inputs) > 3 else -1, (oh, ow), ctx.opt("padding", 0),
                           ctx.opt("stride_h", 1), ctx.opt("stride_w", 1), ctx.opt("fused_activation_function", 0))


@generator("Convolution2DTransposeBias")
def conv2d_transpose_bias(ctx: GenContext) -> list[KernelSpec]:
    pad, sw, sh = transpose_conv_params(ctx)
    _, oh, ow, _ = ctx.output_tensor().shape
    return _transpose_conv(ctx, 0, 1, 2, (oh, ow), pad, sh, sw, 0)
