#!/usr/bin/env python3
"""tflgpu vs LiteRT (XNNPACK, same thread count), every corpus model, in one process.

    python bench/bench_corpus.py [--models-dir ../shared/models] [--threads 2] [--repeat 20] [MODEL ...]

Prints a markdown table: model, backend, tflgpu ms, LiteRT ms, ratio, max relative error.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tflgpu.benchmark import bench_model, format_table

DEFAULT_DIR = Path(os.environ.get("TFLGPU_MODELS_DIR", Path(__file__).resolve().parents[2] / "shared" / "models"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", help="model files (default: every .tflite in --models-dir)")
    p.add_argument("--models-dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    models = [Path(m) for m in args.models] or sorted(args.models_dir.glob("*.tflite"))
    if not models:
        print(f"no models found in {args.models_dir}", file=sys.stderr)
        return 1
    rows = []
    for m in models:
        print(f"benchmarking {m.name} ...", file=sys.stderr, flush=True)
        rows.append(bench_model(m, num_threads=args.threads, warmup=args.warmup, repeats=args.repeat))
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
