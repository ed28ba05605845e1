"""Quantized models on the CPU integer kernels, against LiteRT: within one quantization step per element.

Single-op models are built with per-tensor and per-channel weights, int8 and uint8, and zero points
away from 0 (odd ones, too), on random integer inputs covering the whole range.
"""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu.cpu.quantized import multiply_by_quantized_multiplier, quantize_multiplier

from .conftest import corpus_model, litert, run_model
from .qutil import Q, QConst, QIn, QOut, check_qop, rand_q

I8, U8 = np.int8, np.uint8


def _conv_case(rng, dtype, per_channel, *, depthwise=False, stride=1, act="NONE", k=3, c=8, oc=12):
    """(inputs, output, weights scale) of a conv: int8 weights are symmetric, uint8 weights carry a zero point."""
    n_scales = oc if per_channel else 1
    w_scale = rng.uniform(0.002, 0.02, n_scales).astype(np.float32)
    if dtype == I8:
        w = rand_q(rng, (1, k, k, oc) if depthwise else (oc, k, k, c), I8)
        w[w == -128] = -127
        wq = Q(w_scale, 0, 3 if depthwise else 0)
    else:
        w = rand_q(rng, (1, k, k, oc) if depthwise else (oc, k, k, c), U8)
        wq = Q(w_scale, 131, 3 if depthwise else 0)
    in_q = Q(0.031, 5 if dtype == I8 else 133)
    x = rand_q(rng, (1, 11, 9, oc if depthwise else c), dtype)
    bias = rng.integers(-3000, 3000, oc).astype(np.int32)
    b_q = Q((np.float32(in_q.scale) * w_scale).astype(np.float32), 0)
    oh, ow = -(-11 // stride), -(-9 // stride)
    out = QOut((1, oh, ow, oc), dtype, Q(0.173, -7 if dtype == I8 else 121))
    return [QIn(x, in_q), QConst(w, wq), QConst(bias, b_q)], out


@pytest.mark.parametrize("dtype,per_channel", [(I8, True), (I8, False), (U8, False)],
                         ids=["int8_per_channel", "int8_per_tensor", "uint8"])  # (uint8 is per-tensor in TFLite)
@pytest.mark.parametrize("stride,act", [(1, "NONE"), (2, "RELU6"), (1, "RELU")])
def test_conv2d(rng, dtype, per_channel, stride, act):
    ins, out = _conv_case(rng, dtype, per_channel, stride=stride)
    check_qop("CONV_2D", ins, [out], version=3 if dtype == I8 else 1, padding="SAME", stride_h=stride,
              stride_w=stride, fused_activation_function=act)


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise(rng, dtype, stride):
    ins, out = _conv_case(rng, dtype, dtype == I8, depthwise=True, stride=stride)
    check_qop("DEPTHWISE_CONV_2D", ins, [out], version=3 if dtype == I8 else 1, padding="SAME",
              stride_h=stride, stride_w=stride, depth_multiplier=1, fused_activation_function="RELU6")


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
def test_fully_connected(rng, dtype):
    w = rand_q(rng, (10, 37), dtype)
    if dtype == I8:
        w[w == -128] = -127
    wq = Q(0.0071, 0 if dtype == I8 else 127)
    in_q = Q(0.05, -3 if dtype == I8 else 130)
    bias = rng.integers(-500, 500, 10).astype(np.int32)
    out = QOut((4, 10), dtype, Q(0.41, 9 if dtype == I8 else 117))
    check_qop("FULLY_CONNECTED", [QIn(rand_q(rng, (4, 37), dtype), in_q), QConst(w, wq),
                                  QConst(bias, Q(np.float32(0.05) * np.float32(0.0071), 0))], [out],
              version=4 if dtype == I8 else 1, fused_activation_function="RELU")


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL"])
def test_binary(rng, dtype, op):
    z = (3, -11, 1) if dtype == I8 else (131, 117, 128)
    a = QIn(rand_q(rng, (1, 6, 5, 7), dtype), Q(0.047, z[0]))
    b = QIn(rand_q(rng, (1, 6, 5, 7), dtype), Q(0.0213, z[1]))
    out = QOut((1, 6, 5, 7), dtype, Q(0.083 if op != "MUL" else 0.0231, z[2]))
    check_qop(op, [a, b], [out], version=2, fused_activation_function="NONE")


def test_add_broadcast_and_relu(rng):
    a = QIn(rand_q(rng, (1, 4, 4, 6), I8), Q(0.05, 1))
    b = QIn(rand_q(rng, (1, 1, 1, 6), I8), Q(0.09, -4))
    check_qop("ADD", [a, b], [QOut((1, 4, 4, 6), I8, Q(0.1, -20))], version=2, fused_activation_function="RELU")


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
@pytest.mark.parametrize("op", ["AVERAGE_POOL_2D", "MAX_POOL_2D"])
def test_pools(rng, dtype, op):
    q = Q(0.06, -5 if dtype == I8 else 140)
    x = QIn(rand_q(rng, (1, 9, 10, 5), dtype), q)
    check_qop(op, [x], [QOut((1, 5, 5, 5), dtype, q)], version=2, padding="SAME", stride_h=2, stride_w=2,
              filter_height=3, filter_width=3, fused_activation_function="NONE")


def test_concatenation(rng):
    q = Q(0.05, -3)
    a, b = QIn(rand_q(rng, (1, 3, 3, 4), I8), q), QIn(rand_q(rng, (1, 3, 3, 2), I8), q)
    check_qop("CONCATENATION", [a, b], [QOut((1, 3, 3, 6), I8, q)], version=2, axis=3)


def test_concatenation_rescales_uint8(rng):
    """uint8 inputs with other parameters than the output are requantized (TFLite's builtin kernel;
    LiteRT's XNNPACK refuses the op, and int8 concatenation requires equal parameters)."""
    a = QIn(rand_q(rng, (1, 3, 3, 4), U8), Q(0.05, 120))
    b = QIn(rand_q(rng, (1, 3, 3, 2), U8), Q(0.11, 135))
    check_qop("CONCATENATION", [a, b], [QOut((1, 3, 3, 6), U8, Q(0.1, 128))], axis=3, builtin_only=True)


def test_reshape_and_pad(rng):
    q = Q(0.02, 7)
    x = rand_q(rng, (1, 4, 4, 3), I8)
    check_qop("RESHAPE", [QIn(x, q), QConst(np.array([1, 48], np.int32))], [QOut((1, 48), I8, q)])
    check_qop("PAD", [QIn(x, q), QConst(np.array([[0, 0], [1, 2], [2, 1], [0, 0]], np.int32))],
              [QOut((1, 7, 7, 3), I8, q)], version=2)


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
def test_softmax(rng, dtype):
    x = QIn(rand_q(rng, (2, 30), dtype), Q(0.09, 4 if dtype == I8 else 131))
    out_q = Q(1 / 256, -128 if dtype == I8 else 0)
    check_qop("SOFTMAX", [x], [QOut((2, 30), dtype, out_q)], version=2, beta=1.0)


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
@pytest.mark.parametrize("op", ["LOGISTIC", "TANH", "HARD_SWISH"])
def test_unary(rng, dtype, op):
    x = QIn(rand_q(rng, (1, 8, 8, 4), dtype), Q(0.041, -9 if dtype == I8 else 125))
    if op == "LOGISTIC":
        out_q = Q(1 / 256, -128 if dtype == I8 else 0)
    elif op == "TANH":
        out_q = Q(1 / 128, 0 if dtype == I8 else 128)
    else:
        out_q = Q(0.031, -100 if dtype == I8 else 30)
    check_qop(op, [x], [QOut((1, 8, 8, 4), dtype, out_q)], version=1 if op == "HARD_SWISH" else 2)


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
def test_mean(rng, dtype):
    x = QIn(rand_q(rng, (1, 7, 6, 5), dtype), Q(0.07, 3 if dtype == I8 else 129))
    check_qop("MEAN", [x, QConst(np.array([1, 2], np.int32))], [QOut((1, 1, 1, 5), dtype, Q(0.03, -2 if dtype == I8 else 126))],
              version=2, keep_dims=True)


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
def test_resize_bilinear(rng, dtype):
    q = Q(0.05, 9 if dtype == I8 else 140)
    x = QIn(rand_q(rng, (1, 5, 4, 3), dtype), q)
    check_qop("RESIZE_BILINEAR", [x, QConst(np.array([9, 7], np.int32))], [QOut((1, 9, 7, 3), dtype, q)],
              version=2, half_pixel_centers=True)


def test_quantize_dequantize_requantize(rng):
    x = rng.normal(0, 3, (2, 50)).astype(np.float32)
    check_qop("QUANTIZE", [QIn(x)], [QOut((2, 50), I8, Q(0.037, -3))])
    check_qop("QUANTIZE", [QIn(x)], [QOut((2, 50), U8, Q(0.037, 129))])
    q8 = rand_q(rng, (2, 50), I8)
    check_qop("QUANTIZE", [QIn(q8, Q(0.05, 4))], [QOut((2, 50), I8, Q(0.13, -9))], version=2)
    check_qop("DEQUANTIZE", [QIn(q8, Q(0.05, 4))], [QOut((2, 50), np.float32)], max_steps=0.0, version=2)


def test_fixed_point_multiplier_matches_reference_arithmetic():
    """QuantizeMultiplier / MultiplyByQuantizedMultiplier against exact rational rounding."""
    rng = np.random.default_rng(3)
    m = rng.uniform(1e-4, 0.99, 200)
    q, shift = quantize_multiplier(m)
    assert np.all((q >= 1 << 30) & (q < 1 << 31))
    x = rng.integers(-(1 << 20), 1 << 20, 200)
    got = multiply_by_quantized_multiplier(x, q, shift)
    exact = x * (q / 2.0 ** 31) * 2.0 ** shift
    assert np.abs(got - exact).max() <= 1.0


def test_unsupported_quantized_op_is_a_clear_error():
    """An op with no integer kernel and no float kernel to emulate it fails at construction, naming it."""
    from tflgpu import Interpreter

    from .qutil import qop_model

    model, _ = qop_model("CAST", [QIn(np.zeros((2, 3), I8), Q(0.1, 0))], [QOut((2, 3), np.int32)])
    with pytest.raises(ValueError, match="quantized op CAST"):
        Interpreter(model_content=model).allocate_tensors()


def _corpus_input(path):
    it = litert()(model_path=str(path))
    d = it.get_input_details()[0]
    return np.random.default_rng(7).uniform(-1, 1, d["shape"]).astype(d["dtype"])


def test_mobilenet_v2_int8_matches_litert():
    """The whole int8 model on the CPU integer kernels: every output equals LiteRT's (0 steps)."""
    from tflgpu import Interpreter

    path = corpus_model("mobilenet_v2_1.0_224_int8.tflite")
    x = _corpus_input(path)
    want = run_model(litert(), path, [x])[0]
    got = run_model(Interpreter, path, [x])[0]
    assert got.argmax() == want.argmax()
    assert np.abs(got - want).max() <= 1 / 256 + 1e-9  # at most one step of the output (scale 1/256)
