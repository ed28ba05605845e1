"""The graph IR every later stage works on: plain data, no flatbuffer objects.

A :class:`Model` holds subgraphs; a :class:`Subgraph` holds tensors and
operators in execution order. Constant tensor data are numpy views of the
model bytes (zero-copy); nothing here knows how an op is computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Quantization:
    """Affine quantization of a tensor: ``real = scale * (q - zero_point)``."""

    scales: np.ndarray  # float32, one per channel (or one)
    zero_points: np.ndarray  # int64, same length as scales
    quantized_dimension: int = 0
    block_size: int = 0
    min: np.ndarray | None = None
    max: np.ndarray | None = None

    @property
    def per_tensor(self) -> tuple[float, int]:
        """The deprecated ``(scale, zero_point)`` pair LiteRT reports."""
        if len(self.scales) != 1:
            return (0.0, 0)
        return (float(self.scales[0]), int(self.zero_points[0]))


@dataclass
class Tensor:
    index: int
    name: str
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...]
    dtype: np.dtype
    type_name: str  # the TFLite TensorType name, e.g. "FLOAT32"
    data: np.ndarray | None = None  # constant data (read-only view), already shaped
    quantization: Quantization | None = None
    sparsity: dict[str, Any] | None = None  # raw sparse encoding, see model.sparse
    is_variable: bool = False
    # whether the model stores shape_signature; where it does not, ``shape_signature`` is ``shape`` and LiteRT
    # reports a tensor's current dims as its signature (after a resize too)
    signature_stored: bool = True

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    def empty_values(self, shape: tuple[int, ...]) -> bool:
        """Whether this tensor, at ``shape``, is values a run takes or makes (not a constant, nor int32 / int64
        index arithmetic: a RESHAPE to a scalar reads a shape of no elements) with no elements: an empty batch."""
        return 0 in shape and not self.is_constant and self.dtype not in (np.int32, np.int64)


@dataclass
class Operator:
    index: int
    name: str  # builtin name ("CONV_2D") or the custom code ("MaxUnpooling2D")
    builtin_code: int  # -1 for custom ops
    version: int
    inputs: tuple[int, ...]  # -1 marks an omitted optional input
    outputs: tuple[int, ...]
    intermediates: tuple[int, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    custom_options: bytes = b""

    @property
    def is_custom(self) -> bool:
        return self.builtin_code < 0


@dataclass
class Subgraph:
    index: int
    name: str
    tensors: list[Tensor]
    operators: list[Operator]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass
class SignatureDef:
    key: str
    subgraph_index: int
    inputs: dict[str, int]  # name -> tensor index in that subgraph
    outputs: dict[str, int]


@dataclass
class Model:
    version: int
    description: str
    subgraphs: list[Subgraph]
    signature_defs: list[SignatureDef]
    metadata: dict[str, bytes]
    size_bytes: int

    @property
    def main(self) -> Subgraph:
        return self.subgraphs[0]

    def op_census(self) -> dict[str, int]:
        """Op name -> count over every subgraph."""
        census: dict[str, int] = {}
        for sg in self.subgraphs:
            for op in sg.operators:
                census[op.name] = census.get(op.name, 0) + 1
        return dict(sorted(census.items()))
