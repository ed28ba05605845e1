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

from ..graph.ir import Operator, Subgraph, Tensor

Arrays = Sequence[np.ndarray | None]
KernelFn = Callable[[Arrays], Sequence[np.ndarray]]
Factory = Callable[["OpContext"], KernelFn]

_REGISTRY: dict[str, Factory] = {}


class KernelError(RuntimeError):
    """An op failed at run time (bad runtime input such as an index out of range)."""


@dataclass
class OpContext:
    op: Operator
    subgraph: Subgraph
    runtime: Any  # the ModelRunner: control-flow ops call other subgraphs through it
    consts: Any = None  # the building runner's constants (tensor -> array); else looked up via runtime

    def input_tensor(self, i: int) -> Tensor | None:
        if i >= len(self.op.inputs) or self.op.inputs[i] < 0:
            return None
        return self.subgraph.tensors[self.op.inputs[i]]

    def output_tensor(self, i: int) -> Tensor:
        return self.subgraph.tensors[self.op.outputs[i]]

    def const(self, i: int) -> np.ndarray | None:
        """The constant value of input i, or None if it is not a constant."""
        t = self.input_tensor(i)
        if t is None:
            return None
        if self.consts is not None:
            return self.consts.get(t.index)
        return self.runtime.constant_value(self.subgraph.index, t.index)

    def has_input(self, i: int) -> bool:
        return self.input_tensor(i) is not None

    def opt(self, key: str, default: Any = None) -> Any:
        return self.op.options.get(key, default)

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


def activation_bounds(code: int | None) -> tuple[float, float]:
    """Clamp bounds of a fused activation; TANH/SIGN_BIT are applied separately."""
    if code == 1:
        return 0.0, np.inf
    if code == 2:
        return -1.0, 1.0
    if code == 3:
        return 0.0, 6.0
    return -np.inf, np.inf


def apply_activation(x: np.ndarray, code: int | None) -> np.ndarray:
    """Apply a fused activation (in place where possible); returns the result.

    As in TFLite's CalculateActivationRange, only the RELU family clamps: a
    fused TANH or SIGN_BIT on conv/pool/elementwise ops is a no-op there,
    and LiteRT's outputs are what we must reproduce.
    """
    if code not in (1, 2, 3):
        return x
    lo, hi = activation_bounds(code)
    if x.flags.writeable:
        return np.clip(x, lo, hi, out=x)
    return np.clip(x, lo, hi)


def conv_options(ctx: OpContext) -> tuple[int, int, int, int, int]:
    """(stride_h, stride_w, dilation_h, dilation_w, padding) of a convolution's options."""
    return (ctx.opt("stride_h", 1), ctx.opt("stride_w", 1), ctx.opt("dilation_h_factor", 1) or 1,
            ctx.opt("dilation_w_factor", 1) or 1, ctx.opt("padding", 0))


def conv_padding(in_size: int, k: int, stride: int, dilation: int, padding: int) -> tuple[int, int]:
    """(output size, padding before) for TFLite's SAME (0) / VALID (1) padding."""
    eff = (k - 1) * dilation + 1
    if padding == 0:
        out = (in_size + stride - 1) // stride
    else:
        out = (in_size - eff + stride) // stride
    total = max((out - 1) * stride + eff - in_size, 0)
    return out, total // 2


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
