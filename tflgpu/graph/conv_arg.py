"""A CONV_2D and the ARG_MAX / ARG_MIN over its channels as one op, ``CONV_ARG`` (a segmentation head's
class map): one kernel computes a pixel's every output channel and keeps the index of the largest (smallest)
in registers, instead of storing the sums for a second pass to rank.

The merged op takes the conv's inputs, options and op index, with ``arg`` ("ARG_MAX" / "ARG_MIN") added; its
outputs are (the conv's output, the index). Where nothing else reads the conv's output and it is not a graph
output, that output is -1 (omitted: never stored). Its ``ops.traits``: it ``ranks`` (an FP16 plan keeps what it
compares exact), and it ``casts_own_output``: kept in FP32 for its index, it still stores the sums its other
readers read in half, so the rest of an FP16 plan stays FP16. Pure IR; the kernels are ``cpu.conv`` and
``kernels.conv``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..model.ir import Operator, Subgraph

CONV_ARG = "TFLGPU_CONV_ARG"
ARGS = ("ARG_MAX", "ARG_MIN")
HALF_EXACT = 2048  # integers up to this are exact in half: an index stored as half needs fewer channels


def ranks_channels(op: Operator, sg: Subgraph, consts: dict) -> bool:
    """Whether ``op`` is an ARG_MAX / ARG_MIN over its input's last axis (a pixel's channels: a constant axis)
    into int32 / int64 indices: what the device ranks, alone or merged with its conv."""
    if op.name not in ARGS or len(op.inputs) < 2 or op.inputs[1] < 0:
        return False
    axis, rank = consts.get(op.inputs[1]), len(sg.tensors[op.inputs[0]].shape)
    return (axis is not None and np.asarray(axis).size == 1 and rank > 0
            and int(np.asarray(axis).reshape(-1)[0]) % rank == rank - 1
            and sg.tensors[op.outputs[0]].dtype in (np.int32, np.int64))


def merge_channel_args(sg: Subgraph, consts: dict) -> tuple[Subgraph, int]:
    """``sg`` with each CONV_2D (4-D float, ungrouped, at most ``HALF_EXACT`` output channels) whose output an
    ARG_MAX / ARG_MIN ranks over the channels merged with that op into a ``CONV_ARG`` (at the conv's place: the
    rank's inputs exist by then). Returns the new subgraph and how many were merged."""
    readers: dict[int, list[Operator]] = {}
    for op in sg.operators:
        for t in set(op.inputs):
            if t >= 0:
                readers.setdefault(t, []).append(op)
    merged: dict[int, Operator] = {}  # conv op index -> the merged op
    absorbed: set[int] = set()  # rank op indices
    for op in sg.operators:
        if op.name != "CONV_2D" or len(op.outputs) != 1 or len(op.inputs) < 2:
            continue
        (t,) = op.outputs
        x, w = sg.tensors[op.inputs[0]], sg.tensors[op.inputs[1]]
        out = sg.tensors[t]
        if (out.dtype != np.float32 or len(out.shape) != 4 or len(w.shape) != 4 or len(x.shape) != 4
                or w.shape[3] != x.shape[3] or w.shape[0] > HALF_EXACT or out.quantization is not None):
            continue
        ranks = [r for r in readers.get(t, []) if r.inputs[0] == t and ranks_channels(r, sg, consts)]
        if not ranks:
            continue
        rank = ranks[0]
        others = [r for r in readers[t] if r is not rank]
        keep = bool(others) or t in sg.outputs
        merged[op.index] = replace(op, name=CONV_ARG, builtin_code=-1, outputs=(t if keep else -1, rank.outputs[0]),
                                   options={**op.options, "arg": rank.name})
        absorbed.add(rank.index)
    if not merged:
        return sg, 0
    ops = [merged.get(op.index, op) for op in sg.operators if op.index not in absorbed]
    return replace(sg, operators=ops), len(merged)
