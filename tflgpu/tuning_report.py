"""Tuning a whole model and reporting what it gained: used by ``tflgpu tune`` and ``bench/``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from .autotune.records import default_tuning_db
from .autotune.tuner import TuningConfig
from .benchmark import _prepare, interleaved_ms, reference_inputs
from .cache.plans import model_token
from .cache.store import CacheStore
from .delegate import GpuDelegate
from .interpreter import Interpreter


@dataclass
class KernelRow:
    op: str
    key: str
    layers: int  # how many of the model's steps share this kernel identity
    heuristic_us: float
    tuned_us: float
    params: dict
    source: str  # "tuned" (searched now) | "record" (from the database)
    flops: int = 0

    @property
    def speedup(self) -> float:
        return self.heuristic_us / self.tuned_us if self.tuned_us > 0 else 1.0


@dataclass
class ModelTuning:
    model: str
    heuristic_ms: float
    tuned_ms: float
    tuning_s: float
    kernels: list[KernelRow] = field(default_factory=list)
    device: str = ""

    @property
    def speedup(self) -> float:
        return self.heuristic_ms / self.tuned_ms if self.tuned_ms > 0 else 1.0


def tune_model(path: str | Path, *, mode: str = "fast", precision: str = "fp32", budget_s: float | None = None,
               trials: int | None = None, storage: str | None = None, db=None, device=None,
               retune: bool = False, progress=None, rounds: int = 30) -> ModelTuning:
    """Tune every kernel of a model on one device; time it with heuristics vs tuned parameters."""

    db = default_tuning_db() if db is None else db
    fp16 = precision == "fp16"
    config = TuningConfig(mode=mode, budget_s=budget_s, trials=trials, db=db, storage=storage,
                          progress=progress, reuse_records=not retune)
    # cache=False: a tuning run searches; it never takes a plan stored before the records existed
    delegate = GpuDelegate(precision_loss_allowed=fp16, device=device, tuning=config, cache=False,
                           tiered_compile=False)
    t0 = time.perf_counter()
    tuned = Interpreter(model_path=str(path), delegate=delegate)
    tuning_s = time.perf_counter() - t0
    _drop_plans(Path(path))
    plan = tuned.gpu_plan
    if plan is None:
        raise RuntimeError("no OpenCL device to tune on")
    inputs = reference_inputs(tuned.get_input_details())
    heuristic = _prepare(Interpreter, Path(path), inputs,
                         delegate=GpuDelegate(precision_loss_allowed=fp16, device=device, tuning_db=False,
                                              cache=False, tiered_compile=False))
    tuned.allocate_tensors()
    for d, x in zip(tuned.get_input_details(), inputs):
        tuned.set_tensor(d["index"], x)
    h_ms, t_ms = interleaved_ms([heuristic, tuned], rounds=rounds)
    rows = [KernelRow(k.op, k.key, k.layers, k.default_us, k.best_us, k.params, k.source, k.flops)
            for k in plan.tuning_results]
    rows.sort(key=lambda r: -r.heuristic_us * max(r.layers, 1))
    return ModelTuning(Path(path).name, h_ms, t_ms, tuning_s, rows, plan.device.identity.device)


def _drop_plans(path: Path) -> None:
    """New records make this model's stored plans stale: remove them (the next run rebuilds its plan with
    the records; compiled programs stay, content-addressed)."""

    store = CacheStore()
    for e in store.plans_of(model_token(path.read_bytes())):
        store.remove(e)


def format_model_tuning(t: ModelTuning) -> str:
    lines = [f"{t.model} on {t.device}: {t.heuristic_ms:.2f} ms with heuristics -> {t.tuned_ms:.2f} ms tuned "
             f"({t.speedup:.2f}x), tuning took {t.tuning_s:.1f} s",
             f"  {'kernel':<20} {'layers':>6} {'heuristic us':>13} {'tuned us':>9} {'speedup':>8}  params"]
    for r in t.kernels:
        params = ", ".join(f"{k}={v}" for k, v in r.params.items()) or "(heuristic default)"
        lines.append(f"  {r.op.lower()[:20]:<20} {r.layers:>6} {r.heuristic_us:>13.1f} {r.tuned_us:>9.1f} "
                     f"{r.speedup:>7.2f}x  {params}{'' if r.source == 'tuned' else ' [record]'}")
    return "\n".join(lines)
