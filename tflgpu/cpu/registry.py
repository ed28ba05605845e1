"""Kernel registry for the CPU path.

A kernel is registered as a *factory*: given an :class:`OpContext` (the op,
its tensors' metadata and any constant inputs) it does the per-model work
once (reshaping weights, folding options) and returns a callable that maps
the op's input arrays to its output arrays on every invoke.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ops.attributes import activation_bounds
from ..ops.context import OpView

Arrays = Sequence[np.ndarray | None]
KernelFn = Callable[[Arrays], Sequence[np.ndarray]]
Factory = Callable[["OpContext"], KernelFn]

_REGISTRY: dict[str, Factory] = {}


class KernelError(RuntimeError):
    """An op failed at run time (bad runtime input such as an index out of range)."""


@dataclass
class OpContext(OpView):
    runtime: Any = None  # the ModelRunner: control-flow ops call other subgraphs through it
    consts: Any = None  # the building runner's constants (tensor -> array); else looked up via runtime

    def constant(self, tensor: int) -> np.ndarray | None:
        if self.consts is not None:
            return self.consts.get(tensor)
        return self.runtime.constant_value(self.subgraph.index, tensor)

    def fail(self, msg: str) -> ValueError:
        return ValueError(f"op {self.op.name} at index {self.op.index}: {msg}")


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


def normalize_axis(axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise KernelError(f"axis {axis} out of range for rank {rank}")
    return a
