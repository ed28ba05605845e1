"""A pointwise conv expanding a tensor and the depthwise conv reading it as one op (graph.passes.fuse_expand_depthwise)
and one kernel (kernels.expand_depthwise): the pass's conditions, every variant against LiteRT at FP32 and FP16, the
defaults (a GPU plan starts with the two convs' own kernels), and MobileNet v2 with its three-launch blocks fused."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tflgpu import GpuDelegate, Interpreter
from tflgpu.cpu.executor import ModelRunner
from tflgpu.graph.passes import EXPAND_DEPTHWISE, PassStep, fuse_expand_depthwise, fuse_separable
from tflgpu.kernels import expand_depthwise
from tflgpu.kernels.base import Target
from tflgpu.kernels.expand_depthwise import (
    EXPANDED_LOCAL_BYTES,
    ExpandDepthwiseKnobs,
    ExpandDepthwiseShape,
)
from tflgpu.kernels.knobs import InvalidKnobs
from tflgpu.model import read_model
from tflgpu.model.builder import ModelBuilder

from .conftest import MODELS_DIR, assert_close, litert, run_model

GPU = classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True))


def _out(size: int, k: int, stride: int, dil: int, pad: str) -> int:
    return -(-size // stride) if pad == "SAME" else (size - (k - 1) * dil - 1) // stride + 1


def block_model(rng, shape=(1, 9, 11, 12), cexp=40, k=3, stride=1, dil=1, pad="SAME", expand_act="RELU6",
                dw_act="RELU6", tap=False, expand_k=1, mult=1, between=()):
    """x -> CONV_2D expand_k x expand_k (cexp) [-> each unary op of ``between``] -> DEPTHWISE_CONV_2D (k, stride,
    dilation, padding; channel multiplier ``mult``) -> CONV_2D 1x1 (8): a MobileNet v2 block (``tap``: the expansion
    a graph output too); (model bytes, feeds)."""
    n, h, w, c = shape
    oh, ow = _out(h, k, stride, dil, pad), _out(w, k, stride, dil, pad)
    b = ModelBuilder()
    x = b.input("x", shape)
    normal = lambda name, *s, scale=1.0: b.const(name, (rng.standard_normal(s) * scale).astype(np.float32))
    e = b.tensor("expand", (n, h, w, cexp))
    b.op("CONV_2D", [x, normal("ex_w", cexp, expand_k, expand_k, c, scale=1 / np.sqrt(c)), normal("ex_b", cexp)],
         [e], padding="SAME", stride_w=1, stride_h=1, fused_activation_function=expand_act)
    for i, name in enumerate(between):
        t = b.tensor(f"between{i}", (n, h, w, cexp))
        b.op(name, [e], [t])
        e = t
    d = b.tensor("dw", (n, oh, ow, cexp * mult))
    b.op("DEPTHWISE_CONV_2D", [e, normal("dw_w", 1, k, k, cexp * mult), normal("dw_b", cexp * mult)], [d],
         padding=pad, stride_w=stride, stride_h=stride, dilation_w_factor=dil, dilation_h_factor=dil,
         depth_multiplier=mult, fused_activation_function=dw_act)
    y = b.tensor("project", (n, oh, ow, 8))
    b.op("CONV_2D", [d, normal("pw_w", 8, 1, 1, cexp * mult, scale=1 / np.sqrt(cexp)), normal("pw_b", 8)], [y],
         padding="SAME", stride_w=1, stride_h=1, fused_activation_function="NONE")
    b.output(y, *([e] if tap else []))
    return b.build(), [rng.uniform(-1, 1, shape).astype(np.float32)]


def _steps(model: bytes):
    runner = ModelRunner(read_model(model)).runner(0)
    return runner, [PassStep(op, [(op, fn)], [], True) for op, fn in runner.steps]


def test_pass_merges_an_expansion_and_its_depthwise_conv(rng):
    """At the depthwise conv's place, its op's index and outputs, the expansion's input its first input; the
    projection after it is left for the separable pass, which then has no depthwise conv to take."""
    runner, steps = _steps(block_model(rng)[0])
    merged, n = fuse_expand_depthwise(steps, runner.sg, runner.consts)
    assert n == 1 and [s.op.name for s in merged] == [EXPAND_DEPTHWISE, "CONV_2D"]
    op = merged[0].op
    assert [o.name for o, _ in merged[0].members] == ["CONV_2D", "DEPTHWISE_CONV_2D"]
    assert op.index == steps[1].op.index and op.outputs == steps[1].op.outputs
    assert op.inputs[0] == steps[0].op.inputs[0] and len(op.inputs) == 5
    assert op.options["expand"] is steps[0].op and op.options["depthwise"] is steps[1].op
    assert fuse_separable(merged, runner.sg, runner.consts)[1] == 0


@pytest.mark.parametrize("why", ["expansion read too", "3x3 expansion", "channel multiplier 2", "vetoed"])
def test_pass_leaves_what_it_cannot_fuse(rng, why):
    kw = {"expansion read too": {"tap": True}, "3x3 expansion": {"expand_k": 3}, "channel multiplier 2": {"mult": 2},
          "vetoed": {}}[why]
    runner, steps = _steps(block_model(rng, **kw)[0])
    allowed = (lambda a, b: False) if why == "vetoed" else (lambda a, b: True)
    merged, n = fuse_expand_depthwise(steps, runner.sg, runner.consts, allowed)
    assert n == 0 and [s.op.name for s in merged] == [s.op.name for s in steps]


def test_where_the_pass_runs():
    """On a GPU, for blocks whose depthwise conv and projection the separable pass's default leaves as two kernels
    (more than 384 expanded channels) and whose expansion reads at most MAX_INPUTS channels (MobileNet v2's 96 and
    160, not MobileNet v1's 256 and more); never on a CPU device."""
    gpu, cpu = Target(float_lanes=1, gpu=True), Target(float_lanes=16, gpu=False)
    assert not expand_depthwise.wanted(gpu, 384, 64) and expand_depthwise.wanted(gpu, 388, 64)
    assert expand_depthwise.wanted(gpu, 576, 96) and expand_depthwise.wanted(gpu, 960, 160)
    assert expand_depthwise.wanted(gpu, 960, expand_depthwise.MAX_INPUTS)
    assert not expand_depthwise.wanted(gpu, 960, expand_depthwise.MAX_INPUTS + 1)
    assert not expand_depthwise.wanted(gpu, 512, 256) and not expand_depthwise.wanted(gpu, 1024, 512)
    assert not expand_depthwise.wanted(cpu, 960, 160)


def test_defaults_and_validity():
    """Unfused by default; its fused point takes a whole image of up to 16 rows a group, as many slices as keep
    128 groups, and fits local memory; points over the local memory or the device's groups are refused."""
    v2_14 = ExpandDepthwiseShape(sexp=144, oh=14, iw=14)
    d = ExpandDepthwiseKnobs.default(v2_14)
    assert not d.fused and d.tile_rows(v2_14) == 14 and d.groups(v2_14) >= 128
    v2_7 = ExpandDepthwiseShape(sexp=240, oh=7, iw=14, sh=2)  # (the stride-2 block: 14x14 in, 7x7 out)
    d7 = ExpandDepthwiseKnobs.default(v2_7)
    assert d7.tile_rows(v2_7) == 7 and d7.input_rows(v2_7) == 15 and d7.groups(v2_7) >= 128
    wide = ExpandDepthwiseShape(sexp=24, oh=112, iw=112)
    dw = ExpandDepthwiseKnobs.default(wide)
    assert dw.tile_rows(wide) == 8 and replace(dw, fused=True).local_bytes(wide) <= EXPANDED_LOCAL_BYTES
    for shape in (v2_14, v2_7, wide):
        ExpandDepthwiseKnobs.resolve(shape, {"fused": True})  # (the fused default point is valid)
    with pytest.raises(InvalidKnobs, match="local memory"):
        ExpandDepthwiseKnobs.resolve(wide, {"fused": True, "rows": 16, "slices": 8})
    with pytest.raises(InvalidKnobs, match="group=96"):
        ExpandDepthwiseKnobs.resolve(v2_14, {"fused": True, "group": 96})
    # the pair takes its ops' own kernels: other knobs beside fused=False are moot
    assert ExpandDepthwiseKnobs.resolve(v2_14, {"fused": False, "rows": 2}) == d
    assert ExpandDepthwiseKnobs.space(ExpandDepthwiseShape(sexp=2, oh=3, iw=3))["rows"] == [1, 2, 3]
    # (DeepLab's 17 rows: even tiles of 9 and 8 by default, 6 a tile in the space)
    odd = ExpandDepthwiseShape(sexp=144, oh=17, iw=17)
    assert ExpandDepthwiseKnobs.default(odd).rows == 9
    assert ExpandDepthwiseKnobs.space(odd)["rows"] == [1, 2, 4, 6, 8, 9, 16]


def _plan(model: bytes, fp16: bool, params: dict, monkeypatch):
    """The model's plan under a GPU's target with the pass taking any block, its merged step generated with
    ``params``."""
    from tflgpu.runtime.config import PlanConfig
    from tflgpu.runtime.device import choose_device
    from tflgpu.runtime.executor import GpuPlan

    monkeypatch.setattr(Target, "of", GPU)
    monkeypatch.setattr(expand_depthwise, "wanted", lambda target, channels, inputs: target.gpu)
    it = Interpreter(model_content=model)
    runner = it.cpu_runner()
    index = next(op.index for op, _ in runner.steps if op.name == "DEPTHWISE_CONV_2D")
    return it, GpuPlan(runner, choose_device(), PlanConfig(fp16=fp16), params={index: params})


POINTS = {
    "whole image, 1 slice": {"fused": True, "rows": 16, "slices": 1, "group": 128},
    "2 rows, 4 slices": {"fused": True, "rows": 2, "slices": 4, "group": 64},
    "1 row, 8 slices, 256 items": {"fused": True, "rows": 1, "slices": 8, "group": 256},
    "4 rows, 2 slices": {"fused": True, "rows": 4, "slices": 2, "group": 128},
    "unfused": {"fused": False},
}
FP16_POINTS = ("4 rows, 2 slices", "unfused")
BLOCKS = {  # block_model arguments
    "stride 1": {},
    "stride 2, odd size, batch 2, padded lanes": {"shape": (2, 11, 9, 6), "cexp": 37, "stride": 2},
    "VALID stride 2, no activations": {"shape": (1, 10, 12, 8), "cexp": 24, "stride": 2, "pad": "VALID",
                                       "expand_act": "NONE", "dw_act": "NONE"},
    "dilated 5x5, RELU": {"shape": (1, 13, 10, 5), "cexp": 20, "k": 5, "dil": 2, "expand_act": "RELU"},
    # (unary ops of their own between the convs, as a quantized model's QUANT_SIM: computed on the expanded values)
    "unary ops between": {"shape": (1, 9, 8, 6), "cexp": 28, "expand_act": "NONE", "between": ("TANH", "HARD_SWISH")},
}


@pytest.mark.parametrize(("block", "point", "fp16"), [
    pytest.param(b, p, fp16, id=f"{b}-{p}-{'fp16' if fp16 else 'fp32'}") for b in sorted(BLOCKS) for p in sorted(POINTS)
    for fp16 in ((False, True) if p in FP16_POINTS else (False,))])
def test_variants_match_litert(opencl_device, rng, monkeypatch, block, point, fp16):
    """Every variant computes what LiteRT does (FP32 within 1e-4, FP16 within 1e-2 of the output's scale): tiles
    of one row to the whole image, rows whose windows leave it, groups of 1-8 slices past the last one, strides,
    dilation, VALID padding, batches, a channel count with padded lanes."""
    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    params = POINTS[point]
    model, feeds = block_model(rng, **BLOCKS[block])
    it, plan = _plan(model, fp16, params, monkeypatch)
    (step,) = [s for s in plan.steps if s.device == "gpu" and s.op.name == EXPAND_DEPTHWISE]
    assert plan.cpu_op_count == 0 and step.specs[0].params["fused"] is params["fused"]
    assert len(step.specs) == (1 if params["fused"] else 2)
    if params["fused"]:
        assert {k: step.specs[0].params[k] for k in params} == params
    got = plan.run(feeds)
    for t, want in zip(it.model.main.outputs, run_model(litert(), model, feeds)):
        assert_close(got[t], want, 1e-2 if fp16 else 1e-4)


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 2), h=st.integers(3, 20), w=st.integers(3, 20), c=st.integers(1, 12), cexp=st.integers(1, 40),
       k=st.sampled_from([3, 5]), stride=st.integers(1, 2), pad=st.sampled_from(["SAME", "VALID"]),
       rows=st.sampled_from([1, 2, 3, 4, 8, 9, 16]), slices=st.sampled_from([1, 2, 4, 8]), seed=st.integers(0, 2**16))
def test_random_blocks_match_litert(opencl_device, n, h, w, c, cexp, k, stride, pad, rows, slices, seed):
    """Blocks of any shape and fused points (where local memory takes them): LiteRT's values."""
    if pad == "VALID" and min(h, w) < k:
        return
    shape = ExpandDepthwiseShape(-(-cexp // 4), _out(h, k, stride, 1, pad), w, stride, k, 1, n)
    point = {"fused": True, "rows": rows, "slices": slices, "group": 64}
    try:
        ExpandDepthwiseKnobs.resolve(shape, point)
    except InvalidKnobs:
        return
    model, feeds = block_model(np.random.default_rng(seed), shape=(n, h, w, c), cexp=cexp, k=k, stride=stride,
                               pad=pad)
    with pytest.MonkeyPatch.context() as mp:
        it, plan = _plan(model, False, point, mp)
        (step,) = [s for s in plan.steps if s.op.name == EXPAND_DEPTHWISE]
        assert plan.cpu_op_count == 0 and len(step.specs) == 1
        got = plan.run(feeds)
    assert_close(got[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], 1e-4)


@pytest.mark.parametrize("fp16", [pytest.param(False, id="fp32"), pytest.param(True, id="fp16")])
def test_mobilenet_v2_under_a_gpus_defaults(opencl_device, monkeypatch, fp16):
    """Under a GPU's defaults MobileNet v2's six blocks of 576 and 960 expanded channels (the ones whose depthwise
    conv and projection take two kernels) are merged steps whose start is exactly the kernels the plan launched
    before the pass (the same code, grids and work-groups, tuning records left out); fused, the plan launches six
    kernels fewer and computes LiteRT's values."""
    from tflgpu.runtime.upgrades import retune_steps

    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    monkeypatch.setattr(Target, "of", GPU)
    path = MODELS_DIR / "mobilenet_v2_1.0_224.tflite"
    x = np.random.default_rng(0).uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)
    want = run_model(litert(), path, [x])[0]
    delegate = {"cache": False, "tuning_db": False, "tuning": "none", "precision_loss_allowed": fp16,
                "tiered_compile": False}
    code = lambda p: [(re.sub(r"\bk[0-9a-f]{16}\w*", "K", sp.source), sp.global_size, sp.local_size)
                      for s in p.steps if s.device == "gpu" for sp in s.specs]
    it = Interpreter(str(path), delegate=GpuDelegate(**delegate))
    plan = it.gpu_plan
    blocks = [s for s in plan.steps if s.op.name == EXPAND_DEPTHWISE]
    assert plan.pass_counts["fuse_expand_depthwise"] == 6 and len(blocks) == 6 and plan.cpu_op_count == 0
    assert len({s.op.options["depthwise"].index for s in blocks}) == 6  # (six depthwise convs of their own)
    assert all(len(s.specs) == 2 and s.specs[0].params["fused"] is False for s in blocks)
    with monkeypatch.context() as mp:
        mp.setattr(expand_depthwise, "wanted", lambda target, channels, inputs: False)
        without = Interpreter(str(path), delegate=GpuDelegate(**delegate)).gpu_plan
    assert code(plan) == code(without) and plan.launch_count() == without.launch_count()
    retune_steps(plan, [s.op.index for s in blocks], {"fused": True}, EXPAND_DEPTHWISE)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()  # (installs them)
    it.invoke()
    assert plan.launch_count() == without.launch_count() - 6
    assert all(len(s.specs) == 1 for s in plan.steps if s.op.name == EXPAND_DEPTHWISE)
    assert_close(it.get_tensor(it.get_output_details()[0]["index"]), want, 1e-2 if fp16 else 1e-4)


def test_the_tuner_times_the_fused_kernel_first(opencl_device, rng, monkeypatch):
    """The merged step is a tunable kernel whose search's first candidate is the fused kernel (the block's launch
    knob), so a GPU's background search fuses a block where that measures faster."""
    import pyopencl as cl

    from tflgpu.autotune.measure import KernelBench
    from tflgpu.autotune.tuner import KernelTuner, TuneTask
    from tflgpu.runtime.tuning import _identities

    model, _ = block_model(rng, shape=(1, 14, 14, 16), cexp=48)
    monkeypatch.setattr(Target, "of", GPU)
    monkeypatch.setattr(expand_depthwise, "wanted", lambda target, channels, inputs: target.gpu)
    plan = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False,
                                                                 tuning="none")).gpu_plan
    (block,) = [s for s in plan.steps if s.op.name == EXPAND_DEPTHWISE]
    found = _identities(plan.steps, plan.make, set(), None)
    ident = next(i for i in found.values() if i.steps[0] is block)
    space = ident.specs[0].space
    task = TuneTask("k", EXPAND_DEPTHWISE, lambda p: plan.make(ident.op, ident.epilogue, p), space,
                    {k: ident.specs[0].params[k] for k in space}, {})
    bench = KernelBench(cl, cl.Context([opencl_device.cl_device]), opencl_device, False, {})
    assert KernelTuner(task, bench, "dev", mode="fast", trials=4).neighbors()[0]["fused"] is True


@pytest.mark.parametrize("model,pairs", [("mobilenet_v1_1.0_224.tflite", 0), ("posenet_mnv1_257.tflite", 0),
                                         ("mobilenet_v2_1.0_224.tflite", 6),
                                         ("deeplab_mnv2_257.tflite", 6), ("ssd_mnv2_300.tflite", 5),
                                         ("unet_small_256.tflite", 0)])
def test_the_corpus_pairs_under_a_gpus_target(model, pairs):
    """A pointwise conv of at most MAX_INPUTS input channels whose output only a depthwise conv of more than 384
    channels reads: MobileNet v2's expansions (DeepLab's, SSD's), not MobileNet v1's (and PoseNet's) projections of
    256 and 512 channels into the next block's depthwise conv; each step starting as its two convs' kernels; none on
    a CPU device's target."""
    from .conftest import corpus_model, selected_steps

    path = corpus_model(model)
    steps = selected_steps(path, Target(float_lanes=1, gpu=True)).steps
    blocks = [s for s in steps if s.op.name == EXPAND_DEPTHWISE]
    assert len(blocks) == pairs and all(len(s.specs) == 2 for s in blocks)
    assert all(s.op.options["depthwise"].inputs[0] == s.op.options["expand"].outputs[0] for s in blocks)
    cpu = selected_steps(path, Target(float_lanes=16, gpu=False)).steps
    assert not [s for s in cpu if s.op.name == EXPAND_DEPTHWISE]


def test_a_searched_block_is_stored_and_warm_started(opencl_device, rng, monkeypatch, tmp_path):
    """A search's choice for a merged step (fused or not, and its knobs) is what a later process's plan starts from,
    out of the stored plan with nothing searched, and it computes LiteRT's values."""
    monkeypatch.setattr(Target, "of", GPU)
    monkeypatch.setattr(expand_depthwise, "wanted", lambda target, channels, inputs: target.gpu)
    model, feeds = block_model(rng, shape=(1, 12, 12, 8), cexp=24)
    want = run_model(litert(), model, feeds)[0]
    plans = []
    for _ in range(2):
        it = Interpreter(model_content=model, delegate=GpuDelegate(tuning="fast", tuning_budget_s=20, tuning_trials=3,
                                                                   serialization_dir=tmp_path, tiered_compile=False))
        (block,) = [s for s in it.gpu_plan.steps if s.op.name == EXPAND_DEPTHWISE]
        searched = [r.source for r in it.gpu_plan.tuning_results if r.op == EXPAND_DEPTHWISE]
        plans.append((it.gpu_plan.build_stats["plan"], searched, block.specs[0].params, len(block.specs)))
        assert_close(run_model(lambda it=it, **_: it, model, feeds)[0], want, 1e-4)
    assert plans[0][:2] == ("built", ["tuned"]) and plans[1][:2] == ("cache", ["record"])  # (nothing searched)
    assert plans[1][2:] == plans[0][2:]
