"""Quantized models on the CPU integer kernels, against LiteRT: within one quantization step per element.

Single-op models are built with per-tensor and per-channel weights, int8 and uint8, and zero points
away from 0 (odd ones, too), on random integer inputs covering the whole range.
"""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest

from tflgpu.cpu.quantized import multiply_by_quantized_multiplier, quantize_multiplier

from .conftest import assert_close, assert_fp16_close, corpus_model, litert, run_model
from .qutil import Q, QConst, QIn, QOut, check_qop, rand_q

I8, U8 = np.int8, np.uint8


@pytest.fixture(params=["cpu", "gpu-fp32", "gpu-fp16"])
def path(request):
    """Where the op runs: the CPU integer kernels (None), or the GpuDelegate's float view in FP32 / FP16.
    The float view's bound is also one step: it rounds the same real values as the integer kernels (sums
    differ only by float rounding, a small fraction of a step, and FP16 storage of 8-bit values
    times a scale is within 2^-11 relative), so an output moves only where the value lies at a tie."""
    if request.param == "cpu":
        return None
    device = request.getfixturevalue("opencl_device")
    fp16 = request.param == "gpu-fp16"
    if fp16 and not device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    from tflgpu import GpuDelegate

    return GpuDelegate(precision_loss_allowed=fp16, cache=False)


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
def test_conv2d(rng, dtype, per_channel, stride, act, path):
    ins, out = _conv_case(rng, dtype, per_channel, stride=stride)
    check_qop(path, "CONV_2D", ins, [out], version=3 if dtype == I8 else 1, padding="SAME", stride_h=stride,
              stride_w=stride, fused_activation_function=act)


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise(rng, dtype, stride, path):
    ins, out = _conv_case(rng, dtype, dtype == I8, depthwise=True, stride=stride)
    check_qop(path, "DEPTHWISE_CONV_2D", ins, [out], version=3 if dtype == I8 else 1, padding="SAME",
              stride_h=stride, stride_w=stride, depth_multiplier=1, fused_activation_function="RELU6")


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
def test_fully_connected(rng, dtype, path):
    w = rand_q(rng, (10, 37), dtype)
    if dtype == I8:
        w[w == -128] = -127
    wq = Q(0.0071, 0 if dtype == I8 else 127)
    in_q = Q(0.05, -3 if dtype == I8 else 130)
    bias = rng.integers(-500, 500, 10).astype(np.int32)
    out = QOut((4, 10), dtype, Q(0.41, 9 if dtype == I8 else 117))
    check_qop(path, "FULLY_CONNECTED", [QIn(rand_q(rng, (4, 37), dtype), in_q), QConst(w, wq),
                                  QConst(bias, Q(np.float32(0.05) * np.float32(0.0071), 0))], [out],
              version=4 if dtype == I8 else 1, fused_activation_function="RELU")


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL"])
def test_binary(rng, dtype, op, path):
    z = (3, -11, 1) if dtype == I8 else (131, 117, 128)
    a = QIn(rand_q(rng, (1, 6, 5, 7), dtype), Q(0.047, z[0]))
    b = QIn(rand_q(rng, (1, 6, 5, 7), dtype), Q(0.0213, z[1]))
    out = QOut((1, 6, 5, 7), dtype, Q(0.083 if op != "MUL" else 0.0231, z[2]))
    check_qop(path, op, [a, b], [out], version=2, fused_activation_function="NONE")


def test_add_broadcast_and_relu(rng, path):
    a = QIn(rand_q(rng, (1, 4, 4, 6), I8), Q(0.05, 1))
    b = QIn(rand_q(rng, (1, 1, 1, 6), I8), Q(0.09, -4))
    check_qop(path, "ADD", [a, b], [QOut((1, 4, 4, 6), I8, Q(0.1, -20))], version=2, fused_activation_function="RELU")


def test_broadcast_operands_are_read_only_views(rng):
    """The integer kernels' broadcast operands are read-only views, whose flag reads without NumPy's FutureWarning
    ("future versions will not create a writeable array from broadcast_array": it reached a user of the CPU
    kernels through each broadcast ADD with NumPy 1.26, an error under ``-W error``), and through which nothing is
    written into the elements they repeat."""
    from types import SimpleNamespace

    from tflgpu.cpu.quantized import _broadcast

    a, b = rng.integers(-128, 128, (1, 4, 4, 6)).astype(np.int8), rng.integers(-128, 128, (1, 1, 1, 6)).astype(I8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        views = _broadcast(SimpleNamespace(op=SimpleNamespace(name="ADD")), a, b)
        assert [v.flags.writeable for v in views] == [False, False]
    assert [v.shape for v in views] == [(1, 4, 4, 6)] * 2 and np.array_equal(views[1][0, 3, 2], b[0, 0, 0])


@pytest.mark.parametrize("window", [(3, "SAME", (1, 5, 5, 5)), (2, "VALID", (1, 4, 5, 5))], ids=["3same", "2valid"])
@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
@pytest.mark.parametrize("op", ["AVERAGE_POOL_2D", "MAX_POOL_2D"])
def test_pools(rng, dtype, op, window, path):
    """Exact on the CPU and the FP32 float view: TFLite's integer average rounds the mean of the stored
    integers half away from zero (a 2x2 window's mean ends in .5 for a quarter of the outputs), and the float
    view's simulator does too (the valid-model fuzz's first int8 findings: 1 step off, 5 after a conv)."""
    k, padding, out = window
    q = Q(0.06, -5 if dtype == I8 else 140)
    x = QIn(rand_q(rng, (1, 9, 10, 5), dtype), q)
    steps = 1.0 if path is not None and path.wants_fp16() else 0.0
    check_qop(path, op, [x], [QOut(out, dtype, q)], version=2, padding=padding, stride_h=2, stride_w=2,
              filter_height=k, filter_width=k, fused_activation_function="NONE", max_steps=steps)


def test_concatenation(rng, path):
    q = Q(0.05, -3)
    a, b = QIn(rand_q(rng, (1, 3, 3, 4), I8), q), QIn(rand_q(rng, (1, 3, 3, 2), I8), q)
    check_qop(path, "CONCATENATION", [a, b], [QOut((1, 3, 3, 6), I8, q)], version=2, axis=3)


def test_concatenation_rescales_uint8(rng, path):
    """uint8 inputs with other parameters than the output are requantized (TFLite's builtin kernel;
    LiteRT's XNNPACK refuses the op, and int8 concatenation requires equal parameters)."""
    a = QIn(rand_q(rng, (1, 3, 3, 4), U8), Q(0.05, 120))
    b = QIn(rand_q(rng, (1, 3, 3, 2), U8), Q(0.11, 135))
    check_qop(path, "CONCATENATION", [a, b], [QOut((1, 3, 3, 6), U8, Q(0.1, 128))], axis=3, builtin_only=True)


def test_reshape_and_pad(rng, path):
    q = Q(0.02, 7)
    x = rand_q(rng, (1, 4, 4, 3), I8)
    check_qop(path, "RESHAPE", [QIn(x, q), QConst(np.array([1, 48], np.int32))], [QOut((1, 48), I8, q)])
    check_qop(path, "PAD", [QIn(x, q), QConst(np.array([[0, 0], [1, 2], [2, 1], [0, 0]], np.int32))],
              [QOut((1, 7, 7, 3), I8, q)], version=2)


def test_moves_and_extremes(rng, path):
    """The moves and picks this work put on the device (MIRROR_PAD, TILE, REVERSE_V2, spatial REDUCE_MAX / MIN),
    on int8 values: the stored integers moved exactly (the float view's values are on the input's grid)."""
    q = Q(0.03, -6)
    x = rand_q(rng, (1, 4, 5, 3), I8)
    check_qop(path, "MIRROR_PAD", [QIn(x, q), QConst(np.array([[0, 0], [2, 1], [1, 3], [0, 0]], np.int32))],
              [QOut((1, 7, 9, 3), I8, q)], mode=0)
    check_qop(path, "TILE", [QIn(x, q), QConst(np.array([1, 2, 1, 2], np.int32))], [QOut((1, 8, 5, 6), I8, q)])
    check_qop(path, "REVERSE_V2", [QIn(x, q), QConst(np.array([1, 2], np.int32))], [QOut((1, 4, 5, 3), I8, q)])
    for op in ("REDUCE_MAX", "REDUCE_MIN"):
        check_qop(path, op, [QIn(x, q), QConst(np.array([1, 2], np.int32))], [QOut((1, 1, 1, 3), I8, q)],
                  version=2, keep_dims=True)


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
def test_softmax(rng, dtype, path):
    x = QIn(rand_q(rng, (2, 30), dtype), Q(0.09, 4 if dtype == I8 else 131))
    out_q = Q(1 / 256, -128 if dtype == I8 else 0)
    check_qop(path, "SOFTMAX", [x], [QOut((2, 30), dtype, out_q)], version=2, beta=1.0)


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
@pytest.mark.parametrize("op", ["LOGISTIC", "TANH", "HARD_SWISH"])
def test_unary(rng, dtype, op, path):
    x = QIn(rand_q(rng, (1, 8, 8, 4), dtype), Q(0.041, -9 if dtype == I8 else 125))
    if op == "LOGISTIC":
        out_q = Q(1 / 256, -128 if dtype == I8 else 0)
    elif op == "TANH":
        out_q = Q(1 / 128, 0 if dtype == I8 else 128)
    else:
        out_q = Q(0.031, -100 if dtype == I8 else 30)
    check_qop(path, op, [x], [QOut((1, 8, 8, 4), dtype, out_q)], version=1 if op == "HARD_SWISH" else 2)


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
def test_mean(rng, dtype, path):
    x = QIn(rand_q(rng, (1, 7, 6, 5), dtype), Q(0.07, 3 if dtype == I8 else 129))
    check_qop(path, "MEAN", [x, QConst(np.array([1, 2], np.int32))], [QOut((1, 1, 1, 5), dtype, Q(0.03, -2 if dtype == I8 else 126))],
              version=2, keep_dims=True)


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
def test_resize_bilinear(rng, dtype, path):
    q = Q(0.05, 9 if dtype == I8 else 140)
    x = QIn(rand_q(rng, (1, 5, 4, 3), dtype), q)
    check_qop(path, "RESIZE_BILINEAR", [x, QConst(np.array([9, 7], np.int32))], [QOut((1, 9, 7, 3), dtype, q)],
              version=2, half_pixel_centers=True)


def test_quantize_dequantize_requantize(rng, path):
    x = rng.normal(0, 3, (2, 50)).astype(np.float32)
    check_qop(path, "QUANTIZE", [QIn(x)], [QOut((2, 50), I8, Q(0.037, -3))])
    check_qop(path, "QUANTIZE", [QIn(x)], [QOut((2, 50), U8, Q(0.037, 129))])
    q8 = rand_q(rng, (2, 50), I8)
    check_qop(path, "QUANTIZE", [QIn(q8, Q(0.05, 4))], [QOut((2, 50), I8, Q(0.13, -9))], version=2)
    check_qop(path, "DEQUANTIZE", [QIn(q8, Q(0.05, 4))], [QOut((2, 50), np.float32)],
              max_steps=0.0 if path is None else 0.05 if path.wants_fp16() else 1e-5, float_step=0.05,
              version=2)  # (FP16 keeps the float output in half: 2^-11 relative, 0.03 steps here)


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

    model, _ = qop_model("CONCAT_EMBEDDINGS", [QIn(np.zeros((1, 2, 2, 3), I8), Q(0.1, 0))],
                         [QOut((1, 2, 2, 3), I8, Q(0.1, 0))])
    with pytest.raises(ValueError, match="quantized op CONCAT_EMBEDDINGS"):
        Interpreter(model_content=model).allocate_tensors()


def _corpus_input(path):
    it = litert()(model_path=str(path))
    d = it.get_input_details()[0]
    return np.random.default_rng(7).uniform(-1, 1, d["shape"]).astype(d["dtype"])


# -- hybrid (dynamic-range) ops: float activations, int8 per-channel weights ------------------------

def _hybrid_case(rng, op):
    """A float-input op with int8 per-channel weights, as the converter's dynamic-range mode writes it; and
    the same op with those weights dequantized, stored as float (the float reference)."""
    from tflgpu.model.builder import ModelBuilder

    if op == "FULLY_CONNECTED":
        x = rng.normal(0, 1, (3, 40)).astype(np.float32)
        w_shape, out_shape, dim, n = (16, 40), (3, 16), 0, 16
    elif op == "DEPTHWISE_CONV_2D":
        x = rng.normal(0, 1, (1, 9, 8, 12)).astype(np.float32)
        w_shape, out_shape, dim, n = (1, 3, 3, 12), (1, 9, 8, 12), 3, 12
    else:
        k = 1 if op == "CONV_2D_1x1" else 3
        x = rng.normal(0, 1, (1, 9, 8, 10)).astype(np.float32)
        w_shape, out_shape, dim, n = (14, k, k, 10), (1, 9, 8, 14), 0, 14
    w = rng.integers(-127, 128, w_shape).astype(np.int8)
    scale = rng.uniform(0.005, 0.02, n).astype(np.float32)
    bias = rng.normal(0, 0.1, n).astype(np.float32)
    w_real = w.astype(np.float32) * scale.reshape([-1 if i == dim else 1 for i in range(w.ndim)])
    name = "CONV_2D" if op.startswith("CONV_2D") else op
    opts = {} if name == "FULLY_CONNECTED" else {"padding": "SAME", "stride_h": 1, "stride_w": 1}
    if name == "DEPTHWISE_CONV_2D":
        opts["depth_multiplier"] = 1

    def build(hybrid: bool) -> bytes:
        b = ModelBuilder()
        xi = b.input("x", x.shape, np.float32)
        if hybrid:
            wi = b.const("w", w, quant={"scale": scale, "zero_point": np.zeros(n, np.int64), "quantized_dimension": dim})
        else:
            wi = b.const("w", w_real)
        yi = b.tensor("y", out_shape, np.float32)
        version = {"CONV_2D": 5, "DEPTHWISE_CONV_2D": 6, "FULLY_CONNECTED": 12}[name] if hybrid else 1
        b.op(name, [xi, wi, b.const("b", bias)], [yi], version=version, fused_activation_function="NONE", **opts)
        b.output(yi)
        return b.build()

    return build(True), x, build(False)


@pytest.mark.parametrize("op", ["CONV_2D", "CONV_2D_1x1", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"])
def test_hybrid_ops(rng, op, path):
    """CPU: LiteRT's hybrid arithmetic (inputs quantized per row / image, integer products), within float
    rounding. GPU float view: float inputs times the dequantized weights plus the bias, as TFLite's GPU
    delegate computes it: checked against LiteRT running that float arithmetic (the same op with the
    dequantized weights stored as float), at the float tolerance of the path (a dropped bias fails it)."""
    from tflgpu import Interpreter

    model, x, float_model = _hybrid_case(rng, op)
    if path is None:
        want = run_model(litert(), model, [x])[0]
        got = run_model(Interpreter, model, [x])[0]
        assert_close(got, want, 1e-5, what=op)
        return
    it = Interpreter(model_content=model, delegate=path)
    assert it.gpu_plan.cpu_op_count == 0
    got = run_model(lambda **kw: it, model, [x])[0]
    want = run_model(litert(), float_model, [x])[0]
    (assert_fp16_close if path.wants_fp16() else assert_close)(got, want, what=op)


def _check_hybrid(build, x: np.ndarray, path) -> None:
    """``build(True)``, a model with int8 weights, on ``path``: on the CPU within float rounding of LiteRT's hybrid
    arithmetic; through a GpuDelegate's float view, against LiteRT on ``build(False)`` (the weights dequantized)."""
    from tflgpu import Interpreter

    model = build(True)
    if path is None:
        assert_close(run_model(Interpreter, model, [x])[0], run_model(litert(), model, [x])[0], 1e-5)
        return
    got = run_model(lambda **kw: Interpreter(model_content=model, delegate=path), model, [x])[0]
    want = run_model(litert(), build(False), [x])[0]
    (assert_fp16_close if path.wants_fp16() else assert_close)(got, want)


@pytest.mark.parametrize("shapes", [((2, 3, 24), (24, 7), False, False), ((2, 3, 24), (7, 24), False, True),
                                    ((2, 24, 3), (2, 24, 7), True, False), ((5, 24), (24, 7), False, False)],
                         ids=["2d-weights", "adj_y", "adj_x-batched", "rank2"])
def test_hybrid_batch_matmul(rng, shapes, path):
    """BATCH_MATMUL of a float x by constant int8 weights (a dynamic-range transformer's): on the CPU, LiteRT's
    arithmetic (XNNPACK's rows quantized, integer products), within float rounding; it multiplied by the raw
    int8 values before (outputs 50x too large). GPU float view: against LiteRT on the dequantized weights."""
    from tflgpu.model.builder import ModelBuilder

    x_shape, w_shape, adj_x, adj_y = shapes
    w = rng.integers(-127, 128, w_shape).astype(np.int8)
    scale = np.float32(0.013)
    x = rng.normal(0, 1, x_shape).astype(np.float32)
    out_shape = np.matmul(np.swapaxes(x, -1, -2) if adj_x else x,
                          np.swapaxes(w, -1, -2) if adj_y else w.astype(np.float32)).shape

    def build(hybrid: bool) -> bytes:
        b = ModelBuilder()
        xi = b.input("x", x_shape)
        wi = (b.const("w", w, quant={"scale": np.float32([scale]), "zero_point": np.int64([0])}) if hybrid
              else b.const("w", w.astype(np.float32) * scale))
        y = b.tensor("y", out_shape)
        b.op("BATCH_MATMUL", [xi, wi], [y], adj_x=adj_x, adj_y=adj_y)
        b.output(y)
        return b.build()

    _check_hybrid(build, x, path)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
@pytest.mark.parametrize("geometry", [("SAME", 2, True, "NONE"), ("VALID", 1, False, "RELU"),
                                      ("SAME", 3, True, "RELU6")], ids=["same-2", "valid-1", "same-3"])
def test_hybrid_transpose_conv(rng, per_channel, geometry, path):
    """TRANSPOSE_CONV of a float input by int8 weights: on the CPU, LiteRT's hybrid kernel (each image quantized
    asymmetrically, products scattered in its order), within float rounding, where dequantized weights were
    some 0.3% of the output's range off. GPU float view: against LiteRT on the dequantized weights."""
    from tflgpu.model.builder import ModelBuilder

    pad, stride, with_bias, act = geometry
    oc, k, ic, h, w_ = 6, 3, 3, 4, 5
    w = rng.integers(-127, 128, (oc, k, k, ic)).astype(np.int8)
    scale = rng.uniform(0.005, 0.02, oc if per_channel else 1).astype(np.float32)
    bias = rng.normal(0, 1, oc).astype(np.float32)
    oh, ow = (h * stride, w_ * stride) if pad == "SAME" else ((h - 1) * stride + k, (w_ - 1) * stride + k)
    x = rng.normal(0, 1, (2, h, w_, ic)).astype(np.float32)

    def build(hybrid: bool) -> bytes:
        b = ModelBuilder()
        xi = b.input("x", x.shape)
        wi = (b.const("w", w, quant={"scale": scale, "zero_point": np.zeros(len(scale), np.int64),
                                     "quantized_dimension": 0}) if hybrid
              else b.const("w", w.astype(np.float32) * scale.reshape(-1, 1, 1, 1)))
        y = b.tensor("y", (2, oh, ow, oc))
        ins = [b.const("shape", np.array([2, oh, ow, oc], np.int32)), wi, xi]
        b.op("TRANSPOSE_CONV", ins + ([b.const("b", bias)] if with_bias else []), [y], padding=pad, stride_h=stride,
             stride_w=stride, fused_activation_function=act, version=4 if with_bias else 3)
        b.output(y)
        return b.build()

    _check_hybrid(build, x, path)


# -- the corpus' quantized models, on every path --------------------------------------------------

def _run_path(path_delegate, model_path, x):
    from tflgpu import GpuDelegate, Interpreter

    if path_delegate is None:
        return run_model(Interpreter, model_path, [x])[0], None
    # (a corpus model's plan through the session's cache: the one another test built, where it ran first)
    it = Interpreter(str(model_path), delegate=GpuDelegate(precision_loss_allowed=path_delegate.wants_fp16()))
    return run_model(lambda **kw: it, model_path, [x])[0], it.gpu_plan


def test_mobilenet_v2_int8_every_path(path):
    """int8 MobileNet v2: top-1 equals LiteRT's on every path; the CPU integer kernels give LiteRT's
    output exactly; the float view (every op on the device) stays within 1 output step (1/256), as the
    README says."""
    model_path = corpus_model("mobilenet_v2_1.0_224_int8.tflite")
    x = _corpus_input(model_path)
    want = run_model(litert(), model_path, [x])[0]
    got, plan = _run_path(path, model_path, x)
    assert got.argmax() == want.argmax()
    steps = float(np.abs(got - want).max()) * 256
    if plan is None:
        assert steps == 0.0
    else:
        assert plan.cpu_op_count == 0
        assert steps <= 1.0 + 1e-4, f"{steps} output steps from LiteRT"


def _composites(steps) -> dict[str, int]:
    """How many steps of each merged op (graph.passes) a plan's device steps hold."""
    return dict(collections.Counter(s.op.name for s in steps if s.op.name.startswith("TFLGPU_")))


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-target", "gpu-target"])
def test_mobilenet_v2_int8_takes_the_float_models_blocks(gpu):
    """The float view's QUANT_SIM after a block's first conv (the depthwise conv, a v2 block's expansion, the head's
    MEAN) does not keep the block apart: the int8 model's plan merges what the float model's does, each merged op
    holding its simulator (graph.passes.BETWEEN), and the SOFTMAX takes its own as a fused op: so it launches no
    more kernels than the float plan but, on a CPU device, the input's QUANTIZE (on a GPU the stem conv's prologue)
    and the MEAN's simulator (on a GPU the head is merged)."""
    from tflgpu.graph.passes import BETWEEN, PROLOGUE
    from tflgpu.kernels.base import Target

    from .conftest import selected_steps

    target = Target(float_lanes=1, gpu=True) if gpu else Target(float_lanes=16, gpu=False)
    float_steps = selected_steps(corpus_model("mobilenet_v2_1.0_224.tflite"), target).steps
    int8_steps = selected_steps(corpus_model("mobilenet_v2_1.0_224_int8.tflite"), target).steps
    merged = _composites(float_steps)
    if gpu:  # (the int8 model's expansions keep their simulator after them: fuse_expansions leaves them apart)
        expands = merged.pop("TFLGPU_SEPARABLE_EXPAND")
        merged["TFLGPU_SEPARABLE_CONV"] += expands
    assert _composites(int8_steps) == merged
    assert all(s.op.options[BETWEEN] and {f.op.name for f in s.op.options[BETWEEN]} == {"QUANT_SIM"}
               for s in int8_steps if s.op.name.startswith("TFLGPU_"))
    alone = [s.members[0][0].inputs[0] for s in int8_steps if s.op.name == "QUANT_SIM"]
    producers = {t: s.op.name for s in int8_steps for op, _ in s.members for t in op.outputs}
    # (on a GPU the input's QUANTIZE is the stem conv's prologue: graph.passes.fuse_input_prologue)
    assert sorted(producers.get(t, "graph input") for t in alone) == ([] if gpu else ["MEAN", "graph input"])
    prologues = [s for s in int8_steps if s.op.options.get(PROLOGUE)]
    assert [(s.op.name, s.op.inputs[0], [f.op.name for f in s.op.options[PROLOGUE]]) for s in prologues] == \
        ([("CONV_2D", int8_steps[0].members[0][0].inputs[0], ["QUANT_SIM"])] if gpu else [])
    launches = lambda steps: sum(len(s.specs) for s in steps)
    assert launches(int8_steps) == launches(float_steps) + len(alone)


@pytest.mark.parametrize("fp16", [pytest.param(False, id="fp32"), pytest.param(True, id="fp16")])
def test_mobilenet_v2_int8_fused_blocks_under_a_gpus_target(opencl_device, monkeypatch, fp16):
    """Under a GPU's target, with every merged block fused (the expansions with their depthwise convs, the head), the
    int8 model's simulators inside those kernels keep its output within 1 step of LiteRT's, top-1 equal."""
    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.graph.passes import EXPAND_DEPTHWISE, POOLED_DENSE
    from tflgpu.kernels.base import Target
    from tflgpu.runtime.upgrades import retune_steps

    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
    model_path = corpus_model("mobilenet_v2_1.0_224_int8.tflite")
    x = _corpus_input(model_path)
    want = run_model(litert(), model_path, [x])[0]
    it = Interpreter(str(model_path), delegate=GpuDelegate(cache=False, tuning_db=False, tuning="none",
                                                           precision_loss_allowed=fp16, tiered_compile=False))
    plan = it.gpu_plan
    start = plan.launch_count()
    for name, count in ((EXPAND_DEPTHWISE, 6), (POOLED_DENSE, 1)):
        blocks = [s.op.index for s in plan.steps if s.op.name == name]
        assert len(blocks) == count
        retune_steps(plan, blocks, {"fused": True}, name)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()  # (installs them)
    it.invoke()
    got = it.get_tensor(it.get_output_details()[0]["index"])
    assert plan.launch_count() == start - 6 and plan.cpu_op_count == 0  # (the head starts fused)
    assert got.argmax() == want.argmax()
    steps = float(np.abs(got.astype(np.float64) - want).max()) * 256
    assert steps <= 1.0 + 1e-4, f"{steps} output steps from LiteRT"


def test_mobilenet_v2_dynrange_hybrid_ops_equal_litert_op_by_op():
    """Each op of the dynamic-range model, fed LiteRT's own input for it, gives LiteRT's output within float
    rounding (the hybrid ops quantize their input exactly as LiteRT does)."""
    from tflgpu import Interpreter
    from tflgpu.model.reader import read_model

    model_path = corpus_model("mobilenet_v2_1.0_224_dynrange.tflite")
    x = _corpus_input(model_path)
    with warnings.catch_warnings():  # (LiteRT warns that keeping every tensor is for debugging: it is)
        warnings.simplefilter("ignore")
        ref = litert()(model_path=str(model_path), experimental_preserve_all_tensors=True)
    ref.allocate_tensors()
    ref.set_tensor(ref.get_input_details()[0]["index"], x)
    ref.invoke()
    runner = Interpreter(str(model_path)).cpu_runner()
    sg = read_model(str(model_path)).subgraphs[0]
    hybrid = 0
    for op, fn in runner.steps:
        ins = [runner.consts.get(i) if i in runner.consts else ref.get_tensor(i) if i >= 0 else None
               for i in op.inputs]
        want = ref.get_tensor(op.outputs[0])
        got = fn(ins)[0]
        hybrid += sg.tensors[op.inputs[1]].dtype == np.int8 if len(op.inputs) > 1 else 0
        assert np.abs(got - want).max() <= 1e-6 * max(1.0, float(np.abs(want).max())), (op.index, op.name)
    assert hybrid >= 40


def test_mobilenet_v2_dynrange_every_path(path):
    """Dynamic-range MobileNet v2 end to end: top-1 equals LiteRT's on every path and the probabilities
    are within 0.01 (on the CPU, float-rounding differences can flip single levels of a hybrid op's input
    quantization; the float view does not quantize activations at all, as TFLite's GPU delegate)."""
    model_path = corpus_model("mobilenet_v2_1.0_224_dynrange.tflite")
    x = _corpus_input(model_path)
    want = run_model(litert(), model_path, [x])[0]
    got, plan = _run_path(path, model_path, x)
    assert got.argmax() == want.argmax()
    err = float(np.abs(got - want).max())
    assert err <= 0.01, err
    if plan is not None:
        assert plan.cpu_op_count == 0


def test_quantized_models_allowed_false_keeps_integer_kernels(opencl_device):
    """TFLite's ENABLE_QUANT off: quantized ops are not delegated (they run on the CPU integer kernels,
    with the usual warning), and the output is the CPU path's."""
    from tflgpu import GpuDelegate, Interpreter

    model_path = corpus_model("mobilenet_v2_1.0_224_int8.tflite")
    x = _corpus_input(model_path)
    it = Interpreter(str(model_path), delegate=GpuDelegate(quantized_models_allowed=False, cache=False))
    assert it.gpu_plan is None or it.gpu_plan.gpu_op_count == 0
    got = run_model(lambda **kw: it, model_path, [x])[0]
    np.testing.assert_array_equal(got, run_model(Interpreter, model_path, [x])[0])


def test_op_without_float_view_stays_on_integer_kernels(rng, opencl_device, caplog):
    """CAST of quantized values reads the raw integers: under the float view it keeps its integer kernel
    on the CPU (after a QUANTIZE of its operand), with TFLite's warning; the ADD before it runs on
    the device; the results are within one step of LiteRT's."""
    import logging

    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.model.builder import ModelBuilder

    b = ModelBuilder()
    q = {"scale": np.float32([0.05]), "zero_point": np.int64([3])}
    x0 = b.input("a", (1, 4, 4, 8), np.int8, quant=q)
    x1 = b.input("b", (1, 4, 4, 8), np.int8, quant={"scale": np.float32([0.07]), "zero_point": np.int64([-5])})
    s = b.tensor("sum", (1, 4, 4, 8), np.int8, quant={"scale": np.float32([0.1]), "zero_point": np.int64([-2])})
    y = b.tensor("y", (1, 4, 4, 8), np.int32)
    b.op("ADD", [x0, x1], [s], version=2, fused_activation_function="NONE")
    b.op("CAST", [s], [y])
    b.output(y, s)
    model = b.build()
    feeds = [rand_q(rng, (1, 4, 4, 8), I8), rand_q(rng, (1, 4, 4, 8), I8)]
    want = run_model(litert(), model, feeds)
    with caplog.at_level(logging.WARNING, logger="tflgpu"):
        it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
    plan = it.gpu_plan
    on_cpu = [op.name for s_ in plan.steps if s_.device == "cpu" for op, _ in s_.members]
    assert "CAST" in on_cpu and "ADD" not in on_cpu, on_cpu
    assert "op code #53 (CAST) cannot be handled by this delegate" in caplog.text
    got = run_model(lambda **kw: it, model, feeds)
    # the ADD's int8 output (float view + simulator) and its CAST: within one step of LiteRT's
    assert np.abs(got[1].astype(int) - want[1]).max() <= 1
    assert np.abs(got[0] - want[0]).max() <= 1


def test_float_view_too_large_falls_back_to_the_integer_kernels(opencl_device, monkeypatch, caplog):
    """A fuzz finding's shape: the float view's tensors are 4x the int8 ones, so a model whose int8 activations
    fit the per-tensor limit can have a float view that does not. The delegate then warns and keeps the integer
    kernels (TFLite's ENABLE_QUANT off), and the result is the CPU path's, bit for bit."""
    import logging

    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.model import reader

    from .qutil import small_quantized_model

    model = small_quantized_model()
    x = np.random.default_rng(5).uniform(-1, 1, (1, 8, 8, 3)).astype(np.float32)
    want = run_model(Interpreter, model, [x])[0]
    monkeypatch.setattr(reader, "DEFAULT_MAX_TENSOR_BYTES", 1024)  # int8 [1,8,8,8]: 512 bytes; float: 2048
    with caplog.at_level(logging.WARNING, logger="tflgpu"):
        it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
        it.allocate_tensors()
    assert "the float view of this quantized model cannot run on these inputs" in caplog.text
    assert "exceeds 1024 bytes" in caplog.text
    assert it.gpu_plan is not None and it.gpu_plan.gpu_op_count == 0  # (with the float view: every op)
    np.testing.assert_array_equal(run_model(lambda **kw: it, model, [x])[0], want)


def test_small_quantized_model_on_every_path(path):
    """A converter-shaped int8 model (the fuzz test's quantized seed): within one output step of LiteRT."""
    from tflgpu import Interpreter

    from .qutil import small_quantized_model

    model = small_quantized_model()
    x = np.random.default_rng(5).uniform(-1, 1, (1, 8, 8, 3)).astype(np.float32)
    want = run_model(litert(), model, [x])[0]
    if path is None:
        got = run_model(Interpreter, model, [x])[0]
    else:
        it = Interpreter(model_content=model, delegate=path)
        assert it.gpu_plan.cpu_op_count == 0
        got = run_model(lambda **kw: it, model, [x])[0]
    assert np.abs(got - want).max() <= 1 / 256 + 1e-7


@pytest.mark.parametrize("op", ["ADD", "MUL"])
def test_large_binary_ops_compute_in_blocks(rng, op, monkeypatch):
    """Blocks of a large quantized ADD/MUL (broadcast included) give the one-call result, LiteRT's: a fuzz
    finding needed over 8 GB of int64 temporaries at once for a 268M-element ADD."""
    from tflgpu.cpu import quantized

    monkeypatch.setattr(quantized, "BLOCK_ELEMENTS", 50)  # many blocks, over two axes
    a = QIn(rand_q(rng, (2, 9, 7, 6), I8), Q(0.05, 3))
    b = QIn(rand_q(rng, (1, 9, 1, 6), I8), Q(0.07, -2))
    check_qop(None, op, [a, b], [QOut((2, 9, 7, 6), I8, Q(0.11, 1))], version=2, fused_activation_function="NONE")


def test_conv_im2col_in_blocks(rng, monkeypatch):
    """The CPU convolutions build their column matrix a block of output rows at a time (bounded temporaries
    for a large input): many blocks give LiteRT's result, float and int8."""
    from tflgpu.cpu import conv

    from .oputil import In, check_op, rand

    monkeypatch.setattr(conv, "IM2COL_BLOCK_BYTES", 4096)
    check_op("CONV_2D", [In(rand(rng, (2, 13, 11, 5))), rand(rng, (7, 3, 3, 5)), rand(rng, (7,))],
             padding="SAME", stride_w=1, stride_h=2, dilation_w_factor=1, dilation_h_factor=1,
             fused_activation_function="RELU")
    ins, out = _conv_case(rng, I8, True)
    check_qop(None, "CONV_2D", ins, [out], version=3, padding="SAME", stride_h=1, stride_w=1,
              fused_activation_function="NONE")


def _qd8_reference(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """XNNPACK's qd8 row quantization as numpy expressions (what the CPU kernels ran before the numba pass)."""
    rows = rows.astype(np.float32)
    rmin = np.minimum(rows.min(axis=1, initial=0), 0).astype(np.float32)
    rmax = np.maximum(rows.max(axis=1, initial=0), 0).astype(np.float32)
    inv = np.where(rmin == rmax, np.float32(1), np.float32(255) / (rmax - rmin)).astype(np.float32)
    rmin_s, rmax_s = rmin * inv, rmax * inv
    zp = np.where((np.float32(-128) + rmin_s) + (np.float32(127) + rmax_s) > 0, np.float32(-128) - rmin_s,
                  np.float32(127) - rmax_s)
    zp = np.rint(np.clip(zp, -128, 127)).astype(np.float32)[:, None]
    v = rows * inv[:, None]
    np.clip(v, np.float32(-128) - zp, np.float32(127) - zp, out=v)
    return np.rint(v, out=v), np.float32(1) / inv


def test_qd8_row_quantization_kernel_is_the_numpy_reference():
    """The numba pass (quantize_rows_qd8) is XNNPACK's qd8 as the numpy reference writes it, bit for bit,
    including rows of one sign, zeros, tiny ranges, a NaN and infinities."""
    from tflgpu.cpu.hybrid import quantize_rows_qd8

    rng = np.random.default_rng(11)
    for scale in (1.0, 1e-3, 1e3, 1e-30):
        x = (rng.standard_normal((300, 37)) * scale).astype(np.float32)
        x[3], x[4], x[5] = np.abs(x[3]), -np.abs(x[4]), 0
        x[6, 2], x[7, 1], x[8, 3], x[9] = np.nan, np.inf, -np.inf, np.inf
        with np.errstate(all="ignore"):
            want_q, want_s = _qd8_reference(x)
        got_q, got_s = quantize_rows_qd8(x)
        assert np.array_equal(got_q, want_q, equal_nan=True) and np.array_equal(got_s, want_s, equal_nan=True)


@pytest.mark.parametrize("geometry", [(3, 3, 1, 1, 1, "SAME"), (3, 3, 2, 2, 2, "SAME"), (5, 3, 1, 2, 1, "VALID")])
@pytest.mark.parametrize("xdtype", [np.int8, np.uint8])
def test_fused_integer_depthwise_is_the_sums_then_the_requantization(geometry, xdtype):
    """The integer depthwise kernel (offset on the fly, requantized per pixel) gives exactly what int32 sums of
    the offset input and XNNPACK's fp32 requantization give, channel multipliers and padding included."""
    from tflgpu.cpu.conv import _depthwise
    from tflgpu.cpu.quantized import INT32_MAX, INT32_MIN, _depthwise_requantize, requantize_fp32
    from tflgpu.ops.attributes import conv_padding

    kh, kw, sh, sw, mult, pad = geometry
    rng = np.random.default_rng(kh + sh + mult)
    info = np.iinfo(xdtype)
    x = rng.integers(info.min, info.max, (2, 15, 13, 6), endpoint=True).astype(xdtype)
    xz = np.int32(rng.integers(info.min // 2, info.max // 2))
    w = rng.integers(-127, 127, (1, kh, kw, 6 * mult), endpoint=True).astype(np.int32)
    bias = rng.integers(-3000, 3000, 6 * mult).astype(np.int32)
    scale = rng.uniform(1e-3, 1e-2, 6 * mult).astype(np.float32)
    oz, lo, hi = -4, info.min + 3, info.max - 2
    code = 0 if pad == "SAME" else 1
    oh, pt = conv_padding(15, kh, sh, 1, code)
    ow, pl = conv_padding(13, kw, sw, 1, code)
    out = np.empty((2, oh, ow, 6 * mult), xdtype)
    got = _depthwise_requantize(x, xz, w, bias, scale, oz, lo, hi, sh, sw, 1, 1, pt, pl, oh, ow, mult, out)
    acc = _depthwise(np.ascontiguousarray(x.astype(np.int32) - xz), w, bias, sh, sw, 1, 1, pt, pl, oh, ow, mult,
                     INT32_MIN, INT32_MAX)
    want = requantize_fp32(acc, np.zeros(6 * mult, np.int32), scale, oz, lo, hi, xdtype)
    assert np.unique(got).size > 20
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("geometry", [(1, 1, "SAME"), (2, 1, "SAME"), (1, 2, "VALID"), (2, 3, "SAME")])
@pytest.mark.parametrize("xdtype", [np.int8, np.uint8, np.int16])
def test_integer_depthwise_3x3_is_the_general_kernel(geometry, xdtype):
    """The 3x3 integer depthwise kernel (interior pixels in one int32 pass over the taps) gives exactly what the
    general one gives: strides, dilations, paddings, two images, 8- and 16-bit activations, a narrow clamp."""
    from tflgpu.cpu.quantized import _depthwise3x3_requantize, _depthwise_requantize
    from tflgpu.ops.attributes import conv_padding

    stride, dil, pad = geometry
    rng = np.random.default_rng(stride + 10 * dil)
    info = np.iinfo(xdtype)
    x = rng.integers(info.min, info.max, (2, 14, 11, 24), endpoint=True).astype(xdtype)
    xz = np.int32(rng.integers(info.min // 2, info.max // 2))
    w = rng.integers(-127, 127, (1, 3, 3, 24), endpoint=True).astype(np.int32)
    bias = rng.integers(-3000, 3000, 24).astype(np.int32)
    scale = rng.uniform(1e-3, 1e-2, 24).astype(np.float32) / (256 if xdtype == np.int16 else 1)
    oz, lo, hi = -4, info.min + 3, info.max - 2
    code = 0 if pad == "SAME" else 1
    oh, pt = conv_padding(14, 3, stride, dil, code)
    ow, pl = conv_padding(11, 3, stride, dil, code)
    want = _depthwise_requantize(x, xz, w, bias, scale, oz, lo, hi, stride, stride, dil, dil, pt, pl, oh, ow, 1,
                                 np.empty((2, oh, ow, 24), xdtype))
    got = _depthwise3x3_requantize(x, xz, np.ascontiguousarray(w[0]), bias, scale, oz, lo, hi, stride, stride, dil,
                                   dil, pt, pl, oh, ow, np.empty((2, oh, ow, 24), xdtype))
    assert np.unique(got).size > 20
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("xdtype", [np.int8, np.uint8, np.int16])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_few_row_integer_product_is_the_sums_then_the_requantization(xdtype, rows):
    """The few-row integer FULLY_CONNECTED (int32 dot products of the offset input and the offset weights,
    requantized at once) gives exactly what the exact float64 product and XNNPACK's fp32 requantization give."""
    from tflgpu.cpu.quantized import _rows_requantize, requantize_fp32

    rng = np.random.default_rng(rows)
    info = np.iinfo(xdtype)
    x = rng.integers(info.min, info.max, (rows, 301), endpoint=True).astype(xdtype)
    xz = np.int32(0 if xdtype == np.int16 else rng.integers(info.min // 2, info.max // 2))
    w = rng.integers(-255 if xdtype == np.uint8 else -127, 127, (37, 301), endpoint=True).astype(np.int16)
    bias = rng.integers(-30000, 30000, 37).astype(np.int64)
    scale = rng.uniform(1e-5, 1e-4, 37).astype(np.float32) / (256 if xdtype == np.int16 else 1)
    oz, lo, hi = -4 if xdtype != np.uint8 else 128, info.min + 3, info.max - 2
    got = _rows_requantize(x, xz, w, bias, scale, oz, lo, hi, np.empty((rows, 37), xdtype))
    acc = (x.astype(np.float64) - xz) @ w.T.astype(np.float64)
    want = requantize_fp32(acc, bias.astype(np.float64), scale, oz, lo, hi, xdtype)
    assert np.unique(got).size > 10
    np.testing.assert_array_equal(got, want)


def _tflite_grid(x, scale, zp, qmin, qmax, clamp=None):
    """TFLite's form of a float view's simulator, step by step in float32: the activation's clamp, then
    ``(clamp(rint(x / scale) + zp, qmin, qmax) - zp) * scale``."""
    x = np.asarray(x, np.float32)
    if clamp is not None:
        x = np.minimum(np.maximum(x, np.float32(clamp[0])), np.float32(clamp[1]))
    inv = np.float32(1.0) / np.float32(scale)
    q = np.minimum(np.maximum(np.rint(x * inv) + np.float32(zp), np.float32(qmin)), np.float32(qmax))
    return ((q - np.float32(zp)) * np.float32(scale)).astype(np.float32)


_GRIDS = [(0.0235, -128, -128, 127), (0.0235, 0, -128, 127), (0.05, 5, -128, 127), (0.1, 128, 0, 255),
          (0.002, 0, -32768, 32767), (0.0078125, 127, -128, 127)]
_CLAMPS = [None, (0.0, np.inf), (0.0, 6.0), (-1.0, 1.0)]


def _grid_inputs(scale, rng) -> np.ndarray:
    """Values at and beside the grid's rounding edges (k + 0.5 steps, one float either side), zeros of both signs,
    values far outside every clamp, and random ones."""
    k = np.arange(-300, 300, dtype=np.float32)
    edges = (k + np.float32(0.5)) * np.float32(scale)
    near = np.concatenate([edges, np.nextafter(edges, np.float32(np.inf)), np.nextafter(edges, -np.float32(np.inf))])
    special = np.array([0.0, -0.0, 1e-30, -1e-30, 6.0, -1.0, 1.0, 7.0, 1e6, -1e6, 0.49 * scale, -0.49 * scale],
                       np.float32)
    return np.concatenate([near, special, rng.normal(0, 3, 2000).astype(np.float32)])


@pytest.mark.parametrize("clamp", _CLAMPS, ids=["none", "relu", "relu6", "relu_n1_to_1"])
def test_simulator_grid_is_tflites_rounding_bit_for_bit(rng, opencl_device, clamp):
    """The simulator's five-step form (ops.quantization.SimGrid), with an activation's clamp taken over or none,
    gives TFLite's rounding bit for bit, the sign of a zero included, on the CPU (its kernel) and in the OpenCL
    expression the kernels' stores apply, at every grid's rounding edges: an activation clamped after the grid's
    bounds, a zero point left in, or a rounding to -0.0 would each differ."""
    from tflgpu.graph.float_view import sim_grid, sim_options
    from tflgpu.kernels.expressions import unary_expr
    from tflgpu.model.ir import Operator
    from tflgpu.ops.quantization import QParams
    from tflgpu.runtime.device import import_pyopencl

    cl = import_pyopencl()
    ctx = cl.Context([opencl_device.cl_device])
    queue = cl.CommandQueue(ctx)
    for scale, zp, qmin, qmax in _GRIDS:
        dtype = np.int16 if qmax > 255 else (np.uint8 if qmin == 0 else np.int8)
        p = QParams(np.array([scale], np.float32), np.array([zp]), 0, np.dtype(dtype))
        op = Operator(0, "QUANT_SIM", -1, 1, (0,), (1,), options=sim_options(p, clamp=clamp))
        x = _grid_inputs(scale, rng)
        x = np.concatenate([x, np.zeros((-len(x)) % 4, np.float32)])
        want = _tflite_grid(x, scale, zp, qmin, qmax, clamp)
        expr = unary_expr(op)
        src = f"__kernel void k(__global const float4* s, __global float4* d) {{ int i = get_global_id(0); " \
              f"float4 v = s[i]; d[i] = {expr}; }}"
        prog = cl.Program(ctx, src).build(["-cl-mad-enable"])
        mf = cl.mem_flags
        src_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
        dst_buf = cl.Buffer(ctx, mf.WRITE_ONLY, x.nbytes)
        prog.k(queue, (len(x) // 4,), None, src_buf, dst_buf)
        got = np.empty_like(x)
        cl.enqueue_copy(queue, got, dst_buf)
        cpu = sim_grid(op.options).apply(x)  # (what the CPU kernel of QUANT_SIM returns)
        for name, out in (("OpenCL", got), ("CPU", cpu)):
            bad = np.flatnonzero(out.view(np.int32) != want.view(np.int32))
            assert bad.size == 0, (f"{name}, grid {(scale, zp, qmin, qmax)}, clamp {clamp}: x={x[bad[:4]]} gave "
                                   f"{out[bad[:4]]}, TFLite's form {want[bad[:4]]}")


def test_float_view_moves_a_clamping_activation_into_the_simulator():
    """A quantized op's RELU-family activation leaves the op for the simulator after it (its kernel's store clamps
    once), where the op clamps its output and its one output is quantized; a TANH-coded LSTM's or an op of two
    outputs keeps its own."""
    from tflgpu.graph.float_view import float_view
    from tflgpu.model.reader import read_model

    sg = read_model(str(corpus_model("mobilenet_v2_1.0_224_int8.tflite"))).subgraphs[0]
    view = float_view(sg).sg
    by_output = {t: op for op in view.operators for t in op.outputs}
    moved = 0
    for op in view.operators:
        if op.name != "QUANT_SIM" or "clamp" not in op.options:
            continue
        producer = by_output[op.inputs[0]]
        assert producer.name in ("CONV_2D", "DEPTHWISE_CONV_2D") and \
            producer.options.get("fused_activation_function", 0) == 0
        assert op.options["clamp"] == (0.0, 6.0)
        moved += 1
    original = sum(op.options.get("fused_activation_function", 0) == 3 for op in sg.operators)
    assert moved == original > 30


def test_input_quantize_as_the_first_convs_prologue(opencl_device, monkeypatch):
    """Under a GPU's target, a float input's QUANTIZE read only by a conv is that conv's prologue (no launch of its
    own): the conv rounds each input value it loads to the input's grid, so its output is LiteRT's within 1 step
    for inputs far off that grid (a conv reading them unrounded is tens of steps off). (FP32: in an FP16 plan the
    conv's half weights move 3 of the 648 sums of these large inputs across the output grid's edges, with or
    without the prologue; the conv reads the dense float32 input either way.)"""
    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.graph.passes import PROLOGUE
    from tflgpu.kernels.base import Target
    from tflgpu.model.builder import ModelBuilder

    from .qutil import steps_apart

    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
    rng = np.random.default_rng(7)
    b = ModelBuilder()
    x = b.input("x", (1, 17, 17, 3), np.float32)
    xq = b.tensor("xq", (1, 17, 17, 3), np.int8, quant={"scale": np.float32([0.25]), "zero_point": np.int64([3])})
    b.op("QUANTIZE", [x], [xq])
    s = rng.uniform(0.01, 0.03, 8).astype(np.float32)
    w = b.const("w", rng.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8),
                quant={"scale": s, "zero_point": np.zeros(8, np.int64), "quantized_dimension": 0})
    bias = b.const("b", rng.integers(-50, 50, 8).astype(np.int32),
                   quant={"scale": 0.25 * s, "zero_point": np.zeros(8, np.int64)})
    c = b.tensor("c", (1, 9, 9, 8), np.int8, quant={"scale": np.float32([0.02]), "zero_point": np.int64([-128])})
    b.op("CONV_2D", [xq, w, bias], [c], version=3, padding="SAME", stride_h=2, stride_w=2,
         fused_activation_function="RELU6")
    y = b.tensor("y", (1, 9, 9, 8), np.float32)
    b.op("DEQUANTIZE", [c], [y], version=2)
    b.output(y)
    model = b.build()
    inputs = [(rng.normal(0, 4, (1, 17, 17, 3)) + 0.37).astype(np.float32)]
    want = run_model(litert(), model, inputs)[0]
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False, tuning="none",
                                                               tiered_compile=False))
    plan = it.gpu_plan
    assert [(s.op.name, [f.op.name for f in s.op.options.get(PROLOGUE, ())]) for s in plan.steps] == \
        [("CONV_2D", ["QUANT_SIM"])] and plan.launch_count() == 1
    got = run_model(lambda **kw: it, model, inputs)[0]
    assert steps_apart(got, want, 0.02) <= 1.0 + 1e-4
