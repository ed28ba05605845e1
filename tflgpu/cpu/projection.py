"""The string-projection ops of older on-device text models (projection networks, Smart Reply), as LiteRT computes
them: SKIP_GRAM and LSH_PROJECTION.

SKIP_GRAM: the words of its one string (split at whitespace, with LiteRT's quirk: a string that starts with one
whitespace character loses its first word), and their n-grams of ``ngram_size`` words (every size up to it with
``include_all_ngrams``), each next word at most ``max_skip_size`` words past the one before, in LiteRT's order: by
first word, a longer n-gram before the shorter one it extends.

LSH_PROJECTION: each of
the op's seeds (the hash tensor's floats, [functions, bits]) gives one bit, the sign of the sum over the input's rows
of each row's weight times the row's 64-bit fingerprint, farmhash's Fingerprint64 of the seed's four bytes followed
by the row's bytes, as a signed integer made a double. SPARSE packs each function's bits into one int32 (the first
bit highest) offset by ``function << bits``; DENSE gives every bit.

Fingerprint64 is farmhash's ``farmhashna::Hash64`` (its ``Fingerprint64`` is fixed across platforms and versions),
written here in numba rather than taken from a binding: one op of old models does not justify a C++ extension
dependency, and LiteRT's own LSH_PROJECTION checks every bit of it in the tests.
"""

from __future__ import annotations

import numpy as np

from ..ops.jit import njit
from .registry import KernelError, OpContext, register

_SPARSE, _DENSE = 1, 2  # LSHProjectionType

_K0 = np.uint64(0xC3A5C85C97CB3127)
_K1 = np.uint64(0xB492B66FBE98F273)
_K2 = np.uint64(0x9AE16A3B2F90404F)


@njit(cache=True)
def _fetch(s, i, width):
    """The ``width`` bytes of ``s`` from ``i``, little-endian, as uint64."""
    v = np.uint64(0)
    for k in range(width):
        v |= np.uint64(s[i + k]) << np.uint64(8 * k)
    return v


@njit(cache=True)
def _fetch64(s, i):
    return _fetch(s, i, 8)


@njit(cache=True)
def _rotate(v, shift):
    return (v >> np.uint64(shift)) | (v << np.uint64(64 - shift))


@njit(cache=True)
def _shift_mix(v):
    return v ^ (v >> np.uint64(47))


@njit(cache=True)
def _hash16(u, v, mul):
    a = (u ^ v) * mul
    a ^= a >> np.uint64(47)
    b = (v ^ a) * mul
    b ^= b >> np.uint64(47)
    return b * mul


@njit(cache=True)
def _len0to16(s, n):
    if n >= 8:
        mul = _K2 + np.uint64(n * 2)
        a = _fetch64(s, 0) + _K2
        b = _fetch64(s, n - 8)
        c = _rotate(b, 37) * mul + a
        d = (_rotate(a, 25) + b) * mul
        return _hash16(c, d, mul)
    if n >= 4:
        mul = _K2 + np.uint64(n * 2)
        a = _fetch(s, 0, 4)
        return _hash16(np.uint64(n) + (a << np.uint64(3)), _fetch(s, n - 4, 4), mul)
    if n > 0:
        y = np.uint64(np.uint32(s[0]) + (np.uint32(s[n >> 1]) << np.uint32(8)))
        z = np.uint64(np.uint32(n) + (np.uint32(s[n - 1]) << np.uint32(2)))
        return _shift_mix(y * _K2 ^ z * _K0) * _K2
    return _K2


@njit(cache=True)
def _len17to32(s, n):
    mul = _K2 + np.uint64(n * 2)
    a = _fetch64(s, 0) * _K1
    b = _fetch64(s, 8)
    c = _fetch64(s, n - 8) * mul
    d = _fetch64(s, n - 16) * _K2
    return _hash16(_rotate(a + b, 43) + _rotate(c, 30) + d, a + _rotate(b + _K2, 18) + c, mul)


@njit(cache=True)
def _len33to64(s, n):
    mul = _K2 + np.uint64(n * 2)
    a = _fetch64(s, 0) * _K2
    b = _fetch64(s, 8)
    c = _fetch64(s, n - 8) * mul
    d = _fetch64(s, n - 16) * _K2
    y = _rotate(a + b, 43) + _rotate(c, 30) + d
    z = _hash16(y, a + _rotate(b + _K2, 18) + c, mul)
    e = _fetch64(s, 16) * mul
    f = _fetch64(s, 24)
    g = (y + _fetch64(s, n - 32)) * mul
    h = (z + _fetch64(s, n - 24)) * mul
    return _hash16(_rotate(e + f, 43) + _rotate(g, 30) + h, e + _rotate(f + a, 18) + g, mul)


@njit(cache=True)
def _weak32(s, i, a, b):
    """farmhash's WeakHashLen32WithSeeds of the 32 bytes of ``s`` from ``i``: (first, second)."""
    w, x, y, z = _fetch64(s, i), _fetch64(s, i + 8), _fetch64(s, i + 16), _fetch64(s, i + 24)
    a += w
    b = _rotate(b + a + z, 21)
    c = a
    a += x
    a += y
    b += _rotate(a, 44)
    return a + z, b + c


@njit(cache=True)
def fingerprint64(s, n):
    """farmhash's Fingerprint64 of the first ``n`` bytes of the uint8 array ``s``, as uint64."""
    if n <= 16:
        return _len0to16(s, n)
    if n <= 32:
        return _len17to32(s, n)
    if n <= 64:
        return _len33to64(s, n)
    seed = np.uint64(81)
    x = seed
    y = seed * _K1 + np.uint64(113)
    z = _shift_mix(y * _K2 + np.uint64(113)) * _K2
    v0 = v1 = w0 = w1 = np.uint64(0)
    x = x * _K2 + _fetch64(s, 0)
    end = ((n - 1) // 64) * 64
    last64 = end + ((n - 1) & 63) - 63
    at = 0
    while True:
        x = _rotate(x + y + v0 + _fetch64(s, at + 8), 37) * _K1
        y = _rotate(y + v1 + _fetch64(s, at + 48), 42) * _K1
        x ^= w1
        y += v0 + _fetch64(s, at + 40)
        z = _rotate(z + w0, 33) * _K1
        v0, v1 = _weak32(s, at, v1 * _K1, x + w0)
        w0, w1 = _weak32(s, at + 32, z + w1, y + _fetch64(s, at + 16))
        x, z = z, x
        at += 64
        if at == end:
            break
    mul = _K1 + ((z & np.uint64(0xFF)) << np.uint64(1))
    at = last64
    w0 += np.uint64((n - 1) & 63)
    v0 += w0
    w0 += v0
    x = _rotate(x + y + v0 + _fetch64(s, at + 8), 37) * mul
    y = _rotate(y + v1 + _fetch64(s, at + 48), 42) * mul
    x ^= w1 * np.uint64(9)
    y += v0 * np.uint64(9) + _fetch64(s, at + 40)
    z = _rotate(z + w0, 33) * mul
    v0, v1 = _weak32(s, at, v1 * mul, x + w0)
    w0, w1 = _weak32(s, at + 32, z + w1, y + _fetch64(s, at + 16))
    x, z = z, x
    return _hash16(_hash16(v0, w0, mul) + _shift_mix(y) * _K0 + z, _hash16(v1, w1, mul) + x, mul)


@njit(cache=True)
def _sign_bits(seeds, rows, weights, weighted):
    """For each seed (float32 bytes as uint8 [seeds, 4]), 1 where the weighted sum over ``rows`` (uint8 [n, bytes])
    of the signed fingerprints of seed + row is positive, else 0, summed in row order in double as LiteRT does."""
    n, width = rows.shape
    key = np.empty(4 + width, np.uint8)
    out = np.zeros(seeds.shape[0], np.int32)
    for k in range(seeds.shape[0]):
        key[:4] = seeds[k]
        score = 0.0
        for i in range(n):
            key[4:] = rows[i]
            value = float(np.int64(fingerprint64(key, 4 + width)))
            score += weights[i] * value if weighted else value
        out[k] = 1 if score > 0 else 0
    return out


@register("LSH_PROJECTION")
def lsh_projection(ctx: OpContext):
    """LiteRT's checks at prepare: hash [functions, bits <= 32], input of rank >= 1 with a row, a weight of one
    value per row; the kind SPARSE or DENSE."""
    kind = int(ctx.opt("type", 0))
    if kind not in (_SPARSE, _DENSE):
        raise ctx.fail(f"type {kind} is neither SPARSE ({_SPARSE}) nor DENSE ({_DENSE})")
    if len(ctx.op.inputs) not in (2, 3):
        raise ctx.fail(f"takes 2 or 3 inputs (hash, input, weight), got {len(ctx.op.inputs)}")
    weighted = ctx.has_input(2)
    hashes, x = ctx.input_tensor(0), ctx.input_tensor(1)
    if x.type_name == "STRING":
        raise ctx.fail("a STRING input is not hashed here (its bytes are LiteRT's string buffer)")
    if len(hashes.shape) == 2 and hashes.shape[1] > 32:
        raise ctx.fail(f"hash has {hashes.shape[1]} bits per function; at most 32")
    if weighted and x.shape and ctx.input_tensor(2).shape != (x.shape[0],):
        raise ctx.fail(f"weight {list(ctx.input_tensor(2).shape)} must hold one value per input row ({x.shape[0]})")

    def run(xs):
        hashes, x = np.asarray(xs[0]), np.ascontiguousarray(xs[1])
        if hashes.ndim != 2 or hashes.shape[1] > 32:
            raise KernelError(f"LSH_PROJECTION: hash must be [functions, bits <= 32], got {list(hashes.shape)}")
        if x.ndim < 1 or x.shape[0] < 1:
            raise KernelError(f"LSH_PROJECTION: input must have rank >= 1 and a row, got {list(x.shape)}")
        weights = np.zeros(x.shape[0], np.float32)
        if weighted:
            weights = np.asarray(xs[2], np.float32)
            if weights.ndim != 1 or weights.shape[0] != x.shape[0]:
                raise KernelError(f"LSH_PROJECTION: weight must be [{x.shape[0]}] (one per input row), got "
                                  f"{list(weights.shape)}")
        functions, bits = hashes.shape
        seeds = np.ascontiguousarray(hashes, np.float32).reshape(-1, 1).view(np.uint8)
        rows = x.reshape(x.shape[0], -1).view(np.uint8).reshape(x.shape[0], -1)
        signs = _sign_bits(seeds, rows, weights.astype(np.float64), weighted)
        if kind == _DENSE:
            return [signs]
        packed = np.zeros(functions, np.int64)
        for j in range(bits):
            packed = (packed << 1) | signs.reshape(functions, bits)[:, j]
        return [(packed + np.arange(functions, dtype=np.int64) * (1 << bits)).astype(np.int32)]

    return run


def _words(text: bytes) -> list[bytes]:
    """LiteRT's split of a string at whitespace (a run of it ends a word; the first character starts one even
    where it is whitespace, so a single leading whitespace character takes the first word with it)."""
    words, start = [], 0
    for i in range(1, len(text)):
        if text[i:i + 1].isspace():
            if i > start and not text[start:start + 1].isspace():
                words.append(text[start:i])
            start = i + 1
    if len(text) > start:
        words.append(text[start:])
    return words


def skip_grams(text: bytes, n: int, max_skip: int, all_sizes: bool) -> list[bytes]:
    """The n-grams of ``text``'s words, depth first as LiteRT enumerates them: ``chosen[d]`` is the word at depth
    d, a depth steps in while a next word lies within ``max_skip`` skipped words, and an n-gram is emitted when its
    depth is left."""
    words = _words(text)
    if len(words) < n:
        return []
    out, chosen, depth = [], [0] * n, 1
    while depth >= 0:
        deeper = depth < n and chosen[depth] + 1 < len(words) and (
            depth == 0 or chosen[depth] - chosen[depth - 1] <= max_skip)
        if deeper:
            chosen[depth] += 1
            depth += 1
            if depth < n:
                chosen[depth] = chosen[depth - 1]
        else:
            if depth > 0 and (depth <= n if all_sizes else depth == n):
                out.append(b" ".join(words[chosen[d]] for d in range(depth)))
            depth -= 1
    return out


@register("SKIP_GRAM")
def skip_gram(ctx: OpContext):
    n, max_skip = int(ctx.opt("ngram_size", 0)), int(ctx.opt("max_skip_size", 0))
    all_sizes = bool(ctx.opt("include_all_ngrams", False))
    if n < 1 or max_skip < 0:
        raise ctx.fail(f"ngram_size {n} must be >= 1 and max_skip_size {max_skip} >= 0")

    def run(xs):
        text = np.asarray(xs[0], dtype=object).reshape(-1)
        if text.size < 1:
            raise KernelError("SKIP_GRAM: the input holds no string")
        return [np.array(skip_grams(bytes(text[0]), n, max_skip, all_sizes), dtype=object)]

    return run
