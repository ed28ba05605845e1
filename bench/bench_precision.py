#!/usr/bin/env python3
"""Per-op FP16 precision on every corpus model: each output's error against LiteRT's FP32 output, and the share
of intermediate bytes the FP16 plan stores as half, with the FP16 and FP32 plans' latency in the same run.

    python bench/bench_precision.py [--models-dir ../shared/models] [--repeat 20] [MODEL ...]

The error is max |tflgpu FP16 - LiteRT FP32| over max |LiteRT FP32| on the corpus' test inputs (uniform in
[-1, 1], seed 0, as ``tflgpu.benchmark.reference_inputs``; an integer output, an index, counts the same way). The
FP16 plans use the default calibration and error budget, no tuning. Latencies: the FP16 and FP32 plans' and LiteRT's
(XNNPACK, 2 threads) invokes interleaved in one process; medians, as ratios to LiteRT's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from tflgpu import GpuDelegate, Interpreter
from tflgpu.delegate import fp16_storage
from tflgpu.benchmark import interleaved_ms, reference_inputs

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "shared" / "models"


def _run(it, inputs) -> list[np.ndarray]:
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", type=Path)
    p.add_argument("--models-dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    paths = args.models or sorted(args.models_dir.glob("*.tflite"))
    print("| model | max rel. error, FP16 vs LiteRT FP32 (per output) | FP16 bytes | ops kept FP32 "
          "| FP16 / LiteRT | FP32 / LiteRT |")
    print("|---|---|---:|---:|---:|---:|")
    for path in paths:
        ref = LiteRT(str(path), num_threads=2)
        ref.allocate_tensors()
        inputs = reference_inputs(ref.get_input_details())
        want = _run(ref, inputs)
        its = {fp16: Interpreter(str(path), delegate=GpuDelegate(**fp16_storage(fp16), tuning="none",
                                                                   cache=False)) for fp16 in (True, False)}
        for it in its.values():
            it.allocate_tensors()
        got = _run(its[True], inputs)
        errors = [float(np.abs(g.astype(np.float64) - w).max(initial=0.0)) / max(float(np.abs(w).max(initial=0.0)),
                                                                                    1e-30)
                  for g, w in zip(got, want)]
        plan = its[True].gpu_plan
        for it in its.values():
            for d, x in zip(it.get_input_details(), inputs):
                it.set_tensor(d["index"], x)
        fp16_ms, fp32_ms, ref_ms = interleaved_ms([its[True], its[False], ref], rounds=args.repeat)
        kept = f"{len(plan.precision.fp32)} of {len(plan.runner.steps)}" if plan.fp16 else "(no fp16)"
        print(f"| {path.stem} | {', '.join(f'{e:.2g}' for e in errors)} | {plan.io.fp16_share:.1%} | {kept} "
              f"| {fp16_ms / ref_ms:.2f} | {fp32_ms / ref_ms:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
