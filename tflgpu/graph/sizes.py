"""Which tensors have a size that their graph's input values set, not only its input shapes: a WHERE's (as many
rows as true values), a RANGE's of computed limits, a RESHAPE to a shape read from the data, and every tensor
computed from one of them.

A device plan fixes every tensor's size when it is built (from zeros standing in for the inputs), so such a tensor's
ops cannot run on one: its size changes from invoke to invoke with the same input shapes. A plan leaves them to the
CPU kernels (``DataSizes``) and runs the rest. Values known when a plan is
built are a model's constants and what is computed from shapes alone (SHAPE, RANK, then index arithmetic on them:
BirdNET's SHAPE -> FLOOR_DIV -> PACK -> STRIDED_SLICE), so a reshape to such a shape keeps its size fixed."""

from __future__ import annotations

from dataclasses import dataclass

from ..model.ir import Operator, Subgraph
from ..ops.traits import traits


def sized_by_data(sg: Subgraph) -> dict[int, Operator]:
    """Tensor -> the op whose input values first set its size (the tensor's own producer, or one before it),
    for every tensor of ``sg`` whose size the input values set."""
    known_values = {t.index for t in sg.tensors if t.is_constant}
    sized: dict[int, Operator] = {}
    for op in sg.operators:
        facts = traits(op.name)
        ins = [t for t in op.inputs if t >= 0]
        origin = next((sized[t] for t in ins if t in sized), None)
        if facts.values_from_shape:  # (SHAPE, RANK: values from a shape; their own size is the input's rank)
            if origin is None:
                known_values.update(t for t in op.outputs if t >= 0)
            continue
        if origin is None and facts.shape_inputs and not facts.side_effects:
            reads = [op.inputs[k] for k in facts.shape_inputs if k < len(op.inputs) and op.inputs[k] >= 0]
            origin = op if any(t not in known_values for t in reads) else None
        if origin is not None:
            sized.update((t, origin) for t in op.outputs if t >= 0)
        elif ins and all(t in known_values for t in ins) and not facts.side_effects:
            known_values.update(t for t in op.outputs if t >= 0)
    return sized


@dataclass(frozen=True)
class DataSizes:
    """What of a graph its input values size, and what a device plan of it leaves to the CPU kernels therefore:
    the ops making such a tensor, and those reading one's shape (SHAPE, RANK: values it sets, of a fixed size),
    which are after the tensor's making anyway. Every other op's tensors keep their sizes from invoke to invoke,
    so the ops before a WHERE (a detector's backbone before its threshold) run on the device."""

    sized: dict[int, Operator]  # tensor -> the op whose input values first set its size (sized_by_data)
    host_ops: dict[int, str]  # op index -> why it runs on the CPU

    @classmethod
    def of(cls, sg: Subgraph) -> DataSizes:
        sized = sized_by_data(sg)
        host: dict[int, str] = {}
        for op in sg.operators:
            made = next((t for t in op.outputs if t in sized), None)
            if made is not None:
                origin = sized[made]
                whose = "its" if origin is op else f"{origin.name}'s (node {origin.index})"
                host[op.index] = (f"the size of its output (tensor {made}) follows {whose} input values, and a "
                                  "device plan fixes every size")
            elif traits(op.name).values_from_shape and any(t in sized for t in op.inputs):
                host[op.index] = "it reads the shape of a tensor the input values size"
        return cls(sized, host)

    def __bool__(self) -> bool:
        return bool(self.sized)

