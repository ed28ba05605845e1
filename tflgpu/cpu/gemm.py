"""Matrix products for the CPU kernels, on every core, with the bias and the clamp done while the block is hot.

numpy's BLAS (OpenBLAS) runs single-threaded during an invoke (``threads``): its worker threads spin after each
call and starve numba's, so letting it take the cores made MobileNet v2 9x slower. That left every GEMM of a
model on one core of two. Here the numba thread pool splits a product into blocks of output rows (of output
columns when there are too few rows), and each thread calls the single-threaded BLAS ``sgemm`` on its blocks
directly, then adds the bias and clamps the block while it is still in cache. One thread pool takes the cores,
and a convolution's im2col is built block by block into a buffer the thread reuses instead of as one matrix.

The ``sgemm`` (``dgemm`` for the float64 sums of the integer kernels) is numpy's own BLAS, found through threadpoolctl (the library numpy loaded) and called through a
numba intrinsic with its address as an argument, so the kernels stay in numba's on-disk cache. It is checked
against numpy on a small ragged product when first found; a BLAS without a usable CBLAS ``sgemm`` (or one
giving other numbers) is logged once, and every product then runs through ``numpy.matmul`` as before.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass

import numpy as np

from ..ops.jit import get_num_threads, njit, prange, readonly

log = logging.getLogger("tflgpu")

ROWS_PER_BLOCK = 64  # output rows per sgemm call: the block's outputs and im2col rows stay in L2 ...
WIDE_ROWS_PER_BLOCK = 128  # ... or, for weights of WIDE_WEIGHTS values or more, twice that: sgemm packs the
WIDE_WEIGHTS = 1 << 14  # weights at every call, so fewer calls (Xeon, 196x512x512: 230 -> 280 GFLOP/s)
COLUMN_SPLIT_ROWS = 64  # below this many rows, weights of COLUMN_SPLIT_WEIGHTS values or more are split between
COLUMN_SPLIT_WEIGHTS = 1 << 19  # the threads by columns: each reads half of them (49x1024x1024: 140 -> 180)
MIN_PARALLEL_FLOPS = 1 << 17  # smaller products run on the calling thread (a parallel region costs ~5 us)


@dataclass(frozen=True)
class Blas:
    """numpy's CBLAS ``sgemm`` and ``dgemm``: their addresses and whether they take 64-bit integers (ILP64)."""

    sgemm: int
    dgemm: int
    ilp64: bool

    def gemm(self, dtype) -> int:
        return self.sgemm if dtype == np.float32 else self.dgemm


_FOUND: list[Blas | None] = []
_LOCK = threading.Lock()


def _candidates(info: dict) -> list[tuple[str, str, bool]]:
    prefix = "scipy_" if "scipy" in info.get("prefix", "") else ""
    return [(f"{prefix}cblas_sgemm64_", f"{prefix}cblas_dgemm64_", True),
            (f"{prefix}cblas_sgemm", f"{prefix}cblas_dgemm", False)]


def find_blas() -> Blas | None:
    """numpy's BLAS ``cblas_sgemm`` / ``cblas_dgemm``, checked against ``numpy.matmul``; None (logged) where
    there are none."""
    with _LOCK:
        if not _FOUND:
            _FOUND.append(_find())
        return _FOUND[0]


def _find() -> Blas | None:
    from threadpoolctl import threadpool_info

    np.ones(2) @ np.ones(2)  # (numpy's BLAS is loaded lazily by some builds)
    for info in threadpool_info():
        if info.get("user_api") != "blas" or info.get("internal_api") != "openblas":
            continue
        try:
            lib = ctypes.CDLL(info["filepath"])
        except OSError:
            continue
        for symbol, dsymbol, ilp64 in _candidates(info):
            fn, dfn = getattr(lib, symbol, None), getattr(lib, dsymbol, None)
            if fn is None or dfn is None:
                continue
            found = Blas(ctypes.cast(fn, ctypes.c_void_p).value, ctypes.cast(dfn, ctypes.c_void_p).value, ilp64)
            _bind()
            if _agrees(found, np.float32) and _agrees(found, np.float64):
                return found
            log.warning("tflgpu: %s in %s gives numbers unlike numpy's; the CPU kernels use numpy.matmul",
                        symbol, info["filepath"])
            return None
    log.info("tflgpu: no CBLAS sgemm found in numpy's BLAS; the CPU kernels' products run on one core")
    return None


def _agrees(s: Blas, dtype) -> bool:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 19)).astype(dtype)
    b = rng.standard_normal((19, 23)).astype(dtype)
    bias = rng.standard_normal(23).astype(dtype)
    got = np.empty((37, 23), dtype)
    _gemm_bias_clamp(readonly(a), readonly(b), readonly(bias), dtype(-1.0), dtype(1.0), got, s.gemm(dtype),
                     s.ilp64, 1, 7, False)
    return bool(np.allclose(got, np.clip(a @ b + bias, -1.0, 1.0), rtol=1e-4, atol=1e-4))


# -- the call itself: a numba intrinsic over the function's address -----------------------------------------

_gemm_at = None  # bound by _bind() before any kernel here compiles


def _bind() -> None:
    global _gemm_at
    if _gemm_at is not None:
        return
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def gemm_at(typingctx, fn, ilp64, m, n, k, a, a_off, lda, b, b_off, ldb, c, c_off, ldc):
        """C[m, n] = A[m, k] @ B[k, n], row-major; each matrix an array, the offset (in elements) of its first
        element and its leading dimension."""
        if not isinstance(ilp64, types.BooleanLiteral):
            return None
        if not (all(isinstance(t, types.Array) for t in (a, b, c)) and a.dtype == b.dtype == c.dtype
                and a.dtype in (types.float32, types.float64)):
            return None
        double = a.dtype == types.float64
        bits = 64 if ilp64.literal_value else 32
        sig = types.void(fn, ilp64, m, n, k, a, a_off, lda, b, b_off, ldb, c, c_off, ldc)

        def codegen(context, builder, signature, args):
            i32, it, fl = ir.IntType(32), ir.IntType(bits), ir.DoubleType() if double else ir.FloatType()
            ptr = fl.as_pointer()
            fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, it, it, it, fl, ptr, it, ptr, it, fl, ptr, it])
            f_, _, m_, n_, k_, a_, ao, lda_, b_, bo, ldb_, c_, co, ldc_ = args
            tys = signature.args

            def num(v):
                w = v.type.width
                return builder.trunc(v, it) if bits < w else builder.sext(v, it) if bits > w else v

            def at(i, v, off):
                data = context.make_array(tys[i])(context, builder, v).data
                return builder.gep(data, [off])

            row_major, no_trans = i32(101), i32(111)
            builder.call(builder.inttoptr(f_, fnty.as_pointer()),
                         [row_major, no_trans, no_trans, num(m_), num(n_), num(k_), fl(1.0), at(5, a_, ao),
                          num(lda_), at(8, b_, bo), num(ldb_), fl(0.0), at(11, c_, co), num(ldc_)])
            return context.get_dummy_value()

        return sig, codegen

    _gemm_at = gemm_at


@njit(cache=True, inline="always")
def _gemm(fn, ilp64, m, n, k, a, a_off, lda, b, b_off, ldb, c, c_off, ldc):
    if ilp64:
        _gemm_at(fn, True, m, n, k, a, a_off, lda, b, b_off, ldb, c, c_off, ldc)
    else:
        _gemm_at(fn, False, m, n, k, a, a_off, lda, b, b_off, ldb, c, c_off, ldc)


@njit(cache=True, inline="always")
def _bias_clamp(out, r0, r1, c0, c1, bias, lo, hi):
    for i in range(r0, r1):
        row = out[i]
        for j in range(c0, c1):
            v = row[j] + bias[j]
            if v < lo:  # noqa: PLR1730 (NaN passes, as through TFLite's std::min(std::max(v, lo), hi))
                v = lo
            if v > hi:  # noqa: PLR1730
                v = hi
            row[j] = v


@njit(cache=True, inline="always")
def _row_blocks(m, threads, rows_per_block):
    """(rows per block, blocks, blocks per thread) for ``m`` rows in blocks of at most ``rows_per_block``: as
    many blocks for every thread, of as many rows as can be (196 rows in 64s on two threads left one thread
    128 rows and the other 68)."""
    blocks = (m + rows_per_block - 1) // rows_per_block
    blocks = ((blocks + threads - 1) // threads) * threads
    rows = max(1, (m + blocks - 1) // blocks)
    blocks = (m + rows - 1) // rows
    return rows, blocks, (blocks + threads - 1) // threads


@njit(cache=True, parallel=True)
def _gemm_bias_clamp(a, b, bias, lo, hi, out, fn, ilp64, threads, rows_per_block, split_columns):
    """out = clamp(a @ b + bias, lo, hi); a [m, k], b [k, n], out [m, n], all C-contiguous, of one dtype
    (float32: sgemm at ``fn``; float64: dgemm). The threads split the rows, or with ``split_columns`` the
    columns (runs of 16, a cache line of floats)."""
    m, k = a.shape
    n = b.shape[1]
    if not split_columns:  # blocks of rows, a contiguous run of blocks per thread
        rows_per_block, blocks, per = _row_blocks(m, threads, rows_per_block)
        for t in prange(threads):
            for blk in range(t * per, min(blocks, (t + 1) * per)):
                r0 = blk * rows_per_block
                r1 = min(m, r0 + rows_per_block)
                _gemm(fn, ilp64, r1 - r0, n, k, a, r0 * k, k, b, 0, n, out, r0 * n, n)
                _bias_clamp(out, r0, r1, 0, n, bias, lo, hi)
    else:  # a few rows (a fully connected layer): blocks of columns
        per = (((n + threads - 1) // threads + 15) // 16) * 16
        for t in prange(threads):
            c0 = t * per
            c1 = min(n, c0 + per)
            if c1 > c0:
                _gemm(fn, ilp64, m, c1 - c0, k, a, 0, k, b, c0, n, out, c0, n)
                _bias_clamp(out, 0, m, c0, c1, bias, lo, hi)
    return out


@njit(cache=True, inline="always")
def _im2col_rows(x, xz, cols, r0, r1, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow):
    """Rows [r0, r1) of im2col(x - xz) into ``cols`` (from its first row); padding is zero (an integer input's
    real zero: TFLite's input offset)."""
    _, h, w, c = x.shape
    for r in range(r0, r1):
        row = cols[r - r0]
        b = r // (oh * ow)
        oy = (r // ow) % oh
        ox = r % ow
        for ky in range(kh):
            iy = oy * sh - pt + ky * dh
            for kx in range(kw):
                ix = ox * sw - pl + kx * dw
                base = (ky * kw + kx) * c
                if iy < 0 or iy >= h or ix < 0 or ix >= w:
                    for ch in range(c):
                        row[base + ch] = 0.0
                else:
                    src = x[b, iy, ix]
                    for ch in range(c):
                        row[base + ch] = src[ch] - xz


@njit(cache=True, parallel=True)
def _conv_bias_clamp(x, wm, bias, lo, hi, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, out, fn, ilp64, threads,
                     rows_per_block):
    """out [n*oh*ow, oc] = clamp(im2col(x) @ wm + bias, lo, hi), the im2col built one block of output pixels at a
    time into each thread's own buffer."""
    nb, _, _, c = x.shape
    kdim = kh * kw * c
    oc = wm.shape[1]
    m = nb * oh * ow
    rows_per_block, blocks, per = _row_blocks(m, threads, rows_per_block)
    zero = x.dtype.type(0)
    for t in prange(threads):
        cols = np.empty((rows_per_block, kdim), dtype=x.dtype)
        for blk in range(t * per, min(blocks, (t + 1) * per)):
            r0 = blk * rows_per_block
            r1 = min(m, r0 + rows_per_block)
            _im2col_rows(x, zero, cols, r0, r1, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
            _gemm(fn, ilp64, r1 - r0, oc, kdim, cols, 0, kdim, wm, 0, oc, out, r0 * oc, oc)
            _bias_clamp(out, r0, r1, 0, oc, bias, lo, hi)
    return out


@njit(cache=True, parallel=True)
def _conv_requantize(x, xz, wm, bias, scale, oz, lo, hi, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, out, fn, ilp64,
                     threads, rows_per_block):
    """An integer convolution: out [n*oh*ow, oc] (8- or 16-bit) = XNNPACK's fp32 requantization of
    im2col(x - xz) @ wm + bias (``wm``'s float dtype holds its sums exactly), block by block: the input converted
    while its im2col rows are built, the sums requantized while hot; nothing the size of the tensor in between."""
    nb, _, _, c = x.shape
    kdim = kh * kw * c
    oc = wm.shape[1]
    m = nb * oh * ow
    rows_per_block, blocks, per = _row_blocks(m, threads, rows_per_block)
    vlo, vhi = np.float32(lo - oz), np.float32(hi - oz)
    for t in prange(threads):
        cols = np.empty((rows_per_block, kdim), dtype=wm.dtype)
        acc = np.empty((rows_per_block, oc), dtype=wm.dtype)
        for blk in range(t * per, min(blocks, (t + 1) * per)):
            r0 = blk * rows_per_block
            r1 = min(m, r0 + rows_per_block)
            _im2col_rows(x, xz, cols, r0, r1, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
            _gemm(fn, ilp64, r1 - r0, oc, kdim, cols, 0, kdim, wm, 0, oc, acc, 0, oc)
            for r in range(r1 - r0):
                arow, orow = acc[r], out[r0 + r]
                for j in range(oc):
                    v = np.float32(arow[j] + bias[j]) * scale[j]
                    orow[j] = np.int32(np.rint(min(max(v, vlo), vhi))) + oz
    return out


def gemm_bias_clamp(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, lo: float, hi: float) -> np.ndarray:
    """``clip(a @ b + bias, lo, hi)`` for ``a`` [m, k], ``b`` [k, n] (C-contiguous), ``bias`` [n] (None: none),
    all float32 or all float64."""
    m, k = a.shape
    n = b.shape[1]
    s = find_blas() if 2 * m * n * k >= MIN_PARALLEL_FLOPS else None
    if s is None:  # (a small product: numpy's call costs less than a numba dispatch)
        y = a @ b
        if bias is not None:
            y += bias
        if lo > -np.inf or hi < np.inf:
            np.clip(y, lo, hi, out=y)
        return y
    dt = a.dtype.type
    out = np.empty((m, n), dt)
    bias = np.zeros(n, dt) if bias is None else bias
    threads = get_num_threads()
    split_columns = m < 2 * threads or (m < COLUMN_SPLIT_ROWS and k * n >= COLUMN_SPLIT_WEIGHTS)
    return _gemm_bias_clamp(readonly(a), readonly(b), readonly(bias), dt(lo), dt(hi), out, s.gemm(dt), s.ilp64,
                            threads, rows_per_block(k, n), split_columns)


def rows_per_block(k: int, n: int) -> int:
    """Output rows per sgemm call for [k, n] weights."""
    return WIDE_ROWS_PER_BLOCK if k * n >= WIDE_WEIGHTS else ROWS_PER_BLOCK


def conv_bias_clamp(x: np.ndarray, wm: np.ndarray, bias: np.ndarray | None, lo: float, hi: float, kh: int, kw: int,
                    sh: int, sw: int, dh: int, dw: int, pt: int, pl: int, oh: int, ow: int) -> np.ndarray | None:
    """``clip(im2col(x) @ wm + bias, lo, hi)`` as [n*oh*ow, oc], for NHWC ``x``, ``wm`` [kh*kw*c, oc] and ``bias``,
    all float32 or all float64 (``bias`` None: none); None where there is no usable BLAS (the caller multiplies by
    numpy)."""
    s = find_blas()
    if s is None:
        return None
    m, oc = x.shape[0] * oh * ow, wm.shape[1]
    dt = x.dtype.type
    out = np.empty((m, oc), dt)
    bias = np.zeros(oc, dt) if bias is None else bias
    threads = get_num_threads() if 2 * m * oc * wm.shape[0] >= MIN_PARALLEL_FLOPS else 1
    return _conv_bias_clamp(readonly(x), readonly(wm), readonly(bias), dt(lo), dt(hi), kh, kw, sh, sw, dh, dw, pt,
                            pl, oh, ow, out, s.gemm(dt), s.ilp64, threads, rows_per_block(*wm.shape))


def conv_requantize(x: np.ndarray, xz: int, wm: np.ndarray, bias: np.ndarray, scale: np.ndarray, oz: int, lo: int,
                    hi: int, dtype, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, pt: int, pl: int, oh: int,
                    ow: int) -> np.ndarray | None:
    """An integer convolution's output [n*oh*ow, oc] of ``dtype``: clamp(rint(float32(im2col(x - xz) @ wm + bias)
    * scale), lo - oz, hi - oz) + oz, for integer NHWC ``x``, ``wm`` [kh*kw*c, oc] (float32 or float64, whose sums
    are exact), float64 ``bias`` and float32 ``scale`` per output channel; None where there is no usable BLAS."""
    s = find_blas()
    if s is None:
        return None
    m, oc = x.shape[0] * oh * ow, wm.shape[1]
    out = np.empty((m, oc), dtype)
    threads = get_num_threads() if 2 * m * oc * wm.shape[0] >= MIN_PARALLEL_FLOPS else 1
    return _conv_requantize(np.ascontiguousarray(x), wm.dtype.type(xz), wm, bias, scale, int(oz), int(lo), int(hi),
                            kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, out, s.gemm(wm.dtype), s.ilp64, threads,
                            rows_per_block(*wm.shape))
