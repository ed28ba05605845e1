"""Compiling generated kernels and binding their arguments: shared by the plan and the autotuner."""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, replace

import numpy as np
import xxhash

from .common import CONST_KINDS, IMAGE_ROW, PREAMBLE, KernelSpec, Uploaded

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


# Set while this thread runs one of tflgpu's builds: its compiler log is not the user's (compiler_output_of).
_OWN_BUILD = threading.local()


def compiler_output_of(own):
    """pyopencl's ``compiler_output`` (which passes a build's compiler log on as a CompilerWarning), silent while
    the calling thread runs one of tflgpu's builds and ``own`` otherwise: a user's own builds still warn."""

    def compiler_output(text: str) -> None:
        if not getattr(_OWN_BUILD, "on", False):
            own(text)

    compiler_output.tflgpu_own = own
    return compiler_output


def build(program, options: list[str], **kw):
    """``program.build(options)``, serialized with every other build of this process (``BUILD_LOCK``). The
    compiler's log is not passed on as pyopencl's CompilerWarning (the Intel compiler always writes one; a build
    that fails raises with it). Not through the warning filters: they are the process's, and
    ``warnings.catch_warnings`` is not thread-safe. Set around a build on a plan's worker, its exit restored the
    list another thread had saved, which undid that thread's filters (a user's "error" among them), and another
    thread's exit undid the build's filter while it built (the valid-model fuzzer, whose main thread wraps LiteRT's
    construction in one, printed the warning). pyopencl looks ``compiler_output`` up on each build, so the
    function is wrapped once, and the wrapper asks this thread's flag."""
    import pyopencl

    with BUILD_LOCK:
        if not hasattr(pyopencl.compiler_output, "tflgpu_own"):
            pyopencl.compiler_output = compiler_output_of(pyopencl.compiler_output)
        _OWN_BUILD.on = True
        try:
            return program.build(options=options, **kw)
        finally:
            _OWN_BUILD.on = False


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
    try:
        program = _from_binary(cl, ctx, device.cl_device, binary, _options(fp16, options))
    except cl.Error as e:
        if repair:
            store.discard(store.path("program", key, dev_key),
                          f"the driver rejects the stored binary ({str(e).splitlines()[0][:120]})")
        return None
    COMPILED.put(device.cl_device.int_ptr, key, bytes(binary))
    return program


def _from_binary(cl, ctx, cl_device, binary: bytes, options: list[str]):
    """A program built from a driver's binary; raises ``cl.Error`` where the driver refuses it."""
    return build(cl.Program(ctx, [cl_device], [binary]), options)


class ProgramMemo:
    """The programs built lately in one context, by key (``program_key``), the last ``capacity`` of them: a kernel
    search builds a program per candidate, then times the default and its winner again (``KernelBench.compare``),
    and the winner's swap into the plan builds its step's program once more; each of those finds it here instead
    (the background search of the default model built a third of its programs two or three times)."""

    def __init__(self, capacity: int = 32):
        self.capacity = capacity
        self._programs: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str):
        with self._lock:
            if key in self._programs:
                self._programs.move_to_end(key)
            return self._programs.get(key)

    def put(self, key: str, program) -> None:
        with self._lock:
            self._programs[key] = program
            self._programs.move_to_end(key)
            while len(self._programs) > self.capacity:
                self._programs.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._programs.clear()


class CompiledBinaries:
    """The program binaries this process compiled from source lately, by device (its ``cl_device_id``, the same in
    every context of the process) and program key (``program_key``),
    at most ``limit`` bytes of them (the least recently used go first). A build of the same source and options for
    the same device in any context, with any cache or none, loads the binary instead of compiling again: on the
    Intel CPU runtime that takes a few milliseconds where compiling took 0.2 s for one small kernel and 13 s for
    MediaPipe's face landmark model. Where it pays: several interpreters of one model in a process without the
    disk cache (MobileNet v2's second start: 11.6 s -> 0.6 s), a plan's boundary conversions (the same few
    programs for every model), and the test suite (a third of its compiling was the same programs again). A binary
    loaded from the disk cache is held too."""

    def __init__(self, limit: int = 64 << 20):
        self.limit = limit
        self._binaries: OrderedDict[tuple[int, str], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, device: int, key: str) -> bytes | None:
        with self._lock:
            binary = self._binaries.get((device, key))
            if binary is not None:
                self._binaries.move_to_end((device, key))
            return binary

    def put(self, device: int, key: str, binary: bytes) -> None:
        if not binary or len(binary) > self.limit:
            return
        with self._lock:
            old = self._binaries.pop((device, key), None)
            self._bytes += len(binary) - (len(old) if old is not None else 0)
            self._binaries[(device, key)] = binary
            while self._bytes > self.limit:
                self._bytes -= len(self._binaries.popitem(last=False)[1])

    def clear(self) -> None:
        """Forget every binary (a test's way of starting like a new process)."""
        with self._lock:
            self._binaries.clear()
            self._bytes = 0


COMPILED = CompiledBinaries()


def load_compiled(cl, ctx, key: str, fp16: bool, options: list[str] | None = None):
    """The program ``key`` built from the binary this process compiled earlier (``COMPILED``), or None."""
    device = ctx.devices[0]
    binary = COMPILED.get(device.int_ptr, key)
    if binary is None:
        return None
    try:
        return _from_binary(cl, ctx, device, binary, _options(fp16, options))
    except cl.Error as e:  # (never seen: the same driver made it)
        log.info("a binary compiled earlier in this process was refused, compiling again: %s", str(e)[:120])
        return None


def _compile(cl, ctx, src: str, opts: list[str], key: str) -> tuple[object, bytes | None]:
    """The program compiled from source, and its binary, now held in ``COMPILED`` (None where the driver gives
    none back)."""
    # pyopencl's own compiler cache is never used: builds go through tflgpu's bounded cache, or none
    prg = build(cl.Program(ctx, src), opts, cache_dir=False)
    try:
        binary = bytes(prg.get_info(cl.program_info.BINARIES)[0])
    except cl.Error as e:
        log.info("could not read a program binary back: %s", e)
        return prg, None
    COMPILED.put(ctx.devices[0].int_ptr, key, binary)
    return prg, binary


@dataclass(frozen=True)
class Loading:
    """A program load started before its build was asked for (``build_program``'s ``prefetched``): a warm start
    knows its program key from the stored plan and loads it while the kernels are generated."""

    key: str
    program: Future  # the program, or None where it could not be loaded
    counted_as: str = "binary_loads"  # the stat a use of it counts: "memory_loads" where COMPILED held it


def build_program(cl, ctx, sources: list[str], fp16: bool, store=None, device=None, stats: dict | None = None,
                  options: list[str] | None = None, prefetched: Loading | None = None,
                  memo: ProgramMemo | None = None):
    """One program from the preamble and ``sources``; raises ``cl.Error`` if the compiler rejects it.

    ``prefetched``: a load of the program started earlier (``Loading``), used when its key matches. ``memo``: programs of
    the same context built lately (``ProgramMemo``), looked in before compiling; what is built is put there.
    A program this process compiled before, in any context, is built from its binary (``COMPILED``).

    With a ``tflgpu.cache.CacheStore`` (and the ``DeviceInfo``), the driver's binary is stored under
    the hash of the exact source and options, so a kernel shared by models is stored once, and a
    later build loads it instead of compiling. A binary the driver rejects is discarded and rebuilt.
    """
    opts = _options(fp16, options)
    src = program_source(sources)
    stats = stats if stats is not None else {}
    key = _key(src, opts)
    prg = prefetched.program.result() if prefetched is not None and prefetched.key == key else None
    if prg is not None:
        stats[prefetched.counted_as] = stats.get(prefetched.counted_as, 0) + 1
        return prg
    prg = load_binary(cl, ctx, key, fp16, store, device, options, repair=True) if store is not None else None
    if prg is not None:
        stats["binary_loads"] = stats.get("binary_loads", 0) + 1
        return prg
    binary = None
    prg = memo.get(key) if memo is not None else None
    if prg is None:
        prg = load_compiled(cl, ctx, key, fp16, options)
        if prg is not None:
            stats["memory_loads"] = stats.get("memory_loads", 0) + 1
        else:
            prg, binary = _compile(cl, ctx, src, opts, key)
            stats["source_builds"] = stats.get("source_builds", 0) + 1
        if memo is not None:
            memo.put(key, prg)
    if store is not None:
        try:
            binary = binary if binary is not None else bytes(prg.get_info(cl.program_info.BINARIES)[0])
            if binary:
                store.put("program", key, device.identity.key(), binary)
        except (cl.Error, OSError) as e:
            log.warning("tflgpu cache: could not store a program binary: %s", e)
    return prg


# A kernel's constant arrays (weights, biases) as one buffer. A driver's cost to enqueue a launch grows with the
# memory objects it takes: on an NVIDIA H100 a plan's launches took 11.4 us at 4 buffers and 13.0 at 7
# (bench/invoke_anatomy.py), and a host-bound plan pays that per launch. So a kernel with two or more constant
# arrays takes one buffer holding them all and declares the pointers it had as parameters at the top of its body,
# each at its array's byte offset in the buffer, a constant of the code (no argument takes their place: the
# launch has fewer arguments in all). Only the argument list and those declarations change: spec.source
# (and so each kernel's identity, tuning records, names) is the generated code; what a program holds is
# ``compiled_sources``, what is bound ``kernel_args`` and ``kernel_name``, all three from ``const_pack``.
PACK_CONSTANTS = True  # (bench/launch_ab.py times plans without it)
PACK_ALIGN = 64  # bytes: each array starts on a multiple (any vector load's alignment)
PACK_LIMIT = 128 << 20  # bytes: packed only below OpenCL's least allowed maximum allocation
_PACKABLE = re.compile(r"^__global\s+const\s+(STORE_T|float|half)\s*\*\s*(?:restrict\s+)?(\w+)$")
_TYPES = {"const": "STORE_T", "const32": "float", "const16": "half"}


@dataclass(frozen=True)
class ConstPack:
    """Which of a kernel's arguments go into its one constant buffer, and the function that takes it instead."""

    args: tuple[int, ...]  # indices in spec.args of the packed arrays
    offsets: tuple[int, ...]  # their byte offsets in the buffer (each on PACK_ALIGN)
    size: int  # the buffer's bytes
    # the packed function's name: one per packing, as launches sharing code may differ in which arguments are
    # constants (an LSTM's first step reading its initial state from constant arrays) or in their sizes
    name: str
    generated: str  # the generated function's text in spec.source
    function: str  # the packed function's text


def const_pack(spec: KernelSpec) -> ConstPack | None:
    """The packing of ``spec``'s constant arrays, or None where it has fewer than two that its code declares as
    ``__global const STORE_T*`` ("const") or ``__global const float*`` ("const32"), or they are too large
    together (``PACK_LIMIT``): such a kernel is compiled and bound as generated."""
    if not PACK_CONSTANTS or sum(a.kind in _TYPES for a in spec.args) < 2:
        return None
    # (what the packing depends on: a step's launches share code, a long LSTM's 16,400 of them)
    sizes = tuple((a.kind, _elements(a.value) * stored_bytes(spec, a)) if a.kind in _TYPES else (a.kind, 0)
                  for a in spec.args)
    return _pack(spec.source, spec.name, sizes)


@functools.lru_cache(maxsize=1024)
def _pack(src: str, kernel: str, sizes: tuple[tuple[str, int], ...]) -> ConstPack | None:
    """const_pack of a kernel function ``kernel`` in ``src`` whose arguments are of these kinds and bytes."""
    if sum(n for _, n in sizes) + PACK_ALIGN * len(sizes) > PACK_LIMIT:
        return None
    m = re.search(r"\bvoid\s+" + re.escape(kernel) + r"\s*\(", src)
    start = src.rfind("__kernel", 0, m.start()) if m is not None else -1
    if start < 0 or any(c in src[start:m.start()] for c in "{};"):  # (qualifiers and attributes only between)
        return None
    open_at = m.end() - 1
    close_at = _closing(src, open_at, "()")
    body_at = src.find("{", close_at) if close_at > 0 else -1
    if body_at < 0 or src[close_at + 1:body_at].strip():
        return None
    end = _closing(src, body_at, "{}")
    params = [p.strip() for p in src[open_at + 1:close_at].split(",")]
    if end < 0 or len(params) != len(sizes):
        return None
    packed, offsets, declared, at = [], [], [], 0
    for i, (p, (kind, n)) in enumerate(zip(params, sizes)):
        found = _PACKABLE.match(p) if kind in _TYPES else None
        if found is None or found.group(1) != _TYPES[kind]:
            continue
        t, var = found.groups()
        declared.append(f"__global const {t}* {var} = (__global const {t}*)(tflgpu_consts + {at});")
        packed.append(i)
        offsets.append(at)
        at += -(-max(n, 1) // PACK_ALIGN) * PACK_ALIGN
    if len(packed) < 2:
        return None
    name = f"{kernel}_c{xxhash.xxh32_hexdigest(repr((packed, offsets)).encode())}"
    params = [p for i, p in enumerate(params) if i not in packed] + ["__global const uchar* tflgpu_consts"]
    function = (src[start:m.start()] + f"void {name}(" + ", ".join(params) + ")" + src[close_at + 1:body_at + 1]
                + "\n  " + "\n  ".join(declared) + src[body_at + 1:end + 1])
    return ConstPack(tuple(packed), tuple(offsets), at, name, src[start:end + 1], function)


def stored_bytes(spec: KernelSpec, a) -> int:
    """Bytes per element of a constant argument as uploaded: half for "const16", and for "const" and "image" in an
    FP16 kernel (an image of a device without half images is float: ``_image``)."""
    return 2 if a.kind == "const16" or (spec.fp16 and a.kind in ("const", "image")) else 4


def _closing(src: str, at: int, pair: str) -> int:
    """The index of the bracket closing the one at ``at`` (generated code: no brackets in comments or strings), or
    -1."""
    depth = 0
    for m in re.finditer("[" + re.escape(pair) + "]", src[at:]):
        depth += 1 if m.group() == pair[0] else -1
        if depth == 0:
            return at + m.start()
    return -1


def _elements(value) -> int:
    return value.size if isinstance(value, Uploaded) else int(np.asarray(value).size)


def compiled_sources(specs: list[KernelSpec]) -> list[str]:
    """The code a program of ``specs`` holds: each distinct source once, with a packed kernel's function
    (``const_pack``) in place of the generated one, or beside it where one of ``specs`` launches that one as
    generated (or where a source's other kernels call it)."""
    sources: dict[str, tuple[dict[str, list[ConstPack]], set[str]]] = {}
    for spec in specs:
        packs, plain = sources.setdefault(spec.source, ({}, set()))
        pack = const_pack(spec)
        if pack is None:
            plain.add(spec.name)
        elif all(p.name != pack.name for p in packs.get(spec.name, [])):
            packs.setdefault(spec.name, []).append(pack)
    out = []
    for src, (packs, plain) in sources.items():
        for name, ps in packs.items():
            keep = name in plain or re.search(r"\b" + re.escape(name) + r"\s*\(", src.replace(ps[0].generated, ""))
            src = src.replace(ps[0].generated, (ps[0].generated + "\n\n" if keep else "")
                              + "\n\n".join(p.function for p in ps), 1)
        out.append(src)
    return out


def argument_positions(spec: KernelSpec) -> list[int | None]:
    """Where each of ``spec.args`` is among its bound kernel's arguments (``kernel_args``): None for an array packed
    into its constant buffer (which comes last), the others in order."""
    return _positions(len(spec.args), const_pack(spec))


def _positions(n: int, pack: ConstPack | None) -> list[int | None]:
    packed = frozenset(pack.args if pack is not None else ())
    positions, at = [], 0
    for i in range(n):
        positions.append(None if i in packed else at)
        at += i not in packed
    return positions


def kernel_name(spec: KernelSpec) -> str:
    """The name of ``spec``'s kernel function in a program built from ``compiled_sources``."""
    pack = const_pack(spec)
    return spec.name if pack is None else pack.name


def _packed_buffer(cl, ctx, spec: KernelSpec, pack: ConstPack):
    """One read-only buffer of ``pack``'s arrays in their storage precision, each at its offset."""
    host = np.zeros(pack.size, np.uint8)
    for i, at in zip(pack.args, pack.offsets):
        a = spec.args[i]
        values = np.ascontiguousarray(a.value, dtype=np.float16 if stored_bytes(spec, a) == 2 else np.float32)
        host[at:at + values.nbytes] = values.reshape(-1).view(np.uint8)
    return cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)


def kernel_args(cl, ctx, spec: KernelSpec, tensor_buffer: dict, uploaded: dict | None = None) -> tuple[list, list]:
    """The argument values of ``spec`` (its constants uploaded in its storage precision, ``spec.fp16``);
    returns them and the constant buffers made.
    ``uploaded``: constants already uploaded for specs made together, by the identity of their array (one
    step's specs share theirs: the 16,400 launches of a long LSTM hold one copy of its weights, not 16,400)."""
    mf = cl.mem_flags
    args, consts = [], []
    uploaded = {} if uploaded is None else uploaded
    pack = const_pack(spec)
    for a, at in zip(spec.args, _positions(len(spec.args), pack)):
        if at is None:  # (in the packed buffer, the last argument)
            continue
        if a.kind == "tensor":
            args.append(tensor_buffer[a.value])
        elif a.kind in CONST_KINDS:  # const32 / const16: float32 / half whatever the storage precision
            half = stored_bytes(spec, a) == 2
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
    if pack is not None:
        key = ("packed", pack.name) + tuple(id(spec.args[i].value) for i in pack.args)
        if key not in uploaded:  # (the arrays are kept with the buffer: their ids stay unique while it exists)
            uploaded[key] = (_packed_buffer(cl, ctx, spec, pack), [spec.args[i].value for i in pack.args])
            consts.append(uploaded[key][0])
        args.append(uploaded[key][0])
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
    return make_kernel(cl, program, kernel_name(spec), args), consts
