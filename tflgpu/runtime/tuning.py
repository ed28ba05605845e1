"""What the autotuner decides for a plan's device steps: each tunable kernel identity gets its stored
record's parameters, or (unless tuning is "none") a search's, and its steps are regenerated with them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..autotune import TuneTask, TuningRecord, kernel_key, tune_tasks
from ..autotune.tuner import space_size
from ..kernels import Unsupported
from ..ops.layout import bhwc
from .selection import KernelMaker, Step

log = logging.getLogger("tflgpu")


@dataclass
class TunedKernel:
    """What tuning decided for one kernel identity of this plan."""

    key: str
    op: str
    layers: int  # steps of this plan sharing the identity
    default_us: float
    best_us: float
    params: dict  # {} = the heuristic default
    source: str  # "record" (from the tuning database) | "tuned" (searched now)
    result: object = None  # the TuneResult, when searched now
    flops: int = 0  # per launch of one layer

    @property
    def speedup(self) -> float:
        return self.default_us / self.best_us if self.best_us > 0 else 1.0


def _groups(steps: list[Step], make: KernelMaker, explicit: set) -> dict[str, list[Step]]:
    """The tunable device steps by kernel identity (identical layers share one)."""
    groups: dict[str, list[Step]] = {}
    for s in steps:
        if s.device != "gpu" or s.op.index in explicit or not s.specs:
            continue
        if space_size(s.specs[0].space) <= 1 or any(sp.state for sp in s.specs):
            continue
        if any(bhwc(make.sg.tensors[t].shape) is None for sp in s.specs for t in sp.inputs + sp.outputs):
            continue
        key = kernel_key(s.op.name, s.specs, make.fp16, f"{s.op.name.lower()}_{s.op.index}")
        groups.setdefault(key, []).append(s)
    return groups


def apply_tuning(steps: list[Step], make: KernelMaker, config, device_key: str, bench: Callable,
                 explicit: set) -> tuple[list[TunedKernel], float]:
    """Give every tunable device step its recorded parameters; search those without a record (unless
    ``config.mode`` is "none") with ``bench(task)`` measuring candidates, record the results, and
    regenerate the steps' kernels. Returns what was decided per identity, and the seconds searched."""
    groups = _groups(steps, make, explicit)
    decided, todo = [], []
    for key, group in groups.items():
        rec = config.db.get(device_key, key) if config.db is not None and config.reuse_records else None
        if rec is not None:
            set_params(group, make, rec.params)
            decided.append(TunedKernel(key, group[0].op.name, len(group), rec.default_us, rec.best_us, rec.params,
                                       "record", flops=sum(sp.flops for sp in group[0].specs)))
        elif config.mode != "none":
            s = group[0]
            space = s.specs[0].space
            default = {k: s.specs[0].params.get(k, None if None in v else v[0]) for k, v in space.items()}
            layouts = {t: bhwc(make.sg.tensors[t].shape) for sp in s.specs for t in sp.inputs + sp.outputs}
            todo.append(TuneTask(key, s.op.name, lambda p, s=s: make(s.op, s.epilogue, p), space, default, layouts))
    if not todo:
        return decided, 0.0
    t0 = time.perf_counter()
    results = tune_tasks(todo, bench, device_key, config)
    records = {}
    for r in results:
        set_params(groups[r.key], make, r.params)
        decided.append(TunedKernel(r.key, r.op, len(groups[r.key]), r.default_us, r.best_us, r.params, "tuned", r,
                                   flops=sum(sp.flops for sp in groups[r.key][0].specs)))
        if r.strategy != "budget spent":
            records[r.key] = TuningRecord(r.params, r.default_us, r.best_us, r.trials, r.op)
    if records and config.db is not None:
        config.db.put_many(device_key, records)
    seconds = time.perf_counter() - t0
    log.info("tuned %d kernels in %.1f s", len(results), seconds)
    return decided, seconds


def set_params(steps: list[Step], make: KernelMaker, params: dict) -> None:
    """Regenerate ``steps`` with these generator parameters (those they do not apply to keep theirs)."""
    if not params:
        return
    for s in steps:
        try:
            specs = make(s.op, s.epilogue, params)
        except Unsupported as e:  # a record from another shape family: keep the heuristics
            log.info("tuned parameters %s do not apply to %s: %s", params, s.op.name, e)
            continue
        s.specs, s.params = specs, dict(params)
