#!/usr/bin/env python3
"""What one kernel launch costs the host on an OpenCL device: the wall time per enqueue of an empty kernel
through pyopencl's ``enqueue_nd_range_kernel``, through a ctypes call of ``clEnqueueNDRangeKernel`` on the
same queue and kernel, and the device time between back-to-back empty kernels (profiling events).

    python bench/launch_cost.py [--device D] [--n 5000]
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import statistics
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default=None)
    p.add_argument("--n", type=int, default=5000)
    a = p.parse_args()
    from tflgpu.runtime.device import choose_device
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
    lib = ctypes.CDLL(cl._cl.__file__)  # (the extension links the ICD loader; its symbols resolve through it)
    try:
        fn = lib.clEnqueueNDRangeKernel
    except AttributeError:
        import glob
        import os

        libs = glob.glob(os.path.join(os.path.dirname(cl.__file__), ".libs", "libOpenCL*"))
        fn = ctypes.CDLL(libs[0] if libs else "libOpenCL.so.1").clEnqueueNDRangeKernel
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    gsize = (ctypes.c_size_t * 1)(32)
    qh, kh = q.int_ptr, k.int_ptr
    enq2 = per_call(lambda: fn(qh, kh, 1, None, gsize, None, 0, None, None), q)
    print(f"ctypes clEnqueueNDRangeKernel: {enq2:.2f} us per call")
    evs = [cl.enqueue_nd_range_kernel(qp, k, (32,), None) for _ in range(2000)]
    qp.finish()
    gaps = [(b.profile.start - a_.profile.end) / 1e3 for a_, b in itertools.pairwise(evs[1000:])]
    runs = [(e.profile.end - e.profile.start) / 1e3 for e in evs[1000:]]
    print(f"device: empty kernel {statistics.median(runs):.2f} us, gap between back-to-back kernels "
          f"{statistics.median(gaps):.2f} us (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
