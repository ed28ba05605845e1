"""Compiling generated kernels and binding their arguments: shared by the plan and the autotuner."""

from __future__ import annotations

import logging
import threading
import warnings
from dataclasses import replace

import numpy as np
import xxhash

from .common import CONST_KINDS, IMAGE_ROW, PREAMBLE, KernelSpec

log = logging.getLogger("tflgpu")

BUILD_OPTIONS = ["-cl-mad-enable"]
# The first tier of a tiered start: the same kernels without the compiler's optimizations. On the Intel CPU
# runtime MobileNet v2's program builds in 0.8 s this way instead of 3.2 s, and runs 7.7x slower until the
# optimized build replaces it (runtime.background).
QUICK_BUILD_OPTIONS = ["-cl-mad-enable", "-cl-opt-disable"]


# One OpenCL program build at a time in this process. Intel's CPU runtime (2026.22) spins forever inside
# clBuildProgram (LLVM's StripDebugInfo, parsing the module) after builds in other contexts ran on other
# threads: a plan's optimized build on its worker while the next plan builds. The valid-model fuzzer, one
# interpreter after another with tiered builds, stuck at model 85 (seed 400000 on) and 139 (another run), each
# model taking ~9 s before; with this lock the same 150 models ran in 115 s, as without tiered builds (110 s).
# A compile is CPU-bound on every runtime we know, so little is lost.
BUILD_LOCK = threading.Lock()


def build(program, options: list[str], **kw):
    """``program.build(options)``, serialized with every other build of this process (``BUILD_LOCK``)."""
    with BUILD_LOCK:
        return program.build(options=options, **kw)


def shared_names(specs: list[KernelSpec], base_name: str) -> list[KernelSpec]:
    """``specs`` with their op-specific name (``base_name``, e.g. ``conv_2d_17``, and the names derived from it)
    replaced by one derived from their code: layers whose kernels are the same code (the same shapes,
    attributes, fused ops and parameters; weights are arguments) share one kernel function in a program, which
    builds each function once. A MediaPipe-sized model of 354 ops has about 290 kernels but few distinct ones."""
    generic = "\0".join(s.source.replace(base_name, "K") for s in specs)
    tag = "k" + xxhash.xxh64_hexdigest(generic.encode())
    return [replace(s, name=s.name.replace(base_name, tag), source=s.source.replace(base_name, tag)) for s in specs]


def shared_base(specs: list[KernelSpec]) -> str:
    """The name ``shared_names`` gave these specs in place of their op's (every spec name starts with it)."""
    return specs[0].name.split("_", 1)[0]


def program_source(sources: list[str]) -> str:
    return "\n\n".join([PREAMBLE] + list(dict.fromkeys(sources)))  # specs may share a source (LSTM steps)


def _options(fp16: bool, options: list[str] | None) -> list[str]:
    return (BUILD_OPTIONS if options is None else options) + (["-DTFLGPU_FP16"] if fp16 else [])


def _key(src: str, opts: list[str]) -> str:
    return xxhash.xxh64_hexdigest((src + "\0" + " ".join(opts)).encode())


def program_key(sources: list[str], fp16: bool, options: list[str] | None = None) -> str:
    """Content address of a program: the hash of its exact source and build options."""
    return _key(program_source(sources), _options(fp16, options))


def load_binary(cl, ctx, key: str, fp16: bool, store, device, options: list[str] | None = None,
                repair: bool = False):
    """The stored program ``key`` built from its binary, or None: not stored, or the driver refuses it
    (``repair``: the refused entry is then discarded, with one log line). Safe to run on another thread."""
    dev_key = device.identity.key()
    binary = store.get("program", key, dev_key)
    if binary is None:
        return None
    with warnings.catch_warnings():  # the Intel compiler always prints something: not a problem
        warnings.simplefilter("ignore", cl.CompilerWarning)
        try:
            return build(cl.Program(ctx, [device.cl_device], [binary]), _options(fp16, options))
        except cl.Error as e:
            if repair:
                store.discard(store.path("program", key, dev_key),
                              f"the driver rejects the stored binary ({str(e).splitlines()[0][:120]})")
            return None


def build_program(cl, ctx, sources: list[str], fp16: bool, store=None, device=None, stats: dict | None = None,
                  options: list[str] | None = None, prefetched: tuple | None = None):
    """One program from the preamble and ``sources``; raises ``cl.Error`` if the compiler rejects it.

    ``prefetched``: (key, future) of a ``load_binary`` started while the sources were being generated
    (a warm start knows its program key from the stored plan); used when the key matches.

    With a ``tflgpu.cache.CacheStore`` (and the ``DeviceInfo``), the driver's binary is stored under
    the hash of the exact source and options, so a kernel shared by models is stored once, and a
    later build loads it instead of compiling. A binary the driver rejects is discarded and rebuilt.
    """
    opts = _options(fp16, options)
    src = program_source(sources)
    stats = stats if stats is not None else {}
    if store is not None:
        key = _key(src, opts)
        prg = prefetched[1].result() if prefetched is not None and prefetched[0] == key else None
        if prg is None:
            prg = load_binary(cl, ctx, key, fp16, store, device, options, repair=True)
        if prg is not None:
            stats["binary_loads"] = stats.get("binary_loads", 0) + 1
            return prg
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cl.CompilerWarning)
        # pyopencl's own compiler cache is never used: builds go through tflgpu's bounded cache, or none
        prg = build(cl.Program(ctx, src), opts, cache_dir=False)
        stats["source_builds"] = stats.get("source_builds", 0) + 1
    if store is not None:
        try:
            binary = prg.get_info(cl.program_info.BINARIES)[0]
            if binary:
                store.put("program", key, device.identity.key(), bytes(binary))
        except (cl.Error, OSError) as e:
            log.warning("tflgpu cache: could not store a program binary: %s", e)
    return prg


def kernel_args(cl, ctx, spec: KernelSpec, tensor_buffer: dict, uploaded: dict | None = None) -> tuple[list, list]:
    """The argument values of ``spec`` (its constants uploaded in its storage precision, ``spec.fp16``);
    returns them and the constant buffers made.
    ``uploaded``: constants already uploaded for specs made together, by the identity of their array (one
    step's specs share theirs: the 16,400 launches of a long LSTM hold one copy of its weights, not 16,400)."""
    mf = cl.mem_flags
    args, consts = [], []
    uploaded = {} if uploaded is None else uploaded
    for a in spec.args:
        if a.kind == "tensor":
            args.append(tensor_buffer[a.value])
        elif a.kind in CONST_KINDS:  # const32: float32 whatever the storage precision
            half = spec.fp16 and a.kind != "const32"
            key = (id(a.value), half, a.kind)
            if key not in uploaded:
                # (the array is kept with the buffer: its id stays unique while the entry exists)
                uploaded[key] = (_image(cl, ctx, a.value, half) if a.kind == "image" else cl.Buffer(
                    ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                    hostbuf=np.ascontiguousarray(a.value, dtype=np.float16 if half else np.float32)), a.value)
                consts.append(uploaded[key][0])
            args.append(uploaded[key][0])
        elif a.kind == "int":
            args.append(np.int32(a.value))
        else:
            args.append(np.float32(a.value))
    return args, consts


def _image(cl, ctx, values: np.ndarray, half: bool):
    """An "image" argument: ``values`` as float4 texels of a read-only RGBA image IMAGE_ROW wide (rows zero-padded),
    half where ``half`` and the device has half RGBA images."""
    formats = cl.get_supported_image_formats(ctx, cl.mem_flags.READ_ONLY, cl.mem_object_type.IMAGE2D)
    half = half and any(f.channel_order == cl.channel_order.RGBA and f.channel_data_type == cl.channel_type.HALF_FLOAT
                        for f in formats)
    texels = np.asarray(values, np.float32).reshape(-1, 4)
    rows = max(1, -(-len(texels) // IMAGE_ROW))
    data = np.zeros((rows * IMAGE_ROW, 4), np.float16 if half else np.float32)
    data[:len(texels)] = texels
    fmt = cl.ImageFormat(cl.channel_order.RGBA, cl.channel_type.HALF_FLOAT if half else cl.channel_type.FLOAT)
    return cl.Image(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, fmt, shape=(IMAGE_ROW, rows),
                    hostbuf=data)


def make_kernel(cl, program, name: str, args: list):
    """A kernel instance of ``program`` with every argument set (instances are independent: one per launch)."""
    k = cl.Kernel(program, name)
    for i, v in enumerate(args):  # (set_args would generate, and cache on disk, a pyopencl invoker module)
        k.set_arg(i, v)
    return k


def bind_kernel(cl, ctx, program, spec: KernelSpec, tensor_buffer: dict) -> tuple[object, list]:
    """A kernel instance of ``spec`` with every argument set; returns it and the constant buffers it made."""
    args, consts = kernel_args(cl, ctx, spec, tensor_buffer)
    return make_kernel(cl, program, spec.name, args), consts
