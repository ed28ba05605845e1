#!/usr/bin/env python3
"""First start, as a new user meets it: every corpus model in fresh processes with every cache empty
(tflgpu's, XDG_CACHE_HOME, so pyopencl's too, and numba's: NUMBA_CACHE_DIR, which a new install has empty),
default options, then the same model warm.

Per model, the median of ``--runs`` fresh processes of each kind:

- default (tiered compile, background tuning): seconds to ``allocate_tensors()`` returning and to the first
  result (from ``Interpreter(...)``, imports not counted: they are shown apart), the steady latency right after
  the first invoke (quick build), when the optimized program was installed, the steady latency 15 s after start
  (and its ratio to a ``tuning="none"`` interpreter's in the same process, timed in alternation),
  invoke latency (median and 90th percentile) while the background search runs vs after it finished, for an
  application that invokes every ``--gap-ms`` for half a second and then pauses for a second (the pauses are
  when the search compiles; it never starts a compile within 0.5 s of an invoke), and the steady latency once
  the search is done, with the steady latency of a ``tuning="none"`` interpreter in the same process, timed in
  alternation (so "tuned vs none" is a ratio from one process);
- ``tuning="none"``, no tiering (the plan as it was built before tiering): start and steady latency, the level
  the default must reach within 15 s;
- ``tuning="fast"``, no tiering (the blocking search, as the default was): start and steady latency;
- warm: a fresh process on the cache the default run filled (default options).

Steady latency = median of 20 back-to-back invokes (no idle time between them, so no search runs).

    python bench/bench_startup.py [--runs 3] [--budget-s 60] [--cold-only] [--models-dir DIR] [MODEL ...]

``--cold-only --write-readme README.md`` also writes the first-start table (every corpus model, plus the
synthetic MediaPipe-sized model built by ``bench/make_mediapipe_sized.py``) into the README's
``bench_startup`` section, with the date, the device and this command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_DIR = Path(os.environ.get("TFLGPU_MODELS_DIR", Path(__file__).resolve().parents[2] / "shared" / "models"))

CHILD = r"""
import json, statistics, sys, time
t0 = time.perf_counter()
import numpy as np
from tflgpu import GpuDelegate, Interpreter
from tflgpu.benchmark import reference_inputs
import_s = time.perf_counter() - t0
model, kind, budget, gap, horizon = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]) / 1e3, 15.0
opts = {"default": {"tuning_budget_s": budget}, "start": {"tuning_budget_s": budget},
        "none": {"tuning": "none", "tiered_compile": False},
        "fast": {"tuning": "fast", "tiered_compile": False}}[kind]

def steady(it, n=20):
    ts = []
    for _ in range(n):
        a = time.perf_counter(); it.invoke(); ts.append(time.perf_counter() - a)
    return 1e3 * statistics.median(ts)

def gapped(it, cycles=5, n=25, pause=1.0):
    # an application that invokes every `gap` for a while, then pauses (when the search can compile):
    # (median, 90th percentile) of its invoke latencies, ms
    ts = []
    for _ in range(cycles):
        for _ in range(n):
            time.sleep(gap); a = time.perf_counter(); it.invoke(); ts.append(time.perf_counter() - a)
        time.sleep(pause)
    ts.sort()
    return 1e3 * statistics.median(ts), 1e3 * ts[int(0.9 * len(ts))]

def plain():
    # the same model with heuristics only, optimized build, nothing stored or read (no records: not the shipped
    # ones either): the "none" baseline
    p = Interpreter(model, delegate=GpuDelegate(tuning="none", tiered_compile=False, cache=False, tuning_db=False))
    p.allocate_tensors()
    for d, x in zip(p.get_input_details(), reference_inputs(p.get_input_details())):
        p.set_tensor(d["index"], x)
    return p

def interleaved(a, b, rounds=15, block=4):
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(steady(a, block)); tb.append(steady(b, block))
    return statistics.median(ta), statistics.median(tb)

start = time.perf_counter()
it = Interpreter(model, delegate=GpuDelegate(**opts))
it.allocate_tensors()
ready = time.perf_counter() - start
for d, x in zip(it.get_input_details(), reference_inputs(it.get_input_details())):
    it.set_tensor(d["index"], x)
it.invoke()
out = {"import_s": import_s, "ready_s": ready, "first_result_s": time.perf_counter() - start,
       "steady_start_ms": steady(it), "phases": it.startup_report()}
if kind == "default":
    optimized_at = None
    while time.perf_counter() - start < horizon:  # bursts, each with idle time after it, until 15 s
        ms = steady(it, 5)
        if optimized_at is None and it.gpu_plan.build_stats["tier"] == "optimized":
            optimized_at = time.perf_counter() - start
        time.sleep(0.2)
    out["optimized_at_s"] = optimized_at
    baseline = plain()  # (built now: its compile would have slowed the start)
    out["steady_15s_ms"], out["steady_15s_none_ms"] = interleaved(it, baseline)
    st = it.tuning_status()
    busy = st is not None and not st.finished
    done0 = st.kernels_done if st is not None else 0
    out["during_ms"] = gapped(it) if busy else None
    st = it.tuning_status()
    out["searched_during"] = (st.kernels_done - done0) if st is not None else 0
    it.wait_background()
    out["after_ms"] = gapped(it)
    st = it.tuning_status()
    out["tuning"] = None if st is None else {"searched": st.kernels_searched, "improved": st.kernels_improved,
                                             "seconds": st.seconds, "kernel_speedup": st.speedup}
    out["steady_tuned_ms"], out["steady_none_ms"] = interleaved(it, baseline)
elif kind == "fast":
    out["steady_ms"], out["steady_none_ms"] = interleaved(it, plain())
else:
    out["steady_ms"] = steady(it, 30)
print(json.dumps(out))
"""


def child(model: Path, kind: str, cache: str, budget: float, gap_ms: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TFLGPU_TUNING", "TFLGPU_TIERED_COMPILE",
                                                            "PYOPENCL_NO_CACHE")}
    env.update(TFLGPU_CACHE_DIR=str(Path(cache) / "tflgpu"), XDG_CACHE_HOME=cache,
               NUMBA_CACHE_DIR=str(Path(cache) / "numba"))
    r = subprocess.run([sys.executable, "-c", CHILD, str(model), kind, str(budget), str(gap_ms)], env=env,
                       capture_output=True, text=True, timeout=1800, check=False)
    if r.returncode:
        raise RuntimeError(f"{model.name} ({kind}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def med(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*")
    p.add_argument("--models-dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--runs", type=int, default=3, help="fresh processes of each kind per model (the median)")
    p.add_argument("--budget-s", type=float, default=60.0, help="background tuning budget per model")
    p.add_argument("--gap-ms", type=float, default=20.0, help="idle time between the invokes timed during tuning")
    p.add_argument("--cold-only", action="store_true",
                   help="only the first start of each kind (no 15 s timeline, no background tuning wait)")
    p.add_argument("--write-readme", type=Path, metavar="README",
                   help="with --cold-only: write the first-start table into this README's bench_startup section")
    args = p.parse_args()
    if args.write_readme and not args.cold_only:
        p.error("--write-readme writes the first-start table: use it with --cold-only")
    models = [Path(m) for m in args.models] or sorted(args.models_dir.glob("*.tflite"))
    synthetic: list[Path] = []
    if args.write_readme:
        from make_mediapipe_sized import build

        tmp = tempfile.TemporaryDirectory(prefix="tflgpu-mediapipe-sized-")  # removed at exit
        synthetic = [Path(tmp.name) / "mediapipe_sized.tflite"]
        synthetic[0].write_bytes(build())
    readme_rows = []
    kinds = ["none", "fast"] if not args.cold_only else ["none"]
    print("| model | MB | ready s | first result s | steady at start ms | optimized at s | steady at 15 s ms "
          "| none: first result s / steady ms | fast: first result s / steady ms | fast vs none (same process) "
          "| invoke during / after search: median, p90 ms | tuned vs none (same process) | warm first result s "
          "| import s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in models + synthetic:
        print(f"{m.name} ...", file=sys.stderr, flush=True)
        rows: dict[str, list[dict]] = {k: [] for k in ["default", "warm", *kinds]}
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="tflgpu-startup-") as d:
                # --cold-only: the default start (its background search left for later), without the timeline
                rows["default"].append(child(m, "start" if args.cold_only else "default", d, args.budget_s,
                                             args.gap_ms))
                rows["warm"].append(child(m, "start", d, args.budget_s, args.gap_ms))
            for k in kinds:
                with tempfile.TemporaryDirectory(prefix="tflgpu-startup-") as d:
                    rows[k].append(child(m, k, d, args.budget_s, args.gap_ms))
        dft = rows["default"]

        def pair(key: str, dft=dft) -> str:
            vals = [r[key] for r in dft if r.get(key)]
            if not vals:
                return "-"
            return f"{statistics.median(v[0] for v in vals):.2f}, {statistics.median(v[1] for v in vals):.2f}"

        def ratio(rs: list[dict], key: str, base: str = "steady_none_ms") -> str:
            vals = [r[key] / r[base] for r in rs if r.get(key) and r.get(base)]
            return f"{statistics.median(vals):.3f}x" if vals else "-"

        fast = f"{fmt(med(rows['fast'], 'first_result_s'))} / {fmt(med(rows['fast'], 'steady_ms'))}" \
            if rows.get("fast") else "-"
        print(f"| {m.name} | {m.stat().st_size / 1e6:.1f} | {fmt(med(dft, 'ready_s'))} | "
              f"{fmt(med(dft, 'first_result_s'))} | {fmt(med(dft, 'steady_start_ms'))} | "
              f"{fmt(med(dft, 'optimized_at_s'), 1)} | {fmt(med(dft, 'steady_15s_ms'))} "
              f"({ratio(dft, 'steady_15s_ms', 'steady_15s_none_ms')} of none) | "
              f"{fmt(med(rows['none'], 'first_result_s'))} / {fmt(med(rows['none'], 'steady_ms'))} | {fast} | "
              f"{ratio(rows.get('fast', []), 'steady_ms')} | {pair('during_ms')} / {pair('after_ms')} | "
              f"{ratio(dft, 'steady_tuned_ms')} | {fmt(med(rows['warm'], 'first_result_s'), 3)} | "
              f"{fmt(med(dft, 'import_s'))} |", flush=True)
        label = f"{m.stem} (synthetic)" if m in synthetic else m.stem
        readme_rows.append(f"| {label} | {m.stat().st_size / 1e6:.1f} | {fmt(med(dft, 'first_result_s'))} | "
                           f"{fmt(med(dft, 'ready_s'))} | {fmt(med(rows['none'], 'first_result_s'))} | "
                           f"{fmt(med(rows['warm'], 'first_result_s'), 3)} |")
        for r in dft:
            if r.get("tuning"):
                print(f"    background search: {json.dumps(r['tuning'])}, searched during the timed window: "
                      f"{r.get('searched_during')}", file=sys.stderr)
    if args.write_readme:
        from readme_section import measured_on, replace_section

        header = [("| model | MB | first result s | allocate_tensors() returned s | no tiering: first result s "
                   "| warm: first result s |"), "|---|---:|---:|---:|---:|---:|"]
        replace_section(args.write_readme, "bench_startup",
                        measured_on() + f" Median of {args.runs} fresh processes each.\n\n"
                        + "\n".join(header + readme_rows))
        print(f"wrote the first-start table into {args.write_readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
