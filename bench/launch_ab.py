#!/usr/bin/env python3
"""Launch-level choices for a plan bound by the host's enqueues (a GPU behind NVIDIA's OpenCL: 10-16 us to enqueue
one kernel), each as a whole plan, interleaved in one process (medians of ``--rounds``):

- start: the plan a user gets before any search (``tuning="none"``, the shipped records);
- fused: that plan with every separable block it splits in two launches (``SeparableKnobs.default``'s rule, from
  kernel times alone) fused into one;
- fused, 4 slices: the same with each work-item taking 4 output slices (4 depthwise slices a step): a group covers
  4x the output slices, so each depthwise value is recomputed by 4x fewer groups (a 512-channel block's
  group tile of 8 slices computes each 16 times);
- work-groups: that plan with a work-group size for each kernel its generator leaves to the driver (the stem conv,
  the split blocks' depthwise halves): the largest divisor of each dimension of the global size that keeps the
  group within 32 along x and 128 work-items in all (``--group``), which the kernels accept as they read no local
  ids; NVIDIA's enqueue took ~5 us more for a kernel without one;
- both (fused and work-groups);
- expansions: the start plan built with ``GpuDelegate(fuse_expansions=True)``: each separable block and the
  pointwise conv expanding its output (the next MobileNet v2 block's first conv) as one kernel
  (kernels.separable_expand), one launch per such block instead of two;
- all: expansions, every split block fused, and the work-groups;
- unpacked: the start plan with each constant array its own buffer, as generated (kernels.program.PACK_CONSTANTS
  off): a launch then takes 2-3 more buffers (a separable block's, 7 instead of 4), which NVIDIA's enqueue
  charges for (11.4 us at 4 buffers, 13.0 at 7 on an H100);
- expand-dw: the start plan with each expansion and the depthwise conv reading it (MobileNet v2's blocks of more
  than 384 expanded channels, which the start launches as three kernels) fused into one (kernels.expand_depthwise);
- queued / direct: the start plan launching through pyopencl (an event asked of each launch) / with no event each
  (runtime.enqueue.Launcher), neither flushing: the two a GPU plan's cadence trial chooses between, pinned.

Each variant's outputs are checked against the start's. What it tells: whether fewer launches pay for more kernel
time (fused), and whether a work-group chosen here costs the kernels more than it saves the host (work-groups).

    python bench/launch_ab.py MODEL... [--device D] [--rounds 40]

(a variant whose plan has nothing to change is the start's plan again, timed as itself)
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def work_group(global_size: tuple[int, ...], x_cap: int = 32, items: int = 128) -> tuple[int, ...]:
    """A work-group dividing ``global_size``: as wide along x as a divisor within ``x_cap`` allows, then the last
    dimension, then the middle one, within ``items`` work-items."""
    gs = list(global_size)
    local = [1] * len(gs)
    local[0] = divisor_at_most(gs[0], x_cap)
    for d in reversed(range(1, len(gs))):
        local[d] = divisor_at_most(gs[d], max(1, items // int(np.prod(local))))
    return tuple(local)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--device", default=None)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--variants", default=None, help="comma-separated names of the variants to time (default: all; "
                                                    "the start is always timed, as the base)")
    a = p.parse_args()
    from tflgpu.runtime.icd import ensure_icd_vendors

    ensure_icd_vendors()
    import pyopencl as cl

    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.benchmark import interleaved_ms, reference_inputs
    from tflgpu.kernels import program
    from tflgpu.runtime.cadence import NEVER, Cadence, CadenceTrial
    from tflgpu.runtime.upgrades import retune_steps

    fused, wide = {"fused": True}, {"fused": True, "tile_s": 4, "k_chunk": 4}
    for m in a.models:
        def made(fused: dict | None, groups: bool, expansions: bool = False, packed: bool = True,
                 cadence: Cadence | None = None, expand_dw: bool = False, m=m):
            program.PACK_CONSTANTS = packed  # (read where a plan compiles and binds its kernels)
            try:
                it = Interpreter(m, delegate=GpuDelegate(device=a.device, tuning="none", tiered_compile=False,
                                                         cache=False, fuse_expansions=expansions))
            finally:
                program.PACK_CONSTANTS = True
            it.allocate_tensors()
            details = it.get_input_details()
            for d, x in zip(details, reference_inputs(details)):
                it.set_tensor(d["index"], x)
            plan = it.gpu_plan
            split = [s.op.index for s in plan.steps if s.device == "gpu" and s.op.name == "TFLGPU_SEPARABLE_CONV"
                     and len(s.specs) == 2]
            if fused and split:
                retune_steps(plan, split, fused, "TFLGPU_SEPARABLE_CONV")
                it.invoke()  # (installs them)
            blocks = [s.op.index for s in plan.steps if s.device == "gpu" and s.op.name == "TFLGPU_EXPAND_DEPTHWISE"]
            if expand_dw and blocks:
                retune_steps(plan, blocks, {"fused": True}, "TFLGPU_EXPAND_DEPTHWISE")
                it.invoke()  # (installs them)
            if cadence is not None:  # (pinned: one candidate, chosen at once)
                plan.cadence = CadenceTrial(plan.launch_count(), (cadence,))
            given = 0
            if groups:
                for s in plan.steps:
                    for spec in s.specs if s.device == "gpu" else ():
                        if spec.local_size is None:
                            spec.local_size = work_group(spec.global_size)
                            given += 1
            buffers = [sum(isinstance(v, cl.MemoryObjectHolder) for v in args) for step in plan.io.args.values()
                       for args in step]
            return it, plan.launch_count(), len(split), given, sum(buffers) / max(len(buffers), 1)

        recipes = {"start": lambda: made(None, False), "fused": lambda: made(fused, False),
                   "fused, 4 slices": lambda: made(wide, False), "work-groups": lambda: made(None, True),
                   "both": lambda: made(fused, True), "expansions": lambda: made(None, False, True),
                   "all": lambda: made(fused, True, True), "unpacked": lambda: made(None, False, packed=False),
                   "expand-dw": lambda: made(None, False, expand_dw=True),
                   "queued": lambda: made(None, False, cadence=NEVER),
                   "direct": lambda: made(None, False, cadence=Cadence(direct=True))}
        wanted = recipes if a.variants is None else ["start", *(v.strip() for v in a.variants.split(","))]
        unknown = [v for v in wanted if v not in recipes]
        if unknown:
            p.error(f"unknown variant(s) {unknown}; choose among {list(recipes)}")
        variants = {name: recipes[name]() for name in dict.fromkeys(wanted)}
        outs = {}
        for name, (it, *_) in variants.items():
            it.invoke()
            outs[name] = [it.get_tensor(o["index"]) for o in it.get_output_details()]
        ms = interleaved_ms([v[0] for v in variants.values()], rounds=a.rounds)
        base = ms[0]
        print(f"## {m.split('/')[-1]} ({variants['start'][0].gpu_plan.device.identity.device}), ms, "
              f"interleaved, median of {a.rounds}")
        for (name, (_, launches, split, given, buffers)), t in zip(variants.items(), ms):
            err = max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
                      for x, y in zip(outs[name], outs["start"]))
            print(f"  {name}: {t:.3f} ({base / t:.2f}x the start; {launches} launches, {buffers:.1f} buffers each, "
                  f"{split} split blocks seen, {given} work-groups given; outputs within {err:.2g} of the start's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
