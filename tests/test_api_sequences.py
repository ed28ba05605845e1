"""Random sequences of Interpreter calls end as LiteRT's do (tests.api_sequences)."""

from __future__ import annotations

import pytest

from .api_sequences import run, run_stateful
from .conftest import corpus_model


@pytest.mark.parametrize("delegate", [False, True], ids=["cpu", "gpu_delegate"])
def test_call_sequences_end_as_litert_s(delegate, request):
    """300 sequences of 12 calls (100 through the delegate, each building its plans): resizes, allocations, sets,
    invokes, reads and signature runs in random order, each ending as in LiteRT: the same kind of error or the
    same values. Such sequences found reads after a resize and after a failed allocate_tensors() refused."""
    if delegate:
        request.getfixturevalue("opencl_device")
    found = [d for d in (run(seed, delegate) for seed in range(100 if delegate else 300)) if d]
    assert not found, "\n".join(str(d) for d in found[:3])


@pytest.mark.parametrize("delegate", [False, True], ids=["cpu", "gpu_delegate"])
def test_state_call_sequences_end_as_litert_s(delegate, request):
    """Sequences of state calls on the corpus LSTM (its two state tensors): set and read the state, invoke,
    reset_all_variables(). They found a read of the state after reset_all_variables() on the CPU kernels giving the
    values set before it (the reset replaces the state's arrays; the read kept the old one)."""
    if delegate:
        request.getfixturevalue("opencl_device")
    path = str(corpus_model("lstm_small.tflite"))
    found = [d for d in (run_stateful(seed, delegate, path) for seed in range(40 if delegate else 150)) if d]
    assert not found, "\n".join(str(d) for d in found[:3])
