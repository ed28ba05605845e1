"""The shapes of an op's outputs, from its inputs' shapes and options (and the values of the inputs its traits'
``shape_inputs`` name), for the ops whose CPU kernels cost a start most: a convolution (transposed too), a pool,
an elementwise op, a reduction, a concatenation, a padding, a resize, an LSTM. A plan learns every tensor's shape
before it generates a kernel (runtime.selection.propagate_shapes); with these it runs none of those kernels, so a
model of such ops starts without importing numba or probing the BLAS (about 0.4 s of MobileNet v2's first start,
and 10-15 s where numba's cache is empty: its kernels compiled).

A rule answers None wherever anything is not as it expects (a rank, channels that do not fit, an axis out of
range): the op's kernel then runs and says what is wrong in its own words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..model.ir import Operator
from .attributes import conv_options, conv_padding, explicit_padding
from .custom_options import detection_postprocess_options

Shape = tuple[int, ...]
_CONV_ARG = "TFLGPU_CONV_ARG"
# (op, its inputs' shapes (None: omitted), its inputs' values (None: omitted or not known), its outputs' shapes as the
# model declares them) -> its outputs' shapes
Rule = Callable[[Operator, list, list, list], list[Shape] | None]

_RULES: dict[str, Rule] = {}


def _rule(names: str):
    def add(fn: Rule) -> Rule:
        for name in names.split():
            _RULES[name] = fn
        return fn

    return add


def output_shapes(op: Operator, shapes: Sequence[Shape | None], values: Sequence,
                  declared: Sequence[Shape | None] = ()) -> list[Shape] | None:
    """The shapes of ``op``'s outputs, or None where no rule here knows them (the op's kernel must run).
    ``declared``: its outputs' shapes in the model (what an op whose kernel keeps them, MediaPipe's transposed conv,
    makes)."""
    rule = _RULES.get(op.name)
    if rule is None:
        return None
    try:
        return rule(op, list(shapes), list(values), list(declared))
    except (ValueError, TypeError, IndexError, KeyError):  # (a malformed node: its kernel says what is wrong)
        return None


def _known_ints(value) -> list[int] | None:
    if value is None:
        return None
    a = np.asarray(value)
    if a.dtype.kind not in "iu":
        return None
    return [int(v) for v in a.reshape(-1)]


@_rule("CONV_2D DEPTHWISE_CONV_2D TFLGPU_CONV_ARG")
def _conv(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    """(TFLGPU_CONV_ARG, graph.conv_arg's CONV_2D and the ARG_MAX / ARG_MIN over its channels: the sums, then the
    index of each pixel's pick)"""
    x, w = shapes[0], shapes[1]
    if x is None or w is None or len(x) != 4 or len(w) != 4 or len(op.outputs) != (2 if op.name == _CONV_ARG else 1):
        return None
    sh, sw, dh, dw, pad = conv_options(op.options)
    et, eb, el, er = explicit_padding(op.options)
    if min(sh, sw, dh, dw) < 1:
        return None
    if op.name != "DEPTHWISE_CONV_2D":
        oc, kh, kw, icg = w
        if icg < 1 or x[3] == 0 or x[3] % icg or oc % (x[3] // icg):
            return None
    else:
        _, kh, kw, oc = w
        if w[0] != 1 or x[3] == 0 or oc % x[3]:
            return None
    oh, _ = conv_padding(x[1], kh, sh, dh, pad, et, eb)
    ow, _ = conv_padding(x[2], kw, sw, dw, pad, el, er)
    if oh <= 0 or ow <= 0:
        return None
    return [(x[0], oh, ow, oc), (x[0], oh, ow)] if op.name == _CONV_ARG else [(x[0], oh, ow, oc)]


def _transposed(out: Sequence[int] | None, w: Shape | None, x: Shape | None) -> list[Shape] | None:
    """A transposed conv's output shape ``out`` where it fits the input ``x`` (batch) and the filter ``w``
    [out, kh, kw, in]."""
    if out is None or w is None or x is None or len(out) != 4 or len(w) != 4 or len(x) != 4:
        return None
    if x[3] != w[3] or out[0] != x[0] or out[3] != w[0] or min(out[1], out[2]) < 1:
        return None
    return [tuple(out)]


@_rule("TRANSPOSE_CONV")
def _transpose_conv(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    """The output shape its input 0 names."""
    return _transposed(_known_ints(values[0]), shapes[1], shapes[2]) if len(op.outputs) == 1 else None


@_rule("Convolution2DTransposeBias")
def _transpose_conv_bias(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    """MediaPipe's transposed conv (input, filter, bias) makes the shape the model declares for its output
    (cpu.conv's kernel, kernels.conv's generator)."""
    return _transposed(declared[0], shapes[1], shapes[0]) if len(declared) == 1 else None


@_rule("UNIDIRECTIONAL_SEQUENCE_LSTM")
def _sequence_lstm(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    """[batch, time, outputs] (time_major: [time, batch, outputs]); the outputs are the recurrent weights' columns
    (input 6, recurrent_to_forget [cells, outputs]), which the hidden state (input 18) holds per batch row."""
    if len(shapes) < 19 or len(op.outputs) != 1:
        return None
    x, to_forget, recurrent, h = shapes[0], shapes[2], shapes[6], shapes[18]
    if x is None or len(x) != 3 or to_forget is None or recurrent is None or h is None:
        return None
    if len(to_forget) != 2 or len(recurrent) != 2 or to_forget[1] != x[2]:
        return None
    time_major = op.options.get("time_major", False)
    batch = x[1] if time_major else x[0]
    outputs = recurrent[1]
    if int(np.prod(h, dtype=np.int64)) != batch * outputs:
        return None
    return [(x[0], x[1], outputs)]


@_rule("FULLY_CONNECTED")
def _fully_connected(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    x, w = shapes[0], shapes[1]
    if x is None or w is None or len(w) != 2 or len(op.outputs) != 1:
        return None
    units, depth = w
    size = int(np.prod(x, dtype=np.int64))
    if depth < 1 or size % depth:
        return None
    if op.options.get("keep_num_dims", False):
        if not x or x[-1] != depth:
            return None
        return [(*x[:-1], units)]
    return [(size // depth, units)]


@_rule("AVERAGE_POOL_2D MAX_POOL_2D L2_POOL_2D")
def _pool(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    x = shapes[0]
    o = op.options
    kh, kw, sh, sw = o.get("filter_height", 1), o.get("filter_width", 1), o.get("stride_h", 1), o.get("stride_w", 1)
    if x is None or len(x) != 4 or min(kh, kw, sh, sw) < 1:
        return None
    oh, _ = conv_padding(x[1], kh, sh, 1, o.get("padding", 0))
    ow, _ = conv_padding(x[2], kw, sw, 1, o.get("padding", 0))
    return [(x[0], max(oh, 0), max(ow, 0), x[3])]


# (the unary ops of ops.signatures' same-shape group and the conversions: each output value one input value's)
@_rule("ABS CEIL COS ELU EXP FLOOR GELU HARD_SWISH LEAKY_RELU LOG LOGISTIC NEG RELU RELU6 RELU_0_TO_1 RELU_N1_TO_1 "
       "ROUND RSQRT SIGN SIN SQRT SQUARE TANH L2_NORMALIZATION SOFTMAX LOG_SOFTMAX QUANT_SIM QUANTIZE DEQUANTIZE")
def _same(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    if len(shapes) != 1 or shapes[0] is None or len(op.outputs) != 1:
        return None
    return [tuple(shapes[0])]


@_rule("ADD SUB MUL DIV POW MAXIMUM MINIMUM FLOOR_DIV FLOOR_MOD SQUARED_DIFFERENCE PRELU")
def _broadcast(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    if len(shapes) != 2 or None in shapes or len(op.outputs) != 1:
        return None
    return [tuple(int(d) for d in np.broadcast_shapes(tuple(shapes[0]), tuple(shapes[1])))]


@_rule("MEAN SUM REDUCE_MAX REDUCE_MIN REDUCE_PROD")
def _reduce(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    x, axes = shapes[0], _known_ints(values[1])
    if x is None or axes is None or len(op.outputs) != 1:
        return None
    rank = len(x)
    if rank == 0 or any(not -rank <= a < rank for a in axes):
        return None
    gone = {a + rank if a < 0 else a for a in axes}
    if op.options.get("keep_dims", False):
        return [tuple(1 if i in gone else d for i, d in enumerate(x))]
    return [tuple(d for i, d in enumerate(x) if i not in gone)]


@_rule("CONCATENATION")
def _concatenation(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    if not shapes or None in shapes or len(op.outputs) != 1:
        return None
    rank = len(shapes[0])
    axis = op.options.get("axis", 0)
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank or any(len(s) != rank for s in shapes):
        return None
    if any(s[i] != shapes[0][i] for s in shapes for i in range(rank) if i != axis):
        return None
    return [tuple(sum(s[axis] for s in shapes) if i == axis else d for i, d in enumerate(shapes[0]))]


@_rule("PAD PADV2")
def _pad(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    x, pads = shapes[0], _known_ints(values[1])
    if x is None or pads is None or len(pads) != 2 * len(x) or min(pads, default=0) < 0 or len(op.outputs) != 1:
        return None
    return [tuple(d + pads[2 * i] + pads[2 * i + 1] for i, d in enumerate(x))]


@_rule("RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR")
def _resize(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    x, size = shapes[0], _known_ints(values[1])
    if x is None or len(x) != 4 or size is None or len(size) != 2 or min(size) < 1 or len(op.outputs) != 1:
        return None
    return [(x[0], size[0], size[1], x[3])]


@_rule("TFLite_Detection_PostProcess")
def _detection_postprocess(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    """(its outputs' rows come from its options alone)"""
    p = detection_postprocess_options(op.custom_options)
    if len(shapes) != 3 or None in shapes or p.input_problem(*shapes):
        return None
    return p.output_shapes()


@_rule("NON_MAX_SUPPRESSION_V4 NON_MAX_SUPPRESSION_V5")
def _non_max_suppression(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    """(max_output_size rows whatever the count: LiteRT's kernel pads with zeros, a computed size too)"""
    most = _known_ints(values[2])
    if most is None or len(most) != 1 or most[0] < 0:
        return None
    return [(most[0],)] * (len(op.outputs) - 1) + [()]


@_rule("CUMSUM")
def _cumsum(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    x, axis = shapes[0], _known_ints(values[1])
    if x is None or axis is None or len(axis) != 1 or not -len(x) <= axis[0] < len(x) or len(op.outputs) != 1:
        return None
    return [tuple(x)]


@_rule("RANDOM_UNIFORM RANDOM_STANDARD_NORMAL")
def _random(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    """The shape input's values (known: the generator is not run to learn them, which would draw from it)."""
    shape = _known_ints(values[0])
    if shape is None or any(d < 0 for d in shape) or shapes[0] is None or len(shapes[0]) != 1:
        return None
    return [tuple(shape)]


@_rule("MULTINOMIAL")
def _multinomial(op: Operator, shapes: list, values: list, declared: list) -> list[Shape] | None:
    logits, samples = shapes[0], _known_ints(values[1])
    if logits is None or len(logits) != 2 or samples is None or len(samples) != 1 or samples[0] < 0:
        return None
    return [(logits[0], samples[0])]
