#!/usr/bin/env python3
"""Where an invoke's wall time goes on an OpenCL device (meant for a GPU): one model's plan, each part timed on its
own, all in alternation (medians of ``--rounds``):

- invoke: ``set_tensor`` + ``invoke``, as a caller has it, and the same without pinned memory (the input's upload
  from a pageable array, the outputs read by a map of a buffer made on host memory: as before
  ``transfers.HostArenas.pinned``; a CPU device reading host memory in place has none);
- enqueue: the host's time to enqueue the plan's launches alone (no upload, no read), and that plus the wait;
  and each launch's own enqueue time, by its kernel's arguments (buffers, images, scalars) and work-group;
- device: the same launches held behind a user event until all are enqueued, then released: the device's time
  for the plan with no host in the way (kernels and the gaps between them);
- the same two with no event asked of each launch (``runtime.enqueue.Launcher``, a GPU plan's ``Cadence.direct``):
  whether a driver's device time per launch is its bookkeeping of pyopencl's events;
- upload: the graph input's copy to the device from a pageable numpy array (what ``invoke`` does where the
  device has its own memory), from pinned host memory (a mapped CL_MEM_ALLOC_HOST_PTR buffer), and the host
  copy into that pinned memory;
- read: the outputs' read back after an empty queue, and an empty queue's ``finish``;
- wait: the plan's launches and output read enqueued, then the host waiting for them three ways: ``finish``
  (what an invoke does), the read's event waited for, and that event's status polled in a loop (a driver that
  sleeps in its waits wakes late; a poll does not sleep).

If invoke ~ enqueue + device, the host's launches and the device's kernels do not overlap; if invoke ~
max(enqueue, device) + upload + read, they do, and what is left is the fixed cost.

    python bench/invoke_anatomy.py MODEL... [--device D] [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def anatomy(m: str, made, rounds: int) -> None:
    """Print model ``m``'s parts (``made(m, pinned)``: a warmed-up Interpreter of it)."""
    import pyopencl as cl

    from tflgpu import Interpreter
    from tflgpu.benchmark import reference_inputs

    details = Interpreter(m).get_input_details()
    feeds = reference_inputs(details)
    it, pageable = made(m), made(m, pinned=False)
    plan = it.gpu_plan
    q, ctx, io = plan.queue, plan.ctx, plan.io
    launches = [(k, spec.global_size, spec.local_size) for s in plan.steps if s.device == "gpu"
                for spec, k in zip(s.specs, s.kernels)]
    specs = [spec for s in plan.steps if s.device == "gpu" for spec in s.specs]
    each: list[list[float]] = [[] for _ in launches]
    big = max(io.tensors.input_uploads, key=lambda t: int(np.prod(plan.sg.tensors[t].shape)), default=None)
    x = np.ascontiguousarray(feeds[0], dtype=np.float32)
    pinned_buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, max(x.nbytes, 16))
    pinned, _ = cl.enqueue_map_buffer(q, pinned_buf, cl.map_flags.WRITE, 0, x.shape, np.float32, is_blocking=True)
    pinned[...] = x
    dense = io.staging[big].dense if big is not None and big in io.staging else None

    def invoke(it=it):
        for d, v in zip(details, feeds):
            it.set_tensor(d["index"], v)
        it.invoke()

    def enqueue():
        t = time.perf_counter()
        for k, g, loc in launches:
            cl.enqueue_nd_range_kernel(q, k, g, loc)
        mid = time.perf_counter()
        q.finish()
        return mid - t, time.perf_counter() - t

    direct = plan.launch  # (None where the loader's entry point is not found)

    def enqueue_direct():
        t = time.perf_counter()
        for k, g, loc in launches:
            direct(k, g, loc)
        mid = time.perf_counter()
        q.finish()
        return mid - t, time.perf_counter() - t

    def device_direct():
        gate = cl.UserEvent(ctx)
        cl.enqueue_barrier(q, wait_for=[gate])
        for k, g, loc in launches:
            direct(k, g, loc)
        t = time.perf_counter()
        gate.set_status(cl.command_execution_status.COMPLETE)
        q.finish()
        return time.perf_counter() - t

    out = max(io.tensors.output_downloads, key=lambda t: int(np.prod(plan.sg.tensors[t].shape)), default=None)
    out_host = np.empty(plan.sg.tensors[out].shape, np.float32) if out is not None else None

    def waited(how):
        complete = cl.command_execution_status.COMPLETE

        def go():
            t = time.perf_counter()
            for k, g, loc in launches:
                cl.enqueue_nd_range_kernel(q, k, g, loc)
            ev = cl.enqueue_copy(q, out_host, io.staging[out].dense, is_blocking=False)
            if how == "event":
                ev.wait()
            elif how == "poll":
                while ev.command_execution_status != complete:
                    pass
            q.finish()
            return time.perf_counter() - t
        return go

    def enqueue_each():
        t = time.perf_counter()
        for i, (k, g, loc) in enumerate(launches):
            at = time.perf_counter()
            cl.enqueue_nd_range_kernel(q, k, g, loc)
            each[i].append(time.perf_counter() - at)
        q.finish()
        return time.perf_counter() - t

    def device():
        gate = cl.UserEvent(ctx)
        cl.enqueue_barrier(q, wait_for=[gate])
        for k, g, loc in launches:
            cl.enqueue_nd_range_kernel(q, k, g, loc)
        t = time.perf_counter()
        gate.set_status(cl.command_execution_status.COMPLETE)
        q.finish()
        return time.perf_counter() - t

    def upload(src):
        def go():
            t = time.perf_counter()
            cl.enqueue_copy(q, dense, src, is_blocking=False)
            q.finish()
            return time.perf_counter() - t
        return go

    def host_copy():
        t = time.perf_counter()
        np.copyto(pinned, x)
        return time.perf_counter() - t

    def read():
        t = time.perf_counter()
        outs = io.fetch_outputs(q, list(io.tensors.output_downloads))
        q.finish()
        for f in outs.values():
            f()
        return time.perf_counter() - t

    def finish():
        t = time.perf_counter()
        q.finish()
        return time.perf_counter() - t

    def timed(fn):
        def go():
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t
        return go

    parts = {"invoke": timed(invoke), "invoke, no pinned memory": timed(lambda: invoke(pageable)),
             "enqueue": enqueue, "enqueue, each timed": enqueue_each, "device (gated)": device, "read outputs": read,
             "finish (empty queue)": finish}
    if direct is not None:
        parts.update({"enqueue, no event per launch": enqueue_direct,
                      "device (gated), no event per launch": device_direct})
    if out is not None and io.staging[out].dense is not None:
        parts.update({"wait: finish": waited("finish"), "wait: the read's event": waited("event"),
                      "wait: the read's event polled": waited("poll")})
    if dense is not None:
        parts.update({"upload from pageable": upload(x), "upload from pinned": upload(pinned),
                      "host copy into pinned": host_copy})
    got: dict[str, list] = {k: [] for k in parts}
    for _ in range(rounds):
        for name, fn in parts.items():
            got[name].append(fn())
    print(f"## {m.split('/')[-1]}: {len(launches)} launches, {plan.device.identity.device}; "
          f"input {x.nbytes / 1024:.0f} KiB; median of {rounds}, us")
    for name, ts in got.items():
        if isinstance(ts[0], tuple):
            print(f"  {name}: host {statistics.median(t[0] for t in ts) * 1e6:.1f} "
                  f"({statistics.median(t[0] for t in ts) * 1e6 / len(launches):.2f} per launch), "
                  f"with the wait {statistics.median(t[1] for t in ts) * 1e6:.1f}")
        else:
            print(f"  {name}: {statistics.median(ts) * 1e6:.1f}")
    kinds = {}
    for spec, ts in zip(specs, each):
        n = {"buffer": 0, "image": 0, "scalar": 0}
        for arg in spec.args:
            n["image" if arg.kind == "image" else "scalar" if arg.kind in ("int", "float") else "buffer"] += 1
        key = (n["buffer"], n["image"], n["scalar"], spec.local_size is not None, len(spec.global_size))
        kinds.setdefault(key, []).append(statistics.median(ts) * 1e6)
    print("  each launch's enqueue, us (median per launch; by buffers, images, scalars, work-group set, dims):")
    for (nb, ni, ns, wg, dims), us in sorted(kinds.items()):
        print(f"    {nb} buffers {ni} images {ns} scalars, work-group {'set' if wg else 'none'}, {dims}D: "
              f"{len(us)} launches, {statistics.median(us):.1f} (min {min(us):.1f}, max {max(us):.1f})")
    pinned.base.release(q)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--device", default=None)
    p.add_argument("--rounds", type=int, default=200)
    a = p.parse_args()
    from tflgpu.runtime.icd import ensure_icd_vendors

    ensure_icd_vendors()
    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.benchmark import reference_inputs, warm_up
    from tflgpu.runtime.transfers import HostArenas

    def made(m, pinned=True):
        with_pinned = HostArenas.pinned
        if not pinned:  # (as before pinned memory)
            HostArenas.pinned = lambda self, tensors: {}
        try:
            it = Interpreter(m, delegate=GpuDelegate(device=a.device, tuning="none", tiered_compile=False,
                                                     cache=False))
        finally:
            HostArenas.pinned = with_pinned
        it.allocate_tensors()
        details = it.get_input_details()
        for d, x in zip(details, reference_inputs(details)):
            it.set_tensor(d["index"], x)
        warm_up(it, 10)
        return it

    for m in a.models:
        anatomy(m, made, a.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
