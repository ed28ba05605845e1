"""Tensors between two device steps handed over as dense NHWC buffers on a CPU device (runtime.selection.hand_over):
which are, that each plan computes LiteRT's values, that no kernel's tuning identity changes, and that a background
swap to a form reading the slice layout is refused."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.graph.passes import SEPARABLE_CONV
from tflgpu.kernels.base import Target
from tflgpu.model.builder import ModelBuilder
from tflgpu.runtime.config import PlanConfig
from tflgpu.runtime.executor import GpuPlan

from .conftest import assert_close, litert, run_model


def _conv(b, rng, x, cin, cout, hw, name, act="RELU6", k=1):
    y = b.tensor(name, (1, hw, hw, cout))
    w = (rng.standard_normal((cout, k, k, cin)) / np.sqrt(k * k * cin)).astype(np.float32)
    b.op("CONV_2D", [x, b.const(f"{name}_w", w), b.const(f"{name}_b", rng.standard_normal(cout).astype(np.float32))],
         [y], padding="SAME", stride_w=1, stride_h=1, fused_activation_function=act)
    return y


def _depthwise(b, rng, x, c, hw, name):
    y = b.tensor(name, (1, hw, hw, c))
    b.op("DEPTHWISE_CONV_2D", [x, b.const(f"{name}_w", rng.standard_normal((1, 3, 3, c)).astype(np.float32)),
                               b.const(f"{name}_b", rng.standard_normal(c).astype(np.float32))], [y],
         padding="SAME", stride_w=1, stride_h=1, depth_multiplier=1, fused_activation_function="RELU6")
    return y


def chain_model(rng, hw=20):
    """x -> 1x1 conv 8 -> 48 (``expanded``) -> depthwise + 1x1 conv to 16 (a separable block) -> 1x1 conv 16 -> 32
    (``widened``) -> depthwise (``filtered``) -> 3x3 conv 32 -> 12; (model, feeds, the named tensors)."""
    b = ModelBuilder()
    x = b.input("x", (1, hw, hw, 8))
    expanded = _conv(b, rng, x, 8, 48, hw, "expanded")
    dw = _depthwise(b, rng, expanded, 48, hw, "dw")
    block = _conv(b, rng, dw, 48, 16, hw, "block", act="NONE")
    widened = _conv(b, rng, block, 16, 32, hw, "widened")
    filtered = _depthwise(b, rng, widened, 32, hw, "filtered")
    out = _conv(b, rng, filtered, 32, 12, hw, "out", act="NONE", k=3)
    b.output(out)
    names = {"expanded": expanded, "block": block, "widened": widened, "filtered": filtered}
    return b.build(), [rng.uniform(-1, 1, (1, hw, hw, 8)).astype(np.float32)], names


def _plan(model: bytes, fp16: bool, **config) -> tuple[Interpreter, GpuPlan]:
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False))
    return it, GpuPlan(it.cpu_runner(), it.gpu_plan.device, PlanConfig(fp16=fp16, **config))


@pytest.fixture(params=[pytest.param(False, id="fp32"), pytest.param(True, id="fp16")])
def fp16(request, opencl_device):
    if request.param and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    return request.param


def test_tensors_between_steps_are_handed_over_densely(opencl_device, rng, fp16):
    """On a CPU device, in an FP32 plan: the expansion's output, which the separable block's kernel reads, the 1x1
    conv's output a depthwise conv reads, and the depthwise conv's output, which a 3x3 conv reads, are handed over
    densely (the writer and every reader say so); the block's output is not (the separable block's kernel writes
    slices). Each kernel's code without the hand-over, its identity, is
    the code of the plan without the pass; LiteRT's values either way. An FP16 plan, or a GPU, hands nothing over."""
    model, feeds, t = chain_model(rng)
    want = run_model(litert(), model, feeds)[0]
    it, plan = _plan(model, fp16)
    _, off = _plan(model, fp16, hand_over=False)
    gpu = Target.of(opencl_device.cl_device, opencl_device.identity.device_type).gpu
    expected = set() if fp16 or gpu else {t["expanded"], t["widened"], t["filtered"]}
    assert set(plan.make.handover) == expected and plan.pass_counts["hand_over"] == len(expected)
    assert "hand_over" not in off.pass_counts and not off.make.handover
    for s in plan.steps:
        for spec in s.specs:
            handed = set(spec.dense) & expected
            assert handed == set(spec.inputs + spec.outputs) & expected, s.op.name
    assert [s.op.name for s in plan.steps] == [s.op.name for s in off.steps]
    assert SEPARABLE_CONV in [s.op.name for s in plan.steps]
    for s, o in zip(plan.steps, off.steps):
        key = [(sp.source, sp.global_size) for sp in plan.make.heuristic(s.op, s.epilogue)]
        assert key == [(sp.source, sp.global_size) for sp in o.specs], s.op.name
    tol = 1e-2 if fp16 else 1e-4
    out = it.model.main.outputs[0]
    assert_close(plan.run(feeds)[out], want, tol)
    assert_close(plan.run(feeds)[out], want, tol)  # (again: nothing of the first run is left to be read)
    assert_close(off.run(feeds)[out], want, tol)


def test_a_tensor_a_fused_op_reads_too_keeps_the_slice_layout(opencl_device, rng):
    """x -> 1x1 conv (``a``) -> 1x1 conv -> ADD a: the second conv's kernel reads ``a`` twice, as its input and as
    its fused ADD's operand (which reads the slice layout), so ``a`` is not handed over; LiteRT's values."""
    b = ModelBuilder()
    x = b.input("x", (1, 12, 12, 8))
    a = _conv(b, rng, x, 8, 16, 12, "a")
    c = _conv(b, rng, a, 16, 16, 12, "c", act="NONE")
    z = b.tensor("z", (1, 12, 12, 16))
    b.op("ADD", [c, a], [z], fused_activation_function="RELU")
    b.output(z)
    model, feeds = b.build(), [rng.uniform(-1, 1, (1, 12, 12, 8)).astype(np.float32)]
    it, plan = _plan(model, False)
    assert a not in plan.make.handover
    assert_close(plan.run(feeds)[z], run_model(litert(), model, feeds)[0])


def test_a_swap_keeps_the_hand_over_or_is_refused(opencl_device, rng, caplog):
    """A background winner for the separable block reading the handed-over expansion (its two convs' own kernels)
    reads it densely as well (the depthwise conv's dense input) and is installed; one for the expansion that
    cannot write it densely (a GPU's group tile) is refused (the conv refuses the point, ConvKnobs.problems, and a
    form not honouring a handed-over tensor would be refused by runtime.upgrades as well). The plan computes
    LiteRT's values throughout."""
    import logging

    from tflgpu.runtime.upgrades import retune_steps

    model, feeds, t = chain_model(rng)
    it, plan = _plan(model, False)
    if t["expanded"] not in plan.make.handover:
        pytest.skip("this device hands nothing over (a GPU)")
    out = it.model.main.outputs[0]
    want = run_model(litert(), model, feeds)[0]
    (block,) = [s for s in plan.steps if s.op.name == SEPARABLE_CONV]
    (expansion,) = [s for s in plan.steps if t["expanded"] in s.op.outputs]
    retune_steps(plan, [block.op.index], {"fused": False}, SEPARABLE_CONV)
    assert_close(plan.run(feeds)[out], want)  # (the run installs the swap first)
    assert len(block.specs) == 2 and t["expanded"] in block.specs[0].dense  # (the depthwise conv's)
    assert_close(plan.run(feeds)[out], want)
    with caplog.at_level(logging.INFO, logger="tflgpu"):
        retune_steps(plan, [expansion.op.index], {"group_tile": (16, 4), "tile_x": 1, "tile_s": 1, "lanes": 4,
                                                  "vec_hint": None}, "CONV_2D")
    assert "not installed" in caplog.text
    assert t["expanded"] in expansion.specs[0].dense
    assert_close(plan.run(feeds)[out], want)
