"""CI fails, where a user's plain pytest skips: a missing model corpus or OpenCL device is a failure
naming what is missing under TFLGPU_REQUIRE_CORPUS=1 / TFLGPU_REQUIRE_DEVICE=1 (set by .ci/run). A user without
the corpus runs the whole-model tests on its stand-ins (tflgpu.zoo), unless TFLGPU_STANDINS=0."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import REPO

DEVICE_TEST = "tests/test_prepare.py::test_fuzz_findings_are_refused_at_allocate[opzoo_small_mutant_add_indexerror.tflite-True]"
CORPUS_TEST = "tests/test_corpus.py::test_lstm_state_carries_over_and_resets_like_litert"


def _pytest(test: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TFLGPU_REQUIRE_")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test],
                          cwd=REPO, env={**base, **env}, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("required", [False, True])
def test_missing_device(required):
    r = _pytest(DEVICE_TEST, TFLGPU_DEVICE="no-such-device", **({"TFLGPU_REQUIRE_DEVICE": "1"} if required else {}))
    assert "no OpenCL device matches 'no-such-device'" in r.stdout, r.stdout[-2000:]
    if required:
        assert r.returncode == 1 and "1 failed" in r.stdout and "TFLGPU_REQUIRE_DEVICE=1 requires it" in r.stdout
    else:
        assert r.returncode == 0 and "1 skipped" in r.stdout


@pytest.mark.parametrize("required", [False, True])
def test_missing_corpus(required, tmp_path):
    r = _pytest(CORPUS_TEST, TFLGPU_MODELS_DIR=str(tmp_path), TFLGPU_STANDINS="0",
                **({"TFLGPU_REQUIRE_CORPUS": "1"} if required else {}))
    assert f"corpus model {tmp_path}/lstm_small.tflite not found" in r.stdout, r.stdout[-2000:]
    if required:
        assert r.returncode == 1 and "1 failed" in r.stdout and "TFLGPU_REQUIRE_CORPUS=1 requires it" in r.stdout
    else:
        assert r.returncode == 0 and "1 skipped" in r.stdout


def test_missing_corpus_runs_on_standins(tmp_path):
    """From the repository alone: the corpus test runs, and passes, on the stand-in built into the user's cache
    directory (here a fresh one)."""
    r = _pytest(CORPUS_TEST, TFLGPU_MODELS_DIR=str(tmp_path / "no-corpus"), TFLGPU_CACHE_DIR=str(tmp_path / "cache"))
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-2000:]
    assert len(list((tmp_path / "cache" / "standins").glob("*/lstm_small.tflite"))) == 1
