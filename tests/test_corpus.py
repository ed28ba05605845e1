"""Every model of ../shared/models runs and matches LiteRT on the corpus' test inputs."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import Interpreter
from tflgpu.benchmark import reference_inputs

from .conftest import assert_close, corpus_model, litert, run_model

FLOAT_MODELS = [
    "mobilenet_v1_1.0_224.tflite",
    "mobilenet_v2_1.0_224.tflite",
    "deeplab_mnv2_257.tflite",
    "posenet_mnv1_257.tflite",
    "ssd_mnv2_300.tflite",
    "unet_small_256.tflite",
    "opzoo_small.tflite",
    "lstm_small.tflite",
    "lstm_small_keras3_while.tflite",
    "fallback_ops.tflite",
    "mobilenet_v1_1.0_224_fp16.tflite",
    # integer kernels (int8 exact) and hybrid kernels (dynamic range); their GpuDelegate paths: test_quantized
    "mobilenet_v2_1.0_224_int8.tflite",
    "mobilenet_v2_1.0_224_dynrange.tflite",
]


# Dynamic-range models: every hybrid op equals LiteRT's given the same input (test_quantized checks it
# op by op), but float-rounding differences of the float layers before a hybrid layer can flip single
# levels of its 8-bit input quantization (1/255 of a row's range), and the network amplifies that:
# 2.6e-3 of a 0.29 maximum measured on these inputs.
RTOL = {"mobilenet_v2_1.0_224_dynrange.tflite": 1e-2}


def _compare(name: str) -> None:
    path = corpus_model(name)
    ref_it = litert()(model_path=str(path))
    inputs = reference_inputs(ref_it.get_input_details())
    want = run_model(litert(), path, inputs)
    got = run_model(Interpreter, path, inputs)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, RTOL.get(name, 1e-4), what=f"{name} output {i}")


@pytest.mark.corpus
@pytest.mark.parametrize("name", FLOAT_MODELS)
def test_corpus_model_matches_litert(name):
    _compare(name)


@pytest.mark.corpus
def test_lstm_state_carries_over_and_resets_like_litert():
    path = corpus_model("lstm_small.tflite")
    x = np.random.default_rng(0).uniform(-1, 1, (1, 16, 32)).astype(np.float32)
    results = []
    for cls in (Interpreter, litert()):
        it = cls(model_path=str(path))
        it.allocate_tensors()
        out = it.get_output_details()[0]["index"]
        seq = []
        for reset in (False, False, True):
            if reset:
                it.reset_all_variables()
            it.set_tensor(0, x)
            it.invoke()
            seq.append(it.get_tensor(out))
        results.append(seq)
    ours, ref = results
    assert not np.allclose(ref[0], ref[1]), "reference state should carry over between invokes"
    for a, b in zip(ours, ref):
        assert_close(a, b)
