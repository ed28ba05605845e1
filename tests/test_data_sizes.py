"""A model whose input values size some of its tensors (a detector's WHERE of the scores over a threshold, a RANGE to
a limit read from an input: graph.sizes) runs its other ops on the device: the plan leaves the ops making such
tensors, and a SHAPE of one, to the CPU kernels, and a value they compute of a fixed size (the number of rows
found) goes back to the device ops reading it. Each against LiteRT over invokes whose data set other sizes."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder

from .conftest import assert_fp16_close, litert
from .test_ops_indexing import invokes, where_model

F = np.float32


def detector(rng, batch: int = 1) -> bytes:
    """x [batch, 8, 8, 3] -> CONV_2D 3x3 (RELU) -> CONV_2D 1x1 -> LOGISTIC: scores [batch, 8, 8, 2] (an output);
    WHERE(scores > 0.5) -> GATHER_ND(scores): the rows found and their scores; SHAPE of the rows -> [0:1] -> CAST
    -> scores * found: an output of fixed size computed from that count (the device reads it)."""
    b = ModelBuilder()
    x = b.input("x", [batch, 8, 8, 3], shape_signature=[-1, 8, 8, 3])
    h = b.tensor("h", [batch, 8, 8, 6])
    b.op("CONV_2D", [x, b.const("w1", rng.normal(0, 0.5, (6, 3, 3, 3)).astype(F)),
                     b.const("b1", rng.normal(0, 0.1, 6).astype(F))], [h],
         padding="SAME", stride_w=1, stride_h=1, fused_activation_function="RELU")
    logits = b.tensor("logits", [batch, 8, 8, 2])
    b.op("CONV_2D", [h, b.const("w2", rng.normal(0, 1.5, (2, 1, 1, 6)).astype(F)),
                     b.const("b2", np.array([-0.5, 0.5], F))], [logits], padding="VALID", stride_w=1, stride_h=1)
    scores = b.tensor("scores", [batch, 8, 8, 2])
    b.op("LOGISTIC", [logits], [scores])
    mask = b.tensor("mask", [batch, 8, 8, 2], np.bool_)
    b.op("GREATER", [scores, b.const("half", np.full(1, 0.5, F))], [mask])
    rows = b.tensor("rows", [0, 4], np.int64, shape_signature=[-1, 4])
    b.op("WHERE", [mask], [rows])
    picked = b.tensor("picked", [0], F, shape_signature=[-1])
    b.op("GATHER_ND", [scores, rows], [picked])
    shape = b.tensor("shape", [2], np.int32)
    b.op("SHAPE", [rows], [shape], out_type=2)
    count = b.tensor("count", [1], np.int32)
    b.op("STRIDED_SLICE", [shape, b.const("b0", np.array([0], np.int32)), b.const("e0", np.array([1], np.int32)),
                           b.const("s0", np.array([1], np.int32))], [count])
    found = b.tensor("found", [1])
    b.op("CAST", [count], [found])
    weighted = b.tensor("weighted", [batch, 8, 8, 2])
    b.op("MUL", [scores, found], [weighted])
    b.output(rows, picked, weighted, scores)
    return b.build()


def clear_inputs(model: bytes, rng, n: int, shape=(1, 8, 8, 3), margin: float = 0.02) -> list[list[np.ndarray]]:
    """``n`` random inputs whose scores (LiteRT's) are each ``margin`` or more from the threshold, so that an FP16
    plan finds the same rows."""
    it = litert()(model_content=model)
    it.resize_tensor_input(it.get_input_details()[0]["index"], list(shape))
    it.allocate_tensors()
    out = []
    while len(out) < n:
        x = rng.normal(0, 1, shape).astype(F)
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        scores = it.get_tensor(it.get_output_details()[3]["index"])
        if np.abs(scores - 0.5).min() >= margin:
            out.append([x])
    return out


def check(got, want, fp16: bool = False) -> None:
    for (g_out, g_shapes), (w_out, w_shapes) in zip(got, want, strict=True):
        assert g_shapes == w_shapes
        np.testing.assert_array_equal(g_out[0], w_out[0])  # the rows found
        for g, w in zip(g_out[1:], w_out[1:]):
            if fp16 and w.size:
                assert_fp16_close(g, w)
            else:
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def device_ops(it) -> set[str]:
    return {op.name for s in it.gpu_plan.steps if s.device == "gpu" for op, _ in s.members}


def cpu_ops(it) -> set[str]:
    return {op.name for s in it.gpu_plan.steps if s.device == "cpu" for op, _ in s.members}


@pytest.mark.parametrize("fp16", [False, True])
def test_a_detector_runs_its_backbone_on_the_device_and_its_where_on_the_cpu(opencl_device, rng, fp16):
    """The convs and the scores run on the device, the WHERE and the GATHER_ND of its rows and the SHAPE of them on
    the CPU, and the count the CPU part computes scales the scores on the device: every invoke's rows, as LiteRT
    finds them (3 invokes of other counts, one finding no row), and the scores within float32 (FP16) rounding."""
    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    model = detector(rng)
    feeds = clear_inputs(model, rng, 3) + [[np.full((1, 8, 8, 3), -30, F)]]
    want = invokes(litert()(model_content=model), feeds)
    assert len({tuple(s[0]) for _, s in want}) >= 3  # (the invokes found other numbers of rows)
    delegate = GpuDelegate(inference_priority1="MIN_MEMORY_USAGE") if fp16 else GpuDelegate()
    it = Interpreter(model_content=model, experimental_delegates=[delegate])
    got = invokes(it, feeds)
    assert it.gpu_plan.fp16 is fp16
    assert {"CONV_2D", "CAST"} <= device_ops(it) and {"WHERE", "GATHER_ND", "SHAPE"} <= cpu_ops(it)
    reasons = {s.op.name: s.reason for s in it.gpu_plan.steps if s.device == "cpu"}
    assert "follows WHERE's (node 4) input values" in reasons["GATHER_ND"]
    check(got, want, fp16)


def test_a_resized_batch_and_a_stored_plan_keep_the_where_on_the_cpu(opencl_device, rng, tmp_path):
    """Resized to batch 3, the plan is built for the new shapes with the WHERE still on the CPU; a second interpreter
    loads the stored plan, and finds the same rows."""
    model = detector(rng)
    feeds = clear_inputs(model, rng, 3, shape=(3, 8, 8, 3))
    lite = litert()(model_content=model)
    lite.resize_tensor_input(0, [3, 8, 8, 3])
    want = invokes(lite, feeds)
    for stored in ("built", "cache"):
        it = Interpreter(model_content=model, experimental_delegates=[GpuDelegate(serialization_dir=str(tmp_path),
                                                                                 model_token="detector")])
        it.resize_tensor_input(0, [3, 8, 8, 3])
        got = invokes(it, feeds)
        assert it.gpu_plan.build_stats["plan"] == stored and "WHERE" in cpu_ops(it) and "CONV_2D" in device_ops(it)
        check(got, want)


def test_sizes_set_by_data_keep_only_their_ops_on_the_cpu(opencl_device, rng):
    """A tensor whose size the input values set (a WHERE's rows; a RANGE to a limit computed from an input) cannot be
    in a device plan, which fixes every size when it is built: the plan leaves its ops to the CPU kernels and runs
    the rest, and each invoke's outputs have the sizes its data set. Before, the plan was built on zeros standing in
    for the inputs (the WHERE model's outputs had the zeros' size, silently wrong; the RANGE model raised a
    DeviceError from an upload of the wrong size); then such a model ran wholly on the CPU."""
    feeds = [[rng.normal(0, 1, (2, 5)).astype(F)] for _ in range(3)]
    b = ModelBuilder()  # x -> (x > 0) -> WHERE -> GATHER_ND: the plan's stand-in zeros find no row (no empty tensor
    # of the plan's own: an empty batch's, which the CPU kernels run)
    x = b.input("x", [2, 5])
    c = b.tensor("c", [2, 5], np.bool_)
    b.op("GREATER", [x, b.const("zero", np.zeros(1, F))], [c])
    idx = b.tensor("idx", [0, 2], np.int64, shape_signature=[-1, 2])
    b.op("WHERE", [c], [idx])
    picked = b.tensor("picked", [0], F, shape_signature=[-1])
    b.op("GATHER_ND", [x, idx], [picked])
    b.output(idx, picked)
    for model, on_device, kept in ((where_model(), "LESS_EQUAL", {"WHERE", "GATHER_ND", "MUL"}),
                                   (b.build(), "GREATER", {"WHERE", "GATHER_ND"})):
        want = invokes(litert()(model_content=model), feeds)
        it = Interpreter(model_content=model, experimental_delegates=[GpuDelegate()])
        got = invokes(it, feeds)
        assert device_ops(it) == {on_device} and cpu_ops(it) == kept
        assert it.backend.endswith(f"1 ops on device, {len(kept)} on cpu)") and it.cpu_fallback_reason is None
        import pyopencl as cl

        with pytest.raises(ValueError, match="no device buffer in this plan: the CPU kernels make or read it"):
            it.bind_buffer(it.get_output_details()[-1]["index"], cl.Buffer(it.gpu_context, cl.mem_flags.READ_WRITE, 64))
        for (g_out, g_shapes), (w_out, w_shapes) in zip(got, want):
            assert g_shapes == w_shapes
            for g, w in zip(g_out, w_out):
                np.testing.assert_array_equal(g, w)

    b = ModelBuilder()  # x[0 : n + 5] * 2, n an input
    x, n = b.input("x", [12]), b.input("n", [], np.int32)
    limit = b.tensor("limit", [], np.int32)
    b.op("ADD", [n, b.const("five", np.array(5, np.int32))], [limit])
    r = b.tensor("r", [5], np.int32, shape_signature=[-1])
    b.op("RANGE", [b.const("start", np.array(0, np.int32)), limit, b.const("delta", np.array(1, np.int32))], [r])
    g = b.tensor("g", [5], F, shape_signature=[-1])
    b.op("GATHER", [x, r], [g], axis=0)
    y = b.tensor("y", [5], F, shape_signature=[-1])
    b.op("MUL", [g, b.const("two", np.full(1, 2, F))], [y])
    b.output(y)
    model = b.build()
    feeds = [[np.arange(12, dtype=F), np.array(v, np.int32)] for v in (0, 3, 7)]
    want = invokes(litert()(model_content=model), feeds)
    it = Interpreter(model_content=model, experimental_delegates=[GpuDelegate()])
    got = invokes(it, feeds)
    assert {"RANGE", "GATHER", "MUL"} <= cpu_ops(it)
    for (g_out, g_shapes), (w_out, w_shapes) in zip(got, want):
        assert g_shapes == w_shapes
        np.testing.assert_array_equal(g_out[0], w_out[0])
