"""pytest-benchmark cases: each corpus model through tflgpu and LiteRT, grouped per model.

    python -m pytest bench/ --benchmark-enable --benchmark-group-by=group

Not part of the test suite (speed is measured, never asserted).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from tflgpu import Interpreter
from tflgpu.benchmark import reference_inputs

MODELS_DIR = Path(os.environ.get("TFLGPU_MODELS_DIR", Path(__file__).resolve().parents[2] / "shared" / "models"))
MODELS = sorted(p.name for p in MODELS_DIR.glob("*.tflite")) or ["(no corpus found)"]


def _litert():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ai_edge_litert.interpreter import Interpreter as LiteRT
    return LiteRT


@pytest.mark.parametrize("runtime", ["tflgpu", "litert"])
@pytest.mark.parametrize("name", MODELS)
def test_invoke(benchmark, name, runtime):
    path = MODELS_DIR / name
    if not path.exists():
        pytest.skip(f"{path} not found")
    cls = Interpreter if runtime == "tflgpu" else _litert()
    it = cls(model_path=str(path), num_threads=2)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), reference_inputs(it.get_input_details())):
        it.set_tensor(d["index"], x)
    it.invoke()  # warm-up (JIT, thread pools)
    benchmark.group = name
    benchmark(it.invoke)
