"""Control flow (WHILE, IF, CALL_ONCE, and STABLEHLO_COMPOSITE: a call of its decomposition) and resource variables.

These ops call other subgraphs through the runtime that owns every
subgraph's runner; they hold no state of their own.
"""

from __future__ import annotations

import numpy as np

from .loops import UNFINISHED, LoopSlot
from .registry import KernelError, OpContext, register

MAX_WHILE_ITERATIONS = 100_000_000


def _subgraph(ctx: OpContext, option: str) -> int:
    """The subgraph an option names, checked at prepare: an index of one of the model's subgraphs."""
    idx = ctx.opt(option)
    n = len(ctx.runtime.model.subgraphs)
    if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < n:
        raise ctx.fail(f"{option} {idx!r} is not a subgraph of this model (it has {n})")
    return idx


@register("WHILE")
def while_op(ctx: OpContext):
    cond, body = _subgraph(ctx, "cond_subgraph_index"), _subgraph(ctx, "body_subgraph_index")
    rt = ctx.runtime
    slot = LoopSlot(rt, cond, body, MAX_WHILE_ITERATIONS)
    if hasattr(rt, "loops"):
        rt.loops.append(slot)  # (Interpreter.wait_background compiles it ahead of the first run)

    def interpreted(xs):
        vals = list(xs)
        for _ in range(MAX_WHILE_ITERATIONS):
            c = rt.run_subgraph(cond, vals)[0]
            if not bool(np.asarray(c).reshape(-1)[0]):
                return vals
            vals = rt.run_subgraph(body, vals)
        raise KernelError(f"WHILE did not finish within {MAX_WHILE_ITERATIONS} iterations")

    def run(xs):
        loop = slot.get() if cond != ctx.subgraph.index and body != ctx.subgraph.index else None
        if loop is None or loop.failed is not None:
            return interpreted(xs)
        out, status = loop.run(xs)
        if out is None:
            return interpreted(xs)
        if status == UNFINISHED:
            raise KernelError(f"WHILE did not finish within {MAX_WHILE_ITERATIONS} iterations")
        if not loop.checked and not loop.check(out, want := interpreted(xs)):
            return want
        return out

    return run


@register("IF")
def if_op(ctx: OpContext):
    then_g, else_g = _subgraph(ctx, "then_subgraph_index"), _subgraph(ctx, "else_subgraph_index")
    rt = ctx.runtime

    def run(xs):
        branch = then_g if bool(np.asarray(xs[0]).reshape(-1)[0]) else else_g
        return rt.run_subgraph(branch, list(xs[1:]))

    return run


@register("STABLEHLO_COMPOSITE")
def composite(ctx: OpContext):
    """A StableHLO composite (ai-edge-torch's ``odml.*`` blocks): its decomposition subgraph called on its inputs,
    as LiteRT runs it. (Plans for the OpenCL path inline the decomposition instead: graph.composite.)"""
    dec = _subgraph(ctx, "decomposition_subgraph_index")
    rt = ctx.runtime
    if dec == ctx.subgraph.index:
        raise ctx.fail(f"decomposition_subgraph_index {dec} is the subgraph the composite is in")
    sub = rt.model.subgraphs[dec]
    if len(sub.inputs) != len(ctx.op.inputs) or len(sub.outputs) != len(ctx.op.outputs):
        raise ctx.fail(f"{len(ctx.op.inputs)} inputs and {len(ctx.op.outputs)} outputs for a decomposition of "
                       f"{len(sub.inputs)} and {len(sub.outputs)}")
    return lambda xs: rt.run_subgraph(dec, list(xs))


@register("CALL_ONCE")
def call_once(ctx: OpContext):
    init = _subgraph(ctx, "init_subgraph_index")
    rt = ctx.runtime

    def run(xs):
        rt.call_once(init)
        return []

    return run


@register("VAR_HANDLE")
def var_handle(ctx: OpContext):
    key = (ctx.opt("container", "") or "", ctx.opt("shared_name", "") or "")
    rt = ctx.runtime
    return lambda xs: [np.array(rt.resource_id(key), dtype=np.int32)]


@register("ASSIGN_VARIABLE")
def assign_variable(ctx: OpContext):
    rt = ctx.runtime

    def run(xs):
        rt.resources[int(np.asarray(xs[0]).reshape(-1)[0])] = np.array(xs[1], copy=True)
        return []

    return run


@register("READ_VARIABLE")
def read_variable(ctx: OpContext):
    rt = ctx.runtime

    def run(xs):
        rid = int(np.asarray(xs[0]).reshape(-1)[0])
        if rid not in rt.resources:
            raise KernelError("READ_VARIABLE: the variable was never assigned")
        return [rt.resources[rid]]

    return run
