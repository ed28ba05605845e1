"""Which integer tensors hold small indices: values a device buffer stores exactly as floats.

The OpenCL path holds an int32 / int64 tensor's values as floats, which is exact only for small integers (up to
``HALF_EXACT`` in half storage, 2^24 in float32). An op that only moves integers (a slice, a reshape of TOPK_V2's
indices) may run there only where the values it moves are known to be that small: an index an op made along an
axis of at most ``HALF_EXACT`` (``ops.traits``' makes_index), or such values moved again (picks_first). An integer
graph input, a constant, or a CPU op's arbitrary integers are not. Pure IR.
"""

from __future__ import annotations

import numpy as np

from ..model.ir import Subgraph
from ..ops.traits import traits
from .conv_arg import HALF_EXACT


def exact_indices(sg: Subgraph) -> frozenset[int]:
    """The int32 / int64 tensors of ``sg`` whose every value lies in [0, HALF_EXACT): made by an index maker
    whose float inputs have no axis longer than HALF_EXACT, or picked from such a tensor."""
    found: set[int] = set()

    def small(t: int) -> bool:
        return t >= 0 and sg.tensors[t].dtype == np.float32 and max(sg.tensors[t].shape, default=1) <= HALF_EXACT

    for op in sg.operators:  # (in execution order: a maker comes before what moves its output)
        facts = traits(op.name)
        if facts.makes_index:
            ok = all(small(t) for t in op.inputs if t >= 0 and sg.tensors[t].dtype.kind == "f")
        elif facts.picks_first:
            ok = bool(op.inputs) and op.inputs[0] in found
        else:
            continue
        if ok:
            found.update(t for t in op.outputs if t >= 0 and sg.tensors[t].dtype in (np.int32, np.int64)
                         and sg.tensors[t].quantization is None)
    return frozenset(found)
