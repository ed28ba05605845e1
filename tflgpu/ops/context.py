"""What a kernel sees of its op while it is prepared: the base of the CPU kernels' ``OpContext`` and the
OpenCL generators' ``GenContext``, so both read an op's tensors, constants and options the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..model.ir import Operator, Subgraph, Tensor


@dataclass
class OpView:
    op: Operator
    subgraph: Subgraph

    def tensor(self, idx: int) -> Tensor:
        return self.subgraph.tensors[idx]

    def input_tensor(self, i: int) -> Tensor | None:
        """Input ``i``'s tensor, or None where it is omitted (-1) or past the op's inputs."""
        ins = self.op.inputs
        return self.subgraph.tensors[ins[i]] if i < len(ins) and ins[i] >= 0 else None

    def output_tensor(self, i: int = 0) -> Tensor:
        return self.subgraph.tensors[self.op.outputs[i]]

    def has_input(self, i: int) -> bool:
        return self.input_tensor(i) is not None

    def const(self, i: int) -> np.ndarray | None:
        """The constant (or folded) value of input ``i``, or None if it is not a constant."""
        t = self.input_tensor(i)
        return None if t is None else self.constant(t.index)

    def constant(self, tensor: int) -> np.ndarray | None:
        """The constant (or folded) value of a tensor of this subgraph, or None."""
        raise NotImplementedError

    def opt(self, key: str, default: Any = None) -> Any:
        return self.op.options.get(key, default)

    def fail(self, msg: str) -> Exception:
        """The exception that says this op cannot be prepared, for the caller to raise."""
        raise NotImplementedError
