"""Layers for the stand-in models: each call adds one TFLite op (and its constants) to a ModelBuilder, in the
form TensorFlow's converter writes for a Keras layer, in one of four numeric forms.

    net = Net("tiny", Precision.FLOAT32, seed=0)
    x = net.input("serving_default_input:0", (1, 32, 32, 3))
    y = net.conv(x, 16, k=3, stride=2, name="conv1")
    net.output(net.softmax(net.mean(y, name="pool"), name="StatefulPartitionedCall_1:0"), "output_0")
    model_bytes = net.build()

Precision decides how constants and activations are stored, the way the converter's options do:

- FLOAT32: everything float32.
- FLOAT16: float constants stored as float16, each read through a DEQUANTIZE op (``target_spec.supported_types
  = [tf.float16]``).
- DYNAMIC_RANGE: conv/FC weights of 1,024 elements or more stored int8 per channel, the rest float32; the ops
  run hybrid kernels (``optimizations = [DEFAULT]`` without a dataset).
- INT8: activations int8 with the ranges found by running the float model (``Net.ranges``), weights int8 per
  channel, biases int32, float input and output through QUANTIZE/DEQUANTIZE (a representative dataset).

Weights are random (Glorot-uniform, as Keras initializes them; biases small and random so that bias paths
count). Ops of one type get the highest version among them, as the converter writes one version per op code.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..model.builder import ModelBuilder


class Precision(enum.Enum):
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    DYNAMIC_RANGE = "dynamic_range"
    INT8 = "int8"


@dataclass(frozen=True)
class Act:
    """An activation tensor: its index in the main subgraph, NHWC (or other) shape, and name."""

    index: int
    shape: tuple[int, ...]
    name: str


# per op: the version for float ops, hybrid (dynamic-range) ops and int8 ops, as the converter writes them
_VERSIONS = {
    "CONV_2D": {Precision.DYNAMIC_RANGE: 5, Precision.INT8: 3},
    "DEPTHWISE_CONV_2D": {Precision.DYNAMIC_RANGE: 6, Precision.INT8: 3},
    "FULLY_CONNECTED": {Precision.DYNAMIC_RANGE: 12, Precision.INT8: 4},
    "ADD": {Precision.INT8: 2},
    "MEAN": {Precision.INT8: 2},
    "SOFTMAX": {Precision.INT8: 2},
    "DEQUANTIZE": {Precision.FLOAT16: 3, Precision.INT8: 2},
    "RESIZE_BILINEAR": {},  # v3 in every form (the half_pixel_centers option)
}
_MIN_VERSION = {"RESIZE_BILINEAR": 3}
_HYBRID_MIN_ELEMENTS = 1024  # the converter leaves smaller weight tensors float
_SOFTMAX_INT8 = {"scale": np.float32([1 / 256]), "zero_point": np.int64([-128])}  # fixed by the int8 SOFTMAX spec


def int8_params(lo: float, hi: float) -> dict:
    """Asymmetric int8 parameters covering [lo, hi] (widened to include 0), as the converter derives them."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = (hi - lo) / 255.0 or 1e-8
    zero_point = int(np.clip(round(-128 - lo / scale), -128, 127))
    return {"scale": np.float32([scale]), "zero_point": np.int64([zero_point])}


class Net:
    """A model under construction: layers add ops to ``self.b`` (a ModelBuilder's main subgraph)."""

    def __init__(self, description: str, precision: Precision = Precision.FLOAT32, *, seed: int = 0,
                 ranges: dict[str, tuple[float, float]] | None = None, logit_scale: float = 1.0):
        if precision is Precision.INT8 and ranges is None:
            raise ValueError("an int8 stand-in needs the activation ranges of its float model (ranges=)")
        self.b = ModelBuilder(description)
        self.precision = precision
        self.rng = np.random.default_rng(seed)
        self.ranges = ranges or {}
        self.logit_scale = logit_scale
        self.logits_name: str | None = None  # the tensor the classifier's scale is fitted on
        self._names: set[str] = set()
        self._sig_inputs: dict[str, int] = {}
        self._sig_outputs: dict[str, int] = {}

    # -- tensors ----------------------------------------------------------------------------------------------

    def _quant(self, name: str) -> dict | None:
        if self.precision is not Precision.INT8:
            return None
        if name not in self.ranges:
            raise ValueError(f"no calibration range for tensor {name!r}")
        return int8_params(*self.ranges[name])

    def _act(self, name: str, shape: Sequence[int], *, quant: dict | None = None, dtype=None) -> Act:
        if name in self._names:
            raise ValueError(f"tensor name {name!r} used twice")
        self._names.add(name)
        int8 = self.precision is Precision.INT8 and dtype is None
        q = quant if quant is not None else self._quant(name) if int8 else None
        idx = self.b.tensor(name, shape, np.int8 if int8 else (dtype or np.float32), quant=q)
        return Act(idx, tuple(int(d) for d in shape), name)

    def _op(self, op: str, inputs: Sequence[int], outputs: Sequence[int], **options) -> None:
        version = _VERSIONS.get(op, {}).get(self.precision, _MIN_VERSION.get(op, 1))
        if op == "DEPTHWISE_CONV_2D" and options.get("dilation_h_factor", 1) > 1:
            version = max(version, 2)
        self.b.op(op, list(inputs), list(outputs), version=version, **options)

    def int_const(self, name: str, value) -> int:
        return self.b.const(name, np.asarray(value, np.int32))

    def float_const(self, name: str, value: np.ndarray) -> int:
        """A float constant in this precision's storage: float16 behind a DEQUANTIZE for FLOAT16."""
        value = np.asarray(value, np.float32)
        if self.precision is not Precision.FLOAT16:
            return self.b.const(name, value)
        half = self.b.const(f"{name}_fp16", value.astype(np.float16))
        out = self.b.tensor(name, value.shape)
        # the converter puts every DEQUANTIZE of a constant first, in reverse order of use
        self.b.op("DEQUANTIZE", [half], [out], version=_VERSIONS["DEQUANTIZE"][Precision.FLOAT16])
        self.b.main.ops.insert(0, self.b.main.ops.pop())
        return out

    def glorot(self, shape: Sequence[int], fan_in: int, fan_out: int) -> np.ndarray:
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return self.rng.uniform(-limit, limit, shape).astype(np.float32)

    def small(self, n: int) -> np.ndarray:
        return (self.rng.standard_normal(n) * 0.05).astype(np.float32)

    def _weights(self, name: str, w: np.ndarray, channel_axis: int) -> tuple[int, float | np.ndarray]:
        """The weight constant; returns it and the per-channel scales of an int8 weight (for the bias)."""
        hybrid = self.precision is Precision.DYNAMIC_RANGE and w.size >= _HYBRID_MIN_ELEMENTS
        if self.precision is Precision.INT8 or hybrid:
            moved = np.moveaxis(w, channel_axis, 0).reshape(w.shape[channel_axis], -1)
            scales = (np.abs(moved).max(axis=1) / 127.0).astype(np.float32)
            scales[scales == 0] = 1e-8
            shape = [1] * w.ndim
            shape[channel_axis] = -1
            q = np.clip(np.round(w / scales.reshape(shape)), -127, 127).astype(np.int8)
            quant = {"scale": scales, "zero_point": np.zeros(len(scales), np.int64),
                     "quantized_dimension": channel_axis}
            return self.b.const(name, q, quant=quant), scales
        return self.float_const(name, w), 1.0

    def _bias(self, name: str, bias: np.ndarray, x: Act, w_scales) -> int:
        if self.precision is not Precision.INT8:
            return self.float_const(name, bias)
        x_scale = float(int8_params(*self.ranges[x.name])["scale"][0])
        scales = (x_scale * np.asarray(w_scales, np.float64)).astype(np.float32)
        q = np.round(bias / scales).astype(np.int32)
        return self.b.const(name, q, quant={"scale": scales, "zero_point": np.zeros(len(scales), np.int64)})

    # -- graph ends ---------------------------------------------------------------------------------------------

    def input(self, name: str, shape: Sequence[int], signature_name: str = "input") -> Act:
        """A float graph input (quantized by a QUANTIZE op in INT8)."""
        x = self._act(name, shape, dtype=np.float32)
        self.b.main.inputs.append(x.index)
        self._sig_inputs[signature_name] = x.index
        if self.precision is not Precision.INT8:
            return x
        q = self._act("tfl.quantize", shape, quant=int8_params(*self.ranges[name]))
        self._op("QUANTIZE", [x.index], [q.index])
        self.ranges[q.name] = self.ranges[name]
        return q

    def out_name(self, name: str) -> str:
        """The name for the op that makes the output ``name``: in INT8 a DEQUANTIZE makes it, from ``name1``."""
        return f"{name}1" if self.precision is Precision.INT8 else name

    def output(self, y: Act, signature_name: str, name: str | None = None) -> None:
        """Mark ``y`` an output; in INT8 through a DEQUANTIZE to the float tensor ``name`` (``y`` was named
        ``out_name(name)``)."""
        if self.precision is Precision.INT8:
            if name is None:
                raise ValueError(f"the int8 output {y.name!r} needs the name of its float tensor")
            out = self._act(name, y.shape, dtype=np.float32)
            self._op("DEQUANTIZE", [y.index], [out.index])
            y = out
        self.b.output(y.index)
        self._sig_outputs[signature_name] = y.index

    def build(self) -> bytes:
        latest: dict[str, int] = {}
        for op in self.b.main.ops:
            latest[op.name] = max(latest.get(op.name, 1), op.version)
        for op in self.b.main.ops:
            op.version = latest[op.name]
        self.b.signature("serving_default", self._sig_inputs, self._sig_outputs)
        return self.b.build()

    # -- layers -------------------------------------------------------------------------------------------------

    def conv(self, x: Act, cout: int, *, k: int = 1, stride: int = 1, act: str = "RELU6", padding: str = "SAME",
             name: str, bias: bool = True, scale: float = 1.0) -> Act:
        n, h, w, cin = x.shape
        oh, ow = _spatial(h, k, stride, padding), _spatial(w, k, stride, padding)
        wt = self.glorot((cout, k, k, cin), k * k * cin, k * k * cout) * scale
        wi, ws = self._weights(f"{name}/weights", wt, 0)
        bi = self._bias(f"{name}/bias", self.small(cout) * scale, x, ws) if bias else -1
        y = self._act(name, (n, oh, ow, cout))
        self._op("CONV_2D", [x.index, wi, bi], [y.index], padding=padding, stride_w=stride, stride_h=stride,
                 fused_activation_function=act)
        return y

    def depthwise(self, x: Act, *, k: int = 3, stride: int = 1, dilation: int = 1, multiplier: int = 1,
                  act: str = "RELU6", name: str) -> Act:
        n, h, w, cin = x.shape
        cout = cin * multiplier
        oh, ow = -(-h // stride), -(-w // stride)
        wt = self.glorot((1, k, k, cout), k * k * cin, k * k * multiplier)
        wi, ws = self._weights(f"{name}/weights", wt, 3)
        bi = self._bias(f"{name}/bias", self.small(cout), x, ws)
        y = self._act(name, (n, oh, ow, cout))
        self._op("DEPTHWISE_CONV_2D", [x.index, wi, bi], [y.index], padding="SAME", stride_w=stride,
                 stride_h=stride, depth_multiplier=multiplier, fused_activation_function=act,
                 dilation_w_factor=dilation, dilation_h_factor=dilation)
        return y

    def transpose_conv(self, x: Act, cout: int, *, k: int = 2, stride: int = 2, name: str) -> Act:
        n, h, w, cin = x.shape
        shape = (n, h * stride, w * stride, cout)
        out_shape = self.int_const(f"{name}/output_shape", shape)
        wi, _ = self._weights(f"{name}/weights", self.glorot((cout, k, k, cin), k * k * cout, k * k * cin), 0)
        y = self._act(name, shape)
        self._op("TRANSPOSE_CONV", [out_shape, wi, x.index], [y.index], padding="VALID", stride_w=stride,
                 stride_h=stride)
        return y

    def fully_connected(self, x: Act, units: int, *, name: str, bias: bool = True, scale: float = 1.0) -> Act:
        n, cin = x.shape
        wt = self.glorot((units, cin), cin, units) * scale
        wi, ws = self._weights(f"{name}/weights", wt, 0)
        bi = self._bias(f"{name}/bias", self.small(units) * scale, x, ws) if bias else -1
        y = self._act(name, (n, units))
        hybrid = self.precision is Precision.DYNAMIC_RANGE and wt.size >= _HYBRID_MIN_ELEMENTS
        self._op("FULLY_CONNECTED", [x.index, wi, bi], [y.index], fused_activation_function="NONE",
                 asymmetric_quantize_inputs=hybrid)
        return y

    def add(self, a: Act, b: Act, *, name: str) -> Act:
        y = self._act(name, a.shape)
        self._op("ADD", [a.index, b.index], [y.index], fused_activation_function="NONE")
        return y

    def mean(self, x: Act, *, keep_dims: bool, name: str) -> Act:
        axes = self.int_const(f"{name}/reduction_indices", [1, 2])
        shape = (x.shape[0], 1, 1, x.shape[3]) if keep_dims else (x.shape[0], x.shape[3])
        y = self._act(name, shape)
        self._op("MEAN", [x.index, axes], [y.index], keep_dims=keep_dims)
        return y

    def softmax(self, x: Act, *, name: str) -> Act:
        y = self._act(name, x.shape, quant=_SOFTMAX_INT8 if self.precision is Precision.INT8 else None)
        self._op("SOFTMAX", [x.index], [y.index], beta=1.0)
        return y

    def logistic(self, x: Act, *, name: str) -> Act:
        y = self._act(name, x.shape)
        self._op("LOGISTIC", [x.index], [y.index])
        return y

    def reshape(self, x: Act, shape: Sequence[int], *, name: str) -> Act:
        target = self.int_const(f"{name}/shape", shape)
        y = self._act(name, shape)
        self._op("RESHAPE", [x.index, target], [y.index])
        return y

    def concat(self, xs: Sequence[Act], *, axis: int, name: str) -> Act:
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        y = self._act(name, shape)
        self._op("CONCATENATION", [x.index for x in xs], [y.index], axis=axis if axis == 1 else -1,
                 fused_activation_function="NONE")
        return y

    def resize_bilinear(self, x: Act, size: tuple[int, int], *, name: str, align_corners: bool = False,
                        half_pixel_centers: bool = True) -> Act:
        sz = self.int_const(f"{name}/size", size)
        y = self._act(name, (x.shape[0], *size, x.shape[3]))
        self._op("RESIZE_BILINEAR", [x.index, sz], [y.index], align_corners=align_corners,
                 half_pixel_centers=half_pixel_centers)
        return y

    def prelu(self, x: Act, *, name: str) -> Act:
        alpha = self.float_const(f"{name}/alpha", self.rng.uniform(0.0, 0.3, (1, 1, x.shape[3])))
        y = self._act(name, x.shape)
        self._op("PRELU", [x.index, alpha], [y.index])
        return y

    def pad(self, x: Act, paddings: Sequence[Sequence[int]], *, name: str) -> Act:
        p = self.int_const(f"{name}/paddings", paddings)
        y = self._act(name, [d + a + b for d, (a, b) in zip(x.shape, paddings)])
        self._op("PAD", [x.index, p], [y.index])
        return y

    def pool(self, op: str, x: Act, *, k: int, stride: int, name: str) -> Act:
        """MAX_POOL_2D / AVERAGE_POOL_2D with VALID padding (Keras' default)."""
        n, h, w, c = x.shape
        y = self._act(name, (n, _spatial(h, k, stride, "VALID"), _spatial(w, k, stride, "VALID"), c))
        self._op(op, [x.index], [y.index], padding="VALID", stride_w=stride, stride_h=stride, filter_width=k,
                 filter_height=k, fused_activation_function="NONE")
        return y


def _spatial(size: int, k: int, stride: int, padding: str) -> int:
    return -(-size // stride) if padding == "SAME" else (size - k) // stride + 1
