"""Valid random models, NNSmith-style: random DAGs over the ops our OpenCL generators cover, with shapes and
attributes that are legal by construction (broadcast operands, branches that join again, constants stored
float32, float16 through DEQUANTIZE, sparse through DENSIFY, both); one model in five a full-integer int8 or
uint8 chain with float input and output, one in ten an IF or a WHILE over random chains; so a model exercises
valid-but-unusual graphs rather than malformed bytes.

``random_model(seed, max_ops)`` is deterministic, and op ``i``'s choices depend only on ``(seed, i)``: the
model with ``max_ops=k`` is the first ``k`` ops of the full one, which is how a finding is minimized. Step ``i``
sometimes also ranks what it made (ARG_MAX / ARG_MIN, mostly over the channels, an int32 / int64 graph output),
drawn from a stream of its own so that the float DAG a seed names is the one it named before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from tflgpu.model.builder import ModelBuilder, csr_encode

ACTIVATIONS = ["NONE", "RELU", "RELU6", "RELU_N1_TO_1", "TANH"]
UNARY = ["RELU", "RELU6", "RELU_N1_TO_1", "TANH", "LOGISTIC", "ABS", "NEG", "HARD_SWISH", "ELU", "SQUARE", "SIN",
         "COS"]
BINARY = ["ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "DIV"]
FUSED_ACTIVATION = {"ADD", "SUB", "MUL", "DIV"}


@dataclass(frozen=True)
class T:
    """A float tensor of the graph under construction."""

    index: int
    shape: tuple[int, ...]


@dataclass
class RandomModel:
    """The model's bytes, the inputs to feed, and the op sequence (for the report)."""

    data: bytes
    inputs: list[np.ndarray]
    ops: list[str] = field(default_factory=list)
    output_step: float = 0.0  # a quantized model's float output moves in steps of this (its output scale)


class _Graph:
    def __init__(self, seed: int):
        self.b = ModelBuilder(f"tflgpu random model, seed {seed}")
        self.seed = seed
        self.tensors: list[T] = []
        self.consumed: set[int] = set()
        self.ops: list[str] = []
        self.rng = np.random.default_rng(seed)
        self.last_sparse = False  # LiteRT's CONV_2D wants a bias where the weights are not constant (densified)
        self.indices: list[int] = []  # ARG_MAX / ARG_MIN outputs (integer graph outputs)

    def new(self, shape, name: str = "t") -> T:
        shape = tuple(int(d) for d in shape)
        t = T(self.b.tensor(f"{name}{len(self.b.main.tensors)}", shape), shape)
        self.tensors.append(t)
        return t

    def op(self, name: str, inputs, outputs: list[T], **options) -> None:
        for i in inputs:
            self.consumed.add(i)
        self.b.op(name, list(inputs), [t.index for t in outputs], **options)
        self.ops.append(name)

    def weights(self, value: np.ndarray, name: str) -> int:
        """A float constant stored one of four ways: float32, float16 behind DEQUANTIZE, sparse behind
        DENSIFY, or sparse float16 behind DENSIFY then DEQUANTIZE (as MediaPipe's models store conv weights)."""
        kind = int(self.rng.integers(0, 4))
        self.last_sparse = kind >= 2 and value.ndim > 0
        if kind == 0 or value.ndim == 0:
            return self.b.const(name, value.astype(np.float32))
        stored = value.astype(np.float16 if kind in (1, 3) else np.float32)
        if kind in (2, 3):
            stored = np.where(self.rng.random(value.shape) < 0.5, 0, stored).astype(stored.dtype)
            values, sparsity = csr_encode(stored)
            src = self.b.const(f"{name}/sparse", values, sparsity=sparsity, shape=stored.shape)
            dense = self.b.tensor(f"{name}/dense", stored.shape, stored.dtype)
            self.b.op("DENSIFY", [src], [dense])
            self.ops.append("DENSIFY")
            src = dense
        else:
            src = self.b.const(f"{name}/half", stored)
        if stored.dtype == np.float32:
            return src
        out = self.b.tensor(f"{name}/float", value.shape)
        self.b.op("DEQUANTIZE", [src], [out])
        self.ops.append("DEQUANTIZE")
        return out


def _he(rng, shape, fan_in) -> np.ndarray:
    return (rng.standard_normal(shape) * np.sqrt(2.0 / max(1, fan_in))).astype(np.float32)


def _broadcast_shape(rng, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against ``shape``: some dims 1, maybe fewer dims."""
    out = tuple(d if rng.random() < 0.5 else 1 for d in shape)
    drop = int(rng.integers(0, len(out) + 1)) if rng.random() < 0.3 else 0
    return out[drop:]


def _spatial(size, k, stride, dilation, padding) -> int:
    eff = (k - 1) * dilation + 1
    return -(-size // stride) if padding == "SAME" else (size - eff) // stride + 1


# -- op makers: each takes (graph, rng, x) and returns the new tensor(s), or None where x does not suit it ------

RANK_RATE = 0.1


def _rank(g: _Graph, rng, y: T) -> None:
    """ARG_MAX / ARG_MIN of ``y`` (over its last axis, a pixel's channels, seven times in ten), as a graph output
    (a near-tie FP16 storage would swap decides it: runtime.precision keeps what it ranks exact)."""
    if not y.shape or y.shape[-1] < 2:
        return
    axis = len(y.shape) - 1 if rng.random() < 0.7 else int(rng.integers(0, len(y.shape)))
    out = np.int64 if rng.random() < 0.3 else np.int32
    name = "ARG_MAX" if rng.random() < 0.7 else "ARG_MIN"
    idx = g.b.tensor(f"rank{len(g.b.main.tensors)}", tuple(d for i, d in enumerate(y.shape) if i != axis), out)
    g.b.op(name, [y.index, g.b.const(f"rank_axis{len(g.ops)}", np.array([axis], np.int32))], [idx],
           output_type=4 if out is np.int64 else 2)
    g.ops.append(name)
    g.indices.append(idx)


def _unary(g: _Graph, rng, x: T):
    name = UNARY[int(rng.integers(0, len(UNARY)))]
    y = g.new(x.shape)
    g.op(name, [x.index], [y], **({"alpha": float(rng.uniform(0.01, 0.5))} if name == "LEAKY_RELU" else {}))
    return y


def _guarded(g: _Graph, rng, x: T):
    """EXP of a TANH, SQRT / RSQRT / LOG of |x| + 0.5: the functions that need their domain kept."""
    name = ["EXP", "SQRT", "RSQRT", "LOG"][int(rng.integers(0, 4))]
    if name == "EXP":
        t = g.new(x.shape)
        g.op("TANH", [x.index], [t])
    else:
        a = g.new(x.shape)
        g.op("ABS", [x.index], [a])
        t = g.new(x.shape)
        g.op("ADD", [a.index, g.b.const(f"half{len(g.ops)}", np.float32(0.5))], [t])
    y = g.new(x.shape)
    g.op(name, [t.index], [y])
    return y


def _binary(g: _Graph, rng, x: T):
    name = BINARY[int(rng.integers(0, len(BINARY)))]
    same = [t for t in g.tensors if t.shape == x.shape and t is not x]
    if name != "DIV" and same and rng.random() < 0.5:
        other = same[int(rng.integers(0, len(same)))].index
    else:
        shape = _broadcast_shape(rng, x.shape)
        v = rng.uniform(-1, 1, shape).astype(np.float32)
        if name == "DIV":  # denominators away from zero
            v = (np.sign(v) + (v == 0)) * (0.5 + np.abs(v))
        other = g.b.const(f"c{len(g.ops)}", v)
    operands = [x.index, other] if rng.random() < 0.7 else [other, x.index]
    opts = {"fused_activation_function": ACTIVATIONS[int(rng.integers(0, 4))]} if name in FUSED_ACTIVATION else {}
    y = g.new(x.shape)
    g.op(name, operands, [y], **opts)
    return y


def _conv(g: _Graph, rng, x: T):
    if len(x.shape) != 4:
        return None
    n, h, w, cin = x.shape
    depthwise = rng.random() < 0.4
    k = int(rng.choice([1, 2, 3, 5]))
    dilation = int(rng.choice([1, 1, 2])) if k > 1 else 1
    stride = 1 if dilation > 1 else int(rng.choice([1, 1, 2]))
    padding = "SAME" if rng.random() < 0.6 else "VALID"
    oh, ow = _spatial(h, k, stride, dilation, padding), _spatial(w, k, stride, dilation, padding)
    if oh < 1 or ow < 1:
        padding, oh, ow = "SAME", -(-h // stride), -(-w // stride)
    act = ACTIVATIONS[int(rng.integers(0, len(ACTIVATIONS)))]
    if depthwise:
        mult = int(rng.choice([1, 1, 2]))
        cout = cin * mult
        w_ = g.weights(_he(rng, (1, k, k, cout), k * k), f"dw{len(g.ops)}")
        opts = {"depth_multiplier": mult}
    else:
        cout = int(rng.integers(1, 17))
        w_ = g.weights(_he(rng, (cout, k, k, cin), k * k * cin), f"w{len(g.ops)}")
        opts = {}
    bias = g.b.const(f"b{len(g.ops)}", (rng.standard_normal(cout) * 0.1).astype(np.float32)) \
        if rng.random() < 0.8 or g.last_sparse else -1
    y = g.new((n, oh, ow, cout))
    g.op("DEPTHWISE_CONV_2D" if depthwise else "CONV_2D", [x.index, w_, bias], [y], padding=padding,
         stride_w=stride, stride_h=stride, dilation_w_factor=dilation, dilation_h_factor=dilation,
         fused_activation_function=act, **opts)
    return y


def _padded_conv(g: _Graph, rng, x: T):
    """A zero PAD of the image alone, read by a conv only (graph.passes.merge_pad makes it the conv's explicit
    padding), mostly after the image alone, as exported models pad for an even input and stride 2 (merged, such a
    PAD left a 1x1 conv's leading padding 0, and both paths took it for a pixel-for-pixel GEMM: seed 11207065;
    with this maker a --wide run from seed 12207000 found that bug 3 times in 455 models)."""
    if len(x.shape) != 4:
        return None
    sides = rng.integers(1, 3, size=4) * (rng.random(4) < [0.25, 0.5, 0.25, 0.5])  # (top, bottom, left, right)
    padded = g.new([x.shape[0], x.shape[1] + sides[0] + sides[1], x.shape[2] + sides[2] + sides[3], x.shape[3]])
    g.op("PAD", [x.index, g.b.const(f"sp{len(g.ops)}", np.int32([[0, 0], sides[:2], sides[2:], [0, 0]]))], [padded])
    g.tensors.remove(padded)  # (no other op reads it)
    return _conv(g, rng, padded)


def _empty_detour(g: _Graph, rng, x: T):
    """A SLICE of none of an axis's rows, an elementwise op on that empty tensor and a CONCATENATION of it with the
    input along that axis (the input's values again): an empty tensor inside the graph, as a second stage's batch
    where the first found nothing (the CPU kernels make such ops' outputs without their kernels; a delegate leaves
    a graph holding one to them: its plan divided by the bytes it stores, and the CPU conv by the batch)."""
    axis = int(rng.integers(0, len(x.shape)))
    size = [0 if a == axis else d for a, d in enumerate(x.shape)]
    s = g.new(size)
    g.op("SLICE", [x.index, g.b.const(f"eb{len(g.ops)}", np.int32([0] * len(size))),
                   g.b.const(f"es{len(g.ops)}", np.int32(size))], [s])
    e = _unary(g, rng, s)
    for t in (s, e):
        g.tensors.remove(t)  # (only the CONCATENATION reads them)
    y = g.new(x.shape)
    g.op("CONCATENATION", [x.index, e.index] if rng.random() < 0.5 else [e.index, x.index], [y], axis=axis)
    return y


def _host_op(g: _Graph, rng, x: T):
    """An op LiteRT runs that has no OpenCL kernel here, between ops that have one: ADD_N of the input and one or
    two unary ops of it, LOCAL_RESPONSE_NORMALIZATION, FAKE_QUANT, REVERSE_SEQUENCE, DYNAMIC_UPDATE_SLICE of a
    constant block or UNSORTED_SEGMENT_SUM of the rows (a delegated plan's partition boundary, on the CPU kernels)."""
    kind = ["ADD_N", "LOCAL_RESPONSE_NORMALIZATION", "FAKE_QUANT", "REVERSE_SEQUENCE", "DYNAMIC_UPDATE_SLICE",
            "UNSORTED_SEGMENT_SUM"][int(rng.integers(0, 6))]
    n = len(g.ops)
    if kind == "ADD_N":
        terms = [x] + [_unary(g, rng, x) for _ in range(int(rng.integers(1, 3)))]
        y = g.new(x.shape)
        g.op("ADD_N", [t.index for t in terms], [y])
    elif kind == "LOCAL_RESPONSE_NORMALIZATION":
        if len(x.shape) != 4:
            return None
        y = g.new(x.shape)
        g.op(kind, [x.index], [y], radius=int(rng.integers(0, 4)), bias=float(rng.choice([1.0, 2.0])),
             alpha=float(rng.uniform(1e-3, 0.5)), beta=float(rng.choice([0.5, 0.75, 1.0])))
    elif kind == "FAKE_QUANT":
        y = g.new(x.shape)
        g.op(kind, [x.index], [y], min=-float(rng.uniform(0.5, 4)), max=float(rng.uniform(0.5, 4)),
             num_bits=int(rng.choice([4, 8])), narrow_range=False)
    elif kind == "REVERSE_SEQUENCE":
        if len(x.shape) < 2:
            return None
        lengths = rng.integers(0, x.shape[1] + 1, x.shape[0]).astype(np.int32)
        y = g.new(x.shape)
        g.op(kind, [x.index, g.b.const(f"rl{n}", lengths)], [y], seq_dim=1, batch_dim=0)
    elif kind == "DYNAMIC_UPDATE_SLICE":
        block = tuple(int(rng.integers(1, d + 1)) for d in x.shape)
        starts = np.array([int(rng.integers(-1, d + 1)) for d in x.shape], np.int32)  # (clamped to fit)
        y = g.new(x.shape)
        g.op(kind, [x.index, g.b.const(f"du{n}", rng.uniform(-1, 1, block).astype(np.float32)),
                    g.b.const(f"ds{n}", starts)], [y])
    else:
        rows = x.shape[0]
        segments = rows + int(rng.integers(0, 2))
        ids = rng.integers(-1, segments, rows).astype(np.int32)  # (-1: the row is dropped)
        y = g.new((segments, *x.shape[1:]))
        g.op(kind, [x.index, g.b.const(f"si{n}", ids), g.b.const(f"sn{n}", np.int32(segments))], [y])
    return y


def _counted(g: _Graph, rng, x: T):
    """x scaled by the share of its values over a threshold, counted as the rows of a WHERE of the comparison (a
    size its values set: graph.sizes) read back by SHAPE; or x's values over the threshold gathered by those rows,
    their SUM added to x. A delegated plan leaves the WHERE and what reads its rows to the CPU kernels, and the
    fixed-size count (sum) goes back to the device."""
    n = len(g.ops)
    c = g.b.tensor(f"over{n}", x.shape, np.bool_)
    g.b.op("GREATER", [x.index, g.b.const(f"ct{n}", np.float32(rng.uniform(-0.5, 0.5)))], [c])
    g.ops.append("GREATER")
    rows = g.b.tensor(f"rows{n}", (0, len(x.shape)), np.int64, shape_signature=[-1, len(x.shape)])
    g.b.op("WHERE", [c], [rows])
    g.ops.append("WHERE")
    share = g.new((1,))
    if rng.random() < 0.5:
        shape = g.b.tensor(f"rs{n}", (2,), np.int32)
        g.b.op("SHAPE", [rows], [shape], out_type=2)
        count = g.b.tensor(f"rc{n}", (1,), np.int32)
        g.b.op("STRIDED_SLICE", [shape, g.b.const(f"r0{n}", np.int32([0])), g.b.const(f"r1{n}", np.int32([1])),
                                 g.b.const(f"r2{n}", np.int32([1]))], [count])
        counted = g.new((1,))
        g.b.op("CAST", [count], [counted.index])
        g.tensors.remove(counted)
        g.op("MUL", [counted.index, g.b.const(f"rn{n}", np.float32([1 / np.prod(x.shape)]))], [share])
        g.ops[-1:] = ["SHAPE", "STRIDED_SLICE", "CAST", "MUL"]
    else:
        picked = g.b.tensor(f"rp{n}", (0,), np.float32, shape_signature=[-1])
        g.b.op("GATHER_ND", [x.index, rows], [picked])
        g.op("SUM", [picked, g.b.const(f"ra{n}", np.int32([0]))], [share], keep_dims=True)
        g.ops[-1:] = ["GATHER_ND", "SUM"]
    y = g.new(x.shape)
    g.op("MUL" if rng.random() < 0.5 else "ADD", [x.index, share.index], [y])
    g.tensors.remove(share)
    return y


def _stablehlo(g: _Graph, rng, x: T):
    """A StableHLO op LiteRT runs as a builtin: ADD / MULTIPLY / MAXIMUM / MINIMUM of x and a constant of its shape
    (a delegated plan runs them as the builtins, fused like them: graph.stablehlo), or a PAD of x (edges of -1 to 2,
    interior 0 or 1) by a constant value (on the CPU kernels)."""
    n = len(g.ops)
    if rng.random() < 0.7:
        names = ["STABLEHLO_ADD", "STABLEHLO_MULTIPLY", "STABLEHLO_MAXIMUM", "STABLEHLO_MINIMUM"]
        name = names[int(rng.integers(0, 4))]
        c = g.b.const(f"sh{n}", rng.uniform(-1, 1, x.shape).astype(np.float32))
        y = g.new(x.shape)
        g.op(name, [x.index, c] if rng.random() < 0.5 else [c, x.index], [y])
        return y
    low = [int(rng.integers(-1, 3)) if d > 1 else 0 for d in x.shape]
    high = [int(rng.integers(-1, 3)) if d > 1 else 0 for d in x.shape]
    interior = [int(rng.integers(0, 2)) for _ in x.shape]
    shape = [lo + hi + d + (d - 1) * i for d, lo, hi, i in zip(x.shape, low, high, interior)]
    if min(shape) < 1:
        return None
    y = g.new(shape)
    g.op("STABLEHLO_PAD", [x.index, g.b.const(f"sv{n}", np.float32(rng.uniform(-1, 1)))], [y],
         edge_padding_low=np.array(low, np.int64), edge_padding_high=np.array(high, np.int64),
         interior_padding=np.array(interior, np.int64))
    return y


def _composite(g: _Graph, rng, x: T):
    """A StableHLO composite (ai-edge-torch's ``odml.*`` blocks) of one to three elementwise ops of ``x`` and
    constants, sometimes also returning its input as is: the CPU kernels call its decomposition, a delegated
    plan inlines it (graph.composite)."""
    n = len(g.ops)
    idx, sub = g.b.subgraph(f"composite{n}")
    cur = a = sub.input("a", x.shape)
    for k in range(int(rng.integers(1, 4))):
        t = sub.tensor(f"t{k}", x.shape)
        if rng.random() < 0.5:
            sub.op(UNARY[int(rng.integers(0, len(UNARY)))], [cur], [t])
        else:
            c = sub.const(f"c{k}", rng.uniform(-1, 1, _broadcast_shape(rng, x.shape)).astype(np.float32))
            sub.op(["ADD", "SUB", "MUL", "MAXIMUM"][int(rng.integers(0, 4))], [cur, c] if rng.random() < 0.7
                   else [c, cur], [t])
        cur = t
    both = rng.random() < 0.3
    sub.output(cur, *([a] if both else []))
    outs = [g.new(x.shape) for _ in range(2 if both else 1)]
    g.op("STABLEHLO_COMPOSITE", [x.index], outs, option_fields={
        "name": "odml.random_block", "decomposition_subgraph_index": idx, "version": 1,
        "composite_attributes": b"\x00\x00\x01\x00\x00$\x01"})  # (an empty flexbuffer map)
    return outs[0]


def _transpose_conv(g: _Graph, rng, x: T):
    if len(x.shape) != 4:
        return None
    n, h, w, cin = x.shape
    k, stride = int(rng.choice([2, 3])), int(rng.choice([1, 2]))
    padding = "SAME" if rng.random() < 0.5 else "VALID"
    oh, ow = (h * stride, w * stride) if padding == "SAME" else ((h - 1) * stride + k, (w - 1) * stride + k)
    cout = int(rng.integers(1, 9))
    shape = g.b.const(f"os{len(g.ops)}", np.int32([n, oh, ow, cout]))
    w_ = g.weights(_he(rng, (cout, k, k, cin), k * k * cin), f"tw{len(g.ops)}")
    y = g.new((n, oh, ow, cout))
    g.op("TRANSPOSE_CONV", [shape, w_, x.index], [y], padding=padding, stride_w=stride, stride_h=stride)
    return y


def _pool(g: _Graph, rng, x: T):
    if len(x.shape) != 4:
        return None
    n, h, w, c = x.shape
    k, stride = int(rng.choice([1, 2, 3])), int(rng.choice([1, 2]))
    padding = "SAME" if rng.random() < 0.5 or h < k or w < k else "VALID"
    y = g.new((n, _spatial(h, k, stride, 1, padding), _spatial(w, k, stride, 1, padding), c))
    g.op("MAX_POOL_2D" if rng.random() < 0.5 else "AVERAGE_POOL_2D", [x.index], [y], padding=padding,
         stride_w=stride, stride_h=stride, filter_width=k, filter_height=k,
         fused_activation_function=ACTIVATIONS[int(rng.integers(0, 3))])
    return y


def _fully_connected(g: _Graph, rng, x: T):
    units, cin = int(rng.integers(1, 33)), x.shape[-1]
    keep = len(x.shape) > 2 and rng.random() < 0.5
    w_ = g.weights(_he(rng, (units, cin), cin), f"fc{len(g.ops)}")
    bias = g.b.const(f"fb{len(g.ops)}", (rng.standard_normal(units) * 0.1).astype(np.float32)) \
        if rng.random() < 0.7 else -1
    rows = int(np.prod(x.shape[:-1]))
    y = g.new((*x.shape[:-1], units) if keep else (rows, units))
    g.op("FULLY_CONNECTED", [x.index, w_, bias], [y], keep_num_dims=keep,
         fused_activation_function=ACTIVATIONS[int(rng.integers(0, 3))])
    return y


def _reduce(g: _Graph, rng, x: T):
    rank = len(x.shape)
    axes = sorted({int(a) for a in rng.choice(np.arange(1, rank), size=int(rng.integers(1, rank)), replace=False)}) \
        if rank > 1 else [0]
    keep = bool(rng.random() < 0.5)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    y = g.new(shape)
    g.op("MEAN" if rng.random() < 0.6 else "SUM", [x.index, g.b.const(f"ax{len(g.ops)}", np.int32(axes))], [y],
         keep_dims=keep)
    return y


def _softmax(g: _Graph, rng, x: T):
    y = g.new(x.shape)
    g.op("SOFTMAX", [x.index], [y], beta=float(rng.choice([0.5, 1.0, 2.0])))
    return y


def _concat(g: _Graph, rng, x: T):
    axis = int(rng.integers(0, len(x.shape)))
    fits = [t for t in g.tensors if len(t.shape) == len(x.shape)
            and all(a == b for i, (a, b) in enumerate(zip(t.shape, x.shape)) if i != axis)]
    parts = [x] + [fits[int(i)] for i in rng.integers(0, len(fits), int(rng.integers(1, 3)))]
    shape = list(x.shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    y = g.new(shape)
    g.op("CONCATENATION", [p.index for p in parts], [y], axis=axis if rng.random() < 0.5 else axis - len(shape))
    return y


def _pad(g: _Graph, rng, x: T):
    pads = np.array([[0, 0]] + [[int(rng.integers(0, 3)), int(rng.integers(0, 3))] for _ in x.shape[1:]], np.int32)
    y = g.new([d + a + b for d, (a, b) in zip(x.shape, pads)])
    inputs = [x.index, g.b.const(f"p{len(g.ops)}", pads)]
    if rng.random() < 0.4:
        inputs.append(g.b.const(f"pv{len(g.ops)}", np.float32(rng.uniform(-1, 1))))
    g.op("PADV2" if len(inputs) == 3 else "PAD", inputs, [y])
    return y


def _reshape(g: _Graph, rng, x: T):
    size = int(np.prod(x.shape))
    options = [(1, size), (1, size // x.shape[-1], x.shape[-1])]
    if len(x.shape) == 4:
        options.append((1, x.shape[2], x.shape[1], x.shape[3]))
    if size % 4 == 0:
        options.append((1, 2, size // 4, 2))
    shape = options[int(rng.integers(0, len(options)))]
    y = g.new(shape)
    g.op("RESHAPE", [x.index, g.b.const(f"s{len(g.ops)}", np.int32(shape))], [y])
    return y


def _transpose(g: _Graph, rng, x: T):
    perm = [0] + [int(p) + 1 for p in rng.permutation(len(x.shape) - 1)]
    y = g.new([x.shape[p] for p in perm])
    g.op("TRANSPOSE", [x.index, g.b.const(f"perm{len(g.ops)}", np.int32(perm))], [y])
    return y


def _resize(g: _Graph, rng, x: T):
    if len(x.shape) != 4:
        return None
    size = np.int32([rng.integers(1, 17), rng.integers(1, 17)])
    align = bool(rng.random() < 0.3)
    half = (not align) and bool(rng.random() < 0.5)
    y = g.new((x.shape[0], *size, x.shape[3]))
    g.op("RESIZE_BILINEAR" if rng.random() < 0.6 else "RESIZE_NEAREST_NEIGHBOR",
         [x.index, g.b.const(f"sz{len(g.ops)}", size)], [y], align_corners=align, half_pixel_centers=half)
    return y


def _slice(g: _Graph, rng, x: T):
    begin = [int(rng.integers(0, d)) for d in x.shape]
    size = [int(rng.integers(1, d - b + 1)) for d, b in zip(x.shape, begin)]
    if rng.random() < 0.5:
        y = g.new(size)
        g.op("SLICE", [x.index, g.b.const(f"sb{len(g.ops)}", np.int32(begin)),
                       g.b.const(f"ss{len(g.ops)}", np.int32(size))], [y])
        return y
    strides = [int(rng.integers(1, 3)) for _ in x.shape]
    end = [b + s for b, s in zip(begin, size)]
    y = g.new([-(-(e - b) // s) for b, e, s in zip(begin, end, strides)])
    g.op("STRIDED_SLICE", [x.index, g.b.const(f"sb{len(g.ops)}", np.int32(begin)),
                           g.b.const(f"se{len(g.ops)}", np.int32(end)),
                           g.b.const(f"st{len(g.ops)}", np.int32(strides))], [y])
    return y


def _space_depth(g: _Graph, rng, x: T):
    if len(x.shape) != 4:
        return None
    n, h, w, c = x.shape
    if h % 2 == 0 and w % 2 == 0 and rng.random() < 0.5:
        y = g.new((n, h // 2, w // 2, c * 4))
        g.op("SPACE_TO_DEPTH", [x.index], [y], block_size=2)
        return y
    if c % 4 == 0:
        y = g.new((n, h * 2, w * 2, c // 4))
        g.op("DEPTH_TO_SPACE", [x.index], [y], block_size=2)
        return y
    return None


def _gather(g: _Graph, rng, x: T):
    axis = int(rng.integers(1, len(x.shape))) if len(x.shape) > 1 else 0
    idx = rng.integers(0, x.shape[axis], int(rng.integers(1, 6))).astype(np.int32)
    shape = list(x.shape)
    shape[axis] = len(idx)
    y = g.new(shape)
    g.op("GATHER", [x.index, g.b.const(f"gi{len(g.ops)}", idx)], [y], axis=axis)
    return y


def _split(g: _Graph, rng, x: T):
    axes = [a for a in range(1, len(x.shape)) if x.shape[a] % 2 == 0]
    if not axes:
        return None
    axis = axes[int(rng.integers(0, len(axes)))]
    shape = list(x.shape)
    shape[axis] //= 2
    ys = [g.new(shape), g.new(shape)]
    g.op("SPLIT", [g.b.const(f"sa{len(g.ops)}", np.int32(axis)), x.index], ys, num_splits=2)
    return ys[int(rng.integers(0, 2))]


def _prelu(g: _Graph, rng, x: T):
    """PRELU with a learned slope per channel (broadcast over the rest), or a whole-tensor one."""
    shape = (x.shape[-1],) if rng.random() < 0.6 else _broadcast_shape(rng, x.shape)
    alpha = g.b.const(f"alpha{len(g.ops)}", rng.uniform(-0.5, 0.5, shape).astype(np.float32))
    y = g.new(x.shape)
    g.op("PRELU", [x.index, alpha], [y])
    return y


def _batch_matmul(g: _Graph, rng, x: T):
    """BATCH_MATMUL of x (its last two dims a matrix, maybe read transposed) by a constant or by another tensor
    of the graph (attention's two products), broadcasting the batch dims."""
    if len(x.shape) < 2:
        return None
    adj_x = bool(rng.random() < 0.3)
    rows, k = (x.shape[-1], x.shape[-2]) if adj_x else (x.shape[-2], x.shape[-1])
    adj_y = bool(rng.random() < 0.3)
    others = [t for t in g.tensors if len(t.shape) == len(x.shape) and t.shape[:-2] == x.shape[:-2]
              and (t.shape[-1] if adj_y else t.shape[-2]) == k]
    if others and rng.random() < 0.5:
        other = others[int(rng.integers(0, len(others)))]
        index, cols = other.index, other.shape[-2] if adj_y else other.shape[-1]
    else:
        cols = int(rng.integers(1, 17))
        batch = tuple(d if rng.random() < 0.5 else 1 for d in x.shape[:-2])
        shape = (*batch, cols, k) if adj_y else (*batch, k, cols)
        index = g.b.const(f"bm{len(g.ops)}", _he(rng, shape, k))
    y = g.new((*x.shape[:-2], rows, cols))
    g.op("BATCH_MATMUL", [x.index, index], [y], adj_x=adj_x, adj_y=adj_y)
    return y


def _split_v(g: _Graph, rng, x: T):
    """SPLIT_V into two or three parts of uneven sizes (one of them maybe -1: the rest), one part kept."""
    axes = [a for a in range(len(x.shape)) if x.shape[a] >= 2]
    if not axes:
        return None
    axis = axes[int(rng.integers(0, len(axes)))]
    d = x.shape[axis]
    cuts = sorted({int(c) for c in rng.integers(1, d, int(rng.integers(1, 3)))})
    sizes = [b - a for a, b in pairwise([0, *cuts, d])]
    given = list(sizes)
    if rng.random() < 0.4:
        given[int(rng.integers(0, len(given)))] = -1
    parts = []
    for n in sizes:
        shape = list(x.shape)
        shape[axis] = n
        parts.append(g.new(shape))
    g.op("SPLIT_V", [x.index, g.b.const(f"svs{len(g.ops)}", np.int32(given)),
                     g.b.const(f"sva{len(g.ops)}", np.int32(axis if rng.random() < 0.5 else axis - len(x.shape)))],
         parts, num_splits=len(parts))
    return parts[int(rng.integers(0, len(parts)))]


def _expand_squeeze(g: _Graph, rng, x: T):
    """EXPAND_DIMS at some axis then, half the time, SQUEEZE of it (or of every unit dim) again."""
    if len(x.shape) >= 5:
        return None
    axis = int(rng.integers(0, len(x.shape) + 1))
    shape = list(x.shape)
    shape.insert(axis, 1)
    y = g.new(shape)
    g.op("EXPAND_DIMS", [x.index, g.b.const(f"ea{len(g.ops)}", np.int32(axis if rng.random() < 0.5 else
                                                                          axis - len(shape)))], [y])
    if rng.random() < 0.5:
        return y
    dims = [axis] if rng.random() < 0.5 or all(d == 1 for d in shape) else []
    z = g.new([d for i, d in enumerate(shape) if (i not in dims if dims else d != 1)])
    g.op("SQUEEZE", [y.index], [z], squeeze_dims=dims)
    return z


COMPARE = ["LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"]


def _compare(g: _Graph, rng, x: T):
    """A mask: x compared with a constant (or two comparisons joined by LOGICAL_AND / OR, maybe negated),
    CAST back to float and multiplied into x. EQUAL / NOT_EQUAL compare a RELU'd x with zero, so that they are
    not constant."""
    def boolean() -> int:
        return g.b.tensor(f"mask{len(g.b.main.tensors)}", x.shape, np.bool_)

    def mask() -> int:
        name = COMPARE[int(rng.integers(0, len(COMPARE)))]
        c = boolean()
        if name in ("EQUAL", "NOT_EQUAL"):
            r = g.new(x.shape)
            g.op("RELU", [x.index], [r])
            g.b.op(name, [r.index, g.b.const(f"zero{len(g.ops)}", np.float32(0))], [c])
        else:
            v = rng.uniform(-0.5, 0.5, _broadcast_shape(rng, x.shape)).astype(np.float32)
            g.b.op(name, [x.index, g.b.const(f"cv{len(g.ops)}", v)], [c])
        g.ops.append(name)
        return c

    cond = mask()
    if rng.random() < 0.4:
        other, joined = mask(), boolean()
        name = "LOGICAL_AND" if rng.random() < 0.5 else "LOGICAL_OR"
        g.b.op(name, [cond, other], [joined])
        g.ops.append(name)
        cond = joined
    if rng.random() < 0.3:
        neg = boolean()
        g.b.op("LOGICAL_NOT", [cond], [neg])
        g.ops.append("LOGICAL_NOT")
        cond = neg
    f = g.new(x.shape)
    g.b.op("CAST", [cond], [f.index])
    g.ops.append("CAST")
    y = g.new(x.shape)
    g.op("MUL", [x.index, f.index], [y])
    return y


def _cumsum(g: _Graph, rng, x: T):
    axis = int(rng.integers(0, len(x.shape)))
    y = g.new(x.shape)
    g.op("CUMSUM", [x.index, g.b.const(f"cs{len(g.ops)}", np.int32(axis))], [y],
         exclusive=bool(rng.random() < 0.5), reverse=bool(rng.random() < 0.5))
    return y


def _topk(g: _Graph, rng, x: T):
    """TOPK_V2's values over the last axis (its indices, which a tie may order either way, left unread)."""
    k = int(rng.integers(1, x.shape[-1] + 1))
    values = g.new((*x.shape[:-1], k))
    order = g.b.tensor(f"topk_i{len(g.b.main.tensors)}", (*x.shape[:-1], k), np.int32)
    g.op("TOPK_V2", [x.index, g.b.const(f"k{len(g.ops)}", np.int32(k))], [values, T(order, (*x.shape[:-1], k))])
    return values


MORE_UNARY = ["GELU", "FLOOR", "CEIL", "ROUND", "SIGN", "RELU_0_TO_1", "LEAKY_RELU"]


def _more_unary(g: _Graph, rng, x: T):
    name = MORE_UNARY[int(rng.integers(0, len(MORE_UNARY)))]
    opts = {"alpha": float(rng.uniform(0.01, 0.5))} if name == "LEAKY_RELU" else \
        {"approximate": bool(rng.random() < 0.5)} if name == "GELU" else {}
    y = g.new(x.shape)
    g.op(name, [x.index], [y], **opts)
    return y


def _more_binary(g: _Graph, rng, x: T):
    """POW (of |x| + 0.5 by any exponent, of x by a whole one), FLOOR_MOD by a constant away from zero, ATAN2 with
    a tensor of the graph or a constant of x's shape (LiteRT's takes one shape)."""
    name = ["POW", "FLOOR_MOD", "ATAN2"][int(rng.integers(0, 3))]
    if name == "POW":
        whole = rng.random() < 0.5
        if not whole:
            a, t = g.new(x.shape), g.new(x.shape)
            g.op("ABS", [x.index], [a])
            g.op("ADD", [a.index, g.b.const(f"half{len(g.ops)}", np.float32(0.5))], [t])
            x = t
        e = rng.integers(1, 4, _broadcast_shape(rng, x.shape)) if whole else \
            rng.uniform(-2, 2, _broadcast_shape(rng, x.shape))
        other = g.b.const(f"exp{len(g.ops)}", e.astype(np.float32))
    elif name == "FLOOR_MOD":
        v = rng.uniform(-1, 1, _broadcast_shape(rng, x.shape)).astype(np.float32)
        other = g.b.const(f"mod{len(g.ops)}", (np.sign(v) + (v == 0)) * (0.25 + np.abs(v)))
    else:
        same = [t for t in g.tensors if t.shape == x.shape and t is not x]
        other = same[int(rng.integers(0, len(same)))].index if same and rng.random() < 0.5 else \
            g.b.const(f"at{len(g.ops)}", rng.uniform(-1, 1, x.shape).astype(np.float32))
    y = g.new(x.shape)
    g.op(name, [x.index, other], [y])
    return y


def _normalize(g: _Graph, rng, x: T):
    """LOG_SOFTMAX or L2_NORMALIZATION over the last axis."""
    y = g.new(x.shape)
    g.op("LOG_SOFTMAX" if rng.random() < 0.5 else "L2_NORMALIZATION", [x.index], [y])
    return y


def _extreme(g: _Graph, rng, x: T):
    """REDUCE_MAX / REDUCE_MIN (over the spatial axes of an image mostly, which the device runs, else any) or a
    REDUCE_PROD of 1 + x / 4 (factors near 1)."""
    rank = len(x.shape)
    if rank == 4 and rng.random() < 0.7:
        axes = [1, 2]
    else:
        axes = sorted({int(a) for a in rng.choice(np.arange(rank), size=int(rng.integers(1, rank + 1)), replace=False)})
    keep = bool(rng.random() < 0.5)
    name = ["REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"][int(rng.integers(0, 3))]
    if name == "REDUCE_PROD":
        t = g.new(x.shape)
        g.op("MUL", [x.index, g.b.const(f"quarter{len(g.ops)}", np.float32(0.25))], [t])
        u = g.new(x.shape)
        g.op("ADD", [t.index, g.b.const(f"one{len(g.ops)}", np.float32(1))], [u])
        x = u
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    if not shape:  # (every axis reduced, dims dropped: a scalar, which this graph does not keep)
        return None
    y = g.new(shape)
    g.op(name, [x.index, g.b.const(f"rax{len(g.ops)}", np.int32(axes))], [y], keep_dims=keep)
    return y


def _mirror(g: _Graph, rng, x: T):
    sym = int(rng.random() < 0.5)
    pads = np.array([[0, 0]] + [[int(rng.integers(0, d + sym)), int(rng.integers(0, d + sym))] for d in x.shape[1:]],
                    np.int32)
    y = g.new([d + a + b for d, (a, b) in zip(x.shape, pads)])
    g.op("MIRROR_PAD", [x.index, g.b.const(f"mp{len(g.ops)}", pads)], [y], mode=sym)
    return y


def _tile(g: _Graph, rng, x: T):
    """TILE by small multiples, or BROADCAST_TO a shape whose dims x's size-1 dims grow to (a leading dim too)."""
    if rng.random() < 0.5 or not any(d == 1 for d in x.shape):
        reps = [1] + [int(rng.integers(1, 4)) for _ in x.shape[1:]]
        y = g.new([d * r for d, r in zip(x.shape, reps)])
        g.op("TILE", [x.index, g.b.const(f"rep{len(g.ops)}", np.int32(reps))], [y])
        return y
    shape = [d if d != 1 or i == 0 else int(rng.integers(1, 6)) for i, d in enumerate(x.shape)]
    y = g.new(shape)
    g.op("BROADCAST_TO", [x.index, g.b.const(f"bt{len(g.ops)}", np.int32(shape))], [y], version=2)
    return y


def _reverse(g: _Graph, rng, x: T):
    """REVERSE_V2 over adjacent axes (LiteRT's takes no other)."""
    first = int(rng.integers(0, len(x.shape)))
    last = int(rng.integers(first, len(x.shape)))
    y = g.new(x.shape)
    g.op("REVERSE_V2", [x.index, g.b.const(f"rv{len(g.ops)}", np.int32(list(range(first, last + 1))))], [y])
    return y


def _pack(g: _Graph, rng, x: T):
    """PACK of x with tensors of its shape along a new axis, or UNPACK of an axis (one part kept)."""
    if rng.random() < 0.5 and len(x.shape) < 4:
        same = [t for t in g.tensors if t.shape == x.shape and t is not x]
        parts = [x] + [same[int(i)] for i in rng.integers(0, len(same), int(rng.integers(1, 3)))] if same else [x, x]
        axis = int(rng.integers(0, len(x.shape) + 1))
        shape = list(x.shape)
        shape.insert(axis, len(parts))
        y = g.new(shape)
        g.op("PACK", [p.index for p in parts], [y], values_count=len(parts),
             axis=axis if rng.random() < 0.5 else axis - len(shape))
        return y
    axis = int(rng.integers(0, len(x.shape)))
    if len(x.shape) < 2 or x.shape[axis] > 6:
        return None
    parts = [g.new([d for i, d in enumerate(x.shape) if i != axis]) for _ in range(x.shape[axis])]
    g.op("UNPACK", [x.index], parts, num=x.shape[axis], axis=axis)
    return parts[int(rng.integers(0, len(parts)))]


def _select(g: _Graph, rng, x: T):
    """SELECT_V2 of x and another operand (a tensor of the graph or a broadcast constant) by x compared with a
    constant."""
    cond = g.b.tensor(f"mask{len(g.b.main.tensors)}", x.shape, np.bool_)
    name = COMPARE[int(rng.integers(0, 4))]
    g.b.op(name, [x.index, g.b.const(f"sv{len(g.ops)}", rng.uniform(-0.5, 0.5, _broadcast_shape(rng, x.shape))
                                      .astype(np.float32))], [cond])
    g.ops.append(name)
    same = [t for t in g.tensors if t.shape == x.shape and t is not x]
    other = same[int(rng.integers(0, len(same)))].index if same and rng.random() < 0.5 else \
        g.b.const(f"so{len(g.ops)}", rng.uniform(-1, 1, _broadcast_shape(rng, x.shape)).astype(np.float32))
    operands = [x.index, other] if rng.random() < 0.5 else [other, x.index]
    y = g.new(x.shape)
    g.op("SELECT_V2", [cond, *operands], [y])
    return y


def _block(g: _Graph, rng, x: T):
    """A block of a real network around ``x``, whose ops read x twice: a residual ADD of a conv of x back onto x
    (from a graph input too: one kernel then reads x as its input and as its fused ADD's operand); a skip branch
    widened by a channel PAD, of x or of its 2x2 MAX_POOL, added to a conv of x (a BlazeBlock's; either branch
    first in op order); or a squeeze-and-excitation gate (a MEAN or a whole-image AVERAGE_POOL_2D, two 1x1 convs,
    LOGISTIC, MUL onto x, at times a 1x1 conv of that)."""
    if len(x.shape) != 4:
        return None
    n, h, w, c = x.shape
    kind = int(rng.integers(0, 3))

    def conv(src: T, cout: int, k: int, stride: int, depthwise: bool = False, act: str = "NONE") -> T:
        oh, ow = (src.shape[1] - k) // stride + 1, (src.shape[2] - k) // stride + 1
        shape = (1, k, k, cout) if depthwise else (cout, k, k, src.shape[3])
        w_ = g.weights(_he(rng, shape, k * k * (1 if depthwise else src.shape[3])), f"bw{len(g.ops)}")
        bias = g.b.const(f"bb{len(g.ops)}", (rng.standard_normal(cout) * 0.1).astype(np.float32))
        y = g.new((n, oh, ow, cout))
        g.op("DEPTHWISE_CONV_2D" if depthwise else "CONV_2D", [src.index, w_, bias], [y], padding="VALID",
             stride_w=stride, stride_h=stride, fused_activation_function=act,
             **({"depth_multiplier": 1} if depthwise else {}))
        return y

    act = ACTIVATIONS[int(rng.integers(0, 4))]
    if kind == 0:  # residual
        y = conv(x, c, 1, 1, depthwise=rng.random() < 0.5, act=ACTIVATIONS[int(rng.integers(0, 4))])
        other = x
    elif kind == 1:  # widened skip branch
        pool = rng.random() < 0.5 and h >= 2 and w >= 2
        wide = c + int(rng.integers(1, 9))

        def skip() -> T:
            s = x
            if pool:
                s = g.new((n, h // 2, w // 2, c))
                g.op("MAX_POOL_2D", [x.index], [s], padding="VALID", stride_w=2, stride_h=2, filter_width=2,
                     filter_height=2)
            out = g.new(s.shape[:3] + (wide,))
            g.op("PAD", [s.index, g.b.const(f"bp{len(g.ops)}", np.int32([[0, 0], [0, 0], [0, 0], [0, wide - c]]))],
                 [out])
            return out

        first = skip() if rng.random() < 0.5 else None
        y = conv(x, wide, 2 if pool else 1, 2 if pool else 1)
        other = first if first is not None else skip()
    else:  # squeeze and excitation
        m = g.new((n, 1, 1, c))
        if len(g.ops) % 2:  # (the whole image's AVERAGE_POOL_2D, as MediaPipe's: no draw, so each seed's model stays)
            g.op("AVERAGE_POOL_2D", [x.index], [m], padding="VALID", stride_w=1, stride_h=1, filter_width=w,
                 filter_height=h)
        else:
            g.op("MEAN", [x.index, g.b.const(f"ba{len(g.ops)}", np.int32([1, 2]))], [m], keep_dims=True)
        r = conv(m, max(1, c // 4), 1, 1, act="RELU")
        e = conv(r, c, 1, 1)
        gate = g.new(e.shape)
        g.op("LOGISTIC", [e.index], [gate])
        z = g.new(x.shape)
        g.op("MUL", [x.index, gate.index], [z])
        if len(g.ops) % 3 == 0:  # (a block's projection reading the gated tensor; no draw, as the pool's choice)
            z = conv(z, c, 1, 1)
        return z
    z = g.new(y.shape)
    g.op("ADD", [y.index, other.index] if rng.random() < 0.7 else [other.index, y.index], [z],
         fused_activation_function=act)
    return z


MAKERS: list[tuple[Callable, float]] = [
    (_unary, 3), (_guarded, 1), (_binary, 3), (_conv, 3), (_transpose_conv, 0.7), (_pool, 1),
    (_fully_connected, 1), (_reduce, 0.7), (_softmax, 0.5), (_concat, 1), (_pad, 0.7), (_reshape, 0.7),
    (_transpose, 0.7), (_resize, 0.7), (_slice, 0.8), (_space_depth, 0.5), (_gather, 0.5), (_split, 0.5),
]
# the makers added after those: the float DAGs of seeds 1 and 8 mod 10 draw from both lists, the others from the
# first alone (so that each of those seeds names the model it named before: the regression tests name seeds)
WIDE_MAKERS = MAKERS + [
    (_prelu, 0.6), (_batch_matmul, 0.6), (_split_v, 0.4), (_expand_squeeze, 0.4), (_compare, 0.5), (_cumsum, 0.4),
    (_topk, 0.3), (_more_unary, 1.0), (_more_binary, 0.6), (_normalize, 0.4), (_extreme, 0.5), (_mirror, 0.4),
    (_tile, 0.4), (_reverse, 0.3), (_pack, 0.4), (_select, 0.5), (_block, 1.0),
]
# makers added after seeds of every other residue were named in regression tests: the float DAGs of seeds 9 mod 20
# draw from every list (the others keep their models)
NEWEST_MAKERS = WIDE_MAKERS + [(_padded_conv, 3.0), (_empty_detour, 1.0), (_host_op, 1.0), (_composite, 1.0),
                                (_counted, 1.0), (_stablehlo, 1.0)]


def newest_makers(seed: int) -> bool:
    """The seed's float DAG draws NEWEST_MAKERS."""
    return seed % 20 == 9


def later_makers(seed: int) -> bool:
    """The seed's float DAG draws makers added after the first list (the fuzzer's ``--wide`` runs only these)."""
    return seed % 10 in (1, 8) or newest_makers(seed)
MAX_ELEMENTS = 1 << 16  # keeps every tensor small: a model runs in milliseconds


def _q(scale: float, zero_point: int = 0) -> dict:
    return {"scale": np.float32([scale]), "zero_point": np.int64([zero_point])}


def quantized_model(seed: int, max_ops: int | None = None, dtype=np.int8) -> RandomModel:
    """A full-integer chain with float input and output, as the converter writes one: QUANTIZE, then convs and
    depthwise convs, ADDs of a constant, pools, a MEAN, a RESHAPE + FULLY_CONNECTED, a SOFTMAX, each with
    random but plausible quantization, then DEQUANTIZE. int8 (weights per channel, as the converter writes
    now) or uint8 (the older form: weights per tensor with a zero point, activations' zero points in 0..255)."""
    u8 = np.dtype(dtype) == np.uint8
    rng0 = np.random.default_rng([seed, 7])
    b = ModelBuilder(f"tflgpu random {np.dtype(dtype).name} model, seed {seed}")
    shape = (1, *(int(d) for d in rng0.integers(2, 11, 2)), int(rng0.integers(1, 9)))
    x = b.input("input", shape)
    scale, zp = 2.0 / 255, 128 if u8 else 0
    shift = 128 if u8 else 0  # (a uint8 zero point is an int8 one + 128)
    qlo, qhi = (0, 256) if u8 else (-128, 128)
    cur = b.tensor("q", shape, dtype, quant=_q(scale, zp))
    b.op("QUANTIZE", [x], [cur])
    ops = ["QUANTIZE"]
    n_ops = int(rng0.integers(1, 7))
    for i in range(n_ops if max_ops is None else min(n_ops, max_ops)):
        rng = np.random.default_rng([seed, i])
        kind = ["conv", "depthwise", "add", "pool", "mean", "fc", "softmax"][int(rng.integers(0, 7))]
        n, h, w, c = shape if len(shape) == 4 else (shape[0], 1, 1, shape[-1])
        out_scale, out_zp = float(rng.uniform(0.01, 0.1)), int(rng.integers(-20, 21)) + shift
        if kind in ("conv", "depthwise") and len(shape) == 4:
            k = int(rng.choice([1, 3]))
            cout = c * int(rng.choice([1, 2])) if kind == "depthwise" else int(rng.integers(1, 13))
            wshape = (1, k, k, cout) if kind == "depthwise" else (cout, k, k, c)
            axis = 3 if kind == "depthwise" else 0
            if u8:
                w_scales = np.float32([rng.uniform(0.002, 0.02)])
                wq = b.const(f"w{i}", rng.integers(0, 256, wshape).astype(np.uint8),
                             quant=_q(float(w_scales[0]), int(rng.integers(100, 156))))
                bq = b.const(f"b{i}", rng.integers(-300, 300, cout).astype(np.int32), quant=_q(scale * w_scales[0]))
            else:
                w_scales = rng.uniform(0.002, 0.02, cout).astype(np.float32)
                wq = b.const(f"w{i}", rng.integers(-127, 128, wshape).astype(np.int8),
                             quant={"scale": w_scales, "zero_point": np.zeros(cout, np.int64),
                                    "quantized_dimension": axis})
                bq = b.const(f"b{i}", rng.integers(-300, 300, cout).astype(np.int32),
                             quant={"scale": (scale * w_scales).astype(np.float32),
                                    "zero_point": np.zeros(cout, np.int64)})
            shape = (n, h, w, cout)
            y = b.tensor(f"t{i}", shape, dtype, quant=_q(out_scale, out_zp))
            opts = {"depth_multiplier": cout // c} if kind == "depthwise" else {}
            b.op("DEPTHWISE_CONV_2D" if kind == "depthwise" else "CONV_2D", [cur, wq, bq], [y], version=1 if u8 else 3,
                 padding="SAME", stride_w=1, stride_h=1, fused_activation_function=["NONE", "RELU", "RELU6"][
                     int(rng.integers(0, 3))], **opts)
        elif kind == "add":
            other = b.const(f"c{i}", rng.integers(qlo, qhi, shape).astype(dtype),
                            quant=_q(float(rng.uniform(0.01, 0.05)), int(rng.integers(-10, 11)) + shift))
            y = b.tensor(f"t{i}", shape, dtype, quant=_q(out_scale, out_zp))
            b.op("ADD", [cur, other], [y], version=1 if u8 else 2, fused_activation_function="NONE")
        elif kind == "pool" and len(shape) == 4 and h >= 2 and w >= 2:
            shape = (n, h // 2, w // 2, c)
            y = b.tensor(f"t{i}", shape, dtype, quant=_q(scale, zp))  # pools keep their input's parameters
            b.op("MAX_POOL_2D" if rng.random() < 0.5 else "AVERAGE_POOL_2D", [cur], [y], version=1 if u8 else 2,
                 padding="VALID", stride_w=2, stride_h=2, filter_width=2, filter_height=2,
                 fused_activation_function="NONE")
            out_scale, out_zp = scale, zp
        elif kind == "mean" and len(shape) == 4:
            shape = (n, c)
            y = b.tensor(f"t{i}", shape, dtype, quant=_q(out_scale, out_zp))
            b.op("MEAN", [cur, b.const(f"ax{i}", np.int32([1, 2]))], [y], version=1 if u8 else 2, keep_dims=False)
        elif kind == "fc":
            flat = int(np.prod(shape[1:]))
            if len(shape) != 2:
                r = b.tensor(f"r{i}", (1, flat), dtype, quant=_q(scale, zp))
                b.op("RESHAPE", [cur, b.const(f"rs{i}", np.int32([1, flat]))], [r])
                ops.append("RESHAPE")
                cur = r
            units = int(rng.integers(1, 17))
            ws = float(rng.uniform(0.002, 0.02))
            wq = (b.const(f"w{i}", rng.integers(0, 256, (units, flat)).astype(np.uint8),
                          quant=_q(ws, int(rng.integers(100, 156)))) if u8 else
                  b.const(f"w{i}", rng.integers(-127, 128, (units, flat)).astype(np.int8), quant=_q(ws)))
            bq = b.const(f"b{i}", rng.integers(-300, 300, units).astype(np.int32), quant=_q(scale * ws))
            shape = (1, units)
            y = b.tensor(f"t{i}", shape, dtype, quant=_q(out_scale, out_zp))
            b.op("FULLY_CONNECTED", [cur, wq, bq], [y], version=1 if u8 else 4, fused_activation_function="NONE")
        elif kind == "softmax" and len(shape) == 2:
            out_scale, out_zp = 1 / 256, -128 + shift
            y = b.tensor(f"t{i}", shape, dtype, quant=_q(out_scale, out_zp))
            b.op("SOFTMAX", [cur], [y], version=1 if u8 else 2, beta=1.0)
        else:
            continue
        ops.append(b.main.ops[-1].name)
        cur, scale, zp = y, out_scale, out_zp
    out = b.tensor("output", shape)
    b.op("DEQUANTIZE", [cur], [out], version=1 if u8 else 2)
    b.output(out)
    x0 = np.random.default_rng([seed, 1000]).uniform(-1, 1, b.main.tensors[x].shape)
    return RandomModel(b.build(), [x0.astype(np.float32)], ops + ["DEQUANTIZE"], output_step=scale)


CHAIN_UNARY = ["RELU", "TANH", "LOGISTIC", "ABS", "NEG", "SIN"]
CHAIN_BINARY = ["ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM"]


def _chain(sb, rng, src: int, shape: tuple[int, ...], n: int, tag: str, ops: list[str]) -> int:
    """``n`` elementwise ops (unary, or binary with a per-channel constant) after ``src`` in subgraph ``sb``."""
    cur = src
    for j in range(n):
        name = str(rng.choice(CHAIN_UNARY + CHAIN_BINARY))
        y = sb.tensor(f"{tag}{j}", shape)
        if name in CHAIN_BINARY:
            other = sb.const(f"{tag}c{j}", rng.uniform(-1, 1, shape[-1:]).astype(np.float32))
            kw = {"fused_activation_function": "NONE"} if name in FUSED_ACTIVATION else {}
            sb.op(name, [cur, other], [y], **kw)
        else:
            sb.op(name, [cur], [y])
        ops.append(name)
        cur = y
    return cur


def control_flow_model(seed: int, max_ops: int | None = None) -> RandomModel:
    """An IF choosing between two random elementwise chains by the sign of the input's mean, or a WHILE
    running one chain a constant 1-4 times (which the device plan unrolls), between random ops before and
    after. ``max_ops``: at most that many ops in each chain (and none before or after)."""
    rng0 = np.random.default_rng([seed, 13])
    b = ModelBuilder(f"tflgpu random control-flow model, seed {seed}")
    shape = (1, *(int(d) for d in rng0.integers(1, 9, 2)), int(rng0.integers(1, 9)))
    x = b.input("input", shape)
    ops: list[str] = []
    limit = (lambda n: n) if max_ops is None else (lambda n: min(n, max_ops))
    head = _chain(b.main, np.random.default_rng([seed, 1]), x, shape, 0 if max_ops else int(rng0.integers(0, 3)),
                  "head", ops)
    y = b.tensor("y", shape)
    if rng0.random() < 0.5:
        mean = b.tensor("mean", ())
        b.op("MEAN", [head, b.const("axes", np.int32([0, 1, 2, 3]))], [mean], keep_dims=False)
        cond = b.tensor("cond", (), np.bool_)
        b.op("GREATER", [mean, b.const("zero", np.float32(0.0))], [cond])
        ops += ["MEAN", "GREATER", "IF"]
        branches = []
        for k, tag in enumerate(("then", "else")):
            index, sb = b.subgraph(tag)
            a = sb.input(f"{tag}_x", shape)
            sb.output(_chain(sb, np.random.default_rng([seed, 100 + k]), a, shape,
                             limit(int(rng0.integers(1, 5))), tag, ops))
            branches.append(index)
        b.op("IF", [cond, head], [y], then_subgraph_index=branches[0], else_subgraph_index=branches[1])
    else:
        trips = int(rng0.integers(1, 5))
        ci, cond_sg = b.subgraph("cond")
        bi, body = b.subgraph("body")
        i_out = b.tensor("i_out", (), np.int32)
        b.op("WHILE", [b.const("i0", np.int32(0)), head], [i_out, y], cond_subgraph_index=ci, body_subgraph_index=bi)
        ops.append("WHILE")
        ci_i, _ = cond_sg.input("i", (), np.int32), cond_sg.input("x", shape)
        less = cond_sg.tensor("less", (), np.bool_)
        cond_sg.op("LESS", [ci_i, cond_sg.const("n", np.int32(trips))], [less])
        cond_sg.output(less)
        bi_i, bi_x = body.input("i", (), np.int32), body.input("x", shape)
        nxt = body.tensor("next", (), np.int32)
        body.op("ADD", [bi_i, body.const("one", np.int32(1))], [nxt], fused_activation_function="NONE")
        body.output(nxt, _chain(body, np.random.default_rng([seed, 100]), bi_x, shape,
                                limit(int(rng0.integers(1, 4))), "body", ops))
    tail = _chain(b.main, np.random.default_rng([seed, 2]), y, shape, 0 if max_ops else int(rng0.integers(0, 3)),
                  "tail", ops)
    b.output(tail)
    x0 = np.random.default_rng([seed, 1000]).uniform(-1, 1, shape).astype(np.float32)
    return RandomModel(b.build(), [x0], ops)


def model_for(seed: int, max_ops: int | None = None) -> RandomModel:
    """The fuzzer's model for a seed: one in five (seed % 5 == 2) a full-integer chain (uint8 for one of those
    four, seed % 20 == 12; int8 otherwise), one in ten (seed % 10 == 4) an IF or a WHILE, the rest float DAGs,
    those of seeds 1 and 8 mod 10 with the later makers too (WIDE_MAKERS: PRELU, BATCH_MATMUL, SPLIT_V,
    EXPAND_DIMS / SQUEEZE, comparisons and logic cast to float, CUMSUM, TOPK_V2, GELU and the step functions,
    POW / FLOOR_MOD / ATAN2, LOG_SOFTMAX / L2_NORMALIZATION, REDUCE_MAX / MIN / PROD, MIRROR_PAD, TILE /
    BROADCAST_TO, REVERSE_V2, PACK / UNPACK, SELECT_V2, real networks' blocks: residual ADDs, channel-PAD skip
    branches, squeeze-and-excitation gates), those of seeds 9 mod 20 with the newest too (NEWEST_MAKERS: a zero
    PAD of the image merged into the conv reading it, an empty tensor inside the graph, an op only the CPU kernels
    run: ADD_N, LRN, FAKE_QUANT, REVERSE_SEQUENCE, DYNAMIC_UPDATE_SLICE, UNSORTED_SEGMENT_SUM; a StableHLO
    composite of elementwise ops; a count of values over a threshold, a WHERE's rows; a StableHLO builtin); any other
    seed names the same model it named before those kinds existed (a seed of 9 mod 20 changes as makers join
    NEWEST_MAKERS)."""
    if seed % 5 == 2:
        return quantized_model(seed, max_ops, np.uint8 if seed % 20 == 12 else np.int8)
    if seed % 10 == 4:
        return control_flow_model(seed, max_ops)
    makers = NEWEST_MAKERS if newest_makers(seed) else WIDE_MAKERS if later_makers(seed) else MAKERS
    return random_model(seed, max_ops, makers)


def random_model(seed: int, max_ops: int | None = None, makers=MAKERS) -> RandomModel:
    weights = np.array([w for _, w in makers]) / sum(w for _, w in makers)
    g = _Graph(seed)
    inputs = []
    for i in range(int(g.rng.integers(1, 3))):
        rank = int(g.rng.choice([2, 3, 4, 4, 4]))
        shape = (1, *(int(d) for d in g.rng.integers(1, 13, rank - 1)))
        t = T(g.b.input(f"input{i}", shape), shape)
        g.tensors.append(t)
        inputs.append(np.random.default_rng([seed, 1000 + i]).uniform(-1, 1, shape).astype(np.float32))
    n_ops = int(g.rng.integers(1, 13))
    for i in range(n_ops if max_ops is None else min(n_ops, max_ops)):
        rng = np.random.default_rng([seed, i])
        # mostly extend the newest tensor, sometimes branch from an older one
        pool = g.tensors if rng.random() < 0.3 else g.tensors[-1:]
        x = pool[int(rng.integers(0, len(pool)))]
        for _ in range(8):  # a maker that does not fit x (or would make a large tensor) gives way to another
            maker = makers[int(rng.choice(len(makers), p=weights))][0]
            mark = (len(g.b.main.tensors), len(g.b.main.ops), len(g.tensors), len(g.ops), set(g.consumed))
            y = maker(g, rng, x)
            if y is not None and int(np.prod(y.shape)) <= MAX_ELEMENTS and min(y.shape, default=0) >= 1:
                break
            # undo a made-and-refused op (too large): drop what it added
            del g.b.main.tensors[mark[0]:], g.b.main.ops[mark[1]:], g.tensors[mark[2]:], g.ops[mark[3]:]
            g.consumed = mark[4]
        else:
            y = None
        ranks = np.random.default_rng([seed, i, 31])
        if y is not None and ranks.random() < RANK_RATE:
            _rank(g, ranks, y)
    sinks = [t for t in g.tensors if t.index not in g.consumed and t.index not in g.b.main.inputs]
    outputs = sinks[-3:] or g.tensors[-1:]
    if outputs[-1].index in g.b.main.inputs:  # no op was made: pass the input through one
        y = g.new(outputs[-1].shape)
        g.op("RELU", [outputs[-1].index], [y])
        outputs = [y]
    g.b.output(*(t.index for t in outputs), *g.indices[-2:])
    return RandomModel(g.b.build(), inputs, g.ops)
