"""Control flow (WHILE, IF, CALL_ONCE, and STABLEHLO_COMPOSITE: a call of its decomposition), resource variables and
hash tables (a text model's vocabulary: HASHTABLE / _IMPORT / _FIND / _SIZE, and the older HASHTABLE_LOOKUP).

These ops call other subgraphs through the runtime that owns every
subgraph's runner; they hold no state of their own.
"""

from __future__ import annotations

import numpy as np

from ..model.schema import TENSOR_TYPE_CODES
from .loops import UNFINISHED, LoopSlot
from .registry import KernelError, OpContext, register

MAX_WHILE_ITERATIONS = 100_000_000


def subgraph_option(ctx: OpContext, option: str) -> int:
    """The subgraph an option names, checked at prepare: an index of one of the model's subgraphs."""
    idx = ctx.opt(option)
    n = len(ctx.runtime.model.subgraphs)
    if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < n:
        raise ctx.fail(f"{option} {idx!r} is not a subgraph of this model (it has {n})")
    return idx


@register("WHILE")
def while_op(ctx: OpContext):
    cond, body = subgraph_option(ctx, "cond_subgraph_index"), subgraph_option(ctx, "body_subgraph_index")
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
    then_g, else_g = subgraph_option(ctx, "then_subgraph_index"), subgraph_option(ctx, "else_subgraph_index")
    rt = ctx.runtime

    def run(xs):
        branch = then_g if bool(np.asarray(xs[0]).reshape(-1)[0]) else else_g
        return rt.run_subgraph(branch, list(xs[1:]))

    return run


@register("STABLEHLO_CASE")
def stablehlo_case(ctx: OpContext):
    """The branch its index names called on the other inputs; an index outside the branches takes the last one, as
    StableHLO defines and LiteRT does."""
    branches = tuple(int(i) for i in ctx.opt("branch_subgraph_indices", ()) or ())
    n = len(ctx.runtime.model.subgraphs)
    if not branches or any(not 0 <= i < n or i == ctx.subgraph.index for i in branches):
        raise ctx.fail(f"branch_subgraph_indices {list(branches)} must name other subgraphs of this model (it has {n})")
    rt = ctx.runtime

    def run(xs):
        index = int(np.asarray(xs[0]).reshape(-1)[0])
        return rt.run_subgraph(branches[index if 0 <= index < len(branches) else -1], list(xs[1:]))

    return run


@register("STABLEHLO_COMPOSITE")
def composite(ctx: OpContext):
    """A StableHLO composite (ai-edge-torch's ``odml.*`` blocks): its decomposition subgraph called on its inputs,
    as LiteRT runs it. (Plans for the OpenCL path inline the decomposition instead: graph.composite.)"""
    dec = subgraph_option(ctx, "decomposition_subgraph_index")
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
    init = subgraph_option(ctx, "init_subgraph_index")
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


# -- hash tables: int64 -> string or string -> int64, filled once (HASHTABLE_IMPORT), as LiteRT's static tables --

_TYPE_CODES = {TENSOR_TYPE_CODES[name]: name for name in ("INT64", "STRING")}  # (a table's key / value types)


class _Table:
    def __init__(self, key_type: str, value_type: str):
        self.key_type, self.value_type = key_type, value_type
        self.items: dict = {}
        self.filled = False


def _key(value, string: bool):
    return bytes(value) if string else int(value)


def _table(ctx: OpContext, xs) -> _Table:
    rid = int(np.asarray(xs[0]).reshape(-1)[0])
    table = ctx.runtime.hashtables.get(rid)
    if table is None:
        raise KernelError(f"{ctx.op.name}: no hash table {rid} (a HASHTABLE op makes it)")
    return table


@register("HASHTABLE")
def hashtable(ctx: OpContext):
    """The table ``table_id`` (made on the first run, kept by the interpreter like a resource variable); its id."""
    key, value = (_TYPE_CODES.get(ctx.opt(k)) for k in ("key_dtype", "value_dtype"))
    if (key, value) not in (("INT64", "STRING"), ("STRING", "INT64")):
        raise ctx.fail(f"a table of {ctx.opt('key_dtype')} -> {ctx.opt('value_dtype')} (TensorType codes): LiteRT's "
                       "tables map INT64 to STRING or STRING to INT64")
    rid = int(ctx.opt("table_id", 0))
    rt = ctx.runtime

    def run(xs):
        rt.hashtables.setdefault(rid, _Table(key, value))
        return [np.array([rid], np.int32)]

    return run


@register("HASHTABLE_IMPORT")
def hashtable_import(ctx: OpContext):
    """keys -> values, the first import only (a static table; a key given twice keeps its first value)."""

    def run(xs):
        table = _table(ctx, xs)
        if not table.filled:
            keys, values = np.asarray(xs[1]).reshape(-1), np.asarray(xs[2]).reshape(-1)
            if keys.size != values.size:
                raise KernelError(f"HASHTABLE_IMPORT: {keys.size} keys for {values.size} values")
            for k, v in zip(keys, values):
                table.items.setdefault(_key(k, table.key_type == "STRING"), v)
            table.filled = True
        return []

    return run


@register("HASHTABLE_FIND")
def hashtable_find(ctx: OpContext):
    """Each key's value, ``default_value`` for a key not in the table; the keys' shape."""

    def run(xs):
        table = _table(ctx, xs)
        keys = np.asarray(xs[1])
        default = np.asarray(xs[2]).reshape(-1)[0]
        string = table.key_type == "STRING"
        found = [table.items.get(_key(k, string), default) for k in keys.reshape(-1)]
        dtype = np.object_ if table.value_type == "STRING" else np.int64
        return [np.array(found, dtype=dtype).reshape(keys.shape)]

    return run


@register("HASHTABLE_SIZE")
def hashtable_size(ctx: OpContext):
    return lambda xs: [np.array([len(_table(ctx, xs).items)], np.int64)]


@register("HASHTABLE_LOOKUP")
def hashtable_lookup(ctx: OpContext):
    """TFLite's older lookup: each int32 of ``lookup`` found among ``keys`` (sorted, as the model stores them), its
    row of ``values`` and a hit of 1; a miss gives a row of zeros (an empty string) and 0."""

    def run(xs):
        lookup, keys, values = np.asarray(xs[0]).reshape(-1), np.asarray(xs[1]).reshape(-1), np.asarray(xs[2])
        if values.shape[:1] != keys.shape:
            raise KernelError(f"HASHTABLE_LOOKUP: {keys.size} keys for values of shape {list(values.shape)}")
        at = np.searchsorted(keys, lookup)
        hit = (at < keys.size) & (keys[np.minimum(at, max(keys.size - 1, 0))] == lookup) if keys.size else \
            np.zeros(lookup.size, bool)
        empty = b"" if values.dtype == np.object_ else 0
        out = np.full((lookup.size, *values.shape[1:]), empty, dtype=values.dtype)
        out[hit] = values[at[hit]]
        return [out, hit.astype(np.uint8)]

    return run
