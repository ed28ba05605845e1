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

_controller: ThreadpoolController | None = None


@contextlib.contextmanager
def cpu_threads(num_threads: int | None) -> Iterator[None]:
    global _controller
    if _controller is None:
        _controller = ThreadpoolController()  # after numpy is loaded, so it sees its BLAS
    if num_threads is not None:
        jit.set_num_threads(num_threads)  # (numba is imported when a numba kernel first runs)
    with _controller.limit(limits=1, user_api="blas"):
        yield
