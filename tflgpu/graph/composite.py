"""Inline StableHLO composites: a STABLEHLO_COMPOSITE op (what ai-edge-torch writes for a PyTorch block the
converter has no TFLite op for, ``odml.*``) calls its decomposition subgraph on its inputs. Its ops go into the
calling graph instead, once per composite, so the OpenCL path places them like any other op and the graph
passes see through the call. A decomposition holding variable tensors (state of its own) stays a call.
"""

from __future__ import annotations

from dataclasses import replace

from ..model.ir import Model, Operator, Subgraph
from .unroll import LoopEdit, NotUnrollable, rewrite_loops

COMPOSITE = "STABLEHLO_COMPOSITE"
MAX_DEPTH = 16  # composites inside decompositions, inlined level by level


def _inline_one(op: Operator, model: Model, parent: int, edit: LoopEdit) -> list[Operator]:
    index = op.options.get("decomposition_subgraph_index")
    if not isinstance(index, int) or not 0 <= index < len(model.subgraphs) or index == parent:
        raise NotUnrollable(f"decomposition subgraph {index!r} is not another subgraph of the model")
    dec = model.subgraphs[index]
    if any(t.is_variable for t in dec.tensors):
        raise NotUnrollable("its decomposition holds variable tensors")
    if len(dec.inputs) != len(op.inputs) or len(dec.outputs) != len(op.outputs) or any(i < 0 for i in op.inputs):
        raise NotUnrollable("its inputs and outputs do not match its decomposition's")
    prefix = f"{op.options.get('name') or COMPOSITE}@{op.index}/"
    where = dict(zip(dec.inputs, op.inputs))

    def parent_of(t: int) -> int:
        if t < 0 or t in where:
            return where.get(t, t)
        src = dec.tensors[t]  # (a constant, or a tensor no op of the decomposition makes: an error in its order)
        if src.data is None:
            raise NotUnrollable(f"decomposition tensor {t} is read before it is made")
        edit.tensors.append(replace(src, index=len(edit.tensors), name=prefix + src.name))
        where[t] = len(edit.tensors) - 1
        return where[t]

    ops = []
    for b in dec.operators:
        ins = tuple(parent_of(i) for i in b.inputs)
        outs = []
        for o in b.outputs:
            if o >= 0:
                src = dec.tensors[o]
                edit.tensors.append(replace(src, index=len(edit.tensors), name=prefix + src.name))
                where[o] = len(edit.tensors) - 1
            outs.append(where.get(o, o))
        ops.append(replace(b, inputs=ins, outputs=tuple(outs)))
    for out, src in zip(op.outputs, dec.outputs):
        if out >= 0:
            ops.extend(edit.result(out, parent_of(src)))
    return ops


def inline_composites(sg: Subgraph, model: Model) -> tuple[Subgraph, int]:
    """``sg`` with its composites' decompositions inlined (nested ones too, to MAX_DEPTH levels); how many."""
    total, parent = 0, sg.index
    for _ in range(MAX_DEPTH):
        sg, count = rewrite_loops(sg, lambda op, edit: _inline_one(op, model, parent, edit), "stays a call",
                                  COMPOSITE)
        total += count
        if not count:
            break
    return sg, total
