#!/usr/bin/env python3
"""Write a synthetic model of MediaPipe's size for start-up benchmarks: 354 ops, 7.1 MB of float32 weights, a
256x256x3 input; stacks of expand (1x1) / depthwise (3x3) / project (1x1) blocks with residual ADD + RELU, as in
BlazePose- and face-mesh-like networks, then a pooled 195-value landmark head. Random weights (fixed seed).

    python bench/make_mediapipe_sized.py OUT.tflite
    python bench/bench_startup.py --cold-only OUT.tflite
"""

from __future__ import annotations

import sys

import numpy as np

from tflgpu.model.builder import ModelBuilder
from tflgpu.model.default_model import ConvLayers

STAGES = [(24, 2, 8), (40, 2, 12), (56, 2, 16), (80, 2, 18), (112, 1, 18)]  # (channels, first stride, blocks)


def build(seed: int = 1) -> bytes:
    rng = np.random.default_rng(seed)
    b = ModelBuilder("MediaPipe-sized synthetic model (random weights)")
    layers = ConvLayers(b, rng)
    conv = layers.conv

    x = b.input("input", (1, 256, 256, 3))
    y, s = conv(x, (1, 256, 256, 3), 24, 3, 2, "RELU6", "stem")
    for si, (cout, stride, blocks) in enumerate(STAGES):
        for r in range(blocks):
            y, s = layers.inverted_residual(y, s, 2, cout, stride if r == 0 else 1, f"s{si}b{r}", relu=True)
    h, _ = conv(y, s, 64, 1, 1, "RELU", "head")
    pooled = b.tensor("pool", (1, 64))
    b.op("MEAN", [h, b.const("axes", np.array([1, 2], np.int32))], [pooled], keep_dims=False)
    out = b.tensor("landmarks", (1, 195))
    b.op("FULLY_CONNECTED", [pooled, b.const("fc/w", layers.he((195, 64), 64)),
                             b.const("fc/b", np.zeros(195, np.float32))], [out])
    b.output(out)
    return b.build()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    data = build()
    with open(sys.argv[1], "wb") as f:
        f.write(data)
    print(f"wrote {sys.argv[1]} ({len(data) / 1e6:.1f} MB)")
