"""The background worker's jobs that change a plan's kernels (runtime.background runs them): building the
optimized program of a quick-built plan, regenerating steps with tuned parameters, and storing the tuned plan.
Each builds everything on the worker thread and hands the plan a ``Swap``; the plan installs it between
invokes."""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, replace

from ..autotune.tuner import MIN_GAIN
from ..kernels import Unsupported
from ..kernels.common import dense_tensors, relayout_cache
from ..kernels.program import build_program, compiled_sources, kernel_name, make_kernel
from .background import Background, Swap
from .selection import hand_over

log = logging.getLogger("tflgpu")

# the end-to-end check of a search's winners (check_plan): timed runs of each kernel set, alternated, within
# about this much time (at least MIN_ROUNDS each, however long a run takes)
CHECK_ROUNDS = 15
MIN_ROUNDS = 5
CHECK_S = 3.0


def tier_up(bg: Background) -> None:
    """Build the plan's program with the compiler's optimizations (stored in the cache) and queue new kernel
    instances of it for every device step. Runs at once: until it is done, the plan runs unoptimized code."""
    plan = bg.plan()
    steps = {i: list(s.specs) for i, s in enumerate(plan.steps) if s.device == "gpu"}
    sources = compiled_sources([spec for specs in steps.values() for spec in specs])
    stats: dict = {}
    program = build_program(plan.cl, plan.ctx, sources, plan.fp16, plan.store, plan.device, stats)
    kernels = {i: plan.io.kernels(program, i, specs) for i, specs in steps.items()}
    plan.swaps.post(Swap("optimized program", program, kernels))
    bg.optimized()
    log.info("optimized program ready (%s)", "loaded" if stats.get("binary_loads") else "built")


def retune_steps(plan, op_indices: list[int], params: dict | None, what: str, wait=None) -> None:
    """Queue the device steps of these ops regenerated with ``params`` (None: each with its own, the latest a
    queued swap gives it; a composite step's parts with what their records say now, and only where that changes
    its kernels): their program built (and stored; after ``wait()``, the idle gate of a background search), their
    constants uploaded, their kernels bound to the plan's buffers."""
    index = {s.op.index: i for i, s in enumerate(plan.steps) if s.device == "gpu"}
    steps = [index[op] for op in op_indices if op in index]
    if not steps:
        return
    swap = Swap(f"tuned {what}", None, {})
    queued = {i: (sw.specs[i], sw.params[i]) for sw in plan.swaps.pending() for i in sw.specs}
    for i in steps:
        s = plan.steps[i]
        now, own = queued.get(i, (s.specs, s.params))
        given = own if params is None else params
        try:
            specs = plan.make(s.op, s.epilogue, given)
        except Unsupported as e:  # (a point this plan's form refuses: a block reading a handed-over input, unfused)
            log.info("tuned parameters %s do not apply to %s in this plan (%s): not installed", given, s.op.name, e)
            continue
        if params is None and [(sp.source, sp.global_size, sp.local_size) for sp in specs] == \
                [(sp.source, sp.global_size, sp.local_size) for sp in now]:
            continue
        # (the plan's boundary buffers and the tensors it hands over between steps are laid out for the old form; a
        # tensor a composite's unfused form hands on densely between its own kernels is the step's: kernels.separable)
        laid = set(plan.sg.inputs) | set(plan.sg.outputs) | set(plan.make.handover)
        if dense_tensors(specs) & laid != dense_tensors(s.specs) & laid:
            log.info("tuned parameters %s change which tensors %s reads or writes densely: not installed", params,
                     s.op.name)
            continue
        swap.specs[i], swap.params[i] = specs, dict(given)
    steps = list(swap.specs)
    if not steps:
        return
    if wait is not None:
        wait()
    sources = compiled_sources([sp for i in steps for sp in swap.specs[i]])
    program = build_program(plan.cl, plan.ctx, sources, plan.fp16, plan.store, plan.device, memo=plan.built)
    for i in steps:
        scratch = plan.io.scratch_buffers(swap.specs[i])
        swap.scratch.update(scratch)
        args, consts = plan.io.upload_args(swap.specs[i], scratch)
        swap.args[i] = (args, consts)
        swap.kernels[i] = [make_kernel(plan.cl, program, kernel_name(sp), a) for sp, a in zip(swap.specs[i], args)]
        swap.specs[i] = [sp.uploaded() for sp in swap.specs[i]]  # (the device holds the constants now)
    plan.swaps.post(swap)


def store_tuned_plan(bg: Background) -> None:
    """With any kernel tuned: store the plan's record (its steps as they are once the queued swaps are installed)
    and the whole program with the tuned kernels, so the next start loads the tuned plan directly."""
    if not bg.status.kernels_improved or bg.status.reverted:
        return
    bg.wait_idle()
    plan = bg.plan()
    if plan.cache is None:
        return
    pending = plan.swaps.pending()  # (read first: a swap installed meanwhile is then in the steps)
    tuned = next_start_steps(plan, {i: (sw.specs[i], sw.params[i]) for sw in pending for i in sw.specs})
    sources = plan.save_record(tuned)
    build_program(plan.cl, plan.ctx, sources, plan.fp16, plan.store, plan.device)
    log.info("stored the tuned plan")


def next_start_steps(plan, tuned: dict[int, tuple[list, dict]]) -> dict[int, tuple[list, dict]]:
    """``tuned`` ((specs, parameters) by step index) with the steps a start from the stored record will make:
    it runs ``selection.hand_over`` again, with the tuned parameters, which may hand over a tensor the start's
    parameters kept in the slice layout (a step's kernel taking a dense input only in its tuned form), so its
    program, and the key of the binary stored for it, is that one, not the live plan's (whose hand-overs stay as
    the plan was built)."""
    if not plan.config.hand_over:
        return tuned
    steps = [replace(s, specs=tuned[i][0], params=tuned[i][1]) if i in tuned else replace(s)
             for i, s in enumerate(plan.steps)]
    before = [s.specs for s in steps]
    with relayout_cache():
        hand_over(steps, plan.make)
    return {**tuned, **{i: (s.specs, s.params) for i, (s, was) in enumerate(zip(steps, before)) if s.specs is not was}}


@dataclass(frozen=True)
class StepKernels:
    """One device step's kernels and what they were made from: enough to launch them, or to put them back."""

    kernels: list
    specs: list
    params: dict
    args: tuple  # (argument values, constant buffers): what keeps their buffers alive


def kernel_sets(plan) -> dict[int, StepKernels]:
    """Each device step's kernels as they will be once the queued swaps are installed. Call it holding off
    invokes (``Activity.exclusive``): an invoke installs swaps."""
    sets = {i: StepKernels(s.kernels, s.specs, s.params, (plan.io.args[i], plan.io.const_buffers[i]))
            for i, s in enumerate(plan.steps) if s.device == "gpu"}
    for sw in plan.swaps.pending():
        for i, kernels in sw.kernels.items():
            was = sets[i]
            sets[i] = StepKernels(kernels, sw.specs.get(i, was.specs), sw.params.get(i, was.params),
                                  sw.args.get(i, was.args))
    return sets


def checkable(plan) -> str:
    """Why the plan's own kernels may not be launched outside an invoke ("" where they may): a caller's bound
    buffer (an output read on demand would change) or state kept between invokes (it would advance)."""
    if plan.io.bound:
        return "the caller's buffers are bound to it"
    if plan.io.tensors.state_tensors:
        return "it keeps state between invokes"
    return ""


def time_kernel_sets(bg: Background, sets: list[dict[int, StepKernels]]) -> list[list[float]]:
    """Seconds of runs of each set of the plan's device-step kernels (enqueued in step order, then a finish),
    on the plan's own buffers and queue, alternated (each round in the other order; the first round untimed),
    every run in idle time with invokes held off. The host steps between are not run: what differs between the
    sets is the device's work and its launches."""
    cl = bg.plan().cl
    times: list[list[float]] = [[] for _ in sets]
    started = time.perf_counter()
    for r in range(CHECK_ROUNDS + 1):
        if r > MIN_ROUNDS and time.perf_counter() - started > CHECK_S:
            break
        for j in (range(len(sets)) if r % 2 == 0 else reversed(range(len(sets)))):
            with bg.activity.exclusive():
                q = bg.plan().queue
                t0 = time.perf_counter()
                for i in sorted(sets[j]):
                    st = sets[j][i]
                    for spec, k in zip(st.specs, st.kernels):
                        cl.enqueue_nd_range_kernel(q, k, spec.global_size, spec.local_size)
                q.finish()
                if r:
                    times[j].append(time.perf_counter() - t0)
    return times


def check_plan(bg: Background, start: dict[int, StepKernels]) -> bool:
    """After a background search: time the plan's kernels as the search leaves them against ``start`` (as they
    were before it), end to end. Each winner beat its kernel's start alone; together, in the plan, they may not
    (a fused pair that saves a launch but runs slower beside its neighbours). Where the search's kernels are
    slower by more than timing noise (``MIN_GAIN``), the start's are queued back. Returns whether they were
    (the caller then records the start as these kernels' choice); ``bg.status`` holds both times."""
    with bg.activity.exclusive():  # (the plan only while needed: a worker must not keep it alive)
        why, tuned = checkable(bg.plan()), kernel_sets(bg.plan())
    if why:
        log.info("the search's kernels are not checked end to end: %s", why)
        return False
    changed = [i for i in tuned if tuned[i].kernels is not start[i].kernels]
    if not changed:
        return False
    before, after = (statistics.median(t) for t in time_kernel_sets(bg, [start, tuned]))
    bg.status.plan_start_us, bg.status.plan_tuned_us = before * 1e6, after * 1e6
    if after <= before * (1 + MIN_GAIN):
        log.info("the search's kernels end to end: %.0f us, the start's %.0f us: kept", after * 1e6, before * 1e6)
        return False
    swap = Swap("the start's kernels back (the search's were slower together)", None, {})
    for i in changed:
        st = start[i]
        swap.kernels[i], swap.specs[i], swap.params[i], swap.args[i] = st.kernels, st.specs, st.params, st.args
    bg.plan().swaps.post(swap)
    bg.status.reverted = True
    log.info("the search's kernels end to end: %.0f us, the start's %.0f us: the start's put back",
             after * 1e6, before * 1e6)
    return True
