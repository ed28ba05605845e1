"""What every generator shares: the 4-channel slice layout, storage macros, and KernelSpec.

Tensors live on the device as ``[B][S][H][W][4]`` with S = ceil(C / 4) (TFLite's
slice-major PHWC4): a float4 holds four channels of one pixel, a conv reads
one input slice for a row of pixels contiguously. Lanes past C are kept at 0,
so a reduction over channels never sees garbage (every store masks them).

Storage is ``float`` or ``half``; math is always ``float`` (FP16 storage goes
through vload_half/vstore_half, core OpenCL, so long sums never accumulate in half).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ..ops.attributes import activation_bounds
from ..ops.layout import Layout


_MODULES = Path(__file__).parent


# a relative import statement: ``from .x import ...`` (group 1 x) or ``from . import a, b`` / ``(a,\n b)`` (group 2)
_RELATIVE_IMPORT = re.compile(rb"^[ \t]*from \.(?!\.)(\w*)(?:\.\w+)* import (\([^)]*\)|[^\n]*)", re.M)


@functools.cache
def _package_imports(source: bytes) -> frozenset[str]:
    """The modules of this package a module's source imports (``from .x import ...``, ``from . import x``),
    anywhere in it (a generator importing a helper inside a function depends on it as much). Read by a pattern
    over the source without its comments, not by a parse: every module's in 3 ms where ``ast`` took 180, at every
    import of tflgpu (test_keys checks the two agree)."""
    names = set()
    for module, listed in _RELATIVE_IMPORT.findall(re.sub(rb"#[^\n]*", b"", source)):
        listed = listed.decode().strip("()").replace("\n", " ")
        names |= {module.decode()} if module else {n.split()[0] for n in listed.split(",") if n.strip()}
    return frozenset(names)


@functools.cache
def _files() -> dict[str, bytes]:
    return {p.stem: p.read_bytes() for p in _MODULES.glob("*.py")}


def module_closure(modules: Iterable[str], sources: Mapping[str, bytes] | None = None) -> frozenset[str]:
    """``modules`` (names of this package's modules) and every module of the package they import, directly or not.
    ``sources``: each module's source by name (default: the files)."""
    sources = _files() if sources is None else sources
    seen, todo = set(), [m for m in modules if m in sources]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += [d for d in _package_imports(sources[m]) if d in sources and d != "__init__"]
    return frozenset(seen)


def sources_version(modules: Iterable[str], sources: Mapping[str, bytes] | None = None) -> int:
    """A hash of the source of ``modules`` and of every module of this package they import (``module_closure``):
    what the kernels a generator in them makes depend on. A positive int32 (the cache schema's)."""
    sources = _files() if sources is None else sources
    h = xxhash.xxh64()
    for m in sorted(module_closure(modules, sources)):
        h.update(m.encode() + b"\0" + sources[m])
    return int(h.hexdigest()[:7], 16)


# every generator's source: what a plan (the whole library's decisions) is valid for; a kernel's tuning record is
# valid for its own generator's (base.generator_version)
GENERATOR_VERSION = sources_version(_files())


def c_float(x: float) -> str:
    """``x`` as an OpenCL C float literal: ``repr`` (which round-trips) with the ``f`` suffix, and the built-in
    constants for what has no literal (a model's +-inf clip or padding value, a NaN)."""
    x = float(x)
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    return f"{x!r}f"


def storage_macros(fp16: bool) -> str:
    """The storage type and its load/store macros for one precision (re-definable: each is #undef'd first)."""
    if fp16:
        defs = {"STORE_T": "half", "LD4(p, i)": "vload_half4((i), (p))", "ST4(p, i, v)": "vstore_half4((v), (i), (p))",
                "LD1(p, i)": "vload_half((i), (p))", "LD8(p, i)": "vload_half8((i), (p))",
                "LD16(p, i)": "vload_half16((i), (p))",
                "ST1(p, i, v)": "vstore_half((v), (i), (p))", "RND4(v)": "tflgpu_round_half4(v)",
                "RND8(v)": "tflgpu_round_half8(v)", "RND16(v)": "tflgpu_round_half16(v)"}
    else:
        defs = {"STORE_T": "float", "LD4(p, i)": "vload4((i), (p))", "ST4(p, i, v)": "vstore4((v), (i), (p))",
                "LD1(p, i)": "((p)[(i)])", "LD8(p, i)": "vload8((i), (p))", "LD16(p, i)": "vload16((i), (p))",
                "ST1(p, i, v)": "((p)[(i)] = (v))", "RND4(v)": "(v)", "RND8(v)": "(v)", "RND16(v)": "(v)"}
    return "".join(f"#undef {k.split('(')[0]}\n#define {k} {v}\n" for k, v in defs.items())


# RND4(v): a float4 rounded as the storage would round it (to half and back in FP16 storage), for a kernel reading
# or writing a dense float32 boundary buffer (KernelSpec.dense) whose values the slice layout would have stored
# in its precision: the numbers are the conversion pass's, which the FP16 precision choice simulates; and for a
# value a kernel keeps that the unfused ops would have stored (a merged op's first values: epilogue.first_values;
# RND8 / RND16 for a float8 / float16)
# (defined in an FP16 plan's program, whose device has cl_khr_fp16, as two conversions: MobileNet v2's fused
# separable blocks rounding their depthwise values, on the Intel CPU runtime, ran 12-17% slower than without
# rounding through a private array (vstore_half / vload_half) or with a float16 split into float4s; 0-6% so)
_ROUND_HALF = ("#ifdef TFLGPU_FP16\n#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n"
               + "".join(f"static inline float{n} tflgpu_round_half{n}(float{n} v) {{ "
                         f"return convert_float{n}(convert_half{n}(v)); }}\n" for n in (4, 8, 16))
               + "#endif\n")
HALF_ARITHMETIC = "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n"  # (before a kernel computing in half)

# the sampler of ``image_load``: a program-scope constant (an integer literal passed straight to read_imagef is
# what Intel's compiler takes, but NVIDIA's built conv kernels reading wrong texels from it)
_TEXEL_SAMPLER = ("#ifdef __IMAGE_SUPPORT__\n__constant sampler_t TFLGPU_TEXEL = CLK_NORMALIZED_COORDS_FALSE | "
                  "CLK_ADDRESS_NONE | CLK_FILTER_NEAREST;\n#endif\n")

PREAMBLE = (_ROUND_HALF + _TEXEL_SAMPLER + "#ifdef TFLGPU_FP16\n#define TFLGPU_PLAN_FP16\n" + storage_macros(True) + "#else\n"
            + storage_macros(False) + "#endif\n")


def fp32_region(source: str) -> str:
    """``source`` (kernels written over STORE_T / LD4 / ST4) storing in float32 inside a program built for FP16
    storage (per-op precision: an op whose FP16 storage costs accuracy); the plan's storage is restored after."""
    return ("#undef TFLGPU_FP16\n" + storage_macros(False) + source
            + "\n#ifdef TFLGPU_PLAN_FP16\n#define TFLGPU_FP16 1\n" + storage_macros(True) + "#endif\n")


def to_slices(x: np.ndarray, layout: Layout, dtype) -> np.ndarray:
    """NHWC numpy -> ``[B][S][H][W][4]`` (zero-padded lanes), flat."""
    a = np.asarray(x).reshape(layout.dims)
    pad = layout.s * 4 - layout.c
    if pad:
        a = np.concatenate([a, np.zeros(layout.dims[:3] + (pad,), a.dtype)], axis=3)
    a = a.reshape(layout.b, layout.h, layout.w, layout.s, 4).transpose(0, 3, 1, 2, 4)
    return np.ascontiguousarray(a, dtype=dtype).reshape(-1)


@dataclass
class Arg:
    """A kernel argument: a tensor (by index in the subgraph), a constant array, or a scalar."""

    # "tensor": a device tensor (value: its index); "const": an array uploaded once in the plan's storage
    # precision; "const32": an array kept float32 whatever the storage precision (parameters a kernel
    # declares ``const float*``: the Winograd and LSTM weights); "const16": an array every value of which is a
    # half (``exact_in_half``), uploaded as half whatever the storage precision (a kernel declares it
    # ``const half*`` and reads it with vload_half, core OpenCL: half the bytes, nothing lost); "image": an
    # array of float4s uploaded once as a read-only RGBA image IMAGE_ROW texels wide (``image_load``), half where
    # the plan stores half and the device has half images; "int" / "float": a scalar
    kind: str
    value: Any


CONST_KINDS = ("const", "const32", "const16", "image")  # the argument kinds a plan uploads once
IMAGE_ROW = 2048  # texels per row of an "image" argument (every OpenCL device's images are at least this wide)


def image_load(image: str, index: str) -> str:
    """The float4 at texel ``index`` (a C int expression) of an "image" argument, read without filtering."""
    return f"read_imagef({image}, TFLGPU_TEXEL, (int2)(({index}) % {IMAGE_ROW}, ({index}) / {IMAGE_ROW}))"


@dataclass(frozen=True)
class Uploaded:
    """A constant argument once its plan has uploaded it: the device holds the values, the spec keeps their count
    (``KernelSpec.uploaded``)."""

    size: int


@dataclass
class KernelSpec:
    """One launch: everything a generator decides, as data."""

    name: str
    source: str
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    args: list[Arg]
    inputs: list[int] = field(default_factory=list)  # tensor indices read
    outputs: list[int] = field(default_factory=list)  # tensor indices written
    params: dict[str, Any] = field(default_factory=dict)  # the values this spec was generated with
    space: dict[str, list] = field(default_factory=dict)  # every value each knob may take (the tuner's space)
    flops: int = 0
    # variable tensors (LSTM h and c) this kernel reads and writes in place: they stay on the device between
    # invokes and are copied back to the host variables after each
    state: list[int] = field(default_factory=list)
    # the storage precision of the tensors it reads and writes and of its "const" arguments (set by the plan's
    # KernelMaker from the op's precision); ``input_fp16``: its tensor inputs' instead, where they differ (a
    # storage cast, graph.precision)
    fp16: bool = False
    input_fp16: bool | None = None
    # outputs an FP32 kernel stores as half (``ops.traits``' casts_own_output: only FP16 ops read them)
    half_outputs: frozenset = frozenset()
    # tensors it reads or writes as dense NHWC float32 (a graph input or output's boundary buffer, whatever the
    # storage precision) instead of the slice layout: the plan's boundary conversion merged into this kernel
    # (runtime.selection.dense_boundary)
    dense: frozenset = frozenset()

    def uploaded(self) -> KernelSpec:
        """This spec with its constant arrays dropped (``Uploaded``): what a plan keeps after uploading them, so a
        model's weights are not held twice (the re-laid-out host copy besides the device buffer)."""
        return replace(self, args=[Arg(a.kind, Uploaded(int(np.asarray(a.value).size)))
                                   if a.kind in CONST_KINDS and not isinstance(a.value, Uploaded) else a
                                   for a in self.args])

    def tensor_fp16(self, t: int) -> bool:
        """Whether tensor ``t`` (one of this kernel's) is stored as half."""
        if t in self.dense:
            return False
        if t in self.half_outputs:
            return True
        if self.input_fp16 is not None and t in self.inputs and t not in self.outputs:
            return self.input_fp16
        return self.fp16


def dense_tensors(specs: list[KernelSpec]) -> frozenset[int]:
    """The tensors some of ``specs`` read or write as dense boundary buffers (KernelSpec.dense)."""
    return frozenset(t for sp in specs for t in sp.dense)


def store_element(lay: Layout, flat: str, value: str, ptr: str = "dst") -> str:
    """A block storing the float ``value`` as the element at NHWC index ``flat`` (a C int expression) of a tensor of
    layout ``lay`` in the slice layout (``ST1``); the element of the last channel also zeroes the lanes past it."""
    c, w, h, s = lay.c, lay.w, lay.h, lay.s
    code = [f"{{ const int f_ = {flat}; const int c_ = f_ % {c}; const int p_ = f_ / {c};",
            f"  const int x_ = p_ % {w}; const int y_ = (p_ / {w}) % {h}; const int b_ = p_ / {w * h};",
            f"  const int e_ = (((b_ * {s} + c_ / 4) * {h} + y_) * {w} + x_) * 4 + c_ % 4;",
            f"  ST1({ptr}, e_, {value});"]
    pad = 3 - (c - 1) % 4
    if pad:
        code.append(f"  if (c_ == {c - 1}) {{ " + " ".join(f"ST1({ptr}, e_ + {j}, 0.0f);" for j in range(1, pad + 1))
                    + " }")
    return "\n".join(code) + " }"


def dense_load4(ptr: str, at: str, c: int, slice_expr: str) -> str:
    """A float4 expression: slice ``slice_expr`` of the pixel whose first channel is element ``at`` of the dense
    NHWC float buffer ``ptr`` with ``c`` channels (lanes past c read as 0), rounded as the kernel's storage
    rounds (``RND4``)."""
    if c % 4 == 0:
        return f"RND4(vload4(0, {ptr} + {at} + 4 * ({slice_expr})))"
    lanes = ", ".join(f"(4 * ({slice_expr}) + {j} < {c} ? {ptr}[{at} + 4 * ({slice_expr}) + {j}] : 0.0f)"
                      for j in range(4))
    return f"RND4((float4)({lanes}))"


def handed_over(ctx, t: int, channels: int) -> bool:
    """Whether input tensor ``t`` (of ``channels`` channels) reaches the kernel as a dense NHWC buffer of whole slices
    handed over from another step (runtime.selection.hand_over; ``ctx.dense``): not a graph input, which keeps its
    conversion (runtime.selection.dense_boundary), and in FP32 storage."""
    return t in ctx.dense and t not in ctx.subgraph.inputs and channels % 4 == 0 and not ctx.fp16


def dense_store4(ptr: str, at: str, c: int, slice_expr: str, value: str) -> str:
    """Statements storing the float4 ``value`` as slice ``slice_expr`` of the pixel whose first channel is element
    ``at`` of the dense NHWC float buffer ``ptr`` with ``c`` channels (lanes past c are not stored), rounded as
    the kernel's storage rounds (``RND4``)."""
    if c % 4 == 0:
        return f"vstore4(RND4({value}), 0, {ptr} + {at} + 4 * ({slice_expr}));"
    # (every slice but the last whole: one vector store, which needs only a float's alignment; the last slice's
    # lanes one by one: DeepLab's 17x17 -> 257x257x21 resize wrote 531 us lane by lane, 318 us so)
    last = c - 4 * (c // 4)
    return (f"{{ const float4 dv_ = RND4({value}); const int dc_ = 4 * ({slice_expr}); "
            f"if (dc_ + 4 <= {c}) vstore4(dv_, 0, {ptr} + {at} + dc_); else {{ "
            + " ".join(f"{ptr}[{at} + dc_ + {j}] = dv_.s{j};" for j in range(last)) + " } }")


def round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def pad_lanes_mask(c: int, slice_expr: str, var: str) -> str:
    """Statement zeroing the lanes of ``var`` past channel c (only needed when c % 4)."""
    if c % 4 == 0:
        return ""
    last = (c + 3) // 4 - 1
    keep = c - 4 * last  # lanes kept in the last slice
    lanes = "xyzw"
    zero = " ".join(f"{var}.{lanes[j]} = 0.0f;" for j in range(keep, 4))
    return f"if ({slice_expr} == {last}) {{ {zero} }}"


def clamped(var: str, lo: float, hi: float, vt: str = "float4") -> str:
    """``var`` (a variable: it is read more than once) clamped to [``lo``, ``hi``] as TFLite clamps
    (ops.attributes.activation_bounds: compare and select, so -0.0 and NaN pass through; not ``fmax`` / ``clamp``).
    On the Intel CPU runtime MobileNet v2 runs as fast either way (2.83 / 2.87 ms, interleaved)."""
    e = var
    if lo > -np.inf:
        e = f"select({e}, ({vt})({c_float(lo)}), {e} < ({vt})({c_float(lo)}))"
    if hi < np.inf:
        e = f"select({e}, ({vt})({c_float(hi)}), {e} > ({vt})({c_float(hi)}))"
    return e


def activation(code: int | None, var: str, vt: str = "float4") -> str:
    """A fused activation's clamp of ``var``, a ``vt`` (ops.attributes gives the bounds and TFLite's rule; "" where
    it clamps nothing)."""
    lo, hi = activation_bounds(code)
    if lo == -np.inf and hi == np.inf:
        return ""
    return f"{var} = {clamped(var, lo, hi, vt)};"


_RELAYOUTS: ContextVar[dict | None] = ContextVar("tflgpu_relayouts", default=None)


@contextmanager
def relayout_cache():
    """Within this block, a weight re-layout asked for twice (an op generated for the support check, then
    again with its fused epilogue or tuned parameters) is computed once. The cache lives only as long as
    the block (a plan's construction), so it never keeps weights alive afterwards."""
    token = _RELAYOUTS.set({})
    try:
        yield
    finally:
        _RELAYOUTS.reset(token)


def _cached(kind: str, w: np.ndarray, pad: int, make) -> np.ndarray:
    cache = _RELAYOUTS.get()
    if cache is None:
        return make()
    key = (kind, w.__array_interface__["data"][0], w.shape, w.strides, w.dtype.str, pad)
    hit = cache.get(key)
    if hit is None or hit[0] is not w:  # (the array itself is held, so its address cannot be reused)
        hit = cache[key] = (w, make())
    return hit[1]


def exact_in_half(w: np.ndarray) -> bool:
    """Whether every value of weights ``w`` is a half value: a float16 model's (DEQUANTIZE, folded into a float32
    constant) are; random or trained float32 weights are not (answered from their first values). Once a plan's
    construction (``relayout_cache``): each generation of the op asks."""
    def exact() -> bool:
        flat = w.reshape(-1)
        with np.errstate(over="ignore"):
            return all(np.array_equal(p.astype(np.float16).astype(np.float32), p) for p in (flat[:256], flat))

    return _cached("exact in half", w, 0, exact)


def weights_oi(w: np.ndarray, lanes: int = 4, pad_out_slices_to: int = 1, in_lanes: int = 4) -> np.ndarray:
    """[O, KH, KW, I] -> groups of ``lanes`` (4, 8 or 16) output channels, [O/lanes][Si][KH][KW][k=0..3], the
    output slices padded to a multiple of ``pad_out_slices_to`` (and of lanes / 4).

    Group (g, si, ky, kx, k) holds w[lanes*g : lanes*(g+1), ky, kx, 4si+k]: acc += x.k * group, one
    accumulator vector holding lanes / 4 output slices. ``in_lanes`` < 4 (a single input slice of that many
    channels, whose sum takes only those lanes: ``summed_lanes``): k = 0..in_lanes-1 only, no rows of zeros.
    """
    return _cached(f"oi{lanes}k{in_lanes}", w, pad_out_slices_to,
                   lambda: _weights_oi(w, lanes, pad_out_slices_to, in_lanes))


def signal_weights(w: np.ndarray) -> np.ndarray:
    """[cout, kh, kw, cin] -> the signal form's [kh][cin][cout][kw] (kernels.conv._signal_source): a window row's and
    input channel's weights together, each output channel's taps adjacent."""
    return _cached("signal", w, 1, lambda: np.ascontiguousarray(np.transpose(w, (1, 3, 0, 2))).reshape(-1))


def summed_lanes(cin: int) -> int:
    """The input lanes a direct conv's sum takes at each tap: a single slice of fewer than 4 channels (an RGB stem,
    a one-channel signal) leaves the rest out (they hold zeros)."""
    return cin if 0 < cin < 4 else 4


def _weights_oi(w: np.ndarray, lanes: int, pad_out_slices_to: int, in_lanes: int = 4) -> np.ndarray:
    o, kh, kw, i = w.shape
    so, si = (o + 3) // 4, (i + 3) // 4
    if in_lanes < 4 and (si != 1 or i > in_lanes):
        raise ValueError(f"{in_lanes} input lanes a tap hold only a single slice of at most that many channels ({i})")
    so_p = round_up(round_up(so, pad_out_slices_to), lanes // 4)
    full = np.zeros((so_p * 4, kh, kw, si * 4), np.float32)
    full[:o, :, :, :i] = w
    # -> [groups, lanes(out), kh, kw, si, 4(k)] -> [groups, si, kh, kw, k, lanes(out)]
    g = full.reshape(so_p * 4 // lanes, lanes, kh, kw, si, 4).transpose(0, 4, 2, 3, 5, 1)[:, :, :, :, :in_lanes]
    return np.ascontiguousarray(g).reshape(-1)


def slice_part(j: int) -> str:
    """The swizzle of the j-th float4 (output slice) of a float8 / float16 accumulator: ".s0123", ".s4567", ..."""
    return ".s" + "0123456789abcdef"[4 * j:4 * j + 4]


def vec_slices(v: np.ndarray, c: int, pad_slices_to: int = 1) -> np.ndarray:
    s = round_up((c + 3) // 4, pad_slices_to)
    out = np.zeros(s * 4, np.float32)
    out[:c] = np.asarray(v, np.float32).reshape(-1)[:c]
    return out


# a GPU's boundary kernels take one pixel and all its slices per work-item from this many pixels up (a CPU's always)
LOOP_SLICES_PIXELS = 4096


def boundary_loops_slices(lay: Layout, gpu: bool) -> bool:
    """Whether ``boundary_kernels`` loop over a pixel's slices in one work-item: always on a CPU runtime, and on a
    GPU where there are pixels enough to fill it without a work-item per slice."""
    return not gpu or lay.b * lay.h * lay.w >= LOOP_SLICES_PIXELS


@dataclass(frozen=True)
class BoundaryForm:
    """The two kernels converting a dense NHWC float32 buffer of ``channels`` channels to the slice layout and
    back, at the graph/partition boundary, so the host copies plain NHWC data and never transposes.

    ``loop_slices``: a work-item takes one pixel and all its slices in turn (its dense side one contiguous run; a
    CPU runtime, vectorizing over pixels, writes each line of the dense buffer once, where a pass per slice rewrote
    the whole buffer per slice: 25-30% faster on the Intel CPU runtime, and 8x on a 1x1x1001 classifier output),
    else one (pixel, slice) each (a GPU's parallel form for a small tensor); the grid is ``boundary_grid``.
    ``fp32``: the slice side stored in float32 inside a program built for FP16 storage (per-op precision).

    The channel count is in the code (the dense side's stride: the Intel CPU runtime ran the conversions 1.3-1.7x
    slower with it an argument); the rest of the shape is arguments (``boundary_args``), so a form is one program
    for every tensor of that many channels, in any model: built once per device and cache, then loaded (a
    program of conversions specialized to each shape cost every plan 0.18 s or more to build on that runtime)."""

    channels: int
    loop_slices: bool
    fp32: bool = False

    @property
    def name(self) -> str:
        return f"tflgpu_io_c{self.channels}_" + ("pixels" if self.loop_slices else "slices") + \
            ("_f32" if self.fp32 else "")

    def source(self) -> str:
        c, s = self.channels, (self.channels + 3) // 4
        head = ("  const int x = get_global_id(0); const int Y = get_global_id(1);\n"
                "  if (x >= W || Y >= BH) return;\n"
                "  const int b = Y / H; const int y = Y % H;\n")
        if self.loop_slices:
            head, tail = head + f"  for (int S = 0; S < {s}; ++S) {{\n", "  }\n"
        else:
            head, tail = head + f"  const int S = get_global_id(2); if (S >= {s}) return;\n", ""
        head += (f"  const int o = ((b * {s} + S) * H + y) * W + x;\n"
                 f"  const int d = ((b * H + y) * W + x) * {c} + S * 4;\n")
        lanes = "xyzw"
        load = "\n".join(f"  if (S * 4 + {j} < {c}) v.{lanes[j]} = dense[d + {j}];" for j in range(4))
        store = "\n".join(f"  if (S * 4 + {j} < {c}) dense[d + {j}] = v.{lanes[j]};" for j in range(4))
        dims = "const int W, const int H, const int BH"
        code = (f"__kernel void {self.name}_in(__global const float* dense, __global STORE_T* dst, {dims}) {{\n"
                f"{head}  float4 v = (float4)(0.0f);\n{load}\n  ST4(dst, o, v);\n{tail}}}\n\n"
                f"__kernel void {self.name}_out(__global const STORE_T* src, __global float* dense, {dims}) {{\n"
                f"{head}  const float4 v = LD4(src, o);\n{store}\n{tail}}}\n")
        return fp32_region(code) if self.fp32 else code


def boundary_args(lay: Layout) -> list[np.int32]:
    """A tensor's shape as its conversions' last arguments (after the dense and the slice-layout buffer)."""
    return [np.int32(v) for v in (lay.w, lay.h, lay.b * lay.h)]


def boundary_grid(lay: Layout, loop_slices: bool) -> tuple[int, ...]:
    """The global size of ``boundary_kernels``."""
    return (lay.w, lay.b * lay.h) if loop_slices else (lay.w, lay.b * lay.h, lay.s)
