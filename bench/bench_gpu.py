#!/usr/bin/env python3
"""Issue 15's table: per corpus model on one OpenCL device (meant for a GPU), in one process, invoked in
alternation so the machine's drift hits every column alike:

- heuristic: the generators' defaults (no tuning records at all: ``tuning_db=False``);
- start: default options in a fresh cache before any search (records of this device, the shipped database
  and the nearest device's records through the fallback chain; ``tuning="none"``);
- background: default options in a fresh cache once the background work (optimized build, background
  tuning) is done, or stopped after ``--background-wait-s`` (a note says so; the column is then what it had
  installed by then);
- exhaustive: after an ``exhaustive`` search (``--exhaustive-budget-s`` per model);
- host us/launch: (wall - kernel time - CPU ops) / launches of the background plan, profiled (events on every
  launch: the wall of a profiled invoke), and the same with the background column's wall (an invoke as a user
  has it, unprofiled) in place of the profiled one (negative where a runtime's events make the kernels look
  longer than an unprofiled invoke takes: the Intel CPU runtime's do); and the profiled figure split by the
  device's clock (``benchmark.LaunchStats``): the host's time outside the device's span (before its first
  command starts, after its last ends), the device idle between commands (a driver's gap between kernels, or
  waiting for the host's next enqueue), and the boundary tensors' copies and conversions;
- LiteRT CPU with every core, and LiteRT's own GPU path (``CompiledModel`` with the GPU accelerator: WebGPU
  over Vulkan) where this machine has a driver for it; with the ratios the issue asks about (start /
  exhaustive, LiteRT CPU / background).

A second table, where PyTorch with CUDA is importable: torchvision's MobileNet v2 and v3 (large) at batch 1 on
the same GPU, eager and replayed as a CUDA graph (what a Python user with an NVIDIA GPU would otherwise pick).

    python bench/bench_gpu.py [--device D] [--models-dir ../shared/models] [--exhaustive-budget-s 120]
                              [--background-wait-s 300] [--rounds 30] [--precision fp32]
                              [--export-background FILE] [MODEL ...]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tflgpu import GpuDelegate, Interpreter
from tflgpu.autotune.exchange import DeviceRecords, cache_records, merge_records, write_records
from tflgpu.autotune.records import MemoryTuningDB
from tflgpu.benchmark import _prepare, interleaved_ms, launch_stats, reference_inputs

DEFAULT_DIR = Path(os.environ.get("TFLGPU_MODELS_DIR", Path(__file__).resolve().parents[2] / "shared" / "models"))
FLOAT_MODELS = ["mobilenet_v1_1.0_224.tflite", "mobilenet_v2_1.0_224.tflite", "deeplab_mnv2_257.tflite",
                "posenet_mnv1_257.tflite", "ssd_mnv2_300.tflite", "unet_small_256.tflite", "opzoo_small.tflite",
                "fallback_ops.tflite", "lstm_small.tflite", "lstm_small_keras3_while.tflite",
                "mobilenet_v1_1.0_224_fp16.tflite", "mobilenet_v2_1.0_224_dynrange.tflite"]


def geomean(xs):
    xs = [x for x in xs if x and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


class LiteRTGpu:
    """LiteRT's own GPU path on this machine (``CompiledModel`` with the GPU accelerator), invoked like an
    Interpreter; ``make`` returns None (and why) where it cannot run."""

    def __init__(self, cm, ins, outs):
        self.cm, self.ins, self.outs = cm, ins, outs

    @classmethod
    def make(cls, path: Path, inputs: list[np.ndarray]):
        try:
            from ai_edge_litert.compiled_model import CompiledModel
            from ai_edge_litert.hardware_accelerator import HardwareAccelerator

            cm = CompiledModel.from_file(str(path), hardware_accel=HardwareAccelerator.GPU)
            ins, outs = cm.create_input_buffers(0), cm.create_output_buffers(0)
            for buf, x in zip(ins, inputs):
                buf.write(np.ascontiguousarray(x))
            cm.run_by_index(0, ins, outs)
            return cls(cm, ins, outs), ""
        except Exception as e:  # noqa: BLE001 - no GPU accelerator here (no Vulkan driver, an unsupported op)
            return None, f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"

    def invoke(self) -> None:
        self.cm.run_by_index(0, self.ins, self.outs)


def torch_table(rounds: int) -> list[str]:
    """torchvision MobileNet v2 / v3-large on CUDA at batch 1: eager, and one CUDA graph replayed."""
    try:
        import torch
        import torchvision
    except ImportError as e:
        return [f"(PyTorch / torchvision not importable here: {e})"]
    if not torch.cuda.is_available():
        return ["(PyTorch has no CUDA device here)"]
    rows = ["| torchvision model (batch 1, FP32) | eager ms | CUDA graph ms |", "|---|---:|---:|"]
    for name in ("mobilenet_v2", "mobilenet_v3_large"):
        model = getattr(torchvision.models, name)(weights=None).eval().cuda()
        x = torch.randn(1, 3, 224, 224, device="cuda")
        with torch.inference_mode():
            for _ in range(10):
                model(x)
            torch.cuda.synchronize()
            eager = []
            for _ in range(rounds):
                t = time.perf_counter()
                model(x)
                torch.cuda.synchronize()
                eager.append((time.perf_counter() - t) * 1e3)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    model(x)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model(x)
            graphed = []
            for _ in range(rounds):
                t = time.perf_counter()
                graph.replay()
                torch.cuda.synchronize()
                graphed.append((time.perf_counter() - t) * 1e3)
        rows.append(f"| {name} | {statistics.median(eager):.3f} | {statistics.median(graphed):.3f} |")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*")
    p.add_argument("--models-dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--device", default=None, help="OpenCL device: index or name substring (default: the first GPU)")
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp32")
    p.add_argument("--exhaustive-budget-s", type=float, default=120.0)
    p.add_argument("--background-wait-s", type=float, default=300.0)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--fuse-expansions", action="store_const", const=True, default=None,
                   help="every tflgpu column with GpuDelegate(fuse_expansions=True): one kernel per separable block "
                        "and the conv expanding its output from the start (default: the delegate's, a GPU's tuner "
                        "fusing a block where it measures faster)")
    p.add_argument("--export-background", metavar="FILE",
                   help="write the records each model's background search left in its fresh cache to FILE (one "
                        "export file, every model's kernels; bench/merge_records.py folds it into a shipped "
                        "database, so that a fresh cache starts where the background search ended)")
    p.add_argument("--export-exhaustive", metavar="FILE",
                   help="write the records of each model's exhaustive search to FILE (as --export-background; "
                        "bench/merge_records.py prefers them to a background search's, drawn from fewer trials)")
    p.add_argument("--host-share", type=float, default=None,
                   help="the share of a step's enqueue time beyond its device span that the searches cost "
                        "(autotune.measure.step_cost; default: HOST_EXCESS_SHARE; 1: the longer of the two)")
    args = p.parse_args()
    if args.host_share is not None:
        from tflgpu.autotune import measure

        measure.HOST_EXCESS_SHARE = args.host_share
    models = [Path(m) for m in args.models] or [args.models_dir / n for n in FLOAT_MODELS
                                                  if (args.models_dir / n).exists()]
    fp16 = args.precision == "fp16"
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    cores = os.cpu_count() or 1
    print(f"| model | heuristic ms | start ms | background ms | exhaustive ms | start / exhaustive "
          f"| host us/launch, profiled (launches) | host us/launch, unprofiled wall "
          f"| of which outside the device's span / device idle / transfers, us/launch "
          f"| LiteRT CPU ({cores} threads) ms | LiteRT GPU ms "
          f"| LiteRT CPU / background |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    notes, speedups, starts = [], [], []
    background_records: list = []  # (--export-background)
    exhaustive_records: list = []  # (--export-exhaustive)
    exported = exported_exhaustive = 0
    shown = 0
    for m in models:
        inputs = reference_inputs(Interpreter(model_path=str(m)).get_input_details())
        kw = {"device": args.device, "precision_loss_allowed": fp16, "fuse_expansions": args.fuse_expansions}
        laps: dict[str, float] = {}  # seconds by phase: where a model's row goes (a step's time limit cuts rows)
        at = [time.perf_counter()]

        def lap(name: str, laps=laps, at=at) -> None:
            now = time.perf_counter()
            laps[name], at[0] = now - at[0], now

        with tempfile.TemporaryDirectory() as fresh, tempfile.TemporaryDirectory() as fresh2:
            heuristic = _prepare(Interpreter, m, inputs, delegate=GpuDelegate(**kw, cache=False, tuning="none",
                                                                              tuning_db=False))
            lap("heuristic plan")
            start = _prepare(Interpreter, m, inputs, delegate=GpuDelegate(**kw, serialization_dir=fresh,
                                                                          tuning="none"))
            lap("start plan")
            background = _prepare(Interpreter, m, inputs, settle=False,
                                  delegate=GpuDelegate(**kw, serialization_dir=fresh2))
            lap("background plan")
            done = background.wait_background(args.background_wait_s)
            waited = time.perf_counter() - at[0]
            work = background.gpu_plan.background if background.gpu_plan is not None else None
            if not done and work is not None:  # (what it found is installed by the next invoke; none runs while timed)
                work.stop()
                background.wait_background()
            lap("background wait")
            st = background.tuning_status()
            if st is not None and st.plan_start_us:  # (runtime.upgrades.check_plan)
                notes.append(f"{m.name}: the background search's kernels end to end {st.plan_tuned_us:.0f} us, the "
                             f"start's {st.plan_start_us:.0f} us: {'the start put back' if st.reverted else 'kept'}")
            searched = MemoryTuningDB()  # (no cache: its records only here, for --export-exhaustive)
            exhaustive = _prepare(Interpreter, m, inputs, delegate=GpuDelegate(
                **kw, cache=False, tuning="exhaustive", tuning_budget_s=args.exhaustive_budget_s,
                tuning_db=searched))
            lap("exhaustive plan")
            if args.export_exhaustive and exhaustive.gpu_plan is not None:
                found = DeviceRecords(exhaustive.gpu_plan.device.identity.as_dict())
                found.records = {k: r for d, k, r in searched.items() if d == found.key}
                exported_exhaustive += merge_records(exhaustive_records, [found])
                write_records(args.export_exhaustive, exhaustive_records)
            peers = [LiteRT(model_path=str(m), num_threads=cores)]
            try:
                peers[0].allocate_tensors()
            except (RuntimeError, ValueError) as e:  # (a MediaPipe custom op LiteRT's Python package lacks)
                notes.append(f"{m.name}: LiteRT CPU cannot run it: {str(e).strip().splitlines()[0]}")
                peers = []
            for d, x in zip(peers[0].get_input_details() if peers else [], inputs):
                peers[0].set_tensor(d["index"], x)
            gpu_peer, why = LiteRTGpu.make(m, inputs)
            if gpu_peer is None:
                notes.append(f"{m.name}: LiteRT GPU: {why}")
            lap("LiteRT")
            interps = [heuristic, start, background, exhaustive, *peers] + ([gpu_peer] if gpu_peer else [])
            ms = interleaved_ms(interps, rounds=args.rounds)
            lap("timing")
            trial = background.gpu_plan.cadence  # (runtime.cadence: settled in the warm-up)
            notes.append(f"{m.name}: background plan's queue: {trial.chosen}; trial medians " + (", ".join(
                f"{c}: {t * 1e3:.3f} ms" for c, t in trial.medians().items()) or "none (no trial on this device)"))
            # (the background plan again, from the records its search left: no second search)
            stats = launch_stats(m, GpuDelegate(**kw, serialization_dir=fresh2, tuning="none"), top=8)
            lap("host time per launch")
            if stats:
                notes.append(f"{m.name}: the background plan's profiled invoke: {stats.breakdown()}")
                notes.append(f"{m.name}: the background plan's slowest kernels (profiled): " + ", ".join(
                    f"{k.layer} ({k.op}) {k.us:.1f} us" for k in stats.top))
            if args.export_background:
                found = cache_records(fresh2, background.gpu_plan.device.identity.as_dict())
                exported += merge_records(background_records, [found])
                write_records(args.export_background, background_records)  # (after each model: a cut run keeps it)
        notes.append(f"{m.name}: seconds by phase: " + ", ".join(f"{k} {v:.1f}" for k, v in laps.items()))
        h, s, b, e = ms[:4]
        cpu = ms[4] if peers else None
        g = f"{ms[4 + len(peers)]:.3f}" if gpu_peer else "n/a"
        host = f"{stats.host_us_per_launch:.1f} ({stats.launches})" if stats else "n/a"
        plain = f"{stats.host_us_per_launch_at(b * 1e3):.1f}" if stats else "n/a"
        n = max(1, stats.launches) if stats else 1
        split = f"{stats.outside_us / n:.1f} / {stats.idle_us / n:.1f} / {stats.transfer_us / n:.1f}" if stats else "n/a"
        if cpu is not None:
            speedups.append(cpu / b)
        starts.append(s / e)
        if not done:
            notes.append(f"{m.name}: background work not finished after {waited:.0f} s: stopped there, the column "
                         f"is what it had installed")
        print(f"| {m.name} | {h:.3f} | {s:.3f} | {b:.3f} | {e:.3f} | {s / e:.2f} | {host} | {plain} | {split} | "
              f"{'n/a' if cpu is None else f'{cpu:.3f}'} | {g} | {'n/a' if cpu is None else f'{cpu / b:.2f}x'} |",
              flush=True)
        for n in notes[shown:]:  # (as they come, on stderr: a run cut short by a time limit keeps them)
            print(f"  note: {n}", file=sys.stderr, flush=True)
        shown = len(notes)
    versus = f"{geomean(speedups):.2f}x" if speedups else "n/a"
    print(f"\ngeomean: start / exhaustive {geomean(starts):.2f}, LiteRT CPU / background {versus}")
    if args.export_background:
        print(f"background searches' records: {exported} written to {args.export_background}")
    if args.export_exhaustive:
        print(f"exhaustive searches' records: {exported_exhaustive} written to {args.export_exhaustive}")
    for n in notes:
        print(f"- {n}")
    if not args.no_torch:
        print()
        for line in torch_table(args.rounds):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
