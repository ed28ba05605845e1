"""numba, imported when a numba kernel first runs rather than with the package.

numba and llvmlite take ~70 MiB of a process and ~0.3 s to import. A model whose every op runs on the OpenCL
device, started from a stored plan, runs no numba kernel at all, so it should not pay for them. ``njit`` here
records the function and its options; the first call of any recorded function imports numba, compiles (or
loads from numba's cache) every recorded function, and puts the dispatchers in place of the records in every
``tflgpu`` module that holds one, with ``prange`` set to numba's, so a kernel calling another kernel, or
looping with ``prange``, compiles as if numba had been imported from the start.

A cached kernel compiles a new argument signature under a lock file beside its numba cache index
(``_one_compile``): processes that start together on a cold cache (a server's workers, parallel ``tflgpu warmup``
jobs, the test suite's workers) compile each signature once, and the others load what the first wrote.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:  # (not POSIX: each process compiles for itself, as numba does)
    fcntl = None

log = logging.getLogger("tflgpu")

PARALLEL_ELEMENTS = 1 << 16  # below this many values a numba parallel region (several microseconds to start) costs
# more than it saves: such a pass runs on the calling thread (or as numpy's passes)

_RECORDED: list[LazyJit] = []
_THREADS: list[int] = []  # the thread count asked for before numba was imported, applied when it is
_LOCK = threading.Lock()
_READY = False


class _LazyPrange:
    """Stands for ``numba.prange`` until numba is imported (then the module global is numba's own)."""

    def __call__(self, *args):
        return range(*args)


prange = _LazyPrange()


class LazyJit:
    """A function to be compiled by ``numba.njit(**options)``, compiled when any recorded one is first called."""

    def __init__(self, py_func, options: dict[str, Any]):
        self.py_func, self.options, self.dispatcher = py_func, options, None
        self.__name__, self.__doc__, self.__module__ = py_func.__name__, py_func.__doc__, py_func.__module__

    def __call__(self, *args, **kwargs):
        if self.dispatcher is None:
            materialize()
        return self.dispatcher(*args, **kwargs)


def njit(*args, **options):
    """``numba.njit``, deferred: ``@njit`` or ``@njit(cache=True, parallel=True)``."""
    if args and callable(args[0]) and not options:
        return _record(args[0], {})
    return lambda f: _record(f, options)


def _record(f, options: dict):
    w = LazyJit(f, options)
    with _LOCK:
        if _READY:  # (defined after the first kernel ran: compiled as numba.njit would be)
            _compile(w)
            _patch(f.__globals__)
            return w.dispatcher
        _RECORDED.append(w)
    return w


def _compile(w: LazyJit) -> None:
    import numba
    from numba.core.caching import NullCache

    def make(cache: bool):
        return numba.njit(**{**w.options, "cache": cache})(w.py_func)

    dispatcher = cached_or_not(make) if w.options.get("cache") else numba.njit(**w.options)(w.py_func)
    if not isinstance(dispatcher._cache, NullCache):  # (cached: numba found a directory for it)
        tolerate_cache_writes(dispatcher._cache)
        if fcntl is not None:
            # (numba's dispatcher calls _compile_for_args only for a signature it has no machine code for)
            dispatcher._compile_for_args = _one_compile(dispatcher, dispatcher._compile_for_args)
    w.dispatcher = dispatcher


_CACHE_WARNED: list[bool] = []


def _no_cache_directory(e: RuntimeError) -> bool:
    """Whether numba refused ``cache=True`` for want of a writable directory (none of its candidates: the
    source's ``__pycache__``, the user's cache directory, NUMBA_CACHE_DIR)."""
    return "cannot cache function" in str(e)


def cached_or_not(make: Callable[[bool], Any]) -> Any:
    """``make(True)`` (a numba object made with ``cache=True`` that compiles as it is made, as a signature-typed
    ``vectorize``), or, where numba's cache cannot be written, ``make(False)`` after saying so once."""
    try:
        return make(True)
    except OSError as e:
        _cache_unwritable(e)
    except RuntimeError as e:
        if not _no_cache_directory(e):
            raise
        _cache_unwritable(e)
    return make(False)


def _cache_unwritable(e: Exception) -> None:
    """Say once per process that numba's cache of the CPU kernels' machine code cannot be written."""
    if not _CACHE_WARNED:
        _CACHE_WARNED.append(True)
        log.warning("tflgpu: numba cannot keep the CPU kernels' machine code on disk (%s): they compile again in "
                    "each process; free space there, or set NUMBA_CACHE_DIR to a writable directory", e)


def tolerate_cache_writes(cache) -> None:
    """Make a numba cache's writes best-effort: one that fails (a full disk, a directory made read-only) is logged
    once, and the kernel, compiled already, runs from memory. numba raised the OSError out of the compile, so an
    invoke ended in "No space left on device" from inside numba. (numba writes through a temporary file and
    removes it on failure: nothing partial is left.)"""
    save = cache.save_overload

    def save_overload(sig, data):
        try:
            save(sig, data)
        except OSError as e:
            _cache_unwritable(e)

    cache.save_overload = save_overload


COMPILE_WAIT_S = 600.0  # longest wait for another process's compile (numba's slowest kernel: ~10 s on 2 cores)
_COMPILING = threading.local()  # (a compile inside another, on this thread: no second lock)


def _one_compile(dispatcher, compile_for_args):
    """``compile_for_args`` (numba's compile of a new signature, which first looks in numba's cache) under an
    exclusive lock on ``<cache index>.lock``: on a cold cache a kernel that several processes need at once
    compiles in one, then loads from numba's cache in the others, instead of compiling in each (a cold
    CPU-kernel run of MobileNet v2 compiles for 30 s on 2 cores). Where the lock file cannot be made, or another
    process holds it past ``COMPILE_WAIT_S``, it compiles unlocked (logged)."""

    def compile_once(*args, **kws):
        if getattr(_COMPILING, "held", False):
            return compile_for_args(*args, **kws)
        try:
            fd = os.open(dispatcher._cache._cache_file._index_path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except (OSError, AttributeError):  # (an unwritable cache, or a numba that names its files otherwise)
            return compile_for_args(*args, **kws)
        try:
            deadline = time.monotonic() + COMPILE_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        log.warning("tflgpu: another process has compiled %s for over %.0f s; compiling here too",
                                    dispatcher.py_func.__name__, COMPILE_WAIT_S)
                        break
                    time.sleep(0.02)
            _COMPILING.held = True
            return compile_for_args(*args, **kws)
        finally:
            _COMPILING.held = False
            os.close(fd)  # (and with it the lock)

    return compile_once


def _patch(namespace: dict) -> None:
    import numba

    for attr, value in list(namespace.items()):
        if isinstance(value, LazyJit) and value.dispatcher is not None:
            namespace[attr] = value.dispatcher
        elif isinstance(value, _LazyPrange):
            namespace[attr] = numba.prange


def readonly(a: np.ndarray) -> np.ndarray:
    """``a`` as a kernel's input-only array argument: read-only (a view of it where it is writable). numba
    compiles a kernel once per argument type, and whether an array is read-only is part of its type: weights
    straight from a model file are read-only, folded, converted or computed ones are not. Passing every array a
    kernel only reads as read-only compiles such a kernel once instead of two or three times (a parallel conv
    kernel: 4-10 s each on 2 cores)."""
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def materialize() -> None:
    """Import numba, make every recorded function's dispatcher, and put the dispatchers (and numba's prange)
    in place in the kernels' modules and every other tflgpu module."""
    global _READY
    with _LOCK:
        if _READY:
            return
        _load_tbb()
        for w in _RECORDED:
            if w.dispatcher is None:
                _compile(w)
        spaces = {id(w.py_func.__globals__): w.py_func.__globals__ for w in _RECORDED}
        spaces.update({id(vars(m)): vars(m) for n, m in list(sys.modules.items())
                       if n.startswith("tflgpu.") and m is not None})
        for namespace in spaces.values():
            _patch(namespace)
        _READY = True
    if _THREADS:
        set_num_threads(_THREADS[-1])


TBB_LIBRARY = {"linux": "libtbb.so.12"}  # platform -> the file of the ``tbb`` wheel that numba's TBB layer links to


def _load_tbb() -> None:
    """Load TBB's library from the ``tbb`` wheel, where one is installed, before numba picks its threading layer.

    numba takes the first layer that loads (TBB, then OpenMP, then its workqueue; a process may choose
    otherwise through NUMBA_THREADING_LAYER, and still does). Its TBB layer finds the library on the loader's
    path only, and the wheel (installed with the x86-64 OpenCL CPU runtime) puts it under the environment's
    ``lib/``: numba ran on GNU OpenMP, whose pool does not survive fork(). A child forked after a CPU kernel
    ran (multiprocessing's default start on Linux, a server's pre-forked workers) was killed at its first
    kernel. Loaded here, the library is found by its soname; TBB's pool survives fork and is safe from several
    threads, and on 2 cores the CPU path ran as fast (PoseNet, UNet, LSTM, MobileNets: within 3%, interleaved)."""
    name = TBB_LIBRARY.get(sys.platform)
    if name is None:
        return
    try:
        files = importlib.metadata.files("tbb") or []
    except importlib.metadata.PackageNotFoundError:
        return
    for f in files:
        if f.name == name:
            try:
                ctypes.CDLL(str(f.locate()))
            except OSError as e:
                log.info("tflgpu: the tbb package's %s does not load (%s); numba picks another threading layer",
                         name, e)
            return


_FORKED_FROM: list[int] = []  # the parent's pid, in a child forked after numba's GNU OpenMP pool started


def _note_fork() -> None:
    """In a forked child: whether the parent had started numba's GNU OpenMP pool, which kills the child at its
    next parallel kernel (SIGTERM: "fork() called from a process already using GNU OpenMP")."""
    numba = sys.modules.get("numba")
    if numba is None:
        return
    try:
        layer = numba.threading_layer()
    except ValueError:  # (no parallel kernel ran: the pool starts in whichever process runs one first)
        return
    vendor = getattr(sys.modules.get("numba.np.ufunc.omppool"), "openmp_vendor", "GNU")
    if layer == "omp" and vendor == "GNU":
        _FORKED_FROM[:] = [os.getppid()]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_note_fork)


def check_fork() -> None:
    """Raise a RuntimeError in a child forked after its parent's numba kernels ran on GNU OpenMP threads,
    before a kernel here would end the process."""
    if _FORKED_FROM:
        raise RuntimeError(
            f"tflgpu's CPU kernels ran on numba's GNU OpenMP threads in the parent process (pid {_FORKED_FROM[0]}), "
            "and GNU OpenMP does not survive fork(): a kernel in this forked child would end it. Start child "
            "processes with multiprocessing's 'spawn' or 'forkserver' method, or run no model in the parent "
            "before it forks, or install tbb (pip install tbb) for numba's fork-safe TBB threading layer")


def get_num_threads() -> int:
    """The thread count the kernels run on: numba's setting once it is imported, else the one set for it (or
    every core)."""
    if _READY:
        import numba

        return numba.get_num_threads()
    return _THREADS[-1] if _THREADS else (os.cpu_count() or 1)


def set_num_threads(n: int) -> None:
    """numba's thread count for the kernels (clamped to its pool): now if numba is imported, else when it is."""
    if not _READY:
        _THREADS[:] = [n]
        return
    import numba

    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
