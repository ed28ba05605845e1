"""LSTMs, control flow (WHILE/IF) and MediaPipe custom ops."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from tflgpu import Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, check_against_litert, litert, run_model
from .oputil import VARIANTS, In, Out, lstm_model, op_model, rand


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_unidirectional_sequence_lstm(variant, rng):
    model, feeds = lstm_model("UNIDIRECTIONAL_SEQUENCE_LSTM", rng, **VARIANTS[variant])
    check_against_litert(model, feeds)


@pytest.mark.parametrize("variant", ["plain", "peephole", "projection", "layer_norm"])
def test_lstm_single_step_state_carries_over(variant, rng):
    model, feeds = lstm_model("LSTM", rng, **VARIANTS[variant])
    seqs = []
    for cls in (Interpreter, litert()):
        it = cls(model_content=model)
        it.allocate_tensors()
        seq = []
        for _ in range(3):
            it.set_tensor(it.get_input_details()[0]["index"], feeds[0])
            it.invoke()
            seq.append(it.get_tensor(it.get_output_details()[0]["index"]))
        seqs.append(seq)
    for a, b in zip(*seqs):
        assert_close(a, b)
    assert not np.allclose(seqs[0][0], seqs[0][2])


def _branch(b: ModelBuilder, op: str, const: float):
    idx, sg = b.subgraph(op.lower())
    x = sg.input("x", (2, 3))
    c = sg.const("c", np.full((1,), const, np.float32))
    y = sg.tensor("y", (2, 3))
    sg.op(op, [x, c], [y])
    sg.output(y)
    return idx


@pytest.mark.parametrize("flag", [True, False])
def test_if(flag, rng):
    b = ModelBuilder()
    cond = b.input("cond", (1,), np.bool_)
    x = b.input("x", (2, 3))
    y = b.tensor("y", (2, 3))
    then_i, else_i = _branch(b, "MUL", 2.0), _branch(b, "ADD", 1.0)
    b.op("IF", [cond, x], [y], then_subgraph_index=then_i, else_subgraph_index=else_i)
    b.output(y)
    check_against_litert(b.build(), [np.array([flag]), rand(rng, (2, 3))])


def test_while_loop(rng):
    b = ModelBuilder()
    i0 = b.input("i", (), np.int32)
    x0 = b.input("x", (2, 3))
    i_out, x_out = b.tensor("i_out", (), np.int32), b.tensor("x_out", (2, 3))
    cond_idx, cond = b.subgraph("cond")
    ci, cx = cond.input("i", (), np.int32), cond.input("x", (2, 3))
    limit = cond.const("limit", np.array(5, np.int32))
    flag = cond.tensor("flag", (), np.bool_)
    cond.op("LESS", [ci, limit], [flag])
    cond.output(flag)
    body_idx, body = b.subgraph("body")
    bi, bx = body.input("i", (), np.int32), body.input("x", (2, 3))
    one, k = body.const("one", np.array(1, np.int32)), body.const("k", np.array([1.5], np.float32))
    bi2, bx2 = body.tensor("i2", (), np.int32), body.tensor("x2", (2, 3))
    body.op("ADD", [bi, one], [bi2])
    body.op("MUL", [bx, k], [bx2])
    body.output(bi2, bx2)
    del cx
    b.op("WHILE", [i0, x0], [i_out, x_out], cond_subgraph_index=cond_idx, body_subgraph_index=body_idx)
    b.output(i_out, x_out)
    got = check_against_litert(b.build(), [np.array(1, np.int32), rand(rng, (2, 3))])
    assert int(got[0]) == 5


def _pool_params(padding: int, sw: int, sh: int, fw: int, fh: int) -> bytes:
    # TfLitePoolParams: padding (1 SAME, 2 VALID), strides, filter, activation, computed padding
    return struct.pack("<10i", padding, sw, sh, fw, fh, 0, 0, 0, 0, 0)


@pytest.mark.parametrize("pad", ["SAME", "VALID"])
@pytest.mark.parametrize("stride", [1, 2])
def test_convolution2d_transpose_bias_matches_litert_transpose_conv(pad, stride, rng):
    x, w, bias = rand(rng, (1, 5, 4, 3)), rand(rng, (6, 3, 3, 3)), rand(rng, (6,))
    oh, ow = (5 * stride, 4 * stride) if pad == "SAME" else ((5 - 1) * stride + 3, (4 - 1) * stride + 3)
    ref_model, feeds = op_model("TRANSPOSE_CONV", [np.array([1, oh, ow, 6], np.int32), w, In(x), bias],
                                [Out(np.float32, (1, oh, ow, 6))], padding=pad, stride_w=stride, stride_h=stride,
                                version=3)
    custom = struct.pack("<3i", 1 if pad == "SAME" else 2, stride, stride)
    model, _ = op_model("Convolution2DTransposeBias", [In(x), w, bias], [Out(np.float32, (1, oh, ow, 6))],
                        custom_options=custom)
    assert_close(run_model(Interpreter, model, feeds)[0], run_model(litert(), ref_model, feeds)[0])


@pytest.mark.parametrize("pad", ["SAME", "VALID"])
def test_max_pooling_with_argmax_and_unpooling(pad, rng):
    x = rand(rng, (2, 6, 7, 3))
    ref_model, _ = op_model("MAX_POOL_2D", [In(x)], padding=pad, stride_w=2, stride_h=2, filter_width=2,
                            filter_height=2)
    want = run_model(litert(), ref_model, [x])[0]
    model, _ = op_model("MaxPoolingWithArgmax2D", [In(x)], [Out(np.float32), Out(np.int32)],
                        custom_options=_pool_params(1 if pad == "SAME" else 2, 2, 2, 2, 2))
    values, idx = run_model(Interpreter, model, [x])
    assert_close(values, want)
    flat = x.reshape(2, -1)
    for n in range(2):  # each index points at the element holding the max
        np.testing.assert_array_equal(flat[n][idx[n].reshape(-1)], values[n].reshape(-1))

    unpool, _ = op_model("MaxUnpooling2D", [In(values), In(idx)], [Out(np.float32, x.shape)],
                         custom_options=_pool_params(1 if pad == "SAME" else 2, 2, 2, 2, 2))
    restored = run_model(Interpreter, unpool, [values, idx])[0]
    expected = np.zeros_like(x).reshape(2, -1)
    for n in range(2):
        expected[n][idx[n].reshape(-1)] = values[n].reshape(-1)
    np.testing.assert_array_equal(restored, expected.reshape(x.shape))
    assert np.count_nonzero(restored) == np.count_nonzero(values)


def test_bad_custom_options_refused_at_allocate(rng):
    model, _ = op_model("MaxPoolingWithArgmax2D", [In(rand(rng, (1, 4, 4, 1)))], [Out(), Out(np.int32)],
                        custom_options=b"\x01\x00")
    it = Interpreter(model_content=model)  # as LiteRT: the node is refused by its Prepare, at allocate_tensors
    with pytest.raises(RuntimeError, match=r"Node number 0 \(MaxPoolingWithArgmax2D\) failed to prepare: "
                                           r"custom options hold 2 bytes"):
        it.allocate_tensors()


def test_lstm_vector_activations_are_within_a_few_ulp():
    """The LSTM's vectorized exp / sigmoid / tanh (Cephes' polynomials) against float64, from -100 to 100: a few
    float32 ulp (relative, absolute for tanh near 0 and sigmoid far below 0), saturating to 0 / 1 / +-1 at the
    ends, NaN kept."""
    from tflgpu.cpu.vecmath import exp_into as _exp_into
    from tflgpu.cpu.vecmath import sigmoid_into as _sigmoid_into
    from tflgpu.cpu.vecmath import tanh_into as _tanh_into

    x = np.concatenate([np.linspace(-100, 100, 400001), [np.nan, 0.0, -0.0, 1e-30, -1e-30]]).astype(np.float32)
    n = x.size
    e, t, bits = np.empty(n, np.float32), np.empty(n, np.float32), np.empty(n, np.int32)
    x64 = x.astype(np.float64)
    exp = np.empty(n, np.float32)
    _exp_into(x, exp, bits)
    inside = (x64 > -86.6) & (x64 < 88.7)
    want = np.exp(x64)
    assert np.max(np.abs(exp[inside] - want[inside]) / want[inside]) < 3e-7
    assert np.all(exp[x64 >= 88.7] > 3e38) and np.all(exp[x64 <= -86.6] < 3e-38)
    sig = x.copy()
    _sigmoid_into(sig, e, t, bits)
    with np.errstate(over="ignore"):
        want = 1 / (1 + np.exp(-x64))
    assert np.nanmax(np.abs(sig - want) / np.maximum(want, 1e-30)) < 3e-7
    tanh = x.copy()
    _tanh_into(tanh, e, t, bits)
    want = np.tanh(x64)
    assert np.nanmax(np.abs(tanh - want) / np.maximum(np.abs(want), 1e-7)) < 3e-7
    assert tanh[-4] == 0 and tanh[-2] == np.float32(1e-30) and tanh[0] == -1 and tanh[400000] == 1
    assert np.isnan(exp[400001]) and np.isnan(sig[400001]) and np.isnan(tanh[400001])
