"""Affine quantization as TFLite defines it: a tensor's parameters, and converting between real values and
the stored integers (``real = scale * (q - zero_point)``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .jit import PARALLEL_ELEMENTS, njit, prange, readonly

QTYPES = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))


# A float view's simulator after a mean of stored integers (ops.traits' rounds_raw_mean) snaps the rescaled
# mean to a multiple of 1/RAW_MEAN_SNAP before rounding it: the mean of n <= 1024 integers is a multiple of 1/n,
# so the float error of rescaling it (~1e-6 relative of at most 255) goes, and a .5 is exactly .5.
RAW_MEAN_SNAP = 1024.0


@dataclass(frozen=True)
class SimGrid:
    """What a float view's quantization simulator (QUANT_SIM, rounding half to even) computes, as both backends
    compute it: ``rint(clamp(x * inv, lo, hi)) * scale``, all in float32.

    That is TFLite's ``(clamp(rint(x / scale) + zero_point, qmin, qmax) - zero_point) * scale`` exactly, in
    fewer steps: the zero point added and taken away again is gone (the sums are exact integers), and a clamp to
    integer bounds commutes with rounding. ``clamp`` (the bounds of an activation the simulator took over from the
    op before it, graph.float_view) clamps ``x`` first; the product's rounding keeps order, so that clamp joins
    the grid's own as ``clamp(x, a, b) * inv`` clamped to ``[a * inv, b * inv]``. TFLite's form never gives -0.0
    (it adds the zero point to the rounded value): where ``lo`` is below zero, a value rounding to zero from below
    would, and ``plus_zero`` adds 0.0 after the rounding; where the grid starts at zero and goes up, ``lo`` is the
    least normal float instead (every value up to it rounds to +0.0; -0.0 clamped to 0.0 may stay -0.0)."""

    inv: np.float32
    lo: np.float32
    hi: np.float32
    scale: np.float32

    @classmethod
    def of(cls, scale: float, zero_point: int, qmin: int, qmax: int,
           clamp: tuple[float, float] | None = None) -> SimGrid | None:
        """The grid of these parameters; None where an activation's clamp leaves no value on it (it does not
        overlap the grid's range: the simulator must not take that clamp over)."""
        inv = np.float32(1.0) / np.float32(scale)
        lo, hi = np.float32(qmin - zero_point), np.float32(qmax - zero_point)
        if clamp is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                lo = max(lo, np.float32(np.float32(clamp[0]) * inv))
                hi = min(hi, np.float32(np.float32(clamp[1]) * inv))
        if not lo <= hi:
            return None
        if lo == 0 < hi:
            lo = np.finfo(np.float32).tiny
        return cls(inv, np.float32(lo), np.float32(hi), np.float32(scale))

    @property
    def plus_zero(self) -> bool:
        return bool(self.lo <= 0)

    def apply(self, x: np.ndarray) -> np.ndarray:
        q = np.rint(np.clip(np.asarray(x, np.float32) * self.inv, self.lo, self.hi))
        return ((q + np.float32(0.0) if self.plus_zero else q) * self.scale).astype(np.float32, copy=False)


@dataclass(frozen=True)
class QParams:
    scale: np.ndarray  # float32 [n]
    zero_point: np.ndarray  # int64 [n]
    dim: int
    dtype: np.dtype

    @property
    def qmin(self) -> int:
        return int(np.iinfo(self.dtype).min)

    @property
    def qmax(self) -> int:
        return int(np.iinfo(self.dtype).max)

    @property
    def s(self) -> float:
        return float(self.scale[0])

    @property
    def z(self) -> int:
        return int(self.zero_point[0])

    def same(self, other: QParams) -> bool:
        return (self.dtype == other.dtype and np.array_equal(self.scale, other.scale)
                and np.array_equal(self.zero_point, other.zero_point))

    def broadcast(self, ndim: int) -> tuple[np.ndarray, np.ndarray]:
        """(scale, zero point) shaped to broadcast over a rank-``ndim`` array."""
        if len(self.scale) == 1:
            return self.scale[0], self.zero_point[0]
        shape = [1] * ndim
        shape[self.dim] = len(self.scale)
        return self.scale.reshape(shape), self.zero_point.reshape(shape)


def qparams(t) -> QParams | None:
    """The tensor's quantization if it is an integer tensor TFLite would treat as quantized."""
    if t is None or t.dtype not in QTYPES or t.quantization is None:
        return None
    q = t.quantization
    if len(q.scales) == 0:
        return None
    scale = np.asarray(q.scales, np.float32).reshape(-1)
    zp = np.asarray(q.zero_points, np.int64).reshape(-1)
    if len(zp) != len(scale):
        zp = np.resize(zp, len(scale)) if len(zp) else np.zeros(len(scale), np.int64)
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise ValueError(f"tensor '{t.name}' has an invalid quantization scale {scale[:4].tolist()}")
    return QParams(scale, zp, int(q.quantized_dimension), t.dtype)


def tfl_round(x: np.ndarray) -> np.ndarray:
    """std::round: half away from zero."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


@njit(cache=True, inline="always")
def _quantize_one(x, scale, zp, lo, hi):
    v = np.float64(x) / scale
    if np.isnan(v):  # NaN: as zero
        v = 0.0
    r = np.floor(abs(v) + 0.5)
    q = (r if v >= 0 else -r) + zp
    return min(max(q, lo), hi)


@njit(cache=True, parallel=True)
def _quantize_flat(x, scale, zp, lo, hi, out):
    for i in prange(x.size):
        out[i] = _quantize_one(x[i], scale, zp, lo, hi)


@njit(cache=True)
def _quantize_flat_serial(x, scale, zp, lo, hi, out):
    for i in range(x.size):
        out[i] = _quantize_one(x[i], scale, zp, lo, hi)


def quantize_values(real: np.ndarray, p: QParams) -> np.ndarray:
    """round(real / scale) + zero point (half away from zero, as TfLiteRound), clamped to the type's range; NaN
    as zero."""
    if len(p.scale) == 1 and np.ndim(real) > 0:  # (one pass; the host side of every float-view output)
        x = np.ascontiguousarray(real).reshape(-1)
        if x.dtype not in (np.float32, np.float64):
            x = x.astype(np.float64)
        out = np.empty(x.size, p.dtype)
        run = _quantize_flat if x.size >= PARALLEL_ELEMENTS else _quantize_flat_serial
        run(x, np.float64(p.scale[0]), np.float64(p.z), np.float64(p.qmin), np.float64(p.qmax), out)
        return out.reshape(np.shape(real))
    scale, zp = p.broadcast(np.ndim(real))
    q = tfl_round(np.nan_to_num(np.asarray(real, np.float64)) / np.asarray(scale, np.float64)) + zp
    return np.clip(q, p.qmin, p.qmax).astype(p.dtype)


@njit(cache=True)
def _dequantize_flat(q, zp, scale, out):
    for i in range(q.size):
        out[i] = (np.float32(q[i]) - zp) * scale


def dequantize_values(q: np.ndarray, p: QParams) -> np.ndarray:
    """float32((float32(q) - zero point) * scale)."""
    q = np.asarray(q)
    if len(p.scale) == 1 and q.ndim > 0 and q.dtype in QTYPES:  # (one pass, no temporaries)
        out = np.empty(q.shape, np.float32)
        _dequantize_flat(readonly(np.ascontiguousarray(q).reshape(-1)), np.float32(p.zero_point[0]),
                         np.float32(p.scale[0]), out.reshape(-1))
        return out
    scale, zp = p.broadcast(np.ndim(q))
    return ((np.asarray(q, np.float32) - np.asarray(zp, np.float32)) * np.asarray(scale, np.float32)).astype(np.float32)