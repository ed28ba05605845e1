"""The StableHLO ops LiteRT runs as builtins (JAX / PyTorch models converted through StableHLO): the elementwise
ADD / MULTIPLY / MAXIMUM / MINIMUM / AND / SHIFT_LEFT, PAD, GATHER, SCATTER and REDUCE_WINDOW, each against LiteRT's
values exactly, over the dimension numbers, paddings and computations it takes; what it refuses, refused."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import litert, run_model

F = np.float32


def longs(values) -> np.ndarray:
    return np.array(values, np.int64)  # (StableHLO's options are [long] vectors)


def one_op(name: str, inputs: list[np.ndarray], out_shape, out_type, computation: str | None = None,
           computation_option: str = "", **options) -> bytes:
    """A model of one op reading every array of ``inputs`` as an input; ``computation``: the op's two-value
    subgraph (its one op; "replace": none, returning the second value) named by ``computation_option``."""
    b = ModelBuilder()
    ids = [b.input(f"in{i}", x.shape, x.dtype) for i, x in enumerate(inputs)]
    if computation is not None:
        idx, sub = b.subgraph("computation")
        p, q = sub.input("p", (), inputs[0].dtype), sub.input("q", (), inputs[0].dtype)
        if computation == "replace":
            sub.output(q)
        else:
            r = sub.tensor("r", (), inputs[0].dtype)
            sub.op(computation, [p, q], [r])
            sub.output(r)
        options[computation_option] = idx
    y = b.tensor("y", tuple(out_shape), out_type)
    b.op(name, ids, [y], **options)
    b.output(y)
    return b.build()


def same_as_litert(model: bytes, feeds: list) -> np.ndarray:
    want = run_model(litert(), model, feeds)[0]
    got = run_model(Interpreter, model, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    return got


@pytest.mark.parametrize("name", ["STABLEHLO_ADD", "STABLEHLO_MULTIPLY", "STABLEHLO_MAXIMUM", "STABLEHLO_MINIMUM"])
@pytest.mark.parametrize("dtype", [F, np.int32, np.int8, np.int64])
def test_elementwise(rng, name, dtype):
    """Integers wrap where they overflow (int8 products), as LiteRT's do."""
    draw = lambda: (rng.normal(0, 3, (2, 3, 4)) if dtype == F else rng.integers(-100, 100, (2, 3, 4))).astype(dtype)
    a, b = draw(), draw()
    same_as_litert(one_op(name, [a, b], a.shape, dtype), [a, b])


@pytest.mark.parametrize("name", ["STABLEHLO_MAXIMUM", "STABLEHLO_MINIMUM"])
def test_maximum_and_minimum_keep_litert_nans_and_zeros(opencl_device, name):
    """LiteRT's STABLEHLO_MAXIMUM is std::max (the first operand unless it is less), unlike its MAXIMUM (the second
    unless the first is greater): which NaN and which signed zero comes out, on the CPU kernels and on the device,
    where it runs as the builtin with its operands swapped; and a scatter applying it, update after update."""
    from tflgpu import GpuDelegate

    a = np.array([np.nan, 1, -0.0, 0.0, 2, np.nan, -3], F)
    b = np.array([1, np.nan, 0.0, -0.0, 2, np.nan, 4], F)
    model = one_op(name, [a, b], a.shape, F)
    want = run_model(litert(), model, [a, b])[0]
    it = Interpreter(model_content=model, experimental_delegates=[GpuDelegate()])
    assert it.gpu_plan.cpu_op_count == 0
    for got in (run_model(Interpreter, model, [a, b])[0], run_model(lambda **kw: it, model, [a, b])[0]):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    # a scatter's update computation of the op: (old, update), as the op, twice into one row
    x, indices, updates = a.reshape(1, -1), np.zeros((2, 1), np.int32), np.stack([b, a[::-1]])
    model = one_op("STABLEHLO_SCATTER", [x, indices, updates], x.shape, F, name, "update_computation_subgraph_index",
                   update_window_dims=longs([1]), inserted_window_dims=longs([0]),
                   scatter_dims_to_operand_dims=longs([0]), index_vector_dim=1)
    want = run_model(litert(), model, [x, indices, updates])[0]
    got = run_model(Interpreter, model, [x, indices, updates])[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_and_and_shift_left(rng):
    for dtype in (np.bool_, np.int32, np.int8):
        a, b = (rng.integers(0, 2 if dtype == np.bool_ else 100, 9).astype(dtype) for _ in range(2))
        same_as_litert(one_op("STABLEHLO_AND", [a, b], a.shape, dtype), [a, b])
    for dtype in (np.int32, np.int16, np.int8):
        a = rng.integers(-50, 50, 9).astype(dtype)
        b = rng.integers(0, np.dtype(dtype).itemsize * 8, 9).astype(dtype)
        same_as_litert(one_op("STABLEHLO_SHIFT_LEFT", [a, b], a.shape, dtype), [a, b])


@pytest.mark.parametrize("low, high, interior, rows", [([1, 0], [0, 2], [0, 0], 3), ([0, 1], [2, 0], [1, 2], 3),
                                                       ([-1, 1], [1, -2], [0, 1], 3), ([2, -1], [-1, 0], [2, 0], 3),
                                                       ([0, 1], [0, 1], [0, 0], 0), ([-3, 0], [0, 0], [0, 0], 3)],
                         ids=["low-high", "interior", "cropped", "cropped-interior", "empty-in", "cropped-away"])
def test_pad(rng, low, high, interior, rows):
    """Edge padding (negative: cropped) and interior padding, with the padding value; an output of no elements
    (an empty input, or all cropped) has LiteRT's shape, 0 along every axis ([0, 6] reported as [0, 0])."""
    x, value = rng.normal(0, 1, (rows, 4)).astype(F), np.array(7.5, F)
    shape = [lo + hi + d + max(d - 1, 0) * i for d, lo, hi, i in zip(x.shape, low, high, interior)]
    same_as_litert(one_op("STABLEHLO_PAD", [x, value], shape, F, edge_padding_low=longs(low),
                          edge_padding_high=longs(high), interior_padding=longs(interior)), [x, value])


# (indices, offset_dims, collapsed_slice_dims, start_index_map, index_vector_dim, slice_sizes, output shape)
GATHERS = {
    "points": ([[0, 1], [2, 3], [1, 4]], [1], [0, 1], [0, 1], 1, [1, 1, 4], (3, 4)),
    "rows-clamped": ([[4], [0], [2], [9]], [0, 2], [1], [1], 1, [3, 1, 4], (3, 4, 4)),
    "blocks": ([[1], [0]], [1, 2, 3], [], [0], 1, [2, 2, 3], (2, 2, 2, 3)),
    "vector-last-negative": ([[[0, 3]], [[2, -1]]], [2, 3], [0], [0, 1], 2, [1, 2, 4], (2, 1, 2, 4)),
}


@pytest.mark.parametrize("case", GATHERS)
@pytest.mark.parametrize("index_type", [np.int32, np.int64])
def test_gather(rng, case, index_type):
    """XLA's gather by dimension numbers: points, rows (a start index past the end clamped so that the slice lies
    inside), whole blocks, index vectors along another axis (a negative start clamped to 0)."""
    indices, offset, collapsed, start_map, vector_dim, sizes, shape = GATHERS[case]
    x, indices = rng.normal(0, 1, (3, 5, 4)).astype(F), np.array(indices, index_type)
    same_as_litert(one_op("STABLEHLO_GATHER", [x, indices], shape, F, offset_dims=longs(offset),
                          collapsed_slice_dims=longs(collapsed), start_index_map=longs(start_map),
                          index_vector_dim=vector_dim, slice_sizes=longs(sizes)), [x, indices])


# (indices, updates shape, update_window_dims, inserted_window_dims, scatter_dims_to_operand_dims)
SCATTERS = {
    "rows": ([[1], [3], [1]], (3, 4), [1], [0], [0]),
    "points-one-outside": ([[0, 1], [4, 3], [0, 1], [7, 0]], (4,), [], [0, 1], [0, 1]),
    "blocks-partly-outside": ([[0, 0], [3, 2], [4, 3]], (3, 2, 2), [1, 2], [], [0, 1]),
}


@pytest.mark.parametrize("case", SCATTERS)
@pytest.mark.parametrize("computation", ["replace", "STABLEHLO_ADD", "STABLEHLO_MULTIPLY", "STABLEHLO_MAXIMUM",
                                         "STABLEHLO_MINIMUM"])
def test_scatter(rng, case, computation):
    """Repeated indices (the last replaces; sums in order), a value outside the operand skipped, and a window partly
    outside: its values inside are applied (LiteRT checks each value, where XLA skips the window)."""
    indices, update_shape, window, inserted, to_operand = SCATTERS[case]
    x, indices = rng.normal(0, 1, (5, 4)).astype(F), np.array(indices, np.int32)
    updates = rng.normal(0, 1, update_shape).astype(F)
    updates += {"STABLEHLO_MAXIMUM": 5, "STABLEHLO_MINIMUM": -5}.get(computation, 0)  # (each one applied)
    got = same_as_litert(one_op("STABLEHLO_SCATTER", [x, indices, updates], x.shape, F, computation,
                                "update_computation_subgraph_index", update_window_dims=longs(window),
                                inserted_window_dims=longs(inserted), scatter_dims_to_operand_dims=longs(to_operand),
                                index_vector_dim=1), [x, indices, updates])
    assert not np.array_equal(got, x)


@pytest.mark.parametrize("computation", ["STABLEHLO_ADD", "STABLEHLO_MULTIPLY", "STABLEHLO_MAXIMUM",
                                         "STABLEHLO_MINIMUM"])
@pytest.mark.parametrize("window, strides, base, dilations, padding", [
    ([1, 3, 3, 1], [1, 2, 2, 1], [1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 0, 0]),
    ([1, 2, 2, 1], [1, 1, 1, 1], [1, 2, 1, 1], [1, 1, 2, 1], [0, 0, 0, 1, 2, 0, 0, 0]),
    ([1, 3, 1, 2], [1, 1, 3, 1], [1, 1, 1, 1], [1, 2, 1, 1], [0] * 8)], ids=["pool-padded", "dilated", "strided"])
def test_reduce_window(rng, computation, window, strides, base, dilations, padding):
    """Padded (with the init value), base- and window-dilated, strided windows, folded by the body's op in LiteRT's
    order (the float sums equal)."""
    x = rng.normal(0, 1, (1, 7, 6, 2)).astype(F)
    init = np.array({"STABLEHLO_MULTIPLY": 1.0, "STABLEHLO_MINIMUM": 1.5}.get(computation, 0.0), F)
    shape = []
    for k, n in enumerate(x.shape):
        grown = (n - 1) * base[k] + 1 + padding[2 * k] + padding[2 * k + 1]
        shape.append(max(0, (grown - (window[k] - 1) * dilations[k] - 1) // strides[k] + 1))
    same_as_litert(one_op("STABLEHLO_REDUCE_WINDOW", [x, init], shape, F, computation, "body_subgraph_index",
                          window_dimensions=longs(window), window_strides=longs(strides),
                          base_dilations=longs(base), window_dilations=longs(dilations), padding=longs(padding)),
                   [x, init])


def test_a_computation_litert_refuses_is_refused(rng):
    """A scatter whose update computation is a TFLite ADD (not STABLEHLO_ADD): LiteRT refuses it at prepare, and so
    does allocate_tensors() here, naming the node."""
    x, indices, updates = rng.normal(0, 1, (5, 4)).astype(F), np.array([[1]], np.int32), np.ones((1, 4), F)
    model = one_op("STABLEHLO_SCATTER", [x, indices, updates], x.shape, F, "ADD", "update_computation_subgraph_index",
                   update_window_dims=longs([1]), inserted_window_dims=longs([0]),
                   scatter_dims_to_operand_dims=longs([0]), index_vector_dim=1)
    with pytest.raises(RuntimeError, match="failed to prepare"):
        litert()(model_content=model).allocate_tensors()
    with pytest.raises(RuntimeError, match=r"Node number 0 \(STABLEHLO_SCATTER\) failed to prepare: .*not one of"):
        Interpreter(model_content=model).allocate_tensors()


def test_float_elementwise_ops_run_on_the_device_as_builtins(opencl_device, rng):
    """Between two convs, a float STABLEHLO_ADD / _MULTIPLY / _MAXIMUM / _MINIMUM runs on the device as the builtin
    that says the same (graph.stablehlo; before, each was a CPU step splitting the plan); an int32 one stays a CPU
    step. Against LiteRT."""
    from tflgpu import GpuDelegate

    b = ModelBuilder()
    x = b.input("x", (1, 6, 6, 4))
    cur = x
    for k, name in enumerate(["STABLEHLO_ADD", "STABLEHLO_MULTIPLY", "STABLEHLO_MAXIMUM", "STABLEHLO_MINIMUM"]):
        conv = b.tensor(f"conv{k}", (1, 6, 6, 4))
        b.op("CONV_2D", [cur, b.const(f"w{k}", rng.normal(0, 0.5, (4, 1, 1, 4)).astype(F)),
                         b.const(f"b{k}", rng.normal(0, 0.1, 4).astype(F))], [conv], padding="SAME", stride_w=1,
             stride_h=1)
        other = b.const(f"c{k}", rng.normal(0, 1, (1, 6, 6, 4)).astype(F))
        y = b.tensor(f"y{k}", (1, 6, 6, 4))
        b.op(name, [conv, other] if k % 2 else [other, conv], [y])
        cur = y
    i = b.input("i", (5,), np.int32)
    j = b.tensor("j", (5,), np.int32)
    b.op("STABLEHLO_ADD", [i, i], [j])
    b.output(cur, j)
    model = b.build()
    feeds = [rng.normal(0, 1, (1, 6, 6, 4)).astype(F), np.arange(5, dtype=np.int32)]
    want = run_model(litert(), model, feeds)
    it = Interpreter(model_content=model, experimental_delegates=[GpuDelegate()])
    got = run_model(lambda **kw: it, model, feeds)
    plan = it.gpu_plan
    assert plan.pass_counts["stablehlo_builtin"] == 4
    assert [s.op.name for s in plan.steps if s.device == "cpu"] == ["STABLEHLO_ADD"] and plan.cpu_op_count == 1
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("algorithm, words", [(0, 2), (1, 3), (2, 2)], ids=["default", "philox-3", "threefry"])
@pytest.mark.parametrize("out_type", [np.uint32, np.int64])
def test_rng_bit_generator(rng, algorithm, words, out_type):
    """LiteRT's bits and new state for a random state and one whose counter is about to wrap (LiteRT's counter
    wraps its low 64 bits without a carry): Philox (DEFAULT is Philox) from a 2- or 3-word state, Threefry from a
    2-word one; 32- and 64-bit outputs of a length no call's words divide."""
    b = ModelBuilder()
    state = b.input("state", (words,), np.uint64)
    new, bits = b.tensor("new", (words,), np.uint64), b.tensor("bits", (3, 1, 3), out_type)
    b.op("STABLEHLO_RNG_BIT_GENERATOR", [state], [new, bits], algorithm=algorithm)
    b.output(new, bits)
    model = b.build()
    for start in (rng.integers(0, 2**63, words, dtype=np.uint64),
                  np.array([7, 2**64 - 2, 9][:words], np.uint64)):
        want = run_model(litert(), model, [start])
        got = run_model(Interpreter, model, [start])
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
        assert len(set(got[1].reshape(-1).tolist())) == 9


def test_inspect_says_which_stablehlo_ops_reach_the_device(tmp_path, capsys):
    """`tflgpu inspect`: a float STABLEHLO_ADD reaches the device as ADD, a STABLEHLO_PAD runs on the CPU."""
    from tflgpu.cli import main

    b = ModelBuilder()
    x = b.input("x", (4,))
    y, z = b.tensor("y", (4,)), b.tensor("z", (6,))
    b.op("STABLEHLO_ADD", [x, x], [y])
    b.op("STABLEHLO_PAD", [y, b.const("v", np.array(0, F))], [z], edge_padding_low=longs([1]),
         edge_padding_high=longs([1]), interior_padding=longs([0]))
    b.output(z)
    path = tmp_path / "stablehlo.tflite"
    path.write_bytes(b.build())
    assert main(["inspect", str(path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("STABLEHLO")}
    assert lines["STABLEHLO_ADD"].endswith("float32 as ADD; else no (runs on cpu)")
    assert lines["STABLEHLO_PAD"].endswith("no (runs on cpu)")


def case_model(rng, branches_of=None) -> bytes:
    """x -> RELU -> STABLEHLO_CASE(i: ADD / MUL / SUB of a constant, one branch each) -> y. ``branches_of``: the
    subgraph indices the op names (default: its three branches)."""
    b = ModelBuilder()
    i, x = b.input("i", (), np.int32), b.input("x", (2, 3))
    r = b.tensor("r", (2, 3))
    b.op("RELU", [x], [r])
    branches = []
    for k, name in enumerate(["ADD", "MUL", "SUB"]):
        idx, sub = b.subgraph(f"branch{k}")
        a, out = sub.input("a", (2, 3)), sub.tensor("out", (2, 3))
        sub.op(name, [a, sub.const("c", rng.normal(0, 1, (2, 3)).astype(F))], [out])
        sub.output(out)
        branches.append(idx)
    y = b.tensor("y", (2, 3))
    b.op("STABLEHLO_CASE", [i, r], [y], branch_subgraph_indices=branches if branches_of is None else branches_of)
    b.output(y)
    return b.build()


def test_case_calls_the_branch_its_index_names(opencl_device, rng):
    """STABLEHLO_CASE (op code 209, newer than the `tflite` schema package: its options read and written by hand):
    the indexed branch, the last one for an index outside them, as LiteRT; under a GpuDelegate the RELU before it
    runs on the device and the call on the CPU kernels. A branch index that names no subgraph is refused at
    prepare."""
    from tflgpu import GpuDelegate
    from tflgpu.model.reader import read_model

    model = case_model(rng)
    op = read_model(model).main.operators[1]
    assert op.name == "STABLEHLO_CASE" and op.options["branch_subgraph_indices"] == (1, 2, 3)
    x = rng.normal(0, 1, (2, 3)).astype(F)
    delegated = Interpreter(model_content=model, experimental_delegates=[GpuDelegate()])
    outs = set()
    for index in (0, 1, 2, 3, -1):
        feeds = [np.array(index, np.int32), x]
        want = run_model(litert(), model, feeds)[0]
        for got in (run_model(Interpreter, model, feeds)[0], run_model(lambda **kw: delegated, model, feeds)[0]):
            np.testing.assert_array_equal(got, want)
        outs.add(want.tobytes())
    assert len(outs) == 3
    assert delegated.gpu_plan.gpu_op_count == 1 and delegated.gpu_plan.cpu_op_count == 1
    with pytest.raises(RuntimeError, match=r"\(STABLEHLO_CASE\) failed to prepare: branch_subgraph_indices \[1, 9\]"):
        Interpreter(model_content=case_model(rng, [1, 9])).allocate_tensors()
