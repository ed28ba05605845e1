"""Differential fuzzing with valid random models (tests/randmodels.py): each model that LiteRT runs is run on
our CPU kernels, the OpenCL device at FP32 and at FP16, and compared with LiteRT. A crash, a hang, an exception
(LiteRT ran the model, so must we) or an output off by more than the tolerance is a finding: its seed is
recorded, minimized to the fewest ops that still show it, and its model saved.

    python -m tests.fuzz_valid --seconds 600 --seed 0 [--findings DIR]   # prints one JSON line of counts

Tolerance per output: the larger of ``RTOL[path] * max|LiteRT|`` and four times LiteRT's own spread (XNNPACK
vs its builtin kernels) on that output; for a full-integer model, ``QUANT_STEPS[path]`` steps of its output
scale. FP16 storage rounds every tensor to 11 bits, which an ill-conditioned
graph (a SIN of a large SUM, a DIV of a cancellation) turns into any error at all; so the FP16 path may also
differ by eight times what LiteRT's own output moves when the inputs move that much (relative noise of 2^-11,
and all of them scaled by 1 +- 2^-11), the graph's sensitivity to FP16 rounding; and by four half-precision
steps (2^-9) of the largest value any of its tensors holds, which an op whose output is far smaller than its
input (a LOG near 1, a SUB of near-equal values) passes on whole. tests/test_fuzz_valid.py runs a bounded, fixed-seed share in
CI.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import traceback
import warnings
from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np

from tflgpu import GpuDelegate, Interpreter
from tflgpu.runtime.device import list_devices

from .randmodels import model_for

RTOL = {"cpu": 1e-4, "fp32": 1e-4, "fp16": 2e-2}
# a full-integer model's float output moves in steps of its output scale: our integer kernels reproduce LiteRT's
# arithmetic (0 steps on 60 random chains), the device's float view with quantization simulators rounds
# differently where a value lies on a step's edge (<= 1 step at FP32, <= 4 at FP16 on those 60)
QUANT_STEPS = {"cpu": 1, "fp32": 2, "fp16": 6}
FP16_MAX = 65504.0  # a graph storing a larger value has no FP16 result to compare (inf); per-tensor precision
# (issue 16's part 2) is what would keep such tensors in FP32
HANG_S = 60


class Hang(Exception):
    pass


def _alarm(*_):
    raise Hang()


def _litert(data: bytes, builtin: bool, keep_all: bool = False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ai_edge_litert.interpreter import Interpreter as LiteRT
        from ai_edge_litert.interpreter import OpResolverType
    kw = {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES} if builtin else {}
    return LiteRT(model_content=data, num_threads=1, experimental_preserve_all_tensors=keep_all, **kw)


def _largest_stored(it) -> float:
    """The largest magnitude any float tensor took in a run of ``it`` (made with ``keep_all``): FP16 storage
    rounds it to 2^-11 of that."""
    largest = 0.0
    for d in it.get_tensor_details():
        if d["dtype"] == np.float32:
            try:
                v = it.get_tensor(d["index"])
            except ValueError:  # (a tensor LiteRT keeps no buffer for)
                continue
            if v.size and np.isfinite(v).all():
                largest = max(largest, float(np.abs(v).max()))
    return largest


def _run(it, inputs) -> list[np.ndarray]:
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def check(seed: int, max_ops: int | None = None, fp16: bool = True) -> dict:
    """One model: ``{"status": "rejected"|"ok"|"finding", ...}`` with what went wrong where."""
    model = model_for(seed, max_ops)
    try:
        ref, builtin = _litert(model.data, False), _litert(model.data, True, keep_all=True)
        want = _run(ref, model.inputs)
        spread = [np.abs(a - b).max(initial=0.0) for a, b in zip(want, _run(builtin, model.inputs))]
    except Exception as e:  # noqa: BLE001 - LiteRT refuses the model: not ours to run
        return {"status": "rejected", "why": f"{type(e).__name__}: {str(e)[:120]}", "ops": model.ops}
    if not all(np.isfinite(w).all() for w in want):
        return {"status": "rejected", "why": "LiteRT's output is not finite", "ops": model.ops}
    noise = np.random.default_rng([seed, 99])
    eps = np.float32(2.0**-11)
    sensitivity = [0.0] * len(want)
    for rounded in ([x * (1 + noise.uniform(-1, 1, x.shape).astype(np.float32) * eps) for x in model.inputs],
                    [x * (1 + eps) for x in model.inputs], [x * (1 - eps) for x in model.inputs]):
        moved = _run(ref, rounded)
        sensitivity = [max(s, float(np.abs(a - b).max(initial=0.0))) for s, a, b in zip(sensitivity, want, moved)]
    largest = _largest_stored(builtin)
    half_floor = 2.0**-9 * largest
    # FP16 storage cannot hold the graph's values: the FP16 path must still run, but has no result to compare
    fp16_unheld = fp16 and largest > FP16_MAX
    paths = {"cpu": None, "fp32": GpuDelegate(cache=False)}
    if fp16:
        paths["fp16"] = GpuDelegate(cache=False, precision_loss_allowed=True)
    result = {"status": "ok", "ops": model.ops, "device_ops": 0, "fp16_out_of_range": fp16_unheld}
    for path, delegate in paths.items():
        signal.alarm(HANG_S)
        try:
            it = Interpreter(model_content=model.data, delegate=delegate)
            got = _run(it, model.inputs)
        except Hang:
            return {**result, "status": "finding", "path": path, "what": f"hang (> {HANG_S} s)"}
        except Exception as e:  # noqa: BLE001 - LiteRT ran it: any exception of ours is a finding
            frames = traceback.extract_tb(e.__traceback__)[-2:]
            where = [f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in frames]
            return {**result, "status": "finding", "path": path, "what": f"{type(e).__name__}: {str(e)[:200]}",
                    "where": where}
        finally:
            signal.alarm(0)
        if path == "fp32" and it.gpu_plan is not None:
            result["device_ops"] = it.gpu_plan.gpu_op_count
        if path == "fp16" and fp16_unheld:
            continue
        for i, (g, w, s, sens) in enumerate(zip(got, want, spread, sensitivity)):
            if g.shape != w.shape or g.dtype != w.dtype:
                return {**result, "status": "finding", "path": path,
                        "what": f"output {i}: {g.dtype}{list(g.shape)}, LiteRT {w.dtype}{list(w.shape)}"}
            err = float(np.abs(g.astype(np.float64) - w).max(initial=0.0)) if np.isfinite(g).all() else np.inf
            tol = max(RTOL[path] * float(np.abs(w).max(initial=0.0)), 4 * float(s), 1e-6,
                      max(8 * float(sens), half_floor) if path == "fp16" else 0.0,
                      QUANT_STEPS[path] * model.output_step)
            if err > tol:
                return {**result, "status": "finding", "path": path,
                        "what": f"output {i}: max error {err:.3g} > tolerance {tol:.3g} "
                                f"(max|LiteRT| {np.abs(w).max(initial=0.0):.3g}, LiteRT spread {s:.3g}, "
                                f"sensitivity to FP16 rounding {sens:.3g})"}
    return result


def minimize(seed: int, n_ops: int, fp16: bool) -> int:
    """The fewest leading ops of the model that still give a finding."""
    for k in range(1, n_ops):
        if check(seed, k, fp16)["status"] == "finding":
            return k
    return n_ops


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--seed", type=int, default=0, help="first model seed; models use seed, seed+1, ...")
    p.add_argument("--max-models", type=int, default=10**9)
    p.add_argument("--findings", type=Path, help="save each finding's (minimized) model here")
    p.add_argument("--no-fp16", action="store_true")
    args = p.parse_args(argv)
    signal.signal(signal.SIGALRM, _alarm)
    logging.getLogger("tflgpu").setLevel(logging.ERROR)  # placement notes for every model are not findings

    devices = list_devices()
    fp16 = not args.no_fp16 and bool(devices) and devices[0].identity.fp16
    stats = {"tried": 0, "rejected": 0, "ok": 0, "on_device": 0, "fp16_out_of_range": 0, "findings": [],
             "op_pairs": 0, "ops": 0}
    pairs, ops, rejected_why = set(), Counter(), Counter()
    t0, seed = time.time(), args.seed
    while time.time() - t0 < args.seconds and stats["tried"] < args.max_models:
        r = check(seed, None, fp16)
        stats["tried"] += 1
        if r["status"] == "rejected":
            stats["rejected"] += 1
            rejected_why[r["why"][:60]] += 1
        else:
            ops.update(r["ops"])
            pairs.update(pairwise(r["ops"]))
            stats["on_device"] += r["device_ops"] > 0
            stats["fp16_out_of_range"] += bool(r.get("fp16_out_of_range"))
            if r["status"] == "ok":
                stats["ok"] += 1
            else:
                k = minimize(seed, len(r["ops"]), fp16)
                r = {**check(seed, k, fp16), "seed": seed, "max_ops": k}
                if args.findings:
                    args.findings.mkdir(parents=True, exist_ok=True)
                    name = args.findings / f"valid_seed{seed}_ops{k}.tflite"
                    name.write_bytes(model_for(seed, k).data)
                    r["saved"] = str(name)
                stats["findings"].append(r)
        seed += 1
    stats["ops"], stats["op_pairs"] = len(ops), len(pairs)
    stats["rejected_top"] = rejected_why.most_common(5)
    stats["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TFLGPU_TUNING", "none")
    sys.exit(main())
