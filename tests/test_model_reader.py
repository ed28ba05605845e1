"""The reader: schema features and validation of malformed files."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import Interpreter
from tflgpu.model import read_model
from tflgpu.model.builder import ModelBuilder, csr_encode

from .conftest import assert_close, check_against_litert, corpus_model, litert, run_model
from .verdicts import wrapped_bug


def _small_model(rng=None) -> bytes:
    rng = rng or np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 2))
    w = b.const("w", rng.standard_normal((3, 3, 3, 2)).astype(np.float32))
    bias = b.const("bias", np.zeros(3, np.float32))
    y = b.tensor("y", (1, 4, 4, 3))
    b.op("CONV_2D", [x, w, bias], [y], padding="SAME", stride_w=1, stride_h=1)
    b.output(y)
    return b.build()


def test_weights_are_zero_copy_views_of_the_mapped_file():
    path = corpus_model("mobilenet_v1_1.0_224.tflite")
    model = read_model(path)
    weights = [t.data for t in model.main.tensors if t.data is not None and t.data.size > 1000]
    assert weights
    for w in weights:
        assert not w.flags.owndata and not w.flags.writeable
        base = w
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        assert not isinstance(base, np.ndarray)  # rooted in the mmap/bytes, not a copied array


def test_external_buffers_offset_and_size(rng):
    b = ModelBuilder()
    x = b.input("x", (2, 8))
    w = b.const("w", rng.standard_normal((5, 8)).astype(np.float32))
    bias = b.const("bias", rng.standard_normal(5).astype(np.float32))
    y = b.tensor("y", (2, 5))
    b.op("FULLY_CONNECTED", [x, w, bias], [y])
    b.output(y)
    inline, external = b.build(), b.build(external_buffers=True)
    m = read_model(external)
    np.testing.assert_array_equal(m.main.tensors[w].data, read_model(inline).main.tensors[w].data)
    check_against_litert(external, [rng.standard_normal((2, 8)).astype(np.float32)])


@pytest.mark.parametrize("block_map", [True, False], ids=["empty block map", "no block map"])
def test_sparse_weights_densify(rng, block_map):
    """CSR weights densified as LiteRT does, and their sparsity details LiteRT's: an empty block map where the
    model stores one (as this builder's encoding does), none where the field is left out (MediaPipe's models)."""
    dense = (rng.standard_normal((6, 5)) * (rng.random((6, 5)) > 0.6)).astype(np.float32)
    values, sparsity = csr_encode(dense)
    if not block_map:
        del sparsity["block_map"]
    model, ws = _densified_fc(values, sparsity, dense.shape)
    x_val = rng.standard_normal((2, 5)).astype(np.float32)
    got = check_against_litert(model, [x_val])
    assert_close(got[0], x_val @ dense.T)
    assert _sparsity_details(Interpreter, model, ws) == _sparsity_details(litert(), model, ws)


def _densified_fc(values: np.ndarray, sparsity: dict, shape: tuple[int, int]) -> tuple[bytes, int]:
    """x (2 x shape[1]) -> FULLY_CONNECTED with the weights DENSIFY rebuilds from ``values``; (model, the sparse
    tensor's index)."""
    b = ModelBuilder()
    x = b.input("x", (2, shape[1]))
    ws = b.const("ws", values, sparsity=sparsity, shape=shape)
    wd = b.tensor("wd", shape)
    b.op("DENSIFY", [ws], [wd])
    y = b.tensor("y", (2, shape[0]))
    b.op("FULLY_CONNECTED", [x, wd, -1], [y])
    b.output(y)
    return b.build(), ws


def _sparsity_details(interpreter, model: bytes, t: int) -> dict:
    details = interpreter(model_content=model).get_tensor_details()[t]["sparsity_parameters"]
    listed = lambda v: v.tolist() if isinstance(v, np.ndarray) else v  # noqa: E731
    return {k: [{kk: listed(vv) for kk, vv in d.items()} for d in v] if k == "dim_metadata" else listed(v)
            for k, v in details.items()}


def test_block_sparse_weights_densify(rng):
    """Weights stored in blocks of 4 rows (a block map): densified as LiteRT does, and their sparsity details
    LiteRT's (which name a block map only where the tensor has one)."""
    dense = rng.standard_normal((8, 5)).astype(np.float32)
    blocks = np.stack([dense[i * 4:(i + 1) * 4].T for i in range(2)])  # (block row, column, row in block)
    sparsity = {"traversal_order": [0, 1, 2], "block_map": [0],
                "dim_metadata": [{"format": 0, "dense_size": 2}, {"format": 0, "dense_size": 5},
                                 {"format": 0, "dense_size": 4}]}
    model, ws = _densified_fc(blocks.reshape(-1), sparsity, dense.shape)
    x_val = rng.standard_normal((2, 5)).astype(np.float32)
    got = check_against_litert(model, [x_val])
    assert_close(got[0], x_val @ dense.T)
    assert _sparsity_details(Interpreter, model, ws) == _sparsity_details(litert(), model, ws)
    assert _sparsity_details(Interpreter, model, ws)["block_map"] == [0]


def test_metadata_signatures_and_subgraphs():
    b = ModelBuilder()
    x = b.input("x", (2,))
    y = b.tensor("y", (2,))
    b.op("RELU", [x], [y])
    b.output(y)
    b.signature("run", {"inp": x}, {"out": y})
    b.add_metadata("min_runtime_version", b"1.5.0")
    b.subgraph("unused")
    m = read_model(b.build())
    assert m.metadata["min_runtime_version"] == b"1.5.0"
    assert [s.key for s in m.signature_defs] == ["run"]
    assert len(m.subgraphs) == 2


def test_deprecated_builtin_code_only():
    """Old models carry only the one-byte deprecated_builtin_code (builtin_code 0)."""
    model = bytearray(_small_model())
    m = read_model(bytes(model))
    assert m.main.operators[0].name == "CONV_2D"
    # rewrite with builtin_code zeroed: the reader must fall back to the deprecated field
    from tflite.Model import Model

    fb = Model.GetRootAs(model, 0)
    oc = fb.OperatorCodes(0)
    o = oc._tab.Offset(10)  # builtin_code field (vtable slot 3)
    assert o
    pos = oc._tab.Pos + o
    model[pos : pos + 4] = (0).to_bytes(4, "little")
    assert read_model(bytes(model)).main.operators[0].name == "CONV_2D"


def test_custom_op_name_and_options():
    b = ModelBuilder()
    x = b.input("x", (1, 2, 2, 1))
    y, i = b.tensor("y", (1, 1, 1, 1)), b.tensor("i", (1, 1, 1, 1), np.int32)
    b.op("MaxPoolingWithArgmax2D", [x], [y, i], custom_options=b"\x01\x00\x00\x00" * 10)
    b.output(y, i)
    op = read_model(b.build()).main.operators[0]
    assert op.is_custom and op.name == "MaxPoolingWithArgmax2D" and len(op.custom_options) == 40


def test_quantization_parameters_read():
    m = read_model(corpus_model("mobilenet_v2_1.0_224_int8.tflite"))
    q = [t.quantization for t in m.main.tensors if t.quantization is not None]
    assert any(len(x.scales) > 1 for x in q) and any(len(x.scales) == 1 for x in q)


# -- malformed input -----------------------------------------------------------

def test_not_a_flatbuffer():
    for data in (b"", b"abc", b"\x00" * 64, b"TFL3" * 10, b"garbage" * 100):
        with pytest.raises(ValueError, match="not a valid Flatbuffer|identifier"):
            Interpreter(model_content=data)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.tflite"
    p.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        Interpreter(str(p))


def test_truncated_files_raise_value_error():
    """Every cut of a model is refused at construction with a ValueError that is a verdict (no internal error
    behind it), or, where the cut leaves a readable model, runs."""
    data = _small_model()
    cuts = range(8, len(data), max(1, len(data) // 97))
    refused = 0
    for cut in cuts:
        try:
            it = Interpreter(model_content=data[:cut])
        except ValueError as e:
            assert wrapped_bug(e) is None, (cut, e)
            refused += 1
            continue
        it.allocate_tensors()  # a cut that happens to leave a valid model must run
        it.invoke()
    assert refused >= len(cuts) - 2, f"only {refused} of {len(cuts)} cuts refused"


def test_bit_flips_load_and_run_or_raise_clearly():
    data = _small_model()
    rng = np.random.default_rng(7)
    x = np.ones((1, 4, 4, 2), np.float32)
    outcomes = {"ran": 0, "rejected": 0}
    for _ in range(300):
        mutated = bytearray(data)
        for pos in rng.integers(0, len(data), rng.integers(1, 4)):
            mutated[pos] ^= 1 << int(rng.integers(0, 8))
        try:
            it = Interpreter(model_content=bytes(mutated))
            it.allocate_tensors()
            for d in it.get_input_details():
                it.set_tensor(d["index"], np.ones(d["shape"], d["dtype"]) if d["shape"].tolist() != [1, 4, 4, 2] else x)
            it.invoke()
            outcomes["ran"] += 1
        except (ValueError, RuntimeError) as e:
            assert wrapped_bug(e) is None, f"a refusal wrapping an internal error: {e!r}"
            outcomes["rejected"] += 1
    assert outcomes["ran"] > 0 and outcomes["rejected"] > 0, outcomes


def test_out_of_range_tensor_index():
    b = ModelBuilder()
    x = b.input("x", (2,))
    y = b.tensor("y", (2,))
    b.op("RELU", [x], [y])
    b.main.ops[0].inputs = [17]
    b.output(y)
    with pytest.raises(ValueError, match="op 0 RELU.*tensor 17, out of range"):
        Interpreter(model_content=b.build())


def test_tensor_used_before_produced():
    b = ModelBuilder()
    x = b.input("x", (2,))
    y, z = b.tensor("y", (2,)), b.tensor("z", (2,))
    b.op("RELU", [y], [z])  # y is produced by the next op
    b.op("RELU", [x], [y])
    b.output(z)
    with pytest.raises(ValueError, match="used before any op produces it"):
        Interpreter(model_content=b.build())


def test_buffer_too_small_for_shape():
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    w = b.const("w", np.zeros((3,), np.float32))
    b.main.tensors[w].shape = (3, 3)  # claims 9 floats, holds 3
    y = b.tensor("y", (2, 3))
    b.op("FULLY_CONNECTED", [x, w, -1], [y])
    b.output(y)
    with pytest.raises(ValueError, match=r"tensor 1 'w'.*holds 12 bytes but shape \[3, 3\]"):
        Interpreter(model_content=b.build())


def test_giant_tensor_is_refused():
    b = ModelBuilder()
    x = b.input("x", (1 << 20, 1 << 20, 1 << 10))
    y = b.tensor("y", (1,))
    b.op("RELU", [x], [y])
    b.output(y)
    with pytest.raises(ValueError, match="over the limit"):
        Interpreter(model_content=b.build())


def test_unsupported_op_names_op_code_and_index():
    b = ModelBuilder()
    x = b.input("x", (4, 4))
    y = b.tensor("y", (4, 4))
    b.op("RELU", [x], [y])
    z = b.tensor("z", (4,))
    b.op("CONCAT_EMBEDDINGS", [y], [z])  # (LiteRT has no kernel for it either)
    b.output(z)
    with pytest.raises(ValueError, match=r"op CONCAT_EMBEDDINGS \(code 29\) at index 1 is not supported"):
        Interpreter(model_content=b.build())


def test_unknown_op_code():
    data = bytearray(_small_model())
    from tflite.Model import Model

    oc = Model.GetRootAs(data, 0).OperatorCodes(0)
    pos = oc._tab.Pos + oc._tab.Offset(10)
    data[pos : pos + 4] = (250).to_bytes(4, "little")
    with pytest.raises(ValueError, match=r"op UNKNOWN_OP_250 \(code 250\) at index 0 is not supported"):
        Interpreter(model_content=bytes(data))


def test_wrong_shape_and_dtype_inputs(rng):
    it = Interpreter(model_content=_small_model())
    it.allocate_tensors()
    with pytest.raises(ValueError, match="Dimension mismatch"):
        it.set_tensor(0, np.zeros((1, 4, 4, 3), np.float32))
    with pytest.raises(ValueError, match="Got value of type FLOAT64"):
        it.set_tensor(0, np.zeros((1, 4, 4, 2)))
    data = _small_model()
    got = run_model(Interpreter, data, [rng.standard_normal((1, 4, 4, 2)).astype(np.float32)])
    assert got[0].shape == (1, 4, 4, 3)
