"""Timing models through tflgpu and, side by side in the same process, through LiteRT.

Used by ``tflgpu bench`` and by ``bench/``. LiteRT is optional here: it is
a test/bench dependency, imported only when a comparison is asked for.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def reference_inputs(details: list[dict[str, Any]], seed: int = 0) -> list[np.ndarray]:
    """The corpus' test inputs: uniform(-1, 1) from default_rng(seed), per input, in order."""
    rng = np.random.default_rng(seed)
    out = []
    for d in details:
        shape, dtype = tuple(int(s) for s in d["shape"]), np.dtype(d["dtype"])
        if dtype.kind == "f":
            out.append(rng.uniform(-1, 1, shape).astype(dtype))
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            out.append(rng.integers(max(info.min, -128), min(info.max, 127) + 1, shape).astype(dtype))
        else:
            out.append(rng.integers(0, 2, shape).astype(dtype))
    return out


MAX_SETTLING_INVOKES = 400  # warm-up invokes at most while a plan tries its invoke cadences


def settling(it) -> bool:
    """Whether ``it``'s plan is still trying invoke cadences (runtime.cadence): invokes timed meanwhile mix them."""
    plan = getattr(it, "gpu_plan", None)
    return plan is not None and plan.cadence.chosen is None


def warm_up(it, invokes: int) -> None:
    """``invokes`` untimed invokes, and more until the plan has chosen its cadence."""
    for _ in range(invokes):
        it.invoke()
    for _ in range(MAX_SETTLING_INVOKES):
        if not settling(it):
            break
        it.invoke()


def time_invokes(it, warmup: int = 3, repeats: int = 20, min_time_s: float = 0.0) -> list[float]:
    """Wall-clock seconds of each of ``repeats`` invokes of interpreter ``it`` after ``warm_up``."""
    invoke = it.invoke
    warm_up(it, warmup)
    times = []
    start = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start < min_time_s:
        t = time.perf_counter()
        invoke()
        times.append(time.perf_counter() - t)
    return times


def interleaved_ms(interps: list, rounds: int = 30, warmup: int = 3, block: int = 4,
                   min_seconds: float = 0.0) -> list[float]:
    """Median invoke latency of each interpreter, timed in alternation (see ``interleaved_samples``)."""
    return [statistics.median(ts) * 1e3 for ts in interleaved_samples(interps, rounds, warmup, block, min_seconds)]


MAX_SAMPLES = 2000  # per interpreter: where ``min_seconds`` asks for more rounds of a tiny model


def interleaved_samples(interps: list, rounds: int = 30, warmup: int = 3, block: int = 4,
                        min_seconds: float = 0.0) -> list[list[float]]:
    """Seconds of each timed invoke of each interpreter, timed in alternation so the machine's drift hits all
    alike: rounds in which every interpreter runs ``block`` times in a row, keeping all but the first of
    those (the first may share the CPU with the previous runtime's still-spinning worker threads: XNNPACK,
    numba and OpenCL CPU runtimes all spin a while after work), until each has ``rounds`` samples and, with
    ``min_seconds``, the rounds took that long (at most ``MAX_SAMPLES`` each): twenty samples of a 0.2 ms
    model span a few milliseconds, where one burst of another process moves the median by half."""
    for it in interps:
        warm_up(it, warmup)
    times = [[] for _ in interps]
    kept = max(1, block - 1)
    per_round = max(1, -(-rounds // kept))  # enough rounds for ``rounds`` kept samples
    start = time.perf_counter()
    done = 0
    while done < per_round or (time.perf_counter() - start < min_seconds and len(times[0]) + kept <= MAX_SAMPLES):
        for ts, it in zip(times, interps):
            it.invoke()
            for _ in range(kept):
                t = time.perf_counter()
                it.invoke()
                ts.append(time.perf_counter() - t)
        done += 1
    return times


@dataclass
class BenchRow:
    model: str
    tflgpu_ms: float  # median
    litert_ms: float | None
    backend: str
    max_rel_err: float | None
    init_ms: float = 0.0  # construction + allocate_tensors (kernel generation and compilation included)
    min_ms: float = 0.0
    max_ms: float = 0.0
    litert_error: str | None = None  # why LiteRT has no figure (it could not run the model: a custom op, say)

    @property
    def ratio(self) -> float | None:
        return self.tflgpu_ms / self.litert_ms if self.litert_ms else None


def settled(it):
    """``it`` once its background work (optimized build, background tuning) is done: what is timed is the
    steady state a user gets, and no search runs during another interpreter's timing."""
    if hasattr(it, "wait_background"):
        it.wait_background()
    return it


@contextlib.contextmanager
def _native_stderr_quiet(quiet: bool):
    """The process's native stderr (file descriptor 2) sent to /dev/null meanwhile: LiteRT's C++ logger prints
    "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." there when it allocates, into a bench's table.
    Its errors still arrive, as the Python exceptions it raises."""
    if not quiet:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def resized(it, input_shapes=None):
    """``it`` with its inputs resized to ``input_shapes`` (one per input, in order; None: as stored), as a caller of
    a model with a dynamic input does before allocate_tensors(); refused where the count differs."""
    if input_shapes:
        details = it.get_input_details()
        if len(input_shapes) != len(details):
            raise ValueError(f"{len(input_shapes)} input shapes given for the model's {len(details)} inputs")
        for d, shape in zip(details, input_shapes):
            if tuple(d["shape"]) != tuple(shape):
                it.resize_tensor_input(d["index"], list(shape))
    return it


def _prepare(interp_cls, path: Path, inputs, settle: bool = True, **kw):
    """An interpreter of ``path`` with ``inputs`` set (resized to their shapes), its tensors allocated; ``settle``:
    once its background work is done (``settled``; else the caller waits as it sees fit)."""
    it = resized(interp_cls(model_path=str(path), **kw), [np.shape(x) for x in inputs])
    with _native_stderr_quiet(not interp_cls.__module__.startswith("tflgpu")):
        it.allocate_tensors()
    if settle:  # (after the allocation: a resized input's plan is built there, and its background work starts)
        settled(it)
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    return it


def bench_model(path: str | Path, num_threads: int = 2, warmup: int = 3, repeats: int = 20,
                compare: bool = True, interpreter_kwargs: dict | None = None, input_shapes=None) -> BenchRow:
    """Median latency of tflgpu (and LiteRT with XNNPACK, same thread count) on one model (its inputs resized to
    ``input_shapes`` where given)."""
    from .interpreter import Interpreter

    path = Path(path)
    t0 = time.perf_counter()
    ours = resized(Interpreter(model_path=str(path), num_threads=num_threads, **(interpreter_kwargs or {})),
                   input_shapes)
    ours.allocate_tensors()
    init_ms = 1e3 * (time.perf_counter() - t0)
    settled(ours)
    inputs = reference_inputs(ours.get_input_details())
    for d, x in zip(ours.get_input_details(), inputs):
        ours.set_tensor(d["index"], x)
    LiteRT = None
    if compare:
        try:
            from ai_edge_litert.interpreter import Interpreter as LiteRT
        except ImportError:
            pass
    ref_ms = err = litert_error = None
    ref = None
    if LiteRT is not None:
        try:
            ref = _prepare(LiteRT, path, inputs, num_threads=num_threads)
        except (RuntimeError, ValueError) as e:  # (what LiteRT raises for a model it cannot prepare)
            litert_error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if ref is None:
        times = time_invokes(ours, warmup, repeats)
    else:  # timed in alternation with LiteRT, so the machine's drift hits both alike
        times, ref_times = interleaved_samples([ours, ref], rounds=repeats, warmup=warmup)
        ref_ms = 1e3 * statistics.median(ref_times)
        # fresh interpreters, one invoke each, so stateful models (LSTM) compare like with like
        a = _prepare(Interpreter, path, inputs, num_threads=num_threads, **(interpreter_kwargs or {}))
        r = _prepare(LiteRT, path, inputs, num_threads=num_threads)
        a.invoke()
        r.invoke()
        errs = []
        for d in r.get_output_details():
            want = r.get_tensor(d["index"]).astype(np.float64)
            got = a.get_tensor(d["index"]).astype(np.float64)
            errs.append(float(np.abs(got - want).max() / max(1.0, np.abs(want).max())))
        err = max(errs) if errs else 0.0
    ours_ms = 1e3 * statistics.median(times)
    return BenchRow(path.name, ours_ms, ref_ms, ours.backend, err, init_ms, 1e3 * min(times), 1e3 * max(times),
                    litert_error)


def format_table(rows: list[BenchRow]) -> str:
    lines = [
        "| model | backend | init ms | tflgpu ms (median) | min | max | LiteRT ms | ratio (tflgpu/LiteRT) | max rel err |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lit = f"{r.litert_ms:.2f}" if r.litert_ms is not None else "n/a"
        ratio = f"{r.ratio:.1f}x" if r.ratio is not None else "n/a"
        err = f"{r.max_rel_err:.1e}" if r.max_rel_err is not None else "n/a"
        lines.append(f"| {r.model} | {r.backend} | {r.init_ms:.0f} | {r.tflgpu_ms:.2f} | {r.min_ms:.2f} | "
                     f"{r.max_ms:.2f} | {lit} | {ratio} | {err} |")
    lines += [f"\nLiteRT could not run {r.model}: {r.litert_error}" for r in rows if r.litert_error]
    return "\n".join(lines)


def _profiled(path: str | Path, delegate, input_shapes=None):
    """An interpreter with profiling on after its warm-up invokes (reference inputs; the background work done)."""
    from .interpreter import Interpreter

    delegate.profile = True
    it = resized(Interpreter(model_path=str(path), delegate=delegate), input_shapes)
    it.allocate_tensors()
    settled(it)  # (after the allocation, which builds a resized input's plan)
    for d, x in zip(it.get_input_details(), reference_inputs(it.get_input_details())):
        it.set_tensor(d["index"], x)
    warm_up(it, 2)
    return it


def profiled_plan(path: str | Path, delegate, input_shapes=None):
    """The model's plan after one profiled invoke (reference inputs, after a warm-up invoke, the background work
    done), or None without an OpenCL device: what ``kernel_profile`` and ``trace.write_trace`` read."""
    return _profiled(path, delegate, input_shapes).gpu_plan


@dataclass
class KernelRate:
    """One kernel of a profiled run, with what it achieved: GFLOP/s where its generator counts flops, and GB/s
    over the bytes its tensors and constants take (each moved at least once)."""

    layer: str
    op: str
    us: float
    gflops: float | None
    gbps: float


@dataclass
class LaunchStats:
    """Where a device plan's invoke time goes: kernels launched, their summed device time, the invoke's wall
    time, and the host's cost per launch, (wall - kernel time - CPU ops) / launches. That cost is split further
    by the run's device clock: the boundary tensors' copies, maps and layout conversions (``transfer_us``), the
    device idle between one command's end and the next one's start (``idle_us``: a driver's own gap between
    kernels, or a device waiting for the host's next enqueue), and what is left outside the device's span
    (``outside_us``: the host's work before the first command starts and after the last one ends, and its
    wake-up from the wait)."""

    launches: int
    kernel_us: float
    cpu_ops_us: float
    wall_us: float  # median invoke, profiling on
    top: list[KernelRate]
    transfer_us: float = 0.0
    span_us: float = 0.0  # the device's span: the first command's start to the last command's end

    @property
    def host_us_per_launch(self) -> float:
        return max(0.0, self.host_us_per_launch_at(self.wall_us))

    def host_us_per_launch_at(self, wall_us: float) -> float:
        """(``wall_us`` - kernel time - CPU ops) / launches: the host's cost per launch of an invoke taking
        ``wall_us`` (an unprofiled one's, say: negative where the events make the kernels look longer)."""
        return (wall_us - self.kernel_us - self.cpu_ops_us) / max(1, self.launches)

    @property
    def idle_us(self) -> float:
        """The device's time inside its span running no command (can be negative where a runtime's commands
        overlap: the Intel CPU runtime's copies do)."""
        return self.span_us - self.kernel_us - self.transfer_us

    @property
    def outside_us(self) -> float:
        return self.wall_us - self.span_us - self.cpu_ops_us

    def breakdown(self) -> str:
        """The profiled wall time, part by part, with each part per launch."""
        n = max(1, self.launches)
        parts = [("kernels", self.kernel_us), ("boundary copies and conversions", self.transfer_us),
                 ("device idle between commands", self.idle_us), ("CPU ops", self.cpu_ops_us),
                 ("outside the device's span", self.outside_us)]
        return f"wall {self.wall_us:.0f} us = " + " + ".join(
            f"{name} {us:.0f} ({us / n:.1f}/launch)" for name, us in parts if name != "CPU ops" or us)


def launch_stats(path: str | Path, delegate, repeats: int = 20, top: int = 3) -> LaunchStats | None:
    """``LaunchStats`` of the model's plan (None without an OpenCL device): each figure the median over
    ``repeats`` profiled invokes, the wall time and the kernel times of each invoke taken together; the
    ``top`` kernels by median time."""
    it = _profiled(path, delegate)
    plan = it.gpu_plan
    if plan is None:
        return None
    walls, kernels, cpu_ops, moved, spans, per_layer = [], [], [], [], [], {}
    for _ in range(repeats):
        t = time.perf_counter()
        it.invoke()
        walls.append((time.perf_counter() - t) * 1e6)
        run = plan.last_run
        kernels.append(sum(k.us for k in run.launches))
        moved.append(sum(c.us for c in run.transfers))
        events = [k.event for k in run.launches] + [c.event for c in run.transfers]
        spans.append((max(e.profile.end for e in events) - min(e.profile.start for e in events)) / 1e3
                     if events else 0.0)
        cpu_ops.append(sum(h.end_ns - h.start_ns for h in run.host if h.kind == "cpu op") / 1e3)
        for k in run.launches:
            per_layer.setdefault(k.layer, (k, []))[1].append(k.us)
    rates = []
    for k, times in per_layer.values():
        us = statistics.median(times)
        flops = k.spec.flops if k.spec is not None else 0
        bytes_ = plan.spec_bytes(k.spec) if k.spec is not None else 0
        rates.append(KernelRate(k.layer, k.op, us, flops / us / 1e3 if flops and us else None,
                                bytes_ / us / 1e3 if us else 0.0))
    rates.sort(key=lambda r: -r.us)
    return LaunchStats(len(plan.last_run.launches), statistics.median(kernels), statistics.median(cpu_ops),
                       statistics.median(walls), rates[:top], statistics.median(moved), statistics.median(spans))


def kernel_profile(path: str | Path, delegate, top: int = 10, input_shapes=None) -> str:
    """Per-kernel OpenCL event times of one invoke (after a warm-up), largest first."""
    plan = profiled_plan(path, delegate, input_shapes)
    if plan is None:
        return "(no OpenCL plan)"
    rows = sorted(plan.profile_report(), key=lambda r: -r[2])
    total = sum(r[2] for r in rows) or 1.0
    lines = ["| kernel | op | us | share |", "|---|---|---:|---:|"]
    for name, op, us in rows[:top]:
        lines.append(f"| {name} | {op} | {us:.0f} | {us / total:.0%} |")
    lines.append(f"| all {len(rows)} kernels | | {total:.0f} | 100% |")
    return "\n".join(lines)


_RSS_PROBE = """
import sys, numpy as np
path, runtime, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
if runtime == "litert":
    from ai_edge_litert.interpreter import Interpreter
    it = Interpreter(model_path=path, num_threads=threads)
else:
    from tflgpu import GpuDelegate, Interpreter
    it = Interpreter(model_path=path, num_threads=threads,
                     **({"delegate": GpuDelegate(tuning="none")} if runtime == "opencl" else {}))
it.allocate_tensors()
for _ in range(5):  # (inputs as reference_inputs makes them; LiteRT's process does not import tflgpu)
    rng = np.random.default_rng(0)
    for d in it.get_input_details():
        shape, dtype = tuple(int(s) for s in d["shape"]), np.dtype(d["dtype"])
        x = (rng.uniform(-1, 1, shape) if dtype.kind == "f" else rng.integers(0, 2, shape)).astype(dtype)
        it.set_tensor(d["index"], x)
    it.invoke()
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")))
"""


def rss_after_invokes(path: str | Path, runtime: str, threads: int = 2, timeout_s: float = 600) -> float | None:
    """Resident MiB of a fresh Python process after loading ``path`` and five invokes, with ``runtime`` "litert",
    "cpu" (tflgpu's CPU kernels) or "opencl" (GpuDelegate, tuning off), on a warm cache (the second of two such
    processes: a first start's compiler, loaded for the build, would count otherwise); None where that process
    fails (no LiteRT, no /proc)."""
    import subprocess

    rss = None
    for _ in range(2 if runtime == "opencl" else 1):
        try:
            done = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(path), runtime, str(threads)],
                                  capture_output=True, text=True, timeout=timeout_s, check=False)
            rss = int(done.stdout.split()[-1]) / 1024 if done.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
            rss = None
    return rss


def fma_peak_gflops(device=None, fp16: bool = False, repeats: int = 7) -> float:
    """This OpenCL device's FP32 multiply-add throughput, measured: every work-item runs 16 independent
    float8 mad chains (enough to hide FMA latency), timed with profiling events (best of ``repeats``)."""
    import pyopencl as cl

    from .kernels.program import build
    from .runtime.device import choose_device

    dev = device or choose_device()
    ctx = cl.Context([dev.cl_device])
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    chains, iters = 16, 2048
    body = "\n".join(f"    a{i} = mad(a{i}, m, c);" for i in range(chains))
    decl = "\n".join(f"  float8 a{i} = (float8)(get_global_id(0) * 1e-9f + {i});" for i in range(chains))
    total = " + ".join(f"a{i}" for i in range(chains))
    src = f"""__attribute__((vec_type_hint(float8)))
__kernel void peak(__global float8* out, float mf, float cf) {{
  const float8 m = (float8)(mf); const float8 c = (float8)(cf);
{decl}
  for (int k = 0; k < {iters}; ++k) {{
{body}
  }}
  out[get_global_id(0)] = {total};
}}"""
    prog = build(cl.Program(ctx, src), ["-cl-mad-enable"])
    items = dev.identity.compute_units * 256
    out = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, items * 32)
    k = prog.peak
    k.set_args(out, np.float32(0.999), np.float32(1e-3))
    best = float("inf")
    for _ in range(repeats):
        ev = cl.enqueue_nd_range_kernel(q, k, (items,), None)
        ev.wait()
        best = min(best, (ev.profile.end - ev.profile.start) * 1e-9)
    return 2.0 * 8 * chains * iters * items / best / 1e9
