"""The generator registry and the context a generator sees."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..model.ir import Operator, Tensor
from ..ops.context import OpView
from ..ops.layout import Layout, bhwc
from .common import GENERATOR_VERSION, KernelSpec, module_closure, sources_version
from .epilogue import Epilogue, epilogue
from .errors import Unsupported


@dataclass(frozen=True)
class Target:
    """What the generators' heuristics know of the device they generate for."""

    # CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT: 16 on an AVX-512 CPU runtime, 8 on an AVX2 one, 1 on most GPUs (whose
    # work-items are the SIMD lanes). The default is the width the heuristics were first measured with.
    float_lanes: int = 8
    # a GPU (CL_DEVICE_TYPE_GPU): thousands of work-items in flight, each a SIMD lane; a kernel needs enough of
    # them, and cooperative work-groups (local memory) pay off where a CPU runtime gains nothing
    gpu: bool = False
    # the OpenCL C extension that names the sub-group functions (sub_group_reduce_add, get_sub_group_id...) on this
    # device: cl_khr_subgroups, or Intel's cl_intel_subgroups, which has them too; None (NVIDIA's OpenCL 1.2)
    subgroups: str | None = None
    # the device reads images (CL_DEVICE_IMAGE_SUPPORT): read-only data through the texture path
    images: bool = False
    # the work-items a work-group may have (CL_DEVICE_MAX_WORK_GROUP_SIZE, at most 1024: what a group tile may take);
    # the default is the smallest common one
    max_group: int = 256
    # CL_DEVICE_MAX_COMPUTE_UNITS (a CPU runtime's threads); 0: not known (no work-groups chosen for it)
    units: int = 0

    @classmethod
    def of(cls, cl_device, device_type: str) -> Target:
        """``device_type``: the runtime's name of the device's type (``DeviceIdentity.device_type``)."""
        exts = cl_device.extensions.split()
        sub = next((e for e in SUBGROUP_EXTENSIONS if e in exts), None)
        return cls(float_lanes=max(1, int(cl_device.native_vector_width_float)), gpu=device_type == "GPU",
                   subgroups=sub, images=bool(cl_device.image_support),
                   max_group=max(1, min(int(cl_device.max_work_group_size), 1024)),
                   units=max(0, int(cl_device.max_compute_units)))

    def work_group(self, global_size: tuple[int, ...]) -> tuple[int, ...] | None:
        """A CPU device's work-group for a kernel that names none: one group per compute unit where the grid is
        small (at most ``SMALL_GRID`` work-items a unit, and no more than a work-group may take) and splits that
        evenly, else None (the runtime's choice).
        The Intel CPU runtime splits a small grid into many groups, each a task its threads take in turn: 100
        launches of 256 trivial work-items behind a gate cost 2.0 us each so, 1.2 in two groups; whole plans on
        the 2-core AMD EPYC, interleaved: MediaPipe's iris 1.06-1.07x faster, BlazeFace 1.07-1.09x, selfie
        segmentation 1.06x, MobileNet v2 1.02-1.03x."""
        if self.gpu or self.units < 2 or math.prod(global_size) > min(SMALL_GRID, self.max_group) * self.units:
            return None
        group, left = list(global_size), self.units
        for d, size in enumerate(group):  # (each dimension takes what it can of the split)
            step = math.gcd(size, left)
            group[d], left = size // step, left // step
        return tuple(group) if left == 1 else None

    def row_group(self, global_size: tuple[int, ...]) -> tuple[int, ...] | None:
        """A CPU device's work-group for a value-moving kernel of more than a small grid (``work_group``'s):
        the most of the grid's first dimension (a row of pixels) a group may take, at least 16 work-items, else
        None (the runtime's choice). Left to itself the Intel CPU runtime ran some such kernels 10x slower than
        in row groups: Basic Pitch's seven PADs of 172 x 309 one-channel pixels 0.8-1.2 ms each, 0.09-0.13 ms in
        groups of a row (whole plan 1.27x faster; SSD, DeepLab, U-Net and four MediaPipe models within 2% either
        way). Only the moves take it (lanes.lane_kernel): given to every kernel, it cost SSD's convs 5%."""
        if self.gpu or self.units < 2 or math.prod(global_size) <= min(SMALL_GRID, self.max_group) * self.units:
            return None
        first = global_size[0]
        size = max(d for d in range(1, min(first, self.max_group) + 1) if first % d == 0)
        return (size,) + (1,) * (len(global_size) - 1) if size >= 16 else None


SMALL_GRID = 1024  # work-items a compute unit (Target.work_group)


SUBGROUP_EXTENSIONS = ("cl_khr_subgroups", "cl_intel_subgroups")  # (in order of preference)


@dataclass(frozen=True)
class Part:
    """One op of a composite op (a pass's merge of several ops into one step: graph.passes) as its unfused form runs
    it: with its own generator, applying ``epilogue`` (the fused ops that follow it there), its kernels renamed
    ``<composite>_<suffix>``."""

    op: Operator
    epilogue: list
    suffix: str


@dataclass
class GenContext(OpView):
    consts: dict[int, np.ndarray] = field(default_factory=dict)  # folded constants by tensor index
    fp16: bool = False
    params: dict[str, Any] = field(default_factory=dict)  # overrides of the generator's defaults (tuner's knobs)
    epilogue: list = field(default_factory=list)  # fused elementwise ops (graph.passes.Fused), applied in order
    subgraph_variables: frozenset = frozenset()  # variable (stateful) tensor indices
    # outputs this kernel stores as half although its op keeps FP32 (KernelSpec.half_outputs)
    half_outputs: frozenset = frozenset()
    target: Target = Target()
    # tensors the plan would have this kernel read or write as dense NHWC float32 (KernelSpec.dense); a generator
    # honours what it can and lists it in its specs' ``dense``, the rest keep the slice layout
    dense: frozenset = frozenset()
    # int32 / int64 tensors whose values are small indices, exact in any storage (graph.indices): an op that only
    # moves values may move these on the device
    exact_ints: frozenset = frozenset()
    # the parameters a composite op's unfused form generates each of its parts with, ``part_params(op, epilogue)``
    # (the runtime's: that op's own tuning record, as if it had a step of its own); None: the parts' heuristics
    part_params: Callable[[Operator, list], dict] | None = None

    def constant(self, tensor: int) -> np.ndarray | None:
        return self.consts.get(tensor)

    def layout(self, t: Tensor) -> Layout:
        lay = bhwc(t.shape)
        if lay is None:
            raise Unsupported(f"rank {len(t.shape)} > 4")
        return lay

    def fail(self, msg: str) -> Unsupported:
        return Unsupported(msg)

    @property
    def final_output(self) -> int:
        """The tensor this kernel writes: the last fused op's output, else the op's."""
        return self.epilogue[-1].op.outputs[0] if self.epilogue else self.op.outputs[0]

    def epilogue_code(self, cout: int) -> Epilogue:
        """The fused ops' code over ``v``, stored at slice-layout index ``oi`` (see kernels.epilogue)."""
        return epilogue(self.epilogue, "v", "oi", cout)

    @property
    def name(self) -> str:
        return f"{self.op.name.lower()}_{self.op.index}"


Generator = Callable[[GenContext], list[KernelSpec]]
_GENERATORS: dict[str, Generator] = {}
_PARTS: dict[str, Callable[[Operator, list], list[Part]]] = {}


def generator(*names: str):
    def deco(fn: Generator) -> Generator:
        for n in names:
            _GENERATORS[n] = fn
        return fn

    return deco


def generator_for(name: str) -> Generator | None:
    return _GENERATORS.get(name)


def composite(name: str):
    """Registers what a composite op's unfused form runs: ``fn(op, epilogue) -> [Part, ...]``. A composite
    generator has a ``fused`` knob: its unfused form (``unfused``) is the one generated with it False."""
    def deco(fn: Callable[[Operator, list], list[Part]]):
        _PARTS[name] = fn
        return fn

    return deco


def parts_of(op: Operator, epilogue: list) -> list[Part]:
    """The parts of a composite op (with the fused ops its step applies) in order; [] for any other op."""
    fn = _PARTS.get(op.name)
    return fn(op, epilogue) if fn is not None else []


def runs_parts(op: Operator, epilogue: list, specs: list[KernelSpec]) -> list[Part]:
    """The parts whose own kernels ``specs`` (``op``'s, as generated) launch: a composite op's in its unfused form;
    [] for its fused form or any other op."""
    return parts_of(op, epilogue) if specs and specs[0].params.get("fused") is False else []


def unfused(ctx: GenContext, params: dict, space: dict) -> list[KernelSpec]:
    """A composite op's unfused form: each part's own kernels, generated with the part's parameters
    (``ctx.part_params``) and named after the composite (kernels.program.shared_names); the specs carry the
    composite's ``params`` and ``space``, which its tuner searches."""
    specs = []
    for part in parts_of(ctx.op, ctx.epilogue):
        own = ctx.part_params(part.op, part.epilogue) if ctx.part_params is not None else {}
        pctx = replace(ctx, op=part.op, epilogue=part.epilogue, params=dict(own))
        new = f"{ctx.name}_{part.suffix}"
        _covers(ctx.op.name, part.op.name)
        specs += [replace(s, name=s.name.replace(pctx.name, new, 1), source=s.source.replace(pctx.name, new))
                  for s in _GENERATORS[part.op.name](pctx)]
    return [replace(s, params=params, space=space) for s in specs]


def generator_version(op_name: str, sources: Mapping[str, bytes] | None = None) -> int:
    """The version of the generator making ``op_name``'s kernels (a tuning record is valid for it alone): a hash
    of its module's source and of every module of this package that module imports (common.sources_version),
    so a change to one generator leaves the records of the others' kernels standing. A composite's module imports
    the modules of its parts' generators (``unfused`` checks it). An op with no generator here: every generator's
    (GENERATOR_VERSION). ``sources``: the modules' sources by name (default: the files)."""
    if op_name not in _GENERATORS:
        return GENERATOR_VERSION
    if sources is not None:
        return sources_version([_module(op_name)], sources)
    if op_name not in _VERSIONS:
        _VERSIONS[op_name] = sources_version([_module(op_name)])
    return _VERSIONS[op_name]


_VERSIONS: dict[str, int] = {}


def _module(op_name: str) -> str:
    """The name of the module (of this package) of ``op_name``'s generator."""
    return _GENERATORS[op_name].__module__.rsplit(".", 1)[-1]


def _covers(composite: str, part: str) -> None:
    """Raises RuntimeError where a composite's version would not follow its part's generator: the part's module is
    not one the composite's module imports (a tflgpu bug: import it there)."""
    if (composite, part) not in _COVERED:
        if _module(part) not in module_closure([_module(composite)]):
            raise RuntimeError(f"{composite}'s generator ({_module(composite)}) runs {part}'s ({_module(part)}) for "
                               "its unfused form without importing it: its tuning records would outlive a change there")
        _COVERED.add((composite, part))


_COVERED: set[tuple[str, str]] = set()


def gpu_ops() -> list[str]:
    return sorted(_GENERATORS)


def require_float(ctx: GenContext, *tensors: Tensor | None, allow_bool: bool = False,
                  allow_index: bool = False) -> None:
    """Device tensors are float32 (or bool stored as exact 0/1 where the op allows it, or, where it only moves
    values, small integer indices: ``GenContext.exact_ints``)."""
    for t in tensors:
        if t is None or t.dtype == np.float32 or (allow_bool and t.dtype == np.bool_) \
                or (allow_index and t.index in ctx.exact_ints):
            continue
        raise Unsupported(f"tensor '{t.name}' is {t.type_name}, the OpenCL path runs float32 tensors")
