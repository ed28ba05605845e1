"""A float BIDIRECTIONAL_SEQUENCE_LSTM as the two UNIDIRECTIONAL_SEQUENCE_LSTMs it runs: the forward cell on the
sequence, the backward cell on the sequence reversed in time (REVERSE_V2) with its output reversed back, and the two
outputs concatenated on the last axis where the op merges them. The device has kernels for those ops, so a
bidirectional layer runs there instead of on the CPU kernels; each cell keeps its own state variables (the op's
forward and backward states). Not split: an auxiliary input (stacked or for the backward cell), weights that are not
float32 (a hybrid model's: the CPU kernels' hybrid arithmetic), an output missing. Pure IR."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..model.ir import Operator, Subgraph, Tensor
from ..model.schema import BUILTIN_CODES

BIDIRECTIONAL, UNIDIRECTIONAL = "BIDIRECTIONAL_SEQUENCE_LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM"
_FORWARD, _BACKWARD = slice(1, 18), slice(18, 35)  # each cell's 17 weight inputs, in the unidirectional op's order
_STATES = ((35, 36), (37, 38))  # (activation, cell) state of the forward and the backward cell
_AUX = 39  # the auxiliary input; 40-47 its weights
_OUTPUT_RECURRENT = (8, 25)  # recurrent-to-output weights [cells, outputs]: each cell's output width


def _splittable(op: Operator, sg: Subgraph) -> bool:
    ins, outs = op.inputs, [t for t in op.outputs if t >= 0]
    merge = bool(op.options.get("merge_outputs"))
    if len(ins) < 39 or any(t >= 0 for t in ins[_AUX:]) or len(outs) != (1 if merge else 2):
        return False
    weights = [t for t in ins[1:35] if t >= 0]
    return all(sg.tensors[t].dtype == np.float32 and sg.tensors[t].quantization is None
               for t in [ins[0], *weights, *outs])


def split_bidirectional(sg: Subgraph) -> tuple[Subgraph, dict[int, np.ndarray], int]:
    """``sg`` with each float bidirectional LSTM as its two unidirectional ones (new ops and tensors numbered after
    the graph's own), the new constants (the time axis), and how many were split."""
    if not any(op.name == BIDIRECTIONAL for op in sg.operators):
        return sg, {}, 0
    tensors: list[Tensor] = list(sg.tensors)
    consts: dict[int, np.ndarray] = {}
    ops: list[Operator] = []
    next_op = max(op.index for op in sg.operators) + 1
    split = 0

    def tensor(like: int, name: str, shape) -> int:
        tensors.append(replace(tensors[like], index=len(tensors), name=name, shape=tuple(shape),
                               shape_signature=tuple(shape), data=None, is_variable=False))
        return len(tensors) - 1

    def add(name: str, inputs, outputs, **options) -> None:
        nonlocal next_op
        ops.append(Operator(next_op, name, BUILTIN_CODES[name], 1, tuple(inputs), tuple(outputs), options=options))
        next_op += 1

    for op in sg.operators:
        if op.name != BIDIRECTIONAL or not _splittable(op, sg):
            ops.append(op)
            continue
        split += 1
        x, opts = op.inputs[0], op.options
        time_axis = 0 if opts.get("time_major") else 1
        axis = len(tensors)
        tensors.append(Tensor(axis, f"{op.index}/time_axis", (1,), (1,), np.dtype(np.int32), "INT32",
                              data=np.array([time_axis], np.int32)))
        consts[axis] = np.array([time_axis], np.int32)
        cell = {k: opts[k] for k in ("fused_activation_function", "cell_clip", "proj_clip", "time_major") if k in opts}
        shape = tensors[x].shape
        widths = [tensors[op.inputs[w]].shape[1] for w in _OUTPUT_RECURRENT]
        merged = bool(opts.get("merge_outputs"))
        fw_out = tensor(x, f"{op.index}/forward", (*shape[:2], widths[0])) if merged else op.outputs[0]
        bw_out = tensor(x, f"{op.index}/backward", (*shape[:2], widths[1])) if merged else op.outputs[1]
        reversed_x = tensor(x, f"{op.index}/reversed_input", shape)
        reversed_out = tensor(x, f"{op.index}/reversed_backward", (*shape[:2], widths[1]))
        add(UNIDIRECTIONAL, [x, *op.inputs[_FORWARD], *(op.inputs[i] for i in _STATES[0])], [fw_out], **cell)
        add("REVERSE_V2", [x, axis], [reversed_x])
        add(UNIDIRECTIONAL, [reversed_x, *op.inputs[_BACKWARD], *(op.inputs[i] for i in _STATES[1])], [reversed_out],
            **cell)
        add("REVERSE_V2", [reversed_out, axis], [bw_out])
        if merged:
            add("CONCATENATION", [fw_out, bw_out], [op.outputs[0]], axis=2, fused_activation_function=0)
    return replace(sg, tensors=tensors, operators=ops), consts, split
