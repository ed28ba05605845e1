"""TFLite sparse tensors: reading the encoding and rebuilding the dense tensor (DENSIFY)."""

from __future__ import annotations

from typing import Any

import numpy as np

DENSE, SPARSE_CSR = 0, 1


def _union_vector(dm, which: str) -> tuple[int, ...]:
    """array_segments / array_indices are a union of int32/uint16/uint8 vectors."""
    kind = getattr(dm, which + "Type")()
    table = getattr(dm, which)()
    if kind == 0 or table is None:
        return ()
    from tflite.Int32Vector import Int32Vector
    from tflite.Uint8Vector import Uint8Vector
    from tflite.Uint16Vector import Uint16Vector

    cls = {1: Int32Vector, 2: Uint16Vector, 3: Uint8Vector}.get(kind)
    if cls is None:
        raise ValueError(f"Invalid TFLite model: unknown sparse index vector type {kind}")
    vec = cls()
    vec.Init(table.Bytes, table.Pos)
    arr = vec.ValuesAsNumpy()
    return tuple(int(v) for v in arr) if not isinstance(arr, int) else ()


def read_sparsity(sp) -> dict[str, Any]:
    """The sparse encoding in the shape LiteRT reports as ``sparsity_parameters``."""
    meta = []
    for i in range(sp.DimMetadataLength()):
        dm = sp.DimMetadata(i)
        fmt = int(dm.Format())
        entry: dict[str, Any] = {"format": fmt}
        if fmt == DENSE:
            entry["dense_size"] = int(dm.DenseSize())
        else:
            entry["array_segments"] = np.array(_union_vector(dm, "ArraySegments"), np.int32)
            entry["array_indices"] = np.array(_union_vector(dm, "ArrayIndices"), np.int32)
        meta.append(entry)
    order = sp.TraversalOrderAsNumpy()
    bmap = sp.BlockMapAsNumpy()
    return {
        "traversal_order": np.array([] if isinstance(order, int) else order, np.int32),
        "block_map": np.array([] if isinstance(bmap, int) else bmap, np.int32),
        "dim_metadata": meta,
    }


def densify(values: np.ndarray, shape: tuple[int, ...], sparsity: dict[str, Any]) -> np.ndarray:
    """Rebuild the dense tensor from its sparse values (TFLite's FormatConverter, in Python).

    Runs once per constant at build time, so clarity wins over speed here.
    """
    order = [int(v) for v in sparsity["traversal_order"]]
    block_map = [int(v) for v in sparsity["block_map"]]
    meta = sparsity["dim_metadata"]
    rank = len(shape)
    if len(order) != len(meta) or sorted(order) != list(range(len(order))) or len(order) != rank + len(block_map):
        raise ValueError("Invalid sparse tensor: traversal order, block map and dim metadata disagree")
    level_of = {d: lvl for lvl, d in enumerate(order)}
    block_size = {}
    for k, d in enumerate(block_map):
        block_size[d] = meta[level_of[rank + k]].get("dense_size", 1)
    out = np.zeros(shape, dtype=values.dtype)
    coords = [0] * len(order)

    def place(value_index: int) -> None:
        idx = []
        for d in range(rank):
            c = coords[level_of[d]]
            if d in block_size:
                k = block_map.index(d)
                c = c * block_size[d] + coords[level_of[rank + k]]
            idx.append(c)
        if value_index >= len(values) or any(c >= s for c, s in zip(idx, shape)):
            raise ValueError("Invalid sparse tensor: an index lies outside the dense shape")
        out[tuple(idx)] = values[value_index]

    def walk(level: int, prev: int) -> None:
        if level == len(order):
            place(prev)
            return
        m = meta[level]
        if m["format"] == DENSE:
            size = m["dense_size"]
            for j in range(size):
                coords[level] = j
                walk(level + 1, prev * size + j)
        else:
            seg, ind = m["array_segments"], m["array_indices"]
            if prev + 1 >= len(seg):
                raise ValueError("Invalid sparse tensor: array_segments too short")
            for j in range(int(seg[prev]), int(seg[prev + 1])):
                if j >= len(ind):
                    raise ValueError("Invalid sparse tensor: array_indices too short")
                coords[level] = int(ind[j])
                walk(level + 1, j)

    walk(0, 0)
    return out
