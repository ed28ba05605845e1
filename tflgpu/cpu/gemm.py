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

from ..ops.jit import njit, prange

log = logging.getLogger("tflgpu")

ROWS_PER_BLOCK = 64  # output rows per sgemm call: the block's outputs and im2col rows stay in L2
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
    _gemm_bias_clamp(a, b, bias, dtype(-1.0), dtype(1.0), got, s.gemm(dtype), s.ilp64, 1, 7)
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


@njit(cache=True, parallel=True)
def _gemm_bias_clamp(a, b, bias, lo, hi, out, fn, ilp64, threads, rows_per_block):
    """out = clamp(a @ b + bias, lo, hi); a [m, k], b [k, n], out [m, n], all C-contiguous, of one dtype
    (float32: sgemm at ``fn``; float64: dgemm)."""
    m, k = a.shape
    n = b.shape[1]
    if m >= 2 * threads:  # blocks of rows, a contiguous run of blocks per thread
        rows_per_block = min(rows_per_block, (m + threads - 1) // threads)  # (every thread gets a block)
        blocks = (m + rows_per_block - 1) // rows_per_block
        per = (blocks + threads - 1) // threads
        for t in prange(threads):
            for blk in range(t * per, min(blocks, (t + 1) * per)):
                r0 = blk * rows_per_block
                r1 = min(m, r0 + rows_per_block)
                _gemm(fn, ilp64, r1 - r0, n, k, a, r0 * k, k, b, 0, n, out, r0 * n, n)
                _bias_clamp(out, r0, r1, 0, n, bias, lo, hi)
    else:  # a few rows (a fully connected layer): blocks of columns
        per = (n + threads - 1) // threads
        for t in prange(threads):
            c0 = t * per
            c1 = min(n, c0 + per)
            if c1 > c0:
                _gemm(fn, ilp64, m, c1 - c0, k, a, 0, k, b, c0, n, out, c0, n)
                _bias_clamp(out, 0, m, c0, c1, bias, lo, hi)
    return out


@njit(cache=True, parallel=True)
def _conv_bias_clamp(x, wm, bias, lo, hi, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, out, fn, ilp64, threads,
                     rows_per_block):
    """out [n*oh*ow, oc] = clamp(im2col(x) @ wm + bias, lo, hi), the im2col built one block of output pixels at a
    time into each thread's own buffer."""
    nb, h, w, c = x.shape
    kdim = kh * kw * c
    oc = wm.shape[1]
    m = nb * oh * ow
    rows_per_block = max(1, min(rows_per_block, (m + threads - 1) // threads))
    blocks = (m + rows_per_block - 1) // rows_per_block
    per = (blocks + threads - 1) // threads
    for t in prange(threads):
        cols = np.zeros((rows_per_block, kdim), dtype=x.dtype)
        for blk in range(t * per, min(blocks, (t + 1) * per)):
            r0 = blk * rows_per_block
            r1 = min(m, r0 + rows_per_block)
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
                                row[base + ch] = src[ch]
            _gemm(fn, ilp64, r1 - r0, oc, kdim, cols, 0, kdim, wm, 0, oc, out, r0 * oc, oc)
            _bias_clamp(out, r0, r1, 0, oc, bias, lo, hi)
    return out


def _threads() -> int:
    import numba

    return numba.get_num_threads()


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
    return _gemm_bias_clamp(a, b, bias, dt(lo), dt(hi), out, s.gemm(dt), s.ilp64, _threads(),
                            ROWS_PER_BLOCK)


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
    threads = _threads() if 2 * m * oc * wm.shape[0] >= MIN_PARALLEL_FLOPS else 1
    return _conv_bias_clamp(x, wm, bias, dt(lo), dt(hi), kh, kw, sh, sw, dh, dw, pt, pl, oh, ow,
                            out, s.gemm(dt), s.ilp64, threads, ROWS_PER_BLOCK)
