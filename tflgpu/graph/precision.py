"""Per-op storage precision in an FP16 plan: which ops keep FP32 storage, and the casts between the two.

An FP16 plan stores device tensors as half (its math is float everywhere). The ops whose FP16 storage costs
accuracy (``runtime.precision`` finds them) keep FP32 storage instead. A tensor is stored in its producer's
precision (but for an op that ``casts_own_output``: an FP32 one stores an output only FP16 ops read in half); a
tensor no op of the graph produces (a graph input, a variable) is stored as half unless every reader is an FP32
op (variables always as half). An op that reads a tensor stored in the other precision
reads a converted copy, which a storage cast (op ``STORAGE_CAST``, one per tensor and precision) makes just
before the first such reader. Constants are not device tensors: each kernel uploads them in its own precision.
Pure IR; the casts' kernels are in ``kernels.storage``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace

from ..model.ir import Operator, Subgraph, Tensor
from ..ops.traits import traits

STORAGE_CAST = "TFLGPU_STORAGE_CAST"  # an internal op: inputs (tensor,), outputs (copy,), options {"to_fp16"}


@dataclass(frozen=True)
class PrecisionChoice:
    """The ops of an FP16 plan that keep FP32 storage (by op index), each with why; and the largest relative
    error of any graph output that the choice was calibrated to (-1: not calibrated)."""

    fp32: dict[int, str] = field(default_factory=dict)
    error: float = -1.0

    @property
    def fp32_ops(self) -> frozenset[int]:
        return frozenset(self.fp32)


@dataclass(frozen=True)
class CastGraph:
    """A subgraph with storage casts inserted; ``fp32_ops``: every op storing in FP32, casts to FP32 included."""

    sg: Subgraph
    casts: int
    fp32_ops: frozenset[int]


def stored_fp16(sg: Subgraph, fp32_ops: Collection[int]) -> dict[int, bool]:
    """Each non-constant tensor's storage (True: half) under this choice, before casts are inserted."""
    producer = {t: op for op in sg.operators for t in op.outputs if t >= 0}
    readers: dict[int, list[Operator]] = {}
    for op in sg.operators:
        for t in set(op.inputs):
            if t >= 0:
                readers.setdefault(t, []).append(op)
    out = {}
    graph_out = set(sg.outputs)
    for t in range(len(sg.tensors)):
        p = producer.get(t)
        if p is not None:
            # (an FP32 op that casts its own output stores it half where only FP16 ops read it: they would read
            # a half copy anyway)
            out[t] = p.index not in fp32_ops or (traits(p.name).casts_own_output and t not in graph_out
                                                 and bool(readers.get(t))
                                                 and all(r.index not in fp32_ops for r in readers[t]))
        elif sg.tensors[t].is_variable:
            out[t] = True
        else:
            out[t] = any(r.index not in fp32_ops for r in readers.get(t, ())) or not readers.get(t)
    return out


def insert_casts(sg: Subgraph, fp32_ops: Collection[int], constants: Collection[int]) -> CastGraph:
    """``sg`` with a storage cast before each op that reads a tensor stored in the other precision.
    ``constants``: tensor indices that are constant (folded or stored): never cast. The casts get op indices
    after the graph's own, in the order they are inserted (a stored plan names its steps by op index)."""
    fp32_ops = frozenset(fp32_ops)
    if not fp32_ops:
        return CastGraph(sg, 0, fp32_ops)
    half = stored_fp16(sg, fp32_ops)
    tensors: list[Tensor] = list(sg.tensors)
    ops: list[Operator] = []
    copies: dict[tuple[int, bool], int] = {}
    cast_fp32: set[int] = set()
    next_index = max((op.index for op in sg.operators), default=-1) + 1
    for op in sg.operators:
        want = op.index not in fp32_ops
        inputs = list(op.inputs)
        for k, t in enumerate(inputs):
            if t < 0 or t in constants or half[t] == want or sg.tensors[t].dtype.kind in "iu":
                continue  # (an integer tensor lives on the host, in its own type: an index, a shape)
            key = (t, want)
            if key not in copies:
                src = tensors[t]
                copy = Tensor(len(tensors), f"{src.name}/{'fp16' if want else 'fp32'}", src.shape,
                              src.shape_signature, src.dtype, src.type_name)
                tensors.append(copy)
                copies[key] = copy.index
                ops.append(Operator(next_index, STORAGE_CAST, -1, 1, (t,), (copy.index,), options={"to_fp16": want}))
                if not want:
                    cast_fp32.add(next_index)
                next_index += 1
            inputs[k] = copies[key]
        ops.append(op if tuple(inputs) == op.inputs else replace(op, inputs=tuple(inputs)))
    return CastGraph(replace(sg, tensors=tensors, operators=ops), len(copies), fp32_ops | cast_fp32)
