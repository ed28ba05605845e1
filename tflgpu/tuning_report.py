"""Tuning a whole model and reporting what it gained: used by ``tflgpu tune`` and ``bench/``."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from .autotune.records import StagedTuningDB, default_tuning_db
from .autotune.tuner import BUDGET_SPENT, FETCHED, MIN_GAIN, NOT_IN_STORAGE, TuningConfig
from .benchmark import _prepare, interleaved_ms, reference_inputs, resized
from .cache.plans import model_token
from .cache.store import CacheStore
from .delegate import GpuDelegate
from .interpreter import Interpreter
from .runtime.residency import pages_kept

CONFIRM_S = 1.0  # how long the second end-to-end timing runs at least, where the first says "slower"


@dataclass
class KernelRow:
    op: str
    key: str
    layers: int  # how many of the model's steps share this kernel identity
    # the kernel's time at the parameters its search started from: a record through the database's fallback chain
    # where one was found (runtime.tuning.apply_tuning), else the heuristics (printed as "start us")
    heuristic_us: float
    tuned_us: float
    params: dict
    source: str  # "tuned" (searched now) | "record" (from the database)
    flops: int = 0
    search: str = ""  # how it was decided, in words: "record", "grid, 12 timed", "not searched: budget spent"
    used: bool = True  # False: ``params`` is what the search found, but the model was slower with it end to end, so
    #                    its record keeps the heuristic default (what later starts run)

    @property
    def speedup(self) -> float:
        return self.heuristic_us / self.tuned_us if self.tuned_us > 0 else 1.0


@dataclass
class ModelTuning:
    model: str
    heuristic_ms: float
    tuned_ms: float
    tuning_s: float  # the search (the budget's part)
    kernels: list[KernelRow] = field(default_factory=list)
    device: str = ""
    verdict: str = ""  # what happened to the new records (stored, or why not)
    build_s: float = 0.0  # the rest of the Interpreter's start: reading, compiling the tuned plan
    budget_s: float | None = None
    identity: dict = field(default_factory=dict)  # the device's (DeviceIdentity.as_dict()), for an export

    @property
    def speedup(self) -> float:
        return self.heuristic_ms / self.tuned_ms if self.tuned_ms > 0 else 1.0


@pages_kept()  # (a measuring job: its end-to-end check compares few timings)
def tune_model(path: str | Path, *, mode: str = "fast", precision: str = "fp32", budget_s: float | None = None,
               trials: int | None = None, storage: str | None = None, db=None, device=None,
               retune: bool = False, progress=None, rounds: int = 30, fetch: bool = False,
               input_shapes=None) -> ModelTuning:
    """Tune every kernel of a model on one device; time it with heuristics vs tuned parameters.

    The new records are stored unless the model, timed end to end in alternation, is slower with them than
    with the heuristics by more than timing noise (then each searched kernel is recorded as "keep the
    heuristic"). ``fetch``: take the decisions other workers stored in ``storage`` instead of searching.
    ``input_shapes``: the inputs' shapes to tune at, one per input (None: as the model stores them).
    """

    db = default_tuning_db() if db is None else db
    staged = StagedTuningDB(db)  # this run's records: stored only if the model is not slower with them
    fp16 = precision == "fp16"
    config = TuningConfig(mode=mode, budget_s=budget_s, trials=trials, db=staged, storage=storage,
                          progress=progress, reuse_records=not retune, fetch_only=fetch)
    # cache=False: a tuning run searches; it never takes a plan stored before the records existed
    delegate = GpuDelegate(precision_loss_allowed=fp16, device=device, tuning=config, cache=False,
                           tiered_compile=False)
    t0 = time.perf_counter()
    tuned = resized(Interpreter(model_path=str(path), delegate=delegate), input_shapes)
    tuned.allocate_tensors()  # (a plan waiting for its inputs' shapes says so here)
    start_s = time.perf_counter() - t0
    plan = tuned.gpu_plan
    if plan is None:
        why = tuned.cpu_fallback_reason
        raise RuntimeError(f"nothing to tune: {why}" if why else "no OpenCL device to tune on")
    inputs = reference_inputs(tuned.get_input_details())
    heuristic = _prepare(Interpreter, Path(path), inputs,
                         delegate=GpuDelegate(precision_loss_allowed=fp16, device=device, tuning_db=False,
                                              cache=False, tiered_compile=False))
    tuned.allocate_tensors()
    for d, x in zip(tuned.get_input_details(), inputs):
        tuned.set_tensor(d["index"], x)
    new = staged.pending()
    chosen = {k for _, k, r in new if r.params}
    # each choice beat the heuristic alone; together they must not be measurably slower
    h_ms, t_ms = interleaved_ms([heuristic, tuned], rounds=rounds)
    if chosen and t_ms > h_ms * (1 + MIN_GAIN):
        # one short timing does not throw a search away (a burst of another process can make it say so): the
        # two are timed again, for longer, and that timing decides
        h_ms, t_ms = interleaved_ms([heuristic, tuned], rounds=rounds, min_seconds=CONFIRM_S)
    dropped = bool(chosen) and t_ms > h_ms * (1 + MIN_GAIN)
    unsearched = sum(1 for k in plan.tuning_results if k.source == "tuned" and not (k.result and k.result.decided))
    if not new and unsearched:
        verdict = (f"no new records: {unsearched} kernels were not searched (the budget ran out, or --fetch found no "
                   "decision); a longer --budget-s searches them")
    elif not new:
        verdict = "no new records (every kernel had one; --retune searches again)"
    elif dropped:
        staged.commit(heuristic_only=True)
        verdict = (f"NOT stored: with the tuned parameters the model was slower end to end ({t_ms:.2f} ms vs "
                   f"{h_ms:.2f} ms); the {len(new)} kernels searched keep the heuristic defaults")
    else:
        staged.commit()
        verdict = f"stored {len(new)} records ({len(chosen)} with tuned parameters, the rest keep the heuristics)"
    if new:
        _drop_plans(Path(path))
    unused = chosen if dropped else set()
    rows = [KernelRow(k.op, k.key, k.layers, k.default_us, k.best_us, k.params, k.source, k.flops,
                      _search_words(k) + (" (not used)" if k.key in unused else ""), used=k.key not in unused)
            for k in plan.tuning_results]
    rows.sort(key=lambda r: -r.heuristic_us * max(r.layers, 1))
    return ModelTuning(Path(path).name, h_ms, t_ms, plan.tuning_seconds, rows, plan.device.identity.device, verdict,
                       start_s - plan.tuning_seconds, config.model_budget(), plan.device.identity.as_dict())


def _search_words(k) -> str:
    """How one kernel was decided, in words, for the report."""
    if k.source == "record":
        return "record"
    r = k.result
    if r is None or r.strategy == BUDGET_SPENT:
        return "not searched: budget spent"
    if r.strategy in (FETCHED, NOT_IN_STORAGE):
        return r.strategy + (f" ({r.trials} trials)" if r.trials else "")
    # (a candidate cut short as slower was timed: "rejected" is what could not run or ran wrong)
    timed = f"{r.measured + r.slower} timed" + (f" ({r.slower} cut short)" if r.slower else "")
    return f"{r.strategy}, {timed}" + (f", {r.rejected} rejected" if r.rejected else "")


def _drop_plans(path: Path) -> None:
    """New records make this model's stored plans stale: remove them (the next run rebuilds its plan with
    the records; compiled programs stay, content-addressed)."""

    store = CacheStore()
    for e in store.plans_of(model_token(path.read_bytes())):
        store.remove(e)


def format_model_tuning(t: ModelTuning) -> str:
    head = (f"{t.model} on {t.device}: {t.heuristic_ms:.2f} ms with heuristics, {t.tuned_ms:.2f} ms with the "
            f"tuned parameters ({t.speedup:.2f}x, timed in alternation); searching took {t.tuning_s:.1f} s"
            + (f" (budget {t.budget_s:g} s)" if t.budget_s else "") + f", building the plan {t.build_s:.1f} s")
    columns = (f"  {'kernel':<20} {'layers':>6} {'start us':>13} {'tuned us':>9} {'speedup':>8}  "
               f"{'search':<40} params")
    lines = [head, f"  {t.verdict}", columns]

    def us(v: float, width: int) -> str:
        return f"{'-':>{width}}" if math.isnan(v) else f"{v:>{width}.1f}"

    for r in t.kernels:
        params = ", ".join(f"{k}={v}" for k, v in r.params.items()) or "(heuristic default)"
        lines.append(f"  {r.op.lower()[:20]:<20} {r.layers:>6} {us(r.heuristic_us, 13)} {us(r.tuned_us, 9)} "
                     f"{'-' if math.isnan(r.heuristic_us) else f'{r.speedup:.2f}x':>8}  {r.search:<40} {params}")
    return "\n".join(lines)
