"""A plan's one OpenCL program: loaded from the cache when stored, else built: quickly (compiler optimizations
off, when the start is tiered; the optimized build follows in the background) or optimized. Kernels the compiler
rejects go back to the CPU, with the reason, and the model still runs."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

from ..kernels.program import (
    QUICK_BUILD_OPTIONS,
    Loading,
    build_program,
    compiled_sources,
    load_binary,
    load_compiled,
    program_key,
)
from .selection import Step
from .startup import StartupClock

log = logging.getLogger("tflgpu")


def step_sources(steps: list[Step]) -> list[str]:
    return compiled_sources([spec for s in steps if s.device == "gpu" for spec in s.specs])


class PlanProgram:
    """Builds (or loads) the program of a plan's device steps. ``stats`` counts source builds and binary loads
    and says which tier the program is ("quick" | "optimized")."""

    def __init__(self, cl, ctx, device, fp16: bool, store, stats: dict, tiered: bool, stored_key: str | None):
        self.cl, self.ctx, self.device, self.fp16, self.store = cl, ctx, device, fp16, store
        self.stats, self.tiered = stats, tiered
        self.prefetched = self._prefetch(stored_key) if stored_key else None

    def _prefetch(self, key: str) -> Loading:
        """A stored binary loading on a worker thread while the kernels are generated."""
        pool = ThreadPoolExecutor(1, thread_name_prefix="tflgpu-binary")
        future = pool.submit(load_binary, self.cl, self.ctx, key, self.fp16, self.store, self.device)
        pool.shutdown(wait=False)
        return Loading(key, future)

    def _stored(self, sources: list[str]) -> bool:
        """Whether the optimized program of ``sources`` is in the cache, or compiled earlier in this process (it is
        then loaded, not built)."""
        key = program_key(sources, self.fp16)
        if self.prefetched is not None and self.prefetched.key == key:
            prg = self.prefetched.program.result()
        else:
            prg = None if self.store is None else load_binary(self.cl, self.ctx, key, self.fp16, self.store,
                                                              self.device, repair=True)
        counted_as = "binary_loads"
        if prg is None:
            prg, counted_as = load_compiled(self.cl, self.ctx, key, self.fp16), "memory_loads"
        done: Future = Future()
        done.set_result(prg)
        self.prefetched = Loading(key, done, counted_as)
        return prg is not None

    def build(self, sources: list[str], store: bool = True):
        if self.stats["tier"] == "quick":  # (not stored: the optimized build replaces it soon)
            return build_program(self.cl, self.ctx, sources, self.fp16, None, self.device, self.stats,
                                 options=QUICK_BUILD_OPTIONS)
        return build_program(self.cl, self.ctx, sources, self.fp16, self.store if store else None, self.device,
                             self.stats, prefetched=self.prefetched)

    def compile(self, steps: list[Step], clock: StartupClock):
        """The program of every device step, or None when there is none. A step whose kernels the compiler
        rejects is moved to the CPU (``step.device``, ``step.reason``)."""
        cl = self.cl
        gpu_steps = [s for s in steps if s.device == "gpu"]
        if not gpu_steps:  # nothing delegated (e.g. an integer model): no program to build
            return None
        sources = step_sources(gpu_steps)
        if self.tiered and not self._stored(sources):
            self.stats["tier"] = "quick"
        quick = self.stats["tier"] == "quick"
        clock.phase("load" if self.prefetched and not quick else "compile",
                    f"{len(sources)} kernels" + (" (quick build, optimizations off)" if quick else ""))
        try:
            return self.build(sources)
        except cl.Error as e:
            log.info("OpenCL build of the whole plan failed, checking kernels one by one: %s", str(e)[:200])
        for s in gpu_steps:
            try:
                self.build(step_sources([s]), store=False)
            except cl.Error as e:
                first = next((ln for ln in str(e).splitlines() if "error" in ln), str(e).splitlines()[0])
                s.device, s.reason = "cpu", f"OpenCL build failed: {first.strip()[:160]}"
        try:
            return self.build(step_sources(steps))
        except cl.Error as e:
            raise RuntimeError(f"OpenCL build failed on {self.device.identity.device}: {e}") from e
