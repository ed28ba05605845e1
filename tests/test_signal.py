"""A filter over a one-channel signal (an audio model's resampling FIR, a filterbank over raw samples: one input
channel, a window of one row of adjacent taps, at most 4 output channels) in the signal form (``ConvKnobs.signal``:
output pixels along float16 lanes, the window's samples staged by the stride's phase), a CPU device's default,
against LiteRT at FP32 and FP16: read from a graph input's dense buffer and written to a graph output's, or read
from a device tensor's slices with an elementwise op fused after it."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, litert, plan_with_params, run_model
from .oputil import rand

# (input [n, h, w, 1], output channels, taps, stride, padding, activation)
CASES = [
    pytest.param((1, 1, 3000, 1), 1, 256, 2, "VALID", "NONE", id="fir-256-s2"),  # Basic Pitch's decimation filter
    pytest.param((2, 3, 700, 1), 3, 31, 3, "SAME", "RELU", id="rows-3ch-s3"),  # taps not a multiple of the stride
    pytest.param((1, 1, 100, 1), 2, 5, 1, "SAME", "RELU6", id="short-row-s1"),  # the row in one work-item
    pytest.param((1, 1, 2000, 1), 1, 64, 32, "VALID", "NONE", id="s32"),  # 32 phases, 2 steps of the tap loop
    pytest.param((1, 2, 50, 1), 1, 7, 9, "SAME", "NONE", id="stride-past-taps"),  # a phase a tap, gaps between
    pytest.param((1, 1, 40, 1), 2, 1, 1, "VALID", "RELU_N1_TO_1", id="one-tap"),
]


@pytest.fixture(params=[pytest.param(False, id="fp32"), pytest.param(True, id="fp16")])
def fp16(request, opencl_device):
    if request.param and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    return request.param


def _out_width(w: int, taps: int, stride: int, pad: str) -> int:
    return -(-w // stride) if pad == "SAME" else (w - taps) // stride + 1


def _model(rng, shape, cout, taps, stride, pad, act, on_device: bool):
    """The conv alone between a graph input and output (their dense buffers), or on a device tensor's slices (an
    ABS before it) with an ADD of a second input fused after it."""
    b = ModelBuilder()
    out = (shape[0], shape[1], _out_width(shape[2], taps, stride, pad), cout)
    x = b.input("x", shape)
    feeds = [rand(rng, shape)]
    src = x
    if on_device:
        src = b.tensor("a", shape)
        b.op("ABS", [x], [src])
    y = b.tensor("y", out)
    b.op("CONV_2D", [src, b.const("w", rand(rng, (cout, 1, taps, 1))), b.const("b", rand(rng, (cout,)))], [y],
         padding=pad, stride_w=stride, stride_h=1, fused_activation_function=act)
    if on_device:
        z, s = b.input("z", out), b.tensor("s", out)
        b.op("ADD", [y, z], [s])
        feeds.append(rand(rng, out))
        y = s
    b.output(y)
    return b.build(), feeds


def _conv_spec(plan):
    (step,) = [s for s in plan.steps if s.op.name == "CONV_2D"]
    (spec,) = step.specs
    return step, spec


@pytest.mark.parametrize("on_device", [False, True], ids=["dense-boundary", "device-tensors"])
@pytest.mark.parametrize("shape,cout,taps,stride,pad,act", CASES)
def test_a_signal_filter_matches_litert(opencl_device, rng, fp16, shape, cout, taps, stride, pad, act, on_device):
    model, feeds = _model(rng, shape, cout, taps, stride, pad, act, on_device)
    it = Interpreter(model_content=model, delegate=GpuDelegate(precision_loss_allowed=fp16, tuning="none"))
    step, spec = _conv_spec(it.gpu_plan)
    assert spec.params["signal"] > 0 and "float win[" in spec.source  # (the signal form, not the direct kernel)
    assert bool(step.epilogue) == on_device  # (the ADD fused after it)
    assert (spec.inputs[0] in spec.dense) != on_device  # (a graph input's dense buffer; the output is one either way)
    assert it.gpu_plan.cpu_op_count == 0
    want = run_model(litert(), model, feeds)
    got = run_model(lambda **kw: it, model, feeds)
    assert_close(got[0], want[0], 1e-2 if fp16 else 1e-4)


@pytest.mark.parametrize("pixels", [0, 16, 32, 64, 128])
def test_every_signal_tile_matches_litert(opencl_device, rng, pixels):
    """Each value of the knob (0: the direct kernel) over two images of three rows whose 700 pixels leave each tile
    a ragged last work-item, 3 output channels of 31 taps at stride 3."""
    model, feeds = _model(rng, (2, 3, 700, 1), 3, 31, 3, "SAME", "RELU", on_device=True)
    it, plan = plan_with_params(opencl_device, model, ("CONV_2D",), {"signal": pixels})
    _, spec = _conv_spec(plan)
    assert spec.params["signal"] == pixels and ("float win[" in spec.source) == bool(pixels)
    if pixels:
        assert spec.global_size[:2] == (-(-234 // pixels), 6)
    got = plan.run(feeds)[it.model.main.outputs[0]]
    assert_close(got, run_model(litert(), model, feeds)[0])
