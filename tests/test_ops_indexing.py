"""The builtin ops LiteRT runs that real models use now and then (tflgpu refused them before as ops without a
kernel): ADD_N (Keras' Add of three or more inputs), ONE_HOT and EMBEDDING_LOOKUP (text models),
LOCAL_RESPONSE_NORMALIZATION (older image models), FAKE_QUANT (models converted with quantization-aware
training's ops left in), DYNAMIC_UPDATE_SLICE (a generative model's cache), UNSORTED_SEGMENT_* (graph networks),
REVERSE_SEQUENCE, MATRIX_DIAG / MATRIX_SET_DIAG, BROADCAST_ARGS, BUCKETIZE, BITCAST, BITWISE_XOR, RIGHT_SHIFT,
CONV_3D and CONV_3D_TRANSPOSE (video and volume models).
Each against LiteRT's own kernels on random cases: values exactly, or within a few float32 steps where LiteRT's
kernel rounds differently (LRN's power; the 3-D convolutions' sums)."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import litert, run_model

F = np.float32


def single_op(op: str, inputs: list, out_shapes: list, out_types: list, consts: dict | None = None, **options):
    """A model of one op: ``inputs`` are arrays; those named in ``consts`` (by position) become constants, the
    others model inputs."""
    b = ModelBuilder()
    consts = consts or {}
    ids = []
    for i, x in enumerate(inputs):
        x = np.asarray(x)
        ids.append(b.const(f"c{i}", x, x.dtype) if i in consts else b.input(f"in{i}", x.shape, x.dtype))
    outs = [b.tensor(f"out{i}", s, t) for i, (s, t) in enumerate(zip(out_shapes, out_types))]
    b.op(op, ids, outs, **options)
    b.output(*outs)
    return b.build()


def run(model: bytes, feeds: list, reference: bool = False, **kw) -> list[np.ndarray]:
    """Our outputs, or LiteRT's on one thread (``reference``)."""
    return run_model(litert(), model, feeds, num_threads=1) if reference else run_model(Interpreter, model, feeds, **kw)


def check(op: str, inputs: list, out_shapes: list, out_types: list, consts: dict | None = None, ulps: int = 0,
          **options):
    model = single_op(op, inputs, out_shapes, out_types, consts, **options)
    feeds = [np.asarray(x) for i, x in enumerate(inputs) if i not in (consts or {})]
    want = run(model, feeds, reference=True)
    got = run(model, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (op, g.shape, g.dtype, w.shape, w.dtype)
        if ulps and g.dtype == F:
            np.testing.assert_array_max_ulp(g, w, maxulp=ulps)
        else:
            np.testing.assert_array_equal(g, w, err_msg=op)
    return got


def test_add_n(rng):
    for n in (2, 3, 5):
        xs = [rng.normal(0, 1, (2, 3, 4)).astype(F) * 1e3 for _ in range(n)]  # (large: the order of the sums shows)
        check("ADD_N", xs, [(2, 3, 4)], [F])
    check("ADD_N", [rng.integers(-9, 9, (5,)).astype(np.int32) for _ in range(3)], [(5,)], [np.int32])
    with pytest.raises(RuntimeError, match=r"\(ADD_N\) failed to prepare: its inputs' shapes differ"):
        Interpreter(model_content=single_op("ADD_N", [np.ones((2, 3), F), np.ones(3, F)], [(2, 3)], [F])
                    ).allocate_tensors()


def test_one_hot(rng):
    for axis, shape in ((-1, (4,)), (0, (4,)), (1, (2, 3)), (-1, (2, 3))):
        idx = rng.integers(-1, 6, shape).astype(np.int32)  # (-1 and 5: out of range, a row of off_value)
        out = list(shape)
        out.insert(axis if axis >= 0 else len(shape), 5)
        check("ONE_HOT", [idx, np.array(5, np.int32), np.array(2.5, F), np.array(-1.0, F)], [out], [F],
              consts={1: 0, 2: 0, 3: 0}, axis=axis)
    check("ONE_HOT", [np.array([0, 2, 1], np.int64), np.array(3, np.int32), np.array(7, np.int32),
                      np.array(0, np.int32)], [(3, 3)], [np.int32], consts={1: 0, 2: 0, 3: 0}, axis=-1)


def test_embedding_lookup(rng):
    table = rng.normal(0, 1, (10, 4, 3)).astype(F)
    ids = np.array([3, 0, 9, 3], np.int32)
    check("EMBEDDING_LOOKUP", [ids, table], [(4, 4, 3)], [F], consts={1: 0})
    with pytest.raises(RuntimeError, match=r"failed to invoke: Embedding Lookup: index 10 out of bounds"):
        run(single_op("EMBEDDING_LOOKUP", [ids, table], [(4, 4, 3)], [F], consts={1: 0}),
            [np.array([1, 10, 2, 0], np.int32)])


def test_embedding_lookup_hybrid(rng):
    """An int8 table with a float output: rows scaled by the table's scale, per row or per tensor."""
    q = rng.integers(-127, 128, (6, 5)).astype(np.int8)
    ids = np.array([5, 1, 1], np.int32)
    for scales in ([0.05], list(rng.uniform(0.01, 0.1, 6))):
        b = ModelBuilder()
        i = b.input("ids", [3], np.int32)
        t = b.const("table", q, quant={"scale": scales, "zero_point": [0] * len(scales), "quantized_dimension": 0})
        o = b.tensor("rows", [3, 5])
        b.op("EMBEDDING_LOOKUP", [i, t], [o])
        b.output(o)
        model = b.build()
        np.testing.assert_array_equal(run(model, [ids])[0], run(model, [ids], reference=True)[0])


def test_local_response_normalization(rng):
    x = rng.normal(0, 2, (2, 5, 4, 13)).astype(F)
    for radius, bias, alpha, beta in ((2, 1.0, 1e-4, 0.75), (0, 2.0, 0.5, 1.0), (5, 0.5, 0.2, 0.5), (20, 1.0, 1.0, 2.0)):
        check("LOCAL_RESPONSE_NORMALIZATION", [x], [x.shape], [F], ulps=2, radius=radius, bias=bias, alpha=alpha,
              beta=beta)


def test_fake_quant(rng):
    x = np.concatenate([rng.normal(0, 2, 500), np.arange(-3, 3, 0.0625)]).astype(F)  # (halfway values)
    for lo, hi, bits in ((-1.0, 2.0, 8), (-0.4, 6.0, 8), (0.2, 1.5, 4), (-6.0, -1.0, 2), (-1.0, 1.0, 16)):
        check("FAKE_QUANT", [x], [x.shape], [F], min=lo, max=hi, num_bits=bits, narrow_range=False)
    with pytest.raises(RuntimeError, match="narrow_range FakeQuant is not currently supported"):
        Interpreter(model_content=single_op("FAKE_QUANT", [x], [x.shape], [F], min=-1.0, max=1.0, num_bits=8,
                                            narrow_range=True)).allocate_tensors()


def test_dynamic_update_slice(rng):
    operand = rng.normal(0, 1, (4, 6, 3)).astype(F)
    update = rng.normal(0, 1, (2, 3, 3)).astype(F)
    for starts in ([0, 0, 0], [1, 2, 0], [3, 5, 1], [-2, 9, 0]):  # (clamped so that the update fits)
        check("DYNAMIC_UPDATE_SLICE", [operand, update, np.array(starts, np.int32)], [operand.shape], [F])
    check("DYNAMIC_UPDATE_SLICE", [operand, update, np.array([1, 1, 0], np.int64)], [operand.shape], [F])


@pytest.mark.parametrize("reduction", ["SUM", "PROD", "MAX", "MIN"])
def test_unsorted_segment(rng, reduction):
    data = rng.normal(0, 1, (7, 3)).astype(F)
    ids = np.array([2, 0, 2, 4, 0, 1, 2], np.int32)  # (segment 3 empty: the reduction's start)
    check(f"UNSORTED_SEGMENT_{reduction}", [data, ids, np.array(6, np.int32)], [(6, 3)], [F], consts={2: 0})
    ints = rng.integers(-5, 5, (2, 3, 2)).astype(np.int32)
    check(f"UNSORTED_SEGMENT_{reduction}", [ints, np.array([[1, 0, 1], [3, 3, 0]], np.int32),
                                            np.array(4, np.int32)], [(4, 2)], [np.int32], consts={2: 0})


def test_reverse_sequence(rng):
    x = rng.normal(0, 1, (3, 5, 2)).astype(F)
    check("REVERSE_SEQUENCE", [x, np.array([5, 0, 3], np.int32)], [x.shape], [F], seq_dim=1, batch_dim=0)
    check("REVERSE_SEQUENCE", [x, np.array([1, 2], np.int32)], [x.shape], [F], seq_dim=0, batch_dim=2)


def test_matrix_diag(rng):
    d = rng.normal(0, 1, (2, 4)).astype(F)
    check("MATRIX_DIAG", [d], [(2, 4, 4)], [F])
    x = rng.normal(0, 1, (2, 3, 5)).astype(F)
    check("MATRIX_SET_DIAG", [x, rng.normal(0, 1, (2, 3)).astype(F)], [x.shape], [F])


def test_broadcast_args():
    for a, b in (([2, 1, 3], [4, 1]), ([5], [1]), ([1, 7, 1], [3, 1, 1, 4])):
        n = max(len(a), len(b))
        check("BROADCAST_ARGS", [np.array(a, np.int32), np.array(b, np.int32)], [(n,)], [np.int32])


def test_bucketize(rng):
    x = np.concatenate([rng.normal(0, 3, 50), [0.0, 1.5, 3.0, -np.inf, np.inf]]).astype(F)
    check("BUCKETIZE", [x], [x.shape], [np.int32], boundaries=[-2.0, 0.0, 1.5, 3.0, 3.0])
    check("BUCKETIZE", [rng.integers(-5, 6, 30).astype(np.int32)], [(30,)], [np.int32], boundaries=[-1.5, 0.0, 2.0])


def test_bitwise(rng):
    a, b = rng.integers(-100, 100, (4, 5)).astype(np.int32), rng.integers(-100, 100, (4, 5)).astype(np.int32)
    check("BITWISE_XOR", [a, b], [a.shape], [np.int32])
    u = rng.integers(0, 255, (9,)).astype(np.uint8)
    check("BITWISE_XOR", [u, u[::-1].copy()], [u.shape], [np.uint8])
    check("RIGHT_SHIFT", [a, rng.integers(0, 31, (4, 5)).astype(np.int32)], [a.shape], [np.int32])
    check("RIGHT_SHIFT", [u, rng.integers(0, 8, (9,)).astype(np.uint8)], [u.shape], [np.uint8])


def test_bitcast(rng):
    x = rng.normal(0, 1, (3, 4)).astype(F)
    check("BITCAST", [x], [(3, 4)], [np.int32])
    check("BITCAST", [x], [(3, 4, 2)], [np.int16])
    check("BITCAST", [rng.integers(0, 255, (3, 4)).astype(np.uint8)], [(3,)], [np.uint32])


def test_new_ops_beside_the_device(opencl_device, rng):
    """A model mixing them with device ops: a conv's map, ONE_HOT of indices gathered by EMBEDDING_LOOKUP, ADD_N
    of three maps; the new ops on the CPU kernels, the rest on the device, LiteRT's outputs."""
    b = ModelBuilder()
    x = b.input("x", [1, 6, 6, 3])
    maps = []
    for k in range(3):
        y = b.tensor(f"conv{k}", [1, 6, 6, 4])
        b.op("CONV_2D", [x, b.const(f"w{k}", rng.normal(0, 1, (4, 1, 1, 3)).astype(F)),
                         b.const(f"b{k}", np.zeros(4, F))], [y], padding="SAME", stride_h=1, stride_w=1)
        maps.append(y)
    total = b.tensor("sum", [1, 6, 6, 4])
    b.op("ADD_N", maps, [total])
    normalized = b.tensor("lrn", [1, 6, 6, 4])
    b.op("LOCAL_RESPONSE_NORMALIZATION", [total], [normalized], radius=1, bias=1.0, alpha=0.1, beta=0.75)
    out = b.tensor("relu", [1, 6, 6, 4])
    b.op("RELU", [normalized], [out])
    b.output(out)
    model = b.build()
    image = rng.uniform(-1, 1, (1, 6, 6, 3)).astype(F)
    want = run(model, [image], reference=True)[0]
    it = Interpreter(model_content=model, experimental_delegates=[GpuDelegate()])
    it.allocate_tensors()
    assert "on cpu" in it.backend and "2 on cpu" in it.backend, it.backend
    it.set_tensor(it.get_input_details()[0]["index"], image)
    it.invoke()
    np.testing.assert_allclose(it.get_tensor(it.get_output_details()[0]["index"]), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_conv3d(rng, padding):
    """CONV_3D over a [1, 5, 6, 7, 3] volume: kernels 1 to 3 per axis, strides, dilations, a bias, a RELU."""
    x = rng.normal(0, 1, (2, 5, 6, 7, 3)).astype(F)
    for kernel, strides, dilations, act in (((3, 3, 3), (1, 1, 1), (1, 1, 1), "NONE"),
                                            ((2, 3, 1), (2, 1, 3), (1, 1, 1), "RELU"),
                                            ((2, 2, 2), (1, 2, 1), (2, 1, 2), "RELU6")):
        w = rng.normal(0, 1, (*kernel, 3, 4)).astype(F)
        b = rng.normal(0, 1, 4).astype(F)
        out = [2] + [(n + s - 1) // s if padding == "SAME" else (n - (k - 1) * d - 1) // s + 1
                     for n, k, s, d in zip(x.shape[1:4], kernel, strides, dilations)] + [4]
        options = {"padding": padding, "stride_d": strides[0], "stride_h": strides[1], "stride_w": strides[2],
                   "dilation_d_factor": dilations[0], "dilation_h_factor": dilations[1],
                   "dilation_w_factor": dilations[2], "fused_activation_function": act}
        model = single_op("CONV_3D", [x, w, b], [out], [F], consts={1: 0, 2: 0}, **options)
        np.testing.assert_allclose(run(model, [x])[0], run(model, [x], reference=True)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_conv3d_transpose(rng, padding):
    x = rng.normal(0, 1, (1, 3, 4, 2, 5)).astype(F)
    for kernel, strides in (((2, 2, 2), (2, 2, 2)), ((3, 1, 2), (1, 2, 3)), ((3, 3, 3), (2, 1, 1))):
        w = rng.normal(0, 1, (*kernel, 4, 5)).astype(F)  # (kd, kh, kw, out, in)
        shape = [1] + [n * s if padding == "SAME" else (n - 1) * s + k
                       for n, k, s in zip(x.shape[1:4], kernel, strides)] + [4]
        options = {"padding": padding, "stride_d": strides[0], "stride_h": strides[1], "stride_w": strides[2],
                   "fused_activation_function": "NONE"}
        model = single_op("CONV_3D_TRANSPOSE", [np.array(shape, np.int32), w, x, rng.normal(0, 1, 4).astype(F)],
                          [shape], [F], consts={0: 0, 1: 0, 3: 0}, **options)
        np.testing.assert_allclose(run(model, [x])[0], run(model, [x], reference=True)[0], rtol=1e-5, atol=1e-5)


def where_model(shape=(2, 5), condition_type=np.bool_) -> bytes:
    """x -> (x <= 0) -> WHERE -> GATHER_ND(x, ...) * 2: two outputs whose sizes the values of x set."""
    b = ModelBuilder()
    x = b.input("x", list(shape))
    c = b.tensor("c", list(shape), np.bool_)
    b.op("LESS_EQUAL", [x, b.const("zero", np.zeros(1, F))], [c])
    if condition_type is not np.bool_:
        c2 = b.tensor("c2", list(shape), condition_type)
        b.op("CAST", [c], [c2])
        c = c2
    idx = b.tensor("idx", [0, len(shape)], np.int64, shape_signature=[-1, len(shape)])
    b.op("WHERE", [c], [idx])
    picked = b.tensor("picked", [0], F, shape_signature=[-1])
    b.op("GATHER_ND", [x, idx], [picked])
    y = b.tensor("y", [0], F, shape_signature=[-1])
    b.op("MUL", [picked, b.const("two", np.full(1, 2, F))], [y])
    b.output(idx, y)
    return b.build()


def invokes(it, feeds_list):
    """Each invoke's outputs and the output details' shapes after it."""
    it.allocate_tensors()
    seen = []
    for feeds in feeds_list:
        for d, x in zip(it.get_input_details(), feeds):
            it.set_tensor(d["index"], x)
        it.invoke()
        seen.append(([it.get_tensor(d["index"]) for d in it.get_output_details()],
                     [d["shape"].tolist() for d in it.get_output_details()]))
    return seen


@pytest.mark.parametrize("condition_type", [np.bool_, F, np.int32])
def test_where(rng, condition_type):
    """WHERE's coordinates of the true values, row-major; after each invoke the outputs' details give the sizes
    that invoke's data set, as LiteRT's do."""
    feeds = [[rng.normal(0, 1, (2, 5)).astype(F)] for _ in range(3)] + [[-np.ones((2, 5), F)]]  # (LiteRT cannot
    # read back a WHERE of no rows: "Invalid tensor size")
    model = where_model(condition_type=condition_type)
    want = invokes(litert()(model_content=model), feeds)
    got = invokes(Interpreter(model_content=model), feeds)
    for (g_out, g_shapes), (w_out, w_shapes) in zip(got, want):
        assert g_shapes == w_shapes
        for g, w in zip(g_out, w_out):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)


def test_sizes_from_shapes_alone_stay_on_the_device(opencl_device):
    """A RESHAPE to a shape computed from a SHAPE (BirdNET's SHAPE -> STRIDED_SLICE -> PACK) keeps its size fixed:
    graph.sizes finds nothing and the plan runs on the device; a RESHAPE to a shape read from an input's values is
    sized by data."""
    from tflgpu.graph.sizes import sized_by_data
    from tflgpu.model.reader import read_model

    b = ModelBuilder()
    x = b.input("x", [2, 6])
    shape = b.tensor("shape", [2], np.int32)
    b.op("SHAPE", [x], [shape], out_type=2)
    rows = b.tensor("rows", [1], np.int32)
    b.op("STRIDED_SLICE", [shape, b.const("b0", np.array([0], np.int32)), b.const("e0", np.array([1], np.int32)),
                           b.const("s0", np.array([1], np.int32))], [rows])
    new = b.tensor("new", [3], np.int32)
    b.op("CONCATENATION", [rows, b.const("rest", np.array([3, 2], np.int32))], [new], axis=0)
    y = b.tensor("y", [2, 3, 2])
    b.op("RESHAPE", [x, new], [y])
    z = b.tensor("z", [2, 3, 2])
    b.op("RELU", [y], [z])
    b.output(z)
    model = b.build()
    assert sized_by_data(read_model(model).subgraphs[0]) == {}
    it = Interpreter(model_content=model, experimental_delegates=[GpuDelegate()])
    it.allocate_tensors()
    assert it.backend.startswith("opencl")

    b = ModelBuilder()
    x, s = b.input("x", [2, 6]), b.input("s", [2], np.int32)
    y = b.tensor("y", [3, 4], shape_signature=[-1, -1])
    b.op("RESHAPE", [x, s], [y])
    b.output(y)
    sized = sized_by_data(read_model(b.build()).subgraphs[0])
    assert list(sized) == [2] and sized[2].name == "RESHAPE"


def test_unique_and_segment_sum(rng):
    """UNIQUE (first-appearance order, int32 and int64 indices) and SEGMENT_SUM (ids from 0, each the one before or
    the next): sizes the data sets, against LiteRT; ids with a gap are refused, as LiteRT refuses them."""
    for out_idx in (np.int32, np.int64):
        x = rng.integers(-3, 4, 12).astype(np.int32)
        b = ModelBuilder()
        i = b.input("x", [12], np.int32)
        y = b.tensor("y", [0], np.int32, shape_signature=[-1])
        idx = b.tensor("idx", [12], out_idx)
        b.op("UNIQUE", [i], [y, idx], idx_out_type=2 if out_idx is np.int32 else 4)
        b.output(y, idx)
        model = b.build()
        got, want = run(model, [x]), run(model, [x], reference=True)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
    data = rng.normal(0, 1, (6, 3)).astype(F)
    b = ModelBuilder()
    d, s = b.input("data", [6, 3]), b.input("ids", [6], np.int32)
    out = b.tensor("sums", [0, 3], F, shape_signature=[-1, 3])
    b.op("SEGMENT_SUM", [d, s], [out])
    b.output(out)
    model = b.build()
    for ids in ([0, 0, 1, 1, 1, 2], [0, 1, 2, 3, 4, 5], [0] * 6):
        ids = np.array(ids, np.int32)
        np.testing.assert_array_equal(run(model, [data, ids])[0], run(model, [data, ids], reference=True)[0])
    with pytest.raises(RuntimeError, match="must start at 0 and grow by 0 or 1"):
        run(model, [data, np.array([0, 0, 2, 2, 2, 4], np.int32)])


@pytest.mark.parametrize("op", ["RNN", "UNIDIRECTIONAL_SEQUENCE_RNN"])
def test_basic_rnn_keeps_its_state(rng, op):
    """The basic RNN, one step or a sequence (batch-major and time-major), TANH / RELU / none: three invokes in a
    row against LiteRT, the hidden state (a variable) carried from one to the next."""
    batch, steps, inputs, units = 2, 5, 3, 4
    for act, time_major in (("TANH", False), ("RELU", True), ("NONE", False)):
        b = ModelBuilder()
        shape = [batch, inputs] if op == "RNN" else ([steps, batch, inputs] if time_major else [batch, steps, inputs])
        x = b.input("x", shape)
        consts = [b.const("w", rng.normal(0, 0.5, (units, inputs)).astype(F)),
                  b.const("r", rng.normal(0, 0.5, (units, units)).astype(F)),
                  b.const("b", rng.normal(0, 0.5, units).astype(F))]
        h = b.tensor("h", [batch, units], is_variable=True)
        out_shape = [batch, units] if op == "RNN" else shape[:2] + [units]
        y = b.tensor("y", out_shape)
        options = {"fused_activation_function": act} | ({} if op == "RNN" else {"time_major": time_major})
        b.op(op, [x, *consts, h], [y], **options)
        b.output(y)
        model = b.build()
        feeds = [[rng.normal(0, 1, shape).astype(F)] for _ in range(3)]
        got = invokes(Interpreter(model_content=model), feeds)
        want = invokes(litert()(model_content=model, num_threads=1), feeds)
        for (g, _), (w, _) in zip(got, want):
            np.testing.assert_allclose(g[0], w[0], rtol=1e-5, atol=1e-5)


def test_sparse_to_dense(rng):
    """Values placed at their indices over the default (a repeated index: the last value), 2-D and 1-D indices,
    one value for all; an index outside the shape fails the invoke, as in LiteRT."""
    cases = [(np.array([[0, 1], [0, 1], [2, 3], [1, 0]], np.int32), np.array([1, 2, 3, 4], F), [3, 4]),
             (np.array([[2, 1], [0, 1], [1, 3]], np.int64), np.array(7, F), [3, 4]),
             (np.array([1, 3, 0], np.int32), np.array([4, 5, 6], np.int32), [5])]
    for idx, values, shape in cases:
        check("SPARSE_TO_DENSE", [idx, np.array(shape, idx.dtype), values, np.array(-1, values.dtype)],
              [shape], [values.dtype], consts={1: True, 3: True}, validate_indices=True)
    model = single_op("SPARSE_TO_DENSE", [idx, np.array([5], np.int32), values, np.array(0, np.int32)], [[5]],
                      [np.int32], consts={1: True, 3: True})
    with pytest.raises(RuntimeError, match="failed to invoke"):
        run(model, [np.array([1, 7, 0], np.int32), values])


def test_dilate(rng):
    for shape, dilations in (((2, 3), (2, 3)), ((1, 4, 3, 2), (1, 2, 3, 1)), ((3,), (1,))):
        x = rng.normal(0, 1, shape).astype(F)
        out = [(n - 1) * d + 1 for n, d in zip(shape, dilations)]
        check("DILATE", [x, np.array(dilations, np.int32), np.array(0.5, F)], [out], [F], consts={1: True, 2: True})


@pytest.mark.parametrize("function", range(1, 7))  # ADD, MUL, MINIMUM, MAXIMUM, ALL, ANY
def test_reduce_window(rng, function):
    """Strided, dilated windows folded into the init value in LiteRT's order: float sums exactly."""
    cases = [((1, 6, 5, 2), (1, 2, 3, 1), (1, 2, 1, 1), (1, 1, 2, 1), F),
             ((2, 7, 3), (1, 3, 2), (1, 2, 1), (1, 1, 1), F),
             ((1, 5, 4, 1), (1, 2, 2, 1), (1, 1, 1, 1), (1, 2, 1, 1), np.int32)]
    for shape, window, strides, dilations, dtype in cases:
        x = (rng.normal(0, 10, shape) if dtype == F else rng.integers(-3, 4, shape)).astype(dtype)
        span = [(w - 1) * d + 1 for w, d in zip(window, dilations)]
        out = [(n - s) // t + 1 for n, s, t in zip(shape, span, strides)]
        init = np.array({1: 0.5, 2: 1.0, 3: 9.0, 4: -9.0, 5: 1.0, 6: 0.0}[function], dtype)
        b = ModelBuilder()
        xi = b.input("x", shape, dtype)
        ins = [xi, b.const("init", init)] + [b.const(n, np.array(v, np.int64), np.int64) for n, v in
                                             (("w", window), ("s", strides), ("d", dilations))]
        y = b.tensor("y", out, dtype)
        b.op("REDUCE_WINDOW", ins, [y], reduce_function=function)
        b.output(y)
        model = b.build()
        np.testing.assert_array_equal(run(model, [x])[0], run(model, [x], reference=True)[0])


@pytest.mark.parametrize("combiner", [0, 1, 2])  # SUM, MEAN, SQRTN
def test_embedding_lookup_sparse(rng, combiner):
    """Weighted rows summed into the rows their sparse indices name, and divided per run of one row (LiteRT's
    order: unsorted indices, which divide a row once per run, included)."""
    params = rng.normal(0, 1, (6, 2, 3)).astype(F)
    for indices, dense in ((np.array([[0, 0], [0, 1], [1, 0], [3, 2], [3, 5]], np.int32), [4, 6]),
                           (np.array([[2, 0], [0, 1], [2, 1], [0, 0], [2, 3]], np.int32), [3, 4]),
                           (np.array([[1, 0, 0], [1, 1, 3], [0, 1, 1], [1, 1, 0], [0, 0, 2]], np.int32), [2, 2, 4])):
        ids = rng.integers(0, 6, 5).astype(np.int32)
        weights = rng.uniform(0.5, 2, 5).astype(F)
        check("EMBEDDING_LOOKUP_SPARSE", [ids, indices, np.array(dense, np.int32), weights, params],
              [dense[:-1] + [2, 3]], [F], consts={2: True, 4: True}, combiner=combiner)
