"""The ``tflgpu`` command line: run, inspect, bench, tune, warmup, cache."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def _default_model() -> Path:
    from .model.default_model import DEFAULT_MODEL_PATH

    return DEFAULT_MODEL_PATH


def _describe(arr: np.ndarray, limit: int = 8, whole: int = 16) -> str:
    """An output in one line: all of it when it has at most ``whole`` values, else its first ``limit``, with
    min / max / mean and the top class per row."""
    flat = arr.reshape(-1)
    if flat.size <= whole:
        limit = flat.size
    head = np.array2string(flat[:limit], precision=5, separator=", ")
    stats = ""
    if arr.size and arr.dtype.kind in "fiub":
        a = arr.astype(np.float64)
        stats = f" min {a.min():.5g} max {a.max():.5g} mean {a.mean():.5g}"
        if arr.ndim >= 1 and arr.shape[-1] > 1:
            stats += f" argmax(last axis) {np.argmax(arr.reshape(-1, arr.shape[-1]), axis=-1)[:4].tolist()}"
    return f"{head}{' ...' if flat.size > limit else ''}{stats}"


def _delegate(args):
    if getattr(args, "delegate", "gpu") != "gpu":
        ignored = [flag for flag, on in (("--precision fp16", getattr(args, "precision", "fp32") != "fp32"),
                                         ("--profile", getattr(args, "profile", False)),
                                         ("--fuse-expansions", getattr(args, "fuse_expansions", None)),
                                         ("--device", getattr(args, "device", None) is not None)) if on]
        if ignored:
            print(f"note: with --delegate cpu, {', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} ignored "
                  f"(options of the GPU delegate)", file=sys.stderr)
        return None
    from .delegate import GpuDelegate

    return GpuDelegate(precision_loss_allowed=args.precision == "fp16", device=args.device,
                       profile=getattr(args, "profile", False),
                       fuse_expansions=getattr(args, "fuse_expansions", None))


class _StartupProgress(logging.Handler):
    """Start-up phases on stderr, once the start has taken more than a second (a quick start stays quiet)."""

    def __init__(self, after_s: float = 1.0):
        super().__init__(logging.INFO)
        self.t0, self.after_s, self.held = time.perf_counter(), after_s, None

    def emit(self, record: logging.LogRecord) -> None:
        elapsed = time.perf_counter() - self.t0
        if elapsed < self.after_s:
            self.held = record  # (shown if this phase is still running after the first second)
            return
        if self.held is not None:
            self._show(self.held, elapsed)
            self.held = None
        self._show(record, elapsed)

    def _show(self, record: logging.LogRecord, elapsed: float) -> None:
        print(f"  [{elapsed:4.1f} s] {record.getMessage()}", file=sys.stderr, flush=True)

    def __enter__(self):
        logger = logging.getLogger("tflgpu.startup")
        self._level, self._propagate = logger.level, logger.propagate
        logger.setLevel(logging.INFO)
        logger.propagate = logger.isEnabledFor(logging.DEBUG) or logging.getLogger().level <= logging.INFO
        logger.addHandler(self)
        self._watch = threading.Timer(self.after_s, self._late)
        self._watch.daemon = True
        self._watch.start()
        return self

    def _late(self) -> None:
        if self.held is not None:
            self._show(self.held, time.perf_counter() - self.t0)
            self.held = None

    def __exit__(self, *exc):
        self._watch.cancel()
        logger = logging.getLogger("tflgpu.startup")
        logger.removeHandler(self)
        logger.setLevel(self._level)
        logger.propagate = self._propagate
        return False


def _plan_words(interp) -> str:
    """What the start did, in a plain sentence."""
    plan = interp.gpu_plan
    if plan is None:
        return ""
    st = plan.build_stats
    if st["plan"] == "cache" and not st["source_builds"]:
        words = ["the plan and its compiled kernels came from the cache"]
    elif st["tier"] == "quick":
        words = ["compiled the kernels quickly, without the compiler's optimizations; the optimized build runs "
                 "in the background"]
    elif st["source_builds"]:
        words = ["compiled the kernels with the compiler's optimizations"]
    elif st.get("memory_loads"):
        words = ["built the plan; its kernels were compiled earlier in this process"]
    else:
        words = ["built the plan; its compiled kernels came from the cache"]
    tuned = sum(1 for k in plan.tuning_results if k.source == "tuned")
    if tuned:
        words.append(f"searched the best parameters of {tuned} kernels")
    status = interp.tuning_status()
    if status is not None and status.kernels_left:
        words.append(f"{status.kernels_left} kernels are searched in the background while idle")
    if plan.store is not None and st["plan"] != "cache":
        words.append("everything is stored in the cache for the next start")
    return "; ".join(words)


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _require_files(models) -> None:
    """Every model file exists, checked before any work starts (a missing last model fails at once); a URL is named
    as one, with what to do (models are read from files)."""
    missing = [str(m) for m in models if not Path(m).exists()]
    urls = [m for m in missing if _URL.match(m)]
    if urls:
        more = f" (URLs given: {', '.join(urls)})" if len(urls) > 1 else ""
        raise ValueError(f"tflgpu reads models from files, not URLs: download the model first (curl -LO {urls[0]}) "
                         f"and pass the file's path{more}")
    if missing:
        raise ValueError(f"model file not found: {', '.join(missing)}")
    odd = [str(m) for m in models if not Path(m).is_file()]
    if odd:
        raise ValueError(f"not a regular file (a directory, a pipe or a device): {', '.join(odd)}")


def _threads(args) -> int:
    """The CPU thread count of run and bench alike: --threads, else every core."""
    return args.threads or os.cpu_count() or 1


_NPY_MAGIC, _ZIP_MAGIC = b"\x93NUMPY", b"PK\x03\x04"


def _load_input(f: str) -> np.ndarray:
    """One --input file's array; what is wrong with it named (numpy's own words for a file that is no .npy speak of
    pickled data)."""
    try:
        with open(f, "rb") as fh:
            magic = fh.read(len(_NPY_MAGIC))
        if magic.startswith(_ZIP_MAGIC):
            raise ValueError("it is an .npz archive: pass one .npy file per model input, as numpy.save writes")
        if magic != _NPY_MAGIC:
            raise ValueError("it is not a .npy file, which starts with NumPy's magic string: write it with numpy.save")
        return np.load(f, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ValueError(f"--input {f}: cannot read it as a .npy array ({e})") from e


def _input_problem(f: str, x: np.ndarray, d: dict, resize: bool) -> str | None:
    """What keeps an --input array from being the model input ``d`` (None: nothing; with ``resize``, an input of the
    same rank is resized to it), and what to do."""
    from .interpreter import takes_value_type

    want_type, want = np.dtype(d["dtype"]), [int(v) for v in d["shape"]]
    if not takes_value_type(want_type, x.dtype, want_type.kind == "S"):
        head = f"--input {f} holds {x.dtype.name}, the model's input {d['name']!r} takes {want_type.name}"
        scale, zero = d["quantization"]
        if scale and x.dtype.kind == "f" and want_type.kind in "iu":
            shift = f" {'+' if zero > 0 else '-'} {abs(zero)}" if zero else ""
            return (f"{head}, quantized: save numpy.round(x / {scale!r}){shift} as {want_type.name} (its scale and "
                    f"zero point)")
        return f"{head}: save it as {want_type.name} (x.astype(numpy.{want_type.name}))"
    if list(x.shape) == want or (resize and x.ndim == len(want)):
        return None
    head = f"--input {f} has shape {list(x.shape)}, the model's input {d['name']!r} {want}"
    if list(x.shape) == want[1:] and want[:1] == [1]:
        return f"{head}: add the batch dimension (save x[None])"
    if x.ndim != len(want):
        return f"{head}: save it with {len(want)} dimensions"
    return f"{head}: pass --resize to resize the model's input to it"


def _output_dir(path: str, flag: str = "--save") -> Path:
    """An output directory (``--save``'s, ``--trace``'s), created if missing, before the model runs."""
    d = Path(path)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot create the directory ({e.strerror or e})") from e
    return d


def cmd_run(args) -> int:
    from .benchmark import reference_inputs, resized, time_invokes
    from .interpreter import Interpreter
    from .runtime import ShapeError

    _require_files([args.model] if args.model else [])
    path = Path(args.model) if args.model else _default_model()
    save_dir = _output_dir(args.save) if args.save else None
    given = [_load_input(f) for f in args.input] if args.input else None  # (a bad file fails before the model)
    t0 = time.perf_counter()
    with _StartupProgress():
        interp = Interpreter(model_path=str(path), num_threads=_threads(args), delegate=_delegate(args))
        details = interp.get_input_details()
        if given is not None:
            if len(given) != len(details):
                print(f"error: the model has {len(details)} inputs, {len(given)} --input files given", file=sys.stderr)
                return 2
            for f, x, d in zip(args.input, given, details):
                if (problem := _input_problem(f, x, d, args.resize)) is not None:
                    raise ValueError(problem)
            if args.resize:
                resized(interp, [x.shape for x in given])  # (before the first allocation: a stored size may not run)
        try:
            interp.allocate_tensors()
        except ShapeError as e:
            if given is not None and args.resize:
                raise
            how = "pass --resize to run it at the --input arrays' shapes" if given is not None else \
                "with tflgpu run: --input FILE.npy --resize, an array of the shape to run"
            raise ShapeError(f"{e}; {how}") from e
    init_s = time.perf_counter() - t0
    inputs = given if given is not None else reference_inputs(details, seed=args.seed)
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    print(f"model:   {path} ({path.stat().st_size:,} bytes)")
    print(f"device:  {interp.backend}; {_threads(args)} CPU threads")
    for d, x in zip(interp.get_input_details(), inputs):
        src = "file" if args.input else f"uniform(-1,1), seed {args.seed}"
        print(f"input:   {d['name']} {np.dtype(d['dtype']).name}{[int(s) for s in d['shape']]} ({src})")
    interp.invoke()
    first_s = time.perf_counter() - t0
    print(f"start:   {init_s:.2f} s to a ready interpreter, first result at {first_s:.2f} s")
    words = _plan_words(interp)
    if words:
        print(f"         ({words})")
    from .runtime.startup import format_phases

    print("         " + format_phases(interp.startup_report()))
    for d in interp.get_output_details():
        y = interp.get_tensor(d["index"])
        print(f"output:  {d['name']} {y.dtype.name}{list(y.shape)}: {_describe(y)}")
        if save_dir is not None:
            out = save_dir / f"output_{d['index']}.npy"
            np.save(out, y)
            print(f"         saved to {out}")
    status = interp.tuning_status()
    if status is not None and not status.finished:
        what = "the background work (optimized build, then tuning)" if args.wait_tuning else "the optimized build"
        print(f"waiting for {what} before timing ...", file=sys.stderr, flush=True)
        interp.wait_background(tuning=args.wait_tuning)
        if args.wait_tuning:
            s = interp.tuning_status()
            print(f"tuning:  {s.kernels_searched} kernels searched in {s.seconds:.1f} s, {s.kernels_improved} "
                  f"faster than their defaults (kernel time {s.speedup:.2f}x)")
            if s.plan_start_us:
                print(f"         together, end to end: {s.plan_tuned_us / 1e3:.2f} ms against the start's "
                      f"{s.plan_start_us / 1e3:.2f} ms: " + ("the start's kernels put back" if s.reverted else "kept"))
    times = time_invokes(interp, warmup=1, repeats=args.repeat)
    print(f"latency: median {1e3 * statistics.median(times):.2f} ms, min {1e3 * min(times):.2f} ms "
          f"over {len(times)} invokes (after 1 warm-up)")
    plan = interp.gpu_plan
    if plan is not None and len(plan.cadences) > 1 and plan.cadence.chosen is not None:
        print(f"         queue: {plan.cadence.chosen} (the fastest of its first invokes' trial)")
    return 0


def cmd_devices(args) -> int:
    from .runtime.device import list_devices

    devices = list_devices()
    if args.json:
        print(json.dumps([d.identity.as_dict() | {"index": d.index} for d in devices], indent=2))
        return 0
    if not devices:
        print("no OpenCL device found (GpuDelegate will run models on the CPU kernels)")
    for d in devices:
        i = d.identity
        print(f"#{d.index} {i.device_type:4s} {i.device} | platform {i.platform} | driver {i.driver_version} | "
              f"{i.opencl_c_version} | fp16 {'yes' if i.fp16 else 'no'} | {i.compute_units} CUs | "
              f"{i.global_mem_bytes / 2**30:.1f} GiB")
    return 0


def _allocated(interp, args):
    """``interp`` resized to --input-shape, its tensors allocated (a plan waiting for its inputs' shapes is built
    here, or says why it cannot be)."""
    from .benchmark import resized

    resized(interp, args.input_shape).allocate_tensors()
    return interp


def cmd_memory(args) -> int:
    from .delegate import GpuDelegate, fp16_storage
    from .interpreter import Interpreter

    interp = _allocated(Interpreter(model_path=args.model, delegate=GpuDelegate(
        **fp16_storage(args.precision == "fp16"), device=args.device, tuning="none")), args)  # (a CPU device too)
    plan = interp.gpu_plan
    if plan is None:
        print("no OpenCL device: nothing is planned")
        return 1
    print(f"device: {interp.backend}")
    print(f"intermediate tensors: {plan.naive_bytes:,} bytes if each had its own buffer")
    print(f"planned:              {plan.planned_bytes:,} bytes in {len(plan.buffers)} shared buffers "
          f"({plan.planned_bytes / max(plan.naive_bytes, 1):.0%})")
    print(f"constants (weights):  {plan.const_bytes:,} bytes")
    return 0


def cmd_passes(args) -> int:
    from .delegate import GpuDelegate
    from .graph import passes
    from .interpreter import Interpreter

    # inspection never searches (tuning="none"); recorded parameters still apply
    interp = _allocated(Interpreter(model_path=args.model, delegate=GpuDelegate(device=args.device, tuning="none")),
                        args)
    plan = interp.gpu_plan
    if plan is None:
        print("no OpenCL device: the passes run when a plan is built")
        return 1
    print(f"graph passes, in order ({passes.__name__}):")
    for name, n in plan.pass_counts.items():
        print(f"  {name:18s} {n:4d} op(s)")
    kernels = sum(len(s.specs) for s in plan.steps if s.device == "gpu")  # (a linked concatenation has none)
    print(f"device steps: {kernels} kernels for {plan.gpu_op_count} ops; "
          f"{plan.cpu_op_count} ops on the CPU")
    return 0


def cmd_precision(args) -> int:
    """Which ops of an FP16 plan keep FP32 storage, and why (runtime.precision)."""
    from .delegate import GpuDelegate, fp16_storage
    from .graph.precision import STORAGE_CAST
    from .interpreter import Interpreter
    from .runtime.config import DEFAULT_FP16_ERROR_BUDGET

    budget = DEFAULT_FP16_ERROR_BUDGET if args.fp16_error_budget is None else args.fp16_error_budget
    interp = _allocated(Interpreter(model_path=args.model, delegate=GpuDelegate(
        **fp16_storage(), device=args.device, tuning="none", fp16_error_budget=budget)), args)  # (a CPU device too)
    plan = interp.gpu_plan
    if plan is None:
        print("no OpenCL device: nothing is planned")
        return 1
    print(f"device: {interp.backend}")
    if not plan.fp16:
        print("the device has no cl_khr_fp16: every tensor is stored in FP32")
        return 0
    choice, sg = plan.precision, plan.sg
    casts = sum(1 for s in plan.steps for op, _ in s.members if op.name == STORAGE_CAST)
    error = f"{choice.error:.2g}" if choice.error >= 0 else "not calibrated"
    print(f"FP16 plan: {len(choice.fp32)} of {plan.gpu_op_count + plan.cpu_op_count} ops keep FP32 storage, "
          f"{casts} storage casts; output error on the calibration inputs {error} (budget {budget:g}); "
          f"{plan.io.fp16_share:.1%} of intermediate bytes stored as half")
    ops = {op.index: op for op in sg.operators}
    for index, why in sorted(choice.fp32.items()):
        op = ops.get(index)
        if op is None:
            continue
        tensors = ", ".join(f"'{sg.tensors[t].name}' {list(sg.tensors[t].shape)}" for t in op.outputs if t >= 0)
        print(f"  {op.name} (node {index}) -> {tensors}: {why}")
    return 0


def cmd_inspect(args) -> int:
    from .cpu import supported_ops
    from .interpreter import tensor_details
    from .model import read_model

    if args.devices:
        return cmd_devices(args)
    if not args.model:
        print("error: inspect needs a MODEL (or --devices)", file=sys.stderr)
        return 2
    _require_files([args.model])
    if args.memory:
        return cmd_memory(args)
    if args.passes:
        return cmd_passes(args)
    if args.precision == "report":
        return cmd_precision(args)
    if args.startup:
        return cmd_startup(args)
    model = read_model(args.model)
    cpu_ops = set(supported_ops())
    from .graph.bidirectional import BIDIRECTIONAL, UNIDIRECTIONAL
    from .graph.stablehlo import BUILTIN_FOR
    from .kernels import gpu_ops

    opencl_ops = set(gpu_ops())
    # (ops a device plan rewrites into ones the device has kernels for, at float32: graph.stablehlo, .bidirectional)
    rewritten = {name: to for name, to in {**BUILTIN_FOR, BIDIRECTIONAL: UNIDIRECTIONAL}.items() if to in opencl_ops}
    census = model.op_census()
    report = {
        "model": str(args.model),
        "size_bytes": model.size_bytes,
        "subgraphs": len(model.subgraphs),
        "inputs": [_brief(tensor_details(model.main.tensors[i])) for i in model.main.inputs],
        "outputs": [_brief(tensor_details(model.main.tensors[i])) for i in model.main.outputs],
        "ops": {name: {"count": n, "cpu": name in cpu_ops, "opencl": name in opencl_ops,
                       **({"opencl_as": rewritten[name]} if name in rewritten else {})}
                for name, n in census.items()},
        "signatures": {s.key: {"inputs": list(s.inputs), "outputs": list(s.outputs)} for s in model.signature_defs},
    }
    view = _float_view_census(model)
    if view is not None:  # what GpuDelegate runs on the device: the float view's ops, QUANTIZE/DEQUANTIZE folded
        report["float_view"] = {name: {"count": n, "opencl": name in opencl_ops} for name, n in view.items()}
        for name, info in report["ops"].items():
            if name not in view:
                info["float_view"] = "folded into the float view (see below)"
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"model: {args.model} ({model.size_bytes:,} bytes, {len(model.subgraphs)} subgraph(s))")
    for kind in ("inputs", "outputs"):
        for t in report[kind]:
            print(f"{kind[:-1]:7s} #{t['index']:<4d} {t['name']}  {t['dtype']}{t['shape']}")
    print(f"{'op':32s} {'count':>5s}  cpu  opencl")
    for name, info in report["ops"].items():
        opencl = info.get("float_view") or ("yes" if info["opencl"] else "no (runs on cpu)")
        if "opencl_as" in info:
            opencl = f"float32 as {info['opencl_as']}; else no (runs on cpu)"
        print(f"{name:32s} {info['count']:5d}  {'yes' if info['cpu'] else 'NO ':3s}  {opencl}")
    if report.get("float_view"):
        print("the OpenCL device runs this quantized model's float view (weights dequantized once, QUANT_SIM "
              "ops keeping activations on the integer grid; what `tflgpu run` counts):")
        for name, info in report["float_view"].items():
            print(f"    {name:28s} {info['count']:5d}       {'yes' if info['opencl'] else 'no (runs on cpu)'}")
    print("(opencl: a generator exists; shapes/attributes it cannot take still fall back, see `tflgpu run -v`)")
    for key, sig in report["signatures"].items():
        print(f"signature {key!r}: inputs {sig['inputs']} outputs {sig['outputs']}")
    return 0


def _float_view_census(model) -> dict[str, int] | None:
    """Op name -> count of the float view GpuDelegate builds for a quantized model's main subgraph (None for a
    float model, or when the view cannot be built: its quantized ops then stay on the CPU integer kernels)."""
    from collections import Counter

    from .cpu.executor import ModelRunner
    from .graph.float_view import needs_float_view
    from .runtime.selection import transform_graph

    if not needs_float_view(model.main):
        return None
    runtime = ModelRunner(model)
    runtime.build_all()
    graph = transform_graph(runtime.runner(0), quantized_models_allowed=True)
    if graph.quant_io is None:
        return None
    return dict(sorted(Counter(op.name for op in graph.runner.sg.operators).items()))


def cmd_startup(args) -> int:
    """One start of the model as the user's code would make it (cache as it is), and where the time went."""
    from .benchmark import reference_inputs
    from .interpreter import Interpreter

    t0 = time.perf_counter()
    with _StartupProgress():
        interp = _allocated(Interpreter(model_path=str(args.model), delegate=_delegate(args)), args)
        for d, x in zip(interp.get_input_details(), reference_inputs(interp.get_input_details())):
            interp.set_tensor(d["index"], x)
        interp.invoke()
    total = time.perf_counter() - t0
    report = interp.startup_report()
    if args.json:
        print(json.dumps({"model": str(args.model), "first_result_s": total, "phases_s": report,
                          "plan": interp.gpu_plan.build_stats if interp.gpu_plan is not None else None}, indent=2))
        return 0
    print(f"model: {args.model}: first result after {total:.2f} s")
    words = _plan_words(interp)
    if words:
        print(f"({words})")
    for k, v in report.items():
        print(f"  {k:20s} {v:7.3f} s")
    return 0


def _brief(d: dict) -> dict:
    return {"index": d["index"], "name": d["name"], "shape": [int(s) for s in d["shape"]],
            "dtype": np.dtype(d["dtype"]).name}


def cmd_bench(args) -> int:
    from .benchmark import bench_model, format_table

    models = args.models or [str(_default_model())]
    _require_files(models)
    traces = _trace_paths(args.trace, models) if args.trace else {}  # (checked before any work)
    if traces and args.delegate != "gpu":
        raise ValueError("--trace records the OpenCL device's timeline: it needs --delegate gpu")
    rows = []
    on_cpu = _delegate(args) is None  # (says which options --delegate cpu ignores)
    for m in models:
        kwargs = {} if on_cpu else {"delegate": _delegate(args)}
        rows.append(bench_model(m, num_threads=_threads(args), warmup=args.warmup, repeats=args.repeat,
                                compare=not args.no_compare, interpreter_kwargs=kwargs, input_shapes=args.input_shape))
        print(f"  {rows[-1].model}: {rows[-1].tflgpu_ms:.2f} ms ({rows[-1].backend})", file=sys.stderr)
    print(f"{_threads(args)} CPU threads for tflgpu's CPU kernels and LiteRT alike; timed in alternation")
    print(format_table(rows))
    if args.profile and args.delegate == "gpu":
        from .benchmark import kernel_profile

        for m in models:
            print(f"\nper-kernel profile of {Path(m).name} (OpenCL events, one invoke):")
            print(kernel_profile(m, _delegate(args), input_shapes=args.input_shape))
    if traces:
        from .trace import write_trace

        for m, out in traces.items():
            doc = write_trace(out, m, _delegate(args), input_shapes=args.input_shape)
            print(f"trace of one invoke of {Path(m).name}: {out} ({doc['otherData']['kernels']} kernels, "
                  f"{doc['otherData']['host spans']} host spans; open it in ui.perfetto.dev or chrome://tracing)")
    return 0


def _trace_paths(trace: str, models: list[str]) -> dict[str, Path]:
    """Where each model's trace goes: ``trace`` itself for one model, ``<trace stem>-<model stem>.json`` beside
    it for several; its directory is created (an unusable one fails now, before the benchmarks)."""
    base = Path(trace)
    _output_dir(str(base.parent), "--trace")
    if len(models) == 1:
        return {models[0]: base}
    return {m: base.with_name(f"{base.stem}-{Path(m).stem}{base.suffix or '.json'}") for m in models}


def cmd_tune(args) -> int:
    from tqdm import tqdm

    from .autotune.exchange import device_records, held_records, import_records, write_records
    from .autotune.records import FileTuningDB, default_tuning_db
    from .cache import default_cache_dir
    from .cache.paths import usable_cache_dir
    from .tuning_report import format_model_tuning, tune_model

    if not args.models and not args.import_file and not args.export:
        print("error: tune needs MODEL files (or --import FILE, or --export FILE: every record held)", file=sys.stderr)
        return 2
    _require_files(args.models)
    if args.import_file and not Path(args.import_file).is_file():
        raise ValueError(f"--import {args.import_file}: no such file")
    if args.export:
        _output_dir(str(Path(args.export).parent), "--export")

    storage = args.storage
    if args.fetch and storage is None:
        print("error: --fetch takes the decisions other workers stored: give their --storage URL", file=sys.stderr)
        return 2
    if storage is None:  # the search state persists next to the records: a rerun continues it
        storage = f"sqlite:///{usable_cache_dir(default_cache_dir()) / 'tuning-trials.db'}"
    db = FileTuningDB(args.db) if args.db else default_tuning_db()
    if args.import_file:
        try:
            got = import_records(args.import_file, db)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"imported {got.records} records of {got.devices} device(s) from {args.import_file}"
              + (f"; {got.stale} measured with another version of the kernel generators were skipped" if got.stale
                 else ""))
    reports = []
    if not args.quiet and args.models:
        budget = f"a budget of {args.budget_s:g} s per model" if args.budget_s else "no time budget"
        how = "every point of each kernel's space" if args.mode == "exhaustive" else "a short search per kernel"
        print(f"tuning mode {args.mode} ({how}; GpuDelegate searches in the background by default), {budget}",
              file=sys.stderr)
    for m in args.models:
        bars: list = []  # made at the first kernel searched: a model whose kernels all have records shows none
        best = [1.0]

        def progress(result, done, total, bars=bars, best=best, name=Path(m).name):
            if not bars:
                bars.append(tqdm(desc=name, total=total, unit="kernel", file=sys.stderr, disable=args.quiet))
            best[0] = max(best[0], result.speedup)
            bars[0].set_postfix_str(f"best speedup {best[0]:.2f}x")
            bars[0].update(1)

        try:
            reports.append(tune_model(m, mode=args.mode, precision=args.precision, budget_s=args.budget_s,
                                      trials=args.trials, storage=storage, db=db, device=args.device,
                                      retune=args.retune, progress=progress, rounds=args.repeat,
                                      fetch=args.fetch, input_shapes=args.input_shape))
        finally:
            for bar in bars:
                bar.close()
        print(format_model_tuning(reports[-1]))
        print()
    if args.export and reports:
        keys = {k.key for r in reports for k in r.kernels}
        exported = device_records(db, reports[0].identity, keys)
        write_records(args.export, [exported])
        print(f"exported {len(exported.records)} records of {reports[0].device} ({len(keys)} kernels in the models) "
              f"to {args.export}; `tflgpu tune --import {args.export}` merges them elsewhere")
    elif args.export:  # no models: what the records hold of this device, searched by anything (background ones too)
        from .runtime.device import choose_device

        exported = held_records(db, choose_device(args.device).identity.as_dict())
        write_records(args.export, [exported])
        print(f"exported {len(exported.records)} records of {exported.identity['device']} (every record the "
              f"{'file ' + args.db if args.db else 'cache'} holds of it, nothing tuned) to {args.export}; "
              f"`tflgpu tune --import {args.export}` merges them elsewhere")
    if args.json:
        import dataclasses

        print(json.dumps([dataclasses.asdict(r) for r in reports], default=str, indent=1))
    return 0


class _WarnCollector(logging.Handler):
    """The library's warnings while one model warms up, kept to be printed after the progress bar with the
    model's name (not in the middle of the bar)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@dataclass(frozen=True)
class WarmOptions:
    """What ``warmup`` builds each model's plan with (sent to its worker processes with --jobs)."""

    tuning: str
    device: str | None
    cache_dir: str | None
    trials: int | None = None  # candidates per kernel (None: the mode's default)
    budget_s: float | None = None  # search budget per model (None: the mode's default)
    input_shapes: tuple | None = None  # the inputs' shapes, resized to before allocation (None: as stored)


def _warm_one(model: str, precision: str, opts: WarmOptions, events=None) -> dict:
    """Build (or load) one model's plan into the cache; runs in a worker process with --jobs. ``events``
    (anything with ``put``) gets (model, precision, kernels done, kernels total) as each kernel is tuned."""
    import time

    from .benchmark import resized
    from .delegate import GpuDelegate
    from .interpreter import Interpreter

    def progress(result, done, total):
        if events is not None:
            events.put((model, precision, done, total))

    log = logging.getLogger("tflgpu")
    collector, propagate = _WarnCollector(), log.propagate
    log.addHandler(collector)
    log.propagate = False
    t0 = time.perf_counter()
    try:
        # (ahead of time: the optimized build at once, not a quick one first)
        it = resized(Interpreter(model_path=model, delegate=GpuDelegate(
            precision_loss_allowed=precision == "fp16", tiered_compile=False, tuning=opts.tuning, device=opts.device,
            serialization_dir=opts.cache_dir, tuning_progress=progress, tuning_trials=opts.trials,
            tuning_budget_s=opts.budget_s)), opts.input_shapes)
        it.allocate_tensors()  # (a plan waiting for its inputs' shapes says so here)
    finally:
        log.removeHandler(collector)
        log.propagate = propagate
    plan = it.gpu_plan
    if plan is None:
        why = it.cpu_fallback_reason
        raise RuntimeError(f"no device plan: {why}" if why else
                           "no OpenCL device" + "".join(f"; {m}" for m in collector.messages))
    return {"model": Path(model).name, "seconds": time.perf_counter() - t0, **plan.build_stats,
            "tuned": sum(1 for k in plan.tuning_results if k.source == "tuned" and k.result and k.result.decided),
            "unsearched": sum(1 for k in plan.tuning_results
                              if k.source == "tuned" and not (k.result and k.result.decided)),
            "warnings": collector.messages}


class _BarEvents:
    """Per-kernel tuning progress shown on the warmup bar: the model and its kernels done of total."""

    def __init__(self, bar):
        self.bar = bar

    def put(self, event) -> None:
        model, precision, done, total = event
        self.bar.set_postfix_str(f"{Path(model).name} [{precision}]: kernel {done}/{total} tuned")


_WORKER = {"running": False, "interrupted": False}  # a warmup worker process's state, for its SIGINT handler


def _warm_worker_start() -> None:
    """A spawned warmup worker: Ctrl-C (SIGINT to the terminal's process group, or forwarded by the main
    process) ends the model it is warming, as KeyboardInterrupt, and every job it takes after; an idle worker
    only notes it (raised in the pool's own loop, it would print a traceback and break the pool)."""

    def interrupt(signum, frame):
        first = not _WORKER["interrupted"]
        _WORKER["interrupted"] = True
        if first and _WORKER["running"]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)


def _warm_job(model: str, precision: str, opts: WarmOptions, events) -> dict:
    """``_warm_one`` in a warmup worker (``_warm_worker_start``); none starts after an interrupt."""
    if _WORKER["interrupted"]:
        raise KeyboardInterrupt
    _WORKER["running"] = True
    try:
        return _warm_one(model, precision, opts, events)
    finally:
        _WORKER["running"] = False


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def cmd_warmup(args) -> int:
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import active_children, get_context
    from multiprocessing.managers import SyncManager

    from tqdm import tqdm

    _require_files(args.models)
    if args.cache_dir:
        from .cache.paths import usable_cache_dir

        usable_cache_dir(Path(args.cache_dir), "--cache-dir")  # checked before the models are warmed
    jobs = [(m, p) for m in args.models for p in args.precision]
    opts = WarmOptions(args.tuning, args.device, args.cache_dir, args.trials, args.budget_s,
                       tuple(args.input_shape) if args.input_shape else None)
    failed = 0
    results = []
    interrupted = False  # Ctrl-C: the models warmed so far are reported (and stay in the cache), the rest are not
    with tqdm(total=len(jobs), desc="warmup", unit="model", file=sys.stderr, disable=args.quiet) as bar:
        shown = _BarEvents(bar)
        if args.jobs <= 1:
            for m, p in jobs:
                bar.set_postfix_str(f"{Path(m).name} [{p}]")
                try:
                    results.append(((m, p), _warm_one(m, p, opts, shown), None))
                except (ValueError, RuntimeError, OSError) as e:
                    results.append(((m, p), None, e))
                except KeyboardInterrupt:
                    interrupted = True
                    break
                bar.update(1)
        else:  # spawned workers: an OpenCL runtime does not survive fork; their progress comes through a queue
            ctx = get_context("spawn")
            manager = SyncManager(ctx=ctx)
            manager.start(_ignore_sigint)  # (the progress queue outlives a Ctrl-C, which the workers end on)
            with manager, ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=_warm_worker_start) as pool:
                events = manager.Queue()

                def relay():
                    while (event := events.get()) is not None:
                        shown.put(event)

                relayer = threading.Thread(target=relay, daemon=True)
                relayer.start()
                futures = {pool.submit(_warm_job, m, p, opts, events): (m, p)
                           for m, p in jobs}
                try:
                    for f in as_completed(futures):
                        try:
                            results.append((futures[f], f.result(), None))
                        except KeyboardInterrupt:  # (the worker's, where Ctrl-C reached it first)
                            interrupted = True
                            continue
                        except Exception as e:  # a worker's error, reported per model
                            results.append((futures[f], None, e))
                        bar.update(1)
                except KeyboardInterrupt:
                    interrupted = True
                    for f in futures:
                        f.cancel()
                    for child in active_children():  # (a Ctrl-C sent to this process alone reaches them too)
                        if child.pid is not None:
                            os.kill(child.pid, signal.SIGINT)
                finally:
                    events.put(None)
                    relayer.join()
    for (m, p), r, err in sorted(results, key=lambda x: x[0]):
        if err is not None:
            failed += 1
            print(f"{Path(m).name} [{p}]: FAILED: {err}{_shape_hint(err, args)}")
        else:
            if r["plan"] == "cache":
                what = "already in the cache"
            else:
                compiled = ("kernels compiled" if r["source_builds"] or r.get("memory_loads")
                            else "kernels already compiled in the cache")
                searched = f", best parameters searched for {r['tuned']} kernels" if r["tuned"] else ""
                if r["unsearched"]:
                    searched += (f", {r['unsearched']} not searched: the budget ran out (a longer --budget-s, or "
                                 "the background search at the next start)")
                what = f"built and stored ({compiled}{searched})"
            print(f"{r['model']} [{p}]: {what} ({r['seconds']:.1f} s)")
            for w in r["warnings"]:
                print(f"{r['model']} [{p}]: warning: {w}")
    if interrupted:
        done = {job for job, _, _ in results}
        left = [f"{Path(m).name} [{p}]" for m, p in jobs if (m, p) not in done]
        print(f"interrupted: not warmed: {', '.join(left)} (what was warmed and stored before stays in the cache)",
              file=sys.stderr)
        return 130
    return 1 if failed else 0


def _age(t: float) -> str:
    import time

    d = max(0.0, time.time() - t)
    for unit, sec in (("d", 86400), ("h", 3600), ("min", 60)):
        if d >= sec:
            return f"{d / sec:.0f} {unit} ago"
    return f"{d:.0f} s ago"


def cmd_cache(args) -> int:
    from .cache.store import CacheStore

    store = CacheStore(args.cache_dir, named_by="--cache-dir" if args.cache_dir else None)
    entries = list(store.entries(payloads=("plan",) if args.action == "ls" else ()))  # (ls reads the plans)
    token = args.model
    if token is not None and Path(token).is_file():  # a model file: its default token (the bytes' fingerprint)
        from .cache.plans import model_token

        token = model_token(Path(token).read_bytes())
    selected = entries if token is None else store.plans_of(token, entries)
    if token is not None and not selected and args.action in ("ls", "clear"):
        print(f"error: no stored plans for --model {args.model}" + (f" (token {token})" if token != args.model else ""),
              file=sys.stderr)
        return 1

    if args.action == "ls":
        print(f"cache {store.root} ({store.total_bytes():,} bytes, bound {store.max_bytes:,})")
        _list_cache(selected, show_all=args.all or token is not None)
        return 0
    if args.action == "stats":
        by: dict = {}
        for e in entries:
            d = by.setdefault(e.device_key or "(unreadable)", {})
            n, b = d.get(e.kind, (0, 0))
            d[e.kind] = (n + 1, b + e.size)
        print(f"cache {store.root}: {len(entries)} entries, {store.total_bytes():,} bytes "
              f"(bound {store.max_bytes:,})")
        for dev, kinds in by.items():
            print(f"  {dev}")
            for kind, (n, b) in sorted(kinds.items()):
                print(f"    {kind:<8} {n:>6} entries {b:>14,} bytes")
        return 0
    if args.action == "verify":
        bad = [e for e in entries if e.problem]
        for e in bad:
            print(f"BAD {e.path.relative_to(store.root)}: {e.problem}")
            if args.fix:
                store.remove(e)
        print(f"{len(entries) - len(bad)} entries verify, {len(bad)} bad" + (" (removed)" if bad and args.fix else ""))
        return 1 if bad and not args.fix else 0
    # clear
    gone = selected
    for e in gone:
        store.remove(e)
    print(f"removed {len(gone)} entries ({sum(e.size for e in gone):,} bytes)")
    return 0


def _list_cache(entries: list, show_all: bool) -> None:
    """`cache ls`: stored plans grouped by model (its file name, stored with the plan, and its token), then the
    programs and tuning records, which models share (one line each, or every entry with ``show_all``)."""
    from .cache.plans import decode_plan
    from .cache.store import InvalidEntry
    from .runtime.config import PlanConfig

    def device(e) -> str:
        return e.device_key.split("|")[1] if e.device_key.count("|") >= 1 else e.device_key

    def bad(e) -> str:
        return f"  [BAD: {e.problem}]" if e.problem else ""

    models: dict[str, list] = {}
    for e in (e for e in entries if e.kind == "plan"):
        try:
            rec = None if e.problem else decode_plan(e.payload)
        except InvalidEntry:
            rec = None
        models.setdefault(e.key.rsplit("-", 1)[0], []).append((e, rec))
    if models:
        print(f"\n{'model':<40} {'token':<16} {'plans':>5} {'bytes':>11}  last use")
    for token, plans in sorted(models.items(), key=lambda kv: -max(e.last_use for e, _ in kv[1])):
        names = sorted({rec.model_name for _, rec in plans if rec is not None and rec.model_name})
        name = ", ".join(names) or "(bytes, or stored before names were kept)"
        print(f"{name[:40]:<40} {token:<16} {len(plans):>5} {sum(e.size for e, _ in plans):>11,}  "
              f"{_age(max(e.last_use for e, _ in plans))}")
        for e, rec in sorted(plans, key=lambda p: -p[0].last_use):
            config = PlanConfig.from_key(rec.options) if rec is not None else None
            what = config.summary() if config is not None else "(unreadable options)"
            shapes = " ".join("x".join(map(str, s)) or "scalar" for s in rec.input_shapes) if rec else "?"
            print(f"    {what}; input {shapes}; {device(e)}; {e.size:,} bytes, {_age(e.last_use)}{bad(e)}")
    for kind, label in (("program", "compiled programs (shared by models: keyed by their source)"),
                        ("tuning", "tuning records (per kernel and device; shared by models)")):
        of_kind = [e for e in entries if e.kind == kind]
        if not of_kind:
            continue
        print(f"\n{len(of_kind)} {label}: {sum(e.size for e in of_kind):,} bytes"
              + ("" if show_all else " (--all lists them)"))
        for e in sorted(of_kind, key=lambda e: -e.last_use):
            if show_all or e.problem:
                print(f"    {e.key[:40]:<40} {e.size:>10,}  {_age(e.last_use):<12} {device(e)}{bad(e)}")


def _delegate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--delegate", choices=["cpu", "gpu"], default="gpu",
                   help="gpu (default): GpuDelegate on an OpenCL device (the CPU kernels when there is none); "
                        "cpu: the CPU kernels only")
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp32",
                   help="with --delegate gpu; fp16: GpuDelegate(precision_loss_allowed=True), FP16 storage on a GPU "
                        "(a CPU device keeps FP32, faster there)")
    p.add_argument("--device", help="OpenCL device: index or name substring (default: $TFLGPU_DEVICE or the first)")
    p.add_argument("--fuse-expansions", action="store_const", const=True, default=None,
                   help="with --delegate gpu: a separable block and the conv expanding its output as one kernel "
                        "from the start (GpuDelegate(fuse_expansions=True); by default a GPU's tuner decides)")


def _seconds(text: str) -> float:
    """An argparse type: a positive number of seconds."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return v


def _shape(text: str) -> tuple[int, ...]:
    """An argparse type: a tensor shape, "1,1760" (or "1x1760"), every dimension at least 1."""
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape: integers separated by commas, e.g. 1,1760") from None
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every dimension must be at least 1")
    return dims


def _input_shape_arg(parser, scope: str = "") -> None:
    """--input-shape, for the commands that plan a model: the shape its input is resized to before allocation."""
    parser.add_argument("--input-shape", type=_shape, action="append", metavar="D,D,...",
                        help="run the model's input at this shape (once per input, in order): a dynamic input stored "
                             "at a size that does not run (an audio model's [1, 1], say), or another batch"
                             + (f" {scope}" if scope else ""))


def _count(least: int):
    """An argparse type: an integer of at least ``least`` (checked before any work starts)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {v}")
        return v

    return parse


def build_parser() -> argparse.ArgumentParser:
    from .version import __version__

    p = argparse.ArgumentParser(prog="tflgpu", description="Run TensorFlow Lite models with tflgpu.")
    p.add_argument("-v", "--verbose", action="store_true", help="log what tflgpu does")
    p.add_argument("--version", action="version", version=f"tflgpu {__version__}")
    # -v after the subcommand too (`tflgpu run -v`); SUPPRESS keeps a -v given before it
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log what tflgpu does")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[verbose], **kw)

    r = command("run", help="run a model once (the bundled default model if none given)")
    r.add_argument("model", nargs="?", help="a .tflite file (default: the bundled model)")
    r.add_argument("--input", action="append", help="a .npy file per model input, in order")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs used without --input")
    r.add_argument("--repeat", type=_count(1), default=10, help="timed invokes (default 10)")
    r.add_argument("--threads", type=_count(1), default=None, help="CPU threads (default: every core)")
    r.add_argument("--save", help="directory to save each output as .npy")
    r.add_argument("--resize", action="store_true", help="resize the model's inputs to --input arrays of other shapes")
    r.add_argument("--wait-tuning", action="store_true",
                   help="time the model after the background tuning is done (default: after the optimized build)")
    _delegate_args(r)
    r.set_defaults(func=cmd_run)

    i = command("inspect", help="inputs, outputs, op census and backend support of a model")
    i.add_argument("model", nargs="?")
    i.add_argument("--json", action="store_true")
    i.add_argument("--devices", action="store_true", help="list OpenCL devices and their identity")
    i.add_argument("--memory", action="store_true", help="planned device memory vs one buffer per tensor")
    i.add_argument("--passes", action="store_true", help="what each graph pass changed (on the OpenCL path)")
    i.add_argument("--startup", action="store_true",
                   help="start the model once (the cache as it is) and show where the start-up time goes")
    i.add_argument("--precision", nargs="?", choices=["fp32", "fp16", "report"], default="fp32", const="report",
                   help="the precision --memory plans at; alone: which tensors an FP16 plan keeps in FP32, and why")
    i.add_argument("--fp16-error-budget", type=float, default=None, metavar="REL",
                   help="the FP16 plan's error budget for --precision (GpuDelegate(fp16_error_budget=...))")
    i.add_argument("--device", help="OpenCL device: index or name substring")
    _input_shape_arg(i, "(with --memory, --passes, --precision, --startup)")
    i.set_defaults(func=cmd_inspect)

    b = command("bench", help="latency of models through tflgpu, side by side with LiteRT")
    b.add_argument("models", nargs="*")
    b.add_argument("--threads", type=_count(1), default=None,
                   help="CPU threads of tflgpu's CPU kernels and of LiteRT alike (default: every core)")
    b.add_argument("--warmup", type=_count(0), default=3)
    b.add_argument("--repeat", type=_count(1), default=20)
    b.add_argument("--no-compare", action="store_true", help="skip LiteRT")
    _input_shape_arg(b)
    b.add_argument("--compare-litert", action="store_true", help="compare with LiteRT (the default)")
    b.add_argument("--profile", action="store_true", help="per-kernel OpenCL profile (with --delegate gpu)")
    b.add_argument("--trace", metavar="FILE.json",
                   help="write one invoke's timeline (OpenCL kernels, CPU ops, copies, device idle time) as a "
                        "Chrome/Perfetto trace (with --delegate gpu)")
    _delegate_args(b)
    b.set_defaults(func=cmd_bench)

    t = command("tune", help="tune every kernel of models on an OpenCL device and record the choices")
    t.add_argument("models", nargs="*", metavar="MODEL")
    t.add_argument("--mode", choices=["fast", "exhaustive"], default="exhaustive",
                   help="exhaustive (default): every point of each kernel's space; fast: a small search")
    t.add_argument("--budget-s", type=float, default=None, help="wall-clock budget per model")
    t.add_argument("--trials", type=_count(1), default=None, help="compiled candidates per kernel at most")
    t.add_argument("--precision", choices=["fp32", "fp16"], default="fp32",
                   help="fp16: the plan of GpuDelegate(precision_loss_allowed=True) (a CPU device's is FP32)")
    t.add_argument("--device", help="OpenCL device: index or name substring")
    t.add_argument("--storage", help="optuna storage URL shared by tuning workers (default: a SQLite file "
                                     "in the cache directory), e.g. postgresql://user@host/db")
    t.add_argument("--db", help="tuning records file (default: tuning.json in the cache directory)")
    t.add_argument("--retune", action="store_true", help="search again where a record exists")
    t.add_argument("--fetch", action="store_true",
                   help="search nothing: record the decisions that workers sharing --storage stored")
    t.add_argument("--repeat", type=_count(1), default=30, help="invokes timed per model, before and after")
    t.add_argument("--export", metavar="FILE", help="write this device's records of the models' kernels to FILE "
                   "(tuning them first where needed); without models, every record held of this device, nothing "
                   "tuned (the background searches' too)")
    t.add_argument("--import", dest="import_file", metavar="FILE",
                   help="merge a file of records (any device's; --export writes one) into the cache first")
    _input_shape_arg(t)
    t.add_argument("--json", action="store_true", help="also print the reports as JSON")
    t.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_tune)

    w = command("warmup", help="compile, tune and serialize models into the cache ahead of time")
    w.add_argument("models", nargs="+")
    w.add_argument("--precision", choices=["fp32", "fp16"], action="append",
                   help="repeat for both (default fp32); fp16: the plan of GpuDelegate(precision_loss_allowed=True) "
                        "(a CPU device's is FP32)")
    w.add_argument("--tuning", choices=["none", "fast", "exhaustive"], default="fast")
    w.add_argument("--budget-s", type=_seconds, default=None, help="search budget per model (fast: 30 s)")
    w.add_argument("--trials", type=_count(1), default=None, help="compiled candidates per kernel at most (fast: 10)")
    w.add_argument("--jobs", type=_count(1), default=1, help="models warmed in parallel processes")
    w.add_argument("--device", help="OpenCL device: index or name substring")
    w.add_argument("--cache-dir", help="the cache directory (default: $TFLGPU_CACHE_DIR or the user cache dir)")
    _input_shape_arg(w)
    w.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    w.set_defaults(func=cmd_warmup)

    c = command("cache", help="what the cache holds: ls, stats, verify, clear")
    c.add_argument("action", choices=["ls", "stats", "verify", "clear"])
    c.add_argument("--all", action="store_true", help="ls: every compiled program and tuning record too")
    c.add_argument("--model", help="only this model's plans (ls, clear): a model file or its token")
    c.add_argument("--cache-dir", help="the cache directory (default: $TFLGPU_CACHE_DIR or the user cache dir)")
    c.add_argument("--fix", action="store_true", help="verify: remove the entries that fail")
    c.set_defaults(func=cmd_cache)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "command", None) == "warmup":
        args.precision = args.precision or ["fp32"]
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s tflgpu: %(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback; 130 as a shell reports a process ended by SIGINT
        kept = {"tune": "the records of the models tuned before are stored, and the same command continues the "
                        "search from the trials it kept"}.get(getattr(args, "command", None))
        print("\ninterrupted" + (f": {kept}" if kept else ""), file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head & co.: stop quietly, as Unix tools do
        sys.stderr.close()
        return 0
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}{_shape_hint(e, args)}", file=sys.stderr)
        return 1


def _shape_hint(e: Exception, args) -> str:
    """What a command taking --input-shape adds to an input shape's error where that option was not given."""
    from .runtime import ShapeError

    if isinstance(e, ShapeError) and hasattr(args, "input_shape") and not args.input_shape:
        return "; pass --input-shape D,D,... (once per input) to plan it at the shape it runs at"
    return ""


if __name__ == "__main__":
    sys.exit(main())
