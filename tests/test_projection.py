"""LSH_PROJECTION (older on-device text models' projection layers): farmhash's Fingerprint64 against the library's
own values, and the op against LiteRT's bits, SPARSE and DENSE, with and without weights, over input types and
ranks; and what LiteRT refuses at prepare, refused at allocate_tensors()."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import Interpreter
from tflgpu.cpu.projection import fingerprint64
from tflgpu.model.builder import ModelBuilder

from .conftest import litert, run_model

F = np.float32
SPARSE, DENSE = 1, 2

# farmhash's Fingerprint64 (pyfarmhash 0.5.1's fingerprint64) of bytes (37 i + 11) mod 256, i < n: every length
# class of farmhashna::Hash64 (0, 1-3, 4-7, 8-16, 17-32, 33-64, and the 64-byte loop once, twice, with a tail)
KNOWN = {0: 11160318154034397263, 3: 3979540680440595841, 4: 14708324829907283305, 7: 10810953559526984053,
         8: 9029840561075318013, 16: 15579719139305551062, 17: 6692022265393568454, 32: 11543571239247179175,
         33: 9480451918888261270, 64: 4226431515964725, 65: 18101669290602532278, 128: 3742283891066476345,
         200: 5850749971184008558}


def test_fingerprint64_is_farmhashs():
    for n, want in KNOWN.items():
        data = ((np.arange(n) * 37 + 11) % 256).astype(np.uint8)
        assert int(fingerprint64(np.concatenate([data, np.zeros(3, np.uint8)]), n)) == want, n  # (only n bytes)


def lsh_model(kind: int, hashes: np.ndarray | None, hash_shape, x_shape, x_type, weighted: bool) -> bytes:
    """LSH_PROJECTION of input x (and weight w) by ``hashes`` (a constant; None: an input of ``hash_shape``)."""
    b = ModelBuilder()
    h = b.const("h", hashes) if hashes is not None else b.input("h", list(hash_shape))
    ins = [h, b.input("x", list(x_shape), x_type)]
    if weighted:
        ins.append(b.input("w", [x_shape[0]]))
    y = b.tensor("y", [hash_shape[0] * (hash_shape[1] if kind == DENSE else 1)], np.int32)
    b.op("LSH_PROJECTION", ins, [y], type=kind)
    b.output(y)
    return b.build()


@pytest.mark.parametrize("kind", [SPARSE, DENSE])
@pytest.mark.parametrize("weighted", [False, True])
def test_lsh_projection_gives_litert_bits(rng, kind, weighted):
    """Every bit as LiteRT's: hash functions of 1 to 31 bits, inputs int32 / float32 / uint8 of rank 1 to 3 (the
    fingerprinted keys 8 to 72 bytes long), a constant hash or one given as an input."""
    cases = [((4, 8), (6,), np.int32), ((3, 16), (3, 4), F), ((2, 31), (7, 2, 3), np.int32), ((5, 1), (1,), F),
             ((3, 12), (20, 17), np.uint8)]
    for k, (hash_shape, x_shape, x_type) in enumerate(cases):
        hashes = rng.normal(0, 1, hash_shape).astype(F)
        x = (rng.normal(0, 1, x_shape) if x_type == F else rng.integers(0, 1000, x_shape)).astype(x_type)
        feeds = [x] + ([rng.normal(0, 1, x_shape[0]).astype(F)] if weighted else [])
        constant = k % 2 == 0
        model = lsh_model(kind, hashes if constant else None, hash_shape, x_shape, x_type, weighted)
        feeds = feeds if constant else [hashes, *feeds]
        want = run_model(litert(), model, feeds)[0]
        got = run_model(Interpreter, model, feeds)[0]
        assert got.dtype == np.int32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        if kind == DENSE:
            assert 0 < want.sum() < want.size  # (both signs: a bit stuck at one value would pass otherwise)


def test_lsh_projection_refuses_what_litert_refuses(rng):
    """More than 32 bits per function, or a weight of another length than the input's rows: refused at
    allocate_tensors() naming the node, as LiteRT refuses them at prepare."""
    for hash_shape, weight_len in (((2, 33), None), ((2, 4), 5)):
        b = ModelBuilder()
        x = b.input("x", [4], np.int32)
        ins = [b.const("h", rng.normal(0, 1, hash_shape).astype(F)), x]
        if weight_len is not None:
            ins.append(b.input("w", [weight_len]))
        y = b.tensor("y", [hash_shape[0]], np.int32)
        b.op("LSH_PROJECTION", ins, [y], type=SPARSE)
        b.output(y)
        model = b.build()
        with pytest.raises(RuntimeError, match="failed to prepare"):
            litert()(model_content=model).allocate_tensors()
        with pytest.raises(RuntimeError, match=r"Node number 0 \(LSH_PROJECTION\) failed to prepare"):
            Interpreter(model_content=model).allocate_tensors()


def skip_gram_model(n: int, max_skip: int, all_sizes: bool) -> bytes:
    b = ModelBuilder()
    text = b.input("text", [1], np.object_, type_name="STRING")
    grams = b.tensor("grams", [1], np.object_, type_name="STRING", shape_signature=[-1])
    b.op("SKIP_GRAM", [text], [grams], ngram_size=n, max_skip_size=max_skip, include_all_ngrams=all_sizes)
    b.output(grams)
    return b.build()


def test_skip_gram_gives_litert_ngrams(rng):
    """Random sentences of 0 to 6 words (runs of spaces, tabs and newlines between them, a leading one, which
    LiteRT's split takes the first word with, and a trailing one): LiteRT's n-grams in its order, for n of 1 to 4,
    skips of 0 to 2, with and without every smaller size."""
    cases = 0
    for trial in range(60):
        n, max_skip, all_sizes = int(rng.integers(1, 5)), int(rng.integers(0, 3)), bool(trial % 2)
        words = [bytes(rng.choice(list(b"abcde"), int(rng.integers(1, 4))).tolist()) for _ in range(rng.integers(0, 7))]
        seps = [[b" ", b"  ", b"\t", b"\n "][int(rng.integers(0, 4))] for _ in words]
        text = b"".join(s + w for s, w in zip(seps, words)) if trial % 3 else b" ".join(words)
        text += b" " if trial % 5 == 0 else b""
        model = skip_gram_model(n, max_skip, all_sizes)
        feed = [np.array([text], object)]
        want = run_model(litert(), model, feed)[0]
        got = run_model(Interpreter, model, feed)[0]
        assert got.dtype == object and list(got) == list(want), (text, n, max_skip, all_sizes)
        cases += bool(len(want))
    assert cases >= 30  # (most sentences had enough words)


def test_skip_gram_output_size_follows_the_text():
    """One interpreter, sentences of other lengths: each invoke's output holds its own n-grams (its size set by the
    data: graph.sizes), as LiteRT's; an ngram_size of 0 is refused at prepare."""
    model = skip_gram_model(2, 1, False)
    ours, ref = Interpreter(model_content=model), litert()(model_content=model)
    for it in (ours, ref):
        it.allocate_tensors()
    for text in (b"a b c d", b"x y", b"one"):
        outs = []
        for it in (ours, ref):
            it.set_tensor(it.get_input_details()[0]["index"], np.array([text], object))
            it.invoke()
            outs.append(list(it.get_tensor(it.get_output_details()[0]["index"])))
        assert outs[0] == outs[1]
    with pytest.raises(RuntimeError, match=r"Node number 0 \(SKIP_GRAM\) failed to prepare: ngram_size 0"):
        Interpreter(model_content=skip_gram_model(0, 1, False)).allocate_tensors()
