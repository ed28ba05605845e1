"""Elementwise regions (graph.passes.fuse_regions): connected elementwise steps of one layout become one kernel,
which gives LiteRT's outputs and, at FP32 and FP16 alike, exactly the outputs of the plan without the pass (each
step's value rounded as its storage rounds it)."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.graph.passes import ELEMENTWISE_REGION
from tflgpu.model.builder import ModelBuilder
from tflgpu.runtime.config import PlanConfig

from .conftest import assert_close, assert_fp16_close, litert, on_optimized_code, run_model
from .oputil import rand


def branchy_model(rng, c=6):
    """Two convs, then an activation block of branches over their sums and differences (opzoo's shape): what
    leaves it is pooled, concatenated or read later. A MUL of a branch by a conv of a branch (made after the block
    starts) cannot join it."""
    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 5))
    shape = (1, 8, 8, c)

    def t(name):
        return b.tensor(name, shape)

    a, d = t("a"), t("d")
    b.op("CONV_2D", [x, b.const("w1", rand(rng, (c, 3, 3, 5))), b.const("b1", rand(rng, (c,)))], [a],
         padding="SAME", stride_w=1, stride_h=1)
    b.op("CONV_2D", [x, b.const("w2", rand(rng, (c, 1, 1, 5))), b.const("b2", rand(rng, (c,)))], [d],
         padding="SAME", stride_w=1, stride_h=1)
    s, th, df, mx, mn, sc, ex, lg, pr, hs = (t(n) for n in ("s", "th", "df", "mx", "mn", "sc", "ex", "lg", "pr", "hs"))
    b.op("ADD", [a, d], [s], fused_activation_function="RELU6")
    b.op("TANH", [s], [th])
    b.op("SUB", [a, d], [df])
    b.op("MAXIMUM", [s, df], [mx])
    b.op("MINIMUM", [s, df], [mn])
    b.op("MUL", [mn, b.const("per_channel", rng.uniform(0.5, 1.5, (c,)).astype(np.float32))], [sc])
    b.op("EXP", [sc], [ex])
    b.op("LOGISTIC", [df], [lg])
    b.op("MUL", [th, lg], [pr])
    b.op("HARD_SWISH", [pr], [hs])
    pooled = b.tensor("pooled", (1, 4, 4, c))
    b.op("AVERAGE_POOL_2D", [mx], [pooled], padding="VALID", stride_w=2, stride_h=2, filter_width=2, filter_height=2)
    cat = b.tensor("cat", (1, 8, 8, 2 * c))
    b.op("CONCATENATION", [ex, hs], [cat], axis=3)
    # after the block: a conv of one of its values, then a MUL of a block value by that (made after the block's
    # first step: it cannot join)
    k, late = t("k"), t("late")
    b.op("CONV_2D", [mx, b.const("w3", rand(rng, (c, 1, 1, c))), b.const("b3", rand(rng, (c,)))], [k],
         padding="SAME", stride_w=1, stride_h=1)
    b.op("MUL", [th, k], [late])
    b.output(pooled, cat, late, k)  # (k read twice: its MUL is a step of its own, not the conv's epilogue)
    return b.build(), [rand(rng, (1, 8, 8, 5))]


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("c", [6, 8])
def test_an_activation_block_is_one_kernel_and_computes_what_its_steps_did(opencl_device, rng, fp16, c):
    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    from tflgpu.runtime.executor import GpuPlan

    model, feeds = branchy_model(rng, c)
    it = Interpreter(model_content=model, delegate=GpuDelegate(precision_loss_allowed=fp16))
    plan = it.gpu_plan
    regions = [s for s in plan.steps if s.op.name == ELEMENTWISE_REGION]
    assert len(regions) == 1 and plan.pass_counts["fuse_regions"] == 5 and plan.cpu_op_count == 0
    (region,) = regions
    assert [op.name for op, _ in region.members] == ["ADD", "TANH", "SUB", "MAXIMUM", "MINIMUM", "MUL", "EXP",
                                                      "LOGISTIC", "MUL", "HARD_SWISH"]
    names = {t.name: t.index for t in it.model.main.tensors}
    # stored: what the pool, the concatenation, the late conv and MUL read; the rest stays in registers
    assert set(region.op.outputs) == {names[n] for n in ("mx", "ex", "hs", "th")}
    assert len(region.specs) == 1
    got = run_model(lambda **kw: on_optimized_code(it), model, feeds)
    for g, w in zip(got, run_model(litert(), model, feeds)):
        (assert_fp16_close(g, w) if fp16 else assert_close(g, w))
    unfused = GpuPlan(it.cpu_runner(), opencl_device, PlanConfig(fp16=fp16, fuse_regions=False))
    assert unfused.pass_counts["fuse_regions"] == 0
    assert sum(len(s.specs) for s in unfused.steps) == sum(len(s.specs) for s in plan.steps) + 5
    outs = unfused.run(feeds)
    for g, t in zip(got, it.model.main.outputs):
        np.testing.assert_array_equal(g, outs[t])


def test_steps_of_other_layouts_or_unconnected_keep_their_kernels(opencl_device, rng):
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 8))
    y = b.input("y", (1, 4, 4, 8))
    small = b.input("small", (1, 2, 2, 8))
    r, e, r2, s2 = (b.tensor(n, s) for n, s in (("r", (1, 4, 4, 8)), ("e", (1, 4, 4, 8)), ("r2", (1, 2, 2, 8)),
                                                ("s2", (1, 2, 2, 8))))
    b.op("RELU", [x], [r])
    b.op("EXP", [y], [e])  # (reads nothing the RELU reads or makes)
    b.op("TANH", [small], [r2])
    b.op("LOGISTIC", [r2], [s2])  # (a chain of its own layout: fused as before, not a region)
    b.output(r, e, s2)
    model = b.build()
    feeds = [rand(rng, (1, 4, 4, 8)), rand(rng, (1, 4, 4, 8)), rand(rng, (1, 2, 2, 8))]
    it = Interpreter(model_content=model, delegate=GpuDelegate())
    assert it.gpu_plan.pass_counts["fuse_regions"] == 0
    for g, w in zip(run_model(lambda **kw: it, model, feeds), run_model(litert(), model, feeds)):
        assert_close(g, w)
