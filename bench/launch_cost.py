#!/usr/bin/env python3
"""What one kernel launch costs the host on an OpenCL device: the wall time per enqueue of an empty kernel
through pyopencl's ``enqueue_nd_range_kernel``, through a ctypes call of ``clEnqueueNDRangeKernel`` on the
same queue and kernel, the device time between back-to-back empty kernels (profiling events) and per kernel when
they are all queued before the device starts (a user event's gate), and, where the
driver offers ``cl_khr_command_buffer`` 1.0, the same launches recorded once and replayed as one command-buffer
(the extension's entry points through ctypes: pyopencl does not wrap it), and a plan's worth of busy kernels
(each running about as long as an enqueue costs) under each flush cadence an invoke may take (runtime.cadence):
where the driver holds commands until a flush, flushing early overlaps the host's enqueues with the device's work.

    python bench/launch_cost.py [--device D] [--n 5000]
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import statistics
import sys
import time

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default=None)
    p.add_argument("--n", type=int, default=5000)
    a = p.parse_args()
    from tflgpu.runtime.device import choose_device
    from tflgpu.runtime.enqueue import opencl_function
    from tflgpu.runtime.icd import ensure_icd_vendors

    ensure_icd_vendors()
    import pyopencl as cl

    dev = choose_device(a.device)
    ctx = cl.Context([dev.cl_device])
    q = cl.CommandQueue(ctx)
    qp = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4096)
    prg = cl.Program(ctx, "__kernel void k(__global float* x) { if (get_global_id(0) == 100000) x[0] = 1.0f; }").build()
    k = prg.k
    k.set_args(buf)
    print(f"device: {dev.cl_device.name} ({dev.cl_device.platform.name})")

    def per_call(fn, queue) -> float:
        for _ in range(100):
            fn()
        queue.finish()
        t = time.perf_counter()
        for _ in range(a.n):
            fn()
        enq = (time.perf_counter() - t) / a.n * 1e6
        queue.finish()
        return enq

    enq = per_call(lambda: cl.enqueue_nd_range_kernel(q, k, (32,), None), q)
    print(f"pyopencl enqueue_nd_range_kernel: {enq:.2f} us per call")
    for n in (30, 60, 1000):  # a plan's worth of launches, then finish: the cadence an invoke sees
        walls = []
        for _ in range(50):
            t = time.perf_counter()
            for _ in range(n):
                cl.enqueue_nd_range_kernel(q, k, (32,), None)
            q.finish()
            walls.append((time.perf_counter() - t) / n * 1e6)
        print(f"{n} empty kernels then finish: {statistics.median(walls):.2f} us per kernel (median of 50)")
    fn = opencl_function(cl, "clEnqueueNDRangeKernel")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    gsize = (ctypes.c_size_t * 1)(32)
    qh, kh = q.int_ptr, k.int_ptr
    enq2 = per_call(lambda: fn(qh, kh, 1, None, gsize, None, 0, None, None), q)
    print(f"ctypes clEnqueueNDRangeKernel: {enq2:.2f} us per call")
    gated(cl, ctx, q, k)
    # the same with no event asked of each launch (pyopencl asks one of every enqueue): whether the device's cost
    # per launch is the driver's bookkeeping of those events
    local = (ctypes.c_size_t * 1)(32)
    no_events = (ctypes.c_void_p(qh), ctypes.c_void_p(kh), ctypes.c_uint(1), None, gsize, local, ctypes.c_uint(0),
                 None, None)
    gated(cl, ctx, q, k, launch=lambda: fn(*no_events), what="with no event each")
    arguments(cl, ctx, q, per_call)
    command_buffer(cl, dev.cl_device, q, k)
    cadences(cl, ctx, q, qp, buf, enq)
    evs = [cl.enqueue_nd_range_kernel(qp, k, (32,), None) for _ in range(2000)]
    qp.finish()
    gaps = [(b.profile.start - a_.profile.end) / 1e3 for a_, b in itertools.pairwise(evs[1000:])]
    runs = [(e.profile.end - e.profile.start) / 1e3 for e in evs[1000:]]
    print(f"device: empty kernel {statistics.median(runs):.2f} us, gap between back-to-back kernels "
          f"{statistics.median(gaps):.2f} us (median)")
    return 0


def gated(cl, ctx, q, k, rounds: int = 30, launch=None, what: str = "") -> None:
    """The device's own cost per launch, with no host in the way: n empty kernels enqueued behind a user event,
    then released and finished (the wall time from the release, per kernel; medians of ``rounds``). What a plan
    pays the device per launch however fast its kernels are, beside what its enqueues cost the host. ``launch``:
    how each kernel is enqueued (pyopencl's call by default)."""
    launch = launch or (lambda: cl.enqueue_nd_range_kernel(q, k, (32,), (32,)))
    for n in (1, 10, 40, 100):
        walls = []
        for _ in range(rounds):
            gate = cl.UserEvent(ctx)
            cl.enqueue_barrier(q, wait_for=[gate])
            for _ in range(n):
                launch()
            t = time.perf_counter()
            gate.set_status(cl.command_execution_status.COMPLETE)
            q.finish()
            walls.append((time.perf_counter() - t) * 1e6)
        med = statistics.median(walls)
        print(f"{n} empty kernels behind a gate{', ' + what if what else ''}, released then finished: {med:.1f} us, "
              f"{med / n:.2f} per kernel")


def arguments(cl, ctx, q, per_call) -> None:
    """An empty kernel's enqueue by what it takes: 1, 4 or 8 buffers (a plan's kernels take 3-6), sub-buffers of one
    buffer instead, one buffer made on host memory (CL_MEM_USE_HOST_PTR), a work-group size and three dimensions
    (as the group tiles launch), and one buffer with an int offset per array instead of 4 or 8 buffers (what
    binding a plan's tensors as offsets into one arena would make of its launches; its constants are one buffer
    already, kernels.program.const_pack): which of these a driver's per-launch cost grows with."""
    from tflgpu.runtime.transfers import aligned_empty

    def kernel(n: int):
        params = ", ".join(f"__global float* a{i}" for i in range(n))
        body = " + ".join(f"a{i}[1]" for i in range(n))
        return (cl.Program(ctx, f"__kernel void k({params}) {{ if (get_global_id(0) == 100000) "
                                       f"a0[0] = {body}; }}").build()).k

    mf = cl.mem_flags
    whole = cl.Buffer(ctx, mf.READ_WRITE, 8 * 4096)
    host = aligned_empty((1024,))
    rows, held = {}, [whole]  # (a kernel holds no reference to its arguments)
    for n in (1, 4, 8):
        k = kernel(n)
        for i in range(n):
            held.append(cl.Buffer(ctx, mf.READ_WRITE, 4096))
            k.set_arg(i, held[-1])
        rows[f"{n} buffers"] = per_call(lambda k=k: cl.enqueue_nd_range_kernel(q, k, (32,), None), q)
        if n == 4:
            rows["4 buffers, work-group (32,)"] = per_call(lambda k=k: cl.enqueue_nd_range_kernel(q, k, (32,), (32,)), q)
            rows["4 buffers, 3D (32, 4, 4) by (32, 1, 1)"] = per_call(
                lambda k=k: cl.enqueue_nd_range_kernel(q, k, (32, 4, 4), (32, 1, 1)), q)
            held.append(cl.Buffer(ctx, mf.READ_WRITE | mf.USE_HOST_PTR, hostbuf=host))
            k.set_arg(3, held[-1])
            rows["4 buffers, one on host memory"] = per_call(lambda k=k: cl.enqueue_nd_range_kernel(q, k, (32,), None), q)
            for i in range(n):
                held.append(whole.get_sub_region(i * 4096, 4096))
                k.set_arg(i, held[-1])
            rows["4 sub-buffers of one buffer"] = per_call(lambda k=k: cl.enqueue_nd_range_kernel(q, k, (32,), None), q)
    for n in (4, 8):  # the same reads through one buffer and n int offsets
        params = ", ".join(["__global uchar* m"] + [f"int o{i}" for i in range(n)])
        body = " + ".join(f"((__global float*)(m + o{i}))[1]" for i in range(n))
        k = cl.Program(ctx, f"__kernel void k({params}) {{ if (get_global_id(0) == 100000) "
                            f"((__global float*)(m + o0))[0] = {body}; }}").build().k
        k.set_arg(0, whole)
        for i in range(n):
            k.set_arg(i + 1, np.int32(i * 4096))
        rows[f"1 buffer + {n} int offsets"] = per_call(lambda k=k: cl.enqueue_nd_range_kernel(q, k, (32,), None), q)
        rows[f"1 buffer + {n} int offsets, work-group (32,)"] = per_call(
            lambda k=k: cl.enqueue_nd_range_kernel(q, k, (32,), (32,)), q)
    print("empty kernel's enqueue by its arguments, us per call: " + ", ".join(f"{k} {v:.2f}" for k, v in rows.items()))


def cadences(cl, ctx, q, qp, buf, enqueue_us: float, n: int = 30) -> None:
    """n busy kernels (one work-group spinning about ``enqueue_us`` on the device) then finish, under each of
    runtime.cadence's candidates, in alternation; against n x max(enqueue, kernel), the time if host and device
    overlapped perfectly."""
    from tflgpu.runtime.cadence import CANDIDATES

    prg = cl.Program(ctx, "__kernel void spin(__global float* x, int n) { float v = x[get_local_id(0)];"
                          " for (int i = 0; i < n; ++i) v = fma(v, 0.999f, 0.5f);"
                          " if (v == 12345.0f) x[0] = v; }").build()
    spin = prg.spin
    iters, kernel_us = 256, 0.0
    for _ in range(16):  # (doubling until one kernel takes about an enqueue's time)
        spin.set_args(buf, np.int32(iters))
        evs = [cl.enqueue_nd_range_kernel(qp, spin, (64,), (64,)) for _ in range(20)]
        qp.finish()
        kernel_us = statistics.median((e.profile.end - e.profile.start) / 1e3 for e in evs)
        if kernel_us >= enqueue_us:
            break
        iters *= 2
    spin.set_args(buf, np.int32(iters))
    walls: dict = {c: [] for c in CANDIDATES}
    for _ in range(100):
        for c in CANDIDATES:
            flush = c.flushes(n)
            t = time.perf_counter()
            for i in range(1, n + 1):
                cl.enqueue_nd_range_kernel(q, spin, (64,), (64,))
                if i in flush:
                    q.flush()
            q.finish()
            walls[c].append((time.perf_counter() - t) / n * 1e6)
    print(f"{n} busy kernels ({kernel_us:.1f} us each on the device) then finish, per kernel (median of 100; "
          f"{max(kernel_us, enqueue_us):.1f} if enqueues and kernels overlapped):")
    for c, w in walls.items():
        print(f"  {c}: {statistics.median(w):.2f} us")


def command_buffer(cl, device, q, k) -> None:
    """n launches of ``k`` recorded into one cl_khr_command_buffer (1.0: earlier versions' entry points have other
    signatures), each waiting on the one before (a plan's order), replayed then finished, against the same n
    launches enqueued one by one; both timed in alternation."""
    versions = {e.name: e.version for e in getattr(device, "extensions_with_version", ())}
    if versions.get("cl_khr_command_buffer", 0) >> 22 != 1:
        print("cl_khr_command_buffer 1.x: not offered")
        return
    from tflgpu.runtime.enqueue import opencl_function

    get = opencl_function(cl, "clGetExtensionFunctionAddressForPlatform")
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
    vp, u32 = ctypes.c_void_p, ctypes.c_uint32

    def fn(name, *argtypes):
        return ctypes.CFUNCTYPE(ctypes.c_int if name != "clCreateCommandBufferKHR" else vp, *argtypes)(
            get(vp(device.platform.int_ptr), name.encode()))

    create = fn("clCreateCommandBufferKHR", ctypes.c_uint, ctypes.POINTER(vp), vp, ctypes.POINTER(ctypes.c_int))
    record = fn("clCommandNDRangeKernelKHR", vp, vp, vp, vp, ctypes.c_uint, vp, ctypes.POINTER(ctypes.c_size_t), vp,
                ctypes.c_uint, ctypes.POINTER(u32), ctypes.POINTER(u32), vp)
    finalize, release = fn("clFinalizeCommandBufferKHR", vp), fn("clReleaseCommandBufferKHR", vp)
    enqueue = fn("clEnqueueCommandBufferKHR", ctypes.c_uint, ctypes.POINTER(vp), vp, ctypes.c_uint, vp, vp)
    queues, gsize = (vp * 1)(q.int_ptr), (ctypes.c_size_t * 1)(32)
    for n in (8, 30):
        err = ctypes.c_int(0)
        cb = create(1, queues, None, ctypes.byref(err))
        last = None
        for _ in range(n):
            point = u32(0)
            wait = None if last is None else (u32 * 1)(last)
            assert record(cb, None, None, k.int_ptr, 1, None, gsize, None, 0 if last is None else 1, wait,
                          ctypes.byref(point), None) == 0
            last = point.value
        assert err.value == 0 and finalize(cb) == 0
        replay, direct = [], []
        for _ in range(200):
            t = time.perf_counter()
            enqueue(1, queues, cb, 0, None, None)
            q.finish()
            replay.append(time.perf_counter() - t)
            t = time.perf_counter()
            for _ in range(n):
                cl.enqueue_nd_range_kernel(q, k, (32,), None)
            q.finish()
            direct.append(time.perf_counter() - t)
        release(cb)
        print(f"{n} empty kernels then finish: {statistics.median(replay) * 1e6:.1f} us replayed as one "
              f"command-buffer, {statistics.median(direct) * 1e6:.1f} us enqueued one by one (median of 200)")


if __name__ == "__main__":
    sys.exit(main())
