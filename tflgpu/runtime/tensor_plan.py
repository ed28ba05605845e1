"""Where a plan's tensors are during an invoke: which live on the device and over which steps, in which storage
precision, and which cross the host/device boundary, when.

Derived from the steps alone (no OpenCL object): ``transfers.DeviceTensors`` plans buffers over the spans and makes
a staging buffer for each crossing; ``GpuPlan.run`` uploads and downloads where this says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.ir import Subgraph
from ..ops.layout import Layout, bhwc
from .selection import Step


@dataclass(frozen=True)
class TensorPlan:
    """A plan's tensors over one invoke (step indices: -1 is the invoke's start, ``len(steps)`` its end)."""

    # device tensor -> (first, last) step it must be held over (a region's span is its whole's)
    spans: dict[int, tuple[int, int]]
    # device tensor -> stored as half, as its kernels declare it (graph.precision keeps every kernel touching a
    # tensor in one precision; a storage cast reads one and writes the other)
    half: dict[int, bool]
    # a link's regions (selection: a linked concatenation's inputs in its output, a linked split's outputs and a
    # linked reshape's output in its input): region tensor -> (whole tensor, first element); a region shares its
    # whole's buffer, the whole held over all their spans
    regions: dict[int, tuple[int, int]]
    uploads_after: dict[int, list[int]]  # CPU step -> the tensors it makes that device steps read
    downloads_before: dict[int, list[int]]  # CPU step -> the tensors device steps made that it reads
    # the variables the device kernels read and write (LSTM state), and whether they stay on the device between
    # invokes (no CPU step reads or writes them): uploaded when the host's value changed, read when the host asks
    state_tensors: list[int]
    state_resident: bool
    input_uploads: list[int]  # graph inputs the device reads, then the state: uploaded by an invoke
    output_downloads: list[int]  # graph outputs a device step makes
    # graph inputs / outputs whose device buffer is their dense NHWC float32 one: tensor -> the steps whose kernels
    # take it (a kernel reading / writing the dense boundary buffer, or a float32 tensor whose slice layout is in
    # dense order)
    dense_steps: dict[int, list[int]]
    # the share of intermediate bytes (float device tensors but the graph's inputs and outputs, and the copies
    # storage casts make) stored as half: 1.0 in an FP16 plan that keeps no op in FP32
    fp16_share: float

    @property
    def crossing(self) -> set[int]:
        """The tensors crossing the device boundary: each has a dense staging buffer."""
        out = set(self.input_uploads) | set(self.output_downloads) | set(self.state_tensors)
        for ts in list(self.uploads_after.values()) + list(self.downloads_before.values()):
            out.update(ts)
        return out


def _dense_order(lay: Layout) -> bool:
    """Whether the slice layout of ``lay`` holds its values in dense NHWC order: no padded lanes, and either one
    pixel per image or one slice."""
    return lay.c % 4 == 0 and (lay.h * lay.w == 1 or lay.s == 1)


def plan_tensors(steps: list[Step], sg: Subgraph, fp16: bool) -> TensorPlan:
    """Where each tensor of ``steps`` (an FP16 plan's if ``fp16``) is over an invoke. Raises AssertionError where
    two kernels store one tensor in two precisions."""
    n = len(steps)
    spans: dict[int, tuple[int, int]] = {}
    uploads_after: dict[int, list[int]] = {}
    downloads_before: dict[int, list[int]] = {}
    producer = {t: i for i, s in enumerate(steps) for op, _ in s.members for t in op.outputs}
    graph_in, graph_out = set(sg.inputs), set(sg.outputs)
    half: dict[int, bool] = {}
    regions: dict[int, tuple[int, int]] = {}

    def touch(t, i):
        a, b = spans.get(t, (i, i))
        spans[t] = (min(a, i), max(b, i))

    def read(t, i):
        """Device step i reads t: alive from its making (an upload after a CPU step, or the invoke's start)."""
        touch(t, i)
        p = producer.get(t)
        if t in graph_in:
            touch(t, -1)
        elif p is not None and steps[p].device == "cpu":
            touch(t, p)
            ups = uploads_after.setdefault(p, [])
            if t not in ups:  # (once, however many device steps read it)
                ups.append(t)

    for i, s in enumerate(steps):
        if s.device != "gpu":
            continue
        if s.link is not None:  # (a concatenation's input a CPU step makes is uploaded into its region)
            touch(s.link.whole, i)
            for t in (s.link.whole, *s.link.offsets):
                half.setdefault(t, s.link.fp16)
            for t in s.link.reads:
                read(t, i)
            for t in s.link.writes:
                touch(t, i)
            regions.update({t: (s.link.whole, at) for t, at in s.link.offsets.items()})
        for spec in s.specs:
            for t in spec.inputs + spec.outputs:
                if half.setdefault(t, spec.tensor_fp16(t)) != spec.tensor_fp16(t):
                    raise AssertionError(f"tensor {t} is stored in two precisions ({spec.name})")
            for t in spec.inputs:
                read(t, i)
            for t in spec.outputs:
                touch(t, i)
    for i, s in enumerate(steps):
        if s.device == "cpu":
            for t in {t for op, _ in s.members for t in op.inputs}:
                p = producer.get(t)
                if t >= 0 and p is not None and p != i and steps[p].device == "gpu":
                    downloads_before.setdefault(i, []).append(t)
                    touch(t, i)
    for t in graph_out:
        if t in spans:
            touch(t, n)
    state = sorted({t for s in steps if s.device == "gpu" for spec in s.specs for t in spec.state})
    for t in state:
        touch(t, -1)
        touch(t, n)
        half.setdefault(t, fp16)
    cpu_touched = {t for s in steps if s.device == "cpu" for op, _ in s.members for t in op.inputs + op.outputs}
    layout = lambda t: bhwc(sg.tensors[t].shape)
    copies = {t for s in steps if s.device == "gpu" for spec in s.specs if spec.input_fp16 is not None
              for t in spec.outputs}
    stored = {t: layout(t).elements * (2 if half[t] else 4) for t in spans
              if t not in graph_in and t not in graph_out and t not in copies and sg.tensors[t].dtype == np.float32}
    for t, (whole, _) in regions.items():
        a, b = spans.pop(t)
        touch(whole, a)
        touch(whole, b)
    dense_steps: dict[int, list[int]] = {}
    for i, s in enumerate(steps):  # (a tensor handed over densely between two kernels is not one: it keeps its
        # place in the arena, whole slices taking the same bytes; kernels.separable, selection.hand_over)
        for t in (t for spec in s.specs for t in spec.dense) if s.device == "gpu" else ():
            if t in graph_in or t in graph_out:
                dense_steps.setdefault(t, []).append(i)
    # a float32-stored graph input / output whose slice layout orders its values as dense NHWC does (whole slices
    # of one pixel, or one whole slice: a [1, 8] vector) needs no conversion either: its buffer is the dense one
    wholes = {w for w, _ in regions.values()}
    for t in sorted((graph_in | graph_out) & spans.keys()):
        if t in dense_steps or t in regions or t in wholes or t in state or half.get(t, True) \
                or sg.tensors[t].dtype != np.float32 or not _dense_order(layout(t)):
            continue
        dense_steps[t] = [i for i, s in enumerate(steps) if s.device == "gpu"
                          and any(t in spec.inputs or t in spec.outputs for spec in s.specs)]
    return TensorPlan(
        spans, half, regions, uploads_after, downloads_before, state, not cpu_touched & set(state),
        [t for t in sg.inputs if t in spans] + state,
        [t for t in sg.outputs if t in producer and steps[producer[t]].device == "gpu"], dense_steps,
        sum(b for t, b in stored.items() if half[t]) / sum(stored.values()) if stored else float(fp16))
