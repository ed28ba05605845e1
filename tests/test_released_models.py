"""The models their makers released (tflgpu.zoo.released: MediaPipe's 14, Spotify's Basic Pitch, openWakeWord's 8,
BirdNET's 2, a Model Maker audio classifier; trained weights, the graphs their converters wrote) on every path against LiteRT: the CPU kernels and the OpenCL
device at FP32 within LiteRT's tolerance, or within the spread of LiteRT's own two CPU paths where that is wider;
FP16 within the FP16 bounds; every op on the device but those a model's entry names (ReleasedModel.host_ops). The attention face mesh, whose custom ops LiteRT cannot resolve, is checked device against CPU kernels
(those ops' kernels have their own tests against references written from MediaPipe's)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.benchmark import reference_inputs, resized
from tflgpu.model import read_model
from tflgpu.zoo.released import RELEASES

from .conftest import FP16_MAX_RTOL, assert_close, assert_fp16_close, released_model, run_model
from .oputil import run_litert

PATHS = ["cpu", "gpu-fp32", "gpu-fp16"]
RELEASE_OF = {name: release for release in RELEASES.values() for name in release.models}
MODELS = {name: release.models[name] for name, release in RELEASE_OF.items()}


def _path(name: str):
    return released_model(RELEASE_OF[name].name, name)


@functools.cache
def _inputs(name: str) -> list[np.ndarray]:
    """Reference inputs, of the shapes the model's callers resize it to (ReleasedModel.input_shapes) where given."""
    details = Interpreter(model_path=str(_path(name))).get_input_details()
    shapes = MODELS[name].input_shapes or [tuple(d["shape"]) for d in details]
    return reference_inputs([{**d, "shape": np.array(shape)} for d, shape in zip(details, shapes)])


@functools.cache
def _reference(name: str) -> tuple[list[np.ndarray], float]:
    """LiteRT's outputs (XNNPACK) and the relative spread between its two CPU paths (0 where the builtin kernels
    cannot run the model: selfie segmentation's transposed conv is XNNPACK's alone)."""
    model = _path(name).read_bytes()
    want = run_litert(model, _inputs(name))
    try:
        builtin = run_litert(model, _inputs(name), builtin_only=True)
    except RuntimeError:
        return want, 0.0
    spread = max(float(np.abs(b.astype(np.float64) - w).max() / max(1.0, np.abs(w).max()))
                 for b, w in zip(builtin, want))
    return want, spread


@functools.cache
def _probabilities(name: str) -> list[bool]:
    """Per output: whether a LOGISTIC makes it (through reshapes). Such an output is judged on its own scale,
    [0, 1]: a pose flag of 3e-9 on a random image is 0 to FP16 storage, not 100% wrong (the FP16 precision
    choice judges it so too)."""
    sg = read_model(_path(name)).subgraphs[0]
    producer = {t: op for op in sg.operators for t in op.outputs}
    found = []
    for t in sg.outputs:
        op = producer.get(t)
        while op is not None and op.name in ("RESHAPE", "SQUEEZE", "EXPAND_DIMS"):
            op = producer.get(op.inputs[0])
        found.append(op is not None and op.name == "LOGISTIC")
    return found


@functools.cache
def _cpu(name: str) -> list[np.ndarray]:
    return run_model(Interpreter, _path(name), _inputs(name))


def _run(name: str, path: str) -> list[np.ndarray]:
    if path == "cpu":
        return _cpu(name)
    it = Interpreter(model_path=str(_path(name)),
                     experimental_delegates=[GpuDelegate(precision_loss_allowed=path == "gpu-fp16")])
    resized(it, [x.shape for x in _inputs(name)])
    it.allocate_tensors()
    assert it.gpu_plan is not None and it.gpu_plan.fp16 == (path == "gpu-fp16")
    on_cpu = [s.op.name for s in it.gpu_plan.steps if s.device == "cpu"]
    assert sorted(on_cpu) == sorted(MODELS[name].host_ops), f"ops left on the CPU: {on_cpu}"
    for d, x in zip(it.get_input_details(), _inputs(name)):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


# (a model LiteRT cannot run has its device paths checked against the CPU kernels, so no CPU case of its own)
CASES = [(m.file, path) for m in MODELS.values() for path in PATHS if m.litert_runs or path != "cpu"]


@pytest.mark.parametrize(("name", "path"), CASES)
def test_released_model(name, path, request):
    device = request.getfixturevalue("opencl_device") if path != "cpu" else None
    if path == "gpu-fp16" and not device.identity.fp16:
        pytest.skip("the OpenCL device has no cl_khr_fp16")
    got = _run(name, path)
    if MODELS[name].litert_runs:
        want, spread = _reference(name)
    else:
        want, spread = _cpu(name), 0.0
    assert len(got) == len(want)
    for k, (g, w, probability) in enumerate(zip(got, want, _probabilities(name))):
        if path == "gpu-fp16" and probability:
            assert_close(g, w, rtol_scale=FP16_MAX_RTOL, what=f"{name} output {k} (a probability)")
        elif path == "gpu-fp16":
            assert_fp16_close(g, w, what=f"{name} output {k}")
        else:
            assert_close(g, w, rtol_scale=max(1e-4, 2 * spread), what=f"{name} output {k}")
