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
    found: dict[str, Any] = {"traversal_order": np.array([] if isinstance(order, int) else order, np.int32)}
    if not sp.BlockMapIsNone():  # (LiteRT names a block map, empty or not, only where the model stores one)
        bmap = sp.BlockMapAsNumpy()
        found["block_map"] = np.array([] if isinstance(bmap, int) else bmap, np.int32)
    found["dim_metadata"] = meta
    return found


def densify(values: np.ndarray, shape: tuple[int, ...], sparsity: dict[str, Any]) -> np.ndarray:
    """Rebuild the dense tensor from its sparse values (what TFLite's FormatConverter does).

    The traversal is expanded one level at a time over every position at once, so a large weight
    (a conv of 256x3x3x256) is rebuilt in a few numpy calls rather than one Python call per value.
    """
    order = [int(v) for v in sparsity["traversal_order"]]
    block_map = [int(v) for v in sparsity.get("block_map", ())]
    meta = sparsity["dim_metadata"]
    rank = len(shape)
    if len(order) != len(meta) or sorted(order) != list(range(len(order))) or len(order) != rank + len(block_map):
        raise ValueError("Invalid sparse tensor: traversal order, block map and dim metadata disagree")
    # walk the levels: `prev` is each position's index into the next level's segments (or the values)
    prev = np.zeros(1, np.int64)
    coords: list[np.ndarray] = []  # per level, each position's coordinate
    for m in meta:
        if m["format"] == DENSE:
            size = int(m["dense_size"])
            if size < 0:
                raise ValueError("Invalid sparse tensor: a negative dense_size")
            coords = [np.repeat(c, size) for c in coords] + [np.tile(np.arange(size, dtype=np.int64), len(prev))]
            prev = (prev[:, None] * size + np.arange(size, dtype=np.int64)).ravel()
        else:
            seg = np.asarray(m["array_segments"], np.int64)
            ind = np.asarray(m["array_indices"], np.int64)
            if len(prev) and int(prev.max()) + 1 >= len(seg):
                raise ValueError("Invalid sparse tensor: array_segments too short")
            lo, hi = seg[prev], seg[prev + 1]
            counts = hi - lo
            if (counts < 0).any():
                raise ValueError("Invalid sparse tensor: array_segments decrease")
            # j runs over lo..hi-1 for every position, all positions at once
            j = np.repeat(lo - np.concatenate(([0], np.cumsum(counts)[:-1])), counts) + np.arange(int(counts.sum()))
            if len(j) and int(j.max()) >= len(ind):
                raise ValueError("Invalid sparse tensor: array_indices too short")
            coords = [np.repeat(c, counts) for c in coords] + [ind[j]]
            prev = j
    level_of = {d: lvl for lvl, d in enumerate(order)}
    index = []
    for d in range(rank):
        c = coords[level_of[d]]
        if d in block_map:
            k = block_map.index(d)
            block = int(meta[level_of[rank + k]].get("dense_size", 1))
            c = c * block + coords[level_of[rank + k]]
        index.append(c)
    if len(prev) and (int(prev.max()) >= len(values) or
                      any(len(c) and (int(c.min()) < 0 or int(c.max()) >= s) for c, s in zip(index, shape))):
        raise ValueError("Invalid sparse tensor: an index lies outside the dense shape")
    out = np.zeros(shape, dtype=values.dtype)
    out[tuple(index)] = values[prev]
    return out
