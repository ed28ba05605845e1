"""Kernel registry for the CPU path.

A kernel is registered as a *factory*: given an :class:`OpContext` (the op,
its tensors' metadata and any constant inputs) it does the per-model work
once (reshaping weights, folding options) and returns a callable that maps
the op's input arrays to its output arrays on every invoke.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..model import reader
from ..ops.attributes import activation_bounds
from ..ops.context import OpView

Arrays = Sequence[np.ndarray | None]
KernelFn = Callable[[Arrays], Sequence[np.ndarray]]
Factory = Callable[["OpContext"], KernelFn]

_REGISTRY: dict[str, Factory] = {}


class KernelError(RuntimeError):
    """An op failed at run time (bad runtime input such as an index out of range)."""


class PrepareError(RuntimeError):
    """A node its kernel cannot take (wrong input count, types, ranks, options or sizes), found when the model
    is prepared: ``Interpreter.allocate_tensors`` raises it, as LiteRT's does, and nothing runs."""

    def __init__(self, op, why: str, subgraph: int = 0):
        where = f" in subgraph {subgraph}" if subgraph else ""
        super().__init__(f"Node number {op.index} ({op.name}){where} failed to prepare: {why}")
        self.op_index, self.why = op.index, why


class UnresolvedCustomOp(PrepareError):
    """A custom op no kernel here runs: LiteRT builds the interpreter and refuses the node when it is prepared
    (``allocate_tensors``), in its words; a builtin op without a kernel is refused when the model is read."""

    def __init__(self, op, subgraph: int = 0):
        super().__init__(op, "unresolved custom op", subgraph)
        where = f" in subgraph {subgraph}" if subgraph else ""
        message = (f"Encountered unresolved custom op: {op.name}.\nSee instructions: "
                   f"https://www.tensorflow.org/lite/guide/ops_custom Node number {op.index} ({op.name}){where} "
                   "failed to prepare.")
        self.args = (message,)


class InvokeError(RuntimeError):
    """A node whose kernel failed on the data it was given ("Node number N (OP) failed to invoke: ..."); where
    the run only computed shapes for ``allocate_tensors``, it becomes the node's PrepareError."""

    def __init__(self, op, why: str):
        super().__init__(f"Node number {op.index} ({op.name}) failed to invoke: {why}")
        self.op, self.why = op, why


@dataclass
class OpContext(OpView):
    runtime: Any = None  # the ModelRunner: control-flow ops call other subgraphs through it
    consts: Any = None  # the building runner's constants (tensor -> array); else looked up via runtime

    def constant(self, tensor: int) -> np.ndarray | None:
        if self.consts is not None:
            return self.consts.get(tensor)
        return self.runtime.constant_value(self.subgraph.index, tensor)

    def fail(self, msg: str) -> ValueError:
        """What a kernel raises for a node it cannot take; the caller names the node (at prepare, a
        PrepareError; at invoke, "failed to invoke")."""
        return ValueError(msg)


def register(*names: str) -> Callable[[Factory], Factory]:
    def deco(factory: Factory) -> Factory:
        for n in names:
            _REGISTRY[n] = factory
        return factory

    return deco


def factory_for(name: str) -> Factory | None:
    return _REGISTRY.get(name)


def supported_ops() -> list[str]:
    return sorted(_REGISTRY)


# -- helpers shared by kernels ----------------------------------------------

def once(make: Callable[[], Any]) -> Callable[[], Any]:
    """``make()``'s value, computed on the first call. Kernels prepare their weight re-layouts this way:
    under a GpuDelegate most ops never run on the CPU, and start-up is spared the copies."""
    box: list = []

    def get():
        if not box:
            box.append(make())
        return box[0]

    return get


def per_input_shape(constant: bool, compute: Callable[[list], Any]) -> Callable[[list], Any]:
    """``compute(xs)``, remembered by the shape of the first input where everything else it reads is constant (a
    slice, padding or size fixed in the model: its checks and index worked out once per input shape, not every
    run, where they were up to a third of a small op's run); computed every run otherwise."""
    if not constant:
        return compute
    known: dict[tuple, Any] = {}

    def get(xs):
        shape = xs[0].shape
        value = known.get(shape)
        if value is None:
            value = known[shape] = compute(xs)
        return value

    return get


def apply_activation(x: np.ndarray, code: int | None) -> np.ndarray:
    """Apply a fused activation (in place where possible); returns the result."""
    lo, hi = activation_bounds(code)
    if lo == -np.inf and hi == np.inf:
        return x
    if x.flags.writeable:
        return np.clip(x, lo, hi, out=x)
    return np.clip(x, lo, hi)


def check_geometry(ctx: OpContext, **values: int) -> None:
    """Strides, dilations and filter sizes must be positive (a corrupt model can say otherwise)."""
    for name, v in values.items():
        if not isinstance(v, int) or v < 1:
            raise ctx.fail(f"{name} must be a positive integer, got {v!r}")


class TooLarge(KernelError):
    """An output over one tensor's limit (``fits``)."""


def fits(shape, dtype, what: str) -> tuple[int, ...]:
    """``shape`` as ints, if an array of it and ``dtype`` fits one tensor's limit; else a KernelError, raised
    before anything is allocated. Kernels whose output size comes from data (paddings, multiples, a target
    shape, broadcasting) call it at prepare where those data are constant, and on every run."""
    limit = reader.DEFAULT_MAX_TENSOR_BYTES
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise KernelError(f"{what}: negative dimension in its output shape {list(dims)}")
    need = math.prod(dims) * np.dtype(dtype).itemsize
    if need > limit:
        raise TooLarge(f"{what}: its output of shape {list(dims)} needs {need} bytes, over the limit of "
                       f"{limit} for one tensor (TFLGPU_MAX_TENSOR_BYTES)")
    return dims


def check_size_at_prepare(check: Callable[[], object]) -> None:
    """Run a kernel's output-size check at prepare, on declared shapes: only an output over the limit refuses
    the node there. A declared shape can be stale (shapes are recomputed at run time), so a shape the check
    cannot use is left to the same check on every run."""
    try:
        check()
    except TooLarge:
        raise
    except (KernelError, ValueError, IndexError):
        pass


def static_shape(ctx: OpContext, i: int) -> tuple[int, ...] | None:
    """Input ``i``'s declared shape where the model fixes it (no -1 in its signature), else None."""
    t = ctx.input_tensor(i)
    if t is None or any(d < 0 for d in t.shape_signature or t.shape):
        return None
    return t.shape


def normalize_axis(axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise KernelError(f"axis {axis} out of range for rank {rank}")
    return a
