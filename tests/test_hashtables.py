"""Hash tables (a text model's vocabulary): HASHTABLE, HASHTABLE_IMPORT, HASHTABLE_FIND, HASHTABLE_SIZE, string ->
int64 and int64 -> string, and the older HASHTABLE_LOOKUP; against LiteRT, alone and ahead of device ops."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder
from tflgpu.model.schema import TENSOR_TYPE_CODES

from .conftest import litert
from .test_ops_indexing import invokes

F = np.float32
WORDS = [b"cat", b"dog", b"bird", b"cat"]  # (a key twice: the table keeps its first value)
IDS = np.array([3, 7, 11, 99], np.int64)


def table(b: ModelBuilder, key: str, value: str, keys: int, values: int) -> int:
    """A table made and filled: its resource tensor."""
    h = b.tensor("table", [1], np.int32, type_name="RESOURCE")
    b.op("HASHTABLE", [], [h], table_id=3, key_dtype=TENSOR_TYPE_CODES[key], value_dtype=TENSOR_TYPE_CODES[value])
    b.op("HASHTABLE_IMPORT", [h, keys, values], [])
    return h


def vocabulary_model(embed: bool = False) -> bytes:
    """words -> ids (-1 where unknown) and the table's size; ``embed``: the ids, clamped, pick rows of an embedding
    that a FULLY_CONNECTED layer reads (device ops after the lookup)."""
    b = ModelBuilder()
    words = b.input("words", [4], np.object_, type_name="STRING")
    h = table(b, "STRING", "INT64", b.const("keys", WORDS), b.const("values", IDS, np.int64))
    ids = b.tensor("ids", [4], np.int64)
    b.op("HASHTABLE_FIND", [h, words, b.const("default", np.array(-1, np.int64), np.int64)], [ids])
    size = b.tensor("size", [1], np.int64)
    b.op("HASHTABLE_SIZE", [h], [size])
    outputs = [ids, size]
    if embed:
        small = b.tensor("small", [4], np.int64)
        b.op("FLOOR_MOD", [ids, b.const("rows", np.array(5, np.int64), np.int64)], [small])
        rows = b.tensor("rows", [4, 6])
        b.op("GATHER", [b.const("embedding", np.arange(30, dtype=F).reshape(5, 6) / 10), small], [rows], axis=0)
        y = b.tensor("y", [4, 3])
        b.op("FULLY_CONNECTED", [rows, b.const("w", np.linspace(-1, 1, 18, dtype=F).reshape(3, 6)), -1], [y],
             fused_activation_function="RELU")
        outputs.append(y)
    b.output(*outputs)
    return b.build()


@pytest.mark.parametrize("delegate", [False, True])
def test_vocabulary_lookup(opencl_device, delegate):
    model = vocabulary_model(embed=delegate)
    feeds = [[np.array([b"dog", b"cat", b"fish", b"bird"], object)], [np.array([b"", b"bird", b"cat", b"dog"], object)]]
    kw = {"experimental_delegates": [GpuDelegate()]} if delegate else {}
    got = invokes(Interpreter(model_content=model, **kw), feeds)
    want = invokes(litert()(model_content=model, num_threads=1), feeds)
    for (g, _), (w, _) in zip(got, want):
        for a, c in zip(g, w):
            np.testing.assert_allclose(a, c, rtol=1e-6) if a.dtype == F else np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(got[0][0][0], [7, 3, -1, 11])
    assert got[0][0][1].tolist() == [3]


def test_ids_to_words():
    b = ModelBuilder()
    ids = b.input("ids", [5], np.int64)
    h = table(b, "INT64", "STRING", b.const("keys", IDS, np.int64), b.const("values", WORDS))
    words = b.tensor("words", [5], np.object_, type_name="STRING")
    b.op("HASHTABLE_FIND", [h, ids, b.const("default", [b"<unk>"])], [words])
    b.output(words)
    model = b.build()
    feeds = [[np.array([7, 3, 5, 99, 11], np.int64)]]
    got = invokes(Interpreter(model_content=model), feeds)[0][0][0]
    assert got.tolist() == invokes(litert()(model_content=model, num_threads=1), feeds)[0][0][0].tolist()
    assert got.tolist() == [b"dog", b"cat", b"<unk>", b"cat", b"bird"]


def test_hashtable_lookup():
    """The older op: int32 keys sorted in the model, a row of values per hit, zeros and a 0 hit otherwise."""
    b = ModelBuilder()
    look = b.input("lookup", [5], np.int32)
    out, hits = b.tensor("out", [5, 2]), b.tensor("hits", [5], np.uint8)
    b.op("HASHTABLE_LOOKUP", [look, b.const("keys", np.array([2, 5, 9], np.int32)),
                              b.const("values", np.array([[1, 2], [3, 4], [5, 6]], F))], [out, hits])
    b.output(out, hits)
    model = b.build()
    feeds = [[np.array([5, 0, 9, 10, 2], np.int32)]]
    got = invokes(Interpreter(model_content=model), feeds)[0][0]
    want = invokes(litert()(model_content=model, num_threads=1), feeds)[0][0]
    for a, c in zip(got, want):
        np.testing.assert_array_equal(a, c)
    assert got[1].tolist() == [1, 0, 1, 0, 1]


def test_a_table_of_other_types_is_refused():
    b = ModelBuilder()
    h = b.tensor("table", [1], np.int32, type_name="RESOURCE")
    b.op("HASHTABLE", [], [h], table_id=1, key_dtype=TENSOR_TYPE_CODES["FLOAT32"],
         value_dtype=TENSOR_TYPE_CODES["INT64"])
    n = b.tensor("n", [1], np.int64)
    b.op("HASHTABLE_SIZE", [h], [n])
    b.output(n)
    with pytest.raises(RuntimeError, match="LiteRT's tables map INT64 to STRING or STRING to INT64"):
        Interpreter(model_content=b.build()).allocate_tensors()
