"""Random sequences of Interpreter calls end as LiteRT's do (tests.api_sequences)."""

from __future__ import annotations

import pytest

from .api_sequences import run


@pytest.mark.parametrize("delegate", [False, True], ids=["cpu", "gpu_delegate"])
def test_call_sequences_end_as_litert_s(delegate, request):
    """300 sequences of 12 calls (100 through the delegate, each building its plans): resizes, allocations, sets,
    invokes, reads and signature runs in random order, each ending as in LiteRT: the same kind of error or the
    same values. Such sequences found reads after a resize and after a failed allocate_tensors() refused."""
    if delegate:
        request.getfixturevalue("opencl_device")
    found = [d for d in (run(seed, delegate) for seed in range(100 if delegate else 300)) if d]
    assert not found, "\n".join(str(d) for d in found[:3])
