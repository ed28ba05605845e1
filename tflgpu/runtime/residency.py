"""The OpenCL runtime's share of this process's resident memory.

A vendor's OpenCL library is large, and what it touches once is counted in the process's RSS for as long as
the process lives: the Intel CPU runtime maps a 200 MB LLVM (``libcommon_clang``) at the first platform query,
and its static initializers, with the runtime's own, leave about 85 MiB of read-only pages resident, of which
an invoke reads back a few. Once a plan is built and its background work is done, those pages are released:
``madvise(MADV_DONTNEED)`` on the runtime libraries' read-only file mappings that hold no private copy of a
page (a page the dynamic linker relocated is one; such mappings are left alone). The kernel simply unmaps the
pages; the file's pages stay in the page cache, and the few that the runtime touches again come back from it
on first touch, unchanged, since a read-only private mapping of a file shows exactly the file. (A writable
mapping is never advised, even one whose pages are all the file's: a thread writing to it meanwhile would
lose the write.) The C heap's free memory goes back too (``malloc_trim``).

The runtime's libraries are those that appear in the process's mappings during the first platform query
(``list_devices``), and those mapped later from the same directories (a math library loaded at the first
build). Linux only (``/proc/self/smaps``); elsewhere, or when the advice is refused, nothing happens.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

log = logging.getLogger("tflgpu")

SMAPS = "/proc/self/smaps"
MAPS = "/proc/self/maps"  # (the same mappings without their page counts: cheap enough to read around a call)
MADV_DONTNEED = 4  # (Linux; Python's mmap module offers it for its own maps only)

_runtime_dirs: set[str] = set()
_runtime_files: set[str] = set()
_kept = [0]  # how many pages_kept() blocks are open
_kept_lock = threading.Lock()


@contextmanager
def pages_kept():
    """Within it (any thread), ``release_startup_memory`` does nothing: for a measuring job (``tflgpu tune``'s
    end-to-end check), where the refaults after a release would widen the spread of the few timings it compares
    (the three-machine tune test's verdict flipped on noise in 2 runs of 3 with a release, 0 of 4 without)."""
    with _kept_lock:
        _kept[0] += 1
    try:
        yield
    finally:
        with _kept_lock:
            _kept[0] -= 1


@dataclass(frozen=True)
class Mapping:
    """One line of /proc/self/smaps with the two fields that decide whether its pages may be dropped."""

    start: int
    end: int
    perms: str  # e.g. "r-xp"
    path: str  # "" for an anonymous mapping
    anonymous_kib: int  # private copies of pages (written, or relocated)
    locked_kib: int
    resident_kib: int

    @property
    def droppable(self) -> bool:
        """Read-only, private, file-backed, no page of its own and none locked: its pages are the file's."""
        return (self.path.startswith("/") and "w" not in self.perms and self.perms.endswith("p")
                and self.anonymous_kib == 0 and self.locked_kib == 0)


def read_mappings(smaps: str = SMAPS) -> list[Mapping]:
    """This process's mappings (empty where /proc is missing)."""
    found: list[Mapping] = []
    head: list[str] | None = None
    fields: dict[str, int] = {}

    def close() -> None:
        if head is not None:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            path = head[5] if len(head) > 5 else ""
            found.append(Mapping(lo, hi, head[1], path, fields.get("Anonymous:", 0), fields.get("Locked:", 0),
                                 fields.get("Rss:", 0)))

    try:
        with open(smaps) as f:
            for line in f:
                parts = line.split()
                if not parts:
                    continue
                if parts[0].endswith(":"):
                    if len(parts) > 1 and parts[1].isdigit():
                        fields[parts[0]] = int(parts[1])
                    continue
                close()
                head, fields = parts, {}
        close()
    except OSError:
        return []
    return found


def mapped_files(maps: str = MAPS) -> frozenset[str]:
    """The files this process maps (empty where /proc is missing)."""
    try:
        with open(maps) as f:
            return frozenset(p[5] for p in (line.split() for line in f) if len(p) > 5 and p[5].startswith("/"))
    except OSError:
        return frozenset()


def note_runtime_libraries(before: frozenset[str], after: frozenset[str]) -> None:
    """Files that the first platform query mapped (``after - before``) are the OpenCL runtime's."""
    new = {p for p in after - before if ".so" in os.path.basename(p)}
    _runtime_files.update(new)
    _runtime_dirs.update(os.path.dirname(p) for p in new)


def runtime_mappings(mappings: list[Mapping]) -> list[Mapping]:
    return [m for m in mappings if m.path in _runtime_files
            or (os.path.dirname(m.path) in _runtime_dirs and ".so" in os.path.basename(m.path))]


def runtime_resident_kib() -> int:
    """Resident KiB of the OpenCL runtime libraries' droppable mappings (what a release would give back)."""
    return sum(m.resident_kib for m in runtime_mappings(read_mappings()) if m.droppable)


def release_startup_memory() -> int:
    """Give back what building a plan left resident and the run does not use: the OpenCL runtime libraries'
    droppable pages (madvise), and the C heap's free memory at its top and in its free lists (glibc's
    ``malloc_trim``: a compile's temporaries, freed, stay in the heap otherwise). Returns the bytes of runtime
    mappings advised (0 where nothing is known or the platform has neither call)."""
    libc = _libc()
    if libc is None or _kept[0]:
        return 0
    advised = 0
    madvise = getattr(libc, "madvise", None)
    if madvise is not None and _runtime_files:
        for m in runtime_mappings(read_mappings()):
            if m.droppable and madvise(m.start, m.end - m.start, MADV_DONTNEED) == 0:
                advised += m.end - m.start
    trim = getattr(libc, "malloc_trim", None)  # (glibc only)
    if trim is not None:
        trim(0)
    log.debug("released the OpenCL runtime's read-only pages (%.0f MiB of mappings) and the heap's free memory",
              advised / 2**20)
    return advised


@lru_cache(maxsize=1)
def _libc():
    """The C library with ``madvise`` / ``malloc_trim`` typed where it has them, or None."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    for name, args, res in (("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int),
                            ("malloc_trim", [ctypes.c_size_t], ctypes.c_int)):
        fn = getattr(libc, name, None)
        if fn is not None:
            fn.argtypes, fn.restype = args, res
    return libc
