"""Finding OpenCL devices, describing them, and choosing one."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache

from ..cache.records import device_key
from .icd import ensure_icd_vendors
from .residency import mapped_files, note_runtime_libraries

log = logging.getLogger("tflgpu")


@dataclass(frozen=True)
class DeviceIdentity:
    """What a compiled binary or a tuning record depends on."""

    platform: str
    device: str
    driver_version: str
    opencl_c_version: str
    device_type: str  # "GPU", "CPU", "ACCELERATOR", ...
    fp16: bool
    compute_units: int
    max_work_group_size: int
    local_mem_bytes: int
    global_mem_bytes: int

    def key(self) -> str:
        return device_key(asdict(self))

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    identity: DeviceIdentity
    cl_device: object  # pyopencl.Device

    def shared_context(self, profile: bool = False) -> SharedContext:
        """A context of this device alone and an in-order queue in it, for every plan of one interpreter
        (``SharedContext``); ``profile``: the queue records profiling events."""
        check_process()
        import pyopencl as cl

        ctx = cl.Context([self.cl_device])
        return SharedContext(ctx, cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE
                                                  if profile else 0))


@dataclass(frozen=True)
class SharedContext:
    """The pyopencl Context and CommandQueue that each of an interpreter's plans (one per input shape) works in:
    buffers its caller bound in the context stay usable after a resize, and what the caller enqueues on the
    queue (``Interpreter.gpu_queue``: a fill of a bound buffer, a copy into it) is ordered with every plan's
    invokes. A queue per plan left a caller holding the first one racing the next plan's kernels on a device
    that runs queues apart (PoCL ran a fill enqueued before an invoke after it)."""

    ctx: object
    queue: object


def _type_name(cl, t: int) -> str:
    for name in ("GPU", "CPU", "ACCELERATOR", "CUSTOM"):
        if t & getattr(cl.device_type, name, 0):
            return name
    return "OTHER"


def import_pyopencl():
    """pyopencl, imported with its on-disk caches off unless the process chose otherwise.

    tflgpu builds through its own bounded cache (or none), but pyopencl also writes a compiler cache and, for
    every kernel object created, an "invoker" cache under the user's cache directory, unbounded. Imported
    here first, pyopencl reads PYOPENCL_NO_CACHE=1 (its own switch, read once at import); a process that
    imported pyopencl earlier, or set the variable itself, keeps what it chose."""
    if "pyopencl" not in sys.modules and "PYOPENCL_NO_CACHE" not in os.environ:
        os.environ["PYOPENCL_NO_CACHE"] = "1"
        try:
            import pyopencl
        finally:
            del os.environ["PYOPENCL_NO_CACHE"]
    import pyopencl

    _memoize_invokers(pyopencl)
    return pyopencl


def _memoize_invokers(cl) -> None:
    """Without its caches, pyopencl generates a fresh Python "invoker" module for every kernel object it creates,
    and pytools names each by scanning the names already taken: creating n kernels costs O(n^2) (16,400 LSTM
    steps took 150 s). The invokers of equal signatures are equal, so they are kept in memory here, once per
    process; tflgpu itself sets arguments and enqueues without them."""
    invoker = importlib.import_module("pyopencl.invoker")
    generate = getattr(invoker, "generate_enqueue_and_set_args", None)
    if generate is None or getattr(generate, "tflgpu_memoized", False) or not getattr(cl, "_PYOPENCL_NO_CACHE", False):
        return
    made: dict = {}

    def memoized(function_name, num_passed_args, num_cl_args, arg_types, work_around_arg_count_bug,
                 warn_about_arg_count_bug, devs):
        key = (function_name, num_passed_args, num_cl_args, tuple(arg_types) if arg_types is not None else None,
               work_around_arg_count_bug, warn_about_arg_count_bug, tuple(devs))
        if key not in made:
            made[key] = generate(function_name, num_passed_args, num_cl_args, arg_types,
                                 work_around_arg_count_bug=work_around_arg_count_bug,
                                 warn_about_arg_count_bug=warn_about_arg_count_bug, devs=devs)
        return made[key]

    memoized.tflgpu_memoized = True
    invoker.generate_enqueue_and_set_args = memoized


_OPENED_IN: list[int] = []  # the id of the process that opened OpenCL (listed its platforms)


class ForkedProcessError(RuntimeError):
    """OpenCL asked of a process forked from the one that opened it."""


def forked_child() -> bool:
    """Whether this process is a child forked after its parent opened OpenCL. What the child inherits
    (contexts, queues, buffers, the driver's own state) is not usable there: on PoCL an invoke of the parent's
    plan, or a new context, waited forever; NVIDIA's driver, like CUDA, is not usable in a child forked after
    it started."""
    return bool(_OPENED_IN) and _OPENED_IN[0] != os.getpid()


def check_process() -> None:
    """Raise ForkedProcessError in a child forked after its parent opened OpenCL (``forked_child``), before a
    call into the runtime."""
    if forked_child():
        raise ForkedProcessError(
            f"OpenCL was opened in process {_OPENED_IN[0]}, and this process ({os.getpid()}) is a child forked from "
            "it: an OpenCL runtime does not survive fork(). Start child processes with multiprocessing's 'spawn' or "
            "'forkserver' method (multiprocessing.set_start_method('spawn')), or create GpuDelegate interpreters "
            "only in the children, with none in the parent before it forks")


def list_devices() -> tuple[DeviceInfo, ...]:
    """Every OpenCL device of every platform (system ICDs and pip runtimes), GPUs first; a ForkedProcessError in
    a child forked after its parent listed them."""
    check_process()
    return _list_devices()


@lru_cache(maxsize=1)
def _list_devices() -> tuple[DeviceInfo, ...]:
    ensure_icd_vendors()
    try:
        cl = import_pyopencl()
        before = mapped_files()
        _OPENED_IN[:] = [os.getpid()]
        platforms = cl.get_platforms()
        note_runtime_libraries(before, mapped_files())  # (whose read-only pages a built plan may release)
    except Exception as e:  # no loader, no platform (pyopencl raises LogicError/RuntimeError)
        log.info("no OpenCL platform: %s", e)
        return ()
    found = []
    for p in platforms:
        try:
            devices = p.get_devices()
        except Exception as e:
            log.info("OpenCL platform %r has no usable devices: %s", p.name, e)
            continue
        for d in devices:
            try:
                ident = DeviceIdentity(
                    platform=p.name.strip(),
                    device=d.name.strip(),
                    driver_version=d.driver_version.strip(),
                    opencl_c_version=d.opencl_c_version.strip(),
                    device_type=_type_name(cl, d.type),
                    fp16="cl_khr_fp16" in d.extensions,
                    compute_units=int(d.max_compute_units),
                    max_work_group_size=int(d.max_work_group_size),
                    local_mem_bytes=int(d.local_mem_size),
                    global_mem_bytes=int(d.global_mem_size),
                )
            except Exception as e:
                log.info("skipping an OpenCL device of %r: %s", p.name, e)
                continue
            found.append((ident, d))
    order = {"GPU": 0, "ACCELERATOR": 1, "CPU": 2}
    # GPUs first; among devices of a kind, those with fp16 support (then the original order)
    found.sort(key=lambda x: (order.get(x[0].device_type, 3), not x[0].fp16))
    return tuple(DeviceInfo(i, ident, d) for i, (ident, d) in enumerate(found))


class NoDeviceError(RuntimeError):
    pass


def choose_device(spec: int | str | None = None) -> DeviceInfo:
    """The device for ``spec``: an index into list_devices(), a name substring, or None.

    None means $TFLGPU_DEVICE if set, else the first device (GPUs come first).
    """
    if spec is None:
        spec = os.environ.get("TFLGPU_DEVICE") or None
    devices = list_devices()
    if not devices:
        raise NoDeviceError("no OpenCL device found (a GPU driver's OpenCL, or on x86-64 the CPU runtime: "
                            "pip install 'tflgpu[cpu-opencl]')")
    if spec is None:
        return devices[0]
    if isinstance(spec, int) or (isinstance(spec, str) and spec.isdigit()):
        i = int(spec)
        if not 0 <= i < len(devices):
            raise NoDeviceError(f"OpenCL device index {i} out of range: {len(devices)} device(s)")
        return devices[i]
    needle = str(spec).lower()
    for d in devices:
        ident = d.identity
        if needle in f"{ident.platform} {ident.device} {ident.opencl_c_version} {ident.device_type}".lower():
            return d
    names = ", ".join(f"{d.index}: {d.identity.platform} / {d.identity.device}" for d in devices)
    raise NoDeviceError(f"no OpenCL device matches {spec!r}; devices: {names}")
