"""Stand-ins for the test corpus: the corpus's architectures (MobileNet v1/v2, DeepLab, PoseNet, SSD, U-Net, two
LSTMs, an op zoo; float32, float16-weight, dynamic-range and calibrated int8 variants) built with tflgpu's own
model builder and random weights, so the whole-model tests and benchmarks run from a checkout alone.

    python -m tflgpu.zoo DIR            # write all thirteen into DIR
    python -m tflgpu.zoo DIR --list     # what each one stands in for

A stand-in has the same ops, options, tensor shapes and types, inputs, outputs and signature as the corpus file
of the same name (``tests/test_zoo.py`` checks this against the corpus where it is present); only the weights
differ. Builds are deterministic: the same tflgpu and numpy give the same bytes.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..cache.paths import atomic_write, default_cache_dir, private_dir
from ..interpreter import Interpreter
from ..model import builder
from . import models
from .net import Net, Precision

# calibration: the corpus generator fits the classifiers on default_rng(1) and its tests feed default_rng(0)
_LOGIT_STD = 3.0  # the corpus's classifier logits have std 3 on the calibration image (see its MANIFEST)
_CALIBRATION_SEEDS = (0, 1, 2, 3)


@dataclass(frozen=True)
class StandIn:
    """One corpus model's stand-in: its file name, architecture, precision and what it is."""

    file: str
    arch: Callable[[Net], None]
    description: str
    precision: Precision = Precision.FLOAT32
    fit_logits: bool = False  # scale the classifier so that its logits have std 3 (else the softmax is flat)
    seed: int = 0


STANDINS: dict[str, StandIn] = {s.file: s for s in (
    StandIn("mobilenet_v1_1.0_224.tflite", models.mobilenet_v1, "MobileNet v1 (alpha 1.0), 224x224, 1001 classes",
            fit_logits=True),
    StandIn("mobilenet_v2_1.0_224.tflite", models.mobilenet_v2, "MobileNet v2 (alpha 1.0), 224x224, 1001 classes",
            fit_logits=True),
    StandIn("deeplab_mnv2_257.tflite", models.deeplab_mnv2,
            "DeepLab-v3-like: atrous MobileNet v2 (output stride 16), ASPP-lite, 21 classes, 257x257"),
    StandIn("posenet_mnv1_257.tflite", models.posenet_mnv1,
            "PoseNet-like: atrous MobileNet v1 (output stride 16), four 1x1 heads, 257x257"),
    StandIn("ssd_mnv2_300.tflite", models.ssd_mnv2, "SSD-like: MobileNet v2 with two box predictors, 300x300"),
    StandIn("unet_small_256.tflite", models.unet_small, "small U-Net with PReLU and transposed convs, 256x256"),
    StandIn("opzoo_small.tflite", models.opzoo_small, "25 ops of 21 types on a 32x32x8 input"),
    StandIn("lstm_small.tflite", models.lstm_small, "LSTM(64) as UNIDIRECTIONAL_SEQUENCE_LSTM, 16 steps"),
    StandIn("lstm_small_keras3_while.tflite", models.lstm_small_keras3_while,
            "the same LSTM as Keras 3 converts it: a WHILE loop"),
    StandIn("fallback_ops.tflite", models.fallback_ops, "ops without OpenCL kernels between convolutions"),
    StandIn("mobilenet_v1_1.0_224_fp16.tflite", models.mobilenet_v1, "MobileNet v1 with float16 weights",
            Precision.FLOAT16, fit_logits=True),
    StandIn("mobilenet_v2_1.0_224_dynrange.tflite", models.mobilenet_v2,
            "MobileNet v2, dynamic-range quantized (int8 weights, float activations)", Precision.DYNAMIC_RANGE,
            fit_logits=True),
    StandIn("mobilenet_v2_1.0_224_int8.tflite", models.mobilenet_v2,
            "MobileNet v2, full-integer int8 calibrated on random inputs, float input and output", Precision.INT8,
            fit_logits=True),
)}


def _source_key() -> str:
    """What a stand-in's bytes depend on: this package's and the builder's source, and numpy's version (its
    random streams)."""
    h = hashlib.sha256(np.__version__.encode())
    for path in sorted(Path(__file__).parent.glob("*.py")) + [Path(builder.__file__)]:
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _float_model(spec: StandIn, logit_scale: float) -> tuple[bytes, Net]:
    net = Net(f"tflgpu stand-in for {spec.file}: {spec.description}; random weights", seed=spec.seed,
              logit_scale=logit_scale)
    spec.arch(net)
    return net.build(), net


def _run(model: bytes, seeds: Iterable[int]) -> Iterable[dict[str, np.ndarray]]:
    """Every tensor's value (by name) after invoking ``model`` on each seed's uniform(-1, 1) input."""
    it = Interpreter(model_content=model)
    it.allocate_tensors()
    details = it.get_tensor_details()
    for seed in seeds:
        for d in it.get_input_details():
            it.set_tensor(d["index"], np.random.default_rng(seed).uniform(-1, 1, d["shape"]).astype(np.float32))
        it.invoke()
        yield {d["name"]: it.get_tensor(d["index"]) for d in details}


def build_standin(file: str) -> bytes:
    """The stand-in model's bytes for a corpus file name (one of ``STANDINS``)."""
    if file not in STANDINS:
        raise ValueError(f"no stand-in for {file!r}; there are: {', '.join(sorted(STANDINS))}")
    spec = STANDINS[file]
    logit_scale = 1.0
    if spec.fit_logits:
        model, net = _float_model(spec, 1.0)
        (values,) = _run(model, [1])
        logit_scale = _LOGIT_STD / float(np.std(values[net.logits_name]))
    if spec.precision is Precision.FLOAT32:
        return _float_model(spec, logit_scale)[0]
    ranges: dict[str, tuple[float, float]] = {}
    if spec.precision is Precision.INT8:
        for values in _run(_float_model(spec, logit_scale)[0], _CALIBRATION_SEEDS):
            for name, v in values.items():
                if v.dtype == np.float32 and v.size:
                    lo, hi = ranges.get(name, (np.inf, -np.inf))
                    ranges[name] = (min(lo, float(v.min())), max(hi, float(v.max())))
    net = Net(f"tflgpu stand-in for {spec.file}: {spec.description}; random weights", spec.precision,
              seed=spec.seed, ranges=ranges, logit_scale=logit_scale)
    spec.arch(net)
    return net.build()


def standin_dir(root: Path | None = None) -> Path:
    """Where this version's stand-ins live: ``ROOT/standins/KEY`` (ROOT: the cache directory), KEY derived from
    the code that builds them, so a change to it builds them afresh."""
    return Path(root if root is not None else default_cache_dir()) / "standins" / _source_key()


def ensure_standin(file: str, directory: Path | None = None) -> Path:
    """The stand-in's path in ``directory`` (default ``standin_dir()``), built and written there if missing.
    Building one into a ``standins/KEY`` directory removes the stand-ins of other keys beside it: older code's
    (80 MB each set)."""
    directory = Path(directory) if directory is not None else standin_dir()
    path = directory / file
    if not path.exists():
        data = build_standin(file)
        private_dir(directory)
        atomic_write(path, data)
        if directory.parent.name == "standins":
            for old in directory.parent.iterdir():
                if old != directory and old.is_dir() and len(old.name) == len(directory.name):
                    shutil.rmtree(old, ignore_errors=True)
    return path


__all__ = ["STANDINS", "Precision", "StandIn", "build_standin", "ensure_standin", "standin_dir"]
