"""A plan's kernel launches without an event each: ``clEnqueueNDRangeKernel`` called through ctypes.

pyopencl's ``enqueue_nd_range_kernel`` asks the runtime for an event with every launch, wraps it in a Python
object and releases it when that object goes: work a fixed plan's invoke does not need (its queue is in order, and
the invoke waits for all of it with one ``finish``). ``Launcher`` makes the same call with no event asked for, its
arguments (queue, kernel, sizes) built once per kernel and sizes and reused. A profiled invoke still launches
through pyopencl: its timeline is made of those events.

Where the loader's entry point cannot be found (a pyopencl built against another ICD loader layout), ``Launcher``
is None and the plan launches through pyopencl as before.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os

from . import DeviceError

log = logging.getLogger("tflgpu")

# CL_* error codes a launch may return, for the message (the others are given by number)
_ERRORS = {-4: "CL_MEM_OBJECT_ALLOCATION_FAILURE", -5: "CL_OUT_OF_RESOURCES", -6: "CL_OUT_OF_HOST_MEMORY",
           -36: "CL_INVALID_COMMAND_QUEUE", -48: "CL_INVALID_KERNEL", -52: "CL_INVALID_KERNEL_ARGS",
           -54: "CL_INVALID_WORK_GROUP_SIZE", -55: "CL_INVALID_WORK_ITEM_SIZE", -63: "CL_INVALID_GLOBAL_WORK_SIZE"}


def opencl_function(cl, name: str):
    """An OpenCL entry point from the ICD loader pyopencl uses (its extension links the loader, so the symbols
    resolve through it; else the loader its wheel bundles, else the system's). Raises OSError or AttributeError
    where there is none."""
    try:
        return getattr(ctypes.CDLL(cl._cl.__file__), name)
    except AttributeError:
        libs = glob.glob(os.path.join(os.path.dirname(cl.__file__), ".libs", "libOpenCL*"))
        return getattr(ctypes.CDLL(libs[0] if libs else "libOpenCL.so.1"), name)


class Launcher:
    """Launches kernels on one queue with ``clEnqueueNDRangeKernel``, no event asked for. Each kernel gets its
    ctypes arguments once, kept with the kernel object itself (so that no other kernel can take its address while
    they are held) and the size tuples they were made from (a spec given other sizes gets new ones); ``forget``
    drops them all (a plan whose kernels were swapped)."""

    def __init__(self, fn, queue):
        self._fn = fn
        self._queue = ctypes.c_void_p(queue.int_ptr)
        self._held = queue  # (the queue outlives the arguments that name it)
        self._args: dict[int, tuple] = {}  # id(kernel) -> (kernel, global size, work-group, ctypes arguments)

    @classmethod
    def make(cls, cl, queue) -> Launcher | None:
        """A launcher on ``queue``, or None where the OpenCL entry point is not found."""
        try:
            fn = opencl_function(cl, "clEnqueueNDRangeKernel")
        except (OSError, AttributeError) as e:
            log.info("launching through pyopencl: no clEnqueueNDRangeKernel to call directly (%s)", e)
            return None
        fn.restype = ctypes.c_int
        return cls(fn, queue)

    def __call__(self, kernel, global_size: tuple[int, ...], local_size: tuple[int, ...] | None) -> None:
        held = self._args.get(id(kernel))
        if held is None or held[0] is not kernel or held[1] is not global_size or held[2] is not local_size:
            held = self._args[id(kernel)] = (kernel, global_size, local_size,
                                             self._arguments(kernel.int_ptr, global_size, local_size))
        code = self._fn(*held[3])
        if code:
            raise DeviceError(f"OpenCL device error during invoke (clEnqueueNDRangeKernel: "
                              f"{_ERRORS.get(code, code)}, global size {tuple(global_size)}, work-group "
                              f"{None if local_size is None else tuple(local_size)})")

    def forget(self) -> None:
        """Drop every kernel's arguments (and the kernels they hold)."""
        self._args.clear()

    def _arguments(self, kernel: int, global_size, local_size) -> tuple:
        dims = len(global_size)
        sizes = ctypes.c_size_t * dims
        local = None if local_size is None else sizes(*local_size)
        return (self._queue, ctypes.c_void_p(kernel), ctypes.c_uint(dims), None, sizes(*global_size), local,
                ctypes.c_uint(0), None, None)
