"""The boundary layout conversion merged into the first and last kernels (runtime.selection.dense_boundary): a
graph input that one kernel reads, and a graph output that one kernel writes, as the host's dense NHWC float32
buffer. Against LiteRT at FP32 and FP16, with the pass off for comparison, with bound (zero-copy) buffers kept
across background kernel swaps, and through a tuning search."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder
from tflgpu.runtime.config import PlanConfig
from tflgpu.runtime.executor import GpuPlan

from .conftest import assert_close, counted_calls, litert, run_model

PRECISIONS = [pytest.param(False, id="fp32"), pytest.param(True, id="fp16")]


def _conv(b, rng, name, x, cin, cout, k, stride, out_shape, act="RELU6"):
    y = b.tensor(name, out_shape)
    w = (rng.standard_normal((cout, k, k, cin)) / np.sqrt(k * k * cin)).astype(np.float32)
    b.op("CONV_2D", [x, b.const(f"{name}_w", w), b.const(f"{name}_b", rng.standard_normal(cout).astype(np.float32))],
         [y], padding="SAME", stride_w=stride, stride_h=stride, fused_activation_function=act)
    return y


def stem_model(rng, cin=3, last="resize", second_reader=False):
    """x (1x19x23xcin) -> 3x3/s2 CONV_2D -> 1x1 CONV_2D to 21 channels [-> RESIZE_BILINEAR to 37x45]: a
    segmentation net's two ends. ``second_reader``: an ADD reads x as well."""
    b = ModelBuilder()
    x = b.input("x", (1, 19, 23, cin))
    stem = _conv(b, rng, "stem", x, cin, 12, 3, 2, (1, 10, 12, 12))
    logits = _conv(b, rng, "logits", stem, 12, 21, 1, 1, (1, 10, 12, 21), act="NONE")
    outs = [logits]
    if last == "resize":
        up = b.tensor("up", (1, 37, 45, 21))
        b.op("RESIZE_BILINEAR", [logits, b.const("size", np.array([37, 45], np.int32))], [up])
        outs = [up]
    if second_reader:
        y = b.tensor("y", (1, 19, 23, cin))
        b.op("ADD", [x, x], [y])
        outs.append(y)
    b.output(*outs)
    return b.build(), [rng.uniform(-1, 1, (1, 19, 23, cin)).astype(np.float32)]


def _plan(model: bytes, fp16: bool, **config) -> GpuPlan:
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
    return GpuPlan(it.cpu_runner(), it.gpu_plan.device, PlanConfig(fp16=fp16, **config))


@pytest.fixture(params=PRECISIONS)
def fp16(request, opencl_device):
    if request.param and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    return request.param


@pytest.mark.parametrize("cin,last,dense", [(3, "resize", 2), (8, "resize", 2), (3, "conv", 2), (5, "conv", 2)])
def test_first_and_last_kernel_take_the_dense_buffers(opencl_device, rng, fp16, cin, last, dense):
    """The stem conv reads the input (3 channels: a partial slice; 8: whole slices; 5: one of each) and the
    last kernel (RESIZE_BILINEAR, or a pointwise conv of 21 channels: a partial last slice) writes the output as
    dense NHWC; no conversion kernel is left at either end, and the result is LiteRT's, as without the pass. On a
    GPU the pointwise conv's default is a group tile, which has no dense form: its output keeps the conversion."""
    from tflgpu.kernels.base import Target

    model, feeds = stem_model(rng, cin, last)
    want = run_model(litert(), model, feeds)[0]
    plan = _plan(model, fp16)
    (x,), (out,) = plan.sg.inputs, plan.sg.outputs
    tiled = last == "conv" and Target.of(opencl_device.cl_device, opencl_device.identity.device_type).gpu
    assert plan.pass_counts["dense_boundary"] == dense - tiled
    assert plan.io.staging[x].to_device is None and (plan.io.staging[out].from_device is None) != tiled
    assert x not in plan.io.buffers and (out in plan.steps[-1].specs[0].dense) != tiled
    tol = 1e-2 if fp16 else 1e-4
    assert_close(plan.run(feeds)[out], want, tol)
    assert_close(plan.run(feeds)[out], want, tol)  # (again: nothing of the first run is left to be read)
    off = _plan(model, fp16, dense_boundary=False)
    assert "dense_boundary" not in off.pass_counts and off.io.staging[x].to_device is not None
    assert_close(off.run(feeds)[out], want, tol)


@pytest.mark.parametrize("cin,mult,stride", [(16, 1, 1), (12, 1, 2), (8, 2, 1), (6, 1, 1)])
def test_a_depthwise_conv_writes_the_output_densely(opencl_device, rng, fp16, cin, mult, stride):
    """A depthwise conv writing a graph output of whole slices in an FP32 plan writes the dense buffer itself, pixel
    by pixel (several slices a work-item, one, or a channel multiplier of 2): no conversion kernel. A ragged last
    slice (6 channels), an FP16 plan or a GPU keeps the conversion. Either way LiteRT's result."""
    from tflgpu.kernels.base import Target

    cout = cin * mult
    oh, ow = -(-9 // stride), -(-10 // stride)
    b = ModelBuilder()
    x = b.input("x", (1, 9, 10, cin))
    y = b.tensor("y", (1, oh, ow, cout))
    b.op("DEPTHWISE_CONV_2D", [x, b.const("w", rng.standard_normal((1, 3, 3, cout)).astype(np.float32)),
                               b.const("b", rng.standard_normal(cout).astype(np.float32))], [y],
         padding="SAME", stride_w=stride, stride_h=stride, depth_multiplier=mult, fused_activation_function="RELU6")
    b.output(y)
    model, feeds = b.build(), [rng.uniform(-1, 1, (1, 9, 10, cin)).astype(np.float32)]
    plan = _plan(model, fp16)
    gpu = Target.of(opencl_device.cl_device, opencl_device.identity.device_type).gpu
    dense = cout % 4 == 0 and not fp16 and not gpu
    assert (y in plan.steps[-1].specs[0].dense) == dense
    assert (plan.io.staging[y].from_device is None) == dense
    assert_close(plan.run(feeds)[y], run_model(litert(), model, feeds)[0], 1e-2 if fp16 else 1e-4)


def test_a_tensor_with_two_readers_keeps_the_slice_layout(opencl_device, rng):
    model, feeds = stem_model(rng, second_reader=True)
    plan = _plan(model, False)
    x = plan.sg.inputs[0]
    assert plan.pass_counts["dense_boundary"] == 1  # the resize's output only: x has two readers
    assert plan.io.staging[x].to_device is not None and not any(x in s.specs[0].dense for s in plan.steps)
    got = plan.run(feeds)
    for t, want in zip(plan.sg.outputs, run_model(litert(), model, feeds)):
        assert_close(got[t], want)


@pytest.mark.parametrize("cin", [4, 7])
def test_an_input_the_conv_also_adds_keeps_the_slice_layout(opencl_device, rng, fp16, cin):
    """x -> 1x1 CONV_2D -> ADD x: one kernel reads x twice, as the conv's input and as its fused ADD's operand
    (which reads the slice layout), so x keeps the slice layout. The dense read gave the ADD the host's NHWC buffer
    as slices: off by 5.7 against LiteRT."""
    b = ModelBuilder()
    x = b.input("x", (1, 9, 11, cin))
    y, z = _conv(b, rng, "pw", x, cin, cin, 1, 1, (1, 9, 11, cin), act="NONE"), b.tensor("z", (1, 9, 11, cin))
    b.op("ADD", [y, x], [z], fused_activation_function="RELU")
    b.output(z)
    model, feeds = b.build(), [rng.uniform(-1, 1, (1, 9, 11, cin)).astype(np.float32)]
    plan = _plan(model, fp16)
    assert len(plan.steps) == 1 and plan.pass_counts["dense_boundary"] == 1  # (the output only)
    assert x not in plan.steps[0].specs[0].dense
    got = plan.run(feeds)[z]
    want = run_model(litert(), model, feeds)[0]
    assert_close(got, want, rtol_scale=1e-2 if fp16 else 1e-4)


def test_explicit_parameters_without_a_dense_form_keep_the_conversion(opencl_device, rng):
    """A first conv given a group tile (a form that reads the slice layout) keeps it and the conversion pass."""
    from .oputil import In, op_model, rand

    model, feeds = op_model("CONV_2D", [In(rand(rng, (1, 6, 7, 8))), rand(rng, (8, 1, 1, 8)), rand(rng, (8,))],
                            padding="VALID", stride_w=1, stride_h=1)
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
    plan = GpuPlan(it.cpu_runner(), it.gpu_plan.device, PlanConfig(),
                   params={0: {"group_tile": (8, 2), "tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": "float4"}})
    assert plan.pass_counts["dense_boundary"] == 0 and plan.steps[0].specs[0].params["group_tile"] == (8, 2)
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0])


@pytest.mark.parametrize("device_outputs", [False, True])
def test_bound_buffers_are_read_and_written_by_the_kernels_across_swaps(opencl_device, new_process, rng, device_outputs):
    """Zero-copy buffers bound to a dense input and output: the stem conv reads the caller's buffer and the resize
    writes the caller's, also in the optimized kernels the background work made before the binding (new
    instances, installed at the next invoke)."""
    import pyopencl as cl
    import pyopencl.array as cla

    model, feeds = stem_model(rng)
    it = Interpreter(model_content=model, delegate=GpuDelegate(allow_buffer_handle_output=device_outputs,
                                                                cache=False, tuning="none", tiered_compile=True))
    assert it.gpu_plan.build_stats["tier"] == "quick"
    assert it.gpu_plan.pass_counts["dense_boundary"] == 2
    it.wait_background()  # (the optimized kernels are made on the plan's own buffers, and queued)
    ctx, q = it.gpu_context, it.gpu_queue
    in_buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=feeds[0])
    out_d = it.get_output_details()[0]
    out_arr = cla.empty(q, tuple(out_d["shape"]), np.float32)
    it.bind_buffer(it.get_input_details()[0]["index"], in_buf)
    it.bind_buffer(out_d["index"], out_arr)
    it.allocate_tensors()
    it.invoke()  # (the optimized kernels are installed first)
    assert it.gpu_plan.build_stats["tier"] == "optimized"
    assert_close(out_arr.get(), run_model(litert(), model, feeds)[0])
    x2 = rng.uniform(-1, 1, feeds[0].shape).astype(np.float32)
    cl.enqueue_copy(q, in_buf, x2, is_blocking=True)
    it.invoke()
    want = run_model(litert(), model, [x2])[0]
    assert_close(out_arr.get(), want)
    assert_close(it.get_tensor(out_d["index"]), want)


def test_a_search_keeps_the_dense_form(opencl_device, rng, tmp_path):
    """Tuning measures the stem conv's candidates on a dense input (KernelBench) and installs one that still
    reads it densely."""
    model, feeds = stem_model(rng)
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning="fast", tuning_db=tmp_path / "r.json",
                                                                tuning_budget_s=10, cache=False))
    plan = it.gpu_plan
    assert plan.pass_counts["dense_boundary"] == 2 and any(k.source == "tuned" for k in plan.tuning_results)
    x = plan.sg.inputs[0]
    assert any(x in sp.dense for s in plan.steps for sp in s.specs)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], feeds[0])
    it.invoke()
    assert_close(it.get_tensor(it.get_output_details()[0]["index"]), run_model(litert(), model, feeds)[0])


def test_outputs_are_read_from_their_buffers_host_memory(opencl_device, rng):
    """A graph output's dense buffer is made on a page-aligned host array the read maps (zero-copy on a CPU
    runtime), or read into a page-aligned pinned array (a device with memory of its own): get_tensor's copies stay
    what they were when the next invoke rewrites the array."""
    from tflgpu.runtime.transfers import HOST_ALIGN

    model, feeds = stem_model(rng)
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning="none"))
    it.allocate_tensors()
    x, out = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    st = it.gpu_plan.io.staging[out]
    host = st.host if it.gpu_plan.io.shared_memory else st.pinned
    assert host is not None and host.ctypes.data % HOST_ALIGN == 0
    x2 = rng.uniform(-1, 1, feeds[0].shape).astype(np.float32)
    it.set_tensor(x, feeds[0])
    it.invoke()
    first = it.get_tensor(out)
    it.set_tensor(x, x2)
    it.invoke()
    assert_close(first, run_model(litert(), model, feeds)[0])
    assert_close(it.get_tensor(out), run_model(litert(), model, [x2])[0])


@pytest.mark.parametrize("memory", ["shared", "pinned", "mapped"])
def test_the_outputs_are_read_with_one_map_of_their_arena_or_into_pinned_memory(opencl_device, rng, fp16, memory,
                                                                                 monkeypatch):
    """A model's outputs the host reads (three: float features and an int32 class map written densely by their
    kernels, the top-k values in their slice layout): where the device shares the host's memory (a CPU runtime)
    they lie in one host arena, each on the device's base address alignment, which an invoke reads with no command
    at all (the finished kernels' values are in it); where the device has memory of its own, each is copied into
    its pinned host array (one command each, no map); without pinned memory, the arena is mapped once instead of
    once per output. Every invoke's values are LiteRT's."""
    import pyopencl as cl

    from tflgpu.runtime import transfers

    from .conftest import corpus_model

    if memory == "shared" and not opencl_device.cl_device.type & cl.device_type.CPU:
        pytest.skip("a GPU's runtime may cache host memory: no arena read in place")
    if memory != "shared":
        monkeypatch.setattr(transfers, "shares_host_memory", lambda cl, ctx: False)
    if memory == "mapped":
        monkeypatch.setattr(transfers.HostArenas, "pinned", lambda self, tensors: {})
    path = corpus_model("fallback_ops.tflite")
    it = Interpreter(str(path), delegate=GpuDelegate(cache=False, tuning="none", precision_loss_allowed=fp16))
    it.allocate_tensors()
    io = it.gpu_plan.io
    outs = [o["index"] for o in it.get_output_details()]
    align = max(opencl_device.cl_device.mem_base_addr_align // 8, 128)
    placed = {t: at for t, (kind, at) in io.host.at.items() if kind == "output"}
    if memory == "pinned":
        assert placed == {} and all(io.staging[t].pinned is not None and io.staging[t].host is None for t in outs)
    else:
        assert sorted(placed) == sorted(outs) and all(at % align == 0 for at in placed.values())
        assert len(set(placed.values())) == 3
    maps = counted_calls(io, "enqueue_map_buffer")
    copied = counted_calls(io, "enqueue_copy")  # (their destinations)
    x = it.get_input_details()[0]["index"]
    for seed in (1, 2):
        feeds = [np.random.default_rng(seed).uniform(-1, 1, (1, 32, 32, 8)).astype(np.float32)]
        it.set_tensor(x, feeds[0])
        maps.clear()
        copied.clear()
        it.invoke()
        assert io.shared_memory == (memory == "shared")
        assert maps == ([io.host.buffers["output"]] if memory == "mapped" else [])
        assert [sum(d is io.staging[t].pinned for d in copied) for t in outs] == [memory == "pinned"] * 3
        want = run_model(litert(), path.read_bytes(), feeds)
        for t, w in zip(outs, want):
            got = it.get_tensor(t)
            assert got.dtype == w.dtype
            if w.dtype == np.float32:
                assert_close(got, w, 1e-2 if fp16 else 1e-5)
            elif not fp16:  # (half-stored sums may rank near-ties otherwise)
                np.testing.assert_array_equal(got, w)


def test_a_class_map_head_reads_the_input_densely_and_maps_its_index_output(opencl_device, rng, fp16):
    """A conv whose ARG_MAX over channels joins it (CONV_ARG) reads the graph input as the dense buffer, and
    writes its int32 class map, a graph output, as the dense buffer too (no conversion kernel at either end); the
    map is read from that buffer's host array (into a pinned array, where the device has memory of its own) and
    converted to int32: equal to LiteRT's over two invokes (the sums' ties are far apart: 1x1 weights of distinct
    scales)."""
    b = ModelBuilder()
    x = b.input("x", (1, 9, 11, 8))
    logits = _conv(b, rng, "logits", x, 8, 6, 3, 1, (1, 9, 11, 6), act="NONE")
    idx = b.tensor("idx", (1, 9, 11), np.int32)
    b.op("ARG_MAX", [logits, b.const("axis", np.array([3], np.int32))], [idx], output_type=2)
    b.output(idx)
    model = b.build()
    plan = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, precision_loss_allowed=fp16)).gpu_plan
    (xt,), (out,) = plan.sg.inputs, plan.sg.outputs
    assert [s.op.name for s in plan.steps] == ["TFLGPU_CONV_ARG"] and xt in plan.steps[0].specs[0].dense
    read = plan.io.staging[out].host if plan.io.shared_memory else plan.io.staging[out].pinned
    assert plan.io.staging[xt].to_device is None and read is not None
    assert out in plan.steps[0].specs[0].dense and plan.io.staging[out].from_device is None
    for _ in range(2):
        feeds = [rng.uniform(-1, 1, (1, 9, 11, 8)).astype(np.float32)]
        got = plan.run(feeds)[out]
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, run_model(litert(), model, feeds)[0])


@pytest.mark.parametrize("shape,group", [((1, 1001), None), ((1, 1001), 64), ((2, 3, 5, 10), None),
                                         ((2, 3, 5, 10), 32)])
def test_a_softmax_writes_the_probabilities_densely(opencl_device, rng, fp16, shape, group):
    """A classifier's last op, SOFTMAX, writes the graph output as its dense boundary buffer (no conversion kernel
    after it): 1,001 classes (a partial last slice) and rows of 10 channels over 2 x 3 x 5 pixels, a work-item per
    row and a work-group per row (``group``: a GPU's default form); LiteRT's values over two invokes, FP16
    storage rounding them as the slice layout would."""
    b = ModelBuilder()
    x = b.input("x", shape)
    h, y = b.tensor("h", shape), b.tensor("y", shape)
    b.op("MUL", [x, b.const("k", rng.uniform(0.5, 2, shape[-1:]).astype(np.float32))], [h])
    b.op("SOFTMAX", [h], [y], beta=0.7)
    b.output(y)
    model = b.build()
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
    plan = GpuPlan(it.cpu_runner(), it.gpu_plan.device, PlanConfig(fp16=fp16),
                   params={} if group is None else {1: {"group": group}})
    (out,) = plan.sg.outputs
    last = plan.steps[-1].specs[0]
    assert last.dense == {out} and plan.io.staging[out].from_device is None
    assert group is None or last.local_size == (group, 1)
    for _ in range(2):
        feeds = [rng.uniform(-4, 4, shape).astype(np.float32)]
        assert_close(plan.run(feeds)[out], run_model(litert(), model, feeds)[0], 1e-2 if fp16 else 1e-5)


@pytest.mark.parametrize("bound", [False, True])
def test_vectors_in_dense_order_need_no_conversion(opencl_device, rng, fp16, bound):
    """A [2, 8] input and a [2, 12] output (whole slices, one pixel per row) are stored in dense order already in
    FP32 storage: their buffers are the dense ones, with no conversion kernel, also when the caller binds buffers of
    their own (the kernels take those). An FP16 plan stores them half and converts. Against LiteRT, twice."""
    import pyopencl as cl
    import pyopencl.array as cla

    b = ModelBuilder()
    x = b.input("x", (2, 8))
    h, y = b.tensor("h", (2, 12)), b.tensor("y", (2, 12))
    b.op("FULLY_CONNECTED", [x, b.const("w", rng.standard_normal((12, 8)).astype(np.float32)),
                             b.const("b", rng.standard_normal(12).astype(np.float32))], [h])
    b.op("TANH", [h], [y])
    b.output(y)
    model = b.build()
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, precision_loss_allowed=fp16))
    plan = it.gpu_plan
    (xt,), (out,) = plan.sg.inputs, plan.sg.outputs
    converted = [plan.io.staging[t].to_device is not None for t in (xt, out)]
    assert converted == ([plan.io.tensors.half[xt], plan.io.tensors.half[out]] if fp16 else [False, False])
    if bound and fp16:
        pytest.skip("bound buffers of half-stored tensors are the conversion test's")
    it.allocate_tensors()
    for _ in range(2):
        feeds = [rng.uniform(-1, 1, (2, 8)).astype(np.float32)]
        if bound:
            in_buf = cl.Buffer(it.gpu_context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=feeds[0])
            out_arr = cla.empty(it.gpu_queue, (2, 12), np.float32)
            it.bind_buffer(xt, in_buf)
            it.bind_buffer(out, out_arr)
            it.invoke()
            got = out_arr.get()
        else:
            got = run_model(lambda **kw: it, model, feeds)[0]
        assert_close(got, run_model(litert(), model, feeds)[0], 1e-2 if fp16 else 1e-5)


@pytest.mark.parametrize("second_reader", [False, True])
def test_inputs_are_written_into_their_buffers_host_memory(opencl_device, rng, fp16, second_reader):
    """Where the device reads host memory in place (a CPU runtime; ``shares_host_memory`` checks it), an invoke
    writes each input into its dense buffer's page-aligned host array and enqueues no copy: the kernel reading it
    densely (the stem) or the conversion kernel (an input two kernels read) sees each invoke's new values."""
    import pyopencl as cl

    from tflgpu.runtime.transfers import HOST_ALIGN, shares_host_memory

    if not opencl_device.cl_device.type & cl.device_type.CPU:
        pytest.skip("a GPU's runtime may cache host memory: inputs are copied there")
    model, _ = stem_model(rng, 3, "conv", second_reader=second_reader)
    plan = _plan(model, fp16)
    io, x = plan.io, plan.sg.inputs[0]
    assert shares_host_memory(io.cl, plan.ctx) and io.shared_memory  # (the Intel and PoCL CPU runtimes do)
    st = io.staging[x]
    assert st.host_in is not None and st.host_in.ctypes.data % HOST_ALIGN == 0
    assert (st.to_device is not None) == second_reader
    copies = counted_calls(io, "enqueue_copy")
    for seed in (1, 2, 3):
        feeds = [np.random.default_rng(seed).uniform(-1, 1, (1, 19, 23, 3)).astype(np.float32)]
        copies.clear()
        got = plan.run(feeds)
        assert copies == []
        for t, want in zip(plan.sg.outputs, run_model(litert(), model, feeds)):
            assert_close(got[t], want, 1e-2 if fp16 else 1e-4)


def test_inputs_are_copied_where_the_device_may_cache_host_memory(opencl_device, rng, monkeypatch):
    """A device that does not read host memory in place (a GPU's, or a failed check) gets each input by a copy
    command, as before; the check itself answers no for a GPU without touching it."""
    from types import SimpleNamespace

    import pyopencl as cl

    from tflgpu.runtime import transfers

    gpu = SimpleNamespace(devices=[SimpleNamespace(type=cl.device_type.GPU)])
    assert transfers.shares_host_memory(cl, gpu) is False
    monkeypatch.setattr(transfers, "shares_host_memory", lambda cl, ctx: False)
    model, _ = stem_model(rng, 3, "conv")
    plan = _plan(model, False)
    x = plan.sg.inputs[0]
    assert plan.io.staging[x].host_in is None and not plan.io.host_in
    for seed in (1, 2):
        feeds = [np.random.default_rng(seed).uniform(-1, 1, (1, 19, 23, 3)).astype(np.float32)]
        assert_close(plan.run(feeds)[plan.sg.outputs[0]], run_model(litert(), model, feeds)[0])


@pytest.mark.parametrize("shared", [True, False])
def test_an_interpreters_input_buffer_is_the_array_its_upload_reads(opencl_device, rng, monkeypatch, shared):
    """``set_tensor`` writes where the invoke's upload reads: into the host arena a CPU device reads in place (no
    copy at all), or into pinned memory (a mapped CL_MEM_ALLOC_HOST_PTR buffer) that a device with memory of its
    own gets one copy command from (a DMA, where from a pageable array the driver copies on the host first); each
    invoke sees its new values."""
    import pyopencl as cl

    from tflgpu.runtime import transfers

    if shared and not opencl_device.cl_device.type & cl.device_type.CPU:
        pytest.skip("a GPU's runtime may cache host memory: no arena read in place")
    if not shared:
        monkeypatch.setattr(transfers, "shares_host_memory", lambda cl, ctx: False)
    model, _ = stem_model(rng, 3, "conv")
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
    it.allocate_tensors()
    io, x = it.gpu_plan.io, it.gpu_plan.sg.inputs[0]
    st = io.staging[x]
    host = st.host_in if shared else st.pinned
    assert host is not None and (st.pinned if shared else st.host_in) is None
    assert list(it.gpu_plan.input_arrays()) == [x] and it.gpu_plan.input_arrays()[x] is host
    sources = counted_calls(io, "enqueue_copy", arg=2)
    for seed in (1, 2, 3):
        feed = np.random.default_rng(seed).uniform(-1, 1, (1, 19, 23, 3)).astype(np.float32)
        it.set_tensor(it.get_input_details()[0]["index"], feed)
        assert np.array_equal(host, feed)  # (written by set_tensor itself)
        sources.clear()
        it.invoke()
        assert sum(s is host for s in sources) == (0 if shared else 1)
        assert_close(it.get_tensor(it.get_output_details()[0]["index"]), run_model(litert(), model, [feed])[0])


def test_inputs_are_copied_from_pageable_arrays_where_no_pinned_memory_is_had(opencl_device, rng, monkeypatch, caplog):
    """A runtime refusing to map an ALLOC_HOST_PTR buffer costs the copies their pinned memory, logged, and nothing
    else: the Interpreter keeps its own input buffers, each invoke copies from them, and the output is read by a
    map of the arena it is made on."""
    import pyopencl as cl

    from tflgpu.runtime import transfers

    monkeypatch.setattr(transfers, "shares_host_memory", lambda cl, ctx: False)
    real_map = cl.enqueue_map_buffer

    def refuse(queue, buf, flags, *a, **k):
        if buf.flags & cl.mem_flags.ALLOC_HOST_PTR:
            raise cl.Error("clEnqueueMapBuffer failed: OUT_OF_HOST_MEMORY")
        return real_map(queue, buf, flags, *a, **k)

    monkeypatch.setattr(cl, "enqueue_map_buffer", refuse)
    model, _ = stem_model(rng, 3, "conv")
    with caplog.at_level("INFO", logger="tflgpu"):
        it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
        it.allocate_tensors()
    assert "no pinned host memory" in caplog.text and it.gpu_plan.input_arrays() == {}
    assert it.gpu_plan.io.host.at and not it.gpu_plan.io.pinned
    for seed in (1, 2):
        feed = np.random.default_rng(seed).uniform(-1, 1, (1, 19, 23, 3)).astype(np.float32)
        it.set_tensor(it.get_input_details()[0]["index"], feed)
        it.invoke()
        assert_close(it.get_tensor(it.get_output_details()[0]["index"]), run_model(litert(), model, [feed])[0])


def _head_model(rng, cin=160, cout=17):
    """x (1x9x11x8) -> 3x3 CONV_2D (cin) -> 1x1 CONV_2D to ``cout`` channels: a PoseNet head's last conv, a graph
    output."""
    b = ModelBuilder()
    x = b.input("x", (1, 9, 11, 8))
    feat = _conv(b, rng, "feat", x, 8, cin, 3, 1, (1, 9, 11, cin))
    head = _conv(b, rng, "head", feat, cin, cout, 1, 1, (1, 9, 11, cout), act="NONE")
    b.output(head)
    return b.build(), [rng.uniform(-1, 1, (1, 9, 11, 8)).astype(np.float32)]


@pytest.mark.parametrize("params", [None, {"group_tile": (8, 2), "tile_x": 1, "tile_s": 1, "lanes": 4,
                                           "vec_hint": None, "k_chunk": 4, "k_split": 4, "prefetch": True},
                                    {"group_tile": None, "tile_x": 2, "tile_s": 1, "lanes": 4, "vec_hint": None,
                                     "k_split": 1}],
                         ids=["default", "group tile, 4 shares, prefetch", "direct"])
@pytest.mark.parametrize("cout", [17, 32])
def test_a_gpus_group_tiled_head_writes_the_output_densely(opencl_device, rng, monkeypatch, fp16, params, cout):
    """Under a GPU's target a pointwise conv writing a graph output (its default a group tile: PoseNet's heads)
    writes the output's dense buffer itself, as a group tile (its sum shared or not) or as the direct kernel: no
    conversion pass after it. LiteRT's values."""
    from tflgpu.kernels.base import Target

    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
    model, feeds = _head_model(rng, cout=cout)
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
    head = max(op.index for op, _ in it.cpu_runner().steps)
    plan = GpuPlan(it.cpu_runner(), opencl_device, PlanConfig(fp16=fp16), params={head: params} if params else None)
    (spec,) = [sp for s in plan.steps if s.op.index == head for sp in s.specs]
    (out,) = it.model.main.outputs
    assert out in spec.dense and out in plan.make.dense
    assert (spec.params["group_tile"] is None) == (params is not None and params["group_tile"] is None)
    assert_close(plan.run(feeds)[out], run_model(litert(), model, feeds)[0], 1e-2 if fp16 else 1e-4)


def test_a_dense_output_refuses_the_forms_that_cannot_write_it():
    from tflgpu.kernels.conv import ConvKnobs, ConvShape

    shape = ConvShape(1, 1, 1, 1, 1, 1, sin=40, sout=5, row=99, pixels=99, w_bytes=3200, pointwise=True, gpu=True,
                      dense_out=True, subgroups="cl_khr_subgroups")
    ok = ConvKnobs(tile_x=1, tile_s=1, lanes=4, vec_hint=None, group_tile=(16, 4), k_chunk=8, k_split=4)
    assert ok.problems(shape) == []
    assert ConvKnobs.space(shape) == ConvKnobs.space(replace(shape, dense_out=False))  # (its records' family)
    for bad in ({"broadcast": 16, "group_tile": None, "k_split": 1}, {"winograd": True}):
        assert any("dense boundary" in p for p in replace(ok, **bad).problems(shape))


@pytest.mark.parametrize("shape,to", [((1, 16, 96), (1, 1536)), ((2, 3, 5, 7), (2, 105)), ((1, 4, 6, 10), (4, 60))])
def test_a_reshaped_graph_input_is_read_densely_by_its_reshape(opencl_device, rng, fp16, shape, to):
    """A graph input whose one reader is a RESHAPE (a wake-word model's [1, 16, 96] embeddings to [1, 1536] for its
    first FC): the reshape's kernel reads the input's dense buffer at each output value's row-major index, which
    the reshape keeps, so the input's conversion to slices goes (one kernel fewer); LiteRT's values, twice."""
    b = ModelBuilder()
    x = b.input("x", shape)
    flat, y = b.tensor("flat", to), b.tensor("y", to[:-1] + (9,))
    b.op("RESHAPE", [x, b.const("shape", np.array(to, np.int32))], [flat])
    b.op("FULLY_CONNECTED", [flat, b.const("w", rng.standard_normal((9, to[-1])).astype(np.float32)),
                             b.const("b", rng.standard_normal(9).astype(np.float32))], [y], keep_num_dims=True)
    b.output(y)
    model = b.build()
    plan = _plan(model, fp16)
    (xt,), (out,) = plan.sg.inputs, plan.sg.outputs
    reshape = next(s for s in plan.steps if s.op.name == "RESHAPE")
    assert xt in reshape.specs[0].dense and plan.io.staging[xt].to_device is None and xt not in plan.io.buffers
    assert plan.launch_count() == 2
    for _ in range(2):
        feeds = [rng.uniform(-2, 2, shape).astype(np.float32)]
        assert_close(plan.run(feeds)[out], run_model(litert(), model, feeds)[0], 1e-2 if fp16 else 1e-5)
