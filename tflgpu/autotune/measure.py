"""Timing one step's kernels on the device with OpenCL profiling events and the host's clock, on real buffers.

A sample has two times: the device's, from the first kernel's start to the last one's end; and the host's,
enqueueing the step's launches. A plan's invoke overlaps the two (the device runs a kernel while the host enqueues
the next), so it takes about the longer of their sums, and which sum is the longer is the plan's, not the step's.
On the H100 behind NVIDIA's OpenCL an enqueue takes 10-16 us of host time, longer than most of MobileNet's kernels
run, and about 5 us more for a kernel launched without a work-group size (bench/invoke_anatomy.py): a candidate with
fewer launches, or with an explicit work-group, can win there on host time, which kernel times never show. Yet the
plans were device-bound there as often (MobileNet v2's, tuned: 0.45 ms an invoke of 31 launches at 11-12 us of
enqueue each), and a sample costed as the longer of its two times made every candidate that runs shorter than its
enqueue a tie.
So a sample costs its device span plus a share of the host's time beyond it (``step_cost``). On the CPU OpenCL
device an enqueue takes ~6 us against kernels of tens of us and more: the device's time decides there.

Every candidate of a step reads the same random inputs (slice layout, pad lanes 0) and writes
fresh output buffers of the right sizes; its outputs are compared with the heuristic default's,
so a candidate that computes something else is rejected rather than timed.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..kernels.common import KernelSpec, to_slices
from ..kernels.program import ProgramMemo, bind_kernel, build_program, compiled_sources, program_key
from ..ops.layout import Layout


def device_span_us(events) -> float:
    """From the first kernel's start to the last one's end: a form of more launches pays the gaps between them
    (on NVIDIA's OpenCL a kernel started 7.5 us after the one before it ended), which a sum of kernel times would
    leave out of the comparison with a fused form."""
    return (events[-1].profile.end - events[0].profile.start) / 1e3


# the share of a step's enqueue time beyond its device span that a sample costs (``step_cost``)
HOST_EXCESS_SHARE = 0.5


def step_cost(host_us: float, device_us: float, share: float = HOST_EXCESS_SHARE) -> float:
    """One sample's cost, in us: the device's span, plus ``share`` of the time the host's enqueues take beyond it.
    In a device-bound plan a step's enqueues hide behind the other steps' kernels (its device time is its cost: share
    0); in a host-bound one its kernels hide behind the other steps' enqueues (share 1 is the longer of the two, an
    upper bound there). Which a plan is, a step's search does not know; half is the mean of the two cases. With
    share 1 on the H100, most single-kernel candidates of MobileNet's steps cost their enqueue (11-13 us, its
    samples' floor) whatever they ran on the device, and the background search fused MobileNet v1's blocks at 32 us
    against their two kernels' 17 + 13 us: in the plan the fused kernels then ran 41-87 us each, and the model
    0.599 ms against 0.330 unfused. Untimed on a GPU since (the next H100 session: bench_gpu.py --host-share 1 beside
    the default)."""
    return device_us + share * max(0.0, host_us - device_us)


class Interrupted(Exception):  # noqa: N818 -- not an error: the caller asked the measurement to stop
    """Raised by a bench's gate: whoever runs the search wants it to end now (nothing is recorded)."""


class CandidateRejected(Exception):
    """The candidate fails to compile, does not fit the device, or computes wrong results."""


class CandidateSlower(CandidateRejected):
    """The candidate ran correctly, but its first samples were already slower than the best so far by the bench's
    discard ratio: timed, and cut short (a search's common case, not a fault)."""


@dataclass
class Timing:
    us: float  # median cost over the kept samples (``step_cost`` of each sample's host and device time)
    samples: list[float]
    outputs: dict[int, np.ndarray] | None = None
    host_us: float = 0.0  # median over the kept samples: the host's enqueues
    device_us: float = 0.0  # ...: the device's span

    @property
    def host_bound(self) -> bool:
        """The host's enqueues take longer than the device runs the kernels: only launching them differently (fewer
        of them, another work-group) can make the step faster."""
        return self.host_us >= self.device_us


class KernelBench:
    """Builds and times candidate kernel lists for one step.

    ``layouts`` maps every tensor index the specs touch to its layout (storage size).
    """

    def __init__(self, cl, ctx, device, fp16: bool, layouts: dict[int, Layout], seed: int = 0,
                 warmup: int = 1, k: int = 5, max_samples: int = 15, max_seconds: float = 1.0,
                 stable_rel: float = 0.05, discard_ratio: float = 1.5, host_share: float | None = None,
                 programs: ProgramMemo | None = None):
        self.cl, self.ctx, self.device, self.fp16 = cl, ctx, device, fp16
        self.host_share = HOST_EXCESS_SHARE if host_share is None else host_share  # (step_cost)
        self.queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.layouts = layouts
        self.rng = np.random.default_rng(seed)
        self.warmup, self.k, self.max_samples = warmup, k, max_samples
        self.max_seconds, self.stable_rel, self.discard_ratio = max_seconds, stable_rel, discard_ratio
        self._inputs: dict[int, np.ndarray] = {}
        self.compiles = 0  # (programs built: one timed again, as ``compare`` does, is found in ``programs``)
        self.programs = programs if programs is not None else ProgramMemo()
        self.last = (0.0, 0.0)  # the last sample's (host, device) time, us
        # gate(kind), kind "compile" | "launch": called before each, so a background search can wait for idle
        self.gate = None

    def _input(self, t: int, half: bool, dense: bool = False) -> np.ndarray:
        """Tensor t's values in the slice layout (as half or float), or ``dense``: as the dense NHWC float32 of a
        boundary buffer (KernelSpec.dense). The same values in every form."""
        if (t, half, dense) not in self._inputs:
            lay = self.layouts[t]
            if t not in self._inputs:
                self._inputs[t] = self.rng.uniform(-1, 1, lay.dims).astype(np.float32)
            x = self._inputs[t]
            self._inputs[t, half, dense] = x.reshape(-1) if dense else \
                to_slices(x, lay, np.float32).astype(np.float16 if half else np.float32)
        return self._inputs[t, half, dense]

    def _buffers(self, specs: list[KernelSpec]) -> tuple[dict, list[int]]:
        cl, mf = self.cl, self.cl.mem_flags
        produced: set[int] = set()
        bufs, outs = {}, []
        self._out_fp16: dict[int, bool] = {}
        self._out_elements: dict[int, int] = {}
        for i, spec in enumerate(specs):
            for t in spec.inputs:
                if t not in bufs and t not in produced:
                    bufs[t] = cl.Buffer(self.ctx, mf.READ_WRITE | mf.COPY_HOST_PTR,
                                        hostbuf=self._input(t, spec.tensor_fp16(t), t in spec.dense))
            for t in spec.outputs:
                produced.add(t)
                if t not in bufs:
                    dtype = np.float16 if spec.tensor_fp16(t) else np.float32
                    self._out_elements[t] = int(np.prod(self.layouts[t].dims)) if t in spec.dense \
                        else self.layouts[t].elements
                    size = max(self._out_elements[t] * dtype().itemsize, 16)
                    bufs[t] = cl.Buffer(self.ctx, mf.READ_WRITE, size)
                    cl.enqueue_fill_buffer(self.queue, bufs[t], dtype(0), 0, size)
                    # (what a later kernel of the list reads is an intermediate value, not the step's output: a
                    # candidate computing it in registers instead, e.g. a fused separable conv, is as good)
                    if not any(t in later.inputs for later in specs[i + 1:]):
                        outs.append(t)
                    self._out_fp16[t] = spec.tensor_fp16(t)
        return bufs, outs

    def prepare(self, specs: list[KernelSpec]) -> list[tuple[KernelSpec, object]]:
        """Compile and bind; raises CandidateRejected when the compiler refuses it (launch sizes are
        checked by the tuner before it gets here)."""
        cl = self.cl
        if self.gate is not None:
            self.gate("compile")
        sources = compiled_sources(specs)
        program = self.programs.get(program_key(sources, self.fp16))
        if program is None:
            self.compiles += 1
            try:
                program = build_program(cl, self.ctx, sources, self.fp16, memo=self.programs)
            except cl.Error as e:
                raise CandidateRejected(f"build failed: {str(e).splitlines()[0][:160]}") from e
        bufs, outs = self._buffers(specs)
        launches = []
        for spec in specs:
            k, consts = bind_kernel(cl, self.ctx, program, spec, bufs)
            launches.append((spec, k, consts, bufs))  # the launch keeps its buffers alive
        self._bufs, self._outs = bufs, outs
        return launches

    def _launch(self, launches) -> float:
        """One sample of the candidate's cost, in us: ``step_cost`` of the host's time enqueueing the launches and the
        device's span (``device_span_us``), both kept in ``last``."""
        self.last = self._sample(launches)
        return step_cost(*self.last, self.host_share)

    def _sample(self, launches) -> tuple[float, float]:
        """Run the launches once: the host's time enqueueing them and the device's span, in us."""
        cl, q = self.cl, self.queue
        if self.gate is not None:
            self.gate("launch")
        try:
            t0 = time.perf_counter_ns()
            evs = [cl.enqueue_nd_range_kernel(q, k, spec.global_size, spec.local_size) for spec, k, *_ in launches]
            host = (time.perf_counter_ns() - t0) / 1e3
            q.finish()
        except cl.Error as e:
            raise CandidateRejected(f"launch failed: {str(e).splitlines()[0][:160]}") from e
        return host, device_span_us(evs)

    def time(self, specs: list[KernelSpec], best_us: float | None = None,
             ref: dict[int, np.ndarray] | None = None) -> Timing:
        """Warm-up, check the outputs against ``ref`` (the default's), then repeat until the median
        of the last k is stable (or the cap); raises CandidateRejected on wrong results, and early
        when clearly slower than ``best_us`` (then it cannot win)."""
        launches = self.prepare(specs)
        for _ in range(max(1, self.warmup)):
            self._launch(launches)
        outputs = self.read_outputs()
        if ref is not None:
            check_outputs(outputs, ref, any(s.fp16 for s in specs),
                          half_math=any(s.params.get("half_math") for s in specs))
        samples: list[float] = []
        parts: list[tuple[float, float]] = []  # (host, device) of each sample
        t0 = time.perf_counter()
        while len(samples) < self.max_samples:
            samples.append(self._launch(launches))
            parts.append(self.last)
            if best_us is not None and len(samples) >= 2 and min(samples) > self.discard_ratio * best_us:
                raise CandidateSlower(f"discarded early: {min(samples):.0f} us vs best {best_us:.0f} us")
            if len(samples) >= self.k:
                last = samples[-self.k:]
                med = statistics.median(last)
                if (max(last) - min(last)) <= self.stable_rel * 2 * med:
                    break
            if len(samples) >= 3 and time.perf_counter() - t0 > self.max_seconds:
                break
        kept = parts[-self.k:]
        return Timing(statistics.median(samples[-self.k:]), samples, outputs,
                      statistics.median(h for h, _ in kept), statistics.median(d for _, d in kept))

    def compare(self, a: list[KernelSpec], b: list[KernelSpec], rounds: int = 9) -> tuple[float, float]:
        """Medians of a and b timed in alternation (so drifting machine speed hits both alike)."""
        la, lb = self.prepare(a), self.prepare(b)
        self._launch(la)
        self._launch(lb)
        ta, tb = [], []
        for _ in range(rounds):
            ta.append(self._launch(la))
            tb.append(self._launch(lb))
        return statistics.median(ta), statistics.median(tb)

    def read_outputs(self) -> dict[int, np.ndarray]:
        out = {}
        for t in self._outs:
            host = np.empty(self._out_elements[t], np.float16 if self._out_fp16[t] else np.float32)
            self.cl.enqueue_copy(self.queue, host, self._bufs[t], is_blocking=True)
            out[t] = host.astype(np.float32)
        return out


# how far a candidate's outputs may be from the default's, relative to the output's largest value: an FP32 kernel's
# sums in another order; an FP16 plan's (half storage, each kernel rounding its own float sums); and a candidate
# doing its arithmetic in half (``half_math``), whose sums round at every term: the FP16 precision budget's share
# of one kernel, so that half arithmetic goes only where its sums are short enough (on the Intel CPU device, a 3x3
# conv's half sums moved its outputs by 0.25% at 16 input channels, 0.4% at 64, 0.8-0.9% at 256 and 1,024)
CHECK_BOUND = {"fp32": 1e-3, "fp16": 2e-2, "half_math": 4e-3}


def check_outputs(got: dict[int, np.ndarray], ref: dict[int, np.ndarray], fp16: bool,
                  half_math: bool = False) -> None:
    """Raise CandidateRejected unless every output matches the reference within the precision's bound
    (``CHECK_BOUND``; ``half_math``: the candidate does its arithmetic in half)."""
    tol = CHECK_BOUND["half_math" if half_math else "fp16" if fp16 else "fp32"]
    for t, r in ref.items():
        g = got.get(t)
        if g is None or g.shape != r.shape:
            raise CandidateRejected(f"output {t} missing or of another size")
        finite = np.isfinite(r)
        if not np.array_equal(finite, np.isfinite(g)):
            raise CandidateRejected(f"output {t}: non-finite values differ from the default's")
        scale = max(1.0, float(np.max(np.abs(r[finite]), initial=0.0)))
        err = float(np.max(np.abs(g[finite] - r[finite]), initial=0.0))
        if err > tol * scale:
            raise CandidateRejected(f"output {t} differs from the default's by {err:.3g} (bound {tol * scale:.3g})")
