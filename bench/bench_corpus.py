#!/usr/bin/env python3
"""tflgpu (CPU kernels, and GpuDelegate FP32/FP16 on the OpenCL device) vs LiteRT (XNNPACK, same
thread count), every corpus model, in one process.

    python bench/bench_corpus.py [--models-dir ../shared/models] [--threads 2] [--repeat 20] [--min-seconds 2] [--no-gpu]
                                 [--write-readme README.md] [MODEL ...]

Prints a markdown table of median latencies and ratios to LiteRT (lower is better for tflgpu). Per
model, every interpreter is built first, then each is invoked in alternation with LiteRT (--repeat rounds, and
at least --min-seconds of them), so the machine's drift hits both alike: the CPU kernels in one rotation, the OpenCL FP32 and FP16 plans in
another, each ratio against the LiteRT of its own rotation (numba's OpenMP workers spin on after an invoke and
slow whatever the process runs next). ``--write-readme`` puts the table, with the date, the
machine and the command, into the README's generated section ``bench_corpus``.

A second table breaks the OpenCL FP32 invoke down (profiling on, in its own interpreter): kernels launched,
their summed device time, the host's time per launch ((wall - kernel time - CPU ops) / launches), and the
three slowest kernels with the GFLOP/s their generators' flop counts give, else the GB/s of the bytes their
tensors and constants take (``tflgpu.benchmark.launch_stats``).

A third table (``--rss``) gives each model's resident memory after loading it and five invokes, one fresh
process per model and runtime (RSS is a process's): LiteRT, the CPU kernels, and the OpenCL device at FP32
with tuning off (``tflgpu.benchmark.rss_after_invokes``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from tflgpu import GpuDelegate, Interpreter
from tflgpu.delegate import fp16_storage
from tflgpu.benchmark import _prepare, interleaved_ms, launch_stats, reference_inputs, rss_after_invokes

DEFAULT_DIR = Path(os.environ.get("TFLGPU_MODELS_DIR", Path(__file__).resolve().parents[2] / "shared" / "models"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", help="model files (default: every .tflite in --models-dir)")
    p.add_argument("--models-dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--min-seconds", type=float, default=2.0,
                   help="time each rotation at least this long (more rounds for small models), up to 2000 samples")
    p.add_argument("--no-gpu", action="store_true", help="only the CPU kernels")
    p.add_argument("--write-readme", type=Path, metavar="README", help="write the table into this README too")
    p.add_argument("--rss", action="store_true", help="also each model's resident memory per runtime (subprocesses)")
    args = p.parse_args()
    models = [Path(m) for m in args.models] or sorted(args.models_dir.glob("*.tflite"))
    if not models:
        print(f"no models found in {args.models_dir}", file=sys.stderr)
        return 1
    lines = ["| model | LiteRT ms, with CPU | tflgpu CPU ms (ratio) | LiteRT ms, with OpenCL | OpenCL FP32 ms (ratio) "
             "| OpenCL FP16 ms (ratio) | ops on device |",
             "|---|---:|---:|---:|---:|---:|---|"]

    def emit(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    for line in lines:
        print(line)
    try:
        from ai_edge_litert.interpreter import Interpreter as LiteRT
    except ImportError:
        LiteRT = None
    ratios = {"cpu": [], "fp32": [], "fp16": []}
    for m in models:
        print(f"benchmarking {m.name} ...", file=sys.stderr, flush=True)
        inputs = reference_inputs(Interpreter(model_path=str(m)).get_input_details())
        its = {"cpu": _prepare(Interpreter, m, inputs, num_threads=args.threads)}
        if not args.no_gpu:
            for key, fp16 in (("fp32", False), ("fp16", True)):  # (the FP16 plan on a CPU device too)
                its[key] = _prepare(Interpreter, m, inputs, num_threads=args.threads,
                                    delegate=GpuDelegate(**fp16_storage(fp16)))
        if LiteRT is not None:
            its["litert"] = _prepare(LiteRT, m, inputs, num_threads=args.threads)
        # invoked in alternation with LiteRT, so the machine's drift hits both alike: the CPU kernels in one rotation,
        # the OpenCL plans in another (numba's OpenMP workers spin on after an invoke, slowing whatever runs next
        # in the process by up to 40% on a small model; each runtime alone does not meet the other's spinning)
        cells = []
        for group in (("cpu",), ("fp32", "fp16")):
            keys = [k for k in group if k in its]
            if not keys:
                cells += ["-"] + [""] * len(group)
                continue
            rotation = keys + (["litert"] if "litert" in its else [])
            ms = dict(zip(rotation, interleaved_ms([its[k] for k in rotation], rounds=args.repeat,
                                                   warmup=args.warmup, min_seconds=args.min_seconds)))
            ref = ms.get("litert")
            cells.append(f"{ref:.2f}" if ref else "-")
            for key in group:
                if key not in ms:
                    cells.append("")
                    continue
                if ref:
                    ratios[key].append(ms[key] / ref)
                cells.append(f"{ms[key]:.2f} ({ms[key] / ref:.1f}x)" if ref else f"{ms[key]:.2f}")
        split = its["fp32"].backend.split("; ", 1)[-1].rstrip(")") if "fp32" in its else ""
        emit(f"| {m.name} | " + " | ".join(cells) + f" | {split} |")
    emit("")
    for key, rs in ratios.items():
        if rs:
            emit(f"Geomean ratio to LiteRT, {key}: {math.exp(sum(map(math.log, rs)) / len(rs)):.2f}x over {len(rs)} models.")
    if not args.no_gpu:
        print("\n| model (OpenCL FP32) | kernels | kernel ms | host us / launch | slowest kernels |\n"
              "|---|---:|---:|---:|---|")
        for m in models:
            st = launch_stats(m, GpuDelegate(), repeats=args.repeat)
            if st is None:
                continue
            top = "; ".join(f"{k.layer} {k.us:.0f} us, " + (f"{k.gflops:.3g} GFLOP/s" if k.gflops else
                                                              f"{k.gbps:.3g} GB/s") for k in st.top)
            print(f"| {m.name} | {st.launches} | {st.kernel_us / 1e3:.2f} | {st.host_us_per_launch:.1f} | {top} |",
                  flush=True)
    if args.rss:
        runtimes = ["litert", "cpu"] + ([] if args.no_gpu else ["opencl"])
        print("\n| model | " + " | ".join(f"{r} RSS MiB" for r in runtimes) + " | ratios to LiteRT |\n|---|"
              + "---:|" * len(runtimes) + "---|")
        for m in models:
            rss = {r: rss_after_invokes(m, r, args.threads) for r in runtimes}
            ratio = ", ".join(f"{r} {rss[r] / rss['litert']:.1f}x" for r in runtimes[1:] if rss[r] and rss["litert"])
            print(f"| {m.name} | " + " | ".join(f"{rss[r]:.0f}" if rss[r] else "-" for r in runtimes)
                  + f" | {ratio} |", flush=True)
    if args.write_readme:
        from readme_section import measured_on, replace_section

        replace_section(args.write_readme, "bench_corpus", measured_on(not args.no_gpu) + "\n\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
