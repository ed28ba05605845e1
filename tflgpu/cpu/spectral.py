"""TFLite's spectral ops and the complex values they make: RFFT2D (an audio model's STFT, e.g. BirdNET's
mel spectrogram), then REAL, IMAG, COMPLEX_ABS (and CAST, in elementwise, keeps the real part).

RFFT2D transforms the last two dimensions of a float32 input, each cropped or zero-padded to ``fft_length``
(a constant pair of powers of two), into complex64 ``[..., fft_length[0], fft_length[1] / 2 + 1]``. TFLite
computes it in double precision (Ooura's rdft2d) and stores complex float; numpy's pocketfft in complex128,
rounded once at the end, agrees to float32's last bit or so.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..ops import jit
from .registry import OpContext, register

_POOL: list[ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """Threads for numpy's FFT, which releases the GIL while it transforms (one pool per process, made at first
    use; as many threads as the kernels run on)."""
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(max(1, jit.get_num_threads()), thread_name_prefix="tflgpu-fft"))
        return _POOL[0]


def _rows_rfft(x: np.ndarray, n: int) -> np.ndarray:
    """The real FFT of length ``n`` along the last axis, in double, the rows split among the kernels' threads
    (BirdNET's 511 frames of 2,048 samples: 4.1 ms on one thread of this machine, 2.2 on two)."""
    x = x.astype(np.float64)
    rows = x.reshape(-1, x.shape[-1])
    parts = min(jit.get_num_threads(), len(rows))
    if parts <= 1 or x.size < jit.PARALLEL_ELEMENTS:  # (a small transform: the hand-off would cost more)
        return np.fft.rfft(x, n=n, axis=-1)
    chunks = np.array_split(rows, parts)
    done = list(_pool().map(lambda c: np.fft.rfft(c, n=n, axis=-1), chunks))
    return np.concatenate(done).reshape(*x.shape[:-1], n // 2 + 1)


@register("RFFT2D")
def rfft2d(ctx: OpContext):
    x_t = ctx.input_tensor(0)
    if x_t.dtype != np.float32:
        raise ctx.fail(f"RFFT2D takes a float32 input, not {x_t.type_name}")
    if len(x_t.shape) < 2:
        raise ctx.fail(f"RFFT2D needs an input of rank 2 or more, not {len(x_t.shape)}")
    fft = ctx.const(1)
    if fft is None:
        raise ctx.fail("RFFT2D's fft_length must be a constant")
    fft = np.asarray(fft).reshape(-1)
    if fft.size != 2 or (fft < 1).any() or (fft & (fft - 1)).any():
        raise ctx.fail(f"RFFT2D's fft_length must be two powers of two, not {fft.tolist()}")
    lengths = (int(fft[0]), int(fft[1]))

    def run(xs):
        x = np.asarray(xs[0])
        if x.ndim < 2:
            raise ValueError(f"RFFT2D needs an input of rank 2 or more, not {x.ndim}")
        if lengths[0] == 1 and x.shape[-2] >= 1:  # (one row: an STFT's frames, each its own 1-D transform)
            return [_rows_rfft(x[..., :1, :], lengths[1]).astype(np.complex64)]
        return [np.fft.rfft2(x.astype(np.float64), s=lengths, axes=(-2, -1)).astype(np.complex64)]

    return run


@register("REAL", "IMAG", "COMPLEX_ABS")
def complex_part(ctx: OpContext):
    if ctx.input_tensor(0).type_name not in ("COMPLEX64", "COMPLEX128"):
        raise ctx.fail(f"{ctx.op.name} takes a complex input, not {ctx.input_tensor(0).type_name}")
    part = {"REAL": np.real, "IMAG": np.imag, "COMPLEX_ABS": np.abs}[ctx.op.name]
    dtype = ctx.output_tensor(0).dtype

    def run(xs):
        return [np.asarray(part(np.asarray(xs[0]))).astype(dtype)]

    return run
