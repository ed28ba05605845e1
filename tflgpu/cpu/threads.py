"""Keep BLAS and numba from fighting over the cores.

The CPU path runs GEMMs (OpenBLAS, through numpy) between numba-parallel
kernels. OpenBLAS's worker threads spin after each call, starving numba's
workers: on 2 cores MobileNetV2 took 166 ms with both pools active and 18 ms
with BLAS single-threaded. So during an invoke BLAS gets one thread and
numba gets the cores; outside an invoke the user's settings are untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from threadpoolctl import ThreadpoolController

from ..ops import jit

_BLAS: list = []  # numpy's BLAS libraries' thread controllers, found at the first invoke (numpy loaded by then)


def _blas_libraries() -> list:
    if not _BLAS:
        _BLAS.append(ThreadpoolController().select(user_api="blas").lib_controllers)
    return _BLAS[0]


@contextlib.contextmanager
def cpu_threads(num_threads: int | None) -> Iterator[None]:
    """BLAS on one thread and numba on ``num_threads`` (None: as set) for the block; the BLAS's own setting is
    put back after it. Through the libraries' own calls (~2 us a block, against ~10 us for threadpoolctl's
    ``limit``, which re-inspects every library: a fifth of a small model's invoke)."""
    libs = _blas_libraries()
    if num_threads is not None:
        jit.set_num_threads(num_threads)  # (numba is imported when a numba kernel first runs)
    before = [lib.get_num_threads() for lib in libs]
    for lib, n in zip(libs, before):
        if n != 1:
            lib.set_num_threads(1)
    try:
        yield
    finally:
        for lib, n in zip(libs, before):
            if n != 1:
                lib.set_num_threads(n)
