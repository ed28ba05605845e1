"""StableHLO's elementwise ops on float32 values as the TFLite builtins that say the same: STABLEHLO_ADD is an ADD
with no fused activation, _MULTIPLY a MUL (StableHLO broadcasts nothing, so the operands have one shape, which the
builtins take too), and _MAXIMUM / _MINIMUM the builtins with their operands swapped: LiteRT's STABLEHLO_MAXIMUM(a, b)
is std::max, a unless a < b, where its MAXIMUM(x, y) is y unless x > y, so MAXIMUM(b, a) gives the same NaN and zero
of the two (MINIMUM alike). A JAX or PyTorch model converted through StableHLO keeps
them between convs; renamed, the device plan's generators and graph passes take them as the builtins they know.
Integer and quantized ones stay as they are (a TFLite int8 ADD is a quantized one)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..model.ir import Subgraph
from ..model.schema import BUILTIN_CODES
from ..ops.quantization import qparams

BUILTIN_FOR = {"STABLEHLO_ADD": "ADD", "STABLEHLO_MULTIPLY": "MUL", "STABLEHLO_MAXIMUM": "MAXIMUM",
               "STABLEHLO_MINIMUM": "MINIMUM"}
_SWAPPED = frozenset({"STABLEHLO_MAXIMUM", "STABLEHLO_MINIMUM"})


def as_builtins(sg: Subgraph) -> tuple[Subgraph, int]:
    """``sg`` with each float32 StableHLO elementwise op renamed to its builtin (op indices kept), and how many."""
    ops, renamed = [], 0
    for op in sg.operators:
        name = BUILTIN_FOR.get(op.name)
        tensors = [sg.tensors[t] for t in (*op.inputs, *op.outputs) if t >= 0]
        if name is not None and len(op.inputs) == 2 and all(
                t.dtype == np.float32 and qparams(t) is None for t in tensors):
            inputs = op.inputs[::-1] if op.name in _SWAPPED else op.inputs
            op = replace(op, name=name, builtin_code=BUILTIN_CODES[name], version=1, options={}, inputs=inputs)
            renamed += 1
        ops.append(op)
    return (replace(sg, operators=ops) if renamed else sg), renamed
