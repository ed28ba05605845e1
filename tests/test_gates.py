"""A squeeze-and-excitation gate (a spatial mean -> dense + RELU -> dense + sigmoid) as one op (graph.passes.fuse_gates)
and one kernel (kernels.pooled_dense.gate): the pass's conditions, every variant against LiteRT at FP32 and FP16
under a CPU device's target and a GPU's, the defaults."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu.graph.passes import (
    GATE,
    HIDDEN_FUSED,
    INPUT_SCALE,
    fold_gate_scales,
    fuse_gates,
)
from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, elementwise_fused, gpu_target, litert, run_model


def gate_model(rng, shape=(1, 6, 5, 24), hidden=6, pool="MEAN", dense="CONV_2D", gate="LOGISTIC",
               hidden_out=False, extra_reader=False, project=None, gated_out=False, residual=False):
    """x -> pool (MEAN over the spatial axes, or a whole-image AVERAGE_POOL_2D) -> dense (1x1 CONV_2D or, after a
    MEAN not keeping its dims, FULLY_CONNECTED) with RELU -> dense -> the gate's activation (a LOGISTIC, or
    MobileNet v3's hard sigmoid: ADD 3, RELU6, MUL 1/6) [-> RESHAPE to 1x1] -> MUL x; (model bytes, feeds).
    ``hidden_out``: the hidden values are a graph output too; ``extra_reader``: a RELU reads the pool's output;
    ``project``: a CONV_2D reads the gated tensor (a block's projection: (out channels, kernel, stride, padding)),
    whose output is the graph's; ``gated_out``: the gated tensor is a graph output too; ``residual``: the graph's
    output is the projection's plus the gated tensor (an ADD, which fuses into the projection's step)."""
    n, h, w, c = shape
    b = ModelBuilder()
    x = b.input("x", shape)
    conv = dense == "CONV_2D"
    vec = lambda ch: (n, 1, 1, ch) if conv else (n, ch)
    m = b.tensor("mean", vec(c) if pool == "MEAN" else (n, 1, 1, c))
    if pool == "MEAN":
        b.op("MEAN", [x, b.const("axes", np.int32([1, 2]))], [m], keep_dims=conv)
    else:
        b.op("AVERAGE_POOL_2D", [x], [m], padding="VALID", stride_w=1, stride_h=1, filter_width=w, filter_height=h)

    def dense_op(name, src, cin, cout, act):
        y = b.tensor(name, vec(cout))
        wts = (rng.standard_normal((cout, cin)) / np.sqrt(cin)).astype(np.float32)
        bias = b.const(f"{name}_b", rng.standard_normal(cout).astype(np.float32))
        if conv:
            b.op("CONV_2D", [src, b.const(f"{name}_w", wts.reshape(cout, 1, 1, cin)), bias], [y], padding="VALID",
                 stride_w=1, stride_h=1, fused_activation_function=act)
        else:
            b.op("FULLY_CONNECTED", [src, b.const(f"{name}_w", wts), bias], [y], fused_activation_function=act)
        return y

    hid = dense_op("hidden", m, c, hidden, "RELU")
    g = dense_op("gate", hid, hidden, c, "NONE")
    if gate == "LOGISTIC":
        s = b.tensor("sig", vec(c))
        b.op("LOGISTIC", [g], [s])
    else:
        a, r, s = b.tensor("plus3", vec(c)), b.tensor("relu6", vec(c)), b.tensor("hsig", vec(c))
        b.op("ADD", [g, b.const("three", np.float32([3]))], [a])
        b.op("RELU6", [a], [r])
        b.op("MUL", [r, b.const("sixth", np.float32([1 / 6]))], [s])
    if not conv:
        r4 = b.tensor("gate4", (n, 1, 1, c))
        b.op("RESHAPE", [s, b.const("shape4", np.int32([n, 1, 1, c]))], [r4])
        s = r4
    y = b.tensor("y", shape)
    b.op("MUL", [x, s], [y])
    outs = [y]
    if project is not None:
        cout, k, stride, pad = project
        valid = pad == "VALID"
        oh, ow = ((h - k) // stride + 1, (w - k) // stride + 1) if valid else (-(-h // stride), -(-w // stride))
        p = b.tensor("projected", (n, oh, ow, cout))
        pw = (rng.standard_normal((cout, k, k, c)) / np.sqrt(k * k * c)).astype(np.float32)
        b.op("CONV_2D", [y, b.const("pw", pw), b.const("pb", rng.standard_normal(cout).astype(np.float32))], [p],
             padding=pad, stride_w=stride, stride_h=stride, fused_activation_function="RELU6")
        outs = [p, y] if gated_out else [p]
        if residual:
            r = b.tensor("residual", (n, oh, ow, cout))
            b.op("ADD", [p, y], [r])
            outs = [r]
    if hidden_out:
        outs.append(hid)
    if extra_reader:
        e = b.tensor("relu_mean", vec(c) if pool == "MEAN" else (n, 1, 1, c))
        b.op("RELU", [m], [e])
        outs.append(e)
    b.output(*outs)
    return b.build(), [rng.uniform(-1, 1, shape).astype(np.float32)]


@pytest.mark.parametrize("pool", ["MEAN", "AVERAGE_POOL_2D"])
@pytest.mark.parametrize("gate", ["LOGISTIC", "hard sigmoid"])
def test_pass_merges_a_gate(rng, pool, gate):
    runner, steps = elementwise_fused(gate_model(rng, pool=pool, gate=gate)[0])
    merged, n = fuse_gates(steps, runner.sg, runner.consts)
    assert n == 2 and len(merged) == len(steps) - 2
    s = next(s for s in merged if s.op.name == GATE)
    gate_ops = ["LOGISTIC"] if gate == "LOGISTIC" else ["ADD", "RELU6", "MUL"]
    assert [op.name for op, _ in s.members] == [pool, "CONV_2D", "CONV_2D", *gate_ops]
    assert [f.op.name for f in s.epilogue] == gate_ops and s.op.options[HIDDEN_FUSED] == ()
    assert s.op.inputs[0] == steps[0].op.inputs[0] and s.op.index == steps[2].op.index


@pytest.mark.parametrize("why", ["hidden is an output", "two readers of the mean", "a window short of the image",
                                 "vetoed"])
def test_pass_leaves_what_it_cannot_merge(rng, why):
    if why == "a window short of the image":
        b = ModelBuilder()
        x = b.input("x", (1, 4, 4, 8))
        m, h, y = b.tensor("m", (1, 2, 2, 8)), b.tensor("h", (1, 2, 2, 2)), b.tensor("y", (1, 2, 2, 8))
        b.op("AVERAGE_POOL_2D", [x], [m], padding="VALID", stride_w=2, stride_h=2, filter_width=2, filter_height=2)
        b.op("CONV_2D", [m, b.const("w1", rng.standard_normal((2, 1, 1, 8)).astype(np.float32)),
                         b.const("b1", np.zeros(2, np.float32))], [h], padding="VALID", stride_w=1, stride_h=1)
        b.op("CONV_2D", [h, b.const("w2", rng.standard_normal((8, 1, 1, 2)).astype(np.float32)),
                         b.const("b2", np.zeros(8, np.float32))], [y], padding="VALID", stride_w=1, stride_h=1)
        b.output(y)
        model = b.build()
    else:
        model = gate_model(rng, hidden_out=why == "hidden is an output",
                           extra_reader=why == "two readers of the mean")[0]
    runner, steps = elementwise_fused(model)
    allowed = (lambda a, b: False) if why == "vetoed" else (lambda a, b: True)
    merged, n = fuse_gates(steps, runner.sg, runner.consts, allowed)
    assert n == 0 and len(merged) == len(steps)


POINTS = {
    "default": ({}, 1),
    "4 slices by 64": ({"fused": True, "group": (4, 64)}, 1),
    "8 slices by 256": ({"fused": True, "group": (8, 256)}, 1),
    "32 slices by 256": ({"fused": True, "group": (32, 256)}, 1),
    "one work-item a slice": ({"fused": True, "group": (16, 16)}, 1),
    "unfused": ({"fused": False}, 3),
}

GATES = {
    "1x1 convs 6x5x24 -> 6": {},
    "batch 2, padded lanes, hard sigmoid": {"shape": (2, 7, 3, 30), "hidden": 7, "gate": "hard sigmoid"},
    "whole-image average pool 9x9x72 -> 18": {"shape": (1, 9, 9, 72), "hidden": 18, "pool": "AVERAGE_POOL_2D"},
    "FC 4x4x40 -> 10": {"shape": (1, 4, 4, 40), "hidden": 10, "dense": "FULLY_CONNECTED"},
    # (more gate slices than a group's 8: groups each summing the means and hidden slices again)
    "1x1 convs 3x3x136 -> 34": {"shape": (1, 3, 3, 136), "hidden": 34},
}


@pytest.mark.parametrize(("gate", "point", "fp16", "gpu"), [
    pytest.param(g, p, fp16, gpu, id=f"{g}-{p}-{'fp16' if fp16 else 'fp32'}-{'gpu' if gpu else 'cpu'}")
    for g in sorted(GATES) for p in sorted(POINTS) for fp16 in (False, True) for gpu in (False, True)
    if not fp16 or p in ("default", "unfused")])
def test_gate_variants_match_litert(opencl_device, rng, monkeypatch, gate, point, fp16, gpu):
    """Every variant computes what LiteRT does (FP32 within 1e-4, FP16 within 1e-2 of the output's scale), under a
    CPU device's target and a GPU's: batches, padded lanes, fused activations and the gate's fused ops."""
    from tflgpu import Interpreter
    from tflgpu.runtime.config import PlanConfig
    from tflgpu.runtime.executor import GpuPlan

    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    if gpu:
        gpu_target(monkeypatch)
    params, kernels = POINTS[point]
    model, feeds = gate_model(rng, **GATES[gate])
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    runner = it.cpu_runner()
    gate_index = [op.index for op, _ in runner.steps if op.name in ("CONV_2D", "FULLY_CONNECTED")][1]
    plan = GpuPlan(runner, opencl_device, PlanConfig(fp16=fp16), params={gate_index: params})
    (step,) = [s for s in plan.steps if s.op.name == GATE]
    assert len(step.specs) == kernels and plan.cpu_op_count == 0 and plan.pass_counts["fuse_gates"] == 2
    assert {k: step.specs[0].params[k] for k in params} == params
    got = plan.run(feeds)[it.model.main.outputs[0]]
    assert_close(got, run_model(litert(), model, feeds)[0], 1e-2 if fp16 else 1e-4)


def test_defaults():
    from tflgpu.kernels.pooled_dense import GateKnobs, PooledShape

    # a GPU: POOLED_DENSE's groups; a CPU device: one group for every gate slice
    assert GateKnobs.default(PooledShape(sin=18, sout=18, gpu=True, hidden=5)) == GateKnobs(True, (8, 256))
    assert GateKnobs.default(PooledShape(sin=6, sout=6, gpu=False, hidden=2)) == GateKnobs(True, (8, 64))
    assert GateKnobs.default(PooledShape(sin=240, sout=240, gpu=False, hidden=60)) == GateKnobs(True, (256, 256))
    assert GateKnobs.default(PooledShape(sin=1, sout=1, gpu=False, hidden=1)) == GateKnobs(True, (1, 64))
    # (means and hidden slices past local memory: the three kernels)
    assert not GateKnobs.default(PooledShape(sin=1800, sout=1800, gpu=False, hidden=100)).fused
    # a CPU device: the three kernels from 32 x 32 pixels (the means on every core); a GPU: fused
    assert GateKnobs.default(PooledShape(sin=4, sout=4, gpu=False, hidden=1, pixels=31 * 32)).fused
    assert not GateKnobs.default(PooledShape(sin=4, sout=4, gpu=False, hidden=1, pixels=32 * 32)).fused
    assert GateKnobs.default(PooledShape(sin=4, sout=4, gpu=True, hidden=1, pixels=128 * 128)).fused


@pytest.mark.parametrize("why", [None, "gated tensor is an output", "vetoed", "the conv's fused ADD reads it"])
def test_scale_pass_folds_the_gates_mul_into_the_conv(rng, why):
    residual = why == "the conv's fused ADD reads it"
    model, _ = gate_model(rng, project=(24 if residual else 8, 1, 1, "VALID"), residual=residual,
                          gated_out=why == "gated tensor is an output")
    runner, steps = elementwise_fused(model)
    if residual:  # (the ADD of the gated tensor is the projection's fused op, its one step reading it)
        assert [s.op.name for s in steps][-1] == "CONV_2D" and steps[-1].epilogue[0].op.name == "ADD"
    steps, _ = fuse_gates(steps, runner.sg, runner.consts)
    allowed = (lambda a, b: False) if why == "vetoed" else (lambda a, b: True)
    merged, n = fold_gate_scales(steps, runner.sg, runner.consts, allowed)
    if why is not None:
        assert n == 0 and merged == steps
        return
    assert n == 1 and [s.op.name for s in merged] == [GATE, "CONV_2D"]
    conv = merged[1]
    assert [op.name for op, _ in conv.members] == ["MUL", "CONV_2D"]  # (the CPU runs both)
    assert conv.op.inputs[0] == steps[0].op.inputs[0] and conv.op.options[INPUT_SCALE] == merged[0].outputs[0]


SCALED = {
    "1x1 6x5x24 -> 8": {"project": (8, 1, 1, "VALID")},
    "3x3 SAME stride 2, batch 2, padded lanes": {"shape": (2, 7, 6, 30), "hidden": 7, "project": (5, 3, 2, "SAME")},
    "hard sigmoid, FC gate, 3x3 VALID": {"shape": (1, 5, 5, 20), "hidden": 5, "dense": "FULLY_CONNECTED",
                                         "gate": "hard sigmoid", "project": (12, 3, 1, "VALID")},
}


SCALED_POINTS = {
    "default": {},
    "tile 2x4": {"tile_x": 2, "tile_s": 4, "group_tile": None},
    "tile 1x1 strided": {"tile_x": 1, "tile_s": 1, "strided": True, "group_tile": None},
    "group tile 16x4": {"tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": None, "strided": False,
                        "group_tile": (16, 4), "k_chunk": 4},
    "group tile 8x8, split 2, prefetch": {"tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": None, "strided": False,
                                          "group_tile": (8, 8), "k_chunk": 8, "k_split": 2, "prefetch": True},
}


@pytest.mark.parametrize(("block", "point", "fp16", "gpu"), [
    pytest.param(b, p, fp16, gpu, id=f"{b}-{p}-{'fp16' if fp16 else 'fp32'}-{'gpu' if gpu else 'cpu'}")
    for b in sorted(SCALED) for p in sorted(SCALED_POINTS) for fp16 in (False, True) for gpu in (False, True)
    if (not fp16 or p == "default") and (gpu or "group" not in p)])
def test_scaled_conv_matches_litert(opencl_device, rng, monkeypatch, block, point, fp16, gpu):
    """The conv scaling its input by the gate (the MUL folded in) computes LiteRT's values: pointwise and windowed
    (the padding's zeros stay zero), strides, batches, padded lanes, under a CPU device's target and a GPU's, the
    direct kernel and the group tile (a GPU's pointwise default, and its implicit GEMM of a windowed conv; its
    sum split too), FP32 and FP16."""
    from tflgpu import Interpreter
    from tflgpu.runtime.config import PlanConfig
    from tflgpu.runtime.executor import GpuPlan

    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    if gpu:
        gpu_target(monkeypatch)
    params = SCALED_POINTS[point]
    model, feeds = gate_model(rng, **SCALED[block])
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    runner = it.cpu_runner()
    conv_index = [op.index for op, _ in runner.steps if op.name in ("CONV_2D", "FULLY_CONNECTED")][-1]
    plan = GpuPlan(runner, opencl_device, PlanConfig(fp16=fp16), params={conv_index: params})
    (step,) = [s for s in plan.steps if INPUT_SCALE in s.op.options]
    assert plan.pass_counts["fold_gate_scales"] == 1 and plan.cpu_op_count == 0
    assert len(step.specs) == 1 and "gsc" in step.specs[0].source
    assert {k: step.specs[0].params[k] for k in params} == params
    want = run_model(litert(), model, feeds)[0]
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], want, 1e-2 if fp16 else 1e-4)


def test_a_residual_of_the_gated_tensor_keeps_it(opencl_device, rng):
    """The fuzz finding (seed 1214321): a gate's MUL read by a pointwise conv whose fused ADD adds the gated
    tensor back. The pass folded the MUL into the conv, so the gated tensor was never stored, and the ADD read
    whatever its buffer held: an error of 1.8 on values of 0.3. A step reading the tensor anywhere but as its
    op's input keeps it (graph.passes._input_only; also fuse_gates', fuse_pooled_dense's, the conv prologue's)."""
    from tflgpu import GpuDelegate, Interpreter

    model, feeds = gate_model(rng, project=(24, 1, 1, "VALID"), residual=True)
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning="none"))
    assert_close(run_model(lambda **_: it, model, feeds)[0], run_model(litert(), model, feeds)[0], 1e-4)
    assert it.gpu_plan.pass_counts["fold_gate_scales"] == 0 and it.gpu_plan.cpu_op_count == 0
