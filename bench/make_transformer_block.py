#!/usr/bin/env python3
"""Write a synthetic transformer encoder block for benchmarks of the ops a transformer needs on the device: a layer
norm as TFLite's converter writes it (MEAN over the last axis, SUB, MUL, MEAN, ADD, RSQRT, MUL, scale and shift),
self-attention (per-token FULLY_CONNECTED for Q / K / V and the output, BATCH_MATMUL, SOFTMAX over the last axis,
RESHAPE / TRANSPOSE into heads), a second layer norm, an MLP (FC, GELU, FC) and the residual ADDs. Random weights
(fixed seed).

    python bench/make_transformer_block.py OUT.tflite [--tokens 196] [--width 256] [--heads 4] [--no-attention]
    tflgpu bench OUT.tflite --delegate gpu
"""

from __future__ import annotations

import argparse

import numpy as np

from tflgpu.model.builder import ModelBuilder


def build(tokens: int = 196, width: int = 256, heads: int = 4, attention: bool = True, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    b = ModelBuilder("synthetic transformer encoder block (random weights)")
    shape = (1, tokens, width)
    names = iter(range(10**6))

    def t(s=shape):
        return b.tensor(f"t{next(names)}", s)

    def const(value):
        return b.const(f"c{next(names)}", np.asarray(value, np.float32))

    def op(name, inputs, s=shape, **options):
        y = t(s)
        b.op(name, inputs, [y], **options)
        return y

    def dense(x, units, depth):
        w = (rng.standard_normal((units, depth)) / np.sqrt(depth)).astype(np.float32)
        return op("FULLY_CONNECTED", [x, const(w), const(np.zeros(units))], (1, tokens, units), keep_num_dims=True)

    def layer_norm(x):
        axis = b.const(f"axis{next(names)}", np.array([-1], np.int32))
        mean = op("MEAN", [x, axis], (1, tokens, 1), keep_dims=True)
        d = op("SUB", [x, mean])
        var = op("MEAN", [op("MUL", [d, d]), axis], (1, tokens, 1), keep_dims=True)
        r = op("RSQRT", [op("ADD", [var, const(1e-5)], (1, tokens, 1))], (1, tokens, 1))
        n = op("MUL", [d, r])
        return op("ADD", [op("MUL", [n, const(rng.uniform(0.5, 1.5, width))]), const(rng.uniform(-0.1, 0.1, width))])

    def heads_of(x, transpose_last: bool):
        dh = width // heads
        r = op("RESHAPE", [x, b.const(f"s{next(names)}", np.array([tokens, heads, dh], np.int32))], (tokens, heads, dh))
        perm = [1, 2, 0] if transpose_last else [1, 0, 2]
        out = (heads, dh, tokens) if transpose_last else (heads, tokens, dh)
        return op("TRANSPOSE", [r, b.const(f"p{next(names)}", np.array(perm, np.int32))], out)

    x = b.input("tokens", shape)
    y = x
    if attention:
        h = layer_norm(x)
        q, k, v = (heads_of(dense(h, width, width), transpose_last=(i == 1)) for i in range(3))
        dh = width // heads
        scores = op("BATCH_MATMUL", [q, k], (heads, tokens, tokens))
        scores = op("MUL", [scores, const(1 / np.sqrt(dh))], (heads, tokens, tokens))
        p = op("SOFTMAX", [scores], (heads, tokens, tokens), beta=1.0)
        ctx = op("BATCH_MATMUL", [p, v], (heads, tokens, dh))
        ctx = op("TRANSPOSE", [ctx, b.const("cperm", np.array([1, 0, 2], np.int32))], (tokens, heads, dh))
        ctx = op("RESHAPE", [ctx, b.const("cshape", np.array([1, tokens, width], np.int32))])
        y = op("ADD", [x, dense(ctx, width, width)])
    h = layer_norm(y)
    m = op("GELU", [dense(h, 4 * width, width)], (1, tokens, 4 * width), approximate=True)
    out = op("ADD", [y, dense(m, width, 4 * width)])
    b.output(out)
    return b.build()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--tokens", type=int, default=196)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--no-attention", action="store_true")
    a = p.parse_args()
    with open(a.out, "wb") as f:
        f.write(build(a.tokens, a.width, a.heads, not a.no_attention))


if __name__ == "__main__":
    main()
