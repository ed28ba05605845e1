"""An elementwise op before a reshape moved after it, where only then can it share a kernel.

``RESHAPE(f(x))`` is ``f(RESHAPE(x))`` for an op ``f`` that maps each element alone (a unary op, or a binary op
with a scalar constant): the same values, rounded the same way, in another order. The plan fuses elementwise ops
into the kernel before them (graph.passes.fuse_elementwise), and a move's kernel takes them
(kernels.reindex), so the swap saves a launch where ``f`` could not join its own producer: ``x`` a graph input, a
CAST's copy (fallback_ops' ARG_MAX index scaled into a channel), read by other ops too, or made by an op that
takes no epilogue. A reshape keeping the slice order is not swapped: the plan links it (no launch either way).
Pure IR.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..model.ir import Operator, Subgraph, Tensor
from ..ops.traits import traits
from .passes import moves_in_place


def _scalar_map(op: Operator, sg: Subgraph, consts: dict) -> int | None:
    """The input ``op`` maps element by element (unary, or binary with a one-element constant), else None."""
    kind = traits(op.name).fusable
    if len(op.outputs) != 1 or sg.tensors[op.outputs[0]].dtype != np.float32:
        return None
    if kind == "unary" and len(op.inputs) == 1:
        return op.inputs[0]
    if kind == "binary" and len(op.inputs) == 2:
        for i, j in ((0, 1), (1, 0)):
            c = consts.get(op.inputs[j])
            if c is not None and np.asarray(c).size == 1 and op.inputs[i] not in consts:
                return op.inputs[i]
    return None


def sink_elementwise(sg: Subgraph, consts: dict, ops: list[Operator]) -> tuple[Subgraph, int]:
    """``sg`` with each elementwise op of ``ops`` (the ops that run: not folded) whose one reader is a reshape
    (not one the plan links) moved after that reshape, where the op could not join its input's producer.
    Returns the new subgraph and how many were moved."""
    readers: dict[int, list[Operator]] = {}
    producer: dict[int, Operator] = {}
    for op in ops:
        for t in set(op.inputs):
            if t >= 0:
                readers.setdefault(t, []).append(op)
        for t in op.outputs:
            producer[t] = op
    tensors = list(sg.tensors)
    swapped: dict[int, Operator] = {}  # op index -> the op now at its place
    graph_out = set(sg.outputs)
    for op in ops:
        x = _scalar_map(op, sg, consts)
        if x is None or op.index in swapped:
            continue
        (t,) = op.outputs
        rs = readers.get(t, [])
        if t in graph_out or len(rs) != 1 or not traits(rs[0].name).reshapes or rs[0].inputs[0] != t \
                or rs[0].index in swapped or len(rs[0].outputs) != 1:
            continue
        move = rs[0]
        (u,) = move.outputs
        if any(np.ndim(consts[i]) > len(sg.tensors[u].shape) for i in op.inputs if i in consts):
            continue  # (a one-element constant of more dims than the reshape's output would broadcast it to more)
        if moves_in_place(move, sg, consts):
            continue  # (linked: no launch to save)
        p = producer.get(x)
        if p is not None and traits(p.name).takes_epilogue and len(readers.get(x, [])) == 1 and x not in graph_out:
            continue  # (the op joins its producer's kernel already)
        moved = Tensor(len(tensors), f"{sg.tensors[x].name}/reshaped", tuple(sg.tensors[u].shape),
                       tuple(sg.tensors[u].shape), np.dtype(np.float32), "FLOAT32")
        tensors.append(moved)
        # (each op keeps the place, and so the index, of the other: the reshape first, then the op)
        swapped[op.index] = replace(move, index=op.index, inputs=(x, *move.inputs[1:]), outputs=(moved.index,))
        swapped[move.index] = replace(op, index=move.index, inputs=tuple(moved.index if i == x else i
                                                                         for i in op.inputs), outputs=(u,))
    if not swapped:
        return sg, 0
    return replace(sg, tensors=tensors, operators=[swapped.get(o.index, o) for o in sg.operators]), len(swapped) // 2
