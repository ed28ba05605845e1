"""Differential fuzzing with valid random models (tests/randmodels.py): each model that LiteRT runs is run on
our CPU kernels, the OpenCL device at FP32, at FP32 under a GPU's target (its defaults, passes and fused steps,
whatever the device) and at FP16, and compared with LiteRT. A crash, a hang, an exception
(LiteRT ran the model, so must we) or an output off by more than the tolerance is a finding: its seed is
recorded, minimized to the fewest ops that still show it, and its model saved.

    python -m tests.fuzz_valid --seconds 600 --seed 0 [--findings DIR] [--wide]   # prints one JSON line of counts

Tolerance per output: the largest of ``RTOL[path] * max|LiteRT|``, four times LiteRT's own spread (XNNPACK
vs its builtin kernels) on that output, and eight times what LiteRT's output moves per FP32 rounding of the
inputs (2^-22, measured at 2^-16 and scaled: a graph dividing by a cancellation passes a last-bit difference
in a sum on enlarged); for a
full-integer model, ``QUANT_STEPS[path]`` steps of its output scale; for an ARG_MAX / ARG_MIN output, the value
each index names in LiteRT's input against the one LiteRT's index names (FP32's tolerance: a tie that rounding
decides names another index, as LiteRT's two paths would). An output is not judged where LiteRT's run
overflowed (a float tensor not finite, or at float32's largest magnitude) and its two paths disagree on that
output (a NaN on one path and a number on the other included): TFLite's builtin kernels clamp an infinite
result to the largest float and keep a NaN through a clamp, XNNPACK keeps the infinity, its average pool's clamp
turns a NaN into the lower bound and its MAXIMUM returns the operand that is a number, so there is no one
answer. The FP16 path is calibrated on the very
inputs it is checked on (``GpuDelegate(calibration_inputs=)``), so its per-op precision choice
(runtime.precision) must keep every output within 2% (of 1 for an output bounded by 1, a LOGISTIC's, as the
choice judges it) however ill-conditioned the graph: a value past FP16's
range, a cancellation, a near-tie an ARG_MAX decides.

One model in five (``resized_batches``) also runs at batch 2 and 0 (``check_batches``: its float inputs of batch 1
repeated, each repeat scaled, or none of their rows) on our CPU kernels and the device at FP32, against LiteRT at
that batch: a batch LiteRT refuses is not judged; one it runs, ours must too, to its shapes and values (a WHILE
unrolled onto the device baked its declared batch in: seed 84).

Each model runs in a worker process, so a hang inside a C call (a driver, the compiler) is caught too: no
answer within ``WORKER_HANG_S`` and the worker is killed, the seed recorded as a hang, and a new worker goes
on. tests/test_fuzz_valid.py runs a bounded, fixed-seed share in CI.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import signal
import sys
import time
import traceback
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model import read_model
from tflgpu.runtime.device import list_devices
from tflgpu.runtime.precision import output_scales

from .randmodels import later_makers, model_for

RTOL = {"cpu": 1e-4, "fp32": 1e-4, "gpu-shaped": 1e-4, "fp16": 2e-2}
# a full-integer model's float output moves in steps of its output scale: our integer kernels reproduce LiteRT's
# arithmetic (0 steps on 60 random chains), the device's float view with quantization simulators rounds
# differently where a value lies on a step's edge (<= 1 step at FP32, <= 4 at FP16 on those 60)
QUANT_STEPS = {"cpu": 1, "fp32": 2, "gpu-shaped": 2, "fp16": 6}
FP16_MAX = 65504.0  # FP16's largest value
HANG_S = 60  # one path of one model (a Python-level wait; a worker stuck in a C call is WORKER_HANG_S's)
WORKER_HANG_S = 600  # one seed's whole work: its check and, for a finding, the minimization
WORKER_MODELS = 200
PROGRESS_EVERY = 250  # models between progress lines (stderr)
BATCHES = (2, 0)  # the other batches a model is run at too (check_batches), one in five: resized_batches
# ops whose LiteRT kernels end the process (SIGSEGV) on a tensor with no elements (its builtin SOFTMAX and
# LOG_SOFTMAX: seeds 670 and 329 at batch 0): a model holding one is not run at batch 0
LITERT_CRASHES_ON_EMPTY = frozenset({"SOFTMAX", "LOG_SOFTMAX"})
# ops LiteRT runs wrongly at another batch: its ATAN2 reads both operands as one shape without checking (a [1, 11]
# constant read as [2, 11], past its end: seed 21208949); a model holding one runs at its own batch only
LITERT_WRONG_AT_OTHER_BATCHES = frozenset({"ATAN2"})


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


def _float_values(it):
    """Each float32 tensor's values in a run of ``it`` (made with ``keep_all``), those LiteRT keeps a buffer for."""
    for d in it.get_tensor_details():
        if d["dtype"] == np.float32:
            try:
                v = it.get_tensor(d["index"])
            except ValueError:  # (a tensor LiteRT keeps no buffer for)
                continue
            if v.size:
                yield v


def _largest_stored(it) -> float:
    """The largest magnitude any float tensor took in a run of ``it`` (made with ``keep_all``): FP16 storage
    rounds it to 2^-11 of that."""
    return max((float(np.abs(v).max()) for v in _float_values(it) if np.isfinite(v).all()), default=0.0)


def _overflowed(it) -> bool:
    """Whether a run of ``it`` (made with ``keep_all``) overflowed somewhere: a float tensor holding a value that
    is not finite, or float32's largest magnitude (TFLite's builtin kernels clamp an op's infinite result to it
    where the op has a fused activation, NONE included; XNNPACK keeps the infinity)."""
    top = float(np.finfo(np.float32).max)
    return any(not (np.abs(v) < top).all() for v in _float_values(it))


@contextmanager
def _target(path: str):
    """Plans made inside the "gpu-shaped" path take a GPU's target (kernels.base.Target: one float lane and a GPU's
    defaults, passes and fused steps) on whatever device runs them, so the code only a GPU runs is fuzzed on a CPU
    device too; the other paths, the device's own."""
    if path != "gpu-shaped":
        yield
        return
    from tflgpu.kernels.base import Target

    own = Target.__dict__["of"]
    Target.of = classmethod(lambda cls, dev, device_type: replace(own.__func__(cls, dev, device_type), float_lanes=1,
                                                                  gpu=True))
    try:
        yield
    finally:
        Target.of = own


def _run(it, inputs) -> list[np.ndarray]:
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _rankings(data: bytes, builtin) -> dict[int, tuple[np.ndarray, int, bool]]:
    """The graph outputs an ARG_MAX / ARG_MIN writes, by output position: (its input's values as LiteRT's builtin
    kernels computed them, in ``builtin``, run with ``keep_all``; the axis; whether it takes the largest)."""
    from tflgpu.model.reader import read_model

    sg = read_model(data).subgraphs[0]
    made = {o: op for op in sg.operators for o in op.outputs}
    out = {}
    for i, d in enumerate(builtin.get_output_details()):
        op = made.get(d["index"])
        if op is not None and op.name in ("ARG_MAX", "ARG_MIN"):
            axis = int(np.asarray(builtin.get_tensor(op.inputs[1])).reshape(-1)[0])
            x = builtin.get_tensor(op.inputs[0]).astype(np.float64)
            out[i] = (x, axis % x.ndim, op.name == "ARG_MAX")
    return out


def rank_error(got: np.ndarray, want: np.ndarray, ranked: tuple[np.ndarray, int, bool], rtol: float) -> float:
    """An ARG_MAX / ARG_MIN output's error: 0 where each index ``got`` names holds, in LiteRT's input ``x``, a value
    within ``rtol * max|x|`` of the one LiteRT's own index holds (a tie that rounding decides: a float output may be
    off that much, so may the values compared), else the largest index difference."""
    x, axis, largest = ranked
    tol = rtol * float(np.abs(x).max(initial=0.0))
    at = lambda idx: np.take_along_axis(x, np.expand_dims(idx.astype(np.int64), axis), axis).squeeze(axis)
    if not ((got >= 0) & (got < x.shape[axis])).all():
        return float(np.abs(got.astype(np.int64) - want).max(initial=0))
    short = at(want) - at(got) if largest else at(got) - at(want)
    off = short > tol
    return float(np.abs(got.astype(np.int64) - want)[off].max(initial=0))


def resized_batches(seed: int) -> bool:
    """Whether the seed's model also runs at ``BATCHES``: one in five (seed % 5 == 4), the IF / WHILE models among
    them (a WHILE unrolled onto the device baked its declared batch in: seed 84)."""
    return seed % 5 == 4


def batched(inputs: list[np.ndarray], batch: int) -> list[np.ndarray] | None:
    """``inputs`` at ``batch``: each float input of batch 1 (rank 2 or more) repeated, each repeat scaled (so rows
    differ, in the same domain), or none of its rows; the others as they are. None where no input has a batch."""
    rng, out = np.random.default_rng(batch), []
    for x in inputs:
        if x.dtype == np.float32 and x.ndim >= 2 and x.shape[0] == 1:
            scales = np.concatenate([[1.0], rng.uniform(0.5, 1.5, max(batch - 1, 0))])[:batch].astype(np.float32)
            out.append(x * scales.reshape((batch,) + (1,) * (x.ndim - 1)))
        else:
            out.append(x)
    return out if any(a is not b for a, b in zip(out, inputs)) else None


def _run_resized(it, inputs) -> list[np.ndarray]:
    for d, x in zip(it.get_input_details(), inputs):
        if tuple(d["shape"]) != x.shape:
            it.resize_tensor_input(d["index"], x.shape)
    return _run(it, inputs)


def check_batches(model, sensitivity: list[float]) -> dict | None:
    """The model at ``BATCHES`` (its inputs ``batched``) on our CPU kernels and the device at FP32, against LiteRT
    at that batch: what went wrong where (a finding's fields), or None. A batch LiteRT refuses is not judged (a
    RESHAPE to a fixed [1, ...]), nor are values where LiteRT's run overflowed, nor integer outputs (an ARG_MAX's
    tie); shapes (against LiteRT's builtin kernels) and exceptions always are."""
    if LITERT_WRONG_AT_OTHER_BATCHES & set(model.ops):
        return None
    for batch in BATCHES:
        inputs = batched(model.inputs, batch)
        if inputs is None:
            return None
        if batch == 0 and LITERT_CRASHES_ON_EMPTY & set(model.ops):
            continue
        try:
            want = _run_resized(_litert(model.data, False), inputs)
            builtin = _litert(model.data, True, keep_all=True)
            other = _run_resized(builtin, inputs)
        except Exception:  # noqa: BLE001, S112 - LiteRT refuses this batch: nothing to hold ours to
            continue
        judged = all(np.isfinite(w).all() for w in want) and not _overflowed(builtin)
        for path, delegate in (("cpu", None), ("fp32", GpuDelegate(cache=False))):
            where = f"{path} at batch {batch}"
            signal.alarm(HANG_S)
            try:
                got = _run_resized(Interpreter(model_content=model.data, delegate=delegate), inputs)
            except Hang:
                return {"path": where, "what": f"hang (> {HANG_S} s)"}
            except Exception as e:  # noqa: BLE001 - LiteRT ran it: any exception of ours is a finding
                return {"path": where, "what": f"{type(e).__name__}: {str(e)[:200]}"}
            finally:
                signal.alarm(0)
            for i, (g, w, o, sens) in enumerate(zip(got, want, other, sensitivity)):
                # (shapes against LiteRT's builtin kernels: XNNPACK's output of a conv at batch 0 gave dims of
                # uninitialized memory, [0, 617509776, 4, 11]: seed 20207739)
                if g.shape != o.shape or g.dtype != o.dtype:
                    return {"path": where, "what": f"output {i}: {g.dtype}{list(g.shape)}, LiteRT {o.dtype}"
                                                   f"{list(o.shape)}"}
                if not judged or w.dtype.kind != "f" or not w.size or w.shape != o.shape:
                    continue
                err = float(np.abs(g.astype(np.float64) - w).max()) if np.isfinite(g).all() else np.inf
                tol = max(RTOL[path] * float(np.abs(w).max()), 4 * float(np.abs(w - o).max()), 8 * sens, 1e-6,
                          QUANT_STEPS[path] * model.output_step)
                if err > tol:
                    return {"path": where, "what": f"output {i}: max error {err:.3g} > tolerance {tol:.3g}"}
    return None


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
    # how far LiteRT's own output moves per FP32 rounding of the inputs (2^-22: noise, and all scaled up and down;
    # moved by 2^-16 and scaled down 64x, as a move of 2 ulps is lost in float32's own rounding inside): a graph
    # dividing by a cancellation passes a last-bit difference in a sum on enlarged
    noise, eps = np.random.default_rng([seed, 99]), np.float32(2.0**-16)
    sensitivity = [0.0] * len(want)
    if all(x.dtype == np.float32 for x in model.inputs):
        for moved in ([x * (1 + noise.uniform(-1, 1, x.shape).astype(np.float32) * eps) for x in model.inputs],
                      [x * (1 + eps) for x in model.inputs], [x * (1 - eps) for x in model.inputs]):
            got = _run(ref, moved)
            sensitivity = [max(s, float(np.abs(a - b).max(initial=0.0)) / 64)
                           for s, a, b in zip(sensitivity, want, got)]
    paths = {"cpu": None, "fp32": GpuDelegate(cache=False), "gpu-shaped": GpuDelegate(cache=False)}
    if fp16:  # (the precision choice calibrated on the inputs it is checked on, as a user with their own data)
        paths["fp16"] = GpuDelegate(cache=False, precision_loss_allowed=True, calibration_inputs=[model.inputs])
    rankings = _rankings(model.data, builtin)
    # (FP16's tolerance on an output bounded by 1, a LOGISTIC's: against 1, as the precision choice judges it)
    sg = read_model(model.data).subgraphs[0]
    bounds = {sg.outputs.index(t): scale for t, scale in output_scales(sg).items()}
    # (counted: a graph storing values FP16 cannot hold, which its FP16 plan must keep in FP32)
    result = {"status": "ok", "ops": model.ops, "device_ops": 0,
              "fp16_out_of_range": fp16 and _largest_stored(builtin) > FP16_MAX}
    # outputs not judged: where the run overflowed and LiteRT's two paths disagree (an infinity XNNPACK keeps and
    # the builtin kernels clamp to the largest float, a NaN XNNPACK's average pool clamps to its lower bound and
    # the builtin kernels keep): TFLite has no one answer to hold ours to there
    # (a spread that is NaN, one path's NaN where the other has a number, is a disagreement too)
    unjudged = {i for i, (w, s) in enumerate(zip(want, spread))
                if not s <= RTOL["fp32"] * float(np.abs(w).max(initial=0.0))} if _overflowed(builtin) else set()
    if unjudged:
        result["overflow_unjudged"] = len(unjudged)
    for path, delegate in paths.items():
        signal.alarm(HANG_S)
        try:
            with _target(path):
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
        for i, (g, w, s, sens) in enumerate(zip(got, want, spread, sensitivity)):
            if g.shape != w.shape or g.dtype != w.dtype:
                return {**result, "status": "finding", "path": path,
                        "what": f"output {i}: {g.dtype}{list(g.shape)}, LiteRT {w.dtype}{list(w.shape)}"}
            if i in unjudged:
                continue
            err = float(np.abs(g.astype(np.float64) - w).max(initial=0.0)) if np.isfinite(g).all() else np.inf
            if i in rankings and err > 0:  # (FP32's tolerance for the values ranked, whatever the path)
                err = rank_error(g, w, rankings[i], RTOL["fp32"])
            scale = max(float(np.abs(w).max(initial=0.0)), bounds.get(i, 0.0) if path == "fp16" else 0.0)
            tol = max(RTOL[path] * scale, 4 * float(s), 8 * sens, 1e-6,
                      QUANT_STEPS[path] * model.output_step)
            if err > tol:
                return {**result, "status": "finding", "path": path,
                        "what": f"output {i}: max error {err:.3g} > tolerance {tol:.3g} "
                                f"(max|LiteRT| {np.abs(w).max(initial=0.0):.3g}, LiteRT spread {s:.3g}, "
                                f"sensitivity to FP32 rounding {sens:.3g})"}
    found = check_batches(model, sensitivity) if resized_batches(seed) else None
    return {**result, "status": "finding", **found} if found else result


def minimize(seed: int, n_ops: int, fp16: bool) -> int:
    """The fewest leading ops of the model that still give a finding."""
    for k in range(1, n_ops):
        if check(seed, k, fp16)["status"] == "finding":
            return k
    return n_ops


def _one(seed: int, fp16: bool, findings: Path | None) -> dict:
    """``check`` one seed; a finding is minimized (and its model saved in ``findings``)."""
    r = check(seed, None, fp16)
    if r["status"] != "finding":
        return r
    k = minimize(seed, len(r["ops"]), fp16)
    r = {**check(seed, k, fp16), "seed": seed, "max_ops": k}
    if r["status"] != "finding":  # (the prefix no longer shows it: keep the whole model's report)
        r = {**check(seed, None, fp16), "seed": seed, "max_ops": None}
    if findings:
        findings.mkdir(parents=True, exist_ok=True)
        name = findings / f"valid_seed{seed}_ops{k}.tflite"
        name.write_bytes(model_for(seed, k).data)
        r["saved"] = str(name)
    return r


def _worker(conn, fp16_allowed: bool, findings: Path | None) -> None:
    """A worker process: checks the seeds it is sent, one answer each, until it is sent None."""
    os.environ.setdefault("TFLGPU_TUNING", "none")
    signal.signal(signal.SIGALRM, _alarm)
    logging.getLogger("tflgpu").setLevel(logging.ERROR)  # placement notes for every model are not findings
    devices = list_devices()
    fp16 = fp16_allowed and bool(devices) and devices[0].identity.fp16
    stall = int(os.environ.get("TFLGPU_FUZZ_STALL_SEED", "-1"))  # (a test's stand-in for a call that never returns)
    while (seed := conn.recv()) is not None:
        if seed == stall:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(10**6)
        conn.send(_one(seed, fp16, findings))


class Workers:
    """One worker process at a time (spawned: the parent never touches OpenCL), replaced after
    ``WORKER_MODELS`` models, after a crash, or when it gives no answer within ``WORKER_HANG_S``."""

    def __init__(self, fp16_allowed: bool, findings: Path | None, hang_s: float = WORKER_HANG_S):
        self.mp = multiprocessing.get_context("spawn")
        self.args, self.proc, self.served, self.hang_s = (fp16_allowed, findings), None, 0, hang_s

    def _start(self):
        self.conn, child = self.mp.Pipe()
        self.proc = self.mp.Process(target=_worker, args=(child, *self.args), daemon=True)
        self.proc.start()
        self.served = 0

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
            self.proc = None

    def check(self, seed: int) -> dict:
        if self.proc is None or self.served >= WORKER_MODELS:
            self.stop()
            self._start()
        self.conn.send(seed)
        self.served += 1
        what = None
        if self.conn.poll(self.hang_s):
            try:
                return self.conn.recv()
            except EOFError:
                self.proc.join(10)
                what = f"crash (the worker died: exit code {self.proc.exitcode})"
        else:
            what = f"hang (no answer in {self.hang_s:g} s: the worker was killed)"
        self.proc.kill()
        self.proc.join()
        self.proc = None
        model = model_for(seed)
        r = {"status": "finding", "what": what, "ops": model.ops, "seed": seed, "max_ops": None}
        if self.args[1]:
            self.args[1].mkdir(parents=True, exist_ok=True)
            r["saved"] = str(self.args[1] / f"valid_seed{seed}.tflite")
            Path(r["saved"]).write_bytes(model.data)
        return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--seed", type=int, default=0, help="first model seed; models use seed, seed+1, ...")
    p.add_argument("--max-models", type=int, default=10**9)
    p.add_argument("--findings", type=Path, help="save each finding's (minimized) model here")
    p.add_argument("--no-fp16", action="store_true")
    p.add_argument("--wide", action="store_true",
                   help="only the seeds whose float DAGs draw every maker (randmodels.later_makers: the later ops)")
    p.add_argument("--worker-hang-s", type=float, default=WORKER_HANG_S,
                   help="a seed with no answer in this long is a hang (its worker is killed)")
    args = p.parse_args(argv)
    stats = {"tried": 0, "rejected": 0, "ok": 0, "on_device": 0, "fp16_out_of_range": 0, "overflow_unjudged": 0,
             "findings": [],
             "op_pairs": 0, "ops": 0}
    pairs, ops, rejected_why = set(), Counter(), Counter()
    t0, seed = time.time(), args.seed

    def next_seed(s: int) -> int:
        while args.wide and not later_makers(s):
            s += 1
        return s

    seed = next_seed(seed)
    workers = Workers(not args.no_fp16, args.findings, args.worker_hang_s)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))  # (a killed run still reports its counts)
    try:
        while time.time() - t0 < args.seconds and stats["tried"] < args.max_models and not stopping:
            if stats["tried"] and stats["tried"] % PROGRESS_EVERY == 0:
                print(f"progress: {stats['tried']} models, {stats['ok']} ok, {stats['rejected']} rejected, "
                      f"{len(stats['findings'])} findings, seed {seed}, {time.time() - t0:.0f} s", file=sys.stderr,
                      flush=True)
            r = workers.check(seed)
            if stopping and r.get("what", "").startswith(("crash", "hang")):
                break  # (the signal reached the worker too: not the model's doing)
            stats["tried"] += 1
            if r["status"] == "rejected":
                stats["rejected"] += 1
                rejected_why[r["why"][:60]] += 1
            else:
                ops.update(r["ops"])
                pairs.update(pairwise(r["ops"]))
                stats["on_device"] += r.get("device_ops", 0) > 0
                stats["fp16_out_of_range"] += bool(r.get("fp16_out_of_range"))
                stats["overflow_unjudged"] += bool(r.get("overflow_unjudged"))
                if r["status"] == "ok":
                    stats["ok"] += 1
                else:
                    stats["findings"].append(r)
            seed = next_seed(seed + 1)
    finally:
        workers.stop()
    stats["ops"], stats["op_pairs"] = len(ops), len(pairs)
    stats["rejected_top"] = rejected_why.most_common(5)
    stats["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TFLGPU_TUNING", "none")
    sys.exit(main())
