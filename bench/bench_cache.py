#!/usr/bin/env python3
"""Start-up with and without the serialization cache, every corpus model, on the OpenCL device.

Per model, each number is the model's start-up (Interpreter(...) + allocate_tensors()) in a fresh
process: cold = empty cache directory (tuning off, and tuning "fast"), warm = the median of the next
three processes on the directory the cold one filled. Each process first imports tflgpu and starts the OpenCL runtime
(loading the driver, listing devices): that part is the same with or without a cache, and users pay it
on every start, so the reduction is reported both ways: the model's start-up alone, and the whole start
(runtime start included, what a user waits for). pyopencl's own compiler cache is bypassed whenever
tflgpu's cache is on, so "cold" compiles everything.

    python bench/bench_cache.py [--models-dir ../shared/models] [--precision fp32] [--cold-runs 3] [MODEL ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WARM_RUNS = 3  # warm starts are short, and this machine's timings drift: the median of three processes
LARGE_BYTES = 1 << 20  # "large" models: the real architectures (1.9-17 MB); the rest are under 120 KB
DEFAULT_DIR = Path(os.environ.get("TFLGPU_MODELS_DIR", Path(__file__).resolve().parents[2] / "shared" / "models"))

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import pyopencl
import tflgpu.autotune, tflgpu.cache.plans, tflgpu.runtime.executor
from tflgpu import GpuDelegate, Interpreter
from tflgpu.delegate import fp16_storage
from tflgpu.runtime.device import choose_device
choose_device()
runtime_start = time.perf_counter() - t0
model, cache_dir, tuning, fp16 = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
t0 = time.perf_counter()
it = Interpreter(model_path=model, delegate=GpuDelegate(serialization_dir=cache_dir, tuning=tuning,
                                                        **fp16_storage(fp16)))
it.allocate_tensors()
s = time.perf_counter() - t0
p = it.gpu_plan
print(json.dumps({"s": s, "runtime_start": runtime_start, "plan": p.build_stats["plan"] if p else None,
                  "compiled": p.build_stats["source_builds"] if p else 0}))
"""


def init_time(model: Path, cache_dir: str, tuning: str, fp16: bool) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, str(model), cache_dir, tuning, "1" if fp16 else "0"],
                       capture_output=True, text=True, timeout=1800, env={**os.environ, "TFLGPU_TUNING": ""})
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def dir_bytes(d: str) -> int:
    return sum(f.stat().st_size for f in Path(d).rglob("*") if f.is_file())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*")
    p.add_argument("--models-dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp32")
    p.add_argument("--no-fast", action="store_true", help="skip the cold runs with tuning 'fast'")
    p.add_argument("--cold-runs", type=int, default=1, help="cold starts (tuning off) per model; the median is used")
    args = p.parse_args()
    models = [Path(m) for m in args.models] or sorted(args.models_dir.glob("*.tflite"))
    fp16 = args.precision == "fp16"
    print("| model | cold init s (tuning off) | cold init s (tuning fast) | warm init s | warm vs cold (off) "
          "| warm vs cold, with runtime start | warm vs cold (fast) | cache bytes | runtime start s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst, worst_large, worst_whole = 100.0, 100.0, 100.0
    for m in models:
        print(f"{m.name} ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="tflgpu-bench-") as d:
            cold = init_time(m, d, "none", fp16)
            if args.cold_runs > 1:  # more cold starts, each on an empty directory: the median process
                colds = [cold]
                for _ in range(args.cold_runs - 1):
                    with tempfile.TemporaryDirectory(prefix="tflgpu-bench-") as d2:
                        colds.append(init_time(m, d2, "none", fp16))
                cold = sorted(colds, key=lambda c: c["s"])[len(colds) // 2]
            warms = [init_time(m, d, "none", fp16) for _ in range(WARM_RUNS)]
            for w in warms:
                assert w["plan"] in ("cache", None) and w["compiled"] == 0, w
            warm = sorted(warms, key=lambda w: w["s"])[WARM_RUNS // 2]  # the median process
            size = dir_bytes(d)
        fast = None
        if not args.no_fast:
            with tempfile.TemporaryDirectory(prefix="tflgpu-bench-") as d:
                fast = init_time(m, d, "fast", fp16)
                warm_fast = init_time(m, d, "fast", fp16)
                assert warm_fast["compiled"] == 0, warm_fast
        red = 100 * (1 - warm["s"] / cold["s"])
        whole = 100 * (1 - (warm["s"] + warm["runtime_start"]) / (cold["s"] + cold["runtime_start"]))
        worst, worst_whole = min(worst, red), min(worst_whole, whole)
        if m.stat().st_size >= LARGE_BYTES:
            worst_large = min(worst_large, red)
        red_fast = f"{100 * (1 - warm_fast['s'] / fast['s']):.1f}%" if fast else "-"
        print(f"| {m.name} | {cold['s']:.2f} | " + (f"{fast['s']:.2f}" if fast else "-")
              + f" | {warm['s']:.3f} | {red:.1f}% | {whole:.1f}% | {red_fast} | {size:,} | {warm['runtime_start']:.2f} |",
              flush=True)
    print(f"\nsmallest reduction (warm vs cold, tuning off): {worst:.1f}% of the model's start-up over every model, "
          f"{worst_large:.1f}% over the large ones (files of 1 MB or more); {worst_whole:.1f}% of the whole start, "
          f"runtime start included")
    return 0


if __name__ == "__main__":
    sys.exit(main())
