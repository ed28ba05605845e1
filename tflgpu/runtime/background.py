"""What a plan does after it starts, on one worker thread, so that the first invoke never waits for it.

1. **Tier-up.** A plan whose program was not in the cache starts from a quick build (the compiler's
   optimizations off: ``kernels.program.QUICK_BUILD_OPTIONS``); the worker builds the optimized program at
   once, stores its binary, and hands the plan new kernel instances of it.
2. **Background tuning** (``tuning="background"``): the kernels with no tuning record on this device are
   searched, those whose default takes the most of the model's time first, within a device-time budget. The
   search runs only while the interpreter is idle: before every timed launch it waits until no invoke has been
   in flight for 50 ms, and before every compile (which cannot be interrupted) for half a second,
   so an application that keeps invoking pauses the search, and an invoke overlaps at most a launch or a
   compile that had started in a pause. A winner is confirmed against the current kernel in alternated runs, its output
   checked against the current kernel's on the same input (``autotune``), recorded whole (a process that exits
   mid-search leaves a consistent cache, and the next one resumes with the kernels still untuned), and handed
   to the plan. Another interpreter or process tuning the same kernel holds its claim, and this one skips it.
3. **The winners together** (``upgrades.check_plan``): each beat its kernel's start alone, but a plan may still
   be slower with all of them (a fused pair that saves a launch but runs slower beside its neighbours: MobileNet
   v1 on an H100, 0.599 ms after its search against 0.525 at its start). The plan's kernels before and after
   the search are timed end to end, alternated, with invokes held off for each run (``Activity.exclusive``);
   where the search's are slower, the start's go back and are recorded as those kernels' choice.
4. With anything tuned and kept, the whole program is rebuilt with the winners and stored with the plan, so the
   next start loads the tuned plan directly.

Nothing here touches a live kernel: every result is a ``Swap`` that the plan applies at the start of its next
``run``, between invokes, never during one. An error here is logged and ends the work; the plan keeps running
on what it has.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..autotune.measure import Interrupted
from .residency import release_startup_memory

log = logging.getLogger("tflgpu")

# Idle this long before background work starts a timed launch (a few ms at most), or a compile (which cannot
# be stopped once started: on this 2-core machine a compile running beside an invoke slowed it by 20-70%,
# whatever its thread's priority, even from another process). An application invoking every 20 ms pauses the
# search; one that pauses for longer lets it run.
LAUNCH_QUIET_S = 0.05
COMPILE_QUIET_S = 0.5


class Stopped(Interrupted):
    """The plan was closed or dropped: the worker ends after what it was doing."""


def lower_thread_priority() -> None:
    """Give the calling thread the lowest CPU priority (Linux: setpriority on a thread id is per thread), so a
    compile that outlasts an idle gap yields the cores to the invoke that starts. Tuning runs so; the tier-up
    build does not (until it is done every invoke runs unoptimized code, so it should finish first)."""
    if hasattr(os, "setpriority") and hasattr(threading, "get_native_id"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError as e:
            log.info("could not lower the background thread's priority: %s", e)


class Activity:
    """Whether an invoke is in flight; background work waits until the plan has been idle for a while."""

    def __init__(self):
        self._cond = threading.Condition()
        self._busy = False
        self._idle_since = time.monotonic()
        self.stopped = False
        # the plan is the one its interpreter runs (allocate_tensors kept it or made it, or it ran): a plan built
        # before a resize (asked for by gpu_plan, say) and replaced by allocate_tensors never was, and its work
        # never starts
        self.in_use = False
        self._device = threading.Lock()  # held by an invoke, and by background work launching the plan's kernels
        # whether what the plan was built from still holds (the interpreter's: its mapped model file, whose weights
        # background work reads, untruncated): once False, the work stops rather than read them
        self.source_intact: Callable[[], bool] | None = None

    def use(self) -> None:
        """The plan is in use: background work waiting for that (``wait_in_use``) starts."""
        with self._cond:
            self.in_use = True
            self._cond.notify_all()

    def wait_in_use(self) -> None:
        """Return once the plan is in use (``use``, or an invoke); raises Stopped."""
        with self._cond:
            while not (self.in_use or self.stopped):
                self._cond.wait()
            if self.stopped:
                raise Stopped

    @contextmanager
    def invoke(self):
        with self._cond:
            self._busy = True
            self.in_use = True
        try:
            with self._device:
                yield
        finally:
            with self._cond:
                self._busy = False
                self._idle_since = time.monotonic()
                self._cond.notify_all()

    def wait_idle(self, quiet_s: float = LAUNCH_QUIET_S) -> None:
        """Return once no invoke is in flight and none ended in the last ``quiet_s``; raises Stopped."""
        with self._cond:
            while True:
                self.check()
                if not self._busy:
                    left = self._idle_since + quiet_s - time.monotonic()
                    if left <= 0:
                        return
                    self._cond.wait(left)
                else:
                    self._cond.wait(0.1)

    def check(self) -> None:
        """Raise Stopped where background work must end: the plan was stopped, or what it was built from changed
        (``source_intact``: the work would read weights from a truncated file, which ends the process)."""
        if not self.stopped and self.source_intact is not None and not self.source_intact():
            log.warning("tflgpu: the model file changed under the plan; its background work stops")
            self.stopped = True
        if self.stopped:
            raise Stopped

    @contextmanager
    def exclusive(self, quiet_s: float = LAUNCH_QUIET_S):
        """Hold off invokes (after idle time, as ``wait_idle``) while background work launches the plan's own
        kernels on its buffers: an invoke that starts meanwhile waits for the block to end. Raises Stopped."""
        while True:
            self.wait_idle(quiet_s)
            self._device.acquire()
            if self.stopped:  # (stopped between: wait_launches may have returned already)
                self._device.release()
                raise Stopped
            if not self._busy:
                break
            self._device.release()  # (an invoke came between: it goes first)
        try:
            yield
        finally:
            self._device.release()

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()

    def wait_launches(self) -> None:
        """Return once no ``exclusive`` block is in flight (none starts after ``stop``); not from inside one."""
        with self._device:
            pass


@dataclass
class Swap:
    """New kernels for some of a plan's device steps, to be installed between invokes."""

    what: str  # "optimized program" | "tuned <op>"
    program: object | None  # the program they come from (the plan's own, for a tier-up)
    kernels: dict[int, list]  # step index -> kernel instances
    specs: dict[int, list] = field(default_factory=dict)  # step index -> new specs (tuning)
    params: dict[int, dict] = field(default_factory=dict)  # step index -> their generator parameters
    args: dict[int, tuple] = field(default_factory=dict)  # step index -> (argument values, constant buffers)
    scratch: dict[int, object] = field(default_factory=dict)  # tensor -> a buffer the memory plan has none of


class SwapQueue:
    """Swaps the worker made, waiting for the plan's next run (appends and pops are atomic in CPython)."""

    def __init__(self):
        self._items: list[Swap] = []

    def post(self, swap: Swap) -> None:
        self._items.append(swap)

    def pending(self) -> list[Swap]:
        return list(self._items)

    def install(self, plan) -> int:
        """Install every queued swap into ``plan`` (its run calls this first, so never during an invoke); returns
        how many."""
        installed = 0
        while self._items:
            installed += 1
            swap = self._items.pop(0)
            plan.io.install_scratch(swap.scratch)
            for i, kernels in swap.kernels.items():
                s = plan.steps[i]
                if i in swap.specs:
                    s.specs, s.params = swap.specs[i], swap.params[i]
                    plan.io.args[i], plan.io.const_buffers[i] = swap.args[i]
                s.kernels = kernels
                plan.io.rebind(i)  # (a caller's buffer bound since these were made)
            if swap.program is not None:  # a whole program: the tier-up
                plan.program, plan.build_stats["tier"] = swap.program, "optimized"
                if plan.background is not None:
                    plan.background.status.compile_tier = "optimized"
            log.info("installed %s (%d steps)", swap.what, len(swap.kernels))
        return installed


@dataclass
class BackgroundStatus:
    """Where a plan's background work stands (``Interpreter.tuning_status()``)."""

    compile_tier: str  # "quick" (compiler optimizations off) | "optimized"
    kernels_done: int  # kernels the background search is done with (skipped ones included)
    kernels_left: int
    kernels_searched: int  # searched here (the others had a record by then, or another searcher had them)
    kernels_improved: int
    speedup: float  # over the searched kernels: their defaults' time / their chosen kernels' time
    finished: bool
    seconds: float  # since the work started
    last_error: str = ""
    # the plan's kernels timed end to end before and after the search's winners (upgrades.check_plan; 0: not
    # checked), and whether the winners were taken back for being slower together
    plan_start_us: float = 0.0
    plan_tuned_us: float = 0.0
    reverted: bool = False


class Background:
    """One plan's worker thread. ``jobs`` are callables taking this object, run in order; each waits for idle
    time itself where it needs to (``wait_idle``) and reaches the plan through ``plan()`` only for as long as
    it needs it, so a plan nobody else holds is collected and its work stops."""

    def __init__(self, plan, jobs: list[Callable], tuning_total: int, compile_tier: str):
        self._plan = weakref.ref(plan)
        self.activity: Activity = plan.activity
        self.jobs = jobs
        self.started = time.monotonic()
        self.status = BackgroundStatus(compile_tier, 0, tuning_total, 0, 0, 1.0, False, 0.0)
        self._default_us = self._best_us = 0.0
        self._done = threading.Event()
        self._optimized = threading.Event()  # the optimized program is built (or was from the start)
        if compile_tier == "optimized":
            self._optimized.set()
        self.thread = threading.Thread(target=self._run, name="tflgpu-background", daemon=True)
        _register_exit_hook()
        _LIVE.add(self)
        weakref.finalize(plan, self.activity.stop)
        self.thread.start()

    def plan(self):
        """The plan, or Stopped once it is gone (a worker must not keep it alive)."""
        p = self._plan()
        if p is None or self.activity.stopped:
            raise Stopped
        return p

    def optimized(self) -> None:
        """The optimized program is built (queued for the plan): ``wait(tuning=False)`` returns."""
        self._optimized.set()

    def wait_idle(self, kind: str = "compile") -> None:
        """Wait for idle time enough to start a "compile" or a "launch" (raises Stopped)."""
        self.activity.wait_idle(COMPILE_QUIET_S if kind == "compile" else LAUNCH_QUIET_S)

    def more(self, kernels: int) -> None:
        """The search found ``kernels`` more to take up (the parts of a composite it left unfused)."""
        self.status.kernels_left += kernels

    def tuned(self, default_us: float, best_us: float, improved: bool, searched: bool = True) -> None:
        s = self.status
        s.kernels_done += 1
        s.kernels_left = max(0, s.kernels_left - 1)
        s.kernels_improved += int(improved)
        if searched:
            s.kernels_searched += 1
            self._default_us += default_us
            self._best_us += best_us
        s.speedup = self._default_us / self._best_us if self._best_us > 0 else 1.0

    def _run(self) -> None:
        try:
            # (a plan replaced before it is used, asked for by gpu_plan before a resize, say: the resized plan
            # would otherwise wait for this one's optimized build, seconds, on the process's one build at a time)
            self.activity.wait_in_use()
            for job in self.jobs:
                job(self)
        except Stopped:
            pass
        except Exception as e:  # noqa: BLE001 -- background work must never take the plan down
            self.status.last_error = f"{type(e).__name__}: {e}"
            log.warning("tflgpu background work stopped: %s", self.status.last_error)
            log.debug("where the background work stopped", exc_info=True)
        finally:
            self.status.finished = True
            self.status.seconds = time.monotonic() - self.started
            _LIVE.discard(self)
            release_when_idle()
            self._optimized.set()
            self._done.set()

    def current(self) -> BackgroundStatus:
        if not self.status.finished:
            self.status.seconds = time.monotonic() - self.started
        return BackgroundStatus(**vars(self.status))

    def wait(self, timeout: float | None = None, tuning: bool = True) -> bool:
        """Block until the work is finished (True) or ``timeout`` seconds passed (False); ``tuning=False``:
        only until the optimized program is built. A wait for the work puts the plan in use: it starts."""
        self.activity.use()
        return (self._done if tuning else self._optimized).wait(timeout)

    def stop(self) -> None:
        self.activity.stop()


_LIVE: set[Background] = set()
EXIT_WAIT_S = 600.0
_HOOKED: list[bool] = []


def release_when_idle() -> None:
    """Give back start-up memory (``residency.release_startup_memory``) unless a worker may still compile: a
    plan with no background work calls it once built, a worker when it is done."""
    if not _LIVE:
        release_startup_memory()


def _register_exit_hook() -> None:
    """Registered when the first worker starts, not at import: exit handlers run last-registered first, and
    this one must run before pyopencl's own (registered when pyopencl is imported, after this module may
    have been), which clears the caches holding contexts a worker may still be compiling in."""
    if not _HOOKED:
        _HOOKED.append(True)
        atexit.register(_finish_at_exit)


def _finish_at_exit() -> None:
    """Let each worker finish the compile or launch it is in (so nothing is torn down under it, and what it
    built is stored), then stop. The wait is for one driver call, however long it takes: a worker still inside
    the OpenCL compiler when the interpreter is torn down takes the process down with it ("FATAL: exception
    not rethrown" from Intel's runtime); the bound is for a driver that never returns."""
    for b in list(_LIVE):
        b.stop()
    for b in list(_LIVE):
        b.thread.join(timeout=EXIT_WAIT_S)
