"""The background worker's jobs that change a plan's kernels (runtime.background runs them): building the
optimized program of a quick-built plan, regenerating steps with tuned parameters, and storing the tuned plan.
Each builds everything on the worker thread and hands the plan a ``Swap``; the plan installs it between
invokes."""

from __future__ import annotations

import logging

from ..kernels.common import dense_tensors
from ..kernels.program import build_program, compiled_sources, kernel_name, make_kernel
from .background import Background, Swap

log = logging.getLogger("tflgpu")


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
        specs = plan.make(s.op, s.epilogue, given)
        if params is None and [(sp.source, sp.global_size, sp.local_size) for sp in specs] == \
                [(sp.source, sp.global_size, sp.local_size) for sp in now]:
            continue
        if dense_tensors(specs) != dense_tensors(s.specs):  # (the plan's buffers are laid out for the old form)
            log.info("tuned parameters %s change which boundary tensors %s reads densely: not installed", params,
                     s.op.name)
            continue
        swap.specs[i], swap.params[i] = specs, dict(given)
    steps = list(swap.specs)
    if not steps:
        return
    if wait is not None:
        wait()
    sources = compiled_sources([sp for i in steps for sp in swap.specs[i]])
    program = build_program(plan.cl, plan.ctx, sources, plan.fp16, plan.store, plan.device)
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
    if not bg.status.kernels_improved:
        return
    bg.wait_idle()
    plan = bg.plan()
    if plan.cache is None:
        return
    pending = plan.swaps.pending()  # (read first: a swap installed meanwhile is then in the steps)
    sources = plan.save_record({i: (sw.specs[i], sw.params[i]) for sw in pending for i in sw.specs})
    build_program(plan.cl, plan.ctx, sources, plan.fp16, plan.store, plan.device)
    log.info("stored the tuned plan")
