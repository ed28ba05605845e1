"""The hybrid (dynamic-range) arithmetic of LiteRT's kernels: float activations, int8 weights.

A model converted with ``optimizations = [DEFAULT]`` and no dataset keeps the weights of its LSTMs, RNNs, SVDFs
and matrix products in int8 and its values in float. LiteRT's kernels for them quantize rows of the float operand
to int8, take exact integer products with the weights and scale them back: ``float(dot) * (row scale * weight
scale)``. How the rows are quantized depends on who runs the op: TFLite's recurrent kernels quantize each step's
input and hidden state per batch row (``quantize_row``: symmetric, or asymmetric where the op's
``asymmetric_quantize_inputs`` says so); XNNPACK, which takes FULLY_CONNECTED, 1x1 convolutions and BATCH_MATMUL
with constant int8 weights, quantizes each row asymmetrically in float32 (``quantize_rows_qd8``). Dequantizing
the weights instead gives other numbers (a few thousandths of the output's range on a random LSTM; hybrid
convolutions and fully connected layers are ``cpu.quantized.hybrid_factory``'s).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops.jit import njit, prange
from ..ops.quantization import QParams, qparams, tfl_round
from .registry import OpContext


@njit(cache=True)
def _round_away(v: float) -> float:
    """std::round in float32: half away from zero."""
    f = np.floor(np.float32(abs(v) + np.float32(0.5)))
    return f if v > 0 else -f if v < 0 else v


@njit(cache=True)
def quantize_row(v, q, asymmetric: bool) -> tuple[float, int]:
    """TFLite's SymmetricQuantizeFloats / AsymmetricQuantizeFloats of one row ``v`` (float32) into ``q`` (int32
    holding the int8 values); returns (scale, zero point). A row of zeros: all 0, scale 1."""
    lo = np.float32(0.0)
    hi = np.float32(0.0)
    first = True
    for x in v:
        if first:
            lo, hi, first = x, x, False
        lo = min(lo, x)
        hi = max(hi, x)
    if not asymmetric:
        rng = max(abs(lo), abs(hi))
        if rng == 0:
            q[:] = 0
            return np.float32(1.0), 0
        inv = np.float32(np.float32(127.0) / rng)
        for i in range(v.size):
            q[i] = min(127, max(-127, int(_round_away(np.float32(v[i] * inv)))))
        return np.float32(rng / np.float32(127.0)), 0
    rmin = float(min(np.float32(0.0), lo))
    rmax = float(max(np.float32(0.0), hi))
    if rmin == rmax:
        q[:] = 0
        return np.float32(1.0), 0
    scale = (rmax - rmin) / 255.0
    from_min, from_max = -128.0 - rmin / scale, 127.0 - rmax / scale
    zp_real = from_min if 128.0 + abs(rmin / scale) < 127.0 + abs(rmax / scale) else from_max
    if zp_real <= -128.0:
        zp = -128
    elif zp_real >= 127.0:
        zp = 127
    else:
        zp = int(np.floor(abs(zp_real) + 0.5)) * (1 if zp_real >= 0 else -1)  # (C's round)
    sf = np.float32(scale)
    inv = np.float32(np.float32(1.0) / sf)
    for i in range(v.size):
        q[i] = min(127, max(-128, int(_round_away(np.float32(inv * v[i]))) + zp))
    return sf, zp


@njit(cache=True)
def quantize_rows(x, asymmetric: bool):
    """quantize_row over each row of ``x`` [n, d]: (int32 values, float32 scales [n], int32 zero points [n])."""
    n, d = x.shape
    q = np.empty((n, d), np.int32)
    scales = np.empty(n, np.float32)
    zps = np.empty(n, np.int32)
    for r in range(n):
        s, z = quantize_row(x[r], q[r], asymmetric)
        scales[r] = s
        zps[r] = z
    return q, scales, zps


@njit(cache=True)
def accumulate_product(gate, q, scale: float, zp: int, w, w_scale, w_sums) -> None:
    """gate[j] += float32(sum_k w[j, k] * q[k] - w_sums[j] * zp) * float32(scale * w_scale[j]): one row's
    integer product with int8 weights (``w`` [rows, k] int32), scaled back and added as LiteRT adds it."""
    for j in range(w.shape[0]):
        dot = 0
        for k in range(w.shape[1]):
            dot += w[j, k] * q[k]
        dot -= w_sums[j] * zp
        gate[j] += np.float32(dot) * np.float32(scale * w_scale[j])


@njit(cache=True, parallel=True)
def quantize_rows_qd8(rows):
    """XNNPACK's dynamic (qd8) quantization of each row, all in float32, one parallel pass per row: inverse scale
    255 / range, the zero point of smaller error, rounded to nearest even. Returns (quantized value - zero point,
    as float32 integers) and each row's scale. A NaN in a row makes its range, and so every value of it, NaN, as
    numpy's reductions do (tests/test_quantized.py holds the numpy expression it equals bit for bit)."""
    m, d = rows.shape
    q = np.empty((m, d), np.float32)
    scales = np.empty(m, np.float32)
    one, lo8, hi8 = np.float32(1), np.float32(-128), np.float32(127)
    for r in prange(m):
        rmin = np.float32(0)
        rmax = np.float32(0)
        for j in range(d):
            v = rows[r, j]
            if np.isnan(v) or v < rmin:
                rmin = v
            if np.isnan(v) or v > rmax:
                rmax = v
            if np.isnan(rmin):
                rmax = rmin
                break
        inv = one if rmin == rmax else np.float32(np.float32(255) / (rmax - rmin))
        rmin_s, rmax_s = np.float32(rmin * inv), np.float32(rmax * inv)
        zp = np.float32(lo8 - rmin_s) if (lo8 + rmin_s) + (hi8 + rmax_s) > 0 else np.float32(hi8 - rmax_s)
        if zp < lo8:  # noqa: PLR1730 (np.clip keeps a NaN; max() would drop it)
            zp = lo8
        if zp > hi8:  # noqa: PLR1730
            zp = hi8
        zp = np.rint(zp)
        vlo, vhi = np.float32(lo8 - zp), np.float32(hi8 - zp)
        for j in range(d):
            v = np.float32(rows[r, j] * inv)
            if np.isnan(zp):  # (an infinite range: np.clip against NaN bounds gives NaN)
                v = zp
            if v < vlo:  # noqa: PLR1730
                v = vlo
            if v > vhi:  # noqa: PLR1730
                v = vhi
            q[r, j] = np.rint(v)
        scales[r] = one / inv
    return q, scales


def quantize_images(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's AsymmetricQuantizeFloats per image (the hybrid convolutions' and TRANSPOSE_CONV's; quantize_row
    is the same for one small row inside a numba loop): each image's range [min(0, x), max(0, x)] mapped
    onto [-128, 127] with a nudged integer zero point. Returns (quantized value - zero point, as float32
    integers; so a padded zero stays zero) and each row's scale."""
    n = x.shape[0]
    rows = x.reshape(n, -1).astype(np.float32, copy=False)
    rmin = np.minimum(rows.min(axis=1, initial=0), 0).astype(np.float64)
    rmax = np.maximum(rows.max(axis=1, initial=0), 0).astype(np.float64)
    flat = rmin == rmax
    scale = np.where(flat, 1.0, (rmax - rmin) / 255.0)
    zp = np.where(128.0 + np.abs(rmin / scale) < 127.0 + np.abs(rmax / scale), -128.0 - rmin / scale,
                  127.0 - rmax / scale)
    off = np.where(flat, 0, np.where(zp <= -128, -128, np.where(zp >= 127, 127, tfl_round(zp)))).astype(np.float32)
    inv = np.float32(1.0) / scale.astype(np.float32)
    # (rounded before the offset is added, as LiteRT's x86 build does)
    q = _offset_round_rows(np.ascontiguousarray(rows), inv, off, flat)
    return q.reshape(x.shape), scale.astype(np.float32)


QUANT_CHUNK = 1 << 14  # values per parallel task of _offset_round_rows (a row is a whole image)


@njit(cache=True, parallel=True)
def _offset_round_rows(rows, inv, off, flat):
    """clip(tfl_round(rows * inv) + off, -128, 127) - off per row, in float32 (0 for a flat row): one parallel
    pass over every value, in chunks, where numpy took ten."""
    n, size = rows.shape
    q = np.empty((n, size), np.float32)
    chunks = (size + QUANT_CHUNK - 1) // QUANT_CHUNK
    lo, hi, half = np.float32(-128), np.float32(127), np.float32(0.5)
    for task in prange(n * chunks):
        r = task // chunks
        j0 = (task % chunks) * QUANT_CHUNK
        j1 = min(size, j0 + QUANT_CHUNK)
        o, s = off[r], inv[r]
        if flat[r]:
            q[r, j0:j1] = 0
            continue
        for j in range(j0, j1):
            v = np.float32(rows[r, j] * s)
            f = np.floor(np.float32(abs(v) + half))
            t = f if v > 0 else -f if v < 0 else v  # (std::round: half away from zero; NaN stays NaN)
            t = np.float32(t + o)
            if t < lo:  # noqa: PLR1730 (np.clip keeps a NaN)
                t = lo
            if t > hi:  # noqa: PLR1730
                t = hi
            q[r, j] = np.float32(t - o)
    return q


@dataclass(frozen=True)
class HybridWeights:
    """int8 weights [rows, k] as int32, each row's scale (per tensor: a gate's scale over its rows) and row sums
    (for asymmetric inputs)."""

    values: np.ndarray
    scales: np.ndarray
    sums: np.ndarray

    @classmethod
    def of(cls, ctx: OpContext, inputs: list[int]) -> HybridWeights:
        """The int8 weight tensors at ``inputs`` stacked by rows (gate after gate)."""
        values, scales = [], []
        for i in inputs:
            w, p = int8_weights(ctx, i)
            values.append(np.asarray(w, np.int32).reshape(w.shape[0], -1))
            scales.append(np.full(w.shape[0], p.s, np.float32))
        v = np.ascontiguousarray(np.concatenate(values))
        return cls(v, np.concatenate(scales), v.sum(axis=1).astype(np.int32))

    def product(self, x: np.ndarray, asymmetric: bool) -> np.ndarray:
        """What rows ``x`` [n, k] (float32, each quantized on its own range) add through these weights: [n, rows]
        float32 terms, each as LiteRT adds it to a gate."""
        q, scales, zps = quantize_rows(np.ascontiguousarray(x, np.float32), asymmetric)
        dot = q.astype(np.float64) @ self.values.T.astype(np.float64) - np.outer(zps, self.sums)  # (exact)
        return dot.astype(np.float32) * (scales[:, None] * self.scales[None, :])


def int8_weights(ctx: OpContext, i: int, per_channel: int = 0) -> tuple[np.ndarray, QParams]:
    """Input ``i``: constant int8 weights with zero point 0 and one scale (or, with ``per_channel``, one per row of
    that many), as LiteRT's hybrid kernels take them; else the node is refused."""
    t, w = ctx.input_tensor(i), ctx.const(i)
    p = qparams(t) if t is not None else None
    if w is None or t.dtype != np.int8 or p is None or len(p.scale) not in (1, per_channel or 1) or \
            np.any(p.zero_point != 0):
        raise ctx.fail(f"hybrid weights (input {i}) must be constant int8 with zero point 0 and one scale"
                       f"{' or one per output channel' if per_channel else ''}")
    return w, p


def is_hybrid(ctx: OpContext, weight: int, data: int = 0) -> bool:
    """Whether the op's float input (``data``) meets int8 weights (input ``weight``): LiteRT's hybrid kernels."""
    x, w = ctx.input_tensor(data), ctx.input_tensor(weight)
    return x is not None and w is not None and x.dtype == np.float32 and w.dtype == np.int8
