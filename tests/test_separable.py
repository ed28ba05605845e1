"""A depthwise conv and the pointwise conv reading it as one op (graph.passes.fuse_separable) and one kernel
(kernels.separable): the pass's conditions, and every variant against LiteRT at FP32 and FP16."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.cpu.executor import ModelRunner
from tflgpu.graph.passes import BETWEEN, SEPARABLE_CONV, PassStep, fuse_separable, merge_pad
from tflgpu.model import read_model
from tflgpu.model.builder import ModelBuilder
from tflgpu.runtime.config import PlanConfig

from .conftest import assert_close, litert, run_model


def _out_hw(size: int, k: int, stride: int, dil: int, pad: str) -> int:
    eff = (k - 1) * dil + 1
    return -(-size // stride) if pad == "SAME" else (size - eff) // stride + 1


def separable_model(rng, shape=(1, 9, 11, 12), cout=10, k=3, stride=1, dil=1, pad="SAME", act_dw="RELU6",
                    act_pw="NONE", residual=False, pw_k=1, mult=1, extra_reader=False, softmax=False, between=(),
                    between_read=False, pre_pad=None):
    """x [-> PAD] -> DEPTHWISE_CONV_2D [-> each unary op of ``between``] -> CONV_2D (pw_k x pw_k) [-> ADD x]
    [-> SOFTMAX]: a MobileNet block (``extra_reader``: the depthwise output read by a RELU too, ``between_read``: the
    last unary op's output a graph output too; ``pre_pad``: (top, bottom, left, right) zeros a PAD adds before the
    depthwise conv, as exported models pad for a VALID conv); (model bytes, feeds)."""
    n, h, w, c = shape
    b = ModelBuilder()
    x = src = b.input("x", shape)
    if pre_pad is not None:
        t, bo, le, ri = pre_pad
        h, w = h + t + bo, w + le + ri
        src = b.tensor("padded", (n, h, w, c))
        b.op("PAD", [x, b.const("paddings", np.array([[0, 0], [t, bo], [le, ri], [0, 0]], np.int32))], [src])
    oh, ow = _out_hw(h, k, stride, dil, pad), _out_hw(w, k, stride, dil, pad)
    dw = b.tensor("dw", (n, oh, ow, c * mult))
    b.op("DEPTHWISE_CONV_2D", [src, b.const("dw_w", rng.standard_normal((1, k, k, c * mult)).astype(np.float32)),
                               b.const("dw_b", rng.standard_normal(c * mult).astype(np.float32))], [dw],
         padding=pad, stride_w=stride, stride_h=stride, dilation_w_factor=dil, dilation_h_factor=dil,
         depth_multiplier=mult, fused_activation_function=act_dw)
    dw_out = dw
    for i, name in enumerate(between):
        t = b.tensor(f"between{i}", (n, oh, ow, c * mult))
        b.op(name, [dw], [t], **({"alpha": 0.25} if name == "LEAKY_RELU" else {}))
        dw = t
    pw = b.tensor("pw", (n, oh, ow, cout))
    scale = 1 / np.sqrt(c * mult)
    b.op("CONV_2D", [dw, b.const("pw_w", (rng.standard_normal((cout, pw_k, pw_k, c * mult)) * scale).astype(np.float32)),
                     b.const("pw_b", rng.standard_normal(cout).astype(np.float32))], [pw],
         padding="SAME", stride_w=1, stride_h=1, fused_activation_function=act_pw)
    outs = [pw]
    if residual:
        y = b.tensor("y", (n, oh, ow, cout))
        b.op("ADD", [pw, x], [y])
        outs = [y]
    if softmax:
        sm = b.tensor("sm", (n, oh, ow, cout))
        b.op("SOFTMAX", outs, [sm], beta=1.0)
        outs = [sm]
    if extra_reader:
        r = b.tensor("r", (n, oh, ow, c * mult))
        b.op("RELU", [dw_out], [r])
        outs.append(r)
    if between_read:
        outs.append(dw)
    b.output(*outs)
    return b.build(), [rng.uniform(-1, 1, shape).astype(np.float32)]


def _passes(model: bytes):
    runner = ModelRunner(read_model(model)).runner(0)
    return runner, [PassStep(op, [(op, fn)], [], True) for op, fn in runner.steps]


def test_pass_merges_a_block_into_one_step(rng):
    runner, steps = _passes(separable_model(rng)[0])
    merged, n = fuse_separable(steps, runner.sg, runner.consts)
    assert n == 1 and len(merged) == 1
    (s,) = merged
    assert s.op.name == SEPARABLE_CONV and [op.name for op, _ in s.members] == ["DEPTHWISE_CONV_2D", "CONV_2D"]
    assert s.op.outputs == steps[1].op.outputs and s.op.inputs[0] == steps[0].op.inputs[0]


def test_pass_merges_a_block_whose_depthwise_conv_took_its_pad(rng):
    """An exported model's PAD -> VALID depthwise conv: merge_pad makes the PAD the conv's explicit padding (one
    step of the two), and that step still joins its pointwise conv as one block (the PAD its first member)."""
    runner, steps = _passes(separable_model(rng, pre_pad=(1, 1, 1, 1), pad="VALID")[0])
    padded, n_pad = merge_pad(steps, runner.sg, runner.consts)
    merged, n = fuse_separable(padded, runner.sg, runner.consts)
    assert n_pad == 1 and n == 1 and len(merged) == 1
    (s,) = merged
    assert [op.name for op, _ in s.members] == ["PAD", "DEPTHWISE_CONV_2D", "CONV_2D"]
    assert s.op.options["depthwise"].options["explicit_padding"] == (1, 1, 1, 1)
    assert s.op.inputs[0] == steps[0].op.inputs[0]


def test_pass_takes_the_unary_ops_between_the_convs(rng):
    """Unary elementwise ops of their own between the two convs (a quantized model's QUANT_SIM, here a HARD_SWISH
    and a LEAKY_RELU) join the block: run in order by the CPU, under BETWEEN for its kernels."""
    runner, steps = _passes(separable_model(rng, between=("HARD_SWISH", "LEAKY_RELU"))[0])
    merged, n = fuse_separable(steps, runner.sg, runner.consts)
    assert n == 3 and len(merged) == 1
    (s,) = merged
    assert [op.name for op, _ in s.members] == ["DEPTHWISE_CONV_2D", "HARD_SWISH", "LEAKY_RELU", "CONV_2D"]
    assert [f.op for f in s.op.options[BETWEEN]] == [steps[1].op, steps[2].op]
    assert s.op.options["depthwise"] is steps[0].op and s.op.options["pointwise"] is steps[3].op


@pytest.mark.parametrize("why", ["3x3 pointwise", "multiplier 2", "two readers", "vetoed", "between read"])
def test_pass_leaves_what_it_cannot_fuse(rng, why):
    kw = {"3x3 pointwise": {"pw_k": 3}, "multiplier 2": {"mult": 2}, "two readers": {"extra_reader": True},
          "vetoed": {}, "between read": {"between": ("RELU", "TANH"), "between_read": True}}[why]
    runner, steps = _passes(separable_model(rng, **kw)[0])
    allowed = (lambda dw, pw: False) if why == "vetoed" else (lambda dw, pw: True)
    merged, n = fuse_separable(steps, runner.sg, runner.consts, allowed)
    assert n == 0 and len(merged) == len(steps)


def _plan(model: bytes, fp16: bool, params: dict | None):
    """The model's plan (an Interpreter's, with ``params=None``), or one whose separable block takes ``params``
    (built once: over a CPU interpreter's runner)."""
    from tflgpu.runtime.device import choose_device
    from tflgpu.runtime.executor import GpuPlan

    if params is None:
        it = Interpreter(model_content=model, delegate=GpuDelegate(precision_loss_allowed=fp16, cache=False,
                                                                   tuning_db=False))
        return it, it.gpu_plan
    it = Interpreter(model_content=model)
    runner = it.cpu_runner()
    index = next(op.index for op, _ in runner.steps if op.name == "CONV_2D")  # (the block: at its pointwise conv)
    return it, GpuPlan(runner, choose_device(), PlanConfig(fp16=fp16), params={index: params})


POINTS = {  # knobs -> kernels launched for the block
    "direct 4x8 16 lanes, 4 slices": ({"fused": True, "tile_x": 4, "tile_s": 8, "lanes": 16, "per": 4,
                                       "group_tile": None}, 1),
    "direct 2x2 8 lanes, 2 slices": ({"fused": True, "tile_x": 2, "tile_s": 2, "lanes": 8, "per": 2,
                                      "whole": False, "group_tile": None}, 1),
    "direct 1x1 float4": ({"fused": True, "tile_x": 1, "tile_s": 1, "lanes": 4, "per": 1, "whole": False,
                           "group_tile": None}, 1),
    "whole 8x4": ({"fused": True, "tile_x": 8, "tile_s": 4, "lanes": 16, "per": 1, "whole": True,
                  "group_tile": None}, 1),
    "whole 2x1": ({"fused": True, "tile_x": 2, "tile_s": 1, "lanes": 4, "per": 2, "whole": True,
                  "group_tile": None}, 1),
    "group tile 32x8": ({"fused": True, "tile_x": 1, "tile_s": 1, "lanes": 4, "per": 1, "whole": False,
                         "group_tile": (32, 8), "k_chunk": 8}, 1),
    "group tile 8x8 by 2x2": ({"fused": True, "tile_x": 2, "tile_s": 2, "lanes": 4, "per": 1, "whole": False,
                               "group_tile": (8, 8), "k_chunk": 4}, 1),
    "group tile 8x8 by 2x2, half math": ({"fused": True, "tile_x": 2, "tile_s": 2, "lanes": 4, "per": 1,
                                          "whole": False, "group_tile": (8, 8), "k_chunk": 4, "half_math": True}, 1),
    "group tile 8x8, sum in 4 shares": ({"fused": True, "tile_x": 1, "tile_s": 1, "lanes": 4, "per": 1, "whole": False,
                                         "group_tile": (8, 8), "k_chunk": 4, "k_split": 4}, 1),
    # the group tile reading (here: computing) each step's depthwise values one step ahead (prefetch), with 2 x 2
    # tiles of 16 depthwise slices a step (a step ragged where the block has 3 or 4), and in 4 shares
    "group tile 8x8 by 2x2, prefetch": ({"fused": True, "tile_x": 2, "tile_s": 2, "lanes": 4, "per": 1,
                                         "whole": False, "group_tile": (8, 8), "k_chunk": 4, "prefetch": True}, 1),
    "group tile 8x8 by 2x2, half math, prefetch": ({"fused": True, "tile_x": 2, "tile_s": 2, "lanes": 4, "per": 1,
                                                    "whole": False, "group_tile": (8, 8), "k_chunk": 4,
                                                    "half_math": True, "prefetch": True}, 1),
    "group tile 8x8, sum in 4 shares, prefetch": ({"fused": True, "tile_x": 1, "tile_s": 1, "lanes": 4, "per": 1,
                                                   "whole": False, "group_tile": (8, 8), "k_chunk": 4, "k_split": 4,
                                                   "prefetch": True}, 1),
    "unfused": ({"fused": False}, 2),
}
# the points an FP16 plan is checked at: each variant once (the others differ from them in indexing only, which
# the FP32 cases check) and the half sums
FP16_POINTS = {"direct 2x2 8 lanes, 2 slices", "whole 8x4", "group tile 8x8 by 2x2", "group tile 8x8 by 2x2, half math",
               "group tile 8x8, sum in 4 shares", "group tile 8x8 by 2x2, prefetch",
               "group tile 8x8 by 2x2, half math, prefetch", "unfused"}

BLOCKS = {  # separable_model arguments
    "stride 1 SAME": {},
    "stride 2 VALID, batch 2, 37 out": {"shape": (2, 10, 9, 8), "cout": 37, "stride": 2, "pad": "VALID"},
    "dilated 5x5, relu out": {"shape": (1, 12, 10, 16), "cout": 24, "k": 5, "dil": 2, "act_pw": "RELU6"},
    "residual add": {"shape": (1, 7, 7, 16), "cout": 16, "residual": True, "act_dw": "RELU"},
    # (a PAD before a VALID depthwise conv, merged in as its explicit padding: uneven, at stride 2)
    "explicit pad 1/2/0/1, stride 2": {"shape": (1, 9, 10, 8), "cout": 12, "stride": 2, "pad": "VALID",
                                       "pre_pad": (1, 2, 0, 1)},
    # (unary ops of their own between the convs, as a quantized model's QUANT_SIM: computed on the depthwise values)
    "unary ops between": {"shape": (1, 8, 9, 16), "cout": 12, "act_dw": "NONE", "between": ("HARD_SWISH", "LEAKY_RELU")},
}


def _cases():
    """Every block at every point in FP32, and at FP16_POINTS in FP16 (half sums in FP16 only), where the point's
    depthwise slices per work-item divide the block's."""
    for block in sorted(BLOCKS):
        slices = BLOCKS[block].get("shape", (1, 9, 11, 12))[3] // 4
        for point in sorted(POINTS):
            params = POINTS[point][0]
            for fp16 in (False, True):
                if (fp16 and point not in FP16_POINTS) or (params.get("half_math") and not fp16) or \
                        slices % params.get("per", 1):
                    continue
                yield pytest.param(fp16, point, block, id=f"{block}-{point}-{'fp16' if fp16 else 'fp32'}")


@pytest.mark.parametrize(("fp16", "point", "block"), list(_cases()))
def test_separable_variants_match_litert(opencl_device, rng, fp16, point, block):
    """Every variant computes the block LiteRT computes (FP32 within 1e-4, FP16 within 1e-2 of the output's
    scale; FP16 arithmetic too), with strides, padding, dilation, batches, padded output slices and a fused
    residual ADD."""
    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    params, kernels = POINTS[point]
    kw = dict(BLOCKS[block])
    model, feeds = separable_model(rng, **kw)
    it, plan = _plan(model, fp16, params)
    (step,) = [s for s in plan.steps if s.device == "gpu"]
    assert step.op.name == SEPARABLE_CONV and len(step.specs) == kernels and plan.cpu_op_count == 0
    assert {k: step.specs[0].params[k] for k in params} == params
    assert ("__local half4 xs" in step.specs[0].source) == bool(params.get("half_math"))
    got = plan.run(feeds)[it.model.main.outputs[0]]
    assert_close(got, run_model(litert(), model, feeds)[0], 1e-2 if fp16 else 1e-4)


@pytest.mark.parametrize("channels", [32, 30], ids=["whole slices", "ragged slice"])
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_an_unfused_block_hands_its_depthwise_output_on_densely(opencl_device, rng, channels, fp16):
    """On a CPU device, in an FP32 plan, the depthwise conv of a block left unfused writes its output pixel by pixel
    (a dense NHWC buffer) and the pointwise conv reads it so (kernels.separable._unfused), where the channels are
    whole slices; the tensor keeps its place in the plan's arena. Else (a ragged last slice, an FP16 plan, a GPU)
    the slice layout. Either way LiteRT's result, at stride 2 with a unary op between the convs."""
    from tflgpu.kernels.base import Target

    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    model, feeds = separable_model(rng, shape=(1, 9, 11, channels), cout=40, stride=2, between=("RELU",))
    it, plan = _plan(model, fp16, {"fused": False})
    (step,) = [s for s in plan.steps if s.device == "gpu"]
    assert step.op.name == SEPARABLE_CONV and len(step.specs) == 2
    mid = step.op.options["pointwise"].inputs[0]
    gpu = Target.of(opencl_device.cl_device, opencl_device.identity.device_type).gpu
    dense = channels % 4 == 0 and not fp16 and not gpu
    assert [mid in sp.dense for sp in step.specs] == [dense, dense]
    assert any(plan.io.tensor_buffer[mid] is b for b in plan.io.buffers)  # (the arena's)
    got = plan.run(feeds)[it.model.main.outputs[0]]
    assert_close(got, run_model(litert(), model, feeds)[0], 1e-2 if fp16 else 1e-4)


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-target", "gpu-target"])
def test_separable_defaults_on_this_device(opencl_device, rng, monkeypatch, gpu):
    """The defaults for a CPU device (fused where one or two work-items cover a pixel's output slices, or the
    depthwise output is at least twice the pointwise one, or up to 256 output channels) and for a
    GPU (the group tile up to 384 input channels, 8 x 8 up to 1,024 output pixels; the two kernels above 384
    channels) compute what LiteRT does, here on whatever device there is."""
    from tflgpu.kernels.base import Target

    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=16 if not gpu else 1,
                                                                                   gpu=gpu)))
    cases = [({"shape": (1, 14, 14, 32), "cout": 24}, True, (True, (8, 8))),
             ({"shape": (1, 7, 7, 32), "cout": 160}, True, (True, (8, 8))),
             ({"shape": (1, 5, 5, 260), "cout": 260}, False, (True, (8, 8))),
             ({"shape": (1, 36, 36, 16), "cout": 8}, True, (True, (32, 8))),
             ({"shape": (1, 7, 7, 384), "cout": 32}, True, (True, (8, 8))),
             ({"shape": (1, 5, 5, 388), "cout": 24}, True, (False, (8, 8)))]
    for kw, cpu_fused, (gpu_fused, tile) in cases:
        model, feeds = separable_model(rng, **kw)
        it, plan = _plan(model, False, None)
        (step,) = [s for s in plan.steps if s.device == "gpu"]
        fused = gpu_fused if gpu else cpu_fused
        assert step.specs[0].params["fused"] is fused and len(step.specs) == (1 if fused else 2)
        if gpu:
            assert step.specs[0].params["group_tile"] == tile
        assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], 1e-4)
        if not gpu and opencl_device.identity.fp16 and kw["cout"] == 160:  # (an FP16 plan fuses by the same rule)
            half_it, half_plan = _plan(model, True, None)
            (half,) = [s for s in half_plan.steps if s.device == "gpu"]
            assert half.specs[0].params["fused"] is True
            assert_close(half_plan.run(feeds)[half_it.model.main.outputs[0]], run_model(litert(), model, feeds)[0],
                         2e-2)


def test_invalid_points_are_refused():
    from tflgpu.kernels.knobs import InvalidKnobs
    from tflgpu.kernels.separable import SeparableKnobs, SeparableShape

    shape = SeparableShape(sin=6, sout=10, ow=7, float_lanes=16)
    for bad in ({"per": 4}, {"lanes": 16, "tile_s": 2}, {"group_tile": (32, 8), "lanes": 16},
                {"group_tile": (64, 8), "lanes": 4, "per": 1, "whole": False}):
        with pytest.raises(InvalidKnobs):
            SeparableKnobs.resolve(shape, {"fused": True, **bad})
    with pytest.raises(InvalidKnobs):
        SeparableKnobs.resolve(shape, {"fused": False, "per": 3})  # (a value no variant has)
    tile = {"fused": True, "lanes": 4, "per": 1, "whole": False, "group_tile": (8, 8), "half_math": True}
    with pytest.raises(InvalidKnobs, match="needs an FP16 plan"):
        SeparableKnobs.resolve(shape, tile)
    half = replace(shape, fp16=True, gpu=True, float_lanes=1)
    assert SeparableKnobs.resolve(half, tile).half_math and SeparableKnobs.space(half)["half_math"] == [False, True]
    assert "half_math" not in SeparableKnobs.space(replace(shape, fp16=True))  # (a CPU runtime emulates half)
    with pytest.raises(InvalidKnobs, match="not with the direct fused kernel"):
        SeparableKnobs.resolve(half, {**tile, "group_tile": None})
    # the pair takes its convs' own defaults: other knobs beside fused=False (a record of another shape's) are moot
    pair = SeparableKnobs.resolve(shape, {"fused": False, "tile_x": 1, "group_tile": (8, 8), "k_chunk": 4})
    assert pair == replace(SeparableKnobs.default(shape), fused=False)
    space = SeparableKnobs.space(shape)
    assert space["per"] == [1, 2] and max(space["tile_x"]) == 8


def test_the_tuner_times_the_block_both_ways(opencl_device, rng, monkeypatch, tmp_path):
    """A search of a separable block times the unfused pair among its first trials (one knob from the default),
    so fusion is a per-layer choice the tuner turns off where it measures slower (then its two convs are searched
    as kernels of their own: a block of 6 us, which a loaded machine, CI's two workers, may time either way); the
    tuned plan matches LiteRT."""
    from tflgpu.autotune.tuner import KernelTuner

    seen = []
    evaluate = KernelTuner.evaluate
    monkeypatch.setattr(KernelTuner, "evaluate", lambda self, params: seen.append(dict(params)) or
                        evaluate(self, params))
    model, feeds = separable_model(rng, shape=(1, 14, 14, 16), cout=24)
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning="fast", tuning_db=tmp_path / "records.json",
                                                               tuning_budget_s=20, cache=False))
    results = it.gpu_plan.tuning_results
    (result,) = [r for r in results if r.op == SEPARABLE_CONV]
    assert result.source == "tuned"
    parts = sorted(r.op for r in results if r is not result)
    assert parts == ([] if result.params.get("fused", True) else ["CONV_2D", "DEPTHWISE_CONV_2D"])
    assert {p["fused"] for p in seen if "fused" in p} == {True, False}
    assert_close(it.gpu_plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0])



def test_unfused_block_runs_its_convs_records(opencl_device, rng, monkeypatch):
    """A separable block left unfused (on a 16-lane CPU device the default for 30 -> 272 channels) runs its
    depthwise and pointwise convs with the tuning records those convs have as steps of their own (here the lone
    convs of the same block with a second reader), not their heuristics; a record that does not apply to its conv
    leaves that conv's heuristics, and the block's own record is found as before (its key is its heuristics'
    code). Each plan computes what LiteRT does. (A SOFTMAX reads the block: a conv writing
    a graph output would write it in its dense layout, another kernel. 30 channels, a ragged last slice: the block
    hands its depthwise output on in the slice layout, so its kernels are the lone convs' exactly. A dense hand-over
    of whole slices keeps each conv's key and parameters: test_an_unfused_block_hands_its_depthwise_output_on_densely.)
    """
    import re

    from tflgpu.autotune import MemoryTuningDB, TuningRecord, kernel_key
    from tflgpu.kernels.base import Target
    from tflgpu.kernels.program import shared_base

    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=16)))
    kw = {"shape": (1, 7, 7, 30), "cout": 272, "softmax": True}
    lone_model, lone_feeds = separable_model(rng, **kw, extra_reader=True)
    model, feeds = separable_model(rng, **kw)
    interp = lambda m, db: Interpreter(model_content=m, delegate=GpuDelegate(tuning_db=db, cache=False))
    lone = {s.op.name: s for s in interp(lone_model, False).gpu_plan.steps if s.device == "gpu"}
    dw, pw = lone["DEPTHWISE_CONV_2D"], lone["CONV_2D"]
    key = lambda s: kernel_key(s.op.name, s.specs, False, shared_base(s.specs))
    dev = opencl_device.identity.key()
    own = {"DEPTHWISE_CONV_2D": {"tile_x": 2, "vec_hint": "float8", "slices": 2},
           "CONV_2D": {"tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": "float4"}}

    def code(spec):  # (a kernel's code whatever its function's name)
        return re.sub(r"__kernel void \w+", "__kernel void K", spec.source), spec.global_size, spec.local_size

    def checked(m, x, db):  # (the interpreter, having computed what LiteRT does)
        it = interp(m, db)
        assert_close(run_model(lambda **_: it, m, x)[0], run_model(litert(), m, x)[0], 1e-4)
        return it

    def block(db):
        plan = checked(model, feeds, db).gpu_plan
        (step,) = [s for s in plan.steps if s.op.name == SEPARABLE_CONV]
        assert step.specs[0].params["fused"] is False and len(step.specs) == 2
        assert [t.source for t in plan.tuning_results if t.op == SEPARABLE_CONV] == (["record"] if db else [])
        return step

    heuristic = block(False)
    for bad_pw in (False, True):
        db = MemoryTuningDB()
        db.put(dev, key(dw), TuningRecord(own["DEPTHWISE_CONV_2D"], 10.0, 5.0, 3, "DEPTHWISE_CONV_2D"))
        db.put(dev, key(pw), TuningRecord({"lanes": 3} if bad_pw else own["CONV_2D"], 10.0, 5.0, 3, "CONV_2D"))
        # (the block's own record, under the key of its heuristics' code: found whatever its convs' records)
        db.put(dev, key(heuristic), TuningRecord({"fused": False}, 10.0, 9.0, 3, SEPARABLE_CONV))
        tuned = {s.op.name: s for s in checked(lone_model, lone_feeds, db).gpu_plan.steps if s.device == "gpu"}
        assert tuned["DEPTHWISE_CONV_2D"].params == own["DEPTHWISE_CONV_2D"]
        step = block(db)
        assert code(step.specs[0]) == code(tuned["DEPTHWISE_CONV_2D"].specs[0]) != code(heuristic.specs[0])
        if bad_pw:  # (no accumulator of 3 lanes: the pointwise conv keeps its heuristics)
            assert code(step.specs[1]) == code(heuristic.specs[1])
        else:
            assert code(step.specs[1]) == code(tuned["CONV_2D"].specs[0]) != code(heuristic.specs[1])


def same_cost_together(monkeypatch) -> None:
    """With synthetic kernel costs, the background search's end-to-end check (runtime.upgrades.check_plan, tested
    in test_startup) would time the real kernels and may take back what the synthetic costs chose: it sees the
    plan the same with them as without."""
    from tflgpu.runtime import upgrades

    monkeypatch.setattr(upgrades, "time_kernel_sets", lambda bg, sets: [[1e-3] * 5 for _ in sets])


@pytest.mark.parametrize("mode", ["fast", "background"])
def test_an_unfused_blocks_convs_are_searched_as_its_parts(opencl_device, rng, monkeypatch, tmp_path, mode):
    """The convs of a block left unfused (as in the test above) are kernels of the plan like any other: a search
    (before the plan is built, or in the background) takes each up under the key a step of that conv alone has,
    records what it decides, and the block runs its convs with it (in the background: from the next invoke on).
    Synthetic costs decide: the depthwise conv is fastest at ``tile_x=2``, the pointwise conv at ``tile_x=1`` (the
    heuristics: 4 and 7), the block's own candidates all cost the same (it stays unfused). No shipped record
    takes part: the block starts from the heuristics on any device (PoCL's shipped file starts it fused)."""
    import re

    from tflgpu.autotune import MemoryTuningDB, exchange, kernel_key
    from tflgpu.autotune.measure import KernelBench
    from tflgpu.kernels.base import Target
    from tflgpu.kernels.program import shared_base

    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=16)))
    monkeypatch.setattr(exchange, "SHIPPED_DIR", tmp_path)
    favoured = {"DEPTHWISE_CONV_2D": 2, "CONV_2D": 1}
    launch = KernelBench._launch

    def kind(spec):  # (by its space: the block's own kernels have a "fused" knob)
        return None if "fused" in spec.space else "DEPTHWISE_CONV_2D" if "slices" in spec.space else "CONV_2D"

    def synthetic(self, launches):
        launch(self, launches)  # (its outputs are checked)
        fast = all(s.params.get("tile_x") == favoured.get(kind(s)) for s, *_ in launches)
        return 10.0 if fast else 100.0

    monkeypatch.setattr(KernelBench, "_launch", synthetic)
    same_cost_together(monkeypatch)
    kw = {"shape": (1, 7, 7, 30), "cout": 272, "softmax": True}
    model, feeds = separable_model(rng, **kw)
    lone_model, _ = separable_model(rng, **kw, extra_reader=True)
    lone = {s.op.name: s for s in Interpreter(model_content=lone_model, delegate=GpuDelegate(
        tuning_db=False, cache=False)).gpu_plan.steps if s.device == "gpu"}
    keys = {name: kernel_key(s.op.name, s.specs, False, shared_base(s.specs)) for name, s in lone.items()
            if name in ("DEPTHWISE_CONV_2D", "CONV_2D")}
    db = MemoryTuningDB()
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning=mode, tuning_db=db, cache=False,
                                                               tuning_trials=4))
    if mode == "background":
        assert it.wait_background(300) and not it.tuning_status().last_error
    expected = run_model(litert(), model, feeds)[0]
    assert_close(run_model(lambda **_: it, model, feeds)[0], expected, 1e-4)  # (a background swap installed)
    dev = opencl_device.identity.key()
    for name, key in keys.items():
        assert db.get(dev, key).params["tile_x"] == favoured[name], name
    (step,) = [s for s in it.gpu_plan.steps if s.op.name == SEPARABLE_CONV]
    assert step.specs[0].params["fused"] is False
    # the block's kernels are its convs' as steps of their own with those records (their sources, renamed)
    alone = {s.op.name: s for s in Interpreter(model_content=lone_model, delegate=GpuDelegate(
        tuning="none", tuning_db=db, cache=False)).gpu_plan.steps if s.device == "gpu"}
    code = lambda spec: (re.sub(r"__kernel void \w+", "K", spec.source), spec.global_size, spec.local_size)
    assert [code(sp) for sp in step.specs] == [code(alone[n].specs[0]) for n in ("DEPTHWISE_CONV_2D", "CONV_2D")]
    assert [code(sp) for sp in step.specs] != [code(lone[n].specs[0]) for n in ("DEPTHWISE_CONV_2D", "CONV_2D")]


@dataclass
class Unfusing:
    """A block that starts fused on this device (the CPU OpenCL runtime's default), with synthetic costs under
    which a search leaves it unfused, its depthwise conv fastest at ``tile_x=2`` and its pointwise conv at
    ``tile_x=1``; the model, a model whose two convs are steps of their own, and those convs' kernel keys. (30
    channels: unfused, the block hands its depthwise output on in the slice layout, its kernels the lone convs'.)"""

    model: bytes
    feeds: list
    lone_model: bytes
    keys: dict[str, str]
    favoured: dict[str, int]


@pytest.fixture
def unfusing(opencl_device, rng, monkeypatch, tmp_path) -> Unfusing:
    from tflgpu.autotune import exchange, kernel_key
    from tflgpu.autotune.measure import KernelBench
    from tflgpu.kernels.program import shared_base

    monkeypatch.setattr(exchange, "SHIPPED_DIR", tmp_path)  # (no shipped record takes part)
    favoured = {"DEPTHWISE_CONV_2D": 2, "CONV_2D": 1}
    launch = KernelBench._launch

    def synthetic(self, launches):
        launch(self, launches)  # (its outputs are checked)
        specs = [s for s, *_ in launches]
        if "fused" in specs[0].space:  # (the block's own candidates: the unfused form wins)
            return 10.0 if specs[0].params.get("fused") is False else 100.0
        kind = "DEPTHWISE_CONV_2D" if "slices" in specs[0].space else "CONV_2D"
        return 10.0 if all(s.params.get("tile_x") == favoured[kind] for s in specs) else 100.0

    monkeypatch.setattr(KernelBench, "_launch", synthetic)
    same_cost_together(monkeypatch)
    kw = {"shape": (1, 7, 7, 30), "cout": 16, "softmax": True}
    model, feeds = separable_model(rng, **kw)
    lone_model, _ = separable_model(rng, **kw, extra_reader=True)
    start = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False)).gpu_plan
    assert [s.specs[0].params.get("fused") for s in start.steps if s.op.name == SEPARABLE_CONV] == [True]
    lone = {s.op.name: s for s in Interpreter(model_content=lone_model, delegate=GpuDelegate(
        cache=False, tuning_db=False)).gpu_plan.steps if s.device == "gpu"}
    keys = {name: kernel_key(s.op.name, s.specs, False, shared_base(s.specs)) for name, s in lone.items()
            if name in favoured}
    return Unfusing(model, feeds, lone_model, keys, favoured)


@pytest.mark.parametrize("mode", ["fast", "background"])
def test_a_block_the_search_unfuses_has_its_convs_searched_in_the_same_run(opencl_device, unfusing, mode):
    """A block that starts fused (this device's default) and that the search leaves unfused launches its convs,
    which a plan started fused did not have among its kernels: they are searched next, in the same run, so the
    next start finds a record for every kernel (before, it searched them again: PoCL's background runs left two).
    """
    import re

    from tflgpu.autotune import MemoryTuningDB

    u = unfusing
    delegate = lambda **kw: GpuDelegate(cache=False, **kw)
    db = MemoryTuningDB()
    it = Interpreter(model_content=u.model, delegate=delegate(tuning=mode, tuning_db=db, tuning_trials=4))
    if mode == "background":
        assert it.wait_background(300) and not it.tuning_status().last_error
        status = it.tuning_status()
        assert status.kernels_left == 0 and status.kernels_done == status.kernels_searched
    assert_close(run_model(lambda **_: it, u.model, u.feeds)[0], run_model(litert(), u.model, u.feeds)[0], 1e-4)
    dev = opencl_device.identity.key()
    for name, key in u.keys.items():
        assert db.get(dev, key).params["tile_x"] == u.favoured[name], name
    (step,) = [s for s in it.gpu_plan.steps if s.op.name == SEPARABLE_CONV]
    assert step.specs[0].params["fused"] is False and len(step.specs) == 2
    alone = {s.op.name: s for s in Interpreter(model_content=u.lone_model, delegate=delegate(
        tuning="none", tuning_db=db)).gpu_plan.steps if s.device == "gpu"}
    code = lambda spec: (re.sub(r"__kernel void \w+", "K", spec.source), spec.global_size, spec.local_size)
    assert [code(sp) for sp in step.specs] == [code(alone[n].specs[0]) for n in ("DEPTHWISE_CONV_2D", "CONV_2D")]
    # the next start: a record for every kernel, nothing to search; the convs the block's record unfuses are listed
    # as taking theirs (a start without a search too: before, they were left out of its tuning results)
    again = Interpreter(model_content=u.model, delegate=delegate(tuning=mode, tuning_db=db))
    assert again.tuning_status() is None
    assert {t.source for t in again.gpu_plan.tuning_results} == {"record"}
    unsearched = Interpreter(model_content=u.model, delegate=delegate(tuning="none", tuning_db=db))
    for start in (again, unsearched):
        taken = {t.key: (t.source, t.params) for t in start.gpu_plan.tuning_results}
        assert all(taken[key] == ("record", db.get(dev, key).params) for key in u.keys.values()), taken


def test_a_stored_plans_block_a_record_unfuses_has_its_convs_searched(opencl_device, unfusing, tmp_path):
    """A process that exits after the search left a block unfused but before it searched the block's convs leaves
    a stored plan with the block fused and the block's record: the next start runs the block unfused from that
    record, and searches its convs (before, only the plan's steps as stored were searched: the convs ran their
    heuristics at every later start)."""
    from tflgpu.autotune import MemoryTuningDB
    from tflgpu.autotune.records import CacheTuningDB
    from tflgpu.cache.store import CacheStore

    u = unfusing
    dev = opencl_device.identity.key()
    searched = MemoryTuningDB()  # (the block's decision, from a search in a cache of its own)
    Interpreter(model_content=u.model, delegate=GpuDelegate(cache=False, tuning="fast", tuning_db=searched,
                                                            tuning_trials=4)).allocate_tensors()
    (block,) = [(k, r) for d, k, r in searched.items() if d == dev and k not in u.keys.values()]
    assert block[1].params["fused"] is False
    cache = tmp_path / "cache"
    options = {"serialization_dir": cache, "tuning": "background", "tuning_trials": 4}
    first = Interpreter(model_content=u.model, delegate=GpuDelegate(**options, tuning_budget_s=0))  # (stores it)
    assert [s.specs[0].params.get("fused") for s in first.gpu_plan.steps if s.op.name == SEPARABLE_CONV] == [True]
    del first
    db = CacheTuningDB(CacheStore(cache))
    db.put(dev, *block)  # (what the exiting process had recorded)
    again = Interpreter(model_content=u.model, delegate=GpuDelegate(**options, tuning_budget_s=120))
    assert again.gpu_plan.build_stats["plan"] == "cache"
    (step,) = [s for s in again.gpu_plan.steps if s.op.name == SEPARABLE_CONV]
    assert step.specs[0].params["fused"] is False and len(step.specs) == 2
    assert again.tuning_status() is not None and again.wait_background(300)
    status = again.tuning_status()
    assert not status.last_error and status.kernels_searched == status.kernels_done == len(u.keys)
    for name, key in u.keys.items():
        assert db.get(dev, key).params["tile_x"] == u.favoured[name], name
    assert_close(run_model(lambda **_: again, u.model, u.feeds)[0], run_model(litert(), u.model, u.feeds)[0], 1e-4)


@pytest.mark.parametrize("spent", [False, True])
def test_the_convs_round_shares_the_models_budget(opencl_device, unfusing, monkeypatch, caplog, spent):
    """A fast search's round for the convs of a block it left unfused gets what the first round left of the
    model's budget (30 s here), not a budget of its own; where nothing is left (the clock moved on 100 s), the
    convs keep no record, for the next start to search, and a log line says so."""
    import types

    from tflgpu.autotune import MemoryTuningDB
    from tflgpu.runtime import tuning

    real, budgets = tuning.tune_tasks, []
    clock = types.SimpleNamespace(perf_counter=time.perf_counter)

    def counted(tasks, bench, device_key, config):
        budgets.append((sorted(t.op for t in tasks), config.model_budget()))
        out = real(tasks, bench, device_key, config)
        if spent:
            clock.perf_counter = lambda: time.perf_counter() + 100.0
        return out

    monkeypatch.setattr(tuning, "tune_tasks", counted)
    monkeypatch.setattr(tuning, "time", clock)
    db = MemoryTuningDB()
    with caplog.at_level(logging.INFO, logger="tflgpu"):
        Interpreter(model_content=unfusing.model, delegate=GpuDelegate(
            cache=False, tuning="fast", tuning_db=db, tuning_budget_s=30, tuning_trials=4)).allocate_tensors()
    dev = opencl_device.identity.key()
    assert budgets[0][1] == 30 and SEPARABLE_CONV in budgets[0][0]
    if spent:
        assert len(budgets) == 1 and all(db.get(dev, k) is None for k in unfusing.keys.values())
        assert "2 kernels of blocks the search left unfused are searched at the next start" in caplog.text
    else:
        assert [ops for ops, _ in budgets[1:]] == [["CONV_2D", "DEPTHWISE_CONV_2D"]]
        assert 0 < budgets[1][1] < 30
