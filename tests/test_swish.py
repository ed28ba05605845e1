"""A swish as converters write it, MUL(x, LOGISTIC(x)), is one unary op fused into x's producer (graph.passes.fuse_swish),
against LiteRT, FP32 and FP16."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.graph.passes import SWISH
from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, litert, run_model


@pytest.fixture(params=[False, True], ids=["fp32", "fp16"])
def precision(request, opencl_device):
    if request.param and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    return request.param


def _swish_model(producer: str, logistic_first: bool, residual: bool) -> bytes:
    """``producer`` (a CONV_2D or DEPTHWISE_CONV_2D of 10 channels) -> its swish; ``logistic_first``: MUL(s, x)
    rather than MUL(x, s); ``residual``: x is also added to the swish's output (a second reader of x)."""
    rng = np.random.default_rng(8)
    b = ModelBuilder()
    x = b.input("x", (1, 7, 9, 10))
    c = b.tensor("conv", (1, 7, 9, 10))
    if producer == "CONV_2D":
        w = b.const("w", (rng.standard_normal((10, 3, 3, 10)) * 0.3).astype(np.float32))
        b.op("CONV_2D", [x, w, b.const("bias", rng.standard_normal(10).astype(np.float32))], [c], padding="SAME",
             stride_w=1, stride_h=1, fused_activation_function="NONE")
    else:
        w = b.const("w", (rng.standard_normal((1, 3, 3, 10)) * 0.5).astype(np.float32))
        b.op("DEPTHWISE_CONV_2D", [x, w, b.const("bias", rng.standard_normal(10).astype(np.float32))], [c],
             padding="SAME", stride_w=1, stride_h=1, depth_multiplier=1, fused_activation_function="NONE")
    s = b.tensor("sigmoid", (1, 7, 9, 10))
    b.op("LOGISTIC", [c], [s])
    y = b.tensor("swish", (1, 7, 9, 10))
    b.op("MUL", [s, c] if logistic_first else [c, s], [y], fused_activation_function="NONE")
    if residual:
        z = b.tensor("sum", (1, 7, 9, 10))
        b.op("ADD", [y, c], [z], fused_activation_function="NONE")
        y = z
    b.output(y)
    return b.build()


@pytest.mark.parametrize("residual", [False, True], ids=["alone", "x-read-again"])
@pytest.mark.parametrize("logistic_first", [False, True], ids=["x-times-s", "s-times-x"])
@pytest.mark.parametrize("producer", ["CONV_2D", "DEPTHWISE_CONV_2D"])
def test_a_swish_is_its_producers_activation(opencl_device, precision, producer, logistic_first, residual):
    """The swish's two ops are one SWISH step, fused into the conv where the conv's output is read by the swish
    alone (one launch); where another op reads x too, the swish is one kernel of its own reading x once."""
    data = _swish_model(producer, logistic_first, residual)
    xv = np.random.default_rng(9).standard_normal((1, 7, 9, 10)).astype(np.float32) * 2
    it = Interpreter(model_content=data, delegate=GpuDelegate(precision_loss_allowed=precision))
    got = run_model(lambda **kw: it, data, [xv])[0]
    plan = it.gpu_plan
    assert plan.cpu_op_count == 0 and plan.pass_counts["fuse_swish"] == 2
    assert plan.gpu_op_count == (4 if residual else 3)  # (the model's ops: the swish's one step member stands for two)
    swish = [s for s in plan.steps if s.op.name == SWISH or any(f.op.name == SWISH for f in s.epilogue)]
    assert len(swish) == 1
    if residual:  # (the conv, then the swish with the ADD fused after it)
        assert swish[0].op.name == SWISH and plan.launch_count() == 2
    else:
        assert swish[0].op.name == producer and plan.launch_count() == 1
    want = run_model(litert(), data, [xv])[0]
    assert_close(got, want, 1e-2 if precision else 1e-6)
    # the CPU fallback of the merged steps (a device that cannot take them runs their members' CPU kernels): the
    # swish is one member running the LOGISTIC's kernel and the MUL's in the model's operand order
    values = {it.model.main.inputs[0]: xv}
    for s in plan.steps:
        for op, fn in s.members:
            for t, v in zip(op.outputs, fn([values.get(i) if i >= 0 else None for i in op.inputs])):
                values[t] = v
    assert_close(values[it.model.main.outputs[0]], want, 1e-6)
