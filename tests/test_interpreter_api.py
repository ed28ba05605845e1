"""tflgpu.Interpreter behaves like ai_edge_litert's: constructor forms, details, errors, signatures."""

from __future__ import annotations

import pathlib
import warnings

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, corpus_model, litert, run_model
from .oputil import add_mul_model, run_litert
from .qutil import Q, QConst, QIn, QOut, qop_model


@pytest.fixture
def opzoo():
    return corpus_model("opzoo_small.tflite")


def test_constructor_forms(opzoo):
    """Every way of naming the model gives the same interpreter: LiteRT's details and its outputs."""
    data = opzoo.read_bytes()
    ref = litert()(model_path=str(opzoo))
    inputs = [np.random.default_rng(3).uniform(-1, 1, d["shape"]).astype(d["dtype"]) for d in ref.get_input_details()]
    want = run_model(litert(), opzoo, inputs)
    forms = [Interpreter(arg) for arg in (str(opzoo), opzoo, data, bytearray(data), memoryview(data))]
    forms += [Interpreter(model_path=str(opzoo)), Interpreter(model_path=pathlib.Path(opzoo)),
              Interpreter(model_content=data, num_threads=2)]
    for it in forms:
        assert _normalize(it.get_input_details()) == _normalize(ref.get_input_details())
        got = run_model(lambda **kw: it, opzoo, inputs)  # noqa: B023 (called at once)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_close(g, w)


def test_constructor_errors_match_litert(opzoo):
    with pytest.raises(ValueError, match="must be specified"):
        Interpreter()
    with pytest.raises(ValueError, match="Can't both provide"):
        Interpreter(model_path=str(opzoo), model_content=opzoo.read_bytes())
    with pytest.raises(ValueError, match="type of num_threads should be int"):
        Interpreter(str(opzoo), num_threads=1.5)
    with pytest.raises(ValueError, match="num_threads should >= 1"):
        Interpreter(str(opzoo), num_threads=0)
    with pytest.raises(ValueError, match="Could not open"):
        Interpreter("/nonexistent/model.tflite")
    with pytest.raises(ValueError, match="Unsupported delegate"):
        Interpreter(str(opzoo), experimental_delegates=[object()])


def test_a_path_that_is_no_regular_file_is_refused_at_once(tmp_path):
    """A named pipe (whose open waits for a writer: the constructor hung), a device, a directory: a ValueError
    naming what the path is, from the Interpreter and the command line alike."""
    import contextlib
    import os
    import threading

    from tflgpu.cli import main

    fifo = tmp_path / "model.tflite"
    os.mkfifo(fifo)

    def writer():  # (should the open wait after all, a writer ends the wait: the test then fails, not hangs)
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    unblock = threading.Timer(10, writer)
    unblock.start()
    try:
        for path, what in ((fifo, "a named pipe"), ("/dev/null", "a device")):
            with pytest.raises(ValueError, match=f"it is {what}, not a regular file"):
                Interpreter(str(path))
    finally:
        unblock.cancel()
    with pytest.raises(ValueError, match="Is a directory"):
        Interpreter(str(tmp_path))
    assert main(["bench", str(fifo)]) != 0


def _normalize(details):
    out = []
    for d in details:
        d = dict(d)
        qp = d.pop("quantization_parameters")
        d["shape"], d["shape_signature"] = d["shape"].tolist(), d["shape_signature"].tolist()
        d["qp"] = (qp["scales"].tolist(), qp["zero_points"].tolist(), qp["quantized_dimension"])
        d["qp_dtypes"] = (qp["scales"].dtype, qp["zero_points"].dtype)
        out.append(d)
    return out


@pytest.mark.parametrize("name", ["opzoo_small.tflite", "lstm_small_keras3_while.tflite",
                                  "mobilenet_v2_1.0_224_int8.tflite"])
def test_details_equal_litert(name):
    path = corpus_model(name)
    ours, ref = Interpreter(str(path)), litert()(str(path))
    ours.allocate_tensors()
    ref.allocate_tensors()
    assert _normalize(ours.get_input_details()) == _normalize(ref.get_input_details())
    assert _normalize(ours.get_output_details()) == _normalize(ref.get_output_details())
    assert _normalize(ours.get_tensor_details()) == _normalize(ref.get_tensor_details())
    assert ours.get_signature_list() == ref.get_signature_list()
    assert ours.num_subgraphs() == ref.num_subgraphs()
    d = ours.get_input_details()[0]
    assert isinstance(d["shape"], np.ndarray) and d["shape"].dtype == np.int32
    assert d["dtype"] is ref.get_input_details()[0]["dtype"]


def test_set_tensor_errors_have_litert_messages(opzoo):
    msgs = []
    for cls in (Interpreter, litert()):
        it = cls(str(opzoo))
        got = []
        try:
            it.set_tensor(0, np.zeros((1, 32, 32, 8), np.float32))
        except ValueError as e:
            got.append(str(e))
        it.allocate_tensors()
        for bad in (np.zeros((1, 32, 32, 7), np.float32), np.zeros((32, 32, 8), np.float32),
                    np.zeros((1, 32, 32, 8), np.float64), np.zeros((1, 32, 32, 8), np.int32)):
            with pytest.raises(ValueError) as e:
                it.set_tensor(0, bad)
            got.append(str(e.value).strip())
        with pytest.raises(ValueError) as e:
            it.get_tensor(9999)
        got.append(str(e.value))
        msgs.append(got)
    assert msgs[0] == msgs[1]


def test_an_input_in_the_other_byte_order_is_read_by_value(opzoo, rng, opencl_device):
    """A float32 array in big-endian order (what np.load gives for a file written so) runs as its values, through
    set_tensor, a signature runner and the delegate; LiteRT copies its bytes (numbers no one wrote)."""
    x = rng.uniform(-1, 1, (1, 32, 32, 8)).astype(np.float32)
    swapped = x.astype(">f4")
    assert swapped.dtype != x.dtype and np.array_equal(swapped, x)
    ref = litert()(str(opzoo))
    ref.allocate_tensors()
    ref.set_tensor(0, x)
    ref.invoke()
    out = ref.get_output_details()[0]["index"]
    for delegate in (None, GpuDelegate(cache=False)):
        it = Interpreter(str(opzoo), experimental_delegates=[delegate] if delegate else None)
        it.allocate_tensors()
        it.set_tensor(0, swapped)
        it.invoke()
        assert_close(it.get_tensor(out), ref.get_tensor(out))
        runner = it.get_signature_runner()
        (name,) = runner.get_input_details()
        got = runner(**{name: swapped})
        for key, d in runner.get_output_details().items():
            assert_close(got[key], ref.get_tensor(d["index"]))


def test_an_index_that_is_no_integer_is_a_type_error(opzoo):
    """A float or string index is LiteRT's TypeError (its bindings take integers); int() had read 0.9 as tensor 0 and
    "0" as 0. numpy's integers and bools are taken, as LiteRT takes them."""
    x = np.zeros((1, 32, 32, 8), np.float32)
    calls = [lambda it: it.set_tensor(0.9, x), lambda it: it.get_tensor("0"), lambda it: it.get_tensor(0, 0.0),
             lambda it: it.resize_tensor_input("0", [1, 32, 32, 8]), lambda it: it.get_tensor_details(0.0)]
    for cls in (Interpreter, litert()):
        it = cls(str(opzoo))
        it.allocate_tensors()
        for call in calls:
            with pytest.raises(TypeError):
                call(it)
        it.set_tensor(np.int64(0), x)
        it.invoke()
        assert it.get_tensor(np.uint8(0)).shape == x.shape


def test_invoke_before_allocate_is_runtime_error(opzoo):
    for cls in (Interpreter, litert()):
        with pytest.raises(RuntimeError):
            cls(str(opzoo)).invoke()


def test_tensor_view_reads_and_writes(opzoo, rng):
    it = Interpreter(str(opzoo))
    it.allocate_tensors()
    inp = it.tensor(it.get_input_details()[0]["index"])
    out_idx = it.get_output_details()[0]["index"]
    x = rng.uniform(-1, 1, (1, 32, 32, 8)).astype(np.float32)
    inp()[...] = x  # write through the view, no set_tensor
    it.invoke()
    ref = litert()(str(opzoo))
    ref.allocate_tensors()
    ref.set_tensor(0, x)
    ref.invoke()
    assert_close(it.tensor(out_idx)(), ref.get_tensor(out_idx))
    assert_close(it.get_tensor(out_idx), ref.get_tensor(out_idx))


def test_get_tensor_returns_a_copy(opzoo):
    it = Interpreter(str(opzoo))
    it.allocate_tensors()
    it.invoke()
    idx = it.get_output_details()[0]["index"]
    a = it.get_tensor(idx)
    a[...] = 123
    assert not np.any(it.get_tensor(idx) == 123)


@pytest.mark.parametrize("signature", [None, (1, 3), (-1, 3)], ids=["none stored", "static", "dynamic batch"])
def test_signature_after_a_resize_is_litert_s(signature, opencl_device):
    """Where the model stores no shape_signature, LiteRT reports each tensor's current dims as its signature,
    after a resize too; a stored signature stays as stored."""
    b = ModelBuilder()
    x = b.input("x", (1, 3), shape_signature=signature)
    y = b.tensor("y", (1, 3), shape_signature=signature)
    b.op("RELU", [x], [y])
    b.output(y)
    data = b.build()
    seen = []
    for make in (lambda: litert()(model_content=data), lambda: Interpreter(model_content=data),
                 lambda: Interpreter(model_content=data, delegate=GpuDelegate(cache=False))):
        it = make()
        before = [_normalize(it.get_input_details()), _normalize(it.get_output_details())]
        it.resize_tensor_input(0, [4, 3])
        it.allocate_tensors()
        it.set_tensor(0, np.ones((4, 3), np.float32))
        it.invoke()
        seen.append(before + [_normalize(it.get_input_details()), _normalize(it.get_output_details()),
                              [d["shape_signature"].tolist() for d in it.get_tensor_details()]])
    assert seen[1] == seen[0] and seen[2] == seen[0]


def test_resize_and_strict(rng):
    fixed, dynamic = add_mul_model(), add_mul_model(dynamic_batch=True)
    for cls in (Interpreter, litert()):
        it = cls(model_content=fixed)
        with pytest.raises(RuntimeError, match="ResizeInputTensorStrict only allows mutating unknown dimensions"):
            it.resize_tensor_input(0, [4, 3], strict=True)
    results = []
    for cls in (Interpreter, litert()):
        it = cls(model_content=dynamic)
        it.resize_tensor_input(0, [4, 3], strict=True)
        it.resize_tensor_input(1, [4, 3])
        it.allocate_tensors()
        assert it.get_output_details()[0]["shape"].tolist() == [4, 3]
        assert it.get_output_details()[0]["shape_signature"].tolist() == [-1, 3]
        x, y = rng.uniform(-1, 1, (4, 3)).astype(np.float32), rng.uniform(-1, 1, (4, 3)).astype(np.float32)
        it.set_tensor(0, x)
        it.set_tensor(1, y)
        it.invoke()
        results.append(it.get_tensor(it.get_output_details()[0]["index"]))
        np.testing.assert_allclose(results[-1], (x + y) * x, rtol=1e-6)


def test_resize_arguments_as_litert_reads_them(rng):
    """resize_tensor_input takes what LiteRT's takes (a tuple, an int64 array, whole floats, numeric strings) and
    refuses what it refuses, with its exception types: a 2-D size, an index outside the graph, a constant; an
    op's output may be named, and nothing changes. A fraction, which LiteRT cuts, is refused."""
    model = add_mul_model(dynamic_batch=True)
    x = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    for cls in (Interpreter, litert()):
        for size in ((2, 3), np.array([2, 3], np.int64), [2.0, 3.0], ["2", "3"]):
            it = cls(model_content=model)
            it.resize_tensor_input(0, size)
            it.resize_tensor_input(1, [2, 3])
            it.resize_tensor_input(it.get_output_details()[0]["index"], [7, 7])  # (an output: no effect)
            it.allocate_tensors()
            assert it.get_output_details()[0]["shape"].tolist() == [2, 3]
            it.set_tensor(0, x)
            it.set_tensor(1, x)
            it.invoke()
            np.testing.assert_allclose(it.get_tensor(it.get_output_details()[0]["index"]), 2 * x * x, rtol=1e-6)
        it = cls(model_content=model)
        with pytest.raises(ValueError, match="Shape should be 1D instead of 2"):
            it.resize_tensor_input(0, [[2, 3]])
        with pytest.raises(RuntimeError, match="tensor_index < context_.tensors_size"):
            it.resize_tensor_input(99, [2, 3])
    with pytest.raises(ValueError, match=r"whole numbers, got \[1.5, 3.0\]"):
        Interpreter(model_content=model).resize_tensor_input(0, [1.5, 3])


def test_constants_are_not_inputs(opzoo):
    """A constant of the model cannot be resized (LiteRT's error) or set (LiteRT writes into the mapped model
    file and crashes; ours says what to set instead), and invoke still gives LiteRT's outputs after the try."""
    ref = litert()(model_path=str(opzoo))
    const = next(d for d in ref.get_tensor_details() if d["index"] not in
                 {t for op in ref._get_ops_details() for t in op["outputs"]} and
                 d["index"] not in [i["index"] for i in ref.get_input_details()])
    for cls in (Interpreter, litert()):
        with pytest.raises(RuntimeError, match="Attempting to resize a fixed-size tensor"):
            cls(model_path=str(opzoo)).resize_tensor_input(const["index"], [1])
    it = Interpreter(model_path=str(opzoo))
    it.allocate_tensors()
    with pytest.raises(ValueError, match=f"tensor {const['index']} .* is a constant of the model"):
        it.set_tensor(const["index"], np.zeros(const["shape"], const["dtype"]))
    inputs = [np.random.default_rng(5).uniform(-1, 1, d["shape"]).astype(d["dtype"]) for d in ref.get_input_details()]
    for g, w in zip(run_model(lambda **kw: it, opzoo, inputs), run_model(litert(), opzoo, inputs)):
        assert_close(g, w)


@pytest.mark.parametrize("name", ["mobilenet_v2_1.0_224_int8.tflite", "lstm_small.tflite", "opzoo_small.tflite"])
def test_ops_details_are_litert_s(name):
    """The private _get_ops_details / _get_op_details that model-inspection scripts call give LiteRT's dicts
    (before allocate_tensors(), where LiteRT lists the model's nodes), omitted optional inputs included."""
    path = str(corpus_model(name))
    ours, theirs = Interpreter(model_path=path)._get_ops_details(), litert()(model_path=path)._get_ops_details()
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k], b[k]) if isinstance(b[k], np.ndarray) else a[k] == b[k], (k, a, b)
    for bad in (len(ours), -1):
        with pytest.raises(ValueError, match="Invalid node index"):
            Interpreter(model_path=path)._get_op_details(bad)


def test_a_subgraph_index_past_the_model_is_litert_s_error(opzoo):
    """LiteRT's two texts: get_tensor's and get_tensor_details'."""
    for cls in (Interpreter, litert()):
        it = cls(model_path=str(opzoo))
        it.allocate_tensors()
        for sub in (1, -1):
            with pytest.raises(ValueError, match=f"^Invalid subgraph index {sub} exceeds max subgraph index 1$"):
                it.get_tensor(0, sub)
            with pytest.raises(ValueError, match=rf"^subgraph_index is out of range: {sub} for the model, which "
                                                 rf"has 1 subgraphs\.$"):
                it.get_tensor_details(sub)


def test_an_input_shape_no_node_takes_fails_to_prepare(opzoo):
    """A resize the model's first conv cannot take is refused by allocate_tensors() as LiteRT refuses it: a
    RuntimeError naming the node and "failed to prepare", with or without the delegate."""
    ref = litert()(model_path=str(opzoo))
    idx, shape = ref.get_input_details()[0]["index"], ref.get_input_details()[0]["shape"].tolist()
    for size in ([shape[0], 0] + shape[2:], shape[1:]):
        for make in (litert(), Interpreter, lambda **kw: Interpreter(**kw, delegate=GpuDelegate(cache=False))):
            it = make(model_path=str(opzoo))
            it.resize_tensor_input(idx, size)
            with pytest.raises(RuntimeError, match=r"Node number \d+ \(\w+\) failed to prepare"):
                it.allocate_tensors()


def test_resize_back_and_forth_between_batch_sizes(rng):
    model = add_mul_model(dynamic_batch=True)
    it = Interpreter(model_content=model)
    for batch in (1, 4, 1, 3):
        for i in (0, 1):
            it.resize_tensor_input(i, [batch, 3])
        it.allocate_tensors()
        x = rng.uniform(-1, 1, (batch, 3)).astype(np.float32)
        it.set_tensor(0, x)
        it.set_tensor(1, x)
        it.invoke()
        np.testing.assert_allclose(it.get_tensor(it.get_output_details()[0]["index"]), 2 * x * x, rtol=1e-6)


def test_outputs_read_on_after_a_resize_until_the_next_allocation(rng):
    """Between resize_tensor_input() and allocate_tensors(), get_tensor reads the last invoke's outputs, as LiteRT's
    does (it said 'unallocated'); set_tensor still asks for allocate_tensors() first. Found by random API
    sequences against LiteRT."""
    model = add_mul_model(dynamic_batch=True)
    x = rng.uniform(-1, 1, (3, 3)).astype(np.float32)
    for make in (litert(), Interpreter, lambda **kw: Interpreter(**kw, delegate=GpuDelegate(cache=False))):
        it = make(model_content=model)
        for i in (0, 1):
            it.resize_tensor_input(i, [3, 3])
        it.allocate_tensors()
        it.set_tensor(0, x)
        it.set_tensor(1, x)
        it.invoke()
        it.resize_tensor_input(1, [1, 3])
        np.testing.assert_allclose(it.get_tensor(it.get_output_details()[0]["index"]), 2 * x * x, rtol=1e-6)
        if not isinstance(it, Interpreter):
            continue
        with pytest.raises(ValueError, match="Try calling allocate_tensors"):
            it.set_tensor(1, x[:1])


def test_signature_runner_matches_litert(rng):
    model = add_mul_model(dynamic_batch=True)
    x, y = rng.uniform(-1, 1, (2, 3)).astype(np.float32), rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    outs = []
    for cls in (Interpreter, litert()):
        it = cls(model_content=model)
        runner = it.get_signature_runner()
        assert sorted(runner.get_input_details()) == ["x", "y"]
        outs.append(runner(x=x, y=y))
        with pytest.raises(ValueError, match="Invalid number of inputs"):
            runner(x=x)
        with pytest.raises(ValueError, match="Invalid Input name"):
            runner(x=x, nope=y)
        with pytest.raises(ValueError, match="Invalid signature_key"):
            it.get_signature_runner("nope")
    assert sorted(outs[0]) == sorted(outs[1]) == ["prod", "sum"]
    for k in outs[0]:
        assert_close(outs[0][k], outs[1][k])


def test_signature_names_are_listed_in_litert_order():
    """A SignatureDef's inputs and outputs come back sorted by name whatever order the file lists them in
    (LiteRT keeps them in a std::map); a model written with "z" before "a" shows whether we do too."""
    b = ModelBuilder()
    x, y = b.input("x", (1, 3)), b.input("y", (1, 3))
    total, product = b.tensor("total", (1, 3)), b.tensor("product", (1, 3))
    b.op("ADD", [x, y], [total])
    b.op("MUL", [x, y], [product])
    b.output(total, product)
    b.signature("serving_default", {"zeta": y, "alpha": x}, {"z_sum": total, "a_prod": product})
    model = b.build()
    feeds = {"zeta": np.ones((1, 3), np.float32), "alpha": np.full((1, 3), 2, np.float32)}
    listed, details, results = [], [], []
    for cls in (Interpreter, litert()):
        it = cls(model_content=model)
        listed.append(it.get_signature_list())
        runner = it.get_signature_runner()
        details.append((list(runner.get_input_details()), list(runner.get_output_details())))
        results.append(list(runner(**feeds)))
    assert listed[0] == listed[1] == {"serving_default": {"inputs": ["alpha", "zeta"], "outputs": ["a_prod", "z_sum"]}}
    assert details[0] == details[1] and results[0] == results[1]


def test_two_signatures_on_two_subgraphs_as_litert_lists_and_runs_them():
    """A model whose second signature runs its second subgraph: LiteRT's private _get_full_signature_list (names
    sorted, indices of each signature's subgraph) and _get_tensor_details of that subgraph, and each runner's
    results, at its stored shape and resized."""
    b = ModelBuilder()
    x, y = b.input("x", (2, 3)), b.tensor("y", (2, 3))
    b.op("ADD", [x, x], [y])
    b.output(y)
    b.signature("double", {"x": x}, {"y": y})
    sub, sg = b.subgraph("square")
    a, c = sg.input("a", (4,)), sg.tensor("c", (4,))
    sg.op("MUL", [a, a], [c])
    sg.output(c)
    b.signature("square", {"a": a}, {"c": c}, subgraph=sub)
    model = b.build()
    seen = []
    for cls in (Interpreter, litert()):
        it = cls(model_content=model)
        square = it.get_signature_runner("square")
        seen.append((it._get_full_signature_list(), _normalize([it._get_tensor_details(i, sub) for i in (a, c)]),
                     it.get_signature_runner("double")(x=np.ones((2, 3), np.float32))["y"].tolist(),
                     square(a=np.arange(4, dtype=np.float32))["c"].tolist(),
                     square(a=np.arange(6, dtype=np.float32))["c"].tolist()))
    assert seen[0] == seen[1]
    assert seen[0][0] == {"double": {"inputs": {"x": x}, "outputs": {"y": y}},
                          "square": {"inputs": {"a": a}, "outputs": {"c": c}}}


@pytest.mark.parametrize("zero_points", [[0, 0, 0], [1, 1, 1], [0, 1, 2]])
def test_compressed_zero_points_as_litert_gives_them(zero_points):
    """``experimental_compress_quantization_zero_points=True``: a per-channel tensor whose zero points are all equal
    reports one (LiteRT's details), through every details call; unequal ones, and the option off, report each."""
    rng = np.random.default_rng(0)
    model, _ = qop_model(
        "CONV_2D",
        [QIn(rng.integers(-128, 127, (1, 4, 4, 3)).astype(np.int8), Q(0.1, 2)),
         QConst(rng.integers(-127, 127, (3, 3, 3, 3)).astype(np.int8), Q([0.1, 0.2, 0.3], zero_points)),
         QConst(np.zeros(3, np.int32), Q([0.01, 0.02, 0.03]))],
        [QOut((1, 2, 2, 3), np.int8, Q(0.5, -1))], padding="VALID")
    for compress in (False, True):
        seen = []
        for cls in (Interpreter, litert()):
            it = cls(model_content=model, experimental_compress_quantization_zero_points=compress)
            seen.append((it.experimental_compress_quantization_zero_points, _normalize(it.get_tensor_details()),
                         _normalize([it._get_tensor_details(1, 0)]), _normalize(it.get_input_details())))
        assert seen[0] == seen[1]
        assert len(seen[0][1][1]["qp"][1]) == (1 if compress and len(set(zero_points)) == 1 else 3)


def test_unknown_keyword_is_type_error(opzoo):
    with pytest.raises(TypeError):
        Interpreter(str(opzoo), not_an_option=True)
    Interpreter(str(opzoo), experimental_preserve_all_tensors=True)  # LiteRT's own options are accepted


@pytest.mark.parametrize(("option", "value", "match"), [
    ("precision_loss_allowed", "maybe", "precision_loss_allowed must be True or False"),
    ("cache", 2, "cache must be True or False"),
    ("tiered_compile", "x", "tiered_compile must be True or False or None"),
    ("tuning_db", 5, "tuning_db must be None"),
    ("tuning_storage", "nope", "tuning_storage must be an optuna storage URL"),
    ("calibration_inputs", "x", "calibration_inputs must be a list of samples"),
])
def test_delegate_options_of_the_wrong_kind_are_refused_when_made(option, value, match):
    """A GpuDelegate option of the wrong kind raises a ValueError naming it at construction, not a raw error from
    deep inside (tuning_db=5: os.fspath's TypeError), a failed background thread (tuning_storage), or a silent
    misreading ("false" is a true string)."""
    with pytest.raises(ValueError, match=match):
        GpuDelegate(**{option: value})


def test_delegate_flags_read_tflite_s_option_strings():
    """TFLite's load_delegate() options carry flags as strings: "false" / "0" read as False, "true" / "1" as True."""
    assert GpuDelegate(precision_loss_allowed="false").precision_loss_allowed is False
    assert GpuDelegate(precision_loss_allowed="1").wants_fp16()
    assert GpuDelegate(cache="0").cache is False and GpuDelegate(profile=np.True_).profile is True


def test_a_model_file_changed_under_the_interpreter_is_named(opzoo, tmp_path, monkeypatch):
    """The weights are read from the mapped file: truncated under a running Interpreter (open(path, 'wb') before a
    rewrite, as a notebook re-exporting its model does), LiteRT's next invoke ends the process with SIGBUS; ours
    raises a RuntimeError naming the file and what to do, as it does for a file rewritten in place. A new model
    renamed over the path leaves the Interpreter running on the old one."""
    from tflgpu.model.reader import ModelBytes

    monkeypatch.setattr(ModelBytes, "CHECK_EVERY_S", 0.0)
    data = opzoo.read_bytes()
    x = np.random.default_rng(2).uniform(-1, 1, (1, 32, 32, 8)).astype(np.float32)

    def start(path):
        it = Interpreter(str(path))
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        return it

    path = tmp_path / "model.tflite"
    path.write_bytes(data)
    it = start(path)
    want = it.get_tensor(it.get_output_details()[0]["index"])
    fresh = tmp_path / "fresh.tflite"
    fresh.write_bytes(data)
    fresh.replace(path)  # (a new file renamed over the path: this Interpreter's file is intact)
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), want)
    it = start(path)
    with open(path, "wb"):
        pass
    with pytest.raises(RuntimeError, match=r"model.tflite changed after this Interpreter read it: it was truncated "
                                           r"to 0 bytes.*make a new one"):
        it.invoke()
    path.write_bytes(data)
    with pytest.raises(RuntimeError, match="changed after this Interpreter read it: it was rewritten"):
        it.allocate_tensors()


def test_background_work_stops_when_the_model_file_is_truncated(tmp_path, caplog, opencl_device):
    """A delegated plan's background search builds candidate kernels from the weights, which it reads from the mapped
    file: truncated under it, the next read ended the process (SIGBUS, in the worker thread). The work now looks at
    the file before each kernel it builds and stops with a warning; the interpreter's next invoke names the file."""
    path = tmp_path / "model.tflite"
    path.write_bytes(corpus_model("mobilenet_v2_1.0_224.tflite").read_bytes())
    it = Interpreter(str(path), delegate=GpuDelegate(serialization_dir=str(tmp_path / "cache"), tuning="background"))
    it.allocate_tensors()
    it.invoke()
    # (the level set before the truncation: the worker may log as soon as the file is cut, before the wait)
    with caplog.at_level("WARNING", logger="tflgpu"):
        with open(path, "wb"):  # (while the worker builds the optimized program, before its search)
            pass
        assert it.wait_background(120)
    assert "the model file changed under the plan; its background work stops" in caplog.text
    assert it.tuning_status().finished and it.tuning_status().kernels_done == 0
    with pytest.raises(RuntimeError, match="changed after this Interpreter read it: it was truncated"):
        it.invoke()


@pytest.mark.parametrize("delegated", [False, True], ids=["cpu", "delegate"])
def test_pickling_is_refused_and_copy_shares_the_state(opzoo, delegated, request):
    """As LiteRT's: pickle and deepcopy raise TypeError (here one saying what to send instead, where pickle
    reached an mmap or a local function inside: 'cannot pickle mmap.mmap', or an AttributeError for a model from
    bytes), and copy.copy is a second handle on the same state."""
    import copy
    import pickle

    if delegated:
        request.getfixturevalue("opencl_device")
    ref = litert()(model_path=str(opzoo))
    with pytest.raises(TypeError):
        pickle.dumps(ref)
    kw = {"delegate": GpuDelegate(cache=False)} if delegated else {}
    for it in (Interpreter(str(opzoo), **kw), Interpreter(model_content=opzoo.read_bytes(), **kw)):
        it.allocate_tensors()
        for refuse in (pickle.dumps, copy.deepcopy):
            with pytest.raises(TypeError, match="cannot pickle a tflgpu Interpreter.*create an Interpreter there"):
                refuse(it)
        with pytest.raises(TypeError, match="cannot pickle a tflgpu Interpreter"):
            pickle.dumps((it, "as a Pool's task arguments hold it"))
        twin = copy.copy(it)
        inputs = [np.random.default_rng(5).uniform(-1, 1, d["shape"]).astype(d["dtype"])
                  for d in it.get_input_details()]
        for d, x in zip(twin.get_input_details(), inputs):
            twin.set_tensor(d["index"], x)
        it.invoke()  # (on what was set through the copy)
        want = run_model(litert(), opzoo, inputs)
        for d, w in zip(twin.get_output_details(), want):
            assert_close(twin.get_tensor(d["index"]), w)


def test_litert_code_with_load_delegate_runs_by_changing_the_import(opzoo, opencl_device, tmp_path):
    """``from ai_edge_litert.interpreter import Interpreter, load_delegate, OpResolverType`` becomes the same import
    from tflgpu (or tflgpu.interpreter): load_delegate of TFLite's GPU delegate library, with TFLite's option names
    and string values, is a GpuDelegate; the op resolver type is taken. Before, the import failed (ImportError)."""
    from tflgpu import OpResolverType as Resolver
    from tflgpu import load_delegate
    from tflgpu.interpreter import OpResolverType
    from tflgpu.interpreter import load_delegate as from_module

    assert from_module is load_delegate and Resolver is OpResolverType
    assert [t.name for t in OpResolverType] == [t.name for t in litert_module().OpResolverType]
    delegate = load_delegate("/usr/lib/libtensorflowlite_gpu_delegate.so", {
        "is_precision_loss_allowed": "0", "inference_priority1": "1", "max_delegated_partitions": "1",
        "delegate_serialize_dir": str(tmp_path / "cache"), "delegate_serialize_token": "opzoo"})
    assert isinstance(delegate, GpuDelegate) and not delegate.wants_fp16()
    assert (delegate.max_delegated_partitions, delegate.model_token) == (1, "opzoo")
    it = Interpreter(model_path=str(opzoo), experimental_delegates=[delegate],
                     experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    assert it.gpu_plan is not None and it.gpu_plan.gpu_op_count > 0
    inputs = [np.random.default_rng(4).uniform(-1, 1, d["shape"]).astype(d["dtype"]) for d in it.get_input_details()]
    got = run_model(lambda **kw: it, opzoo, inputs)
    for g, w in zip(got, run_model(litert(), opzoo, inputs)):
        assert_close(g, w)
    assert load_delegate("libtensorflowlite_gpu_delegate.so", {"gpu_precision_loss_allowed": "true"}).wants_fp16()
    with pytest.raises(ValueError, match=r"^Failed to load delegate from libedgetpu.so.1: tflgpu runs models through "
                                         r"its own OpenCL delegate only"):
        load_delegate("libedgetpu.so.1")
    with pytest.raises(ValueError, match=r"unknown GPU delegate option 'gpu_backend'"):
        load_delegate("libtensorflowlite_gpu_delegate.so", {"gpu_backend": "cl"})


def litert_module():
    import importlib

    return importlib.import_module(litert().__module__)


def test_an_unresolved_custom_op_is_refused_at_allocate_as_litert_refuses_it(opzoo):
    """A model with a custom op no kernel runs: constructed (its details readable), then refused by
    allocate_tensors() with LiteRT's RuntimeError, word for word, with or without a delegate and through
    InterpreterWithCustomOps, whose registerers (LiteRT's C kernels) are taken and not called. Before, the
    constructor raised a ValueError ("Didn't find kernel"), as for a builtin op without a kernel, which LiteRT does
    refuse at construction."""
    from tflgpu import InterpreterWithCustomOps

    from .oputil import In, Out, op_model

    model, _ = op_model("MyCustomOp", [In(np.ones((1, 4), np.float32))], [Out(np.float32, (1, 4))])
    ref = litert()(model_content=model)
    with pytest.raises(RuntimeError) as want:
        ref.allocate_tensors()
    for it in (Interpreter(model_content=model), Interpreter(model_content=model, delegate=GpuDelegate(cache=False)),
               InterpreterWithCustomOps(model_content=model, custom_op_registerers=["TF_MyCustomOp"])):
        assert _normalize(it.get_input_details()) == _normalize(ref.get_input_details())
        assert it._get_op_details(0)["op_name"] == "MyCustomOp"
        with pytest.raises(RuntimeError) as got:
            it.allocate_tensors()
        assert str(got.value) == str(want.value)
    it = InterpreterWithCustomOps(model_path=str(opzoo), custom_op_registerers=["TF_Unused"])
    inputs = [np.random.default_rng(6).uniform(-1, 1, d["shape"]).astype(d["dtype"]) for d in it.get_input_details()]
    for g, w in zip(run_model(lambda **kw: it, opzoo, inputs), run_model(litert(), opzoo, inputs)):
        assert_close(g, w)


def test_litert_s_positional_arguments(opzoo, opencl_device):
    """LiteRT's constructor takes model_path, model_content, experimental_delegates and num_threads by position too:
    each such call builds the same interpreter here, and a path with content is LiteRT's ValueError. Before, any
    second positional argument was a TypeError."""
    data = opzoo.read_bytes()
    inputs = [np.random.default_rng(8).uniform(-1, 1, d["shape"]).astype(d["dtype"])
              for d in litert()(model_path=str(opzoo)).get_input_details()]
    want = run_model(litert(), opzoo, inputs)
    for args, delegates in (((None, data), None), ((str(opzoo), None, None, 2), None),
                            ((None, data, [], 1), None), ((str(opzoo), None), [GpuDelegate(cache=False)])):
        litert()(*args)  # (LiteRT takes the same call)
        it = Interpreter(*args, delegates) if delegates else Interpreter(*args)
        if delegates:
            assert it.gpu_plan is not None
        for g, w in zip(run_model(lambda **kw: it, opzoo, inputs), want):  # noqa: B023 (called at once)
            assert_close(g, w)
    with pytest.raises(ValueError) as theirs:
        litert()(str(opzoo), data)
    with pytest.raises(ValueError) as ours:
        Interpreter(str(opzoo), data)
    assert str(ours.value) == str(theirs.value)


def _second_stage_model(rng, reshape_to: tuple[int, ...] | None = None) -> bytes:
    """A second stage of a pipeline, run on a batch of crops ([-1, 12, 12, 8]): CONV_2D, DEPTHWISE_CONV_2D, MEAN,
    FULLY_CONNECTED, SOFTMAX -> [batch, 5]; with ``reshape_to``, the conv's output RESHAPEd to that fixed shape
    instead (MobileNet v1's head: [1, 1001])."""
    b = ModelBuilder()
    w = lambda name, shape: b.const(name, rng.uniform(-1, 1, shape).astype(np.float32))
    x = b.input("crops", (1, 12, 12, 8), shape_signature=(-1, 12, 12, 8))
    c = b.tensor("conv", (1, 12, 12, 16), shape_signature=(-1, 12, 12, 16))
    b.op("CONV_2D", [x, w("w", (16, 3, 3, 8)), w("b", (16,))], [c], padding="SAME", stride_w=1, stride_h=1,
         fused_activation_function="RELU")
    if reshape_to is not None:
        r = b.tensor("flat", reshape_to)
        b.op("RESHAPE", [c, b.const("shape", np.array(reshape_to, np.int32))], [r])
        b.output(r)
        return b.build()
    d = b.tensor("dw", (1, 6, 6, 16), shape_signature=(-1, 6, 6, 16))
    b.op("DEPTHWISE_CONV_2D", [c, w("dw_w", (1, 3, 3, 16)), w("dw_b", (16,))], [d], padding="SAME", stride_w=2,
         stride_h=2, depth_multiplier=1, fused_activation_function="RELU6")
    m = b.tensor("mean", (1, 16), shape_signature=(-1, 16))
    b.op("MEAN", [d, b.const("axes", np.array([1, 2], np.int32))], [m], keep_dims=False)
    f = b.tensor("fc", (1, 5), shape_signature=(-1, 5))
    b.op("FULLY_CONNECTED", [m, w("fc_w", (5, 16)), w("fc_b", (5,))], [f])
    p = b.tensor("probs", (1, 5), shape_signature=(-1, 5))
    b.op("SOFTMAX", [f], [p], beta=1.0)
    b.output(p)
    return b.build()


@pytest.mark.parametrize("delegate", [False, True], ids=["cpu", "delegate"])
def test_an_empty_batch_runs_as_in_litert_and_the_next_batch_too(rng, delegate, request):
    """A second stage given no detections: resized to batch 0, LiteRT returns [0, 5]. The CPU conv divided its
    work by the batch (ZeroDivisionError at invoke), and the delegate's plan had launches of no work-items
    (ZeroDivisionError building it). Now ops reading an empty tensor make their empty outputs without their
    kernels, and the delegate leaves such shapes to the CPU kernels; the batches before and after run as ever (on
    the device again)."""
    kw = {"delegate": GpuDelegate(cache=False)} if delegate else {}
    if delegate:
        request.getfixturevalue("opencl_device")
    from ai_edge_litert.interpreter import OpResolverType

    model = _second_stage_model(rng)
    # (LiteRT's builtin kernels: XNNPACK takes batch 0 in a new interpreter, not resized to it from another batch)
    it = Interpreter(model_content=model, **kw)
    ref = litert()(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    for batch in (2, 0, 3, 0):
        x = rng.uniform(-1, 1, (batch, 12, 12, 8)).astype(np.float32)
        got, want = (run_model(lambda **_: interp, model, [x]) for interp in (it, ref))  # noqa: B023 (called at once)
        assert got[0].shape == want[0].shape == (batch, 5)
        assert_close(got[0], want[0])
        assert (it.gpu_plan is not None) == (delegate and batch > 0)
        assert ("empty batch" in it.backend) == (delegate and batch == 0), it.backend


def test_an_empty_batch_a_fixed_shape_cannot_take_is_refused_naming_that_op(rng):
    """A graph whose RESHAPE has a fixed [1, ...] shape cannot run batch 0 (nor can LiteRT). allocate_tensors() said
    "Node number 0 (CONV_2D) failed to prepare: ZeroDivisionError": the shape propagation ran every kernel, and the
    conv's failed first on its empty input. Now the RESHAPE is named, with why."""
    from ai_edge_litert.interpreter import OpResolverType

    model = _second_stage_model(rng, reshape_to=(1, 12 * 12 * 16))
    ref = litert()(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it = Interpreter(model_content=model)
    for interp in (ref, it):
        interp.resize_tensor_input(0, [0, 12, 12, 8])
    with pytest.raises(RuntimeError, match=r"Node number 1 \(RESHAPE\) failed to prepare"):
        ref.allocate_tensors()
    with pytest.raises(RuntimeError, match=r"Node number 1 \(RESHAPE\) failed to prepare: RESHAPE: cannot reshape 0 "
                                           r"elements into \[1, 2304\]"):
        it.allocate_tensors()


def test_a_tensor_with_no_elements_inside_the_graph_runs_on_the_cpu_kernels(opencl_device, rng):
    """A SLICE of no rows (the CPU kernels make it: the device refuses the slice) read by an ADD and a CONCATENATION
    the device takes, beside a MUL of the input: LiteRT gives the empty output and the product. The delegate's
    plan divided by the bytes it stores (ZeroDivisionError at allocate_tensors()); now a graph holding an empty
    tensor at these input shapes runs on the CPU kernels (logged), as an empty batch does."""
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 3))
    s, y, z, m = (b.tensor(n, shape) for n, shape in (("s", (1, 0, 4, 3)), ("y", (1, 0, 4, 3)), ("z", (1, 0, 4, 6)),
                                                       ("m", (1, 4, 4, 3))))
    b.op("SLICE", [x, b.const("begin", np.array([0, 1, 0, 0], np.int32)),
                   b.const("size", np.array([1, 0, 4, 3], np.int32))], [s])
    b.op("ADD", [s, s], [y])
    b.op("CONCATENATION", [y, s], [z], axis=3)
    b.op("MUL", [x, x], [m])
    b.output(z, m)
    model, feeds = b.build(), [rng.uniform(-1, 1, (1, 4, 4, 3)).astype(np.float32)]
    want = run_model(litert(), model, feeds)
    for kw in ({}, {"delegate": GpuDelegate(cache=False)}):
        got = run_model(Interpreter, model, feeds, **kw)
        assert [g.shape for g in got] == [w.shape for w in want] == [(1, 0, 4, 6), (1, 4, 4, 3)]
        assert_close(got[1], want[1])


@pytest.mark.parametrize("batch", [0, 2])
def test_an_lstm_whose_state_is_of_another_batch_is_refused_saying_so(batch):
    """The corpus LSTM keeps its state in [1, 64] variables: an input resized to another batch cannot run, in LiteRT
    ("NumElements(output_state) != n_batch * n_output") and here. The refusal said "cannot reshape array of size 64
    into shape (0,newaxis)" at batch 0, and named the state's width at batch 2 (64 values read as [2, 32])."""
    path = str(corpus_model("lstm_small.tflite"))
    ref, it = litert()(model_path=path), Interpreter(model_path=path)
    for interp in (ref, it):
        shape = list(interp.get_input_details()[0]["shape"])
        interp.resize_tensor_input(0, [batch, *shape[1:]])
    with pytest.raises(RuntimeError, match=r"Node number 0 \(UNIDIRECTIONAL_SEQUENCE_LSTM\) failed to prepare"):
        ref.allocate_tensors()
    why = f"the output state holds 64 values where a batch of {batch} needs {batch} x 64"
    with pytest.raises(RuntimeError, match=rf"Node number 0 \(UNIDIRECTIONAL_SEQUENCE_LSTM\) failed to prepare: {why}"):
        it.allocate_tensors()


def test_a_constant_of_no_elements_leaves_the_plan_on_the_device(opencl_device, rng):
    """A RESHAPE to a scalar reads a shape of no elements ([0] int32, as BirdNET's and openWakeWord's graphs hold):
    not an empty batch. Taken for one, it sent those released models to the CPU kernels."""
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 3))
    m, s, y = b.tensor("m", ()), b.tensor("s", ()), b.tensor("y", (1, 4, 4, 3))
    b.op("MEAN", [x, b.const("axes", np.array([0, 1, 2, 3], np.int32))], [m], keep_dims=False)
    b.op("RESHAPE", [m, b.const("scalar", np.zeros(0, np.int32))], [s])
    b.op("MUL", [x, s], [y])
    b.output(y)
    model, feeds = b.build(), [rng.uniform(-1, 1, (1, 4, 4, 3)).astype(np.float32)]
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
    assert_close(run_model(lambda **_: it, model, feeds)[0], run_model(litert(), model, feeds)[0])
    assert it.gpu_plan is not None and it.gpu_plan.gpu_op_count > 0


def test_an_empty_batch_after_a_device_failure_runs_on_the_cpu_kernels(opencl_device, rng):
    """A device failure marks the plan failed until allocate_tensors() builds another; an empty batch, whose shapes
    were seen before, has none to build: its allocation kept the failure, and its invoke raised it."""
    from tflgpu.runtime import DeviceError

    model = _second_stage_model(rng)
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
    for batch in (0, 2):
        run_model(lambda **_: it, model, [rng.uniform(-1, 1, (batch, 12, 12, 8)).astype(np.float32)])

    def lost(*_):
        raise DeviceError("the device was lost")

    it.gpu_plan.run = lost
    with pytest.raises(DeviceError):
        it.invoke()
    got = run_model(lambda **_: it, model, [np.zeros((0, 12, 12, 8), np.float32)])
    assert got[0].shape == (0, 5) and it.gpu_plan is None


@pytest.mark.parametrize("op", ["MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"])
def test_a_reduction_over_an_empty_batch_is_litert_s(op):
    """A reduction over the batch axis of an empty batch makes values: SUM 0, REDUCE_PROD 1, MEAN NaN, and REDUCE_MAX
    / MIN the builtin kernels' start, the type's lowest / highest value (XNNPACK's is an infinity). REDUCE_MAX /
    MIN raised numpy's "zero-size array to reduction operation" there, and MEAN warned "Mean of empty slice" (an
    error under -W error)."""
    b = ModelBuilder()
    x, y = b.input("x", (1, 3), shape_signature=(-1, 3)), b.tensor("y", (3,))
    b.op(op, [x, b.const("axis", np.array([0], np.int32))], [y], keep_dims=False)
    b.output(y)
    model, feeds = b.build(), [np.zeros((0, 3), np.float32)]
    want = run_litert(model, feeds, builtin_only=True)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = run_model(Interpreter, model, feeds)[0]
    np.testing.assert_array_equal(got, want)
