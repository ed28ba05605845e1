#!/usr/bin/env python3
"""What a launch-saving graph rule buys, as whole plans interleaved in one process with LiteRT beside them
(medians of ``--rounds``; ``tuning="none"``, the shipped records): the plan as built, and the plan with one rule
off at a time:

- between: a merged block's unary ops between its two ops (graph.passes._unary_chain: a quantized model's
  QUANT_SIM after a depthwise conv, an expansion, a head's MEAN) keep it apart again;
- prelu: PRELU is no fused op (ops.traits): its own kernel after the conv (U-Net's);
- concat-views: no ``fold_reshapes`` (an SSD head's reshapes launch again before their concatenation);
- tensordot: no ``fold_tensordot`` (a Tensordot's reshapes to rows and back launch again around its FC);
- moves: no ``fold_moves`` (moves in a row, a reshape after a transpose or a gather, launch a kernel each again);
- swish: no ``fuse_swish`` (a swish's LOGISTIC and MUL launch a kernel of their own after x's producer again);
- spectra: no ``fuse_spectra`` (an STFT's RFFT2D and the part taken of its complex values run on the CPU kernels
  again, the frames copied to the host and the spectrum back);
- channel-pad: a PAD adding zero channels (a residual block's skip branch) is no operand a fused op reads through
  (graph.passes._channel_pad_input): it launches again, its ADD with it;
- pool-read: a MAX_POOL is no operand a fused op reads through (graph.passes._pool_read): it launches again;
- cpu-groups: a CPU device's small kernels that name no work-group get none (the runtime's choice) instead of one
  per compute unit (kernels.base.Target.work_group);
- hoist: no step moves before a producer to make a fused op's operand in time (graph.passes.fuse_elementwise's
  ``_runs_earlier``: a BlazeBlock's MAX_POOL after its conv in op order); its ADD launches again;
- gates: no ``fuse_gates`` (a squeeze-and-excitation gate's mean and two dense ops launch three kernels again);
- gate-scales: no ``fold_gate_scales`` (a gate's MUL launches again before the conv reading its output);
- narrow-scatter: a transposed conv of fewer than 4 channels takes the scatter form's slice-wide kernel instead of
  its narrow one (kernels.conv.narrow_scatter: a segmentation mask's last layer);
- input-prologue: no ``fuse_input_prologue`` (a quantized model's QUANTIZE of its float input launches again);
- sim-clamp: a quantized model's float view leaves each op's fused activation on the op instead of moving it
  into the quantization simulator after it (graph.float_view.movable_clamp: two clamps per stored value).

Each variant's outputs are checked against the plan's; a rule that changes nothing in a model builds the same plan.

    python bench/pass_ab.py MODEL... [--off between,prelu,concat-views,tensordot,moves,swish,spectra,channel-pad,pool-read,hoist,cpu-groups,gates,gate-scales,narrow-scatter,input-prologue,sim-clamp] [--device D] [--rounds 40] [--gpu-target]

``--gpu-target``: the plans under a GPU's target on whatever device (its defaults and passes; launch counts, not
a GPU's times).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys

import numpy as np


def _rule_patches(name: str) -> list[tuple[object, str, object]]:
    """What turning the named rule off replaces: (owner, attribute, replacement) each; an owner may be a dict (a key)."""
    from tflgpu.graph import float_view, passes
    from tflgpu.kernels import conv
    from tflgpu.kernels.base import Target
    from tflgpu.ops import traits
    from tflgpu.runtime import selection

    no_pass = lambda steps, sg, consts, allowed: (steps, 0)
    no_plain_pass = lambda steps, sg, consts: (steps, 0)  # (a pass that takes no veto)
    rules = {
        "between": lambda: [(passes, "_unary_chain", lambda view, t, sg, consts: passes._Between((), t))],
        "prelu": lambda: [(traits._TABLE, "PRELU", dataclasses.replace(traits._TABLE["PRELU"], fusable=None))],
        "concat-views": lambda: [(selection, "fold_reshapes", no_pass)],
        "tensordot": lambda: [(selection, "fold_tensordot", no_plain_pass)],
        "moves": lambda: [(selection, "fold_moves", no_pass)],
        "swish": lambda: [(selection, "fuse_swish", no_plain_pass)],
        "spectra": lambda: [(selection, "fuse_spectra", no_plain_pass)],
        "channel-pad": lambda: [(passes, "_channel_pad_input", lambda step, sg, consts: None)],
        "pool-read": lambda: [(passes, "_pool_read", lambda step, sg: None)],
        "hoist": lambda: [(passes, "_runs_earlier", lambda step, sg, made: False)],
        "cpu-groups": lambda: [(Target, "work_group", lambda self, global_size: None)],
        "gates": lambda: [(selection, "fuse_gates", no_pass)],
        "gate-scales": lambda: [(selection, "fold_gate_scales", no_pass)],
        "narrow-scatter": lambda: [(conv, "narrow_scatter", lambda cout, ep: False)],
        "input-prologue": lambda: [(selection, "fuse_input_prologue", no_pass)],
        "sim-clamp": lambda: [(float_view, "movable_clamp", lambda op, params: None)],
    }
    if name not in rules:
        raise ValueError(f"unknown rule {name!r} (one of {', '.join(rules)})")
    return rules[name]()


@contextlib.contextmanager
def rule_off(name: str):
    """The named rule off while a plan is built (its steps selected)."""
    patches = _rule_patches(name)

    def get(owner, key):
        return owner[key] if isinstance(owner, dict) else getattr(owner, key)

    def put(owner, key, value):
        if isinstance(owner, dict):
            owner[key] = value
        else:
            setattr(owner, key, value)

    kept = [(owner, key, get(owner, key)) for owner, key, _ in patches]
    for owner, key, value in patches:
        put(owner, key, value)
    try:
        yield
    finally:
        for owner, key, value in kept:
            put(owner, key, value)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--off", default="between,prelu,concat-views", help="comma-separated rules to turn off, one at a time")
    p.add_argument("--device", default=None)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--gpu-target", action="store_true")
    a = p.parse_args()
    from tflgpu.runtime.icd import ensure_icd_vendors

    ensure_icd_vendors()
    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.benchmark import interleaved_ms, reference_inputs
    from tflgpu.kernels.base import Target

    if a.gpu_target:
        Target.of = classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True, max_group=1024))
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    rules = [r.strip() for r in a.off.split(",") if r.strip()]
    for m in a.models:
        feeds = reference_inputs(Interpreter(model_path=m).get_input_details())

        def made(off: str | None, m=m, feeds=feeds):
            with rule_off(off) if off else contextlib.nullcontext():
                it = Interpreter(m, delegate=GpuDelegate(device=a.device, tuning="none", tiered_compile=False,
                                                         cache=False))
                it.allocate_tensors()
            for d, x in zip(it.get_input_details(), feeds):
                it.set_tensor(d["index"], x)
            it.invoke()
            return it

        variants = {"plan": made(None), **{f"{r} off": made(r) for r in rules}}
        peer = LiteRT(model_path=m, num_threads=os.cpu_count())
        peer.allocate_tensors()
        for d, x in zip(peer.get_input_details(), feeds):
            peer.set_tensor(d["index"], x)
        outs = {name: [it.get_tensor(o["index"]) for o in it.get_output_details()] for name, it in variants.items()}
        ms = interleaved_ms([*variants.values(), peer], rounds=a.rounds)
        plan = variants["plan"].gpu_plan
        print(f"## {m.split('/')[-1]} ({plan.device.identity.device}{', a GPU target' if a.gpu_target else ''}), "
              f"ms, interleaved, median of {a.rounds}; LiteRT {ms[-1]:.3f}")
        for (name, it), t in zip(variants.items(), ms):
            err = max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
                      for x, y in zip(outs[name], outs["plan"]))
            conv = sum(1 for o in it.gpu_plan.sg.outputs if o not in it.gpu_plan.make.dense)
            print(f"  {name}: {t:.3f} ({t / ms[0]:.2f}x the plan, {t / ms[-1]:.2f}x LiteRT; "
                  f"{it.gpu_plan.launch_count()} launches + {conv} output conversions; outputs within {err:.2g} "
                  f"of the plan's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
