"""Convolutions, pooling, resizing and matrix products against LiteRT."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from .oputil import In, Out, both_fail_or_match, check_op, op_model, rand

ACTS = st.sampled_from(["NONE", "RELU", "RELU6", "RELU_N1_TO_1", "TANH"])
PAD = st.sampled_from(["SAME", "VALID"])


def _out(in_size, k, stride, dil, pad):
    eff = (k - 1) * dil + 1
    return -(-in_size // stride) if pad == "SAME" else (in_size - eff + stride) // stride


@given(n=st.integers(1, 2), h=st.integers(1, 10), w=st.integers(1, 10), cin=st.integers(1, 9),
       cout=st.integers(1, 9), k=st.sampled_from([1, 2, 3, 5]), stride=st.integers(1, 3), dil=st.integers(1, 2),
       pad=PAD, act=ACTS, bias=st.booleans(), seed=st.integers(0, 2**16))
def test_conv2d(n, h, w, cin, cout, k, stride, dil, pad, act, bias, seed):
    assume(_out(h, k, stride, dil, pad) > 0 and _out(w, k, stride, dil, pad) > 0)
    rng = np.random.default_rng(seed)
    b = rand(rng, (cout,)) if bias else np.zeros(cout, np.float32)
    check_op("CONV_2D", [In(rand(rng, (n, h, w, cin))), rand(rng, (cout, k, k, cin)), b],
             padding=pad, stride_w=stride, stride_h=stride, dilation_w_factor=dil, dilation_h_factor=dil,
             fused_activation_function=act)


def test_conv2d_nonsquare_strides_and_dilations(rng):
    check_op("CONV_2D", [In(rand(rng, (1, 13, 11, 5))), rand(rng, (7, 3, 2, 5)), rand(rng, (7,))],
             padding="SAME", stride_w=2, stride_h=1, dilation_w_factor=1, dilation_h_factor=3)


@pytest.mark.parametrize("case", [
    # (input shape, filter shape, stride, dilation, padding, activation)
    ((1, 40, 37, 24), (40, 1, 1, 24), 1, 1, "SAME", "RELU6"),  # pointwise: blocks of rows on every thread
    ((1, 45, 50, 3), (16, 3, 3, 3), 2, 1, "SAME", "RELU"),  # a stem: im2col per block, 3 channels
    ((2, 21, 19, 10), (12, 3, 3, 10), 1, 2, "SAME", "NONE"),  # dilated, batch 2, ragged last block
    ((1, 30, 30, 16), (8, 5, 5, 16), 3, 1, "VALID", "RELU_N1_TO_1"),
    ((1, 3, 2, 64), (300, 1, 1, 64), 1, 1, "VALID", "NONE"),  # few rows, many columns
])
def test_conv2d_large_runs_in_blocks_on_every_core(case, rng):
    """Products past MIN_PARALLEL_FLOPS run as BLAS calls on blocks, one run of blocks per numba thread, the
    bias and the clamp applied per block (tflgpu.cpu.gemm)."""
    from tflgpu.cpu.gemm import MIN_PARALLEL_FLOPS, find_blas

    shape, wshape, stride, dil, pad, act = case
    assert find_blas() is not None, "numpy's BLAS has no usable cblas_sgemm here: the blocked path is not tested"
    assert 2 * shape[0] * shape[1] * shape[2] * wshape[0] * wshape[1] * wshape[2] * wshape[3] // stride ** 2 \
        >= MIN_PARALLEL_FLOPS
    check_op("CONV_2D", [In(rand(rng, shape)), rand(rng, wshape), rand(rng, (wshape[0],))], padding=pad,
             stride_w=stride, stride_h=stride, dilation_w_factor=dil, dilation_h_factor=dil,
             fused_activation_function=act)


@pytest.mark.parametrize("batch", [1, 3, 5, 200])
def test_fully_connected_large_splits_rows_or_columns(batch, rng):
    """One or a few rows split by columns across the threads, more by rows."""
    check_op("FULLY_CONNECTED", [In(rand(rng, (batch, 300))), rand(rng, (1001, 300)), rand(rng, (1001,))],
             fused_activation_function="RELU")


def test_grouped_conv2d(rng):
    # filter depth 3 on 6 input channels: two groups
    assert both_fail_or_match("CONV_2D", [In(rand(rng, (1, 6, 6, 6))), rand(rng, (4, 3, 3, 3)), rand(rng, (4,))],
                              padding="SAME", stride_w=1, stride_h=1) in ("matched", "both rejected")


@given(h=st.integers(1, 10), w=st.integers(1, 10), c=st.integers(1, 8), mult=st.integers(1, 3),
       k=st.sampled_from([1, 3, 5]), stride=st.integers(1, 2), dil=st.integers(1, 2), pad=PAD, act=ACTS,
       seed=st.integers(0, 2**16))
def test_depthwise_conv2d(h, w, c, mult, k, stride, dil, pad, act, seed):
    assume(_out(h, k, stride, dil, pad) > 0 and _out(w, k, stride, dil, pad) > 0)
    rng = np.random.default_rng(seed)
    check_op("DEPTHWISE_CONV_2D", [In(rand(rng, (1, h, w, c))), rand(rng, (1, k, k, c * mult)), rand(rng, (c * mult,))],
             padding=pad, stride_w=stride, stride_h=stride, dilation_w_factor=dil, dilation_h_factor=dil,
             depth_multiplier=mult, fused_activation_function=act)


@given(h=st.integers(1, 8), w=st.integers(1, 8), cin=st.integers(1, 6), cout=st.integers(1, 6),
       k=st.sampled_from([1, 2, 3, 4]), stride=st.integers(1, 3), pad=PAD, bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_transpose_conv(h, w, cin, cout, k, stride, pad, bias, seed):
    rng = np.random.default_rng(seed)
    if pad == "SAME":
        oh, ow = h * stride, w * stride
    else:
        oh, ow = (h - 1) * stride + k, (w - 1) * stride + k
    inputs = [np.array([1, oh, ow, cout], np.int32), rand(rng, (cout, k, k, cin)), In(rand(rng, (1, h, w, cin)))]
    if bias:
        inputs.append(rand(rng, (cout,)))
    check_op("TRANSPOSE_CONV", inputs, [Out(np.float32, (1, oh, ow, cout))], padding=pad, stride_w=stride,
             stride_h=stride, version=3 if bias else 1)


@given(kind=st.sampled_from(["AVERAGE_POOL_2D", "MAX_POOL_2D"]), h=st.integers(1, 10), w=st.integers(1, 10),
       c=st.integers(1, 5), fh=st.integers(1, 4), fw=st.integers(1, 4), stride=st.integers(1, 3), pad=PAD,
       act=st.sampled_from(["NONE", "RELU", "RELU6"]), seed=st.integers(0, 2**16))
def test_pool2d(kind, h, w, c, fh, fw, stride, pad, act, seed):
    assume(_out(h, fh, stride, 1, pad) > 0 and _out(w, fw, stride, 1, pad) > 0)
    rng = np.random.default_rng(seed)
    check_op(kind, [In(rand(rng, (2, h, w, c), -3, 3))], padding=pad, stride_w=stride, stride_h=stride,
             filter_width=fw, filter_height=fh, fused_activation_function=act)


def test_max_pool_keeps_tflites_nans_and_zeros():
    """MAX_POOL_2D as TFLite's builtin kernel folds a window, ``max = std::max(max, x)`` in order: a NaN taken first
    is replaced by the next larger value, one taken last is passed over, and of two equal zeros the first stays
    (-0.0 before 0.0). The CPU kernel's channels-innermost loop keeps that order per channel. (An all -inf window is
    left out: the builtin kernel starts from float32's lowest, XNNPACK from -inf.)"""
    from tflgpu import Interpreter

    from .conftest import run_model
    from .oputil import run_litert

    windows = [[np.nan, 1.0, 2.0, 3.0], [1.0, np.nan, -1.0, -2.0], [-0.0, 0.0, 0.0, -0.0], [5.0, 4.0, 3.0, np.nan]]
    img = np.array(windows, np.float32).reshape(4, 2, 2).transpose(1, 0, 2).reshape(1, 2, 8, 1)
    x = np.concatenate([img, -img, img[:, ::-1]], axis=3)
    x = np.concatenate([x, x[:, :, ::-1]], axis=0)  # (a batch of 2, 3 channels)
    model, feeds = op_model("MAX_POOL_2D", [In(x)], padding="VALID", stride_w=2, stride_h=2, filter_width=2,
                            filter_height=2)
    got, want = run_model(Interpreter, model, feeds)[0], run_litert(model, feeds, builtin_only=True)[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_l2_pool(rng):
    check_op("L2_POOL_2D", [In(rand(rng, (1, 6, 6, 3)))], padding="VALID", stride_w=2, stride_h=2,
             filter_width=2, filter_height=2)


@given(kind=st.sampled_from(["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"]), h=st.integers(1, 9),
       w=st.integers(1, 9), oh=st.integers(1, 17), ow=st.integers(1, 17),
       mode=st.sampled_from([(False, False), (True, False), (False, True)]), seed=st.integers(0, 2**16))
def test_resize(kind, h, w, oh, ow, mode, seed):
    rng = np.random.default_rng(seed)
    align, half = mode
    check_op(kind, [In(rand(rng, (1, h, w, 3))), np.array([oh, ow], np.int32)],
             align_corners=align, half_pixel_centers=half, version=3 if half else 1)


@given(batch=st.sampled_from([(3,), (2, 3)]), depth=st.integers(1, 12), units=st.integers(1, 10),
       keep=st.booleans(), bias=st.booleans(), act=st.sampled_from(["NONE", "RELU", "RELU6", "RELU_N1_TO_1"]), seed=st.integers(0, 2**16))
def test_fully_connected(batch, depth, units, keep, bias, act, seed):
    rng = np.random.default_rng(seed)
    inputs = [In(rand(rng, batch + (depth,))), rand(rng, (units, depth)), rand(rng, (units,)) if bias else None]
    check_op("FULLY_CONNECTED", inputs, keep_num_dims=keep, fused_activation_function=act)


@given(adj_x=st.booleans(), adj_y=st.booleans(), b1=st.sampled_from([(), (2,), (1, 3), (2, 3)]),
       b2=st.sampled_from([(), (3,), (2, 1)]), seed=st.integers(0, 2**16))
def test_batch_matmul(adj_x, adj_y, b1, b2, seed):
    rng = np.random.default_rng(seed)
    m, k, n = 4, 5, 3
    try:
        np.broadcast_shapes(b1, b2)
    except ValueError:
        assume(False)
    a = rand(rng, b1 + ((k, m) if adj_x else (m, k)))
    b = rand(rng, b2 + ((n, k) if adj_y else (k, n)))
    check_op("BATCH_MATMUL", [In(a), In(b)], adj_x=adj_x, adj_y=adj_y)


def test_fully_connected_rejects_tanh_like_litert(rng):
    assert both_fail_or_match("FULLY_CONNECTED", [In(rand(rng, (2, 4))), rand(rng, (3, 4)), None],
                              fused_activation_function="TANH") == "both rejected"


@pytest.mark.parametrize("geometry", [(1, 1, "SAME"), (2, 1, "SAME"), (1, 1, "VALID"), (2, 1, "VALID"), (1, 2, "SAME"),
                                      (2, 2, "VALID"), (1, 3, "SAME")])
@pytest.mark.parametrize("size", [(9, 12), (8, 5)])
@pytest.mark.parametrize("c", [32, 40])
def test_depthwise_3x3_against_litert(geometry, size, c):
    """The 3x3 depthwise kernel (32 channels and more: its interior pixels in one pass over the taps, two along a
    row at a time) against LiteRT: both strides, dilations, paddings, even and odd widths (a single last pixel),
    an image whose border is all there is (5 wide, dilation 3), two images, a clamp."""
    stride, dil, pad = geometry
    h, w = size
    assert _out(h, 3, stride, dil, pad) > 0 and _out(w, 3, stride, dil, pad) > 0
    rng = np.random.default_rng(c + 10 * stride + dil)
    check_op("DEPTHWISE_CONV_2D", [In(rand(rng, (2, h, w, c))), rand(rng, (1, 3, 3, c)), rand(rng, (c,))],
             padding=pad, stride_w=stride, stride_h=stride, dilation_w_factor=dil, dilation_h_factor=dil,
             depth_multiplier=1, fused_activation_function="RELU6")


@pytest.mark.parametrize("geometry", [(3, 3, 1, 1, 1, 1, "SAME"), (3, 3, 2, 2, 1, 1, "SAME"), (3, 3, 1, 1, 2, 2, "SAME"),
                                      (5, 3, 2, 1, 1, 3, "VALID"), (1, 1, 1, 1, 1, 1, "VALID")])
@pytest.mark.parametrize("c", [1, 16, 32])
def test_depthwise_by_rows_is_the_per_pixel_kernel(geometry, c):
    """The row-at-a-time depthwise kernel (few channels) computes what the per-pixel one does: strides, dilations,
    both paddings, two images, to float32 rounding (the taps are summed in another order)."""
    from tflgpu.cpu.conv import _depthwise, _depthwise_rows
    from tflgpu.ops.attributes import conv_padding

    kh, kw, sh, sw, dh, dw, pad = geometry
    rng = np.random.default_rng(c + kh + sh)
    x = rng.standard_normal((2, 17, 13, c)).astype(np.float32)
    w = rng.standard_normal((1, kh, kw, c)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    code = 0 if pad == "SAME" else 1
    oh, pt = conv_padding(17, kh, sh, dh, code)
    ow, pl = conv_padding(13, kw, sw, dw, code)
    lo, hi = np.float32(-1.5), np.float32(2.0)
    want = _depthwise(x, w, bias, sh, sw, dh, dw, pt, pl, oh, ow, 1, lo, hi)
    got = _depthwise_rows(x, np.ascontiguousarray(np.tile(w[0], (1, 1, ow))), np.tile(bias, ow), sh, sw, dh, dw, pt,
                          pl, oh, ow, lo, hi)
    assert got.shape == want.shape and np.unique(got).size > got.size // 3
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
