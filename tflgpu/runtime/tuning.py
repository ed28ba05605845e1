"""What the autotuner decides for a plan's device steps: each tunable kernel identity gets its stored
record's parameters, or (unless tuning is "none") a search's, and its steps are regenerated with them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

from ..autotune import TuneResult, TuneTask, kernel_key, tune_tasks
from ..autotune.exchange import NearestRecords
from ..autotune.measure import CandidateRejected
from ..autotune.tuner import KernelTraits, KernelTuner, kernel_share, space_size, study_storage
from ..kernels import KernelSpec, Unsupported
from ..kernels.base import Part, parts_of, runs_parts
from ..kernels.program import shared_base
from ..model.ir import Operator
from ..ops.layout import bhwc
from .background import lower_thread_priority
from .selection import KernelMaker, Step
from .upgrades import check_plan, kernel_sets, retune_steps

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
    source: str  # "record" (this device's) | "database: <link>" (the nearest device's: autotune.exchange) | "tuned" (searched now)
    result: object = None  # the TuneResult, when searched now
    flops: int = 0  # per launch of one layer

    @property
    def speedup(self) -> float:
        return self.default_us / self.best_us if self.best_us > 0 else 1.0


@dataclass
class Identity:
    """One tunable kernel identity of a plan: the steps that launch it as their own kernels (``steps``) and the
    composite steps whose unfused form launches it as one of their parts (``hosts``: kernels.base.unfused, each
    part generated with its ``PartRecords``), with the op, fused ops and kernels that stand for it."""

    op: Operator
    epilogue: list
    specs: list[KernelSpec]  # as the plan generates it now
    ops: list  # every op the kernels compute (their tensors' layouts)
    steps: list[Step]
    hosts: list[Step]

    @property
    def layers(self) -> int:
        return len(self.steps) + len(self.hosts)

    def taking(self, key: str, rec) -> TunedKernel:
        """The identity (``key``) as one that takes its record ``rec`` of this device."""
        return TunedKernel(key, self.op.name, self.layers, rec.default_us, rec.best_us, rec.params, "record",
                           flops=sum(sp.flops for sp in self.specs))


def _identities(steps: list[Step], make: KernelMaker, explicit: set,
                parts: PartRecords | None) -> dict[str, Identity]:
    """The tunable device steps by kernel identity (identical layers share one). A step a stored plan restored
    with parameters is keyed by its default's code like any other: its parameters may be a record of this device
    (then found again) or only a start from the database's fallback chain (then still searched). With ``parts``,
    the parts a composite step runs unfused are identities too, keyed as a step of that op alone would be (so
    a record serves both)."""
    found: dict[str, Identity] = {}
    for s in steps:
        if s.device != "gpu" or s.op.index in explicit or not s.specs:
            continue
        if not _searchable(make, s.specs):
            continue
        try:  # (a composite op's unfused default has its parts' records: its key is its heuristics')
            default = make.heuristic(s.op, s.epilogue) if s.params or parts_of(s.op, s.epilogue) or make.handover \
                else s.specs
        except Unsupported:  # (cannot happen for a step the generator made; kept out of tuning if it does)
            continue
        key = _key(s.op, default)
        if key not in found:
            found[key] = Identity(s.op, s.epilogue, s.specs, [op for op, _ in s.members], [], [])
        found[key].steps.append(s)
    if parts is not None:
        for s in steps:
            if s.device == "gpu" and s.op.index not in explicit:
                for part in runs_parts(s.op, s.epilogue, s.specs):
                    _add_part(found, make, parts, part, s)
    return found


def _add_part(found: dict[str, Identity], make: KernelMaker, parts: PartRecords, part: Part, host: Step) -> None:
    """The part (and, where it is a composite running unfused too, its parts) as an identity ``host`` launches."""
    key = parts.key(make, part.op, part.epilogue)
    if key is None:
        return
    try:
        specs = make(part.op, part.epilogue, parts(make, part.op, part.epilogue))
    except Unsupported:
        return
    if not _searchable(make, specs):
        return
    if key not in found:
        found[key] = Identity(part.op, part.epilogue, specs, _part_ops(part), [], [])
    if host not in found[key].hosts:
        found[key].hosts.append(host)
    for inner in runs_parts(part.op, part.epilogue, specs):
        _add_part(found, make, parts, inner, host)


def _searchable(make: KernelMaker, specs: list[KernelSpec]) -> bool:
    """Whether a search can time these kernels: more than one point to try, no state kept between invokes, and
    every tensor of a BHWC shape (the bench's inputs)."""
    return space_size(specs[0].space) > 1 and not any(sp.state for sp in specs) and \
        all(bhwc(make.sg.tensors[t].shape) is not None for sp in specs for t in sp.inputs + sp.outputs)


def _part_ops(part: Part) -> list[Operator]:
    """Every op a part computes, a composite part's parts' too (a candidate of it may store their values)."""
    return [part.op, *(f.op for f in part.epilogue)] + [op for inner in parts_of(part.op, part.epilogue)
                                                         for op in _part_ops(inner)]


def _key(op: Operator, default: list[KernelSpec]) -> str:
    return kernel_key(op.name, default, default[0].fp16, shared_base(default))


def _layouts(make: KernelMaker, specs: list[KernelSpec], ops) -> dict:
    """The BHWC layout of every tensor of the kernels and of their ops (a candidate may store a value the default
    keeps in registers)."""
    layouts = {t: bhwc(make.sg.tensors[t].shape) for sp in specs for t in sp.inputs + sp.outputs}
    layouts.update({t: lay for op in ops for t in op.inputs + op.outputs
                    if t >= 0 and t not in layouts and (lay := bhwc(make.sg.tensors[t].shape)) is not None})
    return layouts


def _at(make: KernelMaker, op: Operator, epilogue: list) -> tuple:
    """Where a part is in a plan: its op and fused ops (by name too: a composite op takes the index of one of its
    parts, a separable conv its pointwise conv's), for the maker that generates it."""
    return id(make), op.name, op.index, tuple(f.op.index for f in epilogue)


class PartRecords:
    """What a composite op's unfused form (kernels.base.unfused) generates each of its parts with: the part's own
    record of this device (or what a search of it decided: ``learn``), else the nearest device's
    (``autotune.exchange``), as a step of that op alone would have them; {} where there is none or it does not
    apply to the part (another shape's work-group size: the rest of it). A KernelMaker's ``part_params``; looked
    up once per part and plan. ``nearest``: the plan's fallback chain, shared with ``apply_tuning`` (None: this
    device's records only)."""

    def __init__(self, db, device_key: str, nearest: NearestRecords | None):
        self.db, self.device_key, self.nearest = db, device_key, nearest
        # where -> (the maker, held: its id stays its own; the part's key, None: nothing to tune; its heuristics)
        self._keys: dict[tuple, tuple[KernelMaker, str | None, list[KernelSpec]]] = {}
        self._params: dict[tuple, dict] = {}
        self._learned: dict[str, dict] = {}

    def __call__(self, make: KernelMaker, op: Operator, epilogue: list) -> dict:
        at = _at(make, op, epilogue)
        if at not in self._params:
            self._params[at] = self._lookup(make, op, epilogue)
        return self._params[at]

    def key(self, make: KernelMaker, op: Operator, epilogue: list) -> str | None:
        """The part's kernel identity (its heuristics' key, as a step of the op alone has it); None where it has
        nothing to tune."""
        return self._heuristic(make, op, epilogue)[0]

    def _heuristic(self, make: KernelMaker, op: Operator, epilogue: list) -> tuple[str | None, list[KernelSpec]]:
        at = _at(make, op, epilogue)
        if at not in self._keys:
            try:
                default = make.heuristic(op, epilogue)
            except Unsupported:
                default = []
            tunable = bool(default) and space_size(default[0].space) > 1
            self._keys[at] = (make, _key(op, default) if tunable else None, default)
        return self._keys[at][1:]

    def learn(self, key: str, params: dict) -> None:
        """What a search of part kernel ``key`` decided (this device's record now): the parts of that identity
        are generated with it from here on."""
        self._learned[key] = params
        for at, (_, k, _) in self._keys.items():
            if k == key:
                self._params.pop(at, None)

    def _lookup(self, make: KernelMaker, op: Operator, epilogue: list) -> dict:
        key, default = self._heuristic(make, op, epilogue)
        if key is None:
            return {}
        if key in self._learned:
            params = self._learned[key]
        else:
            rec = self.db.get(self.device_key, key)
            if rec is None and self.nearest is not None:
                layouts = _layouts(make, default, [op, *(f.op for f in epilogue)])
                found = self.nearest.find(key, KernelTraits.of(op.name, default, layouts,
                                                               generator_takes(make, op, epilogue)))
                rec = found.record if found is not None else None
            params = rec.params if rec is not None else {}
        if not params:
            return {}
        applied = _applied(make, op, epilogue, params)
        return applied[1] if applied is not None else {}


@dataclass
class Untuned:
    """A kernel identity of the plan with no record: what a search needs, the steps that launch it, and the
    composite steps whose unfused form does (``hosts``: regenerated once ``parts`` has learned the decision)."""

    task: TuneTask
    steps: list[Step]
    hosts: list[Step] = field(default_factory=list)
    parts: PartRecords | None = None
    flops: int = 0  # per launch of one layer

    @property
    def layers(self) -> int:
        return len(self.steps) + len(self.hosts)

    def decided(self, params: dict) -> bool:
        """Tell the plan's part records what the search decided (the hosts' unfused forms take it); whether any
        host is to be regenerated."""
        if not self.hosts or self.parts is None:
            return False
        self.parts.learn(self.task.key, params)
        return True


def apply_tuning(steps: list[Step], make: KernelMaker, config, device_key: str, bench: Callable,
                 explicit: set, nearest: NearestRecords | None = None, parts: PartRecords | None = None,
                 restored: bool = False) -> tuple[list[TunedKernel], float, list[Untuned]]:
    """Give every tunable device step its recorded parameters; search those without a record now when
    ``config.mode`` is "fast" or "exhaustive" (``bench(task)`` measures candidates), record the results, and
    regenerate the steps' kernels. A kernel without a record of this device starts from the nearest device's
    (``nearest``: the device's fallback chain, autotune.exchange), and a search starts there too. With ``parts``
    (the plan's KernelMaker's part records), the kernels composite steps launch unfused are searched as well,
    their records found there, and the steps regenerated with a search's decision. ``restored``: the steps are a
    stored plan's: a kernel without a record keeps its stored parameters (compiled already) as its start, not
    the nearest device's.
    Returns what was decided per identity, the seconds searched, and the kernels left without a record (for a
    background search, with ``config.mode`` "background")."""
    found = _identities(steps, make, explicit, parts)
    decided, todo = [], []
    reuse = config.db is not None and config.reuse_records
    # steps a record gives other parameters (a stored plan's composite may launch its parts now; one that starts
    # from the nearest device's record is searched itself, and its parts after it, if it stays unfused)
    changed: list[Step] = []
    for key, ident in found.items():
        flops = sum(sp.flops for sp in ident.specs)
        rec = config.db.get(device_key, key) if reuse else None
        if rec is not None:  # (the hosts' part records found it too)
            if any(s.params != rec.params for s in ident.steps):  # (a stored plan may have them already)
                set_params(ident.steps, make, rec.params)
                changed.extend(ident.steps)
            decided.append(ident.taking(key, rec))
            continue
        layouts = _layouts(make, ident.specs, ident.ops)
        near = (nearest.find(key, KernelTraits.of(ident.op.name, ident.specs, layouts,
                                                  generator_takes(make, ident.op, ident.epilogue)))
                if nearest is not None and not restored else None)
        if near is not None:
            set_params(ident.steps, make, near.record.params)
            if config.mode in ("none", "background"):  # (a search now reports its own result)
                decided.append(TunedKernel(key, ident.op.name, ident.layers, near.record.default_us,
                                           near.record.best_us, near.record.params, f"database: {near.level}",
                                           flops=flops))
        if config.mode != "none":
            todo.append(_untuned(key, ident, make, parts, layouts))
    known = set(found)

    def listed_parts(hosts: list[Step]) -> list[Untuned]:
        """The parts ``hosts`` launch unfused that the plan has not listed yet: one with a record of this device
        is listed as taking it (the hosts' part records generated it with it); the others are returned."""
        unrecorded = []
        for key, ident in host_parts(hosts, parts, make).items():
            if key in known:
                continue
            known.add(key)
            rec = config.db.get(device_key, key)  # (parts: records are reused)
            if rec is not None:
                decided.append(ident.taking(key, rec))
            else:
                unrecorded.append(_untuned(key, ident, make, parts))
        return unrecorded

    unrecorded = listed_parts(changed)  # (a stored plan's composite that a record now runs unfused: its parts)
    if config.mode != "none":
        todo += unrecorded
    if not todo or config.mode == "background":
        return decided, 0.0, todo
    t0 = time.perf_counter()
    budget, this_round = config.model_budget(), config
    while todo:  # (then the parts of composites the search left unfused, which started fused: none searched yet)
        results = tune_tasks([u.task for u in todo], bench, device_key, this_round)
        untuned = {u.task.key: u for u in todo}
        records, hosts, todo = {}, {}, []
        for r in results:
            u = untuned[r.key]
            kept = u.task.kept(r)  # (the winner's parameters, else the start's, which the steps have already)
            set_params(u.steps, make, r.params)
            u.decided(kept)
            hosts.update({id(h): h for h in u.hosts})
            decided.append(TunedKernel(r.key, r.op, u.layers, r.default_us, r.best_us, kept, "tuned", r,
                                       flops=u.flops))
            if r.decided:
                records[r.key] = u.task.record(r)
        for h in hosts.values():  # (their parts' decisions, whatever their own)
            regenerate(h, make)
        if records and config.db is not None:
            config.db.put_many(device_key, records)
        todo = listed_parts([s for r in results for s in untuned[r.key].steps])
        if todo and budget is not None:  # (one budget for the model, the parts' round included)
            left = budget - (time.perf_counter() - t0)
            if left <= 0:
                log.info("tuning budget spent: %d kernels of blocks the search left unfused are searched at the next "
                         "start", len(todo))
                break
            this_round = replace(config, budget_s=left)
    seconds = time.perf_counter() - t0
    log.info("tuned %d kernels in %.1f s", sum(t.source == "tuned" for t in decided), seconds)
    return decided, seconds, []


def _untuned(key: str, ident: Identity, make: KernelMaker, parts: PartRecords | None,
             layouts: list | None = None) -> Untuned:
    """The search of kernel identity ``key``: its space, its generator's default, where it starts (its steps'
    parameters now, or a part's record), and the steps and hosts a decision regenerates."""
    layouts = layouts if layouts is not None else _layouts(make, ident.specs, ident.ops)
    space = ident.specs[0].space
    default = {k: ident.specs[0].params.get(k, None if None in v else v[0]) for k, v in space.items()}
    start = ident.steps[0].params if ident.steps else parts(make, ident.op, ident.epilogue)
    traits = KernelTraits.of(ident.op.name, ident.specs, layouts)
    task = TuneTask(key, ident.op.name, lambda p, i=ident: make(i.op, i.epilogue, p), space, default, layouts,
                    traits.family, traits.shape, dict(start))
    return Untuned(task, ident.steps, ident.hosts, parts, sum(sp.flops for sp in ident.specs))


def unsearched_parts(hosts: list[Step], parts: PartRecords | None, make: KernelMaker, db, device_key: str,
                     params: dict | None = None) -> list[Untuned]:
    """The parts that composite steps ``hosts`` launch as they are now (or as ``params``, a search's decision not
    installed yet, generates them), where that is unfused, that have no record of this device: a plan that
    started them fused had none of them among its kernels, so they still run their heuristics (or the nearest
    device's record) and would be searched at the next start instead."""
    return [_untuned(key, ident, make, parts) for key, ident in host_parts(hosts, parts, make, params).items()
            if db is None or db.get(device_key, key) is None]


def host_parts(hosts: list[Step], parts: PartRecords | None, make: KernelMaker,
               params: dict | None = None) -> dict[str, Identity]:
    """The kernel identities of the parts composite steps ``hosts`` launch as they are now (or as ``params``
    generates them), where that is unfused (none without ``parts``: a plan without records fuses them)."""
    if parts is None:
        return {}
    found: dict[str, Identity] = {}
    for s in hosts:
        try:
            specs = s.specs if params is None else make(s.op, s.epilogue, params)
        except Unsupported:  # (a decision this host's form refuses, as one reading a handed-over tensor may: the
            continue  # swap leaves it as it is, runtime.upgrades)
        for part in runs_parts(s.op, s.epilogue, specs):
            _add_part(found, make, parts, part, s)
    return found


def regenerate(step: Step, make: KernelMaker) -> None:
    """The step's kernels generated again with its parameters (a composite's parts with what their records say
    now)."""
    applied = _applied(make, step.op, step.epilogue, step.params)
    if applied is not None:
        step.specs = applied[0]


def _uneven_groups(specs: list[KernelSpec]) -> bool:
    """A work-group size that does not divide its launch's grid (OpenCL 1.2 refuses such a launch)."""
    return any(sp.local_size and any(g % w for g, w in zip(sp.global_size, sp.local_size)) for sp in specs)


def set_params(steps: list[Step], make: KernelMaker, params: dict) -> None:
    """Regenerate ``steps`` with these generator parameters (those they do not apply to keep theirs). Parameters
    from another kernel (a neighbour's, another device's) may name a work-group size that does not divide this
    kernel's grid: a conv fits it to its grid (kernels.knobs.fitted); for any other kernel the rest of them apply,
    with the runtime choosing the work-group size."""
    if not params:
        return
    for s in steps:
        applied = _applied(make, s.op, s.epilogue, params)
        if applied is not None:
            s.specs, s.params = applied[0], dict(applied[1])
            params = applied[1]


def _applied(make: KernelMaker, op: Operator, epilogue: list, params: dict,
             quiet: bool = False) -> tuple[list[KernelSpec], dict] | None:
    """``op``'s kernels with these parameters, and the parameters that gave them: without the work-group size
    where it does not divide the grid; None where they do not apply (logged, unless ``quiet``)."""
    try:
        specs = make(op, epilogue, params)
        if _uneven_groups(specs) and params.get("local_size") is not None:
            params = {**params, "local_size": None}
            specs = make(op, epilogue, params)
    except Unsupported as e:  # a record from another shape family: keep the heuristics
        if not quiet:
            log.info("tuned parameters %s do not apply to %s: %s", params, op.name, e)
        return None
    if _uneven_groups(specs):
        if not quiet:
            log.info("tuned parameters %s give %s uneven work-groups: kept the heuristics", params, op.name)
        return None
    return specs, params


def generator_takes(make: KernelMaker, op: Operator, epilogue: list) -> Callable[[dict], bool]:
    """Whether ``op``'s generator takes a point (a record's, which the fallback chain weighs for it): the
    ``accepts`` of its ``KernelTraits``."""
    return lambda params: _applied(make, op, epilogue, params, quiet=True) is not None


def background_jobs(untuned: list[Untuned], config, device_key: str, bench: Callable) -> list[Callable]:
    """The background search of ``untuned`` kernels as jobs for ``runtime.background.Background``: first
    every default is timed (while idle), then the kernels are searched slowest first (default time times the
    layers sharing it), each within its share of what is left of the budget (``kernel_share``), and last the
    winners are checked together, end to end (``confirm``). ``bench(task)`` makes a KernelBench; each job gets
    the Background it runs in."""
    budget = config.model_budget()
    if not untuned or budget == 0:
        return []
    tuners: list[tuple[KernelTuner, Untuned]] = []
    spent = [0.0]

    storage = []  # (the study storage: opened by the first job, in the worker thread)

    def measured(bg, u: Untuned) -> KernelTuner | None:
        """A tuner of ``u`` with its default timed (while idle); None where the default itself fails."""
        b = bench(u.task)
        b.gate = bg.wait_idle

        def make(params, make=u.task.make):  # (a candidate's kernels read weights: not once the source changed)
            bg.activity.check()
            return make(params)

        tuner = KernelTuner(replace(u.task, make=make), b, device_key, mode="background", trials=config.kernel_trials(),
                            storage=storage[0], seed=config.seed)
        t0 = time.perf_counter()
        try:
            tuner.measure_default()
        except CandidateRejected as e:
            log.info("not tuning %s in the background: the default itself fails: %s", u.task.op, e)
            bg.tuned(0.0, 0.0, False, searched=False)
            return None
        finally:
            spent[0] += time.perf_counter() - t0
        return tuner

    def measure_defaults(bg) -> None:
        lower_thread_priority()
        storage.append(study_storage(config.storage))
        for u in untuned:
            tuner = measured(bg, u)
            if tuner is not None:
                tuners.append((tuner, u))
        tuners.sort(key=lambda tu: -tu[0].default_us * tu[1].layers)

    start: list[dict] = []  # the plan's kernels before the search (upgrades.kernel_sets)
    won: list[tuple[Untuned, TuneResult]] = []  # the searches whose winners the plan took

    def search(bg) -> None:
        with bg.activity.exclusive():
            start.append(kernel_sets(bg.plan()))
        queued = {u.task.key for _, u in tuners}
        for i, (tuner, u) in enumerate(tuners):  # (the parts of a block it leaves unfused join the list as it goes)
            left = kernel_share(budget - spent[0], len(tuners) - i, tuner)
            if left <= 0:
                log.info("background tuning: budget of %.0f s spent, %d kernels left", budget, len(tuners) - i)
                return
            # (no records at all: nobody to share the kernel with, so it is ours)
            with config.db.claim(device_key, u.task.key) if config.db is not None else nullcontext(True) as mine:
                if not mine or (config.db is not None and config.db.get(device_key, u.task.key) is not None):
                    bg.tuned(0.0, 0.0, False, searched=False)  # another searcher has it, or had it
                    continue
                t0 = time.perf_counter()
                r = tuner.run(left)
                spent[0] += time.perf_counter() - t0
                if config.db is not None and r.decided:  # (one the budget left unsearched: the next start's)
                    config.db.put(device_key, r.key, u.task.record(r))
            log.info("background tuning %s: %.0f -> %.0f us (%.2fx) %s", r.op, r.default_us, r.best_us, r.speedup,
                     r.params)
            if r.params:
                won.append((u, r))
                retune_steps(bg.plan(), [s.op.index for s in u.steps], r.params, r.op, wait=bg.wait_idle)
                if u.decided(r.params):  # (each host with its own parameters, its parts with their records)
                    retune_steps(bg.plan(), [h.op.index for h in u.hosts], None, f"{r.op}'s hosts",
                                 wait=bg.wait_idle)
            if r.params.get("fused") is False:  # (a composite left unfused launches its parts: theirs next)
                more = unsearched_parts(u.steps, u.parts, bg.plan().make, config.db, device_key, r.params)
                for p in (p for p in more if p.task.key not in queued):
                    queued.add(p.task.key)
                    bg.more(1)
                    tuner = measured(bg, p)
                    if tuner is not None:
                        tuners.append((tuner, p))
            bg.tuned(r.default_us, r.best_us, bool(r.params))

    def confirm(bg) -> None:
        """The winners together, end to end (upgrades.check_plan); where they were slower than the start, each
        kernel's record becomes its start's (TuneTask.overruled), so later starts keep the start and search them
        no more."""
        if won and check_plan(bg, start[0]) and config.db is not None:
            config.db.put_many(device_key, {u.task.key: u.task.overruled(r) for u, r in won})

    return [measure_defaults, search, confirm]

