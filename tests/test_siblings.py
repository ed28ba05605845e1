"""Pointwise convs of one input as one GEMM on a GPU (graph.passes.merge_sibling_convs, kernels.siblings): the
pass's grouping, every variant against LiteRT at FP32 and FP16 (outputs of other channel counts, slice-layout and
dense boundary outputs, batches), the corpus models with heads."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.graph.passes import SIBLING_CONVS, PassStep, merge_sibling_convs
from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, corpus_model, elementwise_fused, gpu_target, litert, plan_with_params, run_model


def heads_model(rng, shape=(1, 9, 9, 40), couts=(12, 17, 34)):
    """x -> a 1x1 conv (RELU6) per ``couts``, the last one's output read by an ADD (so stored in the slice layout, the
    others graph outputs), a 1x1 conv with no activation and a 3x3 conv of x besides; (model bytes, feeds)."""
    n, h, w, c = shape
    b = ModelBuilder()
    x = b.input("x", shape)

    def conv(name, cout, k=1, act="RELU6"):
        y = b.tensor(name, (n, h, w, cout))
        wts = (rng.standard_normal((cout, k, k, c)) / np.sqrt(c * k * k)).astype(np.float32)
        b.op("CONV_2D", [x, b.const(f"{name}_w", wts), b.const(f"{name}_b", rng.standard_normal(cout)
                                                               .astype(np.float32))], [y],
             padding="SAME", stride_w=1, stride_h=1, fused_activation_function=act)
        return y

    outs = [conv(f"head{k}", cout) for k, cout in enumerate(couts)]
    summed = b.tensor("summed", (n, h, w, couts[-1]))
    b.op("ADD", [outs[-1], outs[-1]], [summed])
    b.output(*outs[:-1], summed, conv("linear", 8, act="NONE"), conv("window", 6, k=3))
    return b.build(), [rng.uniform(-1, 1, shape).astype(np.float32)]


def test_pass_merges_the_pointwise_convs_of_one_input_and_activation(rng):
    runner, steps = elementwise_fused(heads_model(rng)[0])
    merged, n = merge_sibling_convs(steps, runner.sg, runner.consts)
    assert n == 2 and len(merged) == len(steps) - 2
    (s,) = [s for s in merged if s.op.name == SIBLING_CONVS]
    heads = [op for op, _ in runner.steps if op.name == "CONV_2D"][:3]
    assert s.op.options["convs"] == tuple(heads) and [op for op, _ in s.members] == heads
    assert s.op.outputs == tuple(h.outputs[0] for h in heads) and s.op.index == heads[0].index
    assert s.op.inputs == (heads[0].inputs[0],) + tuple(t for h in heads for t in h.inputs[1:])
    # (the ADD fused into the last head's own step before the pass keeps that conv apart)
    steps[2] = PassStep(steps[2].op, steps[2].members, [object()], True)
    assert merge_sibling_convs(steps, runner.sg, runner.consts)[1] == 1
    assert merge_sibling_convs(steps, runner.sg, runner.consts, lambda a, b: False)[1] == 0


POINTS = {
    "default": ({}, 1),
    "32 x 8 tile, 8 slices a step": ({"group_tile": (32, 8), "k_chunk": 8, "k_split": 1}, 1),
    "sum in 2 shares, prefetch": ({"group_tile": (16, 4), "k_chunk": 4, "k_split": 2, "prefetch": True}, 1),
    "2 pixels x 2 slices a work-item": ({"group_tile": (16, 4), "tile_x": 2, "tile_s": 2, "k_split": 1}, 1),
    "unfused": ({"fused": False}, 3),
}
SHAPES = {"9x9x40": {}, "batch 2, 5x7x9": {"shape": (2, 5, 7, 9), "couts": (4, 3, 9)}}


@pytest.mark.parametrize(("shape", "point", "fp16"), [
    pytest.param(s, p, fp16, id=f"{s}-{p}-{'fp16' if fp16 else 'fp32'}") for s in sorted(SHAPES) for p in sorted(POINTS)
    for fp16 in ((False, True) if p in ("default", "unfused") else (False,))])
def test_sibling_convs_match_litert(opencl_device, rng, monkeypatch, shape, point, fp16):
    """Every variant computes each conv's output as LiteRT does (FP32 within 1e-4, FP16 within 1e-2 of its
    scale): channel counts that are not whole slices, the slice layout an ADD reads, batches."""
    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    gpu_target(monkeypatch)
    params, kernels = POINTS[point]
    model, feeds = heads_model(rng, **SHAPES[shape])
    it, plan = plan_with_params(opencl_device, model, ("CONV_2D",), params, fp16)  # (the first head's index)
    (step,) = [s for s in plan.steps if s.op.name == SIBLING_CONVS]
    assert len(step.specs) == kernels and plan.cpu_op_count == 0
    assert {k: step.specs[0].params[k] for k in params} == params
    got = plan.run(feeds)
    for t, want in zip(it.model.main.outputs, run_model(litert(), model, feeds)):
        assert_close(got[t], want, 1e-2 if fp16 else 1e-4, what=f"output {t}")


def test_graph_outputs_are_written_densely(opencl_device, rng, monkeypatch):
    """Through an Interpreter the heads that are graph outputs are written as their dense boundary buffers by the
    merged kernel itself (no conversion launch), the one an ADD reads in the slice layout."""
    gpu_target(monkeypatch)
    model, feeds = heads_model(rng)
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False, tuning="none",
                                                               tiered_compile=False))
    got = run_model(lambda **kw: it, model, feeds)
    (spec,) = [sp for s in it.gpu_plan.steps if s.op.name == SIBLING_CONVS for sp in s.specs]
    outputs = it.model.main.outputs
    assert spec.dense == frozenset(outputs[:2]) and len(spec.outputs) == 3
    for g, want in zip(got, run_model(litert(), model, feeds)):
        assert_close(g, want, 1e-4)


def test_defaults_and_invalid_points():
    from tflgpu.kernels.conv import ConvShape
    from tflgpu.kernels.knobs import InvalidKnobs
    from tflgpu.kernels.siblings import SiblingKnobs

    gpu = ConvShape(1, 1, 1, 1, 1, 1, 256, 30, row=289, pixels=289, w_bytes=4 * 120 * 1024, pointwise=True,
                    gpu=True, max_group=1024)
    knobs = SiblingKnobs.default(gpu)
    assert knobs.fused and knobs.group_tile is not None and knobs.k_split == 4  # (the deep pointwise default)
    assert not SiblingKnobs.default(ConvShape(1, 1, 1, 1, 1, 1, 256, 30, row=289, pixels=289, w_bytes=1,
                                              pointwise=True)).fused  # (a CPU device's target)
    with pytest.raises(InvalidKnobs, match="group tile"):
        SiblingKnobs.resolve(gpu, {"group_tile": None, "k_split": 1})
    assert SiblingKnobs.resolve(gpu, {"fused": False, "group_tile": None}) == \
        SiblingKnobs(**{**knobs.params(), "fused": False})


@pytest.mark.parametrize(("name", "launches", "merged"), [("posenet_mnv1_257.tflite", 23, 1),
                                                          ("ssd_mnv2_300.tflite", 45, 2)])
def test_corpus_heads_under_a_gpus_target(opencl_device, monkeypatch, name, launches, merged):
    """PoseNet's four heads (17, 34, 32, 32 channels, graph outputs) are one launch under a GPU's target (26 -> 23),
    an SSD feature map's box and class convs one each (47 -> 45), within LiteRT's tolerance."""
    gpu_target(monkeypatch)
    path = corpus_model(name)
    rng = np.random.default_rng(3)
    probe = Interpreter(model_path=str(path))
    feeds = [rng.uniform(-1, 1, d["shape"]).astype(np.float32) for d in probe.get_input_details()]
    it = Interpreter(model_path=str(path), delegate=GpuDelegate(cache=False, tuning="none", tiered_compile=False))
    got = run_model(lambda **kw: it, path, feeds)
    plan = it.gpu_plan
    assert sum(s.op.name == SIBLING_CONVS for s in plan.steps) == merged and plan.launch_count() == launches
    for g, want in zip(got, run_model(litert(), path, feeds)):
        assert_close(g, want, 1e-4)
