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

STAGES = [(24, 2, 8), (40, 2, 12), (56, 2, 16), (80, 2, 18), (112, 1, 18)]  # (channels, first stride, blocks)


def build(seed: int = 1) -> bytes:
    rng = np.random.default_rng(seed)
    b = ModelBuilder("MediaPipe-sized synthetic model (random weights)")

    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    def conv(x, s, cout, k, stride, act, name):
        n, h, w, cin = s
        out = (n, -(-h // stride), -(-w // stride), cout)
        y = b.tensor(name, out)
        b.op("CONV_2D", [x, b.const(f"{name}/w", he((cout, k, k, cin), k * k * cin)),
                         b.const(f"{name}/b", np.zeros(cout, np.float32))], [y], padding="SAME", stride_w=stride,
             stride_h=stride, fused_activation_function=act)
        return y, out

    def depthwise(x, s, stride, name):
        n, h, w, c = s
        out = (n, -(-h // stride), -(-w // stride), c)
        y = b.tensor(name, out)
        b.op("DEPTHWISE_CONV_2D", [x, b.const(f"{name}/w", he((1, 3, 3, c), 9)),
                                   b.const(f"{name}/b", np.zeros(c, np.float32))], [y], padding="SAME",
             stride_w=stride, stride_h=stride, depth_multiplier=1, fused_activation_function="RELU6")
        return y, out

    x = b.input("input", (1, 256, 256, 3))
    y, s = conv(x, (1, 256, 256, 3), 24, 3, 2, "RELU6", "stem")
    for si, (cout, stride, blocks) in enumerate(STAGES):
        for r in range(blocks):
            st = stride if r == 0 else 1
            e, es = conv(y, s, s[3] * 2, 1, 1, "RELU6", f"s{si}b{r}/expand")
            d, ds = depthwise(e, es, st, f"s{si}b{r}/dw")
            p, ps = conv(d, ds, cout, 1, 1, "NONE", f"s{si}b{r}/project")
            if st == 1 and cout == s[3]:
                added = b.tensor(f"s{si}b{r}/add", ps)
                b.op("ADD", [y, p], [added])
                p = b.tensor(f"s{si}b{r}/relu", ps)
                b.op("RELU", [added], [p])
            y, s = p, ps
    h, _ = conv(y, s, 64, 1, 1, "RELU", "head")
    pooled = b.tensor("pool", (1, 64))
    b.op("MEAN", [h, b.const("axes", np.array([1, 2], np.int32))], [pooled], keep_dims=False)
    out = b.tensor("landmarks", (1, 195))
    b.op("FULLY_CONNECTED", [pooled, b.const("fc/w", he((195, 64), 64)), b.const("fc/b", np.zeros(195, np.float32))],
         [out])
    b.output(out)
    return b.build()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    data = build()
    with open(sys.argv[1], "wb") as f:
        f.write(data)
    print(f"wrote {sys.argv[1]} ({len(data) / 1e6:.1f} MB)")
