"""When an invoke hands its queued launches to the device: ``clFlush`` after some launches, or only the final wait.

An OpenCL runtime may hold enqueued commands back until a flush or a blocking call, so that the device starts an
invoke's first kernel only when the host has enqueued its last one: the host's enqueue time and the device's
kernel time then add up instead of overlapping (on NVIDIA's OpenCL an enqueue costs the host about 8 us, as long
as a MobileNet's kernel runs). Where the runtime submits each command at once, a flush only costs its call; NVIDIA's
driver does (on an H100 a flush after the first launch came within 1% of none on four corpus models, and more
flushes were no faster or slower). Which holds is the driver's business, so a GPU plan measures it on its own
invokes (``CadenceTrial``): after a few warm-up invokes, the next ones take each cadence in turn, and the plan
keeps the fastest, where it beats never flushing by a margin. A CPU device's plan never flushes: the Intel CPU
runtime submits at once, and there one flush after MobileNet v2's first launch made its invokes 1.4x slower (6.15
vs 4.46 ms; every 8 launches 4.39, every 2 4.66), a loss a noisy trial on a busy CPU could pick.

A GPU plan's trial also tries its launches with no event each (``Cadence.direct``: runtime.enqueue.Launcher),
without a flush and with one after the first launch. pyopencl asks the runtime for an event with every launch;
whether a driver's bookkeeping of those costs the device time (NVIDIA's OpenCL costs an H100 ~5.6 us per launch
even for an empty kernel) is the driver's business too, and on the host the direct call saves NVIDIA's runtime
about 0.7 us an enqueue (bench/launch_cost.py) but costs the Intel CPU runtime ~1 us more (a Python-side cache
of each kernel's ctypes arguments against pyopencl's C++ call), so a CPU device's plan never takes it.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field

log = logging.getLogger("tflgpu")


@dataclass(frozen=True)
class Cadence:
    """Flush after the invoke's first launch (``first``: the device starts while the host enqueues the rest) and
    after every ``every``-th launch (0: no more); ``direct``: launch with no event each (runtime.enqueue)."""

    first: bool = False
    every: int = 0
    direct: bool = False

    def flushes(self, launches: int) -> frozenset[int]:
        """The launch counts (1-based) after which an invoke of ``launches`` launches flushes; never after its last
        (the final wait submits it)."""
        at = {1} if self.first else set()
        if self.every > 0:
            at.update(range(self.every, launches, self.every))
        return frozenset(n for n in at if n < launches)

    def __str__(self) -> str:
        if not self.first and not self.every:
            flush = "no flush"
        else:
            parts = (["after the first launch"] if self.first else []) + ([f"every {self.every}"] if self.every else [])
            flush = "flush " + " and ".join(parts)
        return flush + (", no event per launch" if self.direct else "")


NEVER = Cadence()
# what a trial tries, the baseline first: one flush to start the device early, a few more to keep it fed, one per
# pair of launches
CANDIDATES = (NEVER, Cadence(first=True), Cadence(first=True, every=8), Cadence(first=True, every=2))
# and where the plan can launch with no event each (runtime.enqueue.Launcher): so, with and without the first flush
DIRECT = (Cadence(direct=True), Cadence(first=True, direct=True))
MIN_LAUNCHES = 4  # a plan of fewer launches has nothing to overlap: it never flushes
WARMUP = 4  # invokes not timed first (a plan's first invokes are slower whatever the cadence: 0.50 vs 0.28 ms)
ROUNDS = 8  # invokes per candidate
MARGIN = 0.05  # a cadence replaces no flushing where its median invoke is at least this much faster


@dataclass
class CadenceTrial:
    """Chooses an invoke's cadence: after ``warmup`` invokes at the baseline (the first candidate), each
    candidate in turn over ``rounds`` x candidates invokes (interleaved, each round starting one candidate later,
    so drift and order hit all alike), then the one of least median time, kept if it beats the baseline's by
    ``margin``. A plan starts a new trial after its kernels change (a tier-up, a tuning swap: their launches may
    differ). A plan of fewer than MIN_LAUNCHES launches, or one candidate, decides at once: the baseline."""

    launches: int
    candidates: tuple[Cadence, ...] = CANDIDATES
    rounds: int = ROUNDS
    margin: float = MARGIN
    warmup: int = WARMUP
    chosen: Cadence | None = None
    times: dict[Cadence, list[float]] = field(default_factory=dict)
    _turn: int = 0  # invokes recorded, warm-up ones included
    _flushes: dict[Cadence, frozenset[int]] = field(default_factory=dict)

    def __post_init__(self):
        if self.launches < MIN_LAUNCHES or len(self.candidates) < 2:
            self.chosen = self.candidates[0]

    def next(self) -> Cadence:
        """The cadence of the next invoke."""
        if self.chosen is not None:
            return self.chosen
        if self._turn < self.warmup:
            return self.candidates[0]
        n = len(self.candidates)
        k = self._turn - self.warmup
        return self.candidates[(k % n + k // n) % n]

    def flushes(self, cadence: Cadence) -> frozenset[int]:
        if cadence not in self._flushes:
            self._flushes[cadence] = cadence.flushes(self.launches)
        return self._flushes[cadence]

    def record(self, cadence: Cadence, seconds: float) -> None:
        """An invoke run at ``cadence`` took ``seconds`` (ignored once chosen, or if not the candidate asked for)."""
        if self.chosen is not None or cadence != self.next():
            return
        if self._turn >= self.warmup:
            self.times.setdefault(cadence, []).append(seconds)
        self._turn += 1
        if self._turn >= self.warmup + self.rounds * len(self.candidates):
            self._decide()

    def medians(self) -> dict[Cadence, float]:
        return {c: statistics.median(t) for c, t in self.times.items() if t}

    def _decide(self) -> None:
        med = self.medians()
        base = self.candidates[0]
        best = min(med, key=med.get)
        self.chosen = best if med[best] <= med[base] * (1 - self.margin) else base
        log.info("invoke cadence: %s (median %s over %d invokes each)", self.chosen,
                 ", ".join(f"{c}: {m * 1e6:.0f} us" for c, m in med.items()), self.rounds)
