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


def _spectrum_model(shape, n: int, part: str, rows_first: bool = False) -> bytes:
    """An STFT's spectrum as TensorFlow writes it: RFFT2D of each frame's one row (``fft_length`` [1, n]), SQUEEZE of
    that row, then ``part`` (REAL, IMAG, COMPLEX_ABS, or CAST to float: the real part) and a MUL after it.
    ``rows_first``: a RESHAPE of the complex values to [frames, bins] first, where the SQUEEZE was."""
    b = ModelBuilder()
    x = b.input("x", shape)
    bins = n // 2 + 1
    spec = b.tensor("spec", (*shape[:-2], 1, bins), np.complex64)
    b.op("RFFT2D", [x, b.const("fft_length", np.array([1, n], np.int32))], [spec])
    if rows_first:
        flat = (int(np.prod(shape[:-2])), bins)
        sq = b.tensor("rows", flat, np.complex64)
        b.op("RESHAPE", [spec, b.const("to_rows", np.array(flat, np.int32))], [sq])
    else:
        flat = (*shape[:-2], bins)
        sq = b.tensor("squeezed", flat, np.complex64)
        b.op("SQUEEZE", [spec], [sq], squeeze_dims=[len(shape) - 2])
    y = b.tensor("part", flat)
    b.op(part, [sq], [y])
    z = b.tensor("scaled", flat)
    b.op("MUL", [y, b.const("k", np.array(0.5, np.float32))], [z], fused_activation_function="NONE")
    b.output(z)
    return b.build()


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize(("shape", "n", "part", "rows_first"), [
    ((1, 511, 1, 2048), 2048, "CAST", False),  # BirdNET 2.4's first spectrogram: 511 frames of 2,048 samples
    ((1, 9, 1, 100), 128, "REAL", False),  # a frame shorter than the transform: zero-padded (a part-filled slice)
    ((2, 5, 1, 300), 256, "IMAG", True),  # longer: cropped; two images
    ((1, 6, 2, 64), 64, "COMPLEX_ABS", False),  # two rows a frame: the transform takes the first
    ((1, 3, 1, 6), 4, "REAL", False),  # the shortest transform: two complex values
])
@pytest.mark.parametrize("group", [0, 32, 64])
def test_a_spectrum_runs_on_the_device(opencl_device, precision, shape, n, part, rows_first, group):
    """RFFT2D -> SQUEEZE (or RESHAPE) -> a float part of each bin is one device step (graph.passes.fuse_spectra:
    kernels.spectral, a work-item or a work-group a frame), no op left on the CPU, and computes LiteRT's values
    (which TFLite transforms in double) within a few float roundings of the spectrum's scale."""
    from tflgpu.graph.passes import RFFT_PART
    from tflgpu.runtime.config import PlanConfig
    from tflgpu.runtime.executor import GpuPlan

    fp16 = precision == "fp16"
    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    data = _spectrum_model(shape, n, part, rows_first)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    it = Interpreter(model_content=data)  # (on the CPU: the plan under test is built below)
    part_op = next(op for op in it.model.main.operators if op.name == part)
    plan = GpuPlan(it.cpu_runner(), opencl_device, PlanConfig(fp16=fp16), params={part_op.index: {"group": group}})
    assert [(s.op.name, s.device) for s in plan.steps] == [(RFFT_PART, "gpu"), ("MUL", "gpu")], \
        [(s.op.name, s.device, s.reason) for s in plan.steps]
    assert plan.pass_counts["fuse_spectra"] == 3
    (spec,) = plan.steps[0].specs
    assert spec.params == {"group": group}
    got = plan.run([x])[it.model.main.outputs[0]]
    want = run_model(litert(), data, [x])[0]
    assert got.shape == want.shape
    assert_close(got, want, 1e-2 if fp16 else 2e-6, what=f"{part} of {n}-sample frames")


@pytest.mark.parametrize(("shape", "fft_length"), [((1, 4, 1, 64), (1, 64)), ((1, 4, 8), (4, 8))],
                         ids=["read-twice", "two-dimensional"])
def test_a_spectrum_read_twice_stays_on_the_cpu_kernels(opencl_device, shape, fft_length):
    """Where the complex values are read by more than one op (the real and imaginary parts of one transform), or
    the transform takes more than one row (a 2-D RFFT2D), the ops keep the CPU kernels, and the plan matches
    LiteRT."""
    data = _spectral_model(shape, fft_length)
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    it = Interpreter(model_content=data, delegate=GpuDelegate())
    got = run_model(lambda **kw: it, data, [x])
    names = {s.op.name: s.device for s in it.gpu_plan.steps}
    assert names["RFFT2D"] == "cpu" and it.gpu_plan.pass_counts["fuse_spectra"] == 0
    for g, w in zip(got, run_model(litert(), data, [x])):
        assert_close(g, w, 1e-5)
