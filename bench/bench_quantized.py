#!/usr/bin/env python3
"""Quantized corpus models: accuracy against LiteRT on every path, and latency side by side with LiteRT.

    python bench/bench_quantized.py [--inputs 5] [--repeat 20] [--write-readme README.md] [MODEL ...]

For each model (default: the corpus' int8 and dynamic-range MobileNet v2) and path — tflgpu's CPU
kernels, the GpuDelegate float view in FP32 and FP16 — over ``--inputs`` random inputs U(-1, 1):
top-1 agreement with LiteRT, the largest output difference (absolute, and in quantization steps of
the model's last quantized tensor where it has one), then median latency of each path and LiteRT,
timed in alternation, and the ratio (lower is better for tflgpu).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from tflgpu import GpuDelegate, Interpreter
from tflgpu.delegate import fp16_storage
from tflgpu.benchmark import _prepare, interleaved_ms

DEFAULT_DIR = Path(os.environ.get("TFLGPU_MODELS_DIR", Path(__file__).resolve().parents[2] / "shared" / "models"))
DEFAULT_MODELS = ["mobilenet_v2_1.0_224_int8.tflite", "mobilenet_v2_1.0_224_dynrange.tflite"]


def output_step(model: Path) -> float | None:
    """The scale of the quantized tensor the (float) output is dequantized from, if any."""
    from tflgpu.cpu.quantized import qparams
    from tflgpu.model.reader import read_model

    sg = read_model(str(model)).subgraphs[0]
    out = sg.outputs[0]
    p = qparams(sg.tensors[out])
    if p is not None:
        return p.s
    for op in sg.operators:
        if out in op.outputs and op.name == "DEQUANTIZE":
            p = qparams(sg.tensors[op.inputs[0]])
            return p.s if p is not None else None
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*")
    p.add_argument("--models-dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--inputs", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--write-readme", type=Path, metavar="README", help="write the tables into this README too")
    args = p.parse_args()
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    models = [Path(m) for m in args.models] or [args.models_dir / m for m in DEFAULT_MODELS]
    paths = {"CPU": None, "OpenCL FP32": GpuDelegate(), "OpenCL FP16": GpuDelegate(**fp16_storage())}
    acc_rows, speed_rows = [], []
    for m in models:
        print(f"{m.name} ...", file=sys.stderr, flush=True)
        step = output_step(m)
        ref = LiteRT(model_path=str(m), num_threads=args.threads)
        ref.allocate_tensors()
        d_in, d_out = ref.get_input_details()[0], ref.get_output_details()[0]
        rng = np.random.default_rng(2026)
        xs = [rng.uniform(-1, 1, d_in["shape"]).astype(d_in["dtype"]) for _ in range(args.inputs)]
        its = {}
        for name, delegate in paths.items():
            it = Interpreter(str(m), num_threads=args.threads, delegate=delegate)
            it.allocate_tensors()
            its[name] = it
        for name, it in its.items():
            top1, worst = 0, 0.0
            for x in xs:
                outs = []
                for interp in (ref, it):
                    interp.set_tensor(interp.get_input_details()[0]["index"], x)
                    interp.invoke()
                    outs.append(interp.get_tensor(d_out["index"]).astype(np.float64))
                top1 += int(outs[0].argmax() == outs[1].argmax())
                worst = max(worst, float(np.abs(outs[0] - outs[1]).max()))
            plan = it.gpu_plan
            where = "CPU" if plan is None else f"{plan.gpu_op_count} on device, {plan.cpu_op_count} on CPU"
            steps = f"{worst / step:.2f}" if step else "—"
            acc_rows.append(f"| {m.name} | {name} | {where} | {top1}/{len(xs)} | {worst:.3g} | {steps} |")
        inputs = [xs[0]]
        prepared = {name: _prepare(Interpreter, m, inputs, num_threads=args.threads, delegate=delegate)
                    for name, delegate in paths.items()}
        prepared["LiteRT"] = _prepare(LiteRT, m, inputs, num_threads=args.threads)
        ms = dict(zip(prepared, interleaved_ms(list(prepared.values()), rounds=args.repeat, warmup=3)))
        cells = " | ".join(f"{ms[k]:.2f} ({ms[k] / ms['LiteRT']:.2f}×)" for k in paths)
        speed_rows.append(f"| {m.name} | {ms['LiteRT']:.2f} | {cells} |")
    lines = ["| model | path | placement | top-1 = LiteRT | max abs diff | max diff in output steps |",
             "|---|---|---|---:|---:|---:|", *acc_rows, "",
             "| model | LiteRT ms | " + " | ".join(f"tflgpu {k} ms (ratio)" for k in paths) + " |",
             "|---|---:|" + "---:|" * len(paths), *speed_rows]
    print("\n".join(lines))
    if args.write_readme:
        from readme_section import measured_on, replace_section

        replace_section(args.write_readme, "bench_quantized", measured_on() + "\n\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
