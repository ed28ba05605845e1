"""A plan's shapes without its CPU kernels (ops.shapes, SubgraphRunner.shapes): the same shapes as a run of every
kernel, on the corpus and on random models, and the whole run wherever a shape may come from values."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.cpu.executor import ModelRunner
from tflgpu.cpu.registry import PrepareError
from tflgpu.model.builder import ModelBuilder
from tflgpu.model.reader import read_model
from tflgpu.runtime.selection import propagate_shapes

from .conftest import corpus_model, litert, run_model, start_in_new_process
from .randmodels import random_model
from .test_attention_ops import face_mesh_chain


def _both(model, inputs) -> tuple[list | None, list]:
    """(the stand-in propagation's shapes, a run of every kernel's shapes) of ``model`` on ``inputs``."""
    runner = ModelRunner(read_model(model)).runner(0)
    with np.errstate(all="ignore"):
        shapes = runner.shapes(inputs)
        runner.reset_variables()
        full = [None if v is None else tuple(np.shape(v)) for v in runner.run(inputs)]
    return shapes, full


def _zeros(model) -> list[np.ndarray]:
    sg = read_model(model).main
    return [np.zeros(sg.tensors[i].shape, sg.tensors[i].dtype) for i in sg.inputs]


@pytest.mark.parametrize("name", ["mobilenet_v2_1.0_224.tflite", "mobilenet_v2_1.0_224_int8.tflite",
                                  "ssd_mnv2_300.tflite", "deeplab_mnv2_257.tflite", "unet_small_256.tflite",
                                  "opzoo_small.tflite", "lstm_small.tflite", "lstm_small_keras3_while.tflite",
                                  "fallback_ops.tflite"])
def test_corpus_shapes_come_without_the_kernels(name):
    path = corpus_model(name)
    shapes, full = _both(path, _zeros(path))
    assert shapes is not None, "an op of this model sent the propagation to the whole run"
    assert shapes == full


def test_random_models_get_the_shapes_a_run_gives():
    """Random DAGs over the OpenCL ops (branches, broadcasts, int8 chains, IF / WHILE): where the propagation
    answers, every tensor's shape is the one a run of every kernel gives."""
    answered = 0
    for seed in range(60):
        rm = random_model(seed)
        shapes, full = _both(rm.data, [np.zeros_like(x) for x in rm.inputs])
        if shapes is not None:
            answered += 1
            assert shapes == full, (seed, rm.ops)
    assert answered >= 50


def _range_model() -> bytes:
    """n (float scalar) -> ADD 3 -> CAST -> RANGE(0, int(n + 3), 1): the output's length is a value of the ADD's
    output, which the propagation stands zeros in for (a float ADD has a rule)."""
    b = ModelBuilder()
    n = b.input("n", ())
    m = b.tensor("n_plus_3", ())
    b.op("ADD", [n, b.const("three", np.array(3.0, np.float32))], [m])
    k = b.tensor("limit", (), np.int32)
    b.op("CAST", [m], [k])
    r = b.tensor("range", (1,), np.int32)
    b.op("RANGE", [b.const("start", np.array(0, np.int32)), k, b.const("delta", np.array(1, np.int32))], [r])
    b.output(r)
    return b.build()


def _reshape_model() -> bytes:
    """x [1, 12] reshaped to int(s + (2, 6)), s a float [2] input: the new shape is a value of a stand-in's CAST."""
    b = ModelBuilder()
    x = b.input("x", (1, 12))
    s = b.input("s", (2,))
    shape = b.tensor("shape", (2,))
    b.op("ADD", [s, b.const("base", np.array([2.0, 6.0], np.float32))], [shape])
    ints = b.tensor("shape_int", (2,), np.int32)
    b.op("CAST", [shape], [ints])
    y = b.tensor("y", (12,))
    b.op("RESHAPE", [x, ints], [y])
    b.output(y)
    return b.build()


def test_index_arithmetic_on_known_values_keeps_them():
    """A shape computed from a SHAPE (BirdNET 2.4's SHAPE -> SPLIT_V -> FLOOR_DIV -> PACK -> STRIDED_SLICE): int32
    ops whose inputs are all known run their kernels, so the RESHAPE after them reads its real new shape and the
    propagation answers without the whole run (it fell back to it when FLOOR_DIV and CONCATENATION took their
    rules' stand-ins)."""
    b = ModelBuilder()
    x = b.input("x", (1, 12))
    y = b.tensor("y", (1, 12))
    b.op("MUL", [x, b.const("two", np.array(2.0, np.float32))], [y])
    s = b.tensor("s", (2,), np.int32)
    b.op("SHAPE", [y], [s], out_type=2)  # (INT32)
    h = b.tensor("h", (2,), np.int32)
    b.op("FLOOR_DIV", [s, b.const("halves", np.array([1, 2], np.int32))], [h])
    new = b.tensor("new", (3,), np.int32)
    b.op("CONCATENATION", [h, b.const("two_i", np.array([2], np.int32))], [new], axis=0)
    r = b.tensor("r", (12,))
    b.op("RESHAPE", [y, new], [r])
    b.output(r)
    model = b.build()
    shapes, full = _both(model, _zeros(model))
    assert shapes is not None
    assert shapes == full
    assert shapes[read_model(model).main.outputs[0]] == (1, 6, 2)


@pytest.mark.parametrize("make, want", [(_range_model, (3,)), (_reshape_model, (2, 6))])
def test_a_shape_made_of_values_runs_the_kernels(make, want):
    """An op whose output shape may come from a value (RANGE: not known to ops.traits' shape_inputs), or a shape input
    (RESHAPE's new shape) computed from a skipped kernel's output, is not given stand-in zeros: the propagation runs
    the graph whole, and the plan has the shape LiteRT computes."""
    model = make()
    zeros = _zeros(model)
    shapes, full = _both(model, zeros)
    assert shapes is None
    assert full[read_model(model).main.outputs[0]] == want
    runner = ModelRunner(read_model(model)).runner(0)
    sg = propagate_shapes(runner, [z.shape for z in zeros])
    assert sg.tensors[sg.outputs[0]].shape == want
    assert run_model(litert(), model, zeros)[0].shape == want


def test_the_plan_of_a_stand_in_propagation_matches_litert(opencl_device):
    """A model whose every shape comes from ops.shapes' rules (conv, depthwise conv, pool, pad, concatenation,
    mean, fully connected, softmax), planned on the device: LiteRT's outputs."""
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, 9, 11, 3))
    c = b.tensor("c", (1, 5, 6, 8))
    b.op("CONV_2D", [x, b.const("w", rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
                     b.const("b", rng.standard_normal(8).astype(np.float32))], [c],
         stride_h=2, stride_w=2, padding="SAME", fused_activation_function="RELU6")
    d = b.tensor("d", (1, 5, 6, 8))
    b.op("DEPTHWISE_CONV_2D", [c, b.const("dw", rng.standard_normal((1, 3, 3, 8)).astype(np.float32)),
                               b.const("db", np.zeros(8, np.float32))], [d], padding="SAME", stride_h=1, stride_w=1,
         depth_multiplier=1)
    p = b.tensor("p", (1, 7, 8, 8))
    b.op("PAD", [d, b.const("pads", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))], [p])
    q = b.tensor("q", (1, 3, 4, 8))
    b.op("MAX_POOL_2D", [p], [q], filter_height=2, filter_width=2, stride_h=2, stride_w=2, padding="VALID")
    k = b.tensor("k", (1, 3, 4, 16))
    b.op("CONCATENATION", [q, q], [k], axis=3)
    m = b.tensor("m", (1, 16))
    b.op("MEAN", [k, b.const("axes", np.array([1, 2], np.int32))], [m])
    f = b.tensor("f", (1, 5))
    b.op("FULLY_CONNECTED", [m, b.const("fw", rng.standard_normal((5, 16)).astype(np.float32)),
                             b.const("fb", np.zeros(5, np.float32))], [f])
    s = b.tensor("s", (1, 5))
    b.op("SOFTMAX", [f], [s], beta=1.0)
    b.output(s)
    model = b.build()
    feeds = [rng.standard_normal((1, 9, 11, 3)).astype(np.float32)]
    shapes, full = _both(model, _zeros(model))
    assert shapes is not None and shapes == full
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning="none"))
    assert it.gpu_plan is not None and it.gpu_plan.cpu_op_count == 0
    got = run_model(lambda **kw: it, model, feeds)
    want = run_model(litert(), model, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["fallback_ops.tflite", "lstm_small_keras3_while.tflite",
                                  "mobilenet_v2_1.0_224_int8.tflite", "unet_small_256.tflite"])
def test_a_first_start_runs_no_cpu_kernel(opencl_device, name, tmp_path):
    """A fully delegated model's first start, in a new process: no numba (a CPU kernel's first run imports it, and on
    a cold numba cache compiles it: seconds), through the plan's own passes (fallback_ops' CONV_2D + ARG_MAX is one
    TFLGPU_CONV_ARG there, its CUMSUM a rule too), an LSTM's recurrence, an int8 model's float view and a U-Net's
    PRELUs and transposed convs."""
    numba, plan, cpu_ops = start_in_new_process(corpus_model(name), tmp_path)
    assert (numba, plan, cpu_ops) == ("0", "built", "0")


def _case(rng, name: str) -> tuple[list, dict]:
    """One random, often malformed, use of ``name``: its inputs (a tuple: a graph input of that shape; an array: a
    constant) and options, drawn near what its rule checks (channels, axes, paddings, broadcasts, an output shape)."""
    def n(lo, hi):
        return int(rng.integers(lo, hi + 1))

    def shape(rank):
        return tuple(n(1, 6) for _ in range(rank))

    def often(p, a, b):
        return a if rng.random() < p else b

    zeros = np.zeros
    if name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        x = (1, n(1, 9), n(1, 9), n(1, 6))
        kh, kw, mult = n(1, 4), n(1, 4), n(1, 2)
        opts = {"stride_h": n(1, 3), "stride_w": n(1, 3), "dilation_h_factor": n(1, 2), "dilation_w_factor": n(1, 2),
                    "padding": often(0.5, "SAME", "VALID")}
        if name == "CONV_2D":
            oc = n(1, 6)
            w = zeros((oc, kh, kw, often(0.6, x[3], n(1, 6))), np.float32)
        else:
            oc = often(0.8, x[3] * mult, n(1, 7))
            w = zeros((1, kh, kw, oc), np.float32)
            opts["depth_multiplier"] = often(0.8, mult, n(1, 3))
        return [x, w, zeros(often(0.85, oc, n(1, 7)), np.float32)], opts
    if name == "TRANSPOSE_CONV":
        h, w, c, oc, kh, kw, sh, sw = n(1, 6), n(1, 6), n(1, 4), n(1, 4), n(1, 4), n(1, 4), n(1, 3), n(1, 3)
        padding = often(0.5, "SAME", "VALID")
        oh, ow = (h * sh, w * sw) if padding == "SAME" else ((h - 1) * sh + kh, (w - 1) * sw + kw)
        out = np.array([1, oh + often(0.8, 0, n(-2, 2)), ow, often(0.9, oc, n(1, 4))], np.int32)
        return [out, zeros((oc, kh, kw, often(0.9, c, n(1, 4))), np.float32), (1, h, w, c)], {
            "stride_h": sh, "stride_w": sw, "padding": padding}
    if name == "Convolution2DTransposeBias":  # (its output: the declared shape, which the options' key carries)
        h, w, c, oc, kh, kw, sh, sw = n(1, 6), n(1, 6), n(1, 4), n(1, 4), n(1, 4), n(1, 4), n(1, 3), n(1, 3)
        padding = n(1, 2)  # (TfLitePadding: 1 SAME, 2 VALID)
        oh, ow = (h * sh, w * sw) if padding == 1 else ((h - 1) * sh + kh, (w - 1) * sw + kw)
        return [(1, h, w, c), zeros((oc, kh, kw, often(0.9, c, n(1, 4))), np.float32),
                zeros(often(0.9, oc, n(1, 4)), np.float32)], {
            "custom_options": struct.pack("<3i", padding, sw, sh),
            "declared": (often(0.9, 1, 2), oh + often(0.8, 0, n(-1, 1)), ow, often(0.9, oc, n(1, 4)))}
    if name == "FULLY_CONNECTED":
        x = shape(n(1, 4))
        units = n(1, 5)
        return [x, zeros((units, often(0.7, x[-1], n(1, 8))), np.float32),
                zeros(often(0.85, units, n(1, 6)), np.float32)], {"keep_num_dims": bool(n(0, 1))}
    if name.endswith("POOL_2D"):
        return [often(0.9, (1, n(1, 8), n(1, 8), n(1, 3)), shape(3))], {
            "filter_height": n(1, 5), "filter_width": n(1, 5), "stride_h": n(1, 3), "stride_w": n(1, 3),
            "padding": often(0.5, "SAME", "VALID")}
    if name in ("ADD", "MUL", "DIV", "MAXIMUM", "SQUARED_DIFFERENCE", "PRELU", "POW"):
        a = shape(n(0, 6))
        b = tuple(often(0.5, d, often(0.7, 1, n(1, 4))) for d in a[n(0, len(a)):])
        return often(0.7, [a, b], [b, a]), {}
    if name in ("SOFTMAX", "L2_NORMALIZATION", "HARD_SWISH", "LOGISTIC"):
        return [shape(n(0, 5))], ({"beta": 1.0} if name == "SOFTMAX" else {})
    if name in ("MEAN", "SUM", "REDUCE_MAX"):
        x = shape(n(0, 5))
        axes = np.array([n(-len(x) - 1, len(x)) for _ in range(n(0, 3))], np.int32)
        return [x, often(0.9, axes, axes.reshape(-1, 1))], {"keep_dims": bool(n(0, 1))}
    if name == "CONCATENATION":
        rank = n(1, 4)
        base, axis = shape(rank), n(-rank - 1, rank)
        parts = []
        for _ in range(n(1, 3)):
            s = list(base)
            if -rank <= axis < rank:
                s[axis] = n(1, 4)
            if rng.random() < 0.1:
                s[n(0, rank - 1)] = n(1, 4)
            parts.append(tuple(often(0.95, s, [*s, 1])))
        return parts, {"axis": axis}
    if name in ("PAD", "PADV2"):
        x = shape(n(1, 4))
        pads = rng.integers(often(0.1, -1, 0), 3, size=(len(x), 2)).astype(np.int32)
        pads = often(0.9, pads, pads[:-1] if len(x) > 1 else zeros((2, 2), np.int32))
        return [x, pads] + ([np.array(0.5, np.float32)] if name == "PADV2" else []), {}
    if name.startswith("RESIZE"):
        size = often(0.95, np.array([n(0, 9), n(1, 9)], np.int32), np.array([3, 3, 3], np.int32))
        return [often(0.9, (1, n(1, 6), n(1, 6), n(1, 3)), shape(3)), size], {"align_corners": bool(n(0, 1))}
    if name == "CUMSUM":
        x = shape(n(0, 4))
        return [x, np.array(n(-len(x) - 1, len(x)), np.int32)], {}
    raise AssertionError(name)


_RULE_OPS = ["CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "FULLY_CONNECTED", "MAX_POOL_2D", "AVERAGE_POOL_2D",
             "ADD", "DIV", "MAXIMUM", "SQUARED_DIFFERENCE", "PRELU", "POW", "SOFTMAX", "L2_NORMALIZATION", "MEAN",
             "SUM", "REDUCE_MAX", "CONCATENATION", "PAD", "PADV2", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR",
             "CUMSUM", "Convolution2DTransposeBias"]


@pytest.mark.parametrize("name", _RULE_OPS)
def test_each_rule_gives_its_kernels_shapes_or_none(name):
    """ops.shapes' rule for ``name`` on 80 random single-op models, half of them fed inputs of other shapes than
    they declare (a resize: the kernel was prepared at the declared ones), many malformed: where the rule answers,
    the kernel runs and makes those shapes; where the kernel refuses, the rule has not answered (the propagation
    would have planned a node LiteRT rejects). The rule must answer for some (so this checks it at all)."""
    rng = np.random.default_rng(sum(map(ord, name)))
    answered = 0
    for k in range(80):
        inputs, opts = _case(rng, name)
        b = ModelBuilder()
        ids = [b.input(f"x{i}", v) if isinstance(v, tuple) else b.const(f"c{i}", v) for i, v in enumerate(inputs)]
        y = b.tensor("y", opts.pop("declared", (1,)))
        b.op(name, ids, [y], **opts)
        b.output(y)
        model = read_model(b.build())
        try:
            runner = ModelRunner(model).runner(0)
        except PrepareError:  # (rejected at its declared shapes: the interpreter says so before any shape is asked)
            continue
        feeds = []
        for v in inputs:
            if isinstance(v, tuple):
                v = list(v)
                if k % 2 and v:
                    v[int(rng.integers(len(v)))] = int(rng.integers(1, 10))
                feeds.append(np.zeros(v, np.float32))
        with np.errstate(all="ignore"):
            shapes = runner.shapes(feeds)
            try:
                runner.reset_variables()
                full = [None if v is None else tuple(np.shape(v)) for v in runner.run(feeds)]
            except RuntimeError as e:  # (a kernel's failure, naming the node)
                assert shapes is None, (k, inputs, opts, [f.shape for f in feeds], e)
                continue
        if shapes is not None:
            answered += 1
            assert shapes == full, (k, inputs, opts, [f.shape for f in feeds])
    assert answered >= 20


def test_mediapipe_attention_ops_take_their_shapes_from_options(opencl_device, tmp_path):
    """MediaPipe's face-mesh ops (Landmarks2TransformMatrix, TransformTensorBilinear, TransformLandmarks) have
    shapes from their inputs' shapes and options alone: their kernels run on the stand-ins, the propagation answers
    without the whole run (it made the attention face mesh's first start take 19 s where numba's cache was empty,
    3.5 s without), and the model's first start imports no numba."""
    _propagates_and_starts_without_cpu_kernels(face_mesh_chain(), tmp_path)


def _propagates_and_starts_without_cpu_kernels(model: bytes, tmp_path) -> None:
    """``model``'s propagation answers with a run's shapes, and its first start (a new process) runs no CPU
    kernel: no numba, a plan built with every op on the device."""
    shapes, full = _both(model, _zeros(model))
    assert shapes is not None and shapes == full
    path = tmp_path / "model.tflite"
    path.write_bytes(model)
    assert start_in_new_process(path, tmp_path / "cache") == ["0", "built", "0"]


def test_mediapipe_transposed_conv_takes_its_declared_shape(opencl_device, tmp_path):
    """MediaPipe's Convolution2DTransposeBias (selfie segmentation's upsampling) makes its declared output shape: its
    rule gives it, and the first start runs no CPU kernel (its col2im compiled through numba before: selfie
    segmentation's first start imported numba with every op on the device)."""
    b = ModelBuilder()
    y = b.tensor("y", (1, 10, 8, 6))
    b.op("Convolution2DTransposeBias", [b.input("x", (1, 5, 4, 3)), b.const("w", np.ones((6, 3, 3, 3), np.float32)),
                                        b.const("b", np.ones(6, np.float32))], [y],
         custom_options=struct.pack("<3i", 1, 2, 2))  # (SAME, stride 2 x 2)
    b.output(y)
    _propagates_and_starts_without_cpu_kernels(b.build(), tmp_path)


def test_a_resize_on_the_cpu_path_takes_the_rules(monkeypatch, rng):
    """An interpreter without a delegate, resized: allocate_tensors learns the new shapes from the rules, running
    no kernel (MobileNet v2 at batch 4: 420 -> 8 ms), and the shapes and values are LiteRT's; a model whose shape
    may come from a value (``_reshape_model``'s new shape) still runs its kernels for them."""
    from tflgpu.cpu.executor import SubgraphRunner

    runs, real = [], SubgraphRunner.run
    monkeypatch.setattr(SubgraphRunner, "run", lambda self, *a, **k: runs.append(1) or real(self, *a, **k))
    model = corpus_model("mobilenet_v2_1.0_224.tflite").read_bytes()
    feeds = [rng.uniform(-1, 1, (3, 224, 224, 3)).astype(np.float32)]
    ours, ref = Interpreter(model_content=model), litert()(model_content=model)
    for it in (ours, ref):
        it.resize_tensor_input(it.get_input_details()[0]["index"], feeds[0].shape)
        it.allocate_tensors()
    assert not runs
    shapes = [[d["shape"].tolist() for d in it.get_output_details()] for it in (ours, ref)]
    assert shapes[0] == shapes[1] == [[3, 1001]]
    got = run_model(lambda **kw: ours, model, feeds)
    np.testing.assert_allclose(got[0], run_model(lambda **kw: ref, model, feeds)[0], rtol=1e-4, atol=1e-5)
    runs.clear()
    reshaped = Interpreter(model_content=_reshape_model())
    reshaped.resize_tensor_input(reshaped.get_input_details()[0]["index"], [2, 6])
    reshaped.allocate_tensors()
    assert runs and reshaped.get_output_details()[0]["shape"].tolist() == [2, 6]
