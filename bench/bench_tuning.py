#!/usr/bin/env python3
"""Tuning report over the corpus on the OpenCL device: per model, end-to-end latency with heuristic
parameters vs tuned ("fast" and "exhaustive", each from an empty record database), the tuning wall
time, the ratio to LiteRT (XNNPACK, same thread count), and the transfer start: the model with no record
of its own, its kernels taking the records of the other models' exhaustive runs (by family and nearest
shape), with the share of the exhaustive gain that start already has. All four run in one process, invoked in
alternation, so the machine's drift hits them alike. The device's FP32 peak is measured in the same
run with an FMA-bound kernel; "conv % peak" is the tuned CONV_2D kernels' flops over their time, the flops
counted as a direct convolution would do them ("direct-equivalent"): a layer the tuner gave the Winograd
variant does fewer multiplications than that, so the figure can pass 100% of the peak.

    python bench/bench_tuning.py [--models-dir ../shared/models] [--exhaustive-budget-s 120] [MODEL ...]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from tflgpu import GpuDelegate, Interpreter
from tflgpu.delegate import fp16_storage
from tflgpu.autotune import MemoryTuningDB, TuningConfig
from tflgpu.benchmark import _prepare, fma_peak_gflops, interleaved_ms, reference_inputs

DEFAULT_DIR = Path(os.environ.get("TFLGPU_MODELS_DIR", Path(__file__).resolve().parents[2] / "shared" / "models"))


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def conv_gflops(plan) -> float | None:
    """Tuned CONV_2D kernels: total flops / total time (every layer counted)."""
    ks = [k for k in plan.tuning_results if k.op == "CONV_2D" and k.flops]
    t = sum(k.best_us * k.layers for k in ks)
    return sum(k.flops * k.layers for k in ks) / t / 1e3 if t else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*")
    p.add_argument("--models-dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=30, help="interleaved invokes per interpreter")
    p.add_argument("--fast-budget-s", type=float, default=None, help="per model (default: the fast mode's)")
    p.add_argument("--exhaustive-budget-s", type=float, default=120.0, help="per model")
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp32")
    args = p.parse_args()
    models = [Path(m) for m in args.models] or sorted(args.models_dir.glob("*.tflite"))
    fp16 = args.precision == "fp16"
    try:
        from ai_edge_litert.interpreter import Interpreter as LiteRT
    except ImportError:
        LiteRT = None
    peak = fma_peak_gflops()
    print(f"FP32 FMA peak of the OpenCL device, measured: {peak:.0f} GFLOP/s\n")
    print("| model | LiteRT ms | heuristic ms | fast ms (speedup, tuning s) | exhaustive ms (speedup, tuning s) "
          "| transfer start ms (share of the exhaustive gain) | exhaustive / LiteRT "
          "| conv GFLOP/s, direct-equivalent (% peak) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    # pass 1: tune every model from empty records, fast and exhaustive, keeping each run's records
    dbs, secs = {}, {}
    for m in models:
        print(f"tuning {m.name} ...", file=sys.stderr, flush=True)
        inputs = reference_inputs(Interpreter(model_path=str(m)).get_input_details())
        for mode, budget in (("fast", args.fast_budget_s), ("exhaustive", args.exhaustive_budget_s)):
            dbs[m, mode] = MemoryTuningDB()
            cfg = TuningConfig(mode=mode, budget_s=budget, db=dbs[m, mode])
            t0 = time.perf_counter()
            # cache=False: every plan here is built (and tuned) from scratch, none loaded
            _prepare(Interpreter, m, inputs, delegate=GpuDelegate(**fp16_storage(fp16), tuning=cfg, cache=False))
            secs[m, mode] = time.perf_counter() - t0
    # pass 2: per model, its plans from those records (no search), and the transfer start: the records of every
    # OTHER model's exhaustive run, which this model's kernels take by family and nearest shape; all timed in
    # alternation with the heuristics and LiteRT
    fast_x, exh_x, shares = [], [], []
    for m in models:
        inputs = reference_inputs(Interpreter(model_path=str(m)).get_input_details())

        def plan_from(db, m=m, inputs=inputs):
            return _prepare(Interpreter, m, inputs, delegate=GpuDelegate(**fp16_storage(fp16), tuning="none",
                                                                         tuning_db=db, cache=False))

        others = MemoryTuningDB()
        for o in models:
            if o != m:
                for dev, key, rec in dbs[o, "exhaustive"].items():
                    others.put(dev, key, rec)
        heur = plan_from(False)
        if heur.gpu_plan is None:
            print(f"| {m.name} | no OpenCL device |")
            continue
        its = [heur, plan_from(dbs[m, "fast"]), plan_from(dbs[m, "exhaustive"]), plan_from(others)]
        ref = _prepare(LiteRT, m, inputs, num_threads=args.threads) if LiteRT is not None else None
        ms = interleaved_ms(its + ([ref] if ref is not None else []), rounds=args.rounds)
        h, f, e, t = ms[:4]
        lite = ms[4] if ref is not None else None
        fast_x.append(h / f)
        exh_x.append(h / e)
        share = (h - t) / (h - e) if h - e > 0.02 * h else None  # (no gain to share: within timing noise)
        if share is not None:
            shares.append(share)
        g = conv_gflops(its[2].gpu_plan)
        print(f"| {m.name} | " + (f"{lite:.2f}" if lite else "-") + f" | {h:.2f} | {f:.2f} ({h / f:.2f}x, "
              f"{secs[m, 'fast']:.0f}) | {e:.2f} ({h / e:.2f}x, {secs[m, 'exhaustive']:.0f}) | {t:.2f} ("
              + (f"{100 * share:.0f}%" if share is not None else "no gain to share") + ") | "
              + (f"{e / lite:.2f}x | " if lite else "- | ")
              + (f"{g:.0f} ({100 * g / peak:.0f}%)" if g else "") + " |", flush=True)
    print(f"\ngeomean speedup over heuristics: fast {geomean(fast_x):.2f}x, exhaustive {geomean(exh_x):.2f}x "
          f"({len(exh_x)} models)" + (f"; the transfer start has {100 * sum(shares) / len(shares):.0f}% of the "
                                      f"exhaustive gain on average ({len(shares)} models with a gain)" if shares else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
