"""Elementwise ops (with TFLite broadcasting up to rank 5), activations, logic, casts, against LiteRT."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from .oputil import In, Out, both_fail_or_match, check_op, check_special_values, rand


@st.composite
def broadcast_pair(draw, max_rank=4):
    rank = draw(st.integers(1, max_rank))
    base = [draw(st.integers(1, 5)) for _ in range(rank)]
    a = [d if draw(st.booleans()) else 1 for d in base]
    b = [d if draw(st.booleans()) else 1 for d in base]
    b = b[draw(st.integers(0, rank - 1)):]  # drop leading dims: rank-mismatched broadcasting
    return tuple(a), tuple(b)


ARITH = ["ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE"]
FUSED = {"ADD", "SUB", "MUL", "DIV"}


@given(op=st.sampled_from(ARITH), shapes=broadcast_pair(), act=st.sampled_from(["NONE", "RELU", "RELU6"]),
       seed=st.integers(0, 2**16))
def test_binary_broadcast(op, shapes, act, seed):
    rng = np.random.default_rng(seed)
    a, b = rand(rng, shapes[0], -3, 3), rand(rng, shapes[1], -3, 3)
    if op == "DIV":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    opts = {"fused_activation_function": act} if op in FUSED else {}
    check_op(op, [In(a), In(b)], **opts)


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL", "MAXIMUM"])
def test_binary_rank5_broadcast(op, rng):
    both_fail_or_match(op, [In(rand(rng, (2, 1, 3, 1, 4))), In(rand(rng, (1, 2, 1, 5, 1)))])


def test_binary_with_constant_operand(rng):
    check_op("MUL", [In(rand(rng, (1, 4, 4, 3))), rand(rng, (3,))])


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM", "FLOOR_DIV", "FLOOR_MOD"])
def test_binary_int32(op, rng):
    a = rng.integers(-20, 20, (3, 4)).astype(np.int32)
    b = rng.integers(1, 7, (4,)).astype(np.int32) * rng.choice([-1, 1], (4,)).astype(np.int32)
    check_op(op, [In(a), In(b)], [Out(np.int32)])


@pytest.mark.parametrize("op", ["FLOOR_DIV", "FLOOR_MOD", "POW"])
def test_binary_float_misc(op, rng):
    a, b = rand(rng, (2, 5), 0.5, 4), rand(rng, (5,), 0.5, 3)
    check_op(op, [In(a), In(b)])


UNARY = {
    "EXP": (-3, 3), "LOGISTIC": (-8, 8), "TANH": (-4, 4), "RELU": (-2, 2), "RELU6": (-3, 9),
    "RELU_N1_TO_1": (-3, 3), "HARD_SWISH": (-5, 5), "RSQRT": (0.1, 4), "SQRT": (0, 4), "ABS": (-2, 2),
    "NEG": (-2, 2), "LOG": (0.1, 5), "SIN": (-3, 3), "COS": (-3, 3), "SQUARE": (-2, 2), "FLOOR": (-3, 3),
    "CEIL": (-3, 3), "ROUND": (-3, 3), "ELU": (-3, 3), "SIGN": (-2, 2),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op, rng):
    lo, hi = UNARY[op]
    x = rand(rng, (2, 7, 5, 3), lo, hi)
    if op == "ROUND":
        x[0, 0, 0, :] = [0.5, 1.5, -2.5]  # ties go to even
    check_op(op, [In(x)])


@pytest.mark.parametrize("op", ["SIGN", "HARD_SWISH", "ELU", "FLOOR_MOD"])
def test_special_values_as_litert(op):
    """SIGN(NaN) is NaN, HARD_SWISH(3e38) is not infinite ((x / 6) * relu6(x + 3), TFLite's order, its denormals
    too), ELU(-0.0) is -0.0, FLOOR_MOD's zero remainders are +0.0 (fmod's, not np.mod's divisor sign)."""
    check_special_values(op)


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu(approximate, rng):
    check_op("GELU", [In(rand(rng, (3, 17), -4, 4))], approximate=approximate)


def test_leaky_relu(rng):
    check_op("LEAKY_RELU", [In(rand(rng, (2, 8, 3)))], alpha=0.13)


@pytest.mark.parametrize("alpha_shape", [(3,), (1, 1, 3), (4, 5, 3)])
def test_prelu(alpha_shape, rng):
    check_op("PRELU", [In(rand(rng, (1, 4, 5, 3))), rand(rng, alpha_shape)])


@pytest.mark.parametrize("alpha_shape", [(24,), (1, 1, 24), (1,), (40, 70, 24)])
def test_prelu_large_runs_on_every_core(alpha_shape, rng):
    """Past PARALLEL_ELEMENTS a per-channel (or single) alpha takes the numba kernel; a full-shape one numpy's."""
    from tflgpu.cpu.elementwise import PARALLEL_ELEMENTS

    assert 40 * 70 * 24 >= PARALLEL_ELEMENTS
    check_op("PRELU", [In(rand(rng, (1, 40, 70, 24))), rand(rng, alpha_shape)])


@pytest.mark.parametrize("op", ["LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"])
def test_comparisons(op, rng):
    a = rng.integers(-2, 3, (2, 3, 4)).astype(np.float32)
    b = rng.integers(-2, 3, (3, 1)).astype(np.float32)
    check_op(op, [In(a), In(b)], [Out(np.bool_)])


@pytest.mark.parametrize("op", ["LOGICAL_AND", "LOGICAL_OR"])
def test_logical_binary(op, rng):
    check_op(op, [In(rng.random((3, 4)) > 0.5), In(rng.random((4,)) > 0.5)], [Out(np.bool_)])


def test_logical_not(rng):
    check_op("LOGICAL_NOT", [In(rng.random((3, 4)) > 0.5)], [Out(np.bool_)])


def test_select_v2_broadcasts(rng):
    check_op("SELECT_V2", [In(rng.random((2, 1, 4)) > 0.5), In(rand(rng, (2, 3, 4))), In(rand(rng, (4,)))])


def test_select(rng):
    check_op("SELECT", [In(rng.random((2, 3)) > 0.5), In(rand(rng, (2, 3))), In(rand(rng, (2, 3)))])


@pytest.mark.parametrize("src,dst", [(np.float32, np.int32), (np.int32, np.float32), (np.float32, np.bool_),
                                     (np.bool_, np.float32), (np.int32, np.int64), (np.float32, np.uint8)])
def test_cast(src, dst, rng):
    x = rand(rng, (3, 5), -4, 4).astype(src) if src is not np.bool_ else rng.random((3, 5)) > 0.5
    if dst is np.uint8:
        x = np.abs(x)
    check_op("CAST", [In(x)], [Out(dst)])


def test_dequantize_float16_weights(rng):
    w = rand(rng, (4, 6)).astype(np.float16)
    check_op("DEQUANTIZE", [In(w)], [Out(np.float32)])


def test_fp16_weights_feed_conv_through_folded_dequantize(rng):
    """DEQUANTIZE of constant fp16 weights is folded at build time and the conv sees float32 weights."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x = b.input("x", (1, 6, 6, 3))
    w16 = b.const("w16", rand(rng, (5, 3, 3, 3)).astype(np.float16))
    w = b.tensor("w", (5, 3, 3, 3))
    b.op("DEQUANTIZE", [w16], [w])
    bias = b.const("bias", rand(rng, (5,)))
    y = b.tensor("y", (1, 6, 6, 5))
    b.op("CONV_2D", [x, w, bias], [y], padding="SAME", stride_w=1, stride_h=1)
    b.output(y)
    model = b.build()
    xs = [rand(rng, (1, 6, 6, 3))]
    assert_close(run_model(Interpreter, model, xs)[0], run_model(litert(), model, xs)[0])
    it = Interpreter(model_content=model)
    assert [op.name for op, _ in it.cpu_runner().steps] == ["CONV_2D"]


def test_quantize_float_to_int8(rng):
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import litert, run_model

    b = ModelBuilder()
    x = b.input("x", (4, 9))
    y = b.tensor("y", (4, 9), np.int8, quant={"scale": 0.02, "zero_point": -3})
    b.op("QUANTIZE", [x], [y])
    b.output(y)
    xs = [rand(rng, (4, 9), -3, 3)]
    xs[0][0, :4] = [0.01, 0.03, -0.05, 0.07]  # exact ties at the rounding boundary
    np.testing.assert_array_equal(run_model(Interpreter, b.build(), xs)[0], run_model(litert(), b.build(), xs)[0])


def test_int8_dequantize_per_channel(rng):
    q = rng.integers(-127, 128, (3, 4)).astype(np.int8)
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x = b.input("x", (3, 4), np.int8, quant={"scale": [0.1, 0.2, 0.05], "zero_point": [0, 0, 0],
                                              "quantized_dimension": 0})
    y = b.tensor("y", (3, 4))
    b.op("DEQUANTIZE", [x], [y])
    b.output(y)
    assert_close(run_model(Interpreter, b.build(), [q])[0], run_model(litert(), b.build(), [q])[0])


def test_unbroadcastable_shapes_raise_runtime_error(rng):
    assert both_fail_or_match("ADD", [In(rand(rng, (2, 3))), In(rand(rng, (4, 3)))]) == "both rejected"


SIGNED = np.array([-0.0, 0.0, -1.5, np.nan, 2.0, 7.0, -np.inf, np.inf], np.float32).reshape(1, 1, 2, 4)
OTHER = np.array([0.0, -0.0, np.nan, 1.0, np.nan, -0.0, 0.0, 3.0], np.float32).reshape(1, 1, 2, 4)


def _same_bits_but_nans(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Equal values, equal signs of zero and NaN in the same places."""
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: NaNs {got} against {want}"
    fin = ~np.isnan(want)
    assert np.array_equal(got[fin], want[fin]) and np.array_equal(np.signbit(got[fin]), np.signbit(want[fin])), \
        f"{what}: {got.ravel()} against {want.ravel()}"


@pytest.mark.parametrize("path", ["cpu", "device", "gpu-shaped"])
@pytest.mark.parametrize("op,ins,act", [
    ("RELU", [In(SIGNED)], 0), ("RELU6", [In(SIGNED)], 0), ("RELU_N1_TO_1", [In(SIGNED)], 0),
    ("MAXIMUM", [In(SIGNED), In(OTHER)], 0), ("MINIMUM", [In(SIGNED), In(OTHER)], 0),
    ("DIV", [In(SIGNED), np.full((1, 1, 1, 4), -2.0, np.float32)], 3),
    ("DIV", [In(SIGNED), np.full((1, 1, 1, 4), -2.0, np.float32)], 2)])
def test_clamps_and_extremes_keep_tflites_zeros_and_nans(opencl_device, monkeypatch, path, op, ins, act):
    """TFLite clamps as min(max(x, lo), hi) with max(a, b) = a < b ? b : a (ops.attributes.activation_bounds), and
    takes MAXIMUM / MINIMUM as a > b ? a : b: -0.0 stays -0.0 above a bound of 0 (a division by it then gives -inf:
    the offline fuzz's seed 41125, a DIV by a RELU6'd DIV's -0.0 whose sign OpenCL's clamp had dropped, off by 2),
    NaN passes a clamp, and MAXIMUM(NaN, 1) is 1. Every path gives LiteRT's builtin kernels' bits (XNNPACK agrees on
    these), zeros' signs and NaNs' places included."""
    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.kernels.base import Target

    from .conftest import run_model
    from .oputil import op_model, run_litert

    if path == "gpu-shaped":
        monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
    model, feeds = op_model(op, ins, [Out(shape=(1, 1, 2, 4))], **({"fused_activation_function": act} if act else {}))
    want = run_litert(model, feeds, builtin_only=True)[0]
    it = Interpreter(model_content=model, delegate=None if path == "cpu" else GpuDelegate(cache=False))
    if path != "cpu":
        assert it.gpu_plan is not None and it.gpu_plan.cpu_op_count == 0
    _same_bits_but_nans(run_model(lambda **kw: it, model, feeds)[0], want, f"{op} on {path}")


@pytest.mark.parametrize("size", [40, 8_000, 70_000], ids=["numpy", "one-core", "both-cores"])
@pytest.mark.parametrize("op,operand,act", [
    ("MAXIMUM", "second", 0), ("MINIMUM", "first", 0), ("MAXIMUM", None, 0), ("LEAKY_RELU", None, 0),
    ("RELU", None, 0), ("RELU6", None, 0), ("RELU_N1_TO_1", None, 0), ("ADD", None, 3), ("SUB", None, 1),
    ("MUL", None, 2), ("ADD", None, 0), ("MUL", "channel", 0), ("SUB", "channel-first", 1), ("ADD", "second", 3),
    ("MINIMUM", "channel", 0), ("PRELU", "channel", 0)])
def test_one_pass_elementwise_keeps_tflites_bits(rng, size, op, operand, act):
    """The CPU kernels' one-pass float32 elementwise forms, serial and split between the cores (either side of
    ``PARALLEL_ELEMENTS``), and numpy's below ``NUMBA_ELEMENTS``, give LiteRT's builtin kernels' bits, zeros' signs and NaNs' places included: MAXIMUM /
    MINIMUM (``a > b ? a : b``) of one shape, a single value or one value per channel against a tensor, either side;
    LEAKY_RELU and PRELU; the RELU clamps; ADD / SUB / MUL with their fused clamps (a clamp passes -0.0 and NaN), of
    one shape, a single value or one value per channel (a gate's scale) against a tensor. (No infinities in a sum:
    LiteRT's builtin SUB clamps inf - 3 under RELU to float32's largest, its XNNPACK path keeps inf.)"""
    from tflgpu import Interpreter
    from tflgpu.cpu.elementwise import NUMBA_ELEMENTS
    from tflgpu.ops.jit import PARALLEL_ELEMENTS

    from .conftest import run_model
    from .oputil import op_model, run_litert

    assert 40 < NUMBA_ELEMENTS <= 8_000 < PARALLEL_ELEMENTS <= 70_000
    shape = (1, size // 40, 5, 8)
    x = rand(rng, shape, -2, 2)
    x.reshape(-1)[: SIGNED.size] = SIGNED.reshape(-1)
    other = rand(rng, shape, -2, 2)
    other.reshape(-1)[: OTHER.size] = OTHER.reshape(-1)
    if op in ("ADD", "SUB", "MUL"):
        x[np.isinf(x)] = 5.0
    channel = OTHER.reshape(-1)[:8].copy()
    ins = {"first": [np.array(-0.0, np.float32), In(x)], "second": [In(x), np.array(0.5, np.float32)],
           "channel": [In(x), channel], "channel-first": [channel.reshape(1, 1, 1, 8), In(x)],
           None: [In(x)] if op in ("LEAKY_RELU", "RELU", "RELU6", "RELU_N1_TO_1") else [In(x), In(other)]}[operand]
    opts = {"alpha": 0.3} if op == "LEAKY_RELU" else {"fused_activation_function": act} if act else {}
    model, feeds = op_model(op, ins, [Out(shape=shape)], **opts)
    want = run_litert(model, feeds, builtin_only=True)[0]
    _same_bits_but_nans(run_model(Interpreter, model, feeds)[0], want, f"{op} of {x.size} values")


def test_logistic_far_below_zero_is_a_normal_float_near_litert():
    """LOGISTIC clamps its input at LOGISTIC_FLOOR (-87), where 1 / (1 + exp(-x)) is still a normal float32: below it
    the division would make denormals, each a microcode assist (a segmentation mask's background ran 6x slower).
    Those outputs lie within float32's smallest normal of both LiteRT paths' (XNNPACK gives 0, the builtin kernels
    the denormals), and the rest is unchanged."""
    from tflgpu import Interpreter

    from .conftest import run_model
    from .oputil import op_model, run_litert

    x = np.array([-1000, -100, -88.5, -87.5, -87, -86, -20, 0, 5], np.float32).reshape(1, 9)
    model, feeds = op_model("LOGISTIC", [In(x)])
    got = run_model(Interpreter, model, feeds)[0]
    tiny = np.finfo(np.float32).tiny
    assert np.all(got >= tiny), got
    for want in (run_litert(model, feeds)[0], run_litert(model, feeds, builtin_only=True)[0]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=2 * tiny)
