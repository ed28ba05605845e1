"""Prepare-time validation (ops/signatures.py and the kernels' size checks): a node its kernel cannot take
is refused at ``allocate_tensors()`` with a message naming it, as LiteRT's Prepare does, and nothing
runs; LiteRT refuses every such model too. Once a model is prepared, an exception from inside a kernel is
a bug, which the fuzz (test_fuzz.py) looks for in the cause chain of every refusal."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import litert
from .oputil import In, Out, op_model, rand
from .verdicts import wrapped_bug

DATA = Path(__file__).parent / "data"


def litert_refuses(model: bytes) -> str:
    """LiteRT's refusal of a model (at construction or at allocate_tensors), as text; fails if it accepts it."""
    try:
        it = litert()(model_content=model)
        it.allocate_tensors()
    except (ValueError, RuntimeError) as e:
        return str(e)
    pytest.fail("LiteRT accepts the model")


def refused_at_allocate(model: bytes, match: str, **kw) -> RuntimeError:
    it = Interpreter(model_content=model, **kw)  # constructs: details stay readable, as with LiteRT
    assert it.get_input_details() is not None
    with pytest.raises(RuntimeError, match=match) as e:
        it.allocate_tensors()
    with pytest.raises(RuntimeError, match="not ready"):
        it.invoke()
    return e.value


# mutants of corpus models the fuzz found (each was an internal error at invoke) -> the node LiteRT and tflgpu
# refuse at allocate_tensors, and tflgpu's message
MUTANTS = {
    # ADD lost an input (../shared/findings): an IndexError at invoke
    "opzoo_small_mutant_add_indexerror.tflite": ("Node number 23 (ADD)", r"NumInputs\(node\) != 2 \(1 != 2\)$"),
    # a flipped bit in PAD's constant paddings: numpy's MemoryError for 9 GiB at invoke
    "opzoo_small_mutant_pad_9gib.tflite": ("Node number 6 (PAD)", (r"PAD: its output of shape \[1, 4194340, 36, 16\] "
                                           r"needs 9663759360 bytes, over the limit of \d+ for one tensor")),
    # a STRIDED_SLICE with two ellipsis bits: numpy's IndexError at invoke (LiteRT: not a valid flatbuffer)
    "opzoo_small_mutant_two_ellipses.tflite": ("Node number 16 (STRIDED_SLICE)",
                                               r"Multiple ellipses in slice spec not allowed \(ellipsis_mask 9\)$"),
    # int8 FULLY_CONNECTED weights of shape [5, 0]: a ZeroDivisionError at invoke (LiteRT runs it, and
    # returns a uniform softmax whatever the input)
    "small_int8_mutant_fc_depth0.tflite": ("Node number 5 (FULLY_CONNECTED)", r"in1 has a zero dimension: shape \[5, 0\]$"),
    # CALL_ONCE without its init_subgraph_index: a TypeError at invoke (LiteRT refuses it at prepare too)
    # a sequence LSTM whose input is declared rank 0: numpy's AxisError (an IndexError) at invoke
    "lstm_small_mutant_rank0_input.tflite": ("Node number 0 (UNIDIRECTIONAL_SEQUENCE_LSTM)",
                                             r"NumDimensions\(in0\) = 0, expected 3$"),
    "fallback_ops_mutant_call_once_index.tflite": ("Node number 11 (CALL_ONCE)",
                                                   r"init_subgraph_index None is not a subgraph of this model \(it has 1\)$"),
}


@pytest.mark.parametrize("delegate", [False, True])
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_fuzz_findings_are_refused_at_allocate(name, delegate, request):
    if delegate:
        request.getfixturevalue("opencl_device")
    model = (DATA / name).read_bytes()
    node, why = MUTANTS[name]
    if "add" in name:  # (LiteRT attempts the 9 GiB allocation, and where it has the memory it succeeds)
        assert f"{node} failed to prepare" in litert_refuses(model)
    elif "ellipses" in name or "rank0_input" in name:
        litert_refuses(model)
    elif "call_once" in name:
        assert f"{node} failed to prepare" in litert_refuses(model)
    kw = {"delegate": GpuDelegate(cache=False)} if delegate else {}
    err = refused_at_allocate(model, "^" + re.escape(node) + " failed to prepare: " + why, **kw)
    assert not isinstance(err.__cause__, (IndexError, KeyError, TypeError, AttributeError, MemoryError))


def test_fuzz_finding_refused_at_invoke():
    """A mutant whose RESIZE_BILINEAR input is declared rank 0: an IndexError in its prepare-time size check.
    Declared shapes may be stale, so prepare leaves it to the run, where the real shapes give a verdict."""
    model = (DATA / "opzoo_small_mutant_resize_rank0.tflite").read_bytes()
    litert_refuses(model)
    it = Interpreter(model_content=model)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], np.ones(it.get_input_details()[0]["shape"], np.float32))
    with pytest.raises(RuntimeError, match=r"^Node number 22 \(FULLY_CONNECTED\) failed to invoke: FULLY_CONNECTED: "
                                           r"input of 848 values is not a multiple of depth 80$") as e:
        it.invoke()
    assert e.value.__cause__ is None or wrapped_bug(e.value) is None


def test_fuzz_finding_refused_by_the_reader():
    """A mutant of the int8 model whose per-channel weights name dimension 2**31-1: an IndexError in the
    kernel's prepare; refused when read (LiteRT's flatbuffer verifier refuses it too)."""
    model = (DATA / "small_int8_mutant_quantized_dimension.tflite").read_bytes()
    litert_refuses(model)
    with pytest.raises(ValueError, match=r"tensor 5 'w2'\): per-channel quantization along dimension 2147483647 of a "
                                         r"rank-4 tensor"):
        Interpreter(model_content=model)


def _one_op(op: str, ins: list, outs: list, **options) -> bytes:
    """A one-op model whose node lists ``ins`` / ``outs`` (("in", shape, dtype), ("const", array) or None)."""
    b = ModelBuilder()
    idx = []
    for i, v in enumerate(ins):
        if v is None:
            idx.append(-1)
        elif v[0] == "in":
            idx.append(b.input(f"in{i}", v[1], v[2]))
        else:
            idx.append(b.const(f"c{i}", v[1]))
    out_idx = [b.tensor(f"out{i}", shape, dtype) for i, (shape, dtype) in enumerate(outs)]
    b.op(op, idx, out_idx, **options)
    b.output(*out_idx)
    return b.build()


F32, I32 = np.float32, np.int32
MALFORMED = {
    "ADD with three inputs": (
        _one_op("ADD", [("in", (2, 3), F32)] * 3, [((2, 3), F32)]),
        r"Node number 0 \(ADD\) failed to prepare: NumInputs\(node\) != 2 \(3 != 2\)"),
    "MUL of float and int": (
        _one_op("MUL", [("in", (2, 3), F32), ("in", (2, 3), I32)], [((2, 3), F32)]),
        r"Node number 0 \(MUL\) failed to prepare: in0->type != in1->type \(FLOAT32 != INT32\)"),
    "RELU with two outputs": (
        _one_op("RELU", [("in", (2, 3), F32)], [((2, 3), F32)] * 2),
        r"NumOutputs\(node\) != 1 \(2 != 1\)"),
    "CONV_2D without weights": (
        _one_op("CONV_2D", [("in", (1, 4, 4, 2), F32), None], [((1, 4, 4, 2), F32)]),
        r"Node number 0 \(CONV_2D\) failed to prepare: input 1 is required but omitted"),
    "CONV_2D on a rank-3 input": (
        _one_op("CONV_2D", [("in", (4, 4, 2), F32), ("const", np.ones((2, 1, 1, 2), F32))], [((4, 4, 2), F32)]),
        r"NumDimensions\(in0\) = 3, expected 4"),
    "GATHER with float indices": (
        _one_op("GATHER", [("in", (4, 3), F32), ("in", (2,), F32)], [((2, 3), F32)]),
        r"in1 has type FLOAT32, expected INT16 or INT32 or INT64"),
    "LOGICAL_AND of floats": (
        _one_op("LOGICAL_AND", [("in", (3,), F32), ("in", (3,), F32)], [((3,), np.bool_)]),
        r"in0 has type FLOAT32, expected BOOL"),
    "PAD to 64 TiB": (
        _one_op("PAD", [("in", (1, 8, 8, 4), F32), ("const", np.array([[0, 0], [0, 1 << 22], [0, 1 << 20], [0, 0]], I32))],
                [((1, 8, 8, 4), F32)]),
        (r"Node number 0 \(PAD\) failed to prepare: PAD: its output of shape \[1, 4194312, 1048584, 4\] needs "
         r"\d+ bytes, over the limit")),
    "CONCATENATION of float and int8": (
        _one_op("CONCATENATION", [("in", (2, 3), F32), ("in", (2, 1), F32), ("const", np.ones((2, 2), np.int8))],
                [((2, 6), F32)], axis=1),
        r"\(CONCATENATION\) failed to prepare: in0->type != in2->type \(FLOAT32 != INT8\)"),
    "PRELU of an int8 alpha": (  # (LiteRT runs it, reading the int8 bytes as floats)
        _one_op("PRELU", [("in", (2, 3), F32), ("const", np.ones(3, np.int8))], [((2, 3), F32)]),
        r"\(PRELU\) failed to prepare: in0->type != in1->type \(FLOAT32 != INT8\)"),
    "TILE past the limit": (
        _one_op("TILE", [("in", (16, 16), F32), ("const", np.array([1 << 16, 1 << 16], I32))], [((16, 16), F32)]),
        r"\(TILE\) failed to prepare: TILE: its output .* over the limit"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_nodes_are_refused_at_allocate(case):
    model, match = MALFORMED[case]
    if "64 TiB" not in case and "TILE" not in case and "PRELU" not in case:  # (LiteRT tries those allocations,
        # and may fail either way; it runs the PRELU)
        litert_refuses(model)
    err = refused_at_allocate(model, match)
    assert err.__cause__ is None or not isinstance(err.__cause__, (IndexError, KeyError, TypeError, AttributeError))


def test_every_cpu_kernel_has_a_signature():
    from tflgpu.cpu import registry
    from tflgpu.ops.signatures import signature

    assert [op for op in registry.supported_ops() if signature(op) is None] == []


def test_broadcast_past_the_limit_is_refused_before_allocating(monkeypatch):
    """Two small inputs whose broadcast is over one tensor's limit fail at invoke with a message, not a
    MemoryError from numpy (the inputs' shapes are only known at run time here)."""
    from tflgpu.model import reader

    monkeypatch.setattr(reader, "DEFAULT_MAX_TENSOR_BYTES", 1 << 20)
    model, _ = op_model("ADD", [In(np.zeros((1024, 1), F32)), In(np.zeros((1, 1024), F32))], [Out(F32, (1, 1))])  # (a stale declared shape)
    it = Interpreter(model_content=model)
    it.allocate_tensors()
    with pytest.raises(RuntimeError, match=r"Node number 0 \(ADD\) failed to invoke: ADD: its output of shape "
                                           r"\[1024, 1024\] needs 4194304 bytes, over the limit of 1048576"):
        it.invoke()


def test_well_formed_models_still_prepare(rng):
    """The checks refuse nothing LiteRT runs: a few ops at the edges of their signatures."""
    from .oputil import check_op

    check_op("RESHAPE", [In(rand(rng, (2, 6)))], [Out(F32, (3, 4))], new_shape=[3, 4])  # one input
    check_op("PADV2", [In(rand(rng, (1, 3, 3, 2))), np.array([[0, 0], [1, 1], [2, 0], [0, 0]], I32),
                       np.array([0.5], F32)], [Out(F32, (1, 5, 5, 2))])
    check_op("CONCATENATION", [In(rand(rng, (2, 3)))] * 4, [Out(F32, (8, 3))], axis=0)


def test_lstm_peephole_of_the_wrong_size_is_refused_at_allocate(rng):
    """A peephole vector whose length is not the unit count: refused at prepare, as LiteRT does (the CPU kernel
    used to treat it as absent, silently computing another LSTM)."""
    from .oputil import lstm_model

    model, _ = lstm_model("UNIDIRECTIONAL_SEQUENCE_LSTM", rng, peephole=True, units=7, peephole_size=5)
    it = Interpreter(model_content=model)
    with pytest.raises(RuntimeError, match=r"UNIDIRECTIONAL_SEQUENCE_LSTM\) failed to prepare: LSTM peephole"):
        it.allocate_tensors()
    ref = litert()(model_content=model)
    with pytest.raises((RuntimeError, ValueError)):
        ref.allocate_tensors()
