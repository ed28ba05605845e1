#!/usr/bin/env python3
"""tflgpu (CPU kernels, and GpuDelegate FP32/FP16 on the OpenCL device) vs LiteRT (XNNPACK, same
thread count), every corpus model, in one process.

    python bench/bench_corpus.py [--models-dir ../shared/models] [--threads 2] [--repeat 20] [--no-gpu] [MODEL ...]

Prints a markdown table of median latencies and ratios to LiteRT (lower is better for tflgpu).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from tflgpu import GpuDelegate
from tflgpu.benchmark import bench_model

DEFAULT_DIR = Path(os.environ.get("TFLGPU_MODELS_DIR", Path(__file__).resolve().parents[2] / "shared" / "models"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", help="model files (default: every .tflite in --models-dir)")
    p.add_argument("--models-dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--no-gpu", action="store_true", help="only the CPU kernels")
    args = p.parse_args()
    models = [Path(m) for m in args.models] or sorted(args.models_dir.glob("*.tflite"))
    if not models:
        print(f"no models found in {args.models_dir}", file=sys.stderr)
        return 1
    print("| model | LiteRT ms | tflgpu CPU ms (ratio) | OpenCL FP32 ms (ratio) | OpenCL FP16 ms (ratio) | ops on device |")
    print("|---|---:|---:|---:|---:|---|")
    ratios = {"cpu": [], "fp32": [], "fp16": []}
    for m in models:
        print(f"benchmarking {m.name} ...", file=sys.stderr, flush=True)
        cpu = bench_model(m, num_threads=args.threads, warmup=args.warmup, repeats=args.repeat)
        ref = cpu.litert_ms
        cells, split = [], ""
        for key, row in [("cpu", cpu)] + ([] if args.no_gpu else [
            (key, bench_model(m, num_threads=args.threads, warmup=args.warmup, repeats=args.repeat, compare=False,
                              interpreter_kwargs={"delegate": GpuDelegate(precision_loss_allowed=fp16)}))
            for key, fp16 in (("fp32", False), ("fp16", True))]):
            if ref:
                ratios[key].append(row.tflgpu_ms / ref)
            cells.append(f"{row.tflgpu_ms:.2f} ({row.tflgpu_ms / ref:.1f}x)" if ref else f"{row.tflgpu_ms:.2f}")
            if key == "fp32":
                split = row.backend.split("; ", 1)[-1].rstrip(")")
        cells += [""] * (3 - len(cells))
        print(f"| {m.name} | {ref:.2f} | " + " | ".join(cells) + f" | {split} |", flush=True)
    for key, rs in ratios.items():
        if rs:
            print(f"geomean ratio to LiteRT, {key}: {math.exp(sum(map(math.log, rs)) / len(rs)):.2f}x "
                  f"over {len(rs)} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
