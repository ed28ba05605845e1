#!/usr/bin/env python3
"""What a tuning candidate's compile costs on an OpenCL device, and how much of it is per build rather than per
kernel: for the first few tunable kernels of a model, N candidates (the default's one-knob neighbours, the first
points of every search) built one program each, as the tuner builds them, against all N in one program (each
candidate's kernels renamed apart). Where one build of N is much faster than N builds, the driver's cost is mostly
fixed per build, and a search would gain by compiling its next candidates together.

    python bench/compile_cost.py MODEL [--device D] [--n 8] [--kernels 3]
"""

from __future__ import annotations

import argparse
import re
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--device", default=None)
    p.add_argument("--n", type=int, default=8, help="candidates per kernel")
    p.add_argument("--kernels", type=int, default=3, help="tunable kernels to measure")
    args = p.parse_args()

    import tflgpu.runtime.tuning as rt
    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.autotune.tuner import CandidateRejected, KernelTuner
    from tflgpu.kernels.program import build_program
    from tflgpu.runtime.icd import ensure_icd_vendors

    ensure_icd_vendors()
    import pyopencl as cl

    measured = []

    def measure(tasks, bench_for, device_key, config):
        for task in tasks:
            if len(measured) >= args.kernels:
                break
            bench = bench_for(task)
            tuner = KernelTuner(task, bench, device_key, mode="exhaustive", trials=None)
            candidates = []
            for params in tuner.neighbors():
                try:
                    candidates.append(tuner._specs(params))
                except CandidateRejected:
                    continue
                if len(candidates) == args.n:
                    break
            if len(candidates) < 2:
                continue
            t = time.perf_counter()
            for specs in candidates:
                build_program(cl, bench.ctx, [s.source for s in specs], bench.fp16)
            apart = time.perf_counter() - t
            sources = [re.sub(rf"\b{re.escape(s.name)}\b", f"{s.name}_c{i}", s.source)
                       for i, specs in enumerate(candidates) for s in specs]
            t = time.perf_counter()
            build_program(cl, bench.ctx, sources, bench.fp16)
            together = time.perf_counter() - t
            n = len(candidates)
            measured.append((apart, together))
            print(f"{task.op} {task.shape}: {n} builds {apart:.2f} s ({apart / n * 1e3:.0f} ms each), one build of "
                  f"{n} {together:.2f} s ({apart / together:.1f}x)", flush=True)
        return []

    rt.tune_tasks = measure  # (the plan's tuning step hands its tasks here instead of searching)
    it = Interpreter(model_path=args.model, delegate=GpuDelegate(device=args.device, cache=False,
                                                                 tuning="exhaustive", tiered_compile=False))
    print(f"device: {it.backend}")
    if measured:
        apart, together = map(sum, zip(*measured))
        print(f"all: {apart:.2f} s apart, {together:.2f} s together ({apart / together:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
