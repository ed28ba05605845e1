#!/usr/bin/env python3
"""Time a fixed list of knob points for every conv / depthwise kernel of some models on one OpenCL device, each
checked against the heuristic default's outputs (``KernelTuner.evaluate``): the data a device class's heuristic
is fitted from, gathered in one run (on a lent GPU, where time is short and a budgeted search reaches few
points). Prints one line per kernel (shape, default, best point) and writes every timing as JSON lines.

    python bench/gpu_sweep.py MODEL... [--out sweep.jsonl] [--deadline-s 300] [--device D]
    python bench/gpu_sweep.py --pointwise 7x7x960x160 14x14x576x96 ...   (lone 1x1 convs: HxWxCINxCOUT)

(``--pointwise``: 1x1 convs at the shapes given, each as a one-conv model, at the pointwise GEMM's points and
the sum's splits among them; a model's own pointwise convs, which a GPU plan launches inside composite steps,
are swept as those steps' parts.)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TFLGPU_SEPARABLE_CONV", "TFLGPU_POOLED_DENSE",
       "TFLGPU_EXPAND_DEPTHWISE")
GEMM = {"tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": None, "strided": False}  # (GPU default: strided)
POINTS = {
    "pointwise": [dict(GEMM, group_tile=g, k_chunk=kc, tile_x=tx, tile_s=ts, k_split=1)  # (the default may split)
                  for g, tx, ts, kc in (((32, 8), 1, 1, 8), ((16, 4), 1, 1, 8), ((32, 2), 1, 1, 8), ((16, 4), 2, 2, 16),
                                        ((8, 8), 4, 1, 8), ((16, 16), 1, 1, 8), ((8, 8), 1, 1, 8), ((32, 2), 2, 2, 8),
                                        ((32, 8), 1, 1, 16), ((32, 8), 1, 1, 4))]
                 # the sum shared by k_split work-items per output (ConvKnobs.k_split): more, shorter sums
                 + [dict(GEMM, group_tile=g, k_chunk=kc, tile_x=tx, tile_s=ts, k_split=ks)
                    for g, tx, ts, kc, ks in (((8, 8), 1, 1, 8, 4), ((8, 8), 1, 1, 4, 4), ((16, 4), 1, 1, 8, 4),
                                              ((32, 2), 1, 1, 8, 4), ((16, 4), 1, 2, 8, 4), ((8, 8), 1, 1, 8, 2),
                                              ((16, 4), 1, 1, 16, 4),
                                              # 8 shares: where the device's work-groups take 512 work-items
                                              ((16, 4), 1, 1, 8, 8), ((16, 4), 1, 1, 4, 8), ((8, 8), 1, 1, 4, 8),
                                              ((32, 2), 1, 1, 4, 8))]
                 # each step read one step ahead into registers (ConvKnobs.prefetch): the default's tile and the
                 # sweeps' best split points
                 + [dict(GEMM, group_tile=g, k_chunk=kc, tile_x=1, tile_s=1, k_split=ks, prefetch=True)
                    for g, kc, ks in (((32, 8), 8, 1), ((16, 4), 8, 4), ((16, 4), 16, 4), ((8, 8), 8, 4),
                                      ((16, 4), 4, 8))]
                 # the GEMM sharing its input through sub-group broadcasts (where the device has sub-groups)
                 + [dict(GEMM, group_tile=None, broadcast=ls, tile_x=tx) for ls in (16, 64) for tx in (1, 4)],
    "one pixel": [dict(GEMM, split=sp, tile_s=ts) for sp in (8, 16, 32, 64) for ts in (1, 2)],
    "conv": [dict(GEMM, tile_x=tx, tile_s=ts, strided=st) for tx, ts, st in
             ((1, 1, False), (1, 2, False), (2, 1, True), (2, 2, True), (4, 1, True), (1, 4, False), (2, 2, False))]
            + [dict(GEMM, local_size=(32, 1, 1))]
            # the direct kernel's weights through the texture path (where the device has images)
            + [dict(GEMM, tile_x=tx, tile_s=ts, strided=True, image_weights=True) for tx, ts in ((2, 1), (2, 2))]
            # its input lanes loaded one by one where a tile lies inside the image (a 16-lane CPU's default)
            + [dict(GEMM, tile_x=tx, tile_s=ts, strided=True, mem_lanes=True) for tx, ts in ((2, 1), (2, 2))],
    # a conv with a window as an implicit GEMM over its taps (kernels.conv.im2col_stage), where its space has it
    "implicit GEMM": [dict(GEMM, group_tile=g, k_chunk=kc, k_split=ks)
                      for g, kc, ks in (((32, 8), 8, 1), ((16, 4), 8, 1), ((8, 8), 16, 1), ((8, 8), 8, 4), ((16, 4), 8, 4))]
                     + [dict(GEMM, group_tile=g, k_chunk=kc, k_split=ks, prefetch=True)
                        for g, kc, ks in (((32, 8), 8, 1), ((16, 4), 8, 4))],
    "depthwise": [{"tile_x": tx, "slices": s, "vec_hint": None, "local_size": None} for tx in (1, 2) for s in (1, 2)],
    "fully_connected": [{"split": sp, "tile_s": ts, "wide": False} for sp in (1, 8, 16, 32, 64) for ts in (1, 2)],
    # a classifier's head (kernels.pooled_dense): unfused, and groups of 128 to 1,024 work-items (where the device's
    # work-groups take them: the space says)
    "pooled dense": [{"fused": False}] + [{"fused": True, "group": g} for g in ((8, 128), (8, 256), (16, 256), (4, 256),
                                                                          (8, 512), (4, 512), (8, 1024), (4, 1024))],
    # a depthwise + pointwise block (kernels.separable): unfused, the group tile's shapes, the direct variant
    "separable": [{"fused": False}]
                 + [{"fused": True, "group_tile": g, "k_chunk": kc, "tile_x": tx, "tile_s": ts, "lanes": 4, "per": 1,
                     "whole": False} for g, tx, ts, kc in (((32, 8), 1, 1, 8), ((16, 4), 1, 1, 8), ((8, 8), 1, 1, 8),
                                                           ((64, 4), 1, 1, 8), ((32, 8), 1, 1, 4), ((16, 4), 2, 2, 4))]
                 + [{"fused": True, "group_tile": g, "k_chunk": kc, "tile_x": 1, "tile_s": 1, "lanes": 4, "per": 1,
                     "whole": False, "k_split": ks} for g, kc, ks in (((16, 4), 8, 4), ((8, 8), 8, 4), ((8, 8), 4, 4),
                                                                      ((16, 4), 4, 2))]
                 + [{"fused": True, "group_tile": g, "k_chunk": kc, "tile_x": 1, "tile_s": 1, "lanes": 4, "per": 1,
                     "whole": False, "k_split": ks, "prefetch": True} for g, kc, ks in (((32, 8), 8, 1), ((8, 8), 8, 1),
                                                                                        ((16, 4), 8, 4), ((8, 8), 8, 4))]
                 + [{"fused": True, "group_tile": None, "tile_x": tx, "tile_s": ts, "lanes": 4, "per": 1, "whole": False}
                    for tx, ts in ((1, 1), (2, 1), (1, 2))],
    # an expansion and its depthwise conv (kernels.expand_depthwise): unfused, and fused with tiles of a whole image
    # (up to 16 rows) or 2-8 rows by 1-8 expanded slices, 64-256 work-items (points over local memory are refused)
    "expand depthwise": [{"fused": False}] + [{"fused": True, "rows": r, "slices": s, "group": g}
                                              for r, s, g in ((16, 1, 128), (16, 2, 128), (16, 1, 64), (16, 4, 256),
                                                              (8, 1, 128), (4, 2, 128), (2, 4, 128), (16, 1, 256))],
}


def points(task) -> list[dict]:
    if task.op == "TFLGPU_EXPAND_DEPTHWISE":
        return POINTS["expand depthwise"]
    if task.op == "TFLGPU_SEPARABLE_CONV":
        return POINTS["separable"]
    if task.op == "TFLGPU_POOLED_DENSE":
        return POINTS["pooled dense"]
    if task.op == "DEPTHWISE_CONV_2D":
        return POINTS["depthwise"]
    if task.op == "FULLY_CONNECTED":
        return POINTS["fully_connected"]
    if "split" in task.space:
        return POINTS["one pixel"]
    if task.default.get("group_tile") is not None:  # (a GPU's pointwise default: the GEMM)
        return POINTS["pointwise"]
    return POINTS["conv"] + (POINTS["implicit GEMM"] if "group_tile" in task.space else [])


def pointwise_model(h: int, w: int, cin: int, cout: int) -> bytes:
    """A model of one 1x1 CONV_2D (seeded weights) on an h x w x cin input."""
    import numpy as np

    from tflgpu.model.builder import ModelBuilder

    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, h, w, cin))
    wts = b.const("w", rng.standard_normal((cout, 1, 1, cin)).astype(np.float32) / np.sqrt(cin))
    bias = b.const("b", rng.standard_normal(cout).astype(np.float32))
    y = b.tensor("y", (1, h, w, cout))
    b.op("CONV_2D", [x, wts, bias], [y], padding="VALID", stride_w=1, stride_h=1, fused_activation_function="RELU6")
    b.output(y)
    return b.build()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*")
    p.add_argument("--pointwise", nargs="*", default=[], metavar="HxWxCINxCOUT")
    p.add_argument("--out", default="sweep.jsonl")
    p.add_argument("--deadline-s", type=float, default=300.0)
    p.add_argument("--device", default=None)
    p.add_argument("--records", help="write each kernel's best point as this device's tuning records to this file "
                                     "(tflgpu tune --export's format: what tflgpu/data/tuning ships)")
    args = p.parse_args()

    import tflgpu.runtime.tuning as rt
    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.autotune.exchange import DeviceRecords, write_records
    from tflgpu.autotune.tuner import KernelTuner, TuneResult

    end = time.perf_counter() + args.deadline_s
    out = open(args.out, "a")  # noqa: SIM115 - appended to by every kernel the plan builds call back for
    seen: set[str] = set()
    found: dict[str, DeviceRecords] = {}

    def sweep(tasks, bench_for, device_key, config):
        for task in tasks:
            if task.key in seen or task.op not in OPS or time.perf_counter() > end:
                continue
            seen.add(task.key)
            bench = bench_for(task)
            tuner = KernelTuner(task, bench, device_key, mode="exhaustive", trials=None)
            try:
                default_us = tuner.measure_default()
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"{task.op} {task.shape}: default failed: {e}")
                continue
            rows = []
            for point in points(task):
                if any(k not in task.space for k in point):
                    continue
                params = {**task.default, **point}
                tuner.best_us = float("inf")  # (time every point in full: no early discard)
                us = tuner.evaluate(params)
                rows.append((us, point))
                out.write(json.dumps({"op": task.op, "shape": task.shape, "key": task.key, "default": task.default,
                                      "default_us": default_us, "point": point, "us": us}, default=str) + "\n")
            ok = [r for r in rows if r[0] is not None]
            best = min(ok, key=lambda r: r[0]) if ok else (None, None)
            print(f"{task.op[:6]} {task.shape!s:34s} default {default_us:8.1f} us  best {best[0] or 0:8.1f} us "
                  f"{best[1]}  ({len(ok)}/{len(rows)} ok, {tuner.rejected} rejected {tuner.reasons[:1]})", flush=True)
            out.flush()
            if best[1] is not None and args.records:
                params = {**task.default, **best[1]} if best[0] < default_us else dict(task.default)
                result = TuneResult(task.key, task.op, params, default_us, min(best[0], default_us),
                                    trials=len(ok) + 1)
                dev = found.setdefault(device_key, DeviceRecords(bench.device.identity.as_dict()))
                dev.records[task.key] = task.record(result)
                write_records(args.records, list(found.values()))
        return []

    rt.tune_tasks = sweep
    tmp = Path(tempfile.mkdtemp(prefix="gpu_sweep_"))
    models = list(args.models)
    if args.pointwise:
        for dims in args.pointwise:
            models.append(tmp / f"pointwise_{dims}.tflite")
            models[-1].write_bytes(pointwise_model(*map(int, dims.split("x"))))
    for m in models:
        if time.perf_counter() > end:
            break
        print(f"# {Path(m).name}", flush=True)
        # (a fresh cache with the database: a composite step's unfused parts are tuning tasks only where the plan
        # has the records chain, runtime.tuning._identities; every point is still timed from the heuristics)
        Interpreter(model_path=m, delegate=GpuDelegate(device=args.device, serialization_dir=tmp / "cache",
                                                       tuning="exhaustive")).allocate_tensors()
    return 0


if __name__ == "__main__":
    sys.exit(main())
