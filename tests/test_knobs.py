"""Typed generator knobs: every point is taken as asked or rejected, never remapped to another point."""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from tflgpu.kernels.conv import (
    ConvKnobs,
    ConvShape,
    DepthwiseKnobs,
    DepthwiseShape,
    FcShape,
    FullyConnectedKnobs,
    TransposeConvKnobs,
    TransposeConvShape,
)
from tflgpu.kernels.knobs import InvalidKnobs
from tflgpu.kernels.pool import ReduceKnobs, ReduceShape
from tflgpu.kernels.spectral import SpectrumKnobs, SpectrumShape

CONV_3X3 = ConvShape(3, 3, 1, 1, 1, 1, sin=4, sout=8, row=28, pixels=784, w_bytes=32 * 16 * 9 * 4)
CONV_1X1_BIG = ConvShape(1, 1, 1, 1, 1, 1, sin=64, sout=64, row=49, pixels=49, w_bytes=256 * 256 * 4)
CONV_STEM = ConvShape(3, 3, 2, 2, 1, 1, sin=1, sout=3, row=112, pixels=112 * 112, w_bytes=12 * 27 * 4)
CONV_1X1 = ConvShape(1, 1, 1, 1, 1, 1, sin=8, sout=8, row=196, pixels=196, w_bytes=32 * 32 * 4, pointwise=True)
CONV_1PX = ConvShape(1, 1, 1, 1, 1, 1, sin=256, sout=250, row=1, pixels=1, w_bytes=1000 * 1024 * 4, pointwise=True)
# a one-channel signal's resampling filter (Basic Pitch's: 256 taps at stride 2, one output channel)
CONV_FIR = ConvShape(1, 256, 1, 2, 1, 1, sin=1, sout=1, row=5480, pixels=5480, w_bytes=256 * 4, cin=1, float_lanes=16)
GPU = {"float_lanes": 1, "gpu": True}

FAMILIES = [(ConvKnobs, CONV_3X3), (ConvKnobs, CONV_1X1_BIG), (ConvKnobs, CONV_STEM), (ConvKnobs, CONV_1X1),
            (ConvKnobs, CONV_FIR),
            (DepthwiseKnobs, DepthwiseShape(14, 8)), (DepthwiseKnobs, DepthwiseShape(2, 1)),
            (DepthwiseKnobs, DepthwiseShape(7, 6, mult=2)), (FullyConnectedKnobs, FcShape(250)),
            (FullyConnectedKnobs, FcShape(1)), (TransposeConvKnobs, TransposeConvShape(2, 36, gpu=True)),
            (ConvKnobs, replace(CONV_1X1, **GPU)),
            (ConvKnobs, replace(CONV_1PX, **GPU)), (FullyConnectedKnobs, FcShape(250, gpu=True)),
            (DepthwiseKnobs, DepthwiseShape(14, 8, **GPU)), (ReduceKnobs, ReduceShape(251, gpu=True)),
            (ReduceKnobs, ReduceShape(3)), (ReduceKnobs, ReduceShape(40, subgroups=True)),
            (SpectrumKnobs, SpectrumShape(2048, gpu=False, max_group=8192)),
            (SpectrumKnobs, SpectrumShape(2048, gpu=True, max_group=1024)),
            (SpectrumKnobs, SpectrumShape(8192, gpu=False, max_group=8192)),  # (too long for a work-item)
            (SpectrumKnobs, SpectrumShape(4, gpu=True, max_group=64)), (SpectrumKnobs, SpectrumShape(64, False, 16))]


MOST_POINTS = 20_000  # points a family's check resolves: all of a smaller space, a seeded sample of a larger one


def _points(space: dict):
    """Every point of ``space`` (value tuples in its knobs' order), or MOST_POINTS of them drawn without
    replacement (a GPU's pointwise conv space holds ~10^5: all of them took 20 s)."""
    sizes = [len(v) for v in space.values()]
    total = int(np.prod(sizes))
    if total <= MOST_POINTS:
        yield from itertools.product(*space.values())
        return
    for index in np.random.default_rng(0).choice(total, MOST_POINTS, replace=False):
        yield tuple(options[at] for options, at in zip(space.values(), np.unravel_index(index, sizes)))


@pytest.mark.parametrize("cls,shape", FAMILIES)
def test_every_point_is_taken_as_asked_or_rejected(cls, shape):
    default = cls.default(shape)
    assert not default.problems(shape), "the heuristic default must be a valid point"
    space = cls.space(shape)
    taken = rejected = 0
    for values in _points(space):
        point = dict(zip(space, values))
        try:
            knobs = cls.resolve(shape, point)
        except InvalidKnobs:
            rejected += 1
            continue
        assert knobs.params() == {**default.params(), **point}  # nothing moved to another point
        taken += 1
    assert taken > 0
    if cls in (ConvKnobs, FullyConnectedKnobs):  # spaces that hold invalid combinations (odd tile_s, 8 lanes)
        assert rejected > 0


@pytest.mark.parametrize("params,why", [
    ({"lanes": 8, "tile_s": 1, "vec_hint": "float4"}, "multiple of 2"),
    ({"lanes": 16, "tile_s": 6, "vec_hint": None}, "multiple of 4"),
    ({"lanes": 4, "vec_hint": "float8"}, "float8 needs 8-lane"),
    ({"lanes": 8, "vec_hint": "float16"}, "float16 needs 16-lane"),
    ({"lanes": 32, "tile_s": 8}, "lanes=32 is not one of"),
    ({"tile_x": 0}, "tile_x must be a positive int"),
    ({"vec_hint": "double4"}, "vec_hint"),
    ({"local_size": (8, 1)}, "local_size"),
    ({"tiles": 4}, "no knob tiles"),
    ({"k_split": True}, "k_split=True is not one of"),  # (True == 1: a count is not a flag)
    ({"winograd": 1}, "winograd=1 is not one of"),  # (nor a flag a count)
])
def test_invalid_conv_points_are_rejected(params, why):
    with pytest.raises(InvalidKnobs, match=why):
        ConvKnobs.resolve(CONV_3X3, params)


def test_shape_dependent_validity():
    assert ConvKnobs.resolve(CONV_3X3, {"winograd": True}).winograd
    with pytest.raises(InvalidKnobs, match="Winograd needs a 3x3"):
        ConvKnobs.resolve(CONV_1X1_BIG, {"winograd": True})
    assert ConvKnobs.resolve(CONV_STEM, {"const_weights": True}).const_weights
    with pytest.raises(InvalidKnobs, match="__constant weights"):
        ConvKnobs.resolve(CONV_1X1_BIG, {"const_weights": True})
    assert "winograd" not in ConvKnobs.space(CONV_1X1_BIG) and "const_weights" not in ConvKnobs.space(CONV_1X1_BIG)
    with pytest.raises(InvalidKnobs, match="even tile_s"):
        FullyConnectedKnobs.resolve(FcShape(250), {"tile_s": 1})  # the default's wide accumulators stay asked for


def test_group_tiles_only_where_they_apply():
    """The local-memory group tile: its own work-group and layout, within the local memory and work-group size
    every OpenCL 1.2 device offers, not where the kernel ranks channels or reads a dense boundary buffer; a conv
    with a window stages its taps (an implicit GEMM), its chunk no deeper than taps x input slices need."""
    knobs = ConvKnobs.resolve(CONV_1X1, {"group_tile": (16, 4), "tile_x": 2, "tile_s": 2, "lanes": 4,
                                         "vec_hint": "float4"})
    assert knobs.local_bytes() == 16 * 8 * (16 * 2 + 4 * 4 * 2)
    assert "group_tile" in ConvKnobs.space(CONV_1X1) and "group_tile" not in ConvKnobs.space(CONV_3X3)  # (a CPU)
    gpu_3x3, gpu_stem = replace(CONV_3X3, **GPU), replace(CONV_STEM, **GPU)
    assert "group_tile" in ConvKnobs.space(gpu_3x3)
    assert ConvKnobs.space(gpu_stem)["k_chunk"] == [4, 8, 16]  # 9 taps x 1 slice: a chunk of 16 still < 18
    assert ConvKnobs.space(replace(gpu_stem, kh=1, kw=2))["k_chunk"] == [4]
    for shape in (replace(gpu_3x3, whole_pixel=True), replace(gpu_3x3, dense=True)):
        assert "group_tile" not in ConvKnobs.space(shape)
    plain = {"lanes": 4, "vec_hint": "float4"}
    assert ConvKnobs.resolve(CONV_3X3, {"group_tile": (16, 4), **plain}).group_tile == (16, 4)  # (asked for)
    assert "group_tile" not in TransposeConvKnobs.space(TransposeConvShape(sout=3, depth=32))
    transposed = TransposeConvShape(sout=3, depth=4 * 4 * 2, gpu=True)
    assert TransposeConvKnobs.resolve(transposed, {"group_tile": (8, 8)}).local_bytes() == 16 * 8 * (8 + 4 * 8)
    with pytest.raises(InvalidKnobs, match="512 work-items is over 256"):
        TransposeConvKnobs.resolve(transposed, {"group_tile": (32, 16)})
    for shape, params, why in [
        (replace(CONV_3X3, whole_pixel=True), {"group_tile": (16, 4), **plain}, "no Winograd, no group tile"),
        (CONV_1X1, {"group_tile": (16, 4), "lanes": 8, "tile_s": 2}, "not with"),
        (CONV_1X1, {"group_tile": (16, 4), "local_size": (16, 1, 1), **plain}, "not with"),
        (CONV_1X1, {"group_tile": (32, 16), **plain}, "512 work-items is over 256"),
        (CONV_1X1, {"group_tile": (64, 4), "tile_x": 8, "k_chunk": 16, **plain}, "bytes of local memory"),
        (CONV_1X1, {"group_tile": (16,), **plain}, "2 positive ints"),
        (CONV_1X1, {"group_tile": (32, 8), "k_split": 2, **plain}, "512 work-items is over 256"),
        (CONV_1X1, {"group_tile": (8, 8), "k_split": 4, "k_chunk": 16, "tile_x": 1, "tile_s": 1, **plain},
         "4 shares use 40960 bytes"),
        (CONV_1X1, {"k_split": 2, **plain}, "it needs a group_tile"),
        (CONV_1X1, {"group_tile": (8, 8), "k_split": 3, **plain}, "k_split"),
    ]:
        with pytest.raises(InvalidKnobs, match=why):
            ConvKnobs.resolve(shape, params)


def _an_older_record_is_a_start(knobs, shape, *added: str) -> bool:
    """Whether a record measured before ``added`` were knobs (its point the kernel's default without them, as the
    fallback chain weighs it: autotune.tuner.KernelTraits.takes, with the generator's own check) is a start for a
    kernel of ``shape`` whose space has them: the added knobs then take the kernel's default."""
    from tflgpu.autotune.tuner import KernelTraits, kernel_family

    def accepts(point):
        try:
            knobs.resolve(shape, point)
        except InvalidKnobs:
            return False
        return True

    space = knobs.space(shape)
    assert all(k in space for k in added)
    older = {k: v for k, v in knobs.default(shape).params().items() if k in space and k not in added}
    return KernelTraits(kernel_family("CONV_2D", False), (), space, accepts).takes(older)


def test_a_split_sum_is_a_gpus_variant_in_the_same_family():
    """``k_split`` (a group tile's sum shared by k_split work-items per output): in a GPU's space wherever the group
    tile is, not a CPU's, with as many shares as the device's work-groups take; it counts the shares' local memory
    and work-items; and it is a knob added after records were shipped, so an older record (without it) is still a
    start."""
    gpu_1x1 = replace(CONV_1X1, **GPU)
    assert ConvKnobs.space(gpu_1x1)["k_split"] == [1, 2, 4] and "k_split" in ConvKnobs.space(replace(CONV_3X3, **GPU))
    assert "k_split" not in ConvKnobs.space(CONV_1X1) and "k_split" not in ConvKnobs.space(replace(gpu_1x1, dense=True))
    knobs = ConvKnobs.resolve(gpu_1x1, {"group_tile": (8, 8), "k_split": 4, "k_chunk": 8, "tile_x": 1, "tile_s": 1,
                                        "lanes": 4, "vec_hint": None})
    assert knobs.group_bytes() == 4 * 16 * 8 * (8 + 4 * 8) and ConvKnobs.default(gpu_1x1).k_split == 1
    # 8 shares where the device's work-groups take 512 work-items or more (an H100's: 1024), not at 256
    wide = replace(gpu_1x1, max_group=1024)
    assert ConvKnobs.space(wide)["k_split"] == [1, 2, 4, 8]
    eight = {"group_tile": (16, 4), "k_split": 8, "k_chunk": 8, "tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": None}
    assert ConvKnobs.resolve(wide, eight).group_bytes() == 32 * 1024
    with pytest.raises(InvalidKnobs, match="512 work-items is over 256, the most this device's work-groups take"):
        ConvKnobs.resolve(gpu_1x1, eight)
    assert _an_older_record_is_a_start(ConvKnobs, wide, "k_split")
    # the separable block's group tile (its sum over the depthwise slices) alike; not its direct kernel
    from tflgpu.kernels.separable import SeparableKnobs, SeparableShape

    block = SeparableShape(sin=64, sout=64, ow=14, float_lanes=1, gpu=True, pixels=196)
    assert SeparableKnobs.space(block)["k_split"] == [1, 2, 4]
    assert "k_split" not in SeparableKnobs.space(replace(block, gpu=False, float_lanes=16))
    assert SeparableKnobs.resolve(block, {"group_tile": (8, 8), "k_split": 4}).group_bytes() <= 32 * 1024
    with pytest.raises(InvalidKnobs, match="not with the direct fused kernel"):
        SeparableKnobs.resolve(block, {"group_tile": None, "k_split": 2})


def test_prefetch_is_a_gpus_group_tile_variant_in_the_same_family():
    """``prefetch`` (a group tile reading each step one step ahead, into registers): in a GPU's space wherever the
    group tile is (a pointwise GEMM, an implicit one, a separable block's), not a CPU's; off by default; only with a
    group tile; a knob added after records were shipped, so an older record (without it) is still a start."""
    from tflgpu.kernels.separable import SeparableKnobs, SeparableShape

    gpu_1x1, gpu_3x3 = replace(CONV_1X1, **GPU), replace(CONV_3X3, **GPU)
    assert ConvKnobs.space(gpu_1x1)["prefetch"] == [False, True] and "prefetch" in ConvKnobs.space(gpu_3x3)
    assert "prefetch" not in ConvKnobs.space(CONV_1X1) and "prefetch" not in ConvKnobs.space(replace(gpu_1x1, dense=True))
    assert not ConvKnobs.default(gpu_1x1).prefetch and not ConvKnobs.default(replace(gpu_1x1, sin=64)).prefetch
    plain = {"lanes": 4, "vec_hint": None, "tile_x": 1, "tile_s": 1}
    assert ConvKnobs.resolve(gpu_1x1, {"group_tile": (16, 4), "k_split": 4, "k_chunk": 8, "prefetch": True,
                                       **plain}).prefetch
    for params, why in [({"group_tile": None, "prefetch": True, **plain}, "it needs a group_tile"),
                        ({"group_tile": (16, 4), "prefetch": "yes", **plain}, "prefetch=.yes. is not one of")]:
        with pytest.raises(InvalidKnobs, match=why):
            ConvKnobs.resolve(gpu_1x1, params)
    assert _an_older_record_is_a_start(ConvKnobs, gpu_1x1, "prefetch", "k_split")
    block = SeparableShape(sin=64, sout=64, ow=14, float_lanes=1, gpu=True, pixels=196)
    assert SeparableKnobs.space(block)["prefetch"] == [False, True]
    assert "prefetch" not in SeparableKnobs.space(replace(block, gpu=False, float_lanes=16))
    assert SeparableKnobs.resolve(block, {"group_tile": (8, 8), "prefetch": True}).prefetch
    with pytest.raises(InvalidKnobs, match="it needs a group_tile"):
        SeparableKnobs.resolve(block, {"group_tile": None, "prefetch": True})


def test_input_lanes_from_memory_are_a_16_lane_devices_windowed_fp32_default_in_the_same_family():
    """``mem_lanes`` (a tile inside the image reads its input lane by lane, each broadcast by its load): on by
    default for a 16-lane device's windowed conv of 2+ input slices in FP32 storage, where it measured faster (with
    float8 tiles of 8 pixels for 5-8 output channels); off
    for a pointwise conv, one input slice, FP16 storage, a graph input read densely, an input prologue, an 8-lane
    device and a GPU; in the space wherever it changes the code; a knob added after records were shipped, so an
    older record (without it) is still a start."""
    windowed = replace(CONV_3X3, float_lanes=16)
    assert ConvKnobs.default(windowed).mem_lanes and ConvKnobs.default(replace(windowed, sout=4)).mem_lanes
    off = [replace(CONV_1X1, float_lanes=16), replace(windowed, sin=1), replace(windowed, fp16=True),
           replace(windowed, dense_in=True, dense=True), replace(windowed, prologue=True), CONV_3X3,
           replace(CONV_3X3, **GPU)]
    assert [ConvKnobs.default(s).mem_lanes for s in off] == [False] * len(off)
    assert ConvKnobs.space(windowed)["mem_lanes"] == [False, True]
    # 5-8 output channels: 8 pixels of one float8 each there; in FP16 storage the float4 tile as before
    eight = [ConvKnobs.default(replace(windowed, sout=2, fp16=fp16)) for fp16 in (False, True)]
    assert [(k.tile_x, k.tile_s, k.lanes, k.vec_hint, k.mem_lanes) for k in eight] == [
        (8, 2, 8, "float8", True), (4, 2, 4, "float4", False)]
    assert "mem_lanes" in ConvKnobs.space(replace(windowed, fp16=True))  # (a search may still take it)
    assert "mem_lanes" not in ConvKnobs.space(replace(windowed, dense_in=True, dense=True))
    assert not ConvKnobs.resolve(windowed, {"mem_lanes": False}).mem_lanes
    with pytest.raises(InvalidKnobs, match="mem_lanes=1 is not one of"):
        ConvKnobs.resolve(windowed, {"mem_lanes": 1})
    assert _an_older_record_is_a_start(ConvKnobs, windowed, "mem_lanes")


def test_rows_of_many_taps_run_the_signal_form_on_a_cpu_device_in_the_same_family():
    """``signal`` (output pixels a work-item along float16 lanes, each input row's samples staged by phase): the
    default of a CPU device's conv of at most 8 output channels over rows of 9 or more adjacent taps, 64 pixels a
    work-item (32 for 5-8 channels) or the fewest that take a short row whole; not for rows of fewer taps (in the
    space still), 9 output channels, a dilated row, a prologue, unknown input channels, a GPU, or a row's window
    past the private memory it may stage; in the space wherever it applies; a knob added after records were
    shipped, so an older record (without it) is still a start."""
    from tflgpu.kernels.conv import SIGNAL_WINDOW_FLOATS

    wide = replace(CONV_FIR, kh=3, kw=39, sw=1, sin=2, cin=8, sout=2, row=264, pixels=264 * 172)  # (Basic Pitch's)
    assert [ConvKnobs.default(s).signal for s in (CONV_FIR, wide, replace(CONV_FIR, row=30, pixels=30),
                                                  replace(wide, row=20, pixels=20), replace(CONV_FIR, kw=9))] == [
        64, 32, 32, 32, 64]
    off = [replace(CONV_FIR, kw=8), replace(CONV_FIR, sout=3), replace(CONV_FIR, cin=0), replace(CONV_FIR, dw=2),
           replace(CONV_FIR, prologue=True), replace(CONV_FIR, whole_pixel=True), replace(CONV_FIR, **GPU),
           replace(CONV_FIR, sw=256, kw=512)]
    assert [ConvKnobs.default(s).signal for s in off] == [0] * len(off)
    assert [("signal" in ConvKnobs.space(s)) for s in off] == [True] + [False] * (len(off) - 1)
    assert ConvKnobs.space(CONV_FIR)["signal"] == [0, 16, 32, 64, 128]
    # (stride 32: 32 phases of the pixels' and the taps' samples each, 128 pixels' window too large)
    strided = replace(CONV_FIR, sw=32)
    assert ConvKnobs.space(strided)["signal"] == [0, 16, 32, 64]
    assert strided.signal_window(128) > SIGNAL_WINDOW_FLOATS >= strided.signal_window(64)
    with pytest.raises(InvalidKnobs, match="window of at most 4096 samples"):
        ConvKnobs.resolve(strided, {"signal": 128})
    with pytest.raises(InvalidKnobs, match="the signal form needs rows of adjacent taps"):
        ConvKnobs.resolve(replace(CONV_FIR, sout=3), {"signal": 64})
    with pytest.raises(InvalidKnobs, match="the signal form reads its own weights.*not with"):
        ConvKnobs.resolve(CONV_FIR, {"signal": 64, "group_tile": (16, 4)})
    assert ConvKnobs.resolve(CONV_FIR, {"signal": 64, "const_weights": True}).const_weights  # (__constant weights)
    assert ConvKnobs.resolve(CONV_FIR, {"signal": 0, "tile_x": 8}).signal == 0  # (the direct kernel, as asked)
    assert _an_older_record_is_a_start(ConvKnobs, CONV_FIR, "signal")


def test_defaults_follow_the_measured_heuristic():
    assert ConvKnobs.default(CONV_3X3).params() == {**ConvKnobs().params(), "tile_x": 4, "tile_s": 4, "lanes": 8,
                                                     "vec_hint": "float8"}
    assert (ConvKnobs.default(CONV_1X1_BIG).tile_x, ConvKnobs.default(CONV_1X1_BIG).tile_s) == (2, 8)
    stem = ConvKnobs.default(CONV_STEM)
    assert (stem.tile_s, stem.lanes, stem.vec_hint) == (3, 4, "float4")
    # a device with 16-lane float vectors (AVX-512): four output slices per accumulator, where there are 8
    avx512 = [replace(s, float_lanes=16) for s in (CONV_3X3, CONV_1X1_BIG, CONV_STEM)]
    assert [(k.tile_x, k.tile_s, k.lanes, k.vec_hint) for k in map(ConvKnobs.default, avx512)] == [
        (4, 8, 16, "float16"), (4, 8, 16, "float16"), (4, 3, 4, "float4")]
    one_slice = replace(CONV_3X3, sout=4, float_lanes=16)
    assert (ConvKnobs.default(one_slice).tile_x, ConvKnobs.default(one_slice).tile_s) == (8, 4)
    # scalar work-items that are not a GPU's: the float8 tile, as before
    assert ConvKnobs.default(replace(CONV_3X3, float_lanes=1)) == ConvKnobs.default(CONV_3X3)
    assert FullyConnectedKnobs.default(FcShape(1)) == FullyConnectedKnobs(tile_s=1, wide=False)
    # a GPU: pointwise convs as a local-memory GEMM, a one-pixel one and FCs as split sums, others 2 strided px
    gpu = [ConvKnobs.default(replace(s, **GPU)) for s in (CONV_1X1, CONV_1PX, CONV_3X3, CONV_STEM)]
    assert [(k.group_tile, k.split, k.tile_x, k.tile_s, k.strided, k.lanes) for k in gpu] == [
        ((32, 8), 1, 1, 1, False, 4), (None, 32, 1, 1, False, 4),
        (None, 1, 2, 1, True, 4), (None, 1, 2, 1, True, 4)]
    # from 128 input channels the GEMM's sum in 4 shares, 16 px x 4 slices a group
    deep = [ConvKnobs.default(replace(CONV_1X1, sin=sin, **GPU)) for sin in (31, 32)]
    assert [(k.group_tile, k.k_split, k.k_chunk) for k in deep] == [((32, 8), 1, 8), ((16, 4), 4, 8)]
    assert ConvKnobs.resolve(replace(CONV_1X1, sin=240, **GPU)).group_bytes() <= 32 * 1024
    assert FullyConnectedKnobs.default(FcShape(250, gpu=True)).split == 32
    assert (DepthwiseKnobs.default(DepthwiseShape(14, 8, **GPU)).tile_x, DepthwiseKnobs.default(
        DepthwiseShape(14, 8, **GPU)).slices) == (1, 1)
    # depthwise: two slices per work-item (float8), four (float16) on a 16-lane device, one with a multiplier
    dw = [DepthwiseShape(14, 8), DepthwiseShape(14, 8, float_lanes=16), DepthwiseShape(14, 3, float_lanes=16),
          DepthwiseShape(14, 8, mult=2, float_lanes=16)]
    assert [(k.slices, k.vec_hint) for k in map(DepthwiseKnobs.default, dw)] == [
        (2, "float8"), (4, "float16"), (2, "float8"), (1, "float4")]


def test_an_invalid_record_keeps_the_heuristics(opencl_device, rng):
    """A stored record naming an invalid point (hand-written, or from an older generator) is not applied."""
    import numpy as np

    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.autotune import MemoryTuningDB, TuningRecord, kernel_key

    from .oputil import In, op_model

    model, _ = op_model("CONV_2D", [In(rng.standard_normal((1, 8, 8, 8)).astype(np.float32)),
                                    rng.standard_normal((16, 3, 3, 8)).astype(np.float32),
                                    np.zeros(16, np.float32)], padding="SAME", stride_w=1, stride_h=1)
    plain = Interpreter(model_content=model, delegate=GpuDelegate(tuning_db=False)).gpu_plan
    step = plain.steps[0]
    db = MemoryTuningDB()
    from tflgpu.kernels.program import shared_base

    db.put(opencl_device.identity.key(), kernel_key(step.op.name, step.specs, False, shared_base(step.specs)),
           TuningRecord({"tile_s": 1, "wide": True}, 10.0, 5.0, 3, "CONV_2D"))
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning_db=db))
    assert it.gpu_plan.steps[0].params == {} and it.gpu_plan.cpu_op_count == 0
    assert it.gpu_plan.steps[0].specs[0].params == step.specs[0].params


def test_sub_group_reductions_only_where_the_device_has_them():
    """The reduction's sub-group form: in the space and valid only on a device with sub-group functions, and only
    for a work-group (a lone work-item has nothing to reduce with)."""
    with_sub, without = ReduceShape(40, subgroups=True), ReduceShape(40)
    assert ReduceKnobs.space(with_sub)["subgroups"] == [False, True] and "subgroups" not in ReduceKnobs.space(without)
    assert "subgroups" not in ReduceKnobs.space(ReduceShape(1, subgroups=True))  # (one term: no work-group either)
    assert ReduceKnobs.resolve(with_sub, {"group": 32, "subgroups": True}).subgroups
    with pytest.raises(InvalidKnobs, match="need a device with"):
        ReduceKnobs.resolve(without, {"group": 32, "subgroups": True})
    with pytest.raises(InvalidKnobs, match="group > 1"):
        ReduceKnobs.resolve(with_sub, {"group": 1, "subgroups": True})


def test_image_weights_only_on_a_device_with_images():
    """The direct conv's image weights: in a GPU's space where the device reads images, valid with the direct
    kernel's float4 accumulators only, and refused past the image's texels."""
    gpu_3x3 = replace(CONV_3X3, **GPU, images=True)
    assert ConvKnobs.space(gpu_3x3)["image_weights"] == [False, True]
    assert "image_weights" not in ConvKnobs.space(replace(CONV_3X3, images=True))  # (a CPU runtime)
    assert "image_weights" not in ConvKnobs.space(replace(gpu_3x3, images=False))
    plain = {"lanes": 4, "vec_hint": "float4", "tile_s": 2}
    assert ConvKnobs.resolve(gpu_3x3, {"image_weights": True, **plain}).image_weights
    for shape, params, why in [
        (replace(gpu_3x3, images=False), {"image_weights": True, **plain}, "need a device with image support"),
        (gpu_3x3, {"image_weights": True, "lanes": 8, "tile_s": 2, "vec_hint": "float8"}, "float4 accumulators"),
        (gpu_3x3, {"image_weights": True, "winograd": True, **plain}, "not with \\['winograd'\\]"),
        (replace(gpu_3x3, sin=1024, sout=1024), {"image_weights": True, **plain}, "do not fit"),
    ]:
        with pytest.raises(InvalidKnobs, match=why):
            ConvKnobs.resolve(shape, params)


def test_half_math_only_in_an_fp16_plan_on_a_gpu():
    """FP16 arithmetic: in a GPU's space where the kernel stores half, valid in the direct kernel and the group
    tile, not with a split sum."""
    gpu_half = replace(CONV_3X3, **GPU, fp16=True)
    assert ConvKnobs.space(gpu_half)["half_math"] == [False, True]
    for shape in (replace(CONV_3X3, fp16=True), replace(CONV_3X3, **GPU), replace(gpu_half, whole_pixel=True)):
        assert "half_math" not in ConvKnobs.space(shape)
    assert ConvKnobs.resolve(gpu_half, {"half_math": True}).half_math
    with pytest.raises(InvalidKnobs, match="needs an FP16 plan"):
        ConvKnobs.resolve(replace(CONV_3X3, **GPU), {"half_math": True})
    with pytest.raises(InvalidKnobs, match="not with \\['winograd'\\]"):
        ConvKnobs.resolve(gpu_half, {"half_math": True, "winograd": True})
    assert ConvKnobs.resolve(gpu_half, {"half_math": True, "group_tile": (8, 8), "strided": False, "tile_x": 1}).group_tile
    with pytest.raises(InvalidKnobs, match="not with \\['a channel rank / split'\\]"):
        ConvKnobs.resolve(replace(gpu_half, pointwise=True, pixels=1), {"half_math": True, "split": 8})


def test_broadcast_gemm_only_for_a_pointwise_conv_on_a_gpu_with_sub_groups():
    """The sub-group broadcast GEMM: in the space of a GPU's pointwise conv where the device names sub-group
    functions (3-5x slower than the default tiles on the Intel CPU runtime, so not in a CPU's), valid with one
    float4 output slice per work-item and nothing else setting the work-group."""
    pw = replace(CONV_3X3, kh=1, kw=1, pointwise=True, subgroups="cl_khr_subgroups", **GPU)
    assert ConvKnobs.space(pw)["broadcast"] == [0, 16, 64]
    for shape in (replace(pw, subgroups=None), replace(pw, gpu=False, float_lanes=16), CONV_3X3,
                  replace(pw, whole_pixel=True), replace(pw, dense=True)):
        assert "broadcast" not in ConvKnobs.space(shape)
    plain = {"tile_s": 1, "lanes": 4, "vec_hint": None, "strided": False, "group_tile": None}
    assert ConvKnobs.resolve(pw, {"broadcast": 16, "tile_x": 4, **plain}).broadcast == 16
    for shape, params, why in [
        (replace(pw, subgroups=None), {"broadcast": 16, **plain}, "on a device with cl_khr_subgroups"),
        (pw, {"broadcast": 16, **plain, "tile_s": 2}, "one output slice per work-item"),
        (pw, {"broadcast": 16, **plain, "group_tile": (8, 8)}, "one output slice per work-item"),
        (pw, {"broadcast": 32, **plain}, "broadcast"),
    ]:
        with pytest.raises(InvalidKnobs, match=why):
            ConvKnobs.resolve(shape, params)


def test_a_cpu_devices_small_kernels_get_a_work_group_per_compute_unit(opencl_device, rng):
    """A kernel that names no work-group gets one per compute unit on a CPU device where its grid is small and
    splits evenly (kernels.base.Target.work_group), none on a GPU or where it does not split; the plan launches
    that group and computes what LiteRT does."""
    import math

    from tflgpu.kernels.base import Target

    cpu = Target(float_lanes=16, units=2, max_group=1024)
    assert cpu.work_group((256, 1, 2)) == (128, 1, 2) and cpu.work_group((1, 7, 6)) == (1, 7, 3)
    assert cpu.work_group((257, 3, 1)) is None and cpu.work_group((2048, 2, 1)) is None
    assert Target(gpu=True, units=132, max_group=1024).work_group((256, 1, 2)) is None
    assert Target(units=1).work_group((256, 1, 1)) is None and Target(units=0).work_group((256, 1, 1)) is None
    six = Target(units=6, max_group=1024).work_group((12, 3, 1))
    assert six is not None and math.prod((12, 3, 1)) // math.prod(six) == 6 and all(
        g % w == 0 for g, w in zip((12, 3, 1), six))

    from tflgpu import GpuDelegate, Interpreter

    from .conftest import assert_close, litert, run_model
    from .oputil import In, op_model, rand

    model, feeds = op_model("CONV_2D", [In(rand(rng, (1, 9, 13, 6))), rand(rng, (10, 1, 1, 6)), rand(rng, (10,))],
                            padding="SAME", stride_w=1, stride_h=1)
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
    got = run_model(lambda **kw: it, model, feeds)[0]
    (spec,) = it.gpu_plan.steps[0].specs
    target = it.gpu_plan.make.target
    assert spec.local_size == target.work_group(tuple(spec.global_size)), (spec.global_size, target)
    if not target.gpu and target.units == 2:  # (CI's device: this conv's grid splits in two)
        assert spec.local_size is not None
    assert_close(got, run_model(litert(), model, feeds)[0])


def test_a_cpu_devices_moves_take_row_groups(opencl_device, rng):
    """A value-moving kernel (a PAD, a slice, a concatenation: lanes.lane_kernel) of more than a small grid
    takes, on a CPU device, a work-group of the most of a row that divides it and a group may take
    (kernels.base.Target.row_group),
    at least 16 work-items; none on a GPU, where the row does not split into one of 16 or more, or where the grid
    is small (work_group's). The plan launches that group and pads as LiteRT does."""
    from tflgpu.kernels.base import Target

    cpu = Target(float_lanes=16, units=2, max_group=1024)
    assert cpu.row_group((309, 172, 1)) == (309, 1, 1) and cpu.row_group((2060, 9, 2)) == (515, 1, 1)
    assert cpu.row_group((1031, 40, 1)) is None and cpu.row_group((13, 300, 1)) is None  # (1031 prime; 13 < 16)
    assert cpu.row_group((64, 8, 1)) is None  # (small: work_group's)
    assert Target(gpu=True, units=132, max_group=1024).row_group((309, 172, 1)) is None
    assert Target(units=1, max_group=1024).row_group((309, 172, 1)) is None

    from tflgpu import GpuDelegate, Interpreter

    from .conftest import assert_close, litert, run_model
    from .oputil import In, op_model, rand

    model, feeds = op_model("PAD", [In(rand(rng, (1, 40, 73, 1))), np.array([[0, 0], [0, 0], [36, 0], [0, 0]], np.int32)])
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
    got = run_model(lambda **kw: it, model, feeds)[0]
    (spec,) = it.gpu_plan.steps[0].specs
    target = it.gpu_plan.make.target
    assert spec.local_size == target.row_group(tuple(spec.global_size)), (spec.global_size, target)
    if not target.gpu and target.units >= 2 and target.max_group >= 109:  # (CI's device: rows of 109 pixels)
        assert spec.local_size == (109, 1, 1)
    assert_close(got, run_model(litert(), model, feeds)[0])
