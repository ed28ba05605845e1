"""The bundled default model: a small MobileNet-style classifier built with our own builder.

Regenerate the shipped file with ``python -m tflgpu.model.default_model``;
a test checks the shipped bytes equal a fresh build (fixed seed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .builder import ModelBuilder

DEFAULT_MODEL_PATH = Path(__file__).resolve().parent.parent / "data" / "default.tflite"
INPUT_SHAPE = (1, 96, 96, 3)
CLASSES = 10


class ConvLayers:
    """MobileNet-style layers with random He-initialized weights, added to a builder (the default model's, and
    the synthetic benchmark models'). Each returns the output tensor and its NHWC shape."""

    def __init__(self, b: ModelBuilder, rng: np.random.Generator):
        self.b, self.rng = b, rng

    def he(self, shape, fan_in: int) -> np.ndarray:
        return (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    def conv(self, x: int, in_shape, cout: int, k: int, stride: int, act: str, name: str):
        n, h, w, cin = in_shape
        oh, ow = -(-h // stride), -(-w // stride)
        wt = self.b.const(f"{name}/weights", self.he((cout, k, k, cin), k * k * cin))
        bias = self.b.const(f"{name}/bias", (self.rng.standard_normal(cout) * 0.05).astype(np.float32))
        y = self.b.tensor(name, (n, oh, ow, cout))
        self.b.op("CONV_2D", [x, wt, bias], [y], padding="SAME", stride_w=stride, stride_h=stride,
                  fused_activation_function=act)
        return y, (n, oh, ow, cout)

    def depthwise(self, x: int, in_shape, stride: int, name: str):
        n, h, w, c = in_shape
        oh, ow = -(-h // stride), -(-w // stride)
        wt = self.b.const(f"{name}/weights", self.he((1, 3, 3, c), 9))
        bias = self.b.const(f"{name}/bias", (self.rng.standard_normal(c) * 0.05).astype(np.float32))
        y = self.b.tensor(name, (n, oh, ow, c))
        self.b.op("DEPTHWISE_CONV_2D", [x, wt, bias], [y], padding="SAME", stride_w=stride, stride_h=stride,
                  depth_multiplier=1, fused_activation_function="RELU6")
        return y, (n, oh, ow, c)

    def inverted_residual(self, x: int, in_shape, expand: int, cout: int, stride: int, name: str,
                          relu: bool = False):
        """MobileNet v2's block: 1x1 expand (RELU6), 3x3 depthwise, 1x1 project; the input added back where the
        shapes allow (then a RELU with ``relu``)."""
        e, es = self.conv(x, in_shape, in_shape[3] * expand, 1, 1, "RELU6", f"{name}/expand")
        d, ds = self.depthwise(e, es, stride, f"{name}/depthwise")
        p, ps = self.conv(d, ds, cout, 1, 1, "NONE", f"{name}/project")
        if stride == 1 and cout == in_shape[3]:
            added = self.b.tensor(f"{name}/add", ps)
            self.b.op("ADD", [x, p], [added])
            p = added
            if relu:
                p = self.b.tensor(f"{name}/relu", ps)
                self.b.op("RELU", [added], [p])
        return p, ps


def build_default_model(seed: int = 2026) -> bytes:
    rng = np.random.default_rng(seed)
    b = ModelBuilder("tflgpu default model: tiny MobileNet-style classifier, random weights")
    layers = ConvLayers(b, rng)
    he, conv = layers.he, layers.conv

    x = b.input("input", INPUT_SHAPE)
    y, s = conv(x, INPUT_SHAPE, 16, 3, 2, "RELU6", "stem")
    for i, (cout, stride) in enumerate([(24, 2), (24, 1), (40, 2), (40, 1), (64, 2)]):
        y, s = layers.inverted_residual(y, s, 4, cout, stride, f"block{i}")
    h, hs = conv(y, s, 128, 1, 1, "NONE", "head")
    hsw = b.tensor("head/hard_swish", hs)
    b.op("HARD_SWISH", [h], [hsw])
    axes = b.const("pool/axes", np.array([1, 2], np.int32))
    pooled = b.tensor("pool", (1, 128))
    b.op("MEAN", [hsw, axes], [pooled], keep_dims=False)
    fc_w = b.const("logits/weights", he((CLASSES, 128), 128))
    fc_b = b.const("logits/bias", np.zeros(CLASSES, np.float32))
    logits = b.tensor("logits", (1, CLASSES))
    b.op("FULLY_CONNECTED", [pooled, fc_w, fc_b], [logits])
    probs = b.tensor("probs", (1, CLASSES))
    b.op("SOFTMAX", [logits], [probs], beta=1.0)
    b.output(probs)
    b.signature("serving_default", {"input": x}, {"probs": probs})
    return b.build()


if __name__ == "__main__":
    data = build_default_model()
    DEFAULT_MODEL_PATH.write_bytes(data)
    print(f"wrote {DEFAULT_MODEL_PATH} ({len(data)} bytes)")
