"""Keep BLAS and numba from fighting over the cores.

The CPU path runs GEMMs (OpenBLAS, through numpy) between numba-parallel
kernels. OpenBLAS's worker threads spin after each call, starving numba's
workers: on 2 cores MobileNetV2 took 166 ms with both pools active and 18 ms
with BLAS single-threaded. So during an invoke BLAS gets one thread and
numba gets the cores; outside an invoke the user's settings are untouched.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from threadpoolctl import ThreadpoolController

from ..ops import jit

_controller: ThreadpoolController | None = None


@contextlib.contextmanager
def cpu_threads(num_threads: int | None) -> Iterator[None]:
    global _controller
    if _controller is None:
        _controller = ThreadpoolController()  # after numpy is loaded, so it sees its BLAS
    numba = sys.modules.get("numba") if jit.loaded() else None  # (imported when a numba kernel first runs)
    if num_threads is not None:
        if numba is not None:
            numba.set_num_threads(max(1, min(num_threads, numba.config.NUMBA_NUM_THREADS)))
        else:
            jit.pending_threads = num_threads
    with _controller.limit(limits=1, user_api="blas"):
        yield
