"""RANDOM_UNIFORM, RANDOM_STANDARD_NORMAL and MULTINOMIAL: a seeded model draws LiteRT's numbers (TensorFlow's Philox
generator), invoke after invoke, and starts its sequence over where LiteRT does (a resize that changes a shape)."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import litert
from .test_ops_indexing import invokes

F = np.float32


def random_model(op: str, shape, seed: int, seed2: int, scale: bool = False) -> bytes:
    """The op of a constant shape; ``scale``: times an input [1] (a model with an input to resize), through ADD."""
    b = ModelBuilder()
    y = b.tensor("y", list(shape))
    b.op(op, [b.const("shape", np.array(shape, np.int32))], [y], seed=seed, seed2=seed2)
    if scale:
        x = b.input("x", [1])
        z = b.tensor("z", list(shape))
        b.op("ADD", [y, x], [z])
        y = z
    b.output(y)
    return b.build()


@pytest.mark.parametrize("op", ["RANDOM_UNIFORM", "RANDOM_STANDARD_NORMAL"])
@pytest.mark.parametrize("shape, seed, seed2", [((2, 3), 1, 2), ((7,), -5, 123456789012), ((3, 5, 3), 0, 7),
                                                ((4,), 1 << 40, 1)])
def test_seeded_random_values_are_litert_s(op, shape, seed, seed2):
    """Three invokes: uniform values exactly, normal ones to float32 rounding (the C library's logf / sincosf
    against numpy's); seeds wider than 32 bits as LiteRT keeps them (the low 32 bits)."""
    model = random_model(op, shape, seed, seed2)
    got = invokes(Interpreter(model_content=model), [[]] * 3)
    want = invokes(litert()(model_content=model, num_threads=1), [[]] * 3)
    for (g, _), (w, _) in zip(got, want):
        if op == "RANDOM_UNIFORM":
            np.testing.assert_array_equal(g[0], w[0])
        else:
            np.testing.assert_allclose(g[0], w[0], rtol=1e-6, atol=1e-6)
    assert not np.array_equal(got[0][0][0], got[1][0][0])


def test_multinomial_samples_are_litert_s(rng):
    b = ModelBuilder()
    logits = b.input("logits", [3, 5])
    y = b.tensor("y", [3, 7], np.int64)
    b.op("MULTINOMIAL", [logits, b.const("n", np.array(7, np.int32))], [y], seed=3, seed2=4)
    b.output(y)
    model = b.build()
    x = np.log(rng.dirichlet(np.ones(5), 3)).astype(F)
    x[1, 2] = -np.inf  # (a class that cannot be drawn)
    got = invokes(Interpreter(model_content=model), [[x]] * 3)
    want = invokes(litert()(model_content=model, num_threads=1), [[x]] * 3)
    for (g, _), (w, _) in zip(got, want):
        np.testing.assert_array_equal(g[0], w[0])
    assert not (np.stack([g[0] for g, _ in got])[:, 1] == 2).any()


@pytest.mark.parametrize("delegate", [False, True])
def test_the_sequence_starts_over_where_litert_s_does(opencl_device, delegate):
    """allocate_tensors() again, or a resize to the same shape, goes on with the sequence; a resize to another
    shape starts it over (LiteRT prepares the graph again), with or without a GpuDelegate (whose plan build and
    calibration run the CPU kernels)."""
    model = random_model("RANDOM_UNIFORM", (2, 3), 4, 5, scale=True)
    kw = {"experimental_delegates": [GpuDelegate(precision_loss_allowed=True)]} if delegate else {}

    def sequence(it):
        it.allocate_tensors()
        index = it.get_input_details()[0]["index"]
        out = it.get_output_details()[0]["index"]

        def run(shape=(1,)):
            it.set_tensor(index, np.zeros(shape, F))
            it.invoke()
            return it.get_tensor(out).copy()

        seen = [run(), run()]
        it.allocate_tensors()
        seen.append(run())
        it.resize_tensor_input(index, [1])
        it.allocate_tensors()
        seen.append(run())
        it.resize_tensor_input(index, [2, 3])
        it.allocate_tensors()
        seen.append(run((2, 3)))
        return seen

    got = sequence(Interpreter(model_content=model, **kw))
    want = sequence(litert()(model_content=model, num_threads=1))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[4], got[0])


def test_unseeded_ops_draw_anew_each_time():
    model = random_model("RANDOM_UNIFORM", (8,), 0, 0)
    a, b = (invokes(Interpreter(model_content=model), [[]])[0][0][0] for _ in range(2))
    assert not np.array_equal(a, b)
