"""The signal form of a conv (``ConvKnobs.signal``: output pixels along float16 lanes, each input row's samples
staged by the stride's phase), a CPU device's default for at most 8 output channels over rows of 9 or more
adjacent taps (an audio model's resampling FIR, a filterbank over raw samples, Basic Pitch's 3 x 39 conv), against
LiteRT at FP32 and FP16: read from a graph input's dense buffer and written to a graph output's, or read from a
device tensor's slices with an elementwise op fused after it; and each value of the knob, on rows of few taps
too."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, litert, plan_with_params, run_model
from .oputil import rand


def conv(shape, cout, kh, kw, stride=(1, 1), pad="VALID", act="NONE", dil_h=1):
    """A conv's geometry: input [n, h, w, cin], output channels, window, (stride_h, stride_w), padding, fused
    activation, dilation along the height."""
    return {"shape": shape, "cout": cout, "kh": kh, "kw": kw, "stride": stride, "pad": pad, "act": act,
            "dil_h": dil_h}


# rows of 9 taps or more: the default
CASES = [
    pytest.param(conv((1, 1, 3000, 1), 1, 1, 256, (1, 2)), id="fir-256-s2"),  # Basic Pitch's decimation filter
    pytest.param(conv((2, 3, 700, 1), 3, 1, 31, (1, 3), "SAME", "RELU"), id="rows-3ch-s3"),  # taps % stride != 0
    pytest.param(conv((1, 1, 2000, 1), 1, 1, 64, (1, 32)), id="s32"),  # 32 phases, 2 steps of the tap loop
    pytest.param(conv((1, 2, 50, 1), 1, 1, 9, (1, 11), "SAME"), id="stride-past-taps"),  # a phase a tap, gaps
    pytest.param(conv((1, 7, 60, 8), 8, 3, 39, (1, 1), "SAME", "RELU"), id="3x39-8ch"),  # Basic Pitch's wide conv
    pytest.param(conv((2, 9, 41, 6), 5, 2, 9, (2, 2), "SAME", "RELU6", dil_h=2), id="2x9-6to5-s2-dilated-rows"),
    pytest.param(conv((1, 4, 30, 3), 2, 1, 12, (1, 1), "VALID"), id="short-row-3to2"),  # the row in one work-item
]


@pytest.fixture(params=[pytest.param(False, id="fp32"), pytest.param(True, id="fp16")])
def fp16(request, opencl_device):
    if request.param and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    return request.param


def _out(size: int, k: int, stride: int, dil: int, pad: str) -> int:
    return -(-size // stride) if pad == "SAME" else (size - (k - 1) * dil - 1) // stride + 1


def _model(rng, g: dict, on_device: bool):
    """The conv alone between a graph input and output (their dense buffers), or on a device tensor's slices (an
    ABS before it) with an ADD of a second input fused after it."""
    n, h, w, cin = g["shape"]
    (sh, sw), pad = g["stride"], g["pad"]
    out = (n, _out(h, g["kh"], sh, g["dil_h"], pad), _out(w, g["kw"], sw, 1, pad), g["cout"])
    b = ModelBuilder()
    x = src = b.input("x", g["shape"])
    feeds = [rand(rng, g["shape"])]
    if on_device:
        src = b.tensor("a", g["shape"])
        b.op("ABS", [x], [src])
    y = b.tensor("y", out)
    b.op("CONV_2D", [src, b.const("w", rand(rng, (g["cout"], g["kh"], g["kw"], cin))),
                     b.const("b", rand(rng, (g["cout"],)))], [y],
         padding=pad, stride_w=sw, stride_h=sh, dilation_h_factor=g["dil_h"], fused_activation_function=g["act"])
    if on_device:
        z, s = b.input("z", out), b.tensor("s", out)
        b.op("ADD", [y, z], [s])
        feeds.append(rand(rng, out))
        y = s
    b.output(y)
    return b.build(), feeds, out


def _conv_spec(plan):
    (step,) = [s for s in plan.steps if s.op.name == "CONV_2D"]
    (spec,) = step.specs
    return step, spec


@pytest.mark.parametrize("on_device", [False, True], ids=["dense-boundary", "device-tensors"])
@pytest.mark.parametrize("g", CASES)
def test_a_conv_of_long_rows_runs_the_signal_form_and_matches_litert(opencl_device, rng, fp16, g, on_device):
    model, feeds, _ = _model(rng, g, on_device)
    it = Interpreter(model_content=model, delegate=GpuDelegate(precision_loss_allowed=fp16, tuning="none"))
    step, spec = _conv_spec(it.gpu_plan)
    assert spec.params["signal"] > 0 and "float win[" in spec.source  # (the signal form, not the direct kernel)
    assert bool(step.epilogue) == on_device  # (the ADD fused after it)
    assert (spec.inputs[0] in spec.dense) != on_device  # (a graph input's dense buffer; the output is one either way)
    assert it.gpu_plan.cpu_op_count == 0
    want = run_model(litert(), model, feeds)
    got = run_model(lambda **kw: it, model, feeds)
    assert_close(got[0], want[0], 1e-2 if fp16 else 1e-4)


@pytest.mark.parametrize("const", [False, True], ids=["global-weights", "constant-weights"])
@pytest.mark.parametrize("pixels", [0, 16, 32, 64, 128])
@pytest.mark.parametrize("g", [
    pytest.param(conv((2, 3, 700, 1), 3, 1, 31, (1, 3), "SAME", "RELU"), id="rows-3ch-s3"),
    pytest.param(conv((1, 6, 45, 7), 6, 3, 5, (1, 1), "SAME"), id="5x5-7to6"),  # rows of few taps: not the default
    pytest.param(conv((1, 1, 40, 1), 2, 1, 1, (1, 1), "VALID", "RELU_N1_TO_1"), id="one-tap"),
])
def test_every_signal_tile_matches_litert(opencl_device, rng, pixels, g, const):
    """Each value of the knob (0: the direct kernel), each leaving its last work-item ragged, on rows of many taps
    and of few, its weights in global or __constant memory."""
    model, feeds, out = _model(rng, g, on_device=True)
    it, plan = plan_with_params(opencl_device, model, ("CONV_2D",), {"signal": pixels, "const_weights": const})
    _, spec = _conv_spec(plan)
    assert spec.params["signal"] == pixels and ("float win[" in spec.source) == bool(pixels)
    assert ("__constant STORE_T* wts" in spec.source) == const  # (either form's __constant weights)
    if pixels:
        assert spec.global_size[:2] == (-(-out[2] // pixels), out[0] * out[1])
    got = plan.run(feeds)[it.model.main.outputs[0]]
    assert_close(got, run_model(litert(), model, feeds)[0])
