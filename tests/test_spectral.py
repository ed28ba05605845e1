"""RFFT2D and the complex values it makes (REAL, IMAG, COMPLEX_ABS, CAST to float) on the CPU kernels, against
LiteRT; and what an audio model's graph around them needs (BirdNET 2.4's spectrogram: a RESHAPE to a scalar
through an empty shape tensor, shapes computed at run time)."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, litert, run_model


def _spectral_model(shape, fft_length) -> bytes:
    """RFFT2D of the input, then its magnitude, real part, imaginary part and CAST to float."""
    b = ModelBuilder()
    x = b.input("x", shape)
    spec_shape = (*shape[:-2], fft_length[0], fft_length[1] // 2 + 1)
    spec = b.tensor("spec", spec_shape, np.complex64)
    b.op("RFFT2D", [x, b.const("fft_length", np.array(fft_length, np.int32))], [spec])
    outs = []
    for name in ("COMPLEX_ABS", "REAL", "IMAG", "CAST"):
        y = b.tensor(name.lower(), spec_shape)
        b.op(name, [spec], [y])
        outs.append(y)
    b.output(*outs)
    return b.build()


@pytest.mark.parametrize(("shape", "fft_length"), [((1, 4, 8), (4, 8)), ((2, 3, 8), (4, 16)), ((1, 1, 2048), (1, 2048)),
                                                    ((3, 6, 10), (2, 4)), ((1, 64, 1, 2048), (1, 2048)),
                                                    ((2, 40, 1, 1000), (1, 1024))],
                         ids=["same", "padded", "stft-frame", "cropped", "stft-threaded", "stft-padded-threaded"])
def test_rfft2d_and_complex_parts_match_litert(shape, fft_length):
    data = _spectral_model(shape, fft_length)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    want = run_model(litert(), data, [x])
    got = run_model(Interpreter, data, [x])
    for name, g, w in zip(("abs", "real", "imag", "cast"), got, want):
        assert_close(g, w, 1e-5, what=name)


def test_rfft2d_refuses_a_length_that_is_not_a_power_of_two():
    data = _spectral_model((1, 4, 8), (4, 6))
    it = Interpreter(model_content=data)
    with pytest.raises(RuntimeError, match=r"RFFT2D.*fft_length must be two powers of two, not \[4, 6\]"):
        it.allocate_tensors()


def test_reshape_to_a_scalar_through_an_empty_shape_tensor():
    """TFLite's converter writes a RESHAPE to a scalar with a shape tensor of shape [0] and an empty buffer, which
    no op makes (BirdNET 2.4's STFT framing): an empty constant, as TFLite reads it; the reader had refused the
    model ("used before any op produces it")."""
    b = ModelBuilder()
    x = b.input("x", (1, 1))
    y = b.tensor("y", ())
    b.op("RESHAPE", [x, b.const("shape", np.zeros((0,), np.int32))], [y])
    z = b.tensor("z", ())
    b.op("MUL", [y, b.const("two", np.array(2.0, np.float32))], [z], fused_activation_function="NONE")
    b.output(z)
    data = b.build()
    x = np.array([[1.5]], np.float32)
    want = run_model(litert(), data, [x])
    assert want[0].shape == () and float(want[0]) == 3.0
    assert_close(run_model(Interpreter, data, [x])[0], want[0])


def test_shapes_computed_at_run_time_are_constants_of_the_plan(opencl_device):
    """A Keras reshape as TensorFlow converts it (SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE): a plan made for one
    input shape knows the SHAPE, so the chain folds (runtime.selection.fold_shapes) and the RESHAPE, its shape now
    constant, runs on the device with the ops around it: one partition, no CPU op (before, SHAPE and the integer
    ops after it ran on the CPU between two device partitions)."""
    b = ModelBuilder()
    x = b.input("x", (1, 6, 8))
    h = b.tensor("h", (1, 6, 8))
    b.op("MUL", [x, b.const("k", np.array(0.5, np.float32))], [h], fused_activation_function="NONE")
    shape = b.tensor("shape", (3,), np.int32)
    b.op("SHAPE", [h], [shape], out_type=2)
    batch = b.tensor("batch", (), np.int32)
    b.op("STRIDED_SLICE", [shape, b.const("begin", np.array([0], np.int32)), b.const("end", np.array([1], np.int32)),
                           b.const("strides", np.array([1], np.int32))], [batch], shrink_axis_mask=1)
    new_shape = b.tensor("new_shape", (3,), np.int32)
    b.op("PACK", [batch, b.const("rows", np.array(12, np.int32)), b.const("cols", np.array(4, np.int32))], [new_shape],
         values_count=3, axis=0)
    r = b.tensor("r", (1, 12, 4))
    b.op("RESHAPE", [h, new_shape], [r])
    out = b.tensor("out", (1, 12, 4))
    b.op("ADD", [r, b.const("one", np.ones((1, 1, 4), np.float32))], [out], fused_activation_function="NONE")
    b.output(out)
    data = b.build()
    x = np.random.default_rng(2).standard_normal((1, 6, 8)).astype(np.float32)
    it = Interpreter(model_content=data, delegate=GpuDelegate())
    got = run_model(lambda **kw: it, data, [x])
    assert it.gpu_plan.cpu_op_count == 0, [(s.op.name, s.reason) for s in it.gpu_plan.steps if s.device == "cpu"]
    assert it.gpu_plan.pass_counts["fold_constants"] == 3  # (SHAPE, STRIDED_SLICE, PACK)
    assert_close(got[0], run_model(litert(), data, [x])[0])
