"""Weights stored the way real converters write them: sparse fp16 (DENSIFY -> DEQUANTIZE -> weight input, as in
MediaPipe's sparse models), fp16 biases, and weights behind TRANSPOSE / CAST of constants. Every such chain is
folded at build time, so the whole model runs on the OpenCL device, on every path against LiteRT."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder, csr_encode

from .conftest import assert_close, assert_fp16_close, constant_only_ops, litert, run_model


def _sparse_fp16(b: ModelBuilder, name: str, dense: np.ndarray) -> int:
    """A float32 weight tensor fed by DENSIFY(sparse fp16) -> DEQUANTIZE."""
    half = dense.astype(np.float16)
    values, sparsity = csr_encode(half)
    ws = b.const(f"{name}_sparse", values, sparsity=sparsity, shape=half.shape)
    wd = b.tensor(f"{name}_dense", half.shape, np.float16)
    b.op("DENSIFY", [ws], [wd])
    wf = b.tensor(name, half.shape)
    b.op("DEQUANTIZE", [wd], [wf])
    return wf


def _fp16(b: ModelBuilder, name: str, value: np.ndarray) -> int:
    """A float32 tensor fed by DEQUANTIZE(fp16 constant)."""
    h = b.const(f"{name}_fp16", value.astype(np.float16))
    f = b.tensor(name, value.shape)
    b.op("DEQUANTIZE", [h], [f])
    return f


def sparse_fp16_model(seed: int = 7) -> bytes:
    """A small MobileNet-shaped classifier: a strided 3x3 stem, a depthwise 3x3, a 1x1 conv (all with sparse
    fp16 weights, 60-80% zeros), a residual ADD, mean pooling, and a FULLY_CONNECTED whose weights are the
    TRANSPOSE of a constant and whose scale comes from a CAST of an integer constant."""
    rng = np.random.default_rng(seed)

    def sparse(shape, density):
        return (rng.standard_normal(shape) * (rng.random(shape) < density) * 0.5).astype(np.float32)

    b = ModelBuilder("sparse fp16 weights")
    x = b.input("image", (1, 32, 32, 3))
    stem = b.tensor("stem", (1, 16, 16, 16))
    b.op("CONV_2D", [x, _sparse_fp16(b, "stem_w", sparse((16, 3, 3, 3), 0.4)),
                     _fp16(b, "stem_b", rng.standard_normal(16).astype(np.float32) * 0.1)], [stem],
         padding="SAME", stride_w=2, stride_h=2, fused_activation_function="RELU6")
    dw = b.tensor("dw", (1, 16, 16, 16))
    b.op("DEPTHWISE_CONV_2D", [stem, _sparse_fp16(b, "dw_w", sparse((1, 3, 3, 16), 0.35)),
                               b.const("dw_b", rng.standard_normal(16).astype(np.float32) * 0.1)], [dw],
         padding="SAME", stride_w=1, stride_h=1, depth_multiplier=1, fused_activation_function="RELU")
    pw = b.tensor("pw", (1, 16, 16, 16))
    b.op("CONV_2D", [dw, _sparse_fp16(b, "pw_w", sparse((16, 1, 1, 16), 0.3)),
                     _fp16(b, "pw_b", rng.standard_normal(16).astype(np.float32) * 0.1)], [pw],
         padding="SAME", stride_w=1, stride_h=1)
    res = b.tensor("res", (1, 16, 16, 16))
    b.op("ADD", [pw, stem], [res])
    pooled = b.tensor("pooled", (1, 16))
    b.op("MEAN", [res, b.const("axes", np.array([1, 2], np.int32))], [pooled], keep_dims=False)
    fc_t = b.const("fc_w_t", rng.standard_normal((16, 10)).astype(np.float32))  # stored input-major
    fc_w = b.tensor("fc_w", (10, 16))
    b.op("TRANSPOSE", [fc_t, b.const("perm", np.array([1, 0], np.int32))], [fc_w])
    logits = b.tensor("logits", (1, 10))
    b.op("FULLY_CONNECTED", [pooled, fc_w, -1], [logits])
    scale_i = b.const("scale_i", np.array([3], np.int32))
    scale = b.tensor("scale", (1,))
    b.op("CAST", [scale_i], [scale])
    scaled = b.tensor("scaled_logits", (1, 10))
    b.op("MUL", [logits, scale], [scaled])
    b.output(scaled, res)
    return b.build()


@pytest.fixture(scope="module")
def model():
    return sparse_fp16_model()


@pytest.fixture(scope="module")
def inputs():
    return [np.random.default_rng(3).uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)]


def test_sparse_fp16_weights_on_the_cpu(model, inputs):
    want = run_model(litert(), model, inputs)
    got = run_model(Interpreter, model, inputs)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, what=f"output {i}")


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_sparse_fp16_weights_fully_delegated(model, inputs, fp16, opencl_device):
    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    it = Interpreter(model_content=model, delegate=GpuDelegate(precision_loss_allowed=fp16))
    plan = it.gpu_plan
    assert plan.cpu_op_count == 0, [(s.op.name, s.reason) for s in plan.steps if s.device == "cpu"]
    assert not constant_only_ops(plan)
    want = run_model(litert(), model, inputs)
    got = run_model(lambda **kw: it, model, inputs)
    for i, (g, w) in enumerate(zip(got, want)):
        (assert_fp16_close if fp16 else assert_close)(g, w, what=f"output {i}")


def _fc_model(weights: np.ndarray, bias: np.ndarray, sparse: bool) -> bytes:
    b = ModelBuilder()
    x = b.input("x", (3, weights.shape[1]))
    if sparse:
        values, sparsity = csr_encode(weights)
        w = b.const("w", values, sparsity=sparsity, shape=weights.shape)
    else:
        w = b.const("w", weights)
    y = b.tensor("y", (3, weights.shape[0]))
    b.op("FULLY_CONNECTED", [x, w, b.const("bias", bias)], [y])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("path", ["cpu", "fp32"])
def test_fully_connected_reads_sparse_weights_directly(path, opencl_device):
    """Sparse weights read by FULLY_CONNECTED itself (no DENSIFY in front) compute with their dense tensor.
    (LiteRT's FULLY_CONNECTED reads this CSR encoding's value buffer as if it were dense and returns
    NaN / 1e28 garbage, so the reference is LiteRT on the same weights stored dense, and numpy.)"""
    rng = np.random.default_rng(5)
    dense = (rng.standard_normal((12, 9)) * (rng.random((12, 9)) < 0.35)).astype(np.float32)
    bias = rng.standard_normal(12).astype(np.float32)
    feeds = [rng.standard_normal((3, 9)).astype(np.float32)]
    model = _fc_model(dense, bias, sparse=True)
    it = Interpreter(model_content=model, **({} if path == "cpu" else {"delegate": GpuDelegate()}))
    if path != "cpu":
        assert it.gpu_plan.cpu_op_count == 0
    got = run_model(lambda **_: it, model, feeds)[0]
    assert_close(got, run_model(litert(), _fc_model(dense, bias, sparse=False), feeds)[0])
    assert_close(got, feeds[0] @ dense.T + bias, what="against numpy")


@pytest.mark.parametrize("params", [None, {"split": 1, "tile_s": 2, "wide": True},
                                    {"split": 1, "tile_s": 1, "wide": False}, {"split": 8, "wide": False}],
                         ids=["default", "wide", "float4", "split"])
def test_a_float16_models_fc_weights_are_read_as_halves(params, opencl_device):
    """A FULLY_CONNECTED whose weights a float16 model stores (DEQUANTIZE of a float16 constant, folded into float32
    values every one of which is a half) reads them as halves in an FP32 plan: a "const16" argument, loaded with
    vload_half (a GEMV's time is its weights' bytes: half of them). Each sum form, against LiteRT; the same
    weights stored float32 but not exactly halves stay float32."""
    from .conftest import plan_with_params

    rng = np.random.default_rng(11)
    w = (rng.standard_normal((37, 70)) * 0.2).astype(np.float32)
    bias = rng.standard_normal(37).astype(np.float32)
    feeds = [rng.standard_normal((2, 70)).astype(np.float32)]
    b = ModelBuilder("float16 FC weights")
    x = b.input("x", (2, 70))
    y = b.tensor("y", (2, 37))
    b.op("FULLY_CONNECTED", [x, _fp16(b, "w", w), b.const("bias", bias)], [y], fused_activation_function="RELU")
    b.output(y)
    model = b.build()
    if params is None:
        it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False))
        plan = it.gpu_plan
    else:
        it, plan = plan_with_params(opencl_device, model, ("FULLY_CONNECTED",), params)
    (spec,) = [sp for s in plan.steps if s.op.name == "FULLY_CONNECTED" for sp in s.specs]
    assert [a.kind for a in spec.args][1] == "const16" and "half* wts" in spec.source and "vload_half" in spec.source
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0])
    w32 = w + np.float32(1e-5)  # (not halves)
    plain = Interpreter(model_content=_fc_model(w32, bias, sparse=False), delegate=GpuDelegate(cache=False))
    (spec,) = [sp for s in plain.gpu_plan.steps if s.op.name == "FULLY_CONNECTED" for sp in s.specs]
    assert spec.args[1].kind == "const"
