"""RANDOM_UNIFORM, RANDOM_STANDARD_NORMAL and MULTINOMIAL as LiteRT draws them: TensorFlow's Philox-4x32-10
generator keyed by the op's ``seed`` / ``seed2`` (both 0: seeds from the OS, a new sequence every run), its float
and double conversions and Box-Muller pairs, so a seeded model gives LiteRT's numbers. The generator is the op's
state: it goes on from invoke to invoke, and starts again when the model is prepared for new input shapes (a
resize that changes one), as LiteRT re-prepares it.
"""

from __future__ import annotations

import copy
import os

import numpy as np

from .registry import KernelError, OpContext, fits, register

_M = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_W = (0x9E3779B9, 0xBB67AE85)
_LOW32 = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


class Philox:
    """TensorFlow's PhiloxRandom: a 128-bit counter (the high 64 bits from ``seed_hi``) and a 64-bit key (``seed_lo``);
    each call gives four uint32 and counts up by one."""

    def __init__(self, seed_lo: int, seed_hi: int):
        self.key = (seed_lo % (1 << 64)) & 0xFFFFFFFF, (seed_lo % (1 << 64)) >> 32
        self.counter = (seed_hi % (1 << 64)) << 64  # (the low 64 bits start at 0)

    def draw(self, calls: int) -> np.ndarray:
        """The next ``calls`` results, [calls, 4] uint32; the counter moves on by ``calls``."""
        base, self.counter = self.counter, (self.counter + calls) % (1 << 128)
        lo = np.uint64(base & ((1 << 64) - 1)) + np.arange(calls, dtype=np.uint64)
        hi = np.full(calls, base >> 64, np.uint64) + (lo < np.uint64(base & ((1 << 64) - 1))).astype(np.uint64)
        return philox4x32(self.key, lo, hi)

    def skip(self, count: int) -> None:
        self.counter = (self.counter + count) % (1 << 128)


def philox4x32(key: tuple[int, int], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Philox-4x32-10 of the 128-bit counters ``hi`` << 64 | ``lo`` (uint64 arrays) under ``key`` (two uint32):
    [n, 4] uint32, TensorFlow's and XLA's order."""
    c = [lo & _LOW32, lo >> _32, hi & _LOW32, hi >> _32]
    k0, k1 = key
    for _ in range(10):
        p0, p1 = _M[0] * c[0], _M[1] * c[2]
        c = [(p1 >> _32) ^ c[1] ^ np.uint64(k0), p1 & _LOW32, (p0 >> _32) ^ c[3] ^ np.uint64(k1), p0 & _LOW32]
        k0, k1 = (k0 + _W[0]) & 0xFFFFFFFF, (k1 + _W[1]) & 0xFFFFFFFF
    return np.stack(c, axis=1).astype(np.uint32)


def uint32_to_float(x: np.ndarray) -> np.ndarray:
    """[0, 1) from 23 random mantissa bits, as TensorFlow's Uint32ToFloat."""
    return ((np.uint32(127 << 23) | (x & np.uint32(0x7FFFFF))).view(np.float32) - np.float32(1.0)).astype(np.float32)


def box_muller(x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TensorFlow's BoxMullerFloat: two standard normal floats from two uint32."""
    u1 = np.maximum(uint32_to_float(x0), np.float32(1.0e-7))
    v1 = (2.0 * np.pi * uint32_to_float(x1).astype(np.float64)).astype(np.float32)
    u2 = np.sqrt(np.float32(-2.0) * np.log(u1))
    return np.sin(v1) * u2, np.cos(v1) * u2


def _generator(ctx: OpContext):
    """The op's Philox, made again whenever the model is prepared for other input shapes."""
    # (LiteRT keeps each seed in a C int: the low 32 bits, sign-extended into Philox's 64)
    seed, seed2 = (int(np.int64(int(ctx.opt(k, 0) or 0) % (1 << 32)).astype(np.int32)) for k in ("seed", "seed2"))
    rt = ctx.runtime
    box: list = []

    def get() -> Philox:
        generation = getattr(rt, "preparations", 0)
        if not box or box[0] != generation:
            lo, hi = (seed, seed2) if (seed or seed2) else (int.from_bytes(os.urandom(8), "little"),
                                                            int.from_bytes(os.urandom(8), "little"))
            box[:] = [generation, Philox(lo, hi)]
        return box[1]

    return get


def _shape(x) -> tuple[int, ...]:
    shape = np.asarray(x)
    if shape.ndim != 1:
        raise KernelError(f"the shape input must be 1-D, got {shape.ndim}-D")
    return fits(shape, np.float32, "random op")


def _uniform(bits: np.ndarray) -> np.ndarray:
    return uint32_to_float(bits.reshape(-1))


def _normal(bits: np.ndarray) -> np.ndarray:
    """Each call's four uint32 as two Box-Muller pairs, in order."""
    (a, b), (c, d) = (box_muller(bits[:, i], bits[:, i + 1]) for i in (0, 2))
    return np.stack([a, b, c, d], axis=1).reshape(-1)


def _floats(ctx: OpContext, convert):
    """A random op of float32 values of the shape its input holds: four a generator call, the last call's extra
    ones dropped."""
    generator = _generator(ctx)

    def run(xs):
        shape = _shape(xs[0])
        n = int(np.prod(shape, dtype=np.int64))
        return [convert(generator().draw(-(-n // 4)))[:n].astype(np.float32).reshape(shape)]

    return run


register("RANDOM_UNIFORM")(lambda ctx: _floats(ctx, _uniform))
register("RANDOM_STANDARD_NORMAL")(lambda ctx: _floats(ctx, _normal))


@register("MULTINOMIAL")
def multinomial(ctx: OpContext):
    """``num_samples`` class indices per row of logits, drawn from a copy of the generator (which then skips a
    block of draws, as TensorFlow's op does) against the row's cumulative exp(logit - max) in double."""
    generator = _generator(ctx)
    out_dtype = ctx.output_tensor(0).dtype

    def run(xs):
        logits = np.asarray(xs[0], np.float32)
        samples = int(np.asarray(xs[1]).reshape(-1)[0]) if np.asarray(xs[1]).size == 1 else -1
        if logits.ndim != 2 or logits.shape[1] < 1 or samples < 0:
            raise KernelError(f"MULTINOMIAL: logits [batch, classes > 0] and num_samples >= 0, got "
                              f"{list(logits.shape)} and {samples}")
        batch = logits.shape[0]
        rng = generator()
        draws = copy.copy(rng)
        rng.skip(batch * ((samples + 3) // 4 * 4) * 2 * 256)
        bits = draws.draw(-(-batch * samples // 2)).reshape(-1, 2)[: batch * samples].astype(np.uint64)
        mantissa = ((bits[:, 0] & np.uint64(0xFFFFF)) << _32) | bits[:, 1]
        u = ((np.uint64(1023) << np.uint64(52)) | mantissa).view(np.float64) - 1.0
        out = np.empty((batch, samples), out_dtype)
        finite = np.isfinite(logits)
        for b in range(batch):
            row = logits[b]
            top = float(row[finite[b]].max()) if finite[b].any() else float(np.finfo(np.float32).min)
            cdf = np.cumsum(np.where(finite[b], np.exp(row.astype(np.float64) - top), 0.0))
            out[b] = np.searchsorted(cdf, u[b * samples:(b + 1) * samples] * cdf[-1], side="right")
        return [out]

    return run
