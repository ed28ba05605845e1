#!/usr/bin/env python3
"""Carry the corpus to a machine that cannot fetch it, in a few hundred KB instead of 80 MiB.

The corpus models hold random weights (``../shared/models/MANIFEST.md``), so what a speed or correctness run
on another machine needs of a model is its graph, its small constants and weights of the same dtypes and about
the same distributions, not the exact bytes. ``pack`` zeroes every large constant buffer of each model (xz then
shrinks it to its graph) and records, per buffer, where it lies, its tensor's dtype and its statistics;
``unpack`` refills each buffer from a seeded generator with those statistics (normal with the buffer's mean and
standard deviation for floats, uniform over its range for integers). The results are stand-ins: the same
architecture and file layout, different random weights, the same on every unpack. Compare a stand-in only with
itself (tflgpu against LiteRT on the same file), never with figures from the original.

    python bench/standin_models.py pack ../shared/models OUT_DIR
    python bench/standin_models.py unpack OUT_DIR MODELS_DIR
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from pathlib import Path

import numpy as np
import tflite

LARGE = 4096  # bytes: buffers at least this large are regenerated, smaller ones travel as they are
_DTYPES = {tflite.TensorType.FLOAT32: "float32", tflite.TensorType.FLOAT16: "float16",
           tflite.TensorType.INT8: "int8", tflite.TensorType.UINT8: "uint8", tflite.TensorType.INT32: "int32",
           tflite.TensorType.INT16: "int16", tflite.TensorType.INT64: "int64"}


def _buffer_dtypes(model: tflite.Model) -> dict[int, str]:
    """Buffer index -> the dtype of the (first) tensor that reads it."""
    out: dict[int, str] = {}
    for s in range(model.SubgraphsLength()):
        sg = model.Subgraphs(s)
        for t in range(sg.TensorsLength()):
            tensor = sg.Tensors(t)
            if tensor.Buffer() and tensor.Type() in _DTYPES:
                out.setdefault(tensor.Buffer(), _DTYPES[tensor.Type()])
    return out


def pack(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.glob("*.tflite")):
        data = bytearray(path.read_bytes())
        base = np.frombuffer(bytes(data), np.uint8)
        model = tflite.Model.GetRootAsModel(base.tobytes(), 0)
        raw = np.frombuffer(model._tab.Bytes, np.uint8)
        dtypes = _buffer_dtypes(model)
        fills = []
        for b in range(model.BuffersLength()):
            buf = model.Buffers(b)
            if buf.DataLength() < LARGE or b not in dtypes:
                continue
            view = buf.DataAsNumpy()
            start = view.__array_interface__["data"][0] - raw.__array_interface__["data"][0]
            values = np.frombuffer(bytes(data[start:start + view.size]), dtypes[b])
            wide = values.astype(np.float64)
            fills.append({"buffer": b, "offset": int(start), "bytes": int(view.size), "dtype": dtypes[b],
                          "mean": float(wide.mean()), "std": float(wide.std()),
                          "min": float(wide.min()), "max": float(wide.max())})
            data[start:start + view.size] = bytes(view.size)
        (dst / f"{path.name}.xz").write_bytes(lzma.compress(bytes(data), preset=6))
        (dst / f"{path.name}.fill.json").write_text(json.dumps(fills))
        print(f"{path.name}: {len(fills)} buffers, {sum(f['bytes'] for f in fills) / 2**20:.1f} MiB regenerated")


def unpack(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for packed in sorted(src.glob("*.tflite.xz")):
        name = packed.name[:-3]
        data = bytearray(lzma.decompress(packed.read_bytes()))
        for f in json.loads((src / f"{name}.fill.json").read_text()):
            dtype = np.dtype(f["dtype"])
            n = f["bytes"] // dtype.itemsize
            rng = np.random.default_rng(f["buffer"])
            if dtype.kind == "f":
                values = rng.normal(f["mean"], f["std"], n).clip(f["min"], f["max"]).astype(dtype)
            else:
                values = rng.integers(int(f["min"]), int(f["max"]), n, endpoint=True).astype(dtype)
            data[f["offset"]:f["offset"] + f["bytes"]] = values.tobytes()
        (dst / name).write_bytes(bytes(data))
    print(f"{len(list(src.glob('*.tflite.xz')))} stand-in models in {dst}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["pack", "unpack"])
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    a = p.parse_args()
    (pack if a.action == "pack" else unpack)(a.src, a.dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
