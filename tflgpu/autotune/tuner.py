"""Searching a kernel's parameter space: grid for small spaces, optuna's TPE for large ones.

The search state is an optuna study per (device, kernel identity). In memory by default; with an
RDB storage URL (SQLite, PostgreSQL, ...) several processes or machines tune the same kernels at
once and share every trial; the chosen parameters are the study's best trial, whoever measured it.
Candidates whose generated code is identical (a knob the generator ignores for this shape) are
measured once. Rejected candidates (build/launch failure, wrong results, discarded early) are
pruned trials, never chosen.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import xxhash

from ..cache.records import TuningRecord
from ..kernels import Unsupported
from ..kernels.base import generator_version
from ..kernels.common import KernelSpec
from ..kernels.knobs import LAUNCH_KNOBS, one_of
from ..ops.layout import Layout
from .measure import CandidateRejected, CandidateSlower, Interrupted, KernelBench

log = logging.getLogger("tflgpu")

MODES = ("none", "background", "fast", "exhaustive")
GRID_MAX = 48  # spaces up to this many points are searched exhaustively in every mode
MIN_GAIN = 0.03  # a candidate must beat the default by this much to be chosen (timing noise)
FAST_TRIALS = 10  # per kernel, in "fast" mode
FAST_MODEL_BUDGET_S = 30.0  # per model, in "fast" mode unless tuning_budget_s says otherwise
BACKGROUND_MODEL_BUDGET_S = 60.0  # per model, searched while the interpreter is idle (runtime.background)
# how a kernel was decided (TuneResult.strategy); the last two are no decision, and get no record
GRID, TPE, FETCHED, BUDGET_SPENT, NOT_IN_STORAGE = "grid", "tpe", "fetched", "budget spent", "not in storage"
TAIL_TRIALS = 2  # a search starts its last trial while this many trials fit: its own and the confirmation
SETTLE_GONE_S = 30.0  # a worker silent this long (plus three trials' time) has stopped without saying so
SETTLE_MAX_S = 600.0  # the longest a finished worker waits for the others sharing its study


@dataclass
class TuningConfig:
    """How a plan tunes kernels that have no record: mode, budgets, where records and trials go.

    Modes: "none" (heuristics and records only), "background" (no search before the first invoke; the
    plan searches while the interpreter is idle, see runtime.background), "fast" and "exhaustive" (a search
    before the plan is built, blocking)."""

    mode: str = "none"
    # per model (None: fast -> FAST_MODEL_BUDGET_S, background -> BACKGROUND_MODEL_BUDGET_S (0: no search),
    # exhaustive -> unbounded)
    budget_s: float | None = None
    trials: int | None = None  # per kernel (None: fast, background -> FAST_TRIALS, exhaustive -> the whole space)
    db: object | None = None  # a TuningDB, or None for no records at all
    storage: str | None = None  # optuna storage URL; None keeps the search in memory
    seed: int = 0
    progress: Callable | None = None  # progress(TuneResult, done, total) as kernels finish
    reuse_records: bool = True  # False: search even where a record exists (tflgpu tune --retune)
    fetch_only: bool = False  # take the decisions already in ``storage`` (other workers'); search nothing

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"tuning must be one of {MODES}, got {self.mode!r}")
        if self.budget_s is not None and not (self.budget_s > 0 or (self.budget_s == 0 and self.mode == "background")):
            raise ValueError("tuning_budget_s must be positive (0 turns the background search off)")
        if self.trials is not None and self.trials < 1:
            raise ValueError("trials must be >= 1")
        if self.fetch_only and self.storage is None:
            raise ValueError("fetch_only takes decisions from a shared storage: give its URL")

    def model_budget(self) -> float | None:
        if self.budget_s is not None:
            return self.budget_s
        return {"fast": FAST_MODEL_BUDGET_S, "background": BACKGROUND_MODEL_BUDGET_S}.get(self.mode)

    def kernel_trials(self) -> int | None:
        if self.trials is not None:
            return self.trials
        return FAST_TRIALS if self.mode in ("fast", "background") else None


@dataclass
class TuneTask:
    key: str  # kernel identity
    op: str
    make: Callable[[dict], list[KernelSpec]]  # params -> specs (may raise Unsupported)
    space: dict[str, list]
    default: dict  # the heuristic default's knob values (the first trial)
    layouts: dict[int, Layout]
    family: str = ""  # kernel_family: the records a new kernel of this family may start from
    shape: tuple[int, ...] = ()  # kernel_shape: how near another kernel of the family is
    # the parameters the default was generated with where they are not the heuristics (another device's record,
    # autotune.exchange): what the kernel keeps where no candidate beats it
    start: dict = field(default_factory=dict)

    def kept(self, r: TuneResult) -> dict:
        """The parameters the kernel runs with after search ``r``: the winner's, else the start's."""
        return r.params or self.start

    def record(self, r: TuneResult) -> TuningRecord:
        """The tuning record of this kernel's search result (a default started from another device's record keeps
        that record's parameters: {} would name the heuristics)."""
        return TuningRecord(self.kept(r), r.default_us, r.best_us, r.trials, r.op, family=self.family,
                            shape=self.shape)

    def overruled(self, r: TuneResult) -> TuningRecord:
        """The record of search ``r`` where a later check (its winner and others together, timed end to end) took
        the start back: the start's parameters at the default's time, one trial more than the search's, so it
        replaces the search's own record (records.replaces)."""
        return TuningRecord(self.start, r.default_us, r.default_us, r.trials + 1, r.op, family=self.family,
                            shape=self.shape)


@dataclass
class TuneResult:
    key: str
    op: str
    params: dict
    default_us: float
    best_us: float
    trials: int = 0  # completed trials in the study (every worker's)
    measured: int = 0  # candidates this process compiled and timed
    rejected: int = 0  # points refused: not valid for the shape, failed to build or launch, wrong outputs
    slower: int = 0  # candidates timed and cut short, already slower than the best by the bench's discard ratio
    seconds: float = 0.0
    strategy: str = ""
    reasons: list[str] = field(default_factory=list)  # why candidates were rejected (first few)

    @property
    def speedup(self) -> float:
        return self.default_us / self.best_us if self.best_us > 0 else 1.0

    @property
    def decided(self) -> bool:
        """Whether this is a decision worth a record (a search ran, or one was fetched): a kernel left for lack
        of budget, or not found in the shared storage, is searched next time."""
        return self.strategy not in (BUDGET_SPENT, NOT_IN_STORAGE)


def space_size(space: dict[str, list]) -> int:
    return math.prod(len(v) for v in space.values()) if space else 1


def kernel_key(op_name: str, specs: list[KernelSpec], fp16: bool, base_name: str, version: int | None = None) -> str:
    """Identity of a kernel: op family, the default's specialized code (shapes, padding, activation,
    fused ops: all baked into the source), launch sizes, precision and its generator's version (``version``, by
    default the current one: kernels.base.generator_version). Weights are arguments, not source, so identical layers
    in any model share one key."""
    version = generator_version(op_name) if version is None else version
    h = xxhash.xxh64(f"{version}|{op_name}|{int(fp16)}".encode())
    for s in specs:
        h.update(s.source.replace(base_name, "K").encode())
        h.update(repr((s.global_size, s.local_size)).encode())
    return h.hexdigest()


def kernel_family(op_name: str, fp16: bool) -> str:
    """Kernels whose records may lend each other parameters: one op at one storage precision ("CONV_2D fp32").
    Which of a family's records fit a kernel is its generator's call (``KernelTraits.takes``), not the family's. A
    family named by the search space split at every knob or value a generator gained, and its lists follow the shape
    (a conv of one output slice offers ``tile_s`` 1 alone): twice it left most shipped records behind until they were
    remapped by hand (103 of the H100's 104, the Zen 5's 47 conv records), and again the H100's and H200's records of
    U-Net's transposed convs and of deep convs of DeepLab, SSD and MobileNet v2. Not the generator version
    either: a record says which version measured it, and whether its knobs are still a fair start is the reader's
    call (a shipped database outlives generator changes; this device's own records do not)."""
    return f"{op_name} {'fp16' if fp16 else 'fp32'}"


@dataclass(frozen=True)
class KernelTraits:
    """What the fallback chain (autotune.exchange) compares a kernel with a record of another kernel by: its family,
    its tensors' shape (how near), and whether it takes the record's point (``takes``). ``accepts``: the kernel's
    generator's verdict on a point (it generates the kernel with it, or refuses); None: the space's knob names
    alone decide."""

    family: str
    shape: tuple[int, ...]
    space: dict = field(default_factory=dict, compare=False)
    accepts: Callable[[dict], bool] | None = field(default=None, compare=False)

    @classmethod
    def of(cls, op_name: str, specs: list[KernelSpec], layouts: dict,
           accepts: Callable[[dict], bool] | None = None) -> KernelTraits:
        return cls(kernel_family(op_name, specs[0].fp16), kernel_shape(specs, layouts), dict(specs[0].space), accepts)

    def takes(self, params: dict) -> bool:
        """Whether ``params`` (a record's point) is a point of this kernel: every knob it names is one of the space's
        (a knob the space lacks, a wide conv's ``mem_lanes`` offered to a conv of one output channel, names another
        kind of kernel), and the generator generates the kernel with it (``accepts``; not the space's lists: they
        leave out what is the same code at this shape, a ``k_chunk`` past the input's slices, which a record of a
        deeper conv of this shape holds). A knob the point does not name takes the kernel's default: a record
        measured before the knob existed is as fair a start in the grown space as it was in the old one (a GPU's deep
        pointwise conv then shares its sum as its default does, ``k_split``; a 16-lane CPU's windowed conv reads its
        lanes from memory, ``mem_lanes``)."""
        return set(params) <= set(self.space) and (self.accepts is None or self.accepts(params))

    def unlisted(self, params: dict) -> int:
        """How many of a point's values this kernel's space does not list. A record of another shape lends only a
        point of none (another shape's values name another class of shapes: a tile of 4 output slices for a conv of
        one); between records of this shape, the one of fewer is the nearer kind of kernel (a shape holds the first
        kernel's tensors alone: MobileNet v2's expansion before a stride-2 depthwise conv has the shape of the one
        before a stride-1 conv, and its ``rows`` stop at the smaller output's height)."""
        return sum(1 for k, v in params.items() if k not in self.space or one_of(k, v, self.space[k]))


def kernel_shape(specs: list[KernelSpec], layouts: dict) -> tuple[int, ...]:
    """The BHWC dims of the first kernel's tensors, inputs then outputs: what "nearest" compares."""
    s = specs[0]
    return tuple(d for t in s.inputs + s.outputs if t in layouts for d in layouts[t].dims)


def kernel_channels(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The channel counts of a ``kernel_shape`` (its tensors' BHWC dims in a row): every fourth."""
    return tuple(shape[3::4])


def shape_distance(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """How far two kernels' shapes are (the sum of |log2| ratios of their dims); inf where they do not compare."""
    if len(a) != len(b) or not a:
        return math.inf
    return sum(abs(math.log2(max(x, 1)) - math.log2(max(y, 1))) for x, y in zip(a, b))


def _encode(v) -> str:
    return repr(v)


def _fingerprint(specs: list[KernelSpec]) -> str:
    h = xxhash.xxh64()
    for s in specs:
        h.update(s.source.encode())
        h.update(repr((s.global_size, s.local_size, [(a.kind, a.value if a.kind in ("int", "float") else None)
                                                      for a in s.args])).encode())
    return h.hexdigest()


def study_storage(url: str | None):
    import optuna

    if url is None:
        return optuna.storages.InMemoryStorage()
    from sqlalchemy.exc import SQLAlchemyError

    kwargs = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {}
    for attempt in range(8):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except ImportError as e:  # the URL's database driver is not installed
            raise RuntimeError(f"optuna storage {url!r} needs its database driver: {e} (PostgreSQL: "
                               "pip install 'psycopg[binary]'; MySQL: pip install pymysql)") from e
        except SQLAlchemyError as e:  # workers creating a fresh database's schema at the same moment
            if attempt == 7:
                raise RuntimeError(f"optuna storage {url!r} is not usable: {e}") from e
            time.sleep(0.2 + random.random() * 0.5 * (attempt + 1))
    raise AssertionError("unreachable")


class KernelTuner:
    def __init__(self, task: TuneTask, bench: KernelBench | None, device_key: str, *, mode: str, trials: int | None,
                 storage=None, seed: int = 0):
        self.task, self.bench, self.mode, self.max_trials = task, bench, mode, trials
        self.device_key, self.storage, self.seed = device_key, storage, seed
        self.values = {k: list(dict.fromkeys(list(v) + ([task.default[k]] if k in task.default else [])))
                       for k, v in task.space.items()}
        self.decode = {k: {_encode(x): x for x in vals} for k, vals in self.values.items()}
        self.measured: dict[str, float | None] = {}
        self.rejected, self.reasons = 0, []
        self.slower = 0  # (TuneResult.slower)
        self.ref = None
        self.default_us = None
        self.host_bound = False  # the default's host enqueues take longer than its kernels run (measure_default)
        self.trial_s = 0.0

    def study_name(self) -> str:
        return f"tflgpu-{xxhash.xxh64_hexdigest(self.device_key.encode())}-{self.task.key}"

    @property
    def shared(self) -> bool:
        """Whether the study lives in a storage other processes may share (not this process's memory)."""
        import optuna

        return self.storage is not None and not isinstance(self.storage, optuna.storages.InMemoryStorage)

    def fetch(self) -> TuneResult:
        """The decision other workers stored in the shared study, without measuring anything; a kernel
        nobody decided yet is "not in storage" (and not recorded)."""
        import optuna

        try:
            study = optuna.load_study(study_name=self.study_name(), storage=self.storage)
        except KeyError:
            study = None
        d = study.user_attrs.get("decision") if study is not None else None
        if not d:
            return TuneResult(self.task.key, self.task.op, {}, math.nan, math.nan, strategy=NOT_IN_STORAGE)
        params = {k: self.decode[k][v] for k, v in d["params"].items() if k in self.decode and v in self.decode[k]}
        if len(params) != len(d["params"]):  # knob values this version does not have: keep the heuristic
            return TuneResult(self.task.key, self.task.op, {}, math.nan, math.nan, strategy=NOT_IN_STORAGE)
        return TuneResult(self.task.key, self.task.op, params, d["default_us"], d["best_us"], trials=d["trials"],
                          strategy=FETCHED)

    def _announce(self, study, worker: str, state: str) -> None:
        """This worker's state in the shared study ("searching", refreshed every trial, or "done"): workers
        that finish first wait for those still searching, so all decide from the same trials."""
        if self.shared:
            study.set_user_attr(f"worker:{worker}", {"state": state, "at": time.time()})

    def _peers(self, study, worker: str) -> dict[str, dict]:
        """The other workers of this study heard from lately (worker key -> its state): one silent for longer
        than SETTLE_GONE_S plus three trials' time has stopped without saying so."""
        if not self.shared:
            return {}
        longest = max((t.duration.total_seconds() for t in study.get_trials(deepcopy=False)
                       if t.duration is not None), default=0.0)
        gone_after = SETTLE_GONE_S + 3 * max(longest, self.trial_s)
        now = time.time()
        return {k: v for k, v in study.user_attrs.items() if k.startswith("worker:") and k != f"worker:{worker}"
                and isinstance(v, dict) and now - float(v.get("at", 0)) < gone_after}

    def _settle(self, study, worker: str) -> None:
        """Wait until no other worker is searching this study and none of its trials is running, so every worker
        decides from the same trials."""
        import optuna

        if not self.shared:
            return
        limit = time.perf_counter() + SETTLE_MAX_S
        while time.perf_counter() < limit:
            searching = any(v.get("state") == "searching" for v in self._peers(study, worker).values())
            running = any(t.state == optuna.trial.TrialState.RUNNING for t in study.get_trials(deepcopy=False))
            if not searching and not running:
                return
            time.sleep(0.3)
        log.info("tuning %s: other workers still searching after %.0f s; deciding from the finished trials",
                 self.task.op, SETTLE_MAX_S)

    def _study_default_us(self, study, encoded: dict) -> float:
        """The heuristic default's time as the study has it (whoever measured it), so that workers sharing the
        study compare its best trial with the same number; this process's own measurement otherwise."""
        import optuna

        default = {k: _encode(v) for k, v in self.task.default.items() if k in encoded}
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            if t.params == default:
                return t.value
        return self.default_us

    def _store_decision(self, study, params: dict, default_us: float, best_us: float, trials: int) -> None:
        """The decision in the study, for workers that only fetch; one drawn from fewer trials never
        replaces one drawn from more."""
        if not self.shared:
            return
        old = study.user_attrs.get("decision")
        if old and old.get("trials", 0) > trials:
            return
        study.set_user_attr("decision", {"params": {k: _encode(v) for k, v in params.items()},
                                         "default_us": default_us, "best_us": best_us, "trials": trials})

    @property
    def least_budget_s(self) -> float:
        """The least budget in which ``run`` times one candidate besides the default (compiled and timed, and the
        confirmation's time left after it)."""
        return (TAIL_TRIALS + 1) * self.trial_s

    def measure_default(self) -> float:
        """Time the heuristic default (raises CandidateRejected if even it cannot run)."""
        t0 = time.perf_counter()
        specs = self.task.make({})
        timing = self.bench.time(specs)
        self.trial_s = time.perf_counter() - t0  # what one candidate costs (compile and timing): budgets use it
        self.ref, self.default_us = timing.outputs, timing.us
        self.host_bound = timing.host_bound
        self.measured[_fingerprint(specs)] = timing.us
        self.best_us = timing.us
        return timing.us

    def _specs(self, params: dict) -> list[KernelSpec]:
        """The candidate's kernels, or CandidateRejected before any compile when it cannot launch."""
        try:
            specs = self.task.make(params)
        except (Unsupported, ValueError) as e:  # a combination the generator refuses
            raise CandidateRejected(f"generator: {e}") from e
        limit = self.bench.device.identity.max_work_group_size
        for sp in specs:
            if sp.local_size is None:
                continue
            if len(sp.local_size) != len(sp.global_size) or math.prod(sp.local_size) > limit or any(
                    g % lc for g, lc in zip(sp.global_size, sp.local_size)):
                raise CandidateRejected(f"local size {sp.local_size} does not fit global {sp.global_size}")
        return specs

    def neighbors(self) -> list[dict]:
        """The default with one knob changed, each distinct kernel once: the first trials of every search (a
        hill-climbing step from the heuristic, as tinygrad's beam search starts), so a small budget is spent where
        the heuristic is most likely improvable. Taken a knob at a time in the space's order, round by round (each
        knob's first other value, then each one's second...), so that a search of a few trials (``FAST_TRIALS``:
        fast and background modes) tries every knob once before a second value of any: a GPU conv's first knobs
        (``tile_x``, 8 values) used to fill its 10 trials before its group tile's knobs (``k_split``,
        ``prefetch``) came up. Where the default is bound by the host's enqueues, the knobs that change its launches
        (``LAUNCH_KNOBS``) come first, every value of them: nothing else can make it faster."""
        seen = set(self.measured)
        per_knob: dict[str, list[tuple[str, dict]]] = {}
        for k, vals in self.values.items():
            for v in vals:
                if v == self.task.default.get(k):
                    continue
                p = {**self.task.default, k: v}
                try:
                    per_knob.setdefault(k, []).append((_fingerprint(self._specs(p)), p))
                except CandidateRejected:
                    continue
        launch = [k for k in per_knob if self.host_bound and k in LAUNCH_KNOBS]
        rest = [per_knob[k] for k in per_knob if k not in launch]
        order = [c for k in launch for c in per_knob[k]]
        order += [cands[r] for r in range(max(map(len, rest), default=0)) for cands in rest if r < len(cands)]
        out = []
        for fp, p in order:
            if fp not in seen:
                seen.add(fp)
                out.append(p)
        return out

    def evaluate(self, params: dict) -> float | None:
        try:
            specs = self._specs(params)
        except CandidateRejected as e:
            return self._reject(str(e))
        fp = _fingerprint(specs)
        if fp in self.measured:
            return self.measured[fp]
        try:
            us = self.bench.time(specs, best_us=self.best_us, ref=self.ref).us
        except CandidateSlower:
            self.measured[fp] = None
            self.slower += 1
            return None
        except CandidateRejected as e:
            self.measured[fp] = None
            return self._reject(str(e))
        self.measured[fp] = us
        self.best_us = min(self.best_us, us)
        return us

    def _confirm(self, study, trial, cand: dict, worker: str) -> tuple[float, float]:
        """(default µs, candidate µs) timed in alternation, so a winner measured while the machine
        happened to be fast does not look better than it is. Stored in the study: every worker
        sharing it decides from the same confirmation."""
        key = f"confirm:{trial.number}"
        got = study.user_attrs.get(key)
        if got is not None:
            return tuple(got)
        try:
            res = self.bench.compare(self.task.make({}), self._specs(cand))
        except CandidateRejected as e:
            self._reject(f"confirmation: {e}")
            return self.default_us, self.default_us
        if not self.shared:
            return res
        # workers that confirmed at the same moment: the first stored wins; one that stored (within the same
        # few milliseconds as another) reads back after a pause, so all take the value stored last
        # (``user_attrs`` reads the storage each time); alone, nothing to wait for
        got = study.user_attrs.get(key)
        if got is not None:
            return tuple(got)
        study.set_user_attr(key, list(res))
        if not self._peers(study, worker):
            return res
        time.sleep(0.5)
        return tuple(study.user_attrs[key])

    def _reject(self, why: str):
        self.rejected += 1
        if len(self.reasons) < 5:
            self.reasons.append(why)
        return None

    def run(self, budget_s: float | None) -> TuneResult:
        import optuna

        t0 = time.perf_counter()
        if self.default_us is None:
            self.measure_default()
        n = space_size(self.values)
        grid = n <= GRID_MAX or self.mode == "exhaustive"
        name = self.study_name()
        encoded = {k: [_encode(x) for x in v] for k, v in self.values.items()}
        sampler = (optuna.samplers.GridSampler(encoded, seed=self.seed) if grid
                   else optuna.samplers.TPESampler(seed=self.seed, n_startup_trials=4))
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(study_name=name, storage=self.storage, sampler=sampler,
                                    direction="minimize", load_if_exists=True)
        first = [self.task.default] + self.neighbors() if not study.trials else []
        for p in first:  # a fresh study: the default first, then its one-knob neighbors
            study.enqueue_trial({k: _encode(v) for k, v in p.items() if k in encoded})

        worker = f"{socket.gethostname()}:{os.getpid()}"
        self._announce(study, worker, "searching")

        interrupted: list[BaseException] = []  # Interrupted (the search's owner), or KeyboardInterrupt (Ctrl-C)
        ran = []  # trials this process ran

        def objective(trial):
            ran.append(trial.number)
            self._announce(study, worker, "searching")
            trial.set_user_attr("worker", worker)  # who measured it (trials are shared through the storage)
            params = {k: self.decode[k][trial.suggest_categorical(k, encoded[k])] for k in encoded}
            try:
                us = self.evaluate(params)
            except (Interrupted, KeyboardInterrupt) as e:  # the search's owner, or Ctrl-C, wants it to end: leave
                interrupted.append(e)  # the study cleanly (optuna logs a trial failed by Ctrl-C with its traceback)
                trial.study.stop()
                raise optuna.TrialPruned() from e
            if us is None:
                raise optuna.TrialPruned()
            return us

        compiles0 = self.bench.compiles
        n_trials = n + len(first) if grid else 20 * (self.max_trials or n)  # also caps cheap repeats

        def enough(study, trial):
            # the trial budget counts compiled candidates: repeats of a measured kernel and launch sizes
            # rejected before compiling cost almost nothing
            if self.max_trials is not None and self.bench.compiles - compiles0 >= self.max_trials:
                study.stop()

        # a trial is not interrupted: the last one starts while a whole one (and the confirmation) still fits
        deadline = None if budget_s is None else time.perf_counter() + budget_s - TAIL_TRIALS * self.trial_s
        for _ in range(5):
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            try:
                study.optimize(objective, n_trials=n_trials, timeout=left, catch=(), callbacks=[enough])
                break
            except (RuntimeError, ValueError) as e:  # shared storage: a trial another worker finished first
                log.info("tuning %s: %s; continuing", self.task.op, e)
        self._announce(study, worker, "done")
        if interrupted:
            raise interrupted[0]
        self._settle(study, worker)
        params, best_us, default_us = {}, self.default_us, self.default_us
        try:
            bt = study.best_trial
        except ValueError:  # no completed trial at all
            bt = None
        if bt is not None and bt.value < self._study_default_us(study, encoded) * (1 - MIN_GAIN):
            cand = {k: self.decode[k][v] for k, v in bt.params.items() if k in self.decode}
            default_us, us = self._confirm(study, bt, cand, worker)
            if us < default_us * (1 - MIN_GAIN):
                params, best_us = cand, us
            else:
                best_us = default_us
        done = sum(1 for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
        if done:
            self._store_decision(study, params, default_us, best_us, done)
        # no trial run here and none elsewhere beyond the default: not a search (not recorded)
        strategy = BUDGET_SPENT if not ran and done <= 1 else GRID if grid else TPE
        return TuneResult(self.task.key, self.task.op, params, default_us, best_us, trials=done,
                          measured=sum(1 for v in self.measured.values() if v is not None),
                          rejected=self.rejected, slower=self.slower, seconds=time.perf_counter() - t0,
                          strategy=strategy, reasons=self.reasons)


def kernel_share(rest_s: float, kernels: int, tuner: KernelTuner) -> float:
    """The search time of the next of ``kernels`` kernels with ``rest_s`` of the model budget left: an even share,
    or, where that is too short to time one candidate of it, what one candidate needs while the budget has it (a
    kernel whose compiles are slow is searched, not left unrecorded while the kernels after it leave time unused).
    """
    return min(rest_s, max(rest_s / kernels, tuner.least_budget_s))


def tune_tasks(tasks: list[TuneTask], bench_for: Callable[[TuneTask], KernelBench], device_key: str,
               config: TuningConfig) -> list[TuneResult]:
    """Tune every task within the model budget: the slowest defaults first, each kernel getting its
    ``kernel_share`` of what is left (what a fast kernel leaves unused flows to the next)."""
    start = time.perf_counter()  # (opening the storage counts: a fresh SQLite file takes a while)
    storage = study_storage(config.storage)
    if config.fetch_only:
        results = []
        for task in tasks:
            results.append(KernelTuner(task, None, device_key, mode=config.mode, trials=None,  # (measures nothing)
                                       storage=storage).fetch())
            if config.progress:
                config.progress(results[-1], len(results), len(tasks))
        return results
    budget = config.model_budget()
    tuners, unmeasured = [], []
    for task in tasks:
        tuner = KernelTuner(task, bench_for(task), device_key, mode=config.mode, trials=config.kernel_trials(),
                            storage=storage, seed=config.seed)
        if budget is not None and time.perf_counter() - start >= budget:  # not even its default timed
            unmeasured.append(TuneResult(task.key, task.op, {}, math.nan, math.nan, strategy=BUDGET_SPENT))
            continue
        try:
            tuner.measure_default()
        except CandidateRejected as e:
            log.info("not tuning %s (%s): the default itself fails: %s", task.op, task.key, e)
            continue
        tuners.append(tuner)
    tuners.sort(key=lambda t: -t.default_us)
    results = []
    for r in unmeasured:
        results.append(r)
        if config.progress:
            config.progress(r, len(results), len(tuners) + len(unmeasured))
    for i, tuner in enumerate(tuners):
        left = None
        if budget is not None:
            left = kernel_share(budget - (time.perf_counter() - start), len(tuners) - i, tuner)
            if left <= 0:
                r = TuneResult(tuner.task.key, tuner.task.op, {}, tuner.default_us, tuner.default_us,
                               strategy=BUDGET_SPENT)
                results.append(r)
                if config.progress:
                    config.progress(r, len(results), len(tuners) + len(unmeasured))
                continue
        r = tuner.run(left)
        log.info("tuned %s: %.0f -> %.0f us (%.2fx, %d measured, %d cut short as slower, %d rejected, %s) %s",
                 r.op, r.default_us, r.best_us, r.speedup, r.measured, r.slower, r.rejected, r.strategy, r.params)
        results.append(r)
        if config.progress:
            config.progress(r, len(results), len(tuners) + len(unmeasured))
    return results
