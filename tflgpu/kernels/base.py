"""The generator registry and the context a generator sees."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..graph.ir import Operator, Subgraph, Tensor
from .common import KernelSpec, Layout, bhwc


class Unsupported(Exception):
    """This op (with these attributes/shapes) cannot run on the OpenCL path."""


@dataclass
class GenContext:
    op: Operator
    subgraph: Subgraph
    consts: dict[int, np.ndarray]  # folded constants by tensor index
    fp16: bool
    params: dict[str, Any]  # overrides of the generator's heuristic defaults (the tuner's knobs)
    epilogue: list = field(default_factory=list)  # fused elementwise ops (graph.passes.Fused), applied in order
    subgraph_variables: frozenset = frozenset()  # variable (stateful) tensor indices

    def tensor(self, idx: int) -> Tensor:
        return self.subgraph.tensors[idx]

    def inp(self, i: int) -> Tensor | None:
        ins = self.op.inputs
        return self.subgraph.tensors[ins[i]] if i < len(ins) and ins[i] >= 0 else None

    def out(self, i: int = 0) -> Tensor:
        return self.subgraph.tensors[self.op.outputs[i]]

    def const(self, i: int) -> np.ndarray | None:
        ins = self.op.inputs
        if i >= len(ins) or ins[i] < 0:
            return None
        return self.consts.get(ins[i])

    def layout(self, t: Tensor) -> Layout:
        lay = bhwc(t.shape)
        if lay is None:
            raise Unsupported(f"rank {len(t.shape)} > 4")
        return lay

    def opt(self, key: str, default: Any = None) -> Any:
        return self.op.options.get(key, default)

    def fail(self, msg: str) -> Unsupported:
        return Unsupported(msg)

    @property
    def final_output(self) -> int:
        """The tensor this kernel writes: the last fused op's output, else the op's."""
        return self.epilogue[-1].op.outputs[0] if self.epilogue else self.op.outputs[0]

    def epilogue_io(self, var: str, index: str, cout: int):
        """(C code, extra params, extra Args, extra input tensors) of the fused ops."""
        from ..graph.passes import epilogue_code
        from .common import Arg

        if not self.epilogue:
            return "", [], [], []
        code, (args, params) = epilogue_code(self.epilogue, var, index, cout)
        return code, params, [Arg(k, v) for k, v in args], [v for k, v in args if k == "tensor"]

    @property
    def name(self) -> str:
        return f"{self.op.name.lower()}_{self.op.index}"


Generator = Callable[[GenContext], list[KernelSpec]]
_GENERATORS: dict[str, Generator] = {}


def generator(*names: str):
    def deco(fn: Generator) -> Generator:
        for n in names:
            _GENERATORS[n] = fn
        return fn

    return deco


def generator_for(name: str) -> Generator | None:
    return _GENERATORS.get(name)


def gpu_ops() -> list[str]:
    return sorted(_GENERATORS)


def require_float(ctx: GenContext, *tensors: Tensor | None, allow_bool: bool = False) -> None:
    """Device tensors are float32 (or bool stored as exact 0/1 where the op allows it)."""
    for t in tensors:
        if t is None or t.dtype == np.float32 or (allow_bool and t.dtype == np.bool_):
            continue
        raise Unsupported(f"tensor '{t.name}' is {t.type_name}, the OpenCL path runs float32 tensors")
