"""One invoke as a Chrome / Perfetto trace (the JSON ``chrome://tracing`` and ``ui.perfetto.dev`` open): every
kernel launch on the OpenCL device (its profiling event), the boundary tensors' copies and conversions there, the
host's CPU ops and the enqueues of its copies, and the device's idle time between commands, on one clock.

The device's timestamps are moved onto the host clock by the offset between each launch's enqueue on the host
and its ``queued`` time on the device (the median over the launches)."""

from __future__ import annotations

import json
import statistics
from itertools import pairwise
from pathlib import Path

PID = 1
DEVICE, HOST, IDLE = 1, 2, 3  # the trace's threads (tracks)


def chrome_trace(plan, title: str = "") -> dict:
    """The trace of ``plan``'s last profiled run (``GpuDelegate(profile=True)``) as a Chrome trace document."""
    run = plan.last_run
    if not run.launches and not run.host:
        raise ValueError("no profiled run to trace: use GpuDelegate(profile=True) and invoke() first")
    offsets = [k.enqueued_ns - k.event.profile.queued for k in run.launches]
    offset = statistics.median(offsets) if offsets else 0
    kernels = sorted(((k.event.profile.start + offset, k.event.profile.end + offset, k) for k in run.launches),
                     key=lambda x: x[0])
    moves = [(c.event.profile.start + offset, c.event.profile.end + offset, c) for c in run.transfers]
    commands = sorted([(s, e, k.layer) for s, e, k in kernels] + [(s, e, c.name) for s, e, c in moves])
    origin = min([s for s, _, _ in commands] + [h.start_ns for h in run.host])

    def us(ns: float) -> float:
        return (ns - origin) / 1e3

    device = plan.device.identity.device
    events = [{"name": "process_name", "ph": "M", "pid": PID, "args": {"name": title or "tflgpu invoke"}},
              {"name": "thread_name", "ph": "M", "pid": PID, "tid": DEVICE, "args": {"name": f"OpenCL: {device}"}},
              {"name": "thread_name", "ph": "M", "pid": PID, "tid": HOST, "args": {"name": "host: CPU ops, copies"}},
              {"name": "thread_name", "ph": "M", "pid": PID, "tid": IDLE,
               "args": {"name": "device idle between commands"}}]
    for start, end, k in kernels:
        events.append({"name": k.layer, "cat": "kernel", "ph": "X", "pid": PID, "tid": DEVICE, "ts": us(start),
                       "dur": (end - start) / 1e3,
                       "args": {"op": k.op, "queued to start us": (k.event.profile.start - k.event.profile.queued) / 1e3}})
    for start, end, c in moves:
        events.append({"name": c.name, "cat": "transfer", "ph": "X", "pid": PID, "tid": DEVICE,
                       "ts": us(start), "dur": (end - start) / 1e3})
    for (_, end, before), (start, _, after) in pairwise(commands):
        if start > end:
            events.append({"name": "idle", "cat": "gap", "ph": "X", "pid": PID, "tid": IDLE, "ts": us(end),
                           "dur": (start - end) / 1e3, "args": {"after": before, "before": after}})
    for h in run.host:
        events.append({"name": h.label, "cat": h.kind, "ph": "X", "pid": PID, "tid": HOST, "ts": us(h.start_ns),
                       "dur": (h.end_ns - h.start_ns) / 1e3})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"device": device, "kernels": len(kernels), "transfers": len(moves),
                          "host spans": len(run.host)}}


def write_trace(path: str | Path, model: str | Path, delegate, input_shapes=None) -> dict:
    """Run ``model`` (reference inputs, one warm-up invoke) with profiling on and write its trace to ``path``."""
    from .benchmark import profiled_plan

    plan = profiled_plan(model, delegate, input_shapes)
    if plan is None:
        raise RuntimeError("no OpenCL plan to trace (no OpenCL device)")
    doc = chrome_trace(plan, title=f"tflgpu: {Path(model).name}")
    Path(path).write_text(json.dumps(doc))
    return doc
