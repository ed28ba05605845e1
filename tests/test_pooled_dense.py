"""A spatial MEAN and the FULLY_CONNECTED / pointwise CONV_2D reading it as one op on a GPU
(graph.passes.fuse_pooled_dense) and one kernel (kernels.pooled_dense): the pass's conditions, every variant
against LiteRT at FP32 and FP16, the defaults."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tflgpu import GpuDelegate, Interpreter
from tflgpu.graph.passes import BETWEEN, POOLED_DENSE, fuse_pooled_dense
from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, elementwise_fused, gpu_target, litert, plan_with_params, run_model


def head_model(rng, shape=(1, 7, 7, 64), units=37, dense="FULLY_CONNECTED", act="NONE", relu_after=False,
               second_reader=False, mean_out=False, between=()):
    """x -> MEAN (spatial) [-> each unary op of ``between``] -> FULLY_CONNECTED (or a 1x1 CONV_2D on the kept dims)
    [-> RELU] -> SOFTMAX; (model bytes, feeds)."""
    n, _, _, c = shape
    b = ModelBuilder()
    x = b.input("x", shape)
    conv = dense == "CONV_2D"
    mshape = (n, 1, 1, c) if conv else (n, c)
    m = b.tensor("mean", mshape)
    b.op("MEAN", [x, b.const("axes", np.int32([1, 2]))], [m], keep_dims=conv)
    mean = m
    for i, name in enumerate(between):
        t = b.tensor(f"between{i}", mshape)
        b.op(name, [m], [t])
        m = t
    y = b.tensor("logits", (n, 1, 1, units) if conv else (n, units))
    wts = (rng.standard_normal((units, c)) / np.sqrt(c)).astype(np.float32)
    if conv:
        b.op("CONV_2D", [m, b.const("w", wts.reshape(units, 1, 1, c)), b.const("b", rng.standard_normal(units)
                                                                             .astype(np.float32))], [y],
             padding="VALID", stride_w=1, stride_h=1, fused_activation_function=act)
    else:
        b.op("FULLY_CONNECTED", [m, b.const("w", wts), b.const("b", rng.standard_normal(units).astype(np.float32))],
             [y], fused_activation_function=act)
    if relu_after:
        r = b.tensor("relu", (n, 1, 1, units) if conv else (n, units))
        b.op("RELU", [y], [r])
        y = r
    outs = [y]
    if second_reader:
        s = b.tensor("sq", mshape)
        b.op("RELU", [mean], [s])
        outs.append(s)
    if mean_out:
        outs.append(mean)
    b.output(*outs)
    return b.build(), [rng.uniform(-1, 1, shape).astype(np.float32)]


@pytest.mark.parametrize("dense", ["FULLY_CONNECTED", "CONV_2D"])
def test_pass_merges_a_head(rng, dense):
    runner, steps = elementwise_fused(head_model(rng, dense=dense, relu_after=True)[0])
    merged, n = fuse_pooled_dense(steps, runner.sg, runner.consts)
    assert n == 1 and len(merged) == len(steps) - 1
    (s,) = merged
    assert s.op.name == POOLED_DENSE and [op.name for op, _ in s.members] == ["MEAN", dense, "RELU"]
    assert s.op.inputs[0] == steps[0].op.inputs[0] and s.op.options["dense"] is steps[1].op and s.epilogue
    assert s.op.index == steps[1].op.index


def test_pass_takes_a_whole_image_average_pool(rng, monkeypatch):
    """An AVERAGE_POOL_2D whose window is the whole image (TF-Slim's MobileNet v1 head: 7x7 VALID) is a mean: the
    head merges, and its kernel (under a GPU's target) computes LiteRT's values."""
    from tflgpu.runtime.config import PlanConfig
    from tflgpu.runtime.device import choose_device
    from tflgpu.runtime.executor import GpuPlan

    b = ModelBuilder()
    x = b.input("x", (1, 7, 7, 36))
    m, y = b.tensor("pool", (1, 1, 1, 36)), b.tensor("logits", (1, 1, 1, 11))
    b.op("AVERAGE_POOL_2D", [x], [m], padding="VALID", stride_w=2, stride_h=2, filter_width=7, filter_height=7)
    b.op("CONV_2D", [m, b.const("w", rng.standard_normal((11, 1, 1, 36)).astype(np.float32)),
                     b.const("b", rng.standard_normal(11).astype(np.float32))], [y], padding="SAME", stride_w=1,
         stride_h=1)
    b.output(y)
    model, feeds = b.build(), [rng.uniform(-1, 1, (1, 7, 7, 36)).astype(np.float32)]
    runner, steps = elementwise_fused(model)
    merged, n = fuse_pooled_dense(steps, runner.sg, runner.consts)
    assert n == 1 and [op.name for op, _ in merged[0].members] == ["AVERAGE_POOL_2D", "CONV_2D"]
    gpu_target(monkeypatch)
    it = Interpreter(model_content=model)
    plan = GpuPlan(it.cpu_runner(), choose_device(), PlanConfig(), params={1: {"fused": True, "group": (4, 64)}})
    assert [s.op.name for s in plan.steps] == [POOLED_DENSE] and len(plan.steps[0].specs) == 1
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0])


def test_pass_takes_the_unary_ops_after_the_mean(rng):
    """Unary elementwise steps between the MEAN and the dense op (a quantized model's QUANT_SIM; here a TANH and
    a HARD_SWISH, one step after fuse_elementwise) join the head: run in order by the CPU, under BETWEEN for its
    kernel."""
    runner, steps = elementwise_fused(head_model(rng, between=("TANH", "HARD_SWISH"))[0])
    assert [s.op.name for s in steps] == ["MEAN", "TANH", "FULLY_CONNECTED"]
    merged, n = fuse_pooled_dense(steps, runner.sg, runner.consts)
    assert n == 2 and len(merged) == len(steps) - 2
    assert [op.name for op, _ in merged[0].members] == ["MEAN", "TANH", "HARD_SWISH", "FULLY_CONNECTED"]
    assert [f.op.name for f in merged[0].op.options[BETWEEN]] == ["TANH", "HARD_SWISH"]


@pytest.mark.parametrize("why", ["two readers", "mean is an output", "over the channels", "vetoed"])
def test_pass_leaves_what_it_cannot_fuse(rng, why):
    kw = {"two readers": {"second_reader": True}, "mean is an output": {"mean_out": True},
          "over the channels": {}, "vetoed": {}}[why]
    if why == "over the channels":
        b = ModelBuilder()
        x = b.input("x", (1, 4, 4, 8))
        m = b.tensor("m", (1, 4, 4))
        b.op("MEAN", [x, b.const("axes", np.int32([3]))], [m], keep_dims=False)
        y = b.tensor("y", (1, 4, 3))
        b.op("FULLY_CONNECTED", [m, b.const("w", rng.standard_normal((3, 4)).astype(np.float32))], [y],
             keep_num_dims=True)
        b.output(y)
        model = b.build()
    else:
        model = head_model(rng, **kw)[0]
    runner, steps = elementwise_fused(model)
    allowed = (lambda a, b: False) if why == "vetoed" else (lambda a, b: True)
    merged, n = fuse_pooled_dense(steps, runner.sg, runner.consts, allowed)
    assert n == 0 and len(merged) == len(steps)


POINTS = {
    "8 slices by 256": ({"fused": True, "group": (8, 256)}, 1),
    "8 slices by 128": ({"fused": True, "group": (8, 128)}, 1),
    # (a device whose work-groups take 1,024 work-items: the means in 2-3 steps of 128 slices)
    "4 slices by 1024": ({"fused": True, "group": (4, 1024)}, 1),
    "8 slices by 512": ({"fused": True, "group": (8, 512)}, 1),
    "4 slices by 64": ({"fused": True, "group": (4, 64)}, 1),
    "32 slices by 256": ({"fused": True, "group": (32, 256)}, 1),
    "one work-item a slice": ({"fused": True, "group": (16, 16)}, 1),
    "unfused": ({"fused": False}, 2),
}

HEADS = {
    "FC 7x7x64 -> 37": {},
    "FC batch 2, 30 channels, relu6": {"shape": (2, 5, 3, 30), "units": 10, "act": "RELU6"},
    "1x1 conv 4x4x300 -> 1001, relu after": {"shape": (1, 4, 4, 300), "units": 1001, "dense": "CONV_2D",
                                             "relu_after": True},
    # (unary ops of their own after the MEAN, as a quantized model's QUANT_SIM: applied to the means)
    "FC, unary ops between": {"shape": (1, 6, 6, 40), "units": 21, "between": ("TANH", "HARD_SWISH")},
}


@pytest.mark.parametrize(("head", "point", "fp16"), [
    pytest.param(h, p, fp16, id=f"{h}-{p}-{'fp16' if fp16 else 'fp32'}") for h in sorted(HEADS) for p in sorted(POINTS)
    for fp16 in ((False, True) if p in ("8 slices by 256", "unfused") else (False,))])  # (FP16: default and pair)
def test_pooled_dense_variants_match_litert(opencl_device, rng, monkeypatch, fp16, point, head):
    """Every variant computes what LiteRT does (FP32 within 1e-4, FP16 within 1e-2 of the output's scale): batches,
    padded input and output lanes, fused activations and a fused op after the dense one."""
    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    gpu_target(monkeypatch)
    params, kernels = POINTS[point]
    model, feeds = head_model(rng, **HEADS[head])
    it, plan = plan_with_params(opencl_device, model, ("FULLY_CONNECTED", "CONV_2D"), params, fp16)  # (the head's)
    (step,) = [s for s in plan.steps if s.op.name == POOLED_DENSE]
    # (unfused, the unary ops between take a kernel of their own, as before the pass)
    between = bool(HEADS[head].get("between")) and not params["fused"]
    assert len(step.specs) == kernels + between and plan.cpu_op_count == 0
    assert {k: step.specs[0].params[k] for k in params} == params
    got = plan.run(feeds)[it.model.main.outputs[0]]
    assert_close(got, run_model(litert(), model, feeds)[0], 1e-2 if fp16 else 1e-4)


def test_defaults_and_invalid_points():
    from tflgpu.kernels.knobs import InvalidKnobs
    from tflgpu.kernels.pooled_dense import PooledKnobs, PooledShape

    gpu = PooledShape(sin=320, sout=251, gpu=True)
    assert PooledKnobs.default(gpu) == PooledKnobs(True, (8, 256))
    # groups of more than 256 work-items where the device's work-groups take them
    wide = PooledShape(sin=320, sout=251, gpu=True, max_group=1024)
    assert max(g[1] for g in PooledKnobs.space(gpu)["group"]) == 256
    assert (4, 1024) in PooledKnobs.space(wide)["group"] and PooledKnobs.default(wide) == PooledKnobs.default(gpu)
    assert PooledKnobs.resolve(wide, {"group": (8, 1024)}).group == (8, 1024)
    with pytest.raises(InvalidKnobs, match="at most 512"):
        PooledKnobs.resolve(PooledShape(sin=320, sout=251, gpu=True, max_group=512), {"group": (8, 1024)})
    assert not PooledKnobs.default(PooledShape(sin=320, sout=251)).fused  # (a CPU device)
    assert not PooledKnobs.default(PooledShape(sin=4096, sout=251, gpu=True)).fused  # (the means overflow)
    for bad, match in (({"group": (8, 96)}, "power-of-two"), ({"group": (8, 512)}, "at most 256"),
                       ({"group": (3, 8)}, "multiple"), ({"group": 8}, "2 positive ints")):
        with pytest.raises(InvalidKnobs, match=match):
            PooledKnobs.resolve(gpu, bad)
    assert PooledKnobs.resolve(gpu, {"fused": False, "group": (4, 64)}) == PooledKnobs(False, (8, 256))


@pytest.mark.parametrize("length", [16, 17, 31, 32, 33, 300])
def test_a_gpus_reduction_default_is_in_its_space(length):
    """A GPU's MEAN / SOFTMAX default for 16 terms was a group of 16, which the space (1, 32, ... 256) refuses:
    the unfused head's MEAN of a 4 x 4 image went to the CPU."""
    from tflgpu.kernels.pool import ReduceKnobs, ReduceShape

    shape = ReduceShape(length, gpu=True)
    knobs = ReduceKnobs.default(shape)
    assert ReduceKnobs.resolve(shape, knobs.params()) == knobs and knobs.group >= 32


def test_a_cpu_device_keeps_its_two_kernels(opencl_device, rng):
    """The pass runs for a GPU's plan only; a CPU device's keeps the MEAN's and the dense op's own kernels."""
    model, _ = head_model(rng)
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False))
    if it.gpu_plan.make.target.gpu:
        pytest.skip("the device is a GPU")
    assert [s.op.name for s in it.gpu_plan.steps if s.device == "gpu"][:2] == ["MEAN", "FULLY_CONNECTED"]
    assert "fuse_pooled_dense" not in it.gpu_plan.pass_counts


def test_mobilenet_heads(opencl_device, monkeypatch):
    """MobileNet v1's MEAN -> 1x1 CONV_2D and v2's MEAN -> FULLY_CONNECTED are one launch each on a GPU, and the
    classes' probabilities are LiteRT's."""
    from .conftest import MODELS_DIR

    gpu_target(monkeypatch)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)
    for name in ("mobilenet_v1_1.0_224.tflite", "mobilenet_v2_1.0_224.tflite"):
        path = MODELS_DIR / name
        it = Interpreter(str(path), delegate=GpuDelegate(cache=False, tuning_db=False, tiered_compile=False))
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        (head,) = [s for s in it.gpu_plan.steps if s.op.name == POOLED_DENSE]
        assert len(head.specs) == 1 and it.gpu_plan.pass_counts["fuse_pooled_dense"] == 1
        assert_close(it.get_tensor(it.get_output_details()[0]["index"]), run_model(litert(), path, [x])[0])


@settings(max_examples=12)
@given(n=st.integers(1, 3), h=st.integers(1, 9), w=st.integers(1, 9), c=st.integers(1, 70), units=st.integers(1, 90),
       dense=st.sampled_from(["FULLY_CONNECTED", "CONV_2D"]), act=st.sampled_from(["NONE", "RELU", "RELU6"]),
       relu_after=st.booleans(), seed=st.integers(0, 2**16))
def test_random_heads_match_litert(opencl_device, n, h, w, c, units, dense, act, relu_after, seed):
    """Heads of any shape (one pixel, odd channel counts, batches) under a GPU's defaults, fused: LiteRT's values."""
    from tflgpu.kernels.base import Target

    model, feeds = head_model(np.random.default_rng(seed), shape=(n, h, w, c), units=units, dense=dense, act=act,
                              relu_after=relu_after)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
        it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False, tiered_compile=False))
        it.allocate_tensors()
    (step,) = [s for s in it.gpu_plan.steps if s.op.name == POOLED_DENSE]
    assert it.gpu_plan.cpu_op_count == 0 and step.specs[0].params["fused"] is True
    assert_close(it.gpu_plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], 1e-4)
