"""Every OpenCL generator on the available OpenCL device (the pip CPU runtime in CI), FP32 and FP16,
against LiteRT: FP32 within 1e-4 * max(1, max|ref|), FP16 within 1e-2 * max(1, max|ref|)."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate
from tflgpu.runtime.config import PlanConfig

from .oputil import CPU_OP, In, Out, check_op, cpu_op, op_model, rand

PRECISIONS = [pytest.param(False, id="fp32"), pytest.param(True, id="fp16")]
I32 = np.int32


@pytest.fixture(params=PRECISIONS)
def gpu(request, opencl_device):
    fp16 = request.param
    if fp16 and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    return {"delegate": GpuDelegate(precision_loss_allowed=fp16), "rtol_scale": 1e-2 if fp16 else 1e-4}


def _device():
    """The device the ``gpu`` fixture's plans run on, for a plan a test builds itself (GpuPlan)."""
    from tflgpu.runtime.device import choose_device

    return choose_device()


def _fp16(gpu) -> bool:
    """The ``gpu`` fixture's precision, for a plan a test builds itself (PlanConfig(fp16=...))."""
    return gpu["delegate"].precision_loss_allowed


@pytest.mark.parametrize("shape,cout,k,stride,dil,pad,act", [
    ((1, 9, 11, 3), 8, 3, 1, 1, "SAME", "RELU6"),
    ((2, 8, 8, 5), 6, 3, 2, 1, "VALID", "NONE"),
    ((1, 7, 7, 16), 12, 1, 1, 1, "SAME", "RELU"),
    ((1, 10, 9, 4), 7, 3, 1, 2, "SAME", "RELU_N1_TO_1"),
    ((1, 5, 6, 9), 3, 5, 2, 1, "SAME", "NONE"),
    ((1, 8, 7, 1), 5, 3, 2, 1, "SAME", "RELU"),  # one or two channels: the sum takes only those lanes
    ((2, 6, 6, 2), 9, 3, 1, 1, "VALID", "NONE"),
])
def test_conv2d(gpu, rng, shape, cout, k, stride, dil, pad, act):
    check_op("CONV_2D", [In(rand(rng, shape)), rand(rng, (cout, k, k, shape[3])), rand(rng, (cout,))],
             padding=pad, stride_w=stride, stride_h=stride, dilation_w_factor=dil, dilation_h_factor=dil,
             fused_activation_function=act, **gpu)


@pytest.mark.parametrize("cin", [1, 2, 3])
def test_a_thin_inputs_weights_hold_only_the_lanes_its_sum_takes(opencl_device, rng, cin):
    """A conv over one input slice of 1-3 channels (an RGB stem, a mel filterbank over raw samples) sums only
    those lanes at each tap, and its weights hold only those (``weights_oi(in_lanes=)``: a one-channel filter's a
    quarter of the four lanes' rows it read before, which a mel spectrogram's 257 x 512-tap filter spent its time
    streaming); each tile width and a FULLY_CONNECTED of 1-3 inputs, its sum in one work-item or split, against
    LiteRT."""
    from tflgpu.kernels.common import weights_oi

    from .conftest import assert_close, litert, plan_with_params, run_model
    from .oputil import op_model

    w = rand(rng, (10, 3, 5, cin))
    model, feeds = op_model("CONV_2D", [In(rand(rng, (1, 9, 13, cin))), w, rand(rng, (10,))], padding="SAME",
                            stride_w=2, stride_h=1, fused_activation_function="RELU")
    want = run_model(litert(), model, feeds)[0]
    for tile in ({"tile_x": 2, "tile_s": 1, "lanes": 4, "vec_hint": "float4"},
                 {"tile_x": 4, "tile_s": 2, "lanes": 8, "vec_hint": "float8"},
                 {"tile_x": 4, "tile_s": 4, "lanes": 16, "vec_hint": None, "strided": True}):
        it, plan = plan_with_params(opencl_device, model, ("CONV_2D",), tile)
        (spec,) = [s.specs[0] for s in plan.steps if s.op.name == "CONV_2D"]
        wts = spec.args[1].value  # (the tensor, then the weights)
        assert wts.size == weights_oi(w, tile["lanes"], tile["tile_s"]).size * cin // 4
        assert_close(plan.run(feeds)[it.model.main.outputs[0]], want)
    fc = [In(rand(rng, (2, cin))), rand(rng, (21, cin)), rand(rng, (21,))]  # (3 groups of 8 output channels)
    fc_model, fc_feeds = op_model("FULLY_CONNECTED", fc)
    for params in ({"split": 1}, {"split": 8, "wide": False}):
        it, plan = plan_with_params(opencl_device, fc_model, ("FULLY_CONNECTED",), params)
        assert [s.specs[0].params["split"] for s in plan.steps if s.op.name == "FULLY_CONNECTED"] == [params["split"]]
        assert_close(plan.run(fc_feeds)[it.model.main.outputs[0]], run_model(litert(), fc_model, fc_feeds)[0])


@pytest.mark.parametrize("cout", [1, 2, 3])
@pytest.mark.parametrize("shape,kh,kw,stride,pad", [((1, 12, 13, 8), 3, 3, 1, "SAME"), ((2, 9, 11, 33), 7, 3, 1, "VALID"),
                                                    ((1, 10, 10, 4), 5, 5, 2, "SAME")])
def test_conv2d_narrow_output(gpu, rng, cout, shape, kh, kw, stride, pad):
    """Fewer than 4 output channels over whole input slices (a mask's, a heatmap's, Basic Pitch's note and onset
    convs): each output channel's sum is a dot product of each input slice with that channel's weights, its lanes
    summed after the loop (``dot0_0``), where broadcasting each input lane took 4 mads a slice."""
    from tflgpu import Interpreter

    from .oputil import op_model

    inputs = [In(rand(rng, shape)), rand(rng, (cout, kh, kw, shape[3])), rand(rng, (cout,))]
    options = {"padding": pad, "stride_w": stride, "stride_h": stride, "fused_activation_function": "RELU"}
    check_op("CONV_2D", inputs, **options, **gpu)
    model, _ = op_model("CONV_2D", inputs, **options)
    (spec,) = Interpreter(model_content=model, delegate=gpu["delegate"]).gpu_plan.steps[0].specs
    assert "dot0_0" in spec.source and (f"dot{cout - 1}_0" in spec.source) and f"dot{cout}_0" not in spec.source


@pytest.mark.parametrize("tile_x,strided", [(1, False), (3, False), (7, True), (4, True)])
@pytest.mark.parametrize("units", [1, 3])
def test_narrow_output_register_tiles(opencl_device, rng, tile_x, strided, units):
    """The narrow form in each register tile of one output slice, adjacent pixels or strided ones, and a
    FULLY_CONNECTED of 1 and 3 units (a 1x1 conv of one pixel: a regressor's, a three-way classifier's)."""
    from .conftest import assert_close, litert, plan_with_params, run_model
    from .oputil import op_model

    params = {"tile_x": tile_x, "tile_s": 1, "lanes": 4, "vec_hint": "float4", "strided": strided}
    model, feeds = op_model("CONV_2D", [In(rand(rng, (1, 6, 17, 12))), rand(rng, (units, 3, 3, 12)),
                                        rand(rng, (units,))], padding="SAME", stride_w=1, stride_h=1)
    it, plan = plan_with_params(opencl_device, model, ("CONV_2D",), params)
    assert "dot0_0" in plan.steps[0].specs[0].source
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0])
    check_op("FULLY_CONNECTED", [In(rand(rng, (2, 40))), rand(rng, (units, 40)), rand(rng, (units,))],
             delegate=GpuDelegate())


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("tile_x,tile_s,lanes,hint", [(1, 1, 4, None), (2, 4, 4, "float4"), (8, 2, 4, None),
                                                      (4, 4, 8, "float8"), (2, 8, 8, "float8"), (1, 2, 8, None),
                                                      (4, 8, 16, "float16"), (2, 4, 16, None), (7, 4, 16, "float16"),
                                                      (5, 4, 16, None), (4, 16, 16, "float16"),
                                                      (4, 12, 16, "float16"), (2, 12, 16, None), (4, 6, 8, "float8")])
@pytest.mark.parametrize("mem", [False, True], ids=["float4-loads", "lane-loads"])
def test_conv2d_register_tiles(opencl_device, rng, tile_x, tile_s, lanes, hint, strided, mem):
    """Every register tile the generator offers computes the same conv (10 output channels: a 16-lane
    accumulator's last 6 lanes are padding), with each input slice loaded as a float4 or lane by lane where a
    tile lies inside the image (``mem_lanes``: a 9 x 13 image padded by one, so tiles of 2-16 pixels take both)."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()  # (the conv's input made on the device: a graph input's dense buffer has loads of its own)
    x, a, y = b.input("x", (1, 9, 13, 6)), b.tensor("a", (1, 9, 13, 6)), b.tensor("y", (1, 9, 13, 10))
    b.op("ABS", [x], [a])
    b.op("CONV_2D", [a, b.const("w", rand(rng, (10, 3, 3, 6))), b.const("b", rand(rng, (10,)))], [y],
         padding="SAME", stride_w=1, stride_h=1)
    b.output(y)
    model, feeds = b.build(), [rand(rng, (1, 9, 13, 6))]
    it = Interpreter(model_content=model, delegate=GpuDelegate())
    from tflgpu.runtime.executor import GpuPlan

    plan = GpuPlan(it.cpu_runner(), opencl_device, PlanConfig(fp16=False),
                   params={1: {"tile_x": tile_x, "tile_s": tile_s, "strided": strided, "vec_hint": hint,
                               "lanes": lanes, "mem_lanes": mem}})
    (spec,) = [s.specs[0] for s in plan.steps if s.op.name == "CONV_2D"]
    assert spec.params == {"tile_x": tile_x, "tile_s": tile_s, "strided": strided, "vec_hint": hint, "lanes": lanes,
                           "const_weights": False, "winograd": False, "local_size": None, "group_tile": None,
                           "k_chunk": 8, "k_split": 1, "split": 1, "image_weights": False, "half_math": False,
                           "broadcast": 0, "prefetch": False, "mem_lanes": mem, "signal": 0}
    assert ("LD1(src, (row + ix0) * 4 + 0)" in spec.source) == mem
    from tflgpu.kernels.conv import CONV_SPACE

    assert all(v in CONV_SPACE[k] for k, v in spec.params.items())  # a point of the generator's full space
    assert set(spec.space) <= set(CONV_SPACE)  # (pruned to what can change this conv's code)
    got = plan.run(feeds)[it.model.main.outputs[0]]
    assert_close(got, run_model(litert(), model, feeds)[0])


@pytest.mark.parametrize("shape,cout,k,stride,dil,pad,tile", [
    ((1, 9, 11, 6), 37, 3, 1, 1, "SAME", (4, 8)),  # 10 output slices: the last accumulator half padding
    ((2, 8, 8, 12), 33, 3, 2, 1, "VALID", (2, 4)),
    ((1, 10, 9, 8), 64, 3, 1, 2, "SAME", (4, 8)),
    ((1, 7, 7, 40), 48, 1, 1, 1, "VALID", (8, 4)),  # pointwise: the image as one row
])
def test_conv2d_16_lane_tiles(gpu, rng, shape, cout, k, stride, dil, pad, tile):
    """float16 accumulators (four output slices per vector: the AVX-512 CPU device's default) compute the same
    conv as LiteRT, at FP32 and FP16, with a fused activation, batches, strides, dilation and padded slices."""
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    model, feeds = op_model("CONV_2D", [In(rand(rng, shape)), rand(rng, (cout, k, k, shape[3])), rand(rng, (cout,))],
                            padding=pad, stride_w=stride, stride_h=stride, dilation_w_factor=dil,
                            dilation_h_factor=dil, fused_activation_function="RELU6")
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    params = {"tile_x": tile[0], "tile_s": tile[1], "lanes": 16, "vec_hint": "float16", "group_tile": None}
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)), params={0: params})
    (spec,) = plan.steps[0].specs
    assert {k: spec.params[k] for k in params} == params and "float16 acc" in spec.source
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("cout,tile", [(24, (6, 8)), (48, (12, 16)), (72, (6, 8)), (64, (8, 16)), (40, (12, 16))])
def test_windowed_conv_tiles_leave_few_slices_unused(gpu, rng, cout, tile):
    """A windowed conv's default on a 16-lane device takes 8 output slices a work-item where they tile the output,
    else 12 (three float16 accumulators a pixel) or 6 (three float8s), whichever leaves fewer unused (openWakeWord's
    1x3 / 3x1 convs of 24, 48 and 72 channels); the tile it picks computes LiteRT's conv, on a row narrower than
    the default's 4 pixels too."""
    from tflgpu import Interpreter
    from tflgpu.kernels.conv import slice_tile
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    assert slice_tile((cout + 3) // 4) == tile
    for shape in ((1, 9, 8, 12), (1, 6, 2, 12)):
        model, feeds = op_model("CONV_2D", [In(rand(rng, shape)), rand(rng, (cout, 1, 3, 12)), rand(rng, (cout,))],
                                padding="SAME", stride_w=1, stride_h=1, fused_activation_function="RELU")
        it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
        plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)))
        (spec,) = plan.steps[0].specs
        if plan.make.target.float_lanes >= 16 and not plan.make.target.gpu:
            assert (spec.params["tile_s"], spec.params["lanes"], spec.params["tile_x"]) == (*tile, min(4, shape[2]))
        assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0],
                     gpu["rtol_scale"])


@pytest.mark.parametrize("shape,mult,k,stride,dil,pad", [
    ((1, 9, 9, 8), 1, 3, 1, 1, "SAME"),
    ((1, 10, 7, 6), 1, 3, 2, 1, "SAME"),
    ((1, 8, 8, 5), 2, 3, 1, 1, "VALID"),
    ((1, 9, 9, 4), 1, 3, 1, 2, "SAME"),
    ((2, 6, 6, 3), 1, 5, 1, 1, "SAME"),
    ((2, 7, 6, 20), 1, 3, 1, 1, "SAME"),  # an odd slice count: the last pair's second half is padding
    ((1, 6, 5, 18), 1, 3, 2, 1, "VALID"),
    ((2, 7, 9, 6), 2, 3, 2, 1, "SAME"),  # channel multipliers dividing 4: a shuffle of one input slice
    ((1, 6, 7, 3), 4, 3, 1, 2, "SAME"),
    ((1, 6, 6, 5), 3, 3, 1, 1, "SAME"),  # others: each lane's input channel gathered
])
def test_depthwise(gpu, rng, shape, mult, k, stride, dil, pad):
    c = shape[3]
    check_op("DEPTHWISE_CONV_2D", [In(rand(rng, shape)), rand(rng, (1, k, k, c * mult)), rand(rng, (c * mult,))],
             padding=pad, stride_w=stride, stride_h=stride, dilation_w_factor=dil, dilation_h_factor=dil,
             depth_multiplier=mult, fused_activation_function="RELU6", **gpu)


@pytest.mark.parametrize("params", [{"slices": 1, "vec_hint": "float4"}, {"slices": 2, "vec_hint": "float8", "tile_x": 1},
                                    {"slices": 2, "vec_hint": None, "tile_x": 8},
                                    {"slices": 4, "vec_hint": "float16", "tile_x": 4},
                                    {"slices": 4, "vec_hint": None, "tile_x": 2}])
def test_depthwise_variants(gpu, rng, params):
    """Each depthwise variant (one slice per work-item, or two / four in float8 / float16 math) computes the same
    conv, with a fused activation, a batch, and a slice count (5) that leaves the last group part padding."""
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    model, feeds = op_model("DEPTHWISE_CONV_2D", [In(rand(rng, (2, 7, 6, 20))), rand(rng, (1, 3, 3, 20)),
                                                  rand(rng, (20,))], padding="SAME", stride_w=1, stride_h=1,
                            depth_multiplier=1, fused_activation_function="RELU6")
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)), params={0: params})
    (spec,) = plan.steps[0].specs
    assert {k: spec.params[k] for k in params} == params
    assert ("float8 acc" in spec.source, "float16 acc" in spec.source) == (params["slices"] == 2, params["slices"] == 4)
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("op", ["CONV_2D", "DEPTHWISE_CONV_2D"])
@pytest.mark.parametrize("local_size", [(8, 1, 1), (16, 2, 1), (8, 4, 1)])
def test_work_group_fitted_to_the_grid(opencl_device, rng, op, local_size):
    """A direct conv's or depthwise conv's ``local_size`` knob is the most each dimension takes: on a 13 x 11 image
    (a grid of 13 / tile_x pixels by 11 rows) its kernel launches the largest group within it that divides the
    grid, not the driver's choice (NVIDIA's enqueue costs ~5 us more without a work-group), and computes what
    LiteRT does."""
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    shape = (1, 11, 13, 8)
    w = rand(rng, (12, 3, 3, 8)) if op == "CONV_2D" else rand(rng, (1, 3, 3, 8))
    opts = {"depth_multiplier": 1} if op == "DEPTHWISE_CONV_2D" else {}
    model, feeds = op_model(op, [In(rand(rng, shape)), w, rand(rng, (w.shape[0] if op == "CONV_2D" else 8,))],
                            padding="SAME", stride_w=1, stride_h=1, fused_activation_function="RELU6", **opts)
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    params = {"tile_x": 1, "local_size": local_size} if op == "DEPTHWISE_CONV_2D" else \
        {"tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": None, "group_tile": None, "local_size": local_size}
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(), params={0: params})
    (spec,) = plan.steps[0].specs
    assert spec.params["local_size"] == local_size and spec.global_size[:2] == (13, 11)
    assert spec.local_size == tuple(max(d for d in range(1, w + 1) if g % d == 0)
                                    for g, w in zip(spec.global_size, local_size)) != local_size
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0])


@pytest.mark.parametrize("batch,depth,units", [(1, 10, 7), (3, 16, 9)])
def test_fully_connected(gpu, rng, batch, depth, units):
    check_op("FULLY_CONNECTED", [In(rand(rng, (batch, depth))), rand(rng, (units, depth)), rand(rng, (units,))],
             fused_activation_function="RELU", **gpu)


@pytest.mark.parametrize("x_shape,units,bias,act", [((1, 196, 64), 96, True, "NONE"), ((2, 7, 40), 24, False, "RELU6"),
                                                  ((1, 5, 6, 36), 10, True, "RELU"), ((1, 3, 130), 257, True, "NONE")])
def test_fully_connected_per_token(gpu, rng, x_shape, units, bias, act):
    """A FULLY_CONNECTED over the last axis of a rank-3 / 4 input, keeping its dims (a transformer's per-token dense
    layer) runs on the device as a 1x1 conv over the slice layout's pixels; one whose output flattens the rows
    stays on the CPU (its slices are ordered otherwise)."""
    depth = x_shape[-1]
    inputs = [In(rand(rng, x_shape)), rand(rng, (units, depth)), rand(rng, (units,)) if bias else None]
    check_op("FULLY_CONNECTED", inputs, keep_num_dims=True, fused_activation_function=act, **gpu)
    check_op("FULLY_CONNECTED", inputs, keep_num_dims=False, fused_activation_function=act, **gpu,
             expect_on_device=False)


@pytest.mark.parametrize("x_shape,units,act,shared", [((1, 40, 20), 8, "RELU", False), ((2, 3, 5, 12), 7, "NONE", False),
                                                       ((1, 40, 20), 8, "NONE", True)])
def test_tensordot_reshapes_fold_into_the_fully_connected(gpu, rng, x_shape, units, act, shared):
    """RESHAPE to rows -> FULLY_CONNECTED -> RESHAPE back (TensorFlow's Tensordot) is one per-token
    FULLY_CONNECTED on the device (graph.passes.fold_tensordot: the two reshapes, which reorder the slice layout,
    go); where another op reads the rows too (``shared``) the three stay as they are. Both match LiteRT."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, assert_fp16_close, litert, run_model

    b = ModelBuilder()
    x = b.input("x", x_shape)
    n, c = int(np.prod(x_shape[:-1])), x_shape[-1]
    rows, dense = b.tensor("rows", (n, c)), b.tensor("dense", (n, units))
    b.op("RESHAPE", [x, b.const("to_rows", np.array([n, c], np.int32))], [rows])
    b.op("FULLY_CONNECTED", [rows, b.const("w", rand(rng, (units, c))), b.const("b", rand(rng, (units,)))], [dense],
         fused_activation_function=act, keep_num_dims=False)
    y = b.tensor("y", x_shape[:-1] + (units,))
    b.op("RESHAPE", [dense, b.const("back", np.array(x_shape[:-1] + (units,), np.int32))], [y])
    out = b.tensor("out", x_shape[:-1] + (units,))
    b.op("ADD", [y, b.const("one", np.ones(units, np.float32))], [out], fused_activation_function="NONE")
    outputs = [out]
    if shared:
        doubled = b.tensor("doubled", (n, c))
        b.op("MUL", [rows, b.const("two", np.array(2.0, np.float32))], [doubled], fused_activation_function="NONE")
        outputs.append(doubled)
    b.output(*outputs)
    data = b.build()
    feeds = [rand(rng, x_shape)]
    it = Interpreter(model_content=data, delegate=gpu["delegate"])
    got = run_model(lambda **kw: it, data, feeds)
    assert it.gpu_plan.pass_counts["fold_tensordot"] == (0 if shared else 2)
    if not shared:
        assert it.gpu_plan.cpu_op_count == 0 and len(it.gpu_plan.steps) == 1, \
            [(s.op.name, s.device, s.reason) for s in it.gpu_plan.steps]
    for g, w in zip(got, run_model(litert(), data, feeds)):
        (assert_fp16_close if gpu["rtol_scale"] > 1e-3 else assert_close)(g, w)


@pytest.mark.parametrize("cin,cout,pool,pad_first,batch", [(5, 12, True, False, 1), (8, 16, False, True, 1),
                                                         (6, 9, True, True, 1), (6, 9, True, False, 2),
                                                         (8, 8, True, False, 1), (7, 7, True, True, 1)])
def test_channel_pad_read_through_by_the_fused_add(gpu, rng, cin, cout, pool, pad_first, batch):
    """A residual block widening its skip branch, RELU(conv(x) + PAD(skip, zero channels after the last)) with the
    skip a 2x2 MAX_POOL of x or x itself (no PAD where the channels stay): the conv's kernel reads x through them,
    each value its window's maximum, the missing slices zeros, and neither launches (graph.passes.fuse_elementwise);
    a batch of 2 keeps their kernels. Both match LiteRT."""
    from tflgpu import Interpreter

    from .conftest import assert_close, assert_fp16_close, litert, run_model
    from .oputil import widened_block

    b, _ = widened_block(rng, cin=cin, cout=cout, batch=batch, pool=pool, pad_first=pad_first)
    data = b.build()
    feeds = [rand(rng, (batch, 8, 8, cin))]
    it = Interpreter(model_content=data, delegate=gpu["delegate"])
    got = run_model(lambda **kw: it, data, feeds)
    names = [s.op.name for s in it.gpu_plan.steps]
    assert it.gpu_plan.cpu_op_count == 0 and ("PAD" in names) == (batch > 1 and cout > cin), names
    assert ("MAX_POOL_2D" in names) == (batch > 1 and pool) and len(names) == (1 if batch == 1 else 2 + pool), names
    for g, w in zip(got, run_model(litert(), data, feeds)):
        (assert_fp16_close if gpu["rtol_scale"] > 1e-3 else assert_close)(g, w)


@pytest.mark.parametrize("split,tile_s", [(8, 1), (16, 2), (32, 4), (64, 1)])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_fully_connected_split_sum(opencl_device, rng, split, tile_s, precision):
    """The split-sum FC (work-items of a work-group each summing every split-th input slice, added in local
    memory: a GPU-shaped variant for small output counts) computes the FC, batched, with a fused ADD."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, assert_fp16_close, litert, run_model

    if precision == "fp16" and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    batch, depth, units = 3, 150, 37  # (38 input slices: not a multiple of any split; 10 output slices)
    b = ModelBuilder()
    x = b.input("x", (batch, depth))
    r = b.input("r", (batch, units))
    y = b.tensor("y", (batch, units))
    b.op("FULLY_CONNECTED", [x, b.const("w", rand(rng, (units, depth))), b.const("b", rand(rng, (units,)))], [y],
         fused_activation_function="RELU")
    z = b.tensor("z", (batch, units))
    b.op("ADD", [y, r], [z], fused_activation_function="NONE")
    b.output(z)
    model = b.build()
    feeds = [rand(rng, (batch, depth)), rand(rng, (batch, units))]
    it = Interpreter(model_content=model, delegate=GpuDelegate())
    plan = GpuPlan(it.cpu_runner(), opencl_device, PlanConfig(fp16=precision == "fp16"),
                   params={0: {"split": split, "tile_s": tile_s, "wide": False}})
    (step,) = [s for s in plan.steps if s.device == "gpu"]
    assert step.epilogue and step.specs[0].local_size == (split, 1, 1) and step.specs[0].params["split"] == split
    got = plan.run(feeds)[it.model.main.outputs[0]]
    want = run_model(litert(), model, feeds)[0]
    (assert_fp16_close if precision == "fp16" else assert_close)(got, want)


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE"])
@pytest.mark.parametrize("shape_b", [(1, 5, 6, 7), (7,), (1, 1, 1, 1), (1, 5, 1, 7)])
def test_binary(gpu, rng, op, shape_b):
    a = rand(rng, (1, 5, 6, 7), -2, 2)
    b = rand(rng, shape_b, 0.5, 2)
    opts = {"fused_activation_function": "RELU6"} if op in ("ADD", "SUB", "MUL", "DIV") else {}
    check_op(op, [In(a), In(b)], **opts, **gpu)


@pytest.mark.parametrize("shape_b,const", [((3, 1, 2), True), ((3, 1, 2), False), ((2, 2), True), ((1, 2), False)])
def test_binary_broadcast_of_a_lower_rank_operand(gpu, rng, shape_b, const):
    """A lower-rank operand aligns to the output's last dims (numpy, TFLite): (3, 1, 2) against (3, 3, 2, 2) is
    (1, 3, 1, 2). The valid-model fuzz's finding (seed 901699): the constant was read as (3, 1, 1, 2), its 3 on the
    batch, and a MAXIMUM was off by 0.76 of 0.82. A device tensor stored in another order falls back to the CPU."""
    b = rand(rng, shape_b)
    check_op("MAXIMUM", [In(rand(rng, (3, 3, 2, 2))), b if const else In(b)], **gpu,
             expect_on_device=const or shape_b == (1, 2))


@pytest.mark.parametrize("shape_a,shape_b,unary", [
    ((1, 4001), (1, 1), "NONE"),  # a signal of one row: one pixel of 1,001 slices (BirdNET's 144,000 samples)
    ((7, 30), (30,), "RELU"),  # rows of features: a rank-2 tensor is one pixel a row
    ((3, 1, 1, 18), (3, 1, 1, 18), "NONE"),  # a pooled head's [batch, 1, 1, channels]
])
def test_one_pixel_rows_run_slices_first(gpu, rng, shape_a, shape_b, unary):
    """Where each row of a tensor has one pixel, an elementwise kernel's grid runs along the slices first
    (kernels.elementwise.grid: a CPU runtime vectorizes along the grid's first dimension, which the pixels made 1
    wide; BirdNET's normalization of its [1, 144000] signal took 633-747 us a kernel on the Intel CPU device, 68-84
    after), with a broadcast operand and a fused op, and computes LiteRT's values."""
    from tflgpu import Interpreter

    from .oputil import op_model

    a, b = rand(rng, shape_a, -2, 2), rand(rng, shape_b, 0.5, 2)
    check_op("SUB", [In(a), In(b)], fused_activation_function=unary, **gpu)
    model, _ = op_model("SUB", [In(a), In(b)], fused_activation_function=unary)
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    (spec,) = [sp for s in it.gpu_plan.steps if s.device == "gpu" for sp in s.specs]
    slices, rows = (shape_a[-1] + 3) // 4, int(np.prod(shape_a[:-1]))
    assert spec.global_size == (slices, rows, 1)


def test_binary_with_constant(gpu, rng):
    check_op("MUL", [In(rand(rng, (1, 4, 4, 6))), rand(rng, (6,))], **gpu)


def test_open_ended_clip_then_log_in_one_region(gpu, rng):
    """openWakeWord's melspectrogram clips with an open end (tf.clip_by_value(x, 1e-10, inf): a MINIMUM with +inf),
    in a region of elementwise steps (graph.passes.fuse_regions), which writes its scalar constants into the kernel:
    +inf was written "inff", which OpenCL C does not know, and the region fell back to the CPU. Infinities and NaN
    are its built-in constants now (kernels.common.c_float). Here MINIMUM(x, inf) is read by two branches (one a
    MAXIMUM with -inf), joined again."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x = b.input("x", (1, 1, 5, 32))
    clip, floor, log, scaled, out = (b.tensor(n, (1, 1, 5, 32)) for n in ("clip", "floor", "log", "scaled", "out"))
    b.op("MINIMUM", [x, b.const("inf", np.array(np.inf, np.float32))], [clip])
    b.op("MAXIMUM", [clip, b.const("tiny", np.array(1e-10, np.float32))], [floor])
    b.op("LOG", [floor], [log])
    b.op("MAXIMUM", [clip, b.const("-inf", np.array(-np.inf, np.float32))], [scaled])
    b.op("ADD", [log, scaled], [out])
    b.output(out)
    model = b.build()
    feed = [rand(rng, (1, 1, 5, 32), -1, 50)]
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    assert it.gpu_plan.cpu_op_count == 0, [s.reason for s in it.gpu_plan.steps if s.device == "cpu"]
    if not _fp16(gpu):  # (an FP16 plan keeps the LOG's operand in FP32 there: casts between, no region)
        assert [s.op.name for s in it.gpu_plan.steps] == ["TFLGPU_ELEMENTWISE_REGION"]
    got = run_model(lambda **kw: it, model, feed)[0]
    assert_close(got, run_model(litert(), model, feed)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("op,lo,hi", [("RELU", -2, 2), ("RELU6", -3, 9), ("RELU_N1_TO_1", -3, 3), ("LOGISTIC", -6, 6),
                                      ("TANH", -3, 3), ("EXP", -3, 3), ("HARD_SWISH", -5, 5), ("ABS", -2, 2),
                                      ("RSQRT", 0.2, 4), ("SQRT", 0, 4), ("NEG", -1, 1), ("ELU", -3, 3),
                                      ("LOG", 0.2, 4), ("SQUARE", -2, 2), ("GELU", -5, 3), ("RELU_0_TO_1", -1, 2)])
def test_unary(gpu, rng, op, lo, hi):
    check_op(op, [In(rand(rng, (1, 4, 5, 7), lo, hi))], **gpu)


def test_gelu_approximate(gpu, rng):
    check_op("GELU", [In(rand(rng, (1, 4, 5, 7), -5, 3))], approximate=True, **gpu)


@pytest.mark.parametrize("op", ["FLOOR", "CEIL", "ROUND", "SIGN"])
def test_step_functions(gpu, rng, op):
    """On a grid of quarters (FP16 holds each exactly): ROUND's halves go to the even neighbour, as TFLite's; SIGN
    of a zero is +0.0 (TFLite's (0 < x) - (x < 0)), whichever zero it reads."""
    x = (rng.integers(-14, 15, (1, 4, 5, 7)) / 4).astype(np.float32)
    x[0, 0, 0, :2] = [0.0, -0.0]
    (got,) = check_op(op, [In(x)], **gpu)
    if op == "SIGN":
        assert not np.signbit(got[got == 0]).any()


@pytest.mark.parametrize("op", ["SIGN", "HARD_SWISH", "ELU", "FLOOR_MOD"])
def test_special_values_on_device(opencl_device, op):
    """NaN, infinities, signed zeros and values near float32's largest as LiteRT's builtin kernels give them, on the
    device (FP32): the CPU kernels' test with the delegate."""
    from .oputil import check_special_values

    check_special_values(op, delegate=GpuDelegate(cache=False))


@pytest.mark.parametrize("op", ["POW", "FLOOR_MOD", "ATAN2"])
def test_more_binary_ops(gpu, rng, op):
    """POW of positive bases, and of negative ones by whole exponents; FLOOR_MOD of either sign by either sign,
    on quarters (exact in FP16: fmod is exact, and so is adding the divisor back); ATAN2 in all four quadrants
    (LiteRT's takes operands of one shape only)."""
    a = (rng.integers(-14, 15, (1, 3, 4, 6)) / 4).astype(np.float32)
    b = (rng.choice([-1, 1], (6,)) * rng.integers(1, 9, (6,)) / 4).astype(np.float32)
    if op == "POW":
        a = np.where(np.arange(6) < 3, np.abs(a) + 0.25, a).astype(np.float32)
        b = np.where(np.arange(6) < 3, rand(rng, (6,), -2, 2), np.round(b * 2)).astype(np.float32)
    if op != "ATAN2":
        check_op(op, [In(a), b], **gpu)
    check_op(op, [In(a), In(np.broadcast_to(b, a.shape).copy())], **gpu)


def test_leaky_relu_and_prelu(gpu, rng):
    check_op("LEAKY_RELU", [In(rand(rng, (1, 4, 4, 6)))], alpha=0.2, **gpu)
    check_op("PRELU", [In(rand(rng, (1, 4, 4, 6))), rand(rng, (6,))], **gpu)


@pytest.mark.parametrize("alpha_shape,fused", [((1, 1, 10), True), ((10,), True), ((1,), True),
                                               ((5, 6, 10), False)], ids=["per-channel", "vector", "scalar", "full"])
def test_prelu_after_a_conv_is_its_fused_op(gpu, rng, alpha_shape, fused):
    """A PRELU whose alpha is a scalar or one value per channel (U-Net's, Keras' PReLU shared over the image) is
    the conv's fused op: one kernel (10 channels: the padded lanes of the last slice), as in a region of
    elementwise ops; an alpha per pixel keeps its own kernel. LiteRT's values."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x = b.input("x", (1, 5, 6, 3))
    y, z = b.tensor("y", (1, 5, 6, 10)), b.tensor("z", (1, 5, 6, 10))
    b.op("CONV_2D", [x, b.const("w", rng.standard_normal((10, 3, 3, 3)).astype(np.float32)),
                     b.const("b", rng.standard_normal(10).astype(np.float32))], [y],
         padding="SAME", stride_w=1, stride_h=1)
    b.op("PRELU", [y, b.const("alpha", rng.uniform(0.05, 0.5, alpha_shape).astype(np.float32))], [z])
    b.output(z)
    model = b.build()
    feeds = [rand(rng, (1, 5, 6, 3), -1, 1)]
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False,
                                                               precision_loss_allowed=_fp16(gpu)))
    plan = it.gpu_plan
    conv = [s for s in plan.steps if s.op.name == "CONV_2D"]
    assert [f.op.name for f in conv[0].epilogue] == (["PRELU"] if fused else [])
    assert plan.launch_count() == (1 if fused else 2) and plan.cpu_op_count == 0
    assert_close(run_model(lambda **kw: it, model, feeds)[0], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("op", ["AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"])
@pytest.mark.parametrize("pad", ["SAME", "VALID"])
def test_pool(gpu, rng, op, pad):
    check_op(op, [In(rand(rng, (1, 9, 8, 6)))], padding=pad, stride_w=2, stride_h=2, filter_width=3,
             filter_height=3, **gpu)


@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("op,window,pad,act", [
    ("MAX_POOL_2D", (2, 2, 2, 2), "VALID", "NONE"),  # every window inside the image: its taps unrolled
    ("MAX_POOL_2D", (1, 2, 1, 2), "VALID", "RELU"),  # (openWakeWord's pools over the time axis only)
    ("AVERAGE_POOL_2D", (3, 3, 2, 2), "SAME", "RELU6"),  # windows clipped at the border: the count varies
    ("AVERAGE_POOL_2D", (2, 3, 1, 2), "VALID", "NONE"),
    ("L2_POOL_2D", (2, 2, 2, 1), "SAME", "NONE"),
    ("AVERAGE_POOL_2D", (9, 12, 9, 12), "VALID", "NONE"),  # a global pool of 108 taps: a loop, not unrolled
    ("MAX_POOL_2D", (9, 8, 1, 4), "VALID", "RELU"),  # 72 taps a window, two windows a row
])
def test_pool_forms(gpu, rng, rows, op, window, pad, act):
    """Both pooling forms, a work-item per output float4 (a GPU's) and a work-item per output row (a CPU device's
    default), compute LiteRT's pool: windows inside the image (unrolled, or a loop past UNROLLED_TAPS) and clipped
    at its border, 10 channels (a part-filled last slice), two images, a fused activation."""
    from tflgpu.kernels.pool import UNROLLED_TAPS, PoolKnobs, PoolShape
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    kh, kw, sh, sw = window
    x = rand(rng, (2, 9, 12, 10))
    model, feeds = op_model(op, [In(x)], padding=pad, filter_height=kh, filter_width=kw, stride_h=sh, stride_w=sw,
                            fused_activation_function=act)
    from tflgpu import Interpreter

    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)), params={0: {"rows": rows}})
    (spec,) = plan.steps[0].specs
    assert spec.params == {"rows": rows} and ("vec_type_hint(float4)" in spec.source) == rows
    assert ("for (int ky" in spec.source) == (kh * kw > UNROLLED_TAPS) and len(spec.source) < 4000
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])
    # the default: rows on a CPU device, a float4 a work-item on a GPU
    assert PoolKnobs.default(PoolShape(6, gpu=False)).rows and not PoolKnobs.default(PoolShape(6, gpu=True)).rows


@pytest.mark.parametrize("keep", [True, False])
def test_mean_spatial(gpu, rng, keep):
    check_op("MEAN", [In(rand(rng, (2, 5, 6, 7))), np.array([1, 2], I32)], keep_dims=keep, **gpu)


@pytest.mark.parametrize("op", ["REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"])
@pytest.mark.parametrize("keep", [True, False])
def test_spatial_extremes_and_product(gpu, rng, op, keep):
    """(the product's factors near 1, so that 30 of them neither vanish nor overflow)"""
    x = rand(rng, (2, 5, 6, 7), 0.8, 1.25) if op == "REDUCE_PROD" else rand(rng, (2, 5, 6, 7))
    check_op(op, [In(x), np.array([1, 2], I32)], keep_dims=keep, **gpu)


@pytest.mark.parametrize("op", ["MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"])
@pytest.mark.parametrize("shape", [(1, 7, 96), (2, 3, 4, 10), (5, 13), (1, 3, 1030)])
@pytest.mark.parametrize("keep", [True, False])
def test_reductions_over_the_last_axis(gpu, rng, op, shape, keep):
    """A layer norm's MEAN over the channels, a per-token SUM / max / min / product: one row a work-item, in order
    (1,030 channels: many slices; 10 and 13: a part-filled last slice); rank 2 to 4, kept dims or not."""
    x = rand(rng, shape, 0.995, 1.005) if op == "REDUCE_PROD" else rand(rng, shape)
    check_op(op, [In(x), np.array([-1], I32)], keep_dims=keep, **gpu)


@pytest.mark.parametrize("op", ["REDUCE_MAX", "REDUCE_MIN"])
def test_reductions_over_the_last_axis_after_a_nan(opencl_device, op):
    """The channels folded in order as TFLite folds them: the extreme after the last NaN, NaN where it is last."""
    x = np.array([[1, np.nan, 0.5, 0.2, 3], [np.nan, 3, 2, 1, 0], [1, 2, 3, 4, np.nan], [5, np.nan, -np.inf, 1, 0]],
                 np.float32).reshape(1, 4, 5)
    check_op(op, [In(x if op == "REDUCE_MAX" else -x), np.array([2], I32)], keep_dims=False,
             delegate=GpuDelegate(cache=False))


@pytest.mark.parametrize("group", [1, 32])
@pytest.mark.parametrize("op", ["REDUCE_MAX", "REDUCE_MIN"])
def test_spatial_extremes_after_a_nan(gpu, rng, op, group):
    """LiteRT's REDUCE_MAX / MIN (XNNPACK and the builtin kernels alike) fold acc > x ? acc : x in pixel order: the
    extreme of the pixels after the last NaN, NaN where the last pixel is one (fmax would skip every NaN). A NaN
    first, in the middle, last, and among infinities; in one work-item and in a work-group's strided shares."""
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import litert, run_model
    from .oputil import op_model

    x = rand(rng, (2, 5, 6, 8))
    x[0, 0, 0, 0] = x[0, 3, 4, 1] = x[1, 4, 5, 2] = x[0, 4, 5, 5] = np.nan
    x[1, :, :, 3], x[1, 2, 2, 3] = -np.inf if op == "REDUCE_MAX" else np.inf, np.nan
    model, feeds = op_model(op, [In(x), np.array([1, 2], I32)], keep_dims=False)
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)), params={0: {"group": group}})
    want = run_model(litert(), model, feeds)[0]
    assert np.isnan(want).sum() == 2 and np.isinf(want).sum() == 1  # (the last pixels' NaNs; after one, infinities)
    got = plan.run(feeds)[it.model.main.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-3 if _fp16(gpu) else 0)  # (NaN where NaN, infinities equal)


@pytest.mark.parametrize("shape", [(1, 10), (2, 3, 7), (1, 4, 4, 6)])
def test_softmax(gpu, rng, shape):
    check_op("SOFTMAX", [In(rand(rng, shape, -4, 4))], beta=1.0, **gpu)


@pytest.mark.parametrize("shape", [(1, 10), (2, 3, 7), (1, 4, 4, 6), (1, 1001)])
def test_log_softmax_and_l2_normalization(gpu, rng, shape):
    check_op("LOG_SOFTMAX", [In(rand(rng, shape, -4, 4))], **gpu)
    check_op("L2_NORMALIZATION", [In(rand(rng, shape, -4, 4))], **gpu)  # (LiteRT takes no fused activation)
    x = rand(rng, shape, -4, 4)  # (a row holding a NaN is NaN, as TFLite's std::max keeps it; an infinity's too)
    x.reshape(-1, shape[-1])[0, 1], x.reshape(-1, shape[-1])[-1, 0] = np.nan, np.inf
    check_op("L2_NORMALIZATION", [In(x)], **gpu)
    if _fp16(gpu):
        return  # (values of 1e-7 to 1e-4 are half's subnormals: FP16 storage holds them to a few bits)
    # rows of norm 1e-7 to 3e-4, about TFLite's clamp of the norm at 1e-6 (the valid-model fuzz's seed 7401338: a
    # norm of 1.04e-4 came out 0.104 where LiteRT's is 1, the square clamped instead of the norm)
    tiny = rand(rng, shape, -1, 1) * np.float32(10.0) ** rng.integers(-7, -3, shape[:-1] + (1,)).astype(np.float32)
    check_op("L2_NORMALIZATION", [In(tiny.astype(np.float32))], **gpu)


def _reduction_knobs(device, group: int, subgroups: bool) -> dict:
    """The reduction knobs asked for; a sub-group form is skipped on a device without sub-group functions."""
    from tflgpu.kernels.base import Target

    if subgroups and Target.of(device.cl_device, device.identity.device_type).subgroups is None:
        pytest.skip("the device has neither cl_khr_subgroups nor cl_intel_subgroups")
    return {"group": group, "subgroups": subgroups}


@pytest.mark.parametrize("op,subgroups", [(op, sub) for op in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD")
                                           for sub in (False, True) if op != "REDUCE_PROD" or not sub])
@pytest.mark.parametrize("group", [32, 256])
@pytest.mark.parametrize("shape", [(2, 5, 6, 7), (1, 32, 32, 9)])
def test_spatial_mean_work_group(gpu, rng, shape, group, op, subgroups):
    """A work-group per (image, slice) reduces its pixels (the reduction knob ``group``), fewer pixels than the
    group and more, in local memory or by sub-groups (none takes a product), against LiteRT."""
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    # (a product's factors near 1: 1,024 of them neither vanish nor overflow)
    x = rand(rng, shape, 0.97, 1.03) if op == "REDUCE_PROD" else rand(rng, shape)
    model, feeds = op_model(op, [In(x), np.array([1, 2], I32)], keep_dims=True)
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    knobs = _reduction_knobs(_device(), group, subgroups)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)), params={0: knobs})
    (spec,) = plan.steps[0].specs
    assert spec.local_size == (group, 1) and ("sub_group_reduce" in spec.source) == subgroups
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("subgroups", [False, True])
@pytest.mark.parametrize("group", [32, 64, 256])
@pytest.mark.parametrize("shape", [(1, 1001), (3, 2, 130), (2, 5)])
@pytest.mark.parametrize("op", ["SOFTMAX", "LOG_SOFTMAX", "L2_NORMALIZATION"])
def test_softmax_work_group_rows(gpu, rng, op, shape, group, subgroups):
    """A work-group per row (the knob ``group``: each pass shared, max and sum reduced in local memory or by
    sub-groups), rows longer and shorter than the group, against LiteRT."""
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    model, feeds = op_model(op, [In(rand(rng, shape, -6, 6))], **({"beta": 0.7} if op == "SOFTMAX" else {}))
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    knobs = _reduction_knobs(_device(), group, subgroups)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)), params={0: knobs})
    (spec,) = plan.steps[0].specs
    assert spec.params == knobs and spec.local_size == (group, 1)
    assert ("sub_group_reduce_add" in spec.source) == subgroups
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("group", [1, 32])
@pytest.mark.parametrize("shape", [(2, 3, 10), (1, 1001)])
def test_softmax_applies_the_fused_ops_after_it(gpu, rng, shape, group):
    """SOFTMAX takes the elementwise ops after it as fused ops (a quantized model's QUANT_SIM of its probabilities):
    a per-channel MUL, an ADD of another input and a TANH here, one kernel, its padded lanes still zero (the rows
    of 10 channels: the ADD's constant would fill them), the graph output written dense; LiteRT's values."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x, other = b.input("x", shape), b.input("other", shape)
    sm, mul, add, out = (b.tensor(n, shape) for n in ("sm", "mul", "add", "out"))
    b.op("SOFTMAX", [x], [sm], beta=0.8)
    b.op("MUL", [sm, b.const("scale", rng.uniform(1, 3, shape[-1]).astype(np.float32))], [mul])
    b.op("ADD", [mul, other], [add])
    b.op("TANH", [add], [out])
    b.output(out)
    model = b.build()
    feeds = [rand(rng, shape, -4, 4), rand(rng, shape, -0.5, 0.5)]
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    knobs = {} if group == 1 else _reduction_knobs(_device(), group, False)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)), params={0: {"group": group, **knobs}})
    (step,) = [s for s in plan.steps if s.device == "gpu"]
    assert step.op.name == "SOFTMAX" and [f.op.name for f in step.epilogue] == ["MUL", "ADD", "TANH"]
    assert len(step.specs) == 1 and plan.launch_count() == 1
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


def _layer_norm_model(shape, *, affine: bool = True, mean_out: bool = False, eps_input: bool = False) -> bytes:
    """x -> MEAN, SUB, MUL, MEAN, ADD epsilon, RSQRT, MUL: a layer norm over the last axis as converters from ONNX
    write it (openWakeWord's wake-word models); ``affine``: then a MUL by a per-channel scale and an ADD of a shift
    with a RELU; ``mean_out``: the row means are a graph output too; ``eps_input``: the epsilon is a graph input."""
    from tflgpu.model.builder import ModelBuilder

    rng = np.random.default_rng(7)
    b = ModelBuilder()
    row = tuple(shape[:-1]) + (1,)
    x = b.input("x", shape)
    # (an epsilon as large as a tenth of the rows' variance: a kernel leaving it out is off by 5%)
    eps = b.input("eps", (1,)) if eps_input else b.const("eps", np.array(0.25, np.float32))
    m, v, ve, r = (b.tensor(n, row) for n in ("m", "v", "ve", "r"))
    d, sq, y = (b.tensor(n, shape) for n in ("d", "sq", "y"))
    axis = b.const("axis", np.array([-1], np.int32))
    b.op("MEAN", [x, axis], [m], keep_dims=True)
    b.op("SUB", [x, m], [d])
    b.op("MUL", [d, d], [sq])
    b.op("MEAN", [sq, axis], [v], keep_dims=True)
    b.op("ADD", [v, eps], [ve])
    b.op("RSQRT", [ve], [r])
    b.op("MUL", [d, r], [y])
    out = y
    if affine:
        scaled, out = b.tensor("scaled", shape), b.tensor("out", shape)
        b.op("MUL", [y, b.const("gamma", rng.uniform(0.5, 2, shape[-1]).astype(np.float32))], [scaled])
        b.op("ADD", [scaled, b.const("beta", rng.uniform(-1, 1, shape[-1]).astype(np.float32))], [out],
             fused_activation_function="RELU")
    b.output(out, *([m] if mean_out else []))
    return b.build()


@pytest.mark.parametrize("group", [1, 32])
@pytest.mark.parametrize("shape", [(1, 128), (2, 5, 10), (1, 3, 4, 36)])
def test_layer_norm_is_one_kernel(gpu, rng, shape, group):
    """A layer norm's seven ops are one step (graph.passes.fuse_layer_norms) whose kernel takes each row's mean,
    variance and normalized values, with the scale, shift and RELU after it fused: one launch, LiteRT's values; in
    one work-item a row (a CPU device's default) and in a work-group a row (a GPU's), rows of 10 channels (a
    part-filled slice) and of 128, rank 2 to 4, FP32 and FP16."""
    from tflgpu import Interpreter
    from tflgpu.graph.passes import LAYER_NORM
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model

    model = _layer_norm_model(shape)
    feeds = [rand(rng, shape, -3, 5)]
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    norm = it.model.main.operators[6].index  # (the merged step takes the last MUL's place and index)
    knobs = {} if group == 1 else _reduction_knobs(_device(), group, False)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)), params={norm: {"group": group, **knobs}})
    (step,) = [s for s in plan.steps if s.device == "gpu"]
    assert step.op.name == LAYER_NORM and [f.op.name for f in step.epilogue] == ["MUL", "ADD"]
    assert plan.launch_count() == 1 and plan.pass_counts["fuse_layer_norms"] == 7 and plan.cpu_op_count == 0
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("case", ["mean_out", "eps_input", "plain"])
def test_layer_norm_merged_only_where_its_parts_are_its_own(opencl_device, rng, case):
    """A chain whose row means are also a graph output, or whose epsilon is not a constant, keeps its ops' own
    kernels; one with nothing after it is merged alone. LiteRT's values either way."""
    from tflgpu import Interpreter

    from .conftest import assert_close, litert, run_model

    shape = (3, 20)
    model = _layer_norm_model(shape, affine=False, mean_out=case == "mean_out", eps_input=case == "eps_input")
    feeds = [rand(rng, shape, -2, 2)] + ([np.array([1e-3], np.float32)] if case == "eps_input" else [])
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False))
    plan = it.gpu_plan
    merged = plan.pass_counts["fuse_layer_norms"]
    assert merged == (7 if case == "plain" else 0) and plan.cpu_op_count == 0
    assert (plan.launch_count() == 1) == (case == "plain")
    got, want = run_model(lambda **kw: it, model, feeds), run_model(litert(), model, feeds)
    for g, w in zip(got, want):
        assert_close(g, w)


def test_softmax_fused_ops_leave_its_padded_lanes_zero(gpu, rng):
    """A fused LOG after a SOFTMAX of 10 channels makes its padded lanes -inf (log 0); the kernel stores them as
    zeros, so the FULLY_CONNECTED reading the log-probabilities (whose weights' padded lanes are zero) sums no
    NaN: LiteRT's values."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x = b.input("x", (3, 10))
    sm, logp, y = b.tensor("sm", (3, 10)), b.tensor("logp", (3, 10)), b.tensor("y", (3, 6))
    b.op("SOFTMAX", [x], [sm], beta=1.0)
    b.op("LOG", [sm], [logp])
    b.op("FULLY_CONNECTED", [logp, b.const("w", rng.standard_normal((6, 10)).astype(np.float32)),
                             b.const("b", np.zeros(6, np.float32))], [y])
    b.output(y)
    model = b.build()
    feeds = [rand(rng, (3, 10), -3, 3)]
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False,
                                                               precision_loss_allowed=_fp16(gpu)))
    softmax = [s for s in it.gpu_plan.steps if s.op.name == "SOFTMAX"]
    assert [f.op.name for f in softmax[0].epilogue] == ["LOG"] and it.gpu_plan.cpu_op_count == 0
    got = run_model(lambda **kw: it, model, feeds)[0]
    assert_close(got, run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


def _ssd_head(rng, sizes=((5, 5), (3, 3)), anchors=3, classes=7, logistic=True, extra=False):
    """An SSD-like head: per feature map, a 3x3 conv of ``anchors`` x 4 box values and one of ``anchors`` x
    ``classes`` scores, each reshaped to rows, the rows concatenated (boxes, scores [-> LOGISTIC]); ``extra``: a
    (rows, 4) graph input concatenated with the boxes as is. (model, feeds)."""
    from tflgpu.model.builder import ModelBuilder

    b = ModelBuilder()
    feeds, boxes, scores = [], [], []
    for k, (h, w) in enumerate(sizes):
        x = b.input(f"x{k}", (1, h, w, 6))
        feeds.append(rand(rng, (1, h, w, 6), -1, 1))
        for name, per, out in (("box", 4, boxes), ("cls", classes, scores)):
            y = b.tensor(f"{name}{k}", (1, h, w, anchors * per))
            b.op("CONV_2D", [x, b.const(f"{name}{k}_w", rng.standard_normal((anchors * per, 3, 3, 6)).astype(np.float32)),
                             b.const(f"{name}{k}_b", rng.standard_normal(anchors * per).astype(np.float32))], [y],
                 padding="SAME", stride_w=1, stride_h=1)
            r = b.tensor(f"{name}{k}_rows", (1, h * w * anchors, per))
            b.op("RESHAPE", [y, b.const(f"{name}{k}_shape", np.int32([1, -1, per]))], [r],
                 new_shape=[1, -1, per])
            out.append(r)
    rows = sum(h * w * anchors for h, w in sizes)
    if extra:
        e = b.input("extra", (1, 4, 4))
        feeds.append(rand(rng, (1, 4, 4), -1, 1))
        boxes.append(e)
    box_out = b.tensor("boxes", (1, rows + 4 * extra, 4))
    b.op("CONCATENATION", boxes, [box_out], axis=1)
    score_out = b.tensor("scores", (1, rows, classes))
    b.op("CONCATENATION", scores, [score_out], axis=1)
    outs = [box_out]
    if logistic:
        sig = b.tensor("sig", (1, rows, classes))
        b.op("LOGISTIC", [score_out], [sig])
        outs.append(sig)
    else:
        outs.append(score_out)
    b.output(*outs)
    return b.build(), feeds


@pytest.mark.parametrize("logistic,extra", [(True, False), (False, True)], ids=["logistic", "an input as is"])
def test_a_concatenation_of_reshaped_convs_is_one_kernel(gpu, rng, logistic, extra):
    """An SSD head: each conv's output, reshaped to rows of 4 box values or of 7 scores (not a whole number of
    slices: lanes move between slices), concatenated; the concatenation reads the convs' outputs through the
    reshapes (graph.passes.fold_reshapes), takes the LOGISTIC after it as a fused op and writes the graph
    outputs dense: a launch per conv and per output, no reshape, no conversion. LiteRT's values."""
    from tflgpu import Interpreter
    from tflgpu.graph.passes import CONCAT_VIEWS

    from .conftest import assert_close, litert, run_model

    model, feeds = _ssd_head(rng, logistic=logistic, extra=extra)
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False,
                                                               precision_loss_allowed=_fp16(gpu)))
    plan = it.gpu_plan
    heads = [s for s in plan.steps if s.op.name == CONCAT_VIEWS]
    assert len(heads) == 2 and not [s for s in plan.steps if s.op.name in ("RESHAPE", "CONCATENATION")]
    assert [f.op.name for f in heads[1].epilogue] == (["LOGISTIC"] if logistic else [])
    assert plan.launch_count() == 6 and plan.cpu_op_count == 0
    assert set(it.model.main.outputs) <= plan.make.dense  # (written dense: no conversion kernel after them)
    for got, want in zip(run_model(lambda **kw: it, model, feeds), run_model(litert(), model, feeds)):
        assert_close(got, want, gpu["rtol_scale"])


def test_reshape_transpose_concat(gpu, rng):
    check_op("RESHAPE", [In(rand(rng, (1, 4, 6, 3))), np.array([1, 8, 9], I32)], **gpu)
    # the same slices in the same order (a float4 copy): pixels' rows regrouped, batch and channels kept
    check_op("RESHAPE", [In(rand(rng, (2, 4, 6, 5))), np.array([2, 24, 5], I32)], **gpu)
    check_op("RESHAPE", [In(rand(rng, (1, 6, 10))), np.array([1, 2, 3, 10], I32)], **gpu)
    check_op("RESHAPE", [In(rand(rng, (3, 7))), np.array([3, 1, 1, 7], I32)], **gpu)
    check_op("TRANSPOSE", [In(rand(rng, (1, 4, 6, 3))), np.array([0, 2, 1, 3], I32)], **gpu)
    for axis in (1, 3, -1):
        shapes = [(1, 3, 4, 5), (1, 3, 4, 5)]
        shapes[1] = tuple(d + 2 if i == axis % 4 else d for i, d in enumerate(shapes[1]))
        check_op("CONCATENATION", [In(rand(rng, s)) for s in shapes], axis=axis, **gpu)


@pytest.mark.parametrize("channels,lead", [((1,) * 8, (1, 5, 7)), ((4, 4), (2, 3, 3)), ((3, 5, 8, 1), (1, 6, 2)),
                                           ((2, 6), (3,)), ((1, 2, 3), (1, 9)), ((130, 130), (1, 2, 2))])
def test_channel_concatenation(gpu, rng, channels, lead):
    """Over the channels, each output slice's lanes come from known lanes of known input slices: a branch per slice
    (each input slice loaded once, a float4 copy where the four lanes are one input slice's); past 64
    output slices (130 + 130) the lane-by-lane form. Ranks 2 to 4."""
    from tflgpu import Interpreter

    from .oputil import op_model

    inputs = [In(rand(rng, (*lead, c))) for c in channels]
    check_op("CONCATENATION", inputs, axis=-1, **gpu)
    model, _ = op_model("CONCATENATION", inputs, axis=-1)
    (spec,) = Interpreter(model_content=model, delegate=gpu["delegate"]).gpu_plan.steps[0].specs
    assert ("switch (S)" in spec.source) == (sum(channels) <= 256)
    assert ("v = t0;" in spec.source) == (channels in ((4, 4), (3, 5, 8, 1)))  # (the 8 at channel 8: aligned)


@pytest.mark.parametrize("shapes,axis,const_at", [
    (((1, 12), (1, 44)), -1, 0),  # a signal padded in front (over channels: a branch per output slice)
    (((2, 3, 4, 5), (2, 2, 4, 5), (2, 1, 4, 5)), 1, 1),  # along the rows, the constant between two tensors
    (((1, 3, 300), (1, 3, 7)), 2, 1),  # past 64 output slices: lane by lane
    (((1, 2, 3, 6), (1, 2, 3, 6)), 0, 0),  # along the batch
])
def test_concatenation_of_a_constant(gpu, rng, shapes, axis, const_at):
    """An operand the model holds as a constant is uploaded once in its slice layout and read as a tensor would be
    (it had kept the concatenation on the CPU): random values, so a constant stored in another layout or order
    than the kernel reads shows."""
    inputs = [rand(rng, s) if k == const_at else In(rand(rng, s)) for k, s in enumerate(shapes)]
    check_op("CONCATENATION", inputs, axis=axis, **gpu)


def test_concatenation_of_a_folded_fill(gpu, rng):
    """As a keyword model pads its audio before framing it (a FILL, its shape computed from the input's,
    concatenated in front): the fill folds to a constant, and the concatenation runs on the device."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x = b.input("audio", (1, 40), np.float32)
    dims, value = b.const("dims", np.array([1, 24], I32), dtype=np.int32), b.const("v", np.float32(0.25))
    pad, y = b.tensor("pad", (1, 24), np.float32), b.tensor("y", (1, 64), np.float32)
    b.op("FILL", [dims, value], [pad])
    b.op("CONCATENATION", [pad, x], [y], axis=1)
    b.output(y)
    model, feed = b.build(), [rand(rng, (1, 40))]
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    assert it.gpu_plan.cpu_op_count == 0, [s.reason for s in it.gpu_plan.steps if s.device == "cpu"]
    assert_close(run_model(lambda **kw: it, model, feed)[0], run_model(litert(), model, feed)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("op", ["MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"])
@pytest.mark.parametrize("shape,axes", [((1, 17, 30), [1, 2]), ((2, 5, 6, 7), [1, 2, 3]), ((1, 4, 5, 6), [0, 1, 2, 3]),
                                        ((5, 4, 9), [2, 1]), ((2, 3, 9), [-1, -2])])
@pytest.mark.parametrize("keep", [True, False])
def test_reductions_over_each_image(gpu, rng, op, shape, axes, keep):
    """Every axis but the batch (and the batch too where there is one image): an audio model's min-max
    normalization of its spectrogram (Basic Pitch's REDUCE_MIN / MAX of [1, 172, 309] over [1, 2]), a part-filled
    last slice, five images' values in an output slice of its own shape [5] or one a slice kept as [5, 1, 1]."""
    x = rand(rng, shape, 0.99, 1.01) if op == "REDUCE_PROD" else rand(rng, shape)
    check_op(op, [In(x), np.array(axes, I32)], keep_dims=keep, **gpu)


@pytest.mark.parametrize("group", [1, 32])
@pytest.mark.parametrize("op", ["REDUCE_MAX", "REDUCE_MIN"])
def test_reductions_over_each_image_after_a_nan(gpu, op, group):
    """TFLite's builtin kernel folds the image's values in row-major order (pixel by pixel, each pixel's channels
    in turn): the extreme after the last NaN in that order, NaN where the image's last value is one; in one
    work-item and in a work-group's strided shares, which take the values in the slices' order instead. (LiteRT's
    XNNPACK path folds in vector lanes: a NaN is lost unless it is last, so its answers differ from the builtin
    kernel's here; the plan follows the builtin kernel, as the spatial and per-row forms do.)"""
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan

    from .oputil import op_model, run_litert

    # (each image's extreme its first value, before any NaN: only the values after the last NaN may count)
    x = np.arange(4 * 3 * 6, dtype=np.float32).reshape(4, 3, 6) * (-1 if op == "REDUCE_MAX" else 1)
    x[0, 1, 5] = np.nan  # image 0: the values after (1, 5), which come before (2, 0) in the slices' order
    x[1, 2, 5] = np.nan  # image 1: its last value: NaN
    x[2, 0, 0], x[2, 2, 1] = np.nan, np.nan  # image 2: two NaNs, the second in the last pixel's first slice
    model, feeds = op_model(op, [In(x), np.array([1, 2], I32)], keep_dims=False)
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)), params={0: {"group": group}})
    want = run_litert(model, feeds, builtin_only=True)[0]
    assert np.isnan(want).tolist() == [False, True, False, False]
    got = plan.run(feeds)[it.model.main.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-3 if _fp16(gpu) else 0)


def test_pad_slices_and_space_depth(gpu, rng):
    check_op("PAD", [In(rand(rng, (1, 4, 5, 3))), np.array([[0, 0], [1, 2], [2, 0], [0, 1]], I32)], **gpu)
    check_op("PADV2", [In(rand(rng, (1, 4, 5, 3))), np.array([[0, 0], [1, 1], [1, 1], [0, 0]], I32),
                       np.array([0.5], np.float32)], **gpu)
    check_op("STRIDED_SLICE", [In(rand(rng, (1, 8, 8, 6))), np.array([0, 1, 7, 0], I32), np.array([0, 7, 0, 5], I32),
                               np.array([1, 2, -2, 1], I32)], begin_mask=1, end_mask=1, **gpu)
    check_op("SLICE", [In(rand(rng, (1, 6, 5, 7))), np.array([0, 1, 2, 3], I32), np.array([1, 4, -1, 3], I32)],
             [Out(np.float32, (1, 4, 3, 3))], **gpu)
    check_op("DEPTH_TO_SPACE", [In(rand(rng, (1, 3, 2, 8)))], block_size=2, **gpu)
    check_op("SPACE_TO_DEPTH", [In(rand(rng, (1, 4, 6, 3)))], block_size=2, **gpu)


def test_moves_of_whole_slices(gpu, rng):
    """The moves whose output slices are each one input slice (a float4 load) or padding alone, over more slices
    than a CPU work-item takes (lanes.LANE_SLICES), the last work-item's share partial: DEPTH_TO_SPACE of 24
    output channels (6 slices), SPACE_TO_DEPTH of 4 input channels into 36, spatial PADs of 3 and of 22 channels
    (the input's zero lanes padding a part-filled slice), a PAD of 4 channels ahead and 5 after, a PADV2 of
    0.5 whose channels fill whole slices; and one whose 0.5 cannot come from a float4 load (3 channels)."""
    check_op("DEPTH_TO_SPACE", [In(rand(rng, (2, 3, 2, 96)))], block_size=2, **gpu)
    check_op("SPACE_TO_DEPTH", [In(rand(rng, (1, 6, 9, 4)))], block_size=3, **gpu)
    for shape in ((1, 5, 4, 3), (2, 3, 5, 22)):
        check_op("PAD", [In(rand(rng, shape)), np.array([[0, 0], [1, 2], [2, 1], [0, 0]], I32)], **gpu)
    check_op("PAD", [In(rand(rng, (1, 3, 4, 7))), np.array([[0, 0], [1, 0], [0, 1], [4, 5]], I32)], **gpu)
    check_op("PADV2", [In(rand(rng, (1, 3, 4, 8))), np.array([[0, 0], [1, 1], [0, 2], [4, 12]], I32),
                       np.array([0.5], np.float32)], **gpu)
    check_op("PADV2", [In(rand(rng, (1, 3, 4, 3))), np.array([[0, 0], [1, 1], [0, 0], [4, 1]], I32),
                       np.array([0.5], np.float32)], **gpu)


@pytest.mark.parametrize("mode", [0, 1], ids=["reflect", "symmetric"])
def test_mirror_pad(gpu, rng, mode):
    """Each edge's full reach (3 of a 4-pixel row: REFLECT leaves the edge value out; SYMMETRIC 4 of 4), one-sided
    and channel pads too."""
    check_op("MIRROR_PAD", [In(rand(rng, (1, 4, 5, 6))), np.array([[0, 0], [3 + mode, 1], [0, 4 + mode], [2, 1]], I32)],
             mode=mode, **gpu)
    check_op("MIRROR_PAD", [In(rand(rng, (2, 7, 3))), np.array([[1, 0], [2, 2], [0, 2]], I32)], mode=mode, **gpu)


def test_tile_broadcast_to_and_reverse(gpu, rng):
    check_op("TILE", [In(rand(rng, (1, 3, 2, 5))), np.array([2, 1, 3, 2], I32)], **gpu)
    check_op("TILE", [In(rand(rng, (2, 7))), np.array([3, 1], I32)], **gpu)
    check_op("BROADCAST_TO", [In(rand(rng, (3, 1, 6))), np.array([2, 3, 4, 6], I32)], version=2, **gpu)
    check_op("BROADCAST_TO", [In(rand(rng, (1, 5, 1, 1))), np.array([2, 5, 3, 9], I32)], version=2, **gpu)
    check_op("REVERSE_V2", [In(rand(rng, (2, 4, 5, 6))), np.array([1, 2], I32)], **gpu)  # (LiteRT: adjacent axes)
    check_op("REVERSE_V2", [In(rand(rng, (3, 7))), np.array([-1], I32)], **gpu)


@pytest.mark.parametrize("hw,block,edges", [((8, 8), (2, 2), [[0, 0], [0, 0]]), ((7, 7), (2, 3), [[1, 2], [0, 2]]),
                                            ((6, 7), (3, 2), [[2, 1], [3, 0]])])
def test_space_to_batch_and_back(gpu, rng, hw, block, edges):
    """The dilated-conv idiom of older converters: pixels dealt to block-offset batches (padded first), and back
    (cropped): odd paddings and crops, two images."""
    check_op("SPACE_TO_BATCH_ND", [In(rand(rng, (2, *hw, 5))), np.array(block, I32), np.array(edges, I32)], **gpu)
    b = block[0] * block[1]
    check_op("BATCH_TO_SPACE_ND", [In(rand(rng, (2 * b, 4, 5, 6))), np.array(block, I32), np.array(edges, I32)], **gpu)


@pytest.mark.parametrize("params,indices", [((4, 5, 6), [[1, 2], [3, 0], [0, 4]]), ((4, 5, 6), [[[1], [0]], [[3], [2]]]),
                                            ((3, 4, 5), [[2, 3, 4], [0, 0, 1]])])
def test_gather_nd(gpu, rng, params, indices):
    """Constant index rows of one, two and every coordinate: slices, rows and single values of the params."""
    check_op("GATHER_ND", [In(rand(rng, params)), np.array(indices, I32)], **gpu)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_pack_and_unpack(gpu, rng, axis):
    parts = [In(rand(rng, (2, 3, 5))) for _ in range(3)]
    check_op("PACK", parts, values_count=3, axis=axis, **gpu)
    x = rand(rng, (3, 4, 2, 5))
    check_op("UNPACK", [In(x)], x.shape[axis], num=x.shape[axis], axis=axis, **gpu)


def test_moves_under_a_gpus_target(opencl_device, rng, monkeypatch):
    """Under a GPU's target a move's work-item takes one slice (a RESIZE_BILINEAR's too, which a CPU's loops over
    reindex.RESIZE_SLICES of): a resize of 44 channels, a DEPTH_TO_SPACE of whole slices and a PAD, as LiteRT."""
    from .conftest import gpu_target

    gpu_target(monkeypatch)
    delegate = GpuDelegate(cache=False, tuning_db=False, tuning="none", tiered_compile=False)
    check_op("RESIZE_BILINEAR", [In(rand(rng, (2, 3, 4, 44))), np.array([7, 6], I32)], half_pixel_centers=True,
             version=3, delegate=delegate)
    check_op("DEPTH_TO_SPACE", [In(rand(rng, (1, 3, 2, 96)))], block_size=2, delegate=delegate)
    check_op("PAD", [In(rand(rng, (1, 3, 4, 22))), np.array([[0, 0], [1, 0], [0, 1], [4, 2]], I32)],
             delegate=delegate)


# (down along H too; 44 channels: 11 slices, more than a CPU work-item takes, reindex.RESIZE_SLICES)
@pytest.mark.parametrize("shape,size", [((1, 5, 7, 6), (9, 12)), ((2, 4, 3, 9), (3, 8)), ((1, 3, 4, 44), (7, 6))])
@pytest.mark.parametrize("mode", [(False, False), (True, False), (False, True)])
def test_resize_bilinear(gpu, rng, mode, shape, size):
    check_op("RESIZE_BILINEAR", [In(rand(rng, shape)), np.array(size, I32)],
             align_corners=mode[0], half_pixel_centers=mode[1], version=3 if mode[1] else 1, **gpu)


def test_unsupported_op_falls_back_to_cpu_with_warning(opencl_device, rng, caplog):
    caplog.set_level("WARNING", logger="tflgpu")
    check_op(CPU_OP, [In(rand(rng, (3, 4))), In(rand(rng, (3, 4), 0.5, 2))], delegate=GpuDelegate(),
             expect_on_device=False)
    assert f"({CPU_OP}) cannot be handled by this delegate" in caplog.text


def test_kernel_the_compiler_rejects_falls_back_to_cpu(opencl_device, rng, caplog, monkeypatch):
    """Inject a build failure into one generator: that op runs on the CPU, the model stays correct."""
    from tflgpu.kernels import conv as conv_gen

    original = conv_gen._conv_source
    monkeypatch.setattr(conv_gen, "_conv_source", lambda *a, **k: original(*a, **k).replace("mad(", "no_such_fn("))
    caplog.set_level("WARNING", logger="tflgpu")
    check_op("CONV_2D", [In(rand(rng, (1, 6, 6, 3))), rand(rng, (4, 3, 3, 3)), rand(rng, (4,))], padding="SAME",
             stride_w=1, stride_h=1, delegate=GpuDelegate(), expect_on_device=False)
    assert "(CONV_2D) cannot be handled by this delegate: OpenCL build failed" in caplog.text


@pytest.mark.parametrize("second", ["HARD_SWISH", "LOGISTIC", "ADD_TENSOR", "MUL_CONST", "SUB_LHS_CONST"])
@pytest.mark.parametrize("producer", ["CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"])
def test_elementwise_fused_into_producer(gpu, rng, producer, second):
    """producer -> elementwise: one kernel (the pass fuses it), same results as LiteRT."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    shape = (1, 6, 5, 8) if producer != "FULLY_CONNECTED" else (2, 8)
    x = b.input("x", shape)
    skip = b.input("skip", shape)
    if producer == "CONV_2D":
        w, bias = b.const("w", rand(rng, (8, 3, 3, 8))), b.const("b", rand(rng, (8,)))
        opts = {"padding": "SAME", "stride_w": 1, "stride_h": 1}
    elif producer == "DEPTHWISE_CONV_2D":
        w, bias = b.const("w", rand(rng, (1, 3, 3, 8))), b.const("b", rand(rng, (8,)))
        opts = {"padding": "SAME", "stride_w": 1, "stride_h": 1, "depth_multiplier": 1}
    else:
        w, bias = b.const("w", rand(rng, (8, 8))), b.const("b", rand(rng, (8,)))
        opts = {}
    y = b.tensor("y", shape)
    b.op(producer, [x, w, bias], [y], **opts)
    z = b.tensor("z", shape)
    if second in ("HARD_SWISH", "LOGISTIC"):
        b.op(second, [y], [z])
    elif second == "ADD_TENSOR":
        b.op("ADD", [y, skip], [z], fused_activation_function="RELU6")
    elif second == "MUL_CONST":
        b.op("MUL", [y, b.const("k", rand(rng, (8,)))], [z])
    else:
        b.op("SUB", [b.const("k", rand(rng, (1,))), y], [z])
    b.output(z)
    model = b.build()
    feeds = [rand(rng, shape), rand(rng, shape)]
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    plan = it.gpu_plan
    assert plan.pass_counts["fuse_elementwise"] == 1 and plan.cpu_op_count == 0
    assert len([s for s in plan.steps if s.device == "gpu"]) == 1
    got = run_model(lambda **kw: it, model, feeds)
    assert_close(got[0], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("first", ["ADD", "TANH", "MAXIMUM_BROADCAST"])
def test_elementwise_chain_is_one_kernel(gpu, rng, first):
    """An elementwise op's kernel takes the elementwise ops after it (graph.passes.fuse_elementwise): unary, with a
    per-channel constant, with a tensor read at the output's index, and with its own activation; 6 channels (a
    padded last slice), at FP32 and FP16 against LiteRT."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    shape = (2, 5, 3, 6)
    b = ModelBuilder()
    x, skip = b.input("x", shape), b.input("skip", shape)
    y = b.tensor("y", shape)
    if first == "ADD":
        b.op("ADD", [x, skip], [y], fused_activation_function="RELU")
    elif first == "TANH":
        b.op("TANH", [x], [y])
    else:
        b.op("MAXIMUM", [x, b.const("floor", rand(rng, (1, 1, 1, 6)))], [y])
    chain = [("LOGISTIC", []), ("MUL", [b.const("k", rand(rng, (6,)))]), ("SUB", ["skip"]), ("HARD_SWISH", [])]
    for name, other in chain:
        z = b.tensor(f"z_{name}", shape)
        b.op(name, [y] + [skip if o == "skip" else o for o in other], [z])
        y = z
    b.output(y)
    model = b.build()
    feeds = [rand(rng, shape, -3, 3), rand(rng, shape)]
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    plan = it.gpu_plan
    assert plan.pass_counts["fuse_elementwise"] == len(chain) and plan.cpu_op_count == 0
    assert sum(len(s.specs) for s in plan.steps if s.device == "gpu") == 1
    got = run_model(lambda **kw: it, model, feeds)
    assert_close(got[0], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("shape,cout,k,stride,pad,bias", [
    ((1, 5, 4, 3), 6, 3, 2, "SAME", True), ((1, 4, 4, 8), 5, 2, 2, "VALID", False),
    ((2, 3, 5, 4), 8, 4, 3, "SAME", True), ((1, 6, 6, 16), 16, 2, 2, "VALID", True),
])
def test_transpose_conv(gpu, rng, shape, cout, k, stride, pad, bias):
    n, h, w, cin = shape
    oh, ow = (h * stride, w * stride) if pad == "SAME" else ((h - 1) * stride + k, (w - 1) * stride + k)
    inputs = [np.array([n, oh, ow, cout], I32), rand(rng, (cout, k, k, cin)), In(rand(rng, shape))]
    if bias:
        inputs.append(rand(rng, (cout,)))
    check_op("TRANSPOSE_CONV", inputs, [Out(np.float32, (n, oh, ow, cout))], padding=pad, stride_w=stride,
             stride_h=stride, version=3 if bias else 1, **gpu)


@pytest.mark.parametrize("shape,cout,k,stride,pad,tile", [
    ((1, 5, 4, 3), 6, 3, 2, "SAME", {"group_tile": (16, 4), "tile_s": 1, "k_chunk": 4}),
    ((2, 4, 4, 8), 5, 2, 2, "VALID", {"group_tile": (8, 8), "tile_s": 2, "k_chunk": 8, "scatter": False}),
    ((1, 3, 5, 12), 20, 4, 3, "SAME", {"group_tile": (32, 2), "tile_s": 4, "k_chunk": 16}),
])
def test_transpose_conv_group_tile_variant(gpu, rng, shape, cout, k, stride, pad, tile):
    """TRANSPOSE_CONV's gather form as an implicit GEMM through local memory (the taps a stride skips staged as
    zeros): the same values as LiteRT, with a ragged last group of pixels, slices and output channels."""
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    n, h, w, cin = shape
    oh, ow = (h * stride, w * stride) if pad == "SAME" else ((h - 1) * stride + k, (w - 1) * stride + k)
    model, feeds = op_model("TRANSPOSE_CONV", [np.array([n, oh, ow, cout], I32), rand(rng, (cout, k, k, cin)),
                                               In(rand(rng, shape)), rand(rng, (cout,))],
                            [Out(np.float32, (n, oh, ow, cout))], padding=pad, stride_w=stride, stride_h=stride,
                            version=3)
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)), params={0: tile})
    (spec,) = plan.steps[0].specs
    assert spec.local_size == (tile["group_tile"][0], 1, tile["group_tile"][1]) and "__local" in spec.source
    assert {key: spec.params[key] for key in tile} == tile and plan.cpu_op_count == 0
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("shape,cout,k,tile_s", [((2, 3, 5, 6), 5, 2, 1), ((1, 4, 3, 16), 9, 2, 2),
                                                  ((1, 3, 3, 4), 16, 2, 4), ((1, 2, 3, 8), 3, 3, 1),
                                                  ((1, 5, 4, 8), 1, 2, 1)])
@pytest.mark.parametrize("scatter", [False, True])
def test_transpose_conv_scatter_variant(gpu, rng, shape, cout, k, tile_s, scatter):
    """Where the filter tiles the output (filter = stride, no padding), a work-item per input pixel writes the
    k x k output pixels its taps make (``scatter``, a CPU device's default there), a fused ADD and RELU after it:
    the gather form's values and LiteRT's, batched, with ragged output slices."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model

    n, h, w, cin = shape
    oh, ow = h * k, w * k
    b = ModelBuilder()
    x, skip = b.input("x", shape), b.input("skip", (n, oh, ow, cout))
    y, z = b.tensor("y", (n, oh, ow, cout)), b.tensor("z", (n, oh, ow, cout))
    b.op("TRANSPOSE_CONV", [b.const("shape", np.array([n, oh, ow, cout], I32)), b.const("w", rand(rng, (cout, k, k, cin))),
                            x, b.const("bias", rand(rng, (cout,)))], [y], padding="VALID", stride_w=k, stride_h=k,
         version=3)
    b.op("ADD", [y, skip], [z], fused_activation_function="RELU")
    b.output(z)
    model, feeds = b.build(), [rand(rng, shape), rand(rng, (n, oh, ow, cout))]
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)),
                   params={0: {"scatter": scatter, "tile_s": tile_s}})
    (spec,) = plan.steps[0].specs
    assert spec.params["scatter"] is scatter and plan.cpu_op_count == 0 and len(plan.steps) == 1
    assert spec.global_size[:2] == ((w, n * h) if scatter else (ow, n * oh))
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("shape,cout,k", [((1, 6, 5, 16), 1, 2), ((2, 3, 4, 7), 2, 2), ((1, 4, 3, 5), 3, 3),
                                           ((1, 3, 3, 8), 1, 4)])
@pytest.mark.parametrize("read_after", [False, True])
def test_transpose_conv_narrow_scatter(gpu, rng, shape, cout, k, read_after):
    """A transposed conv of fewer than 4 output channels whose fused ops are unary (a segmentation mask: a LOGISTIC
    after it) sums its (tap, channel) values as the lanes of its accumulators (_narrow_scatter_source): LiteRT's
    values, written as the graph output's dense buffer, or in the slice layout where a conv reads the output
    after it (``read_after``), its lanes past the channels zero there."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model

    n, h, w, cin = shape
    oh, ow = h * k, w * k
    b = ModelBuilder()
    x = b.input("x", shape)
    y, z = b.tensor("y", (n, oh, ow, cout)), b.tensor("z", (n, oh, ow, cout))
    b.op("TRANSPOSE_CONV", [b.const("shape", np.array([n, oh, ow, cout], I32)), b.const("w", rand(rng, (cout, k, k, cin))),
                            x, b.const("bias", rand(rng, (cout,)))], [y], padding="VALID", stride_w=k, stride_h=k,
         version=3)
    b.op("LOGISTIC", [y], [z])
    if read_after:  # (a 1x1 conv reading the mask: 5 channels of it)
        u = b.tensor("u", (n, oh, ow, 5))
        b.op("CONV_2D", [z, b.const("w2", rand(rng, (5, 1, 1, cout))), b.const("b2", rand(rng, (5,)))], [u],
             padding="VALID", stride_w=1, stride_h=1)
        b.output(u)
    else:
        b.output(z)
    model, feeds = b.build(), [rand(rng, shape)]
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)), params={0: {"scatter": True}})
    spec = plan.steps[0].specs[0]
    assert spec.global_size == (w, n * h, 1) and plan.cpu_op_count == 0
    assert "float4 acc0 = " in spec.source and "acc0_0_0" not in spec.source  # (the narrow form's accumulators)
    assert spec.dense == (frozenset() if read_after else frozenset({it.model.main.outputs[0]}))
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


def test_narrow_scatter_weights_order_the_values_tap_major():
    from tflgpu.kernels.conv import narrow_scatter_bias, narrow_scatter_weights

    w = np.arange(2 * 2 * 2 * 5, dtype=np.float32).reshape(2, 2, 2, 5) + 1  # [O=2, 2, 2, I=5]
    packed = narrow_scatter_weights(w).reshape(8, 2, 4)  # [2 slices x 4 channels][2 accumulators][4 lanes]
    for c in range(5):
        for f in range(8):
            tap, o = divmod(f, 2)
            assert packed[c, f // 4, f % 4] == w[o, tap // 2, tap % 2, c]
    assert not packed[5:].any()
    assert narrow_scatter_bias(np.array([3.0, 4.0]), 3).tolist() == [3, 4, 3, 4, 3, 4, 0, 0]


def test_transpose_conv_scatter_is_a_cpu_devices_default_where_the_filter_tiles():
    from tflgpu.kernels.conv import TransposeConvKnobs, TransposeConvShape

    assert TransposeConvKnobs.default(TransposeConvShape(sout=1, depth=16, gpu=False, tiles=4)).scatter
    assert TransposeConvKnobs.default(TransposeConvShape(sout=8, depth=16, gpu=False, tiles=4)).tile_s == 4
    assert TransposeConvKnobs.default(TransposeConvShape(sout=8, depth=36, gpu=False, tiles=9)).tile_s == 1
    assert not TransposeConvKnobs.default(TransposeConvShape(sout=1, depth=16, gpu=True, tiles=4)).scatter
    assert not TransposeConvKnobs.default(TransposeConvShape(sout=1, depth=36, gpu=False, tiles=0)).scatter
    assert "scatter" not in TransposeConvKnobs.space(TransposeConvShape(sout=1, depth=36, tiles=0))
    assert TransposeConvKnobs.space(TransposeConvShape(sout=1, depth=16, gpu=True, tiles=4))["scatter"] == [False, True]


@pytest.mark.parametrize("pad", ["SAME", "VALID"])
def test_convolution2d_transpose_bias_on_device(gpu, rng, pad):
    """MediaPipe's op on the device against LiteRT's TRANSPOSE_CONV with the same weights and bias."""
    import struct

    from tflgpu import Interpreter

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    x, w, bias = rand(rng, (1, 5, 4, 3)), rand(rng, (6, 3, 3, 3)), rand(rng, (6,))
    oh, ow = (10, 8) if pad == "SAME" else (11, 9)
    ref_model, feeds = op_model("TRANSPOSE_CONV", [np.array([1, oh, ow, 6], I32), w, In(x), bias],
                                [Out(np.float32, (1, oh, ow, 6))], padding=pad, stride_w=2, stride_h=2, version=3)
    model, _ = op_model("Convolution2DTransposeBias", [In(x), w, bias], [Out(np.float32, (1, oh, ow, 6))],
                        custom_options=struct.pack("<3i", 1 if pad == "SAME" else 2, 2, 2))
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    assert it.gpu_plan.cpu_op_count == 0
    assert_close(run_model(lambda **kw: it, model, feeds)[0], run_model(litert(), ref_model, feeds)[0],
                 gpu["rtol_scale"])


@pytest.mark.parametrize("mode", [(False, False), (True, False), (False, True)])
def test_resize_nearest(gpu, rng, mode):
    check_op("RESIZE_NEAREST_NEIGHBOR", [In(rand(rng, (1, 5, 7, 6))), np.array([11, 4], I32)],
             align_corners=mode[0], half_pixel_centers=mode[1], version=3 if mode[1] else 1, **gpu)


def test_split_and_split_v(gpu, rng):
    check_op("SPLIT", [np.array(3, I32), In(rand(rng, (1, 4, 5, 12)))], 3, num_splits=3, **gpu)
    check_op("SPLIT", [np.array(1, I32), In(rand(rng, (2, 6, 3)))], 2, num_splits=2, **gpu)
    check_op("SPLIT_V", [In(rand(rng, (1, 7, 3, 5))), np.array([2, 4, 1], I32), np.array(1, I32)], 3,
             num_splits=3, **gpu)


@pytest.mark.parametrize("keep", [True, False])
def test_sum_spatial(gpu, rng, keep):
    check_op("SUM", [In(rand(rng, (2, 4, 5, 6))), np.array([1, 2], I32)], keep_dims=keep, **gpu)


@pytest.mark.parametrize("adj_x,adj_y,sa,sb", [(False, False, (2, 3, 5), (2, 5, 4)), (True, False, (2, 5, 3), (2, 5, 4)),
                                                (False, True, (3, 6), (4, 6)), (False, False, (2, 3, 5), (5, 4)),
                                                (False, False, (2, 3, 13, 10), (2, 3, 10, 7)),
                                                (False, True, (2, 3, 13, 10), (2, 3, 7, 10)),
                                                (False, True, (4, 19, 16), (4, 19, 16)),
                                                (False, False, (4, 19, 19), (4, 19, 16))])
def test_batch_matmul(gpu, rng, adj_x, adj_y, sa, sb):
    """(Same batch dims, x not transposed: the tiled form, 8 rows of one output slice a work-item: rows, depths and
    columns that are no multiple of 8 or 4, ranks 2 to 4, y read as rows or, adj_y, as columns; attention's two
    products. Else the general lane-by-lane form.)"""
    check_op("BATCH_MATMUL", [In(rand(rng, sa)), In(rand(rng, sb))], adj_x=adj_x, adj_y=adj_y, **gpu)


@pytest.mark.parametrize("sa,sb,adj_y", [((1, 1, 1, 257), (257, 32), False), ((2, 3, 7, 10), (10, 6), False),
                                         ((3, 5, 9), (1, 9, 5), False), ((4, 6, 8), (3, 8), True),
                                         ((5, 12), (12, 3), False)])
def test_batch_matmul_by_a_constant(gpu, rng, sa, sb, adj_y):
    """A MatMul by a weight matrix as ONNX converters write it: BATCH_MATMUL with a constant y (openWakeWord's
    melspectrogram, [1, 1, 1, 257] @ [257, 32], its mel filter bank) ran on the CPU between two device partitions.
    y is uploaded once, repeated over x's batch dims, and read by the tiled form, transposed or not."""
    check_op("BATCH_MATMUL", [In(rand(rng, sa)), rand(rng, sb)], adj_y=adj_y, **gpu)


def test_batch_matmul_takes_the_tiled_form(opencl_device, rng):
    from tflgpu import Interpreter

    from .oputil import op_model

    model, _ = op_model("BATCH_MATMUL", [In(rand(rng, (4, 19, 16))), In(rand(rng, (4, 19, 16)))], adj_y=True)
    (spec,) = Interpreter(model_content=model, delegate=GpuDelegate(cache=False)).gpu_plan.steps[0].specs
    assert spec.global_size == (5, 3, 4) and "float4 acc7" in spec.source


@pytest.mark.parametrize("op,pads,conv_pad", [("CONV_2D", [[0, 0], [1, 1], [2, 1], [0, 0]], "VALID"),
                                              ("CONV_2D", [[0, 0], [0, 2], [1, 0], [0, 0]], "SAME"),
                                              ("DEPTHWISE_CONV_2D", [[0, 0], [1, 2], [1, 1], [0, 0]], "VALID")])
def test_pad_merged_into_conv(gpu, rng, op, pads, conv_pad):
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x = b.input("x", (1, 6, 5, 4))
    padded = b.tensor("padded", (1, 1, 1, 4))
    b.op("PAD", [x, b.const("p", np.array(pads, I32))], [padded])
    if op == "CONV_2D":
        w, opts = b.const("w", rand(rng, (5, 3, 3, 4))), {}
        cout = 5
    else:
        w, opts, cout = b.const("w", rand(rng, (1, 3, 3, 4))), {"depth_multiplier": 1}, 4
    y = b.tensor("y", (1, 1, 1, cout))
    b.op(op, [padded, w, b.const("b", rand(rng, (cout,)))], [y], padding=conv_pad, stride_w=2, stride_h=1, **opts)
    b.output(y)
    model = b.build()
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    assert it.gpu_plan.pass_counts["merge_pad"] == 1 and it.gpu_plan.cpu_op_count == 0
    feeds = [rand(rng, (1, 6, 5, 4))]
    assert_close(run_model(lambda **kw: it, model, feeds)[0], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("variant", ["plain", "cell_clip_time_major", "peephole"])
def test_unidirectional_lstm_on_device(gpu, rng, variant):
    """Plain LSTMs run on the device; other variants fall back to the CPU, correct either way."""
    from tflgpu import Interpreter

    from .conftest import assert_close, litert, run_model
    from .oputil import VARIANTS, lstm_model

    model, feeds = lstm_model("UNIDIRECTIONAL_SEQUENCE_LSTM", rng, **VARIANTS[variant])
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    assert it.gpu_plan.cpu_op_count == (1 if variant == "peephole" else 0)
    assert_close(run_model(lambda **kw: it, model, feeds)[0], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("sequence", [True, False])
@pytest.mark.parametrize("variant", [{}, {"cell_clip": 0.2, "time_major": True, "batch": 3, "steps": 9}])
def test_lstm_in_one_launch_or_one_per_step(gpu, rng, sequence, variant):
    """Both forms of the device LSTM (one work-group looping over the steps, or a launch per step) match LiteRT,
    and the state carries over to the next invoke in each."""
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert
    from .oputil import lstm_model

    model, feeds = lstm_model("UNIDIRECTIONAL_SEQUENCE_LSTM", rng, **variant)
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)),
                   params={0: {"sequence": sequence}})
    (step,) = plan.steps
    assert step.device == "gpu" and len(step.specs) == (1 if sequence else variant.get("steps", 5) + 1)
    ref = litert()(model_content=model)
    ref.allocate_tensors()
    x_in = ref.get_input_details()[0]["index"]
    for _ in range(2):  # (the second invoke starts from the first's final state)
        ref.set_tensor(x_in, feeds[0])
        ref.invoke()
        got = plan.run(feeds)[it.model.main.outputs[0]]
        assert_close(got, ref.get_tensor(ref.get_output_details()[0]["index"]), gpu["rtol_scale"])


def test_long_lstm_builds_in_linear_time_and_holds_its_weights_once(opencl_device, rng, monkeypatch):
    """A fuzz finding: a 16,400-step LSTM took 150 s to build (pyopencl generated an invoker module per kernel
    instance, naming each by scanning the others: O(n^2)) and uploaded its weights once per step. Now the
    invokers of a signature are made once, and a step's launches share its constant buffers."""
    import pyopencl.invoker

    from tflgpu import GpuDelegate, Interpreter

    from .conftest import assert_close, litert, run_model
    from .oputil import lstm_model

    generated = []
    real = pyopencl.invoker._generate_enqueue_and_set_args_module
    monkeypatch.setattr(pyopencl.invoker, "_generate_enqueue_and_set_args_module",
                        lambda *a: generated.append(a[0]) or real(*a))
    from tflgpu.kernels import recurrent

    monkeypatch.setattr(recurrent, "SEQUENCE_UNITS", 0)  # (the one-launch-per-step form)
    model, feeds = lstm_model("UNIDIRECTIONAL_SEQUENCE_LSTM", rng, steps=1500, n_in=5, units=6)
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
    plan = it.gpu_plan
    assert plan.cpu_op_count == 0 and sum(len(s.kernels) for s in plan.steps if s.device == "gpu") > 1500
    assert len(generated) == len(set(generated)) < 20, f"{len(generated)} invokers for {len(set(generated))} kernels"
    lstm_step = next(i for i, s in enumerate(plan.steps) if s.op.name == "UNIDIRECTIONAL_SEQUENCE_LSTM")
    assert len(plan.io.const_buffers[lstm_step]) == 1  # input weights, recurrent weights, bias: once, packed
    assert_close(run_model(lambda **kw: it, model, feeds)[0], run_model(litert(), model, feeds)[0])


def test_a_sequence_longer_than_the_device_takes_runs_on_the_cpu(opencl_device, rng, monkeypatch):
    """A fuzz finding: an LSTM mutant of 2,097,168 steps would get a plan of one kernel per step (and ran for
    minutes); past ``MAX_STEPS`` the sequence stays on the CPU kernel (numba), named in the log, and matches."""
    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.kernels import recurrent

    from .conftest import assert_close, litert, run_model
    from .oputil import lstm_model

    monkeypatch.setattr(recurrent, "MAX_STEPS", 20)
    model, feeds = lstm_model("UNIDIRECTIONAL_SEQUENCE_LSTM", rng, steps=21, n_in=5, units=6)
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
    (cpu_step,) = [s for s in it.gpu_plan.steps if s.device != "gpu"]
    assert cpu_step.op.name == "UNIDIRECTIONAL_SEQUENCE_LSTM" and "21 steps" in cpu_step.reason
    assert_close(run_model(lambda **kw: it, model, feeds)[0], run_model(litert(), model, feeds)[0])


@pytest.mark.parametrize("op", ["LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"])
def test_comparisons_on_device(gpu, rng, op):
    a = rng.integers(-2, 3, (1, 3, 4, 5)).astype(np.float32)
    b = rng.integers(-2, 3, (5,)).astype(np.float32)
    check_op(op, [In(a), In(b)], [Out(np.bool_)], **gpu)


@pytest.mark.parametrize("op", ["LOGICAL_AND", "LOGICAL_OR"])
def test_logical_on_device(gpu, rng, op):
    check_op(op, [In(rng.random((2, 3, 6)) > 0.5), In(rng.random((2, 3, 6)) > 0.5)], [Out(np.bool_)], **gpu)
    check_op("LOGICAL_NOT", [In(rng.random((3, 7)) > 0.5)], [Out(np.bool_)], **gpu)


@pytest.mark.parametrize("op", ["LESS", "GREATER_EQUAL", "EQUAL", "LOGICAL_AND", "LOGICAL_OR", "LOGICAL_NOT"])
def test_a_mask_cast_to_float_holds_positive_zeros(gpu, rng, op):
    """A fuzz finding (tests/fuzz_valid, seed 595): the device stored a comparison's false as -0.0 (the vector
    comparison's 0 times -1.0f), so x * CAST(mask) was -0.0 for a positive x, and a division by it the other
    infinity: c / (x * mask) then RELU6 gave 6 where LiteRT gives 0. The mask cast to float is LiteRT's, the
    sign of each zero included (assert_close cannot see it)."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import litert, run_model

    b = ModelBuilder()
    x = b.input("x", (1, 4, 5, 6))
    mask = b.tensor("mask", (1, 4, 5, 6), np.bool_)
    if op.startswith("LOGICAL"):
        first = b.tensor("first", (1, 4, 5, 6), np.bool_)
        b.op("LESS", [x, b.const("hi", np.float32(-0.2))], [first])
        if op == "LOGICAL_NOT":
            b.op(op, [first], [mask])
        else:  # (x in (-0.6, -0.2), x outside [-0.2, 0.2])
            second = b.tensor("second", (1, 4, 5, 6), np.bool_)
            b.op("GREATER", [x, b.const("lo", np.float32(-0.6 if op == "LOGICAL_AND" else 0.2))], [second])
            b.op(op, [first, second], [mask])
    else:
        other = np.round(rand(rng, (6,)), 1) if op != "EQUAL" else np.float32(0.5)
        b.op(op, [x, b.const("c", np.asarray(other, np.float32))], [mask])
    as_float = b.tensor("as_float", (1, 4, 5, 6))
    b.op("CAST", [mask], [as_float])
    b.output(as_float)
    model = b.build()
    feeds = [np.where(rng.random((1, 4, 5, 6)) < 0.2, 0.5, np.round(rand(rng, (1, 4, 5, 6)), 1)).astype(np.float32)]
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    assert it.gpu_plan.cpu_op_count == 0
    (got,), (want,) = run_model(lambda **kw: it, model, feeds), run_model(litert(), model, feeds)
    assert 0 < np.count_nonzero(want) < want.size
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("op,shapes", [("SELECT", [(2, 3, 4, 6)] * 3), ("SELECT_V2", [(2, 3, 4, 6)] * 3),
                                       ("SELECT_V2", [(1, 3, 1, 6), (2, 3, 4, 6), (6,)]),
                                       ("SELECT_V2", [(3, 5), (1, 5), (3, 1)])])
def test_select(gpu, rng, op, shapes):
    """x where the condition holds, else y (a device comparison's mask, or the graph's own bool input), broadcast
    as SELECT_V2 does."""
    cond, x, y = shapes
    check_op(op, [In(rng.random(cond) < 0.5), In(rand(rng, x)), In(rand(rng, y))], **gpu)
    check_op(op, [rng.random(cond) < 0.5, In(rand(rng, x)), rand(rng, y)], **gpu)


def test_lstm_single_step_on_device_keeps_state(gpu, rng):
    from tflgpu import Interpreter

    from .conftest import assert_close, litert
    from .oputil import lstm_model

    model, feeds = lstm_model("LSTM", rng, cell_clip=0.5)
    ours = Interpreter(model_content=model, delegate=gpu["delegate"])
    assert ours.gpu_plan.cpu_op_count == 0
    ref = litert()(model_content=model)
    for it in (ours, ref):
        it.allocate_tensors()
    for _ in range(3):
        for it in (ours, ref):
            it.set_tensor(it.get_input_details()[0]["index"], feeds[0])
            it.invoke()
        idx = ref.get_output_details()[0]["index"]
        assert_close(ours.get_tensor(idx), ref.get_tensor(idx), gpu["rtol_scale"])


@pytest.mark.parametrize("pad", ["SAME", "VALID"])
def test_mediapipe_argmax_pool_and_unpool_on_device(opencl_device, rng, pad):
    """FP32 on the device (int32 indices are exact there), against the CPU kernels (themselves checked
    against LiteRT's MAX_POOL_2D in test_ops_graph); the two ops chained."""
    import struct

    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    params = struct.pack("<10i", 1 if pad == "SAME" else 2, 2, 2, 2, 2, 0, 0, 0, 0, 0)
    b = ModelBuilder()
    x = b.input("x", (2, 6, 7, 5))
    pooled, idx = b.tensor("pooled", (1,)), b.tensor("idx", (1,), np.int32)
    b.op("MaxPoolingWithArgmax2D", [x], [pooled, idx], custom_options=params)
    restored = b.tensor("restored", (2, 6, 7, 5))  # unpooling restores the original size
    b.op("MaxUnpooling2D", [pooled, idx], [restored], custom_options=params)
    b.output(pooled, idx, restored)
    model = b.build()
    feeds = [rand(rng, (2, 6, 7, 5))]
    it = Interpreter(model_content=model, delegate=GpuDelegate())
    assert it.gpu_plan.cpu_op_count == 0
    from .conftest import run_model

    got = run_model(lambda **kw: it, model, feeds)
    want = run_model(Interpreter, model, feeds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    fp16 = Interpreter(model_content=model, delegate=GpuDelegate(precision_loss_allowed=True))
    if opencl_device.identity.fp16:
        assert fp16.gpu_plan.cpu_op_count == 2  # indices are not exact in half: CPU


@pytest.mark.parametrize("const_weights", [False, True])
def test_conv_constant_memory_weights(gpu, rng, const_weights):
    """The small-filter variant with weights in __constant memory computes the same conv."""
    from tflgpu import Interpreter

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    model, feeds = op_model("CONV_2D", [In(rand(rng, (1, 7, 6, 4))), rand(rng, (8, 3, 3, 4)), rand(rng, (8,))],
                            padding="SAME", stride_w=1, stride_h=1)
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    from tflgpu.runtime.executor import GpuPlan

    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)),
                   params={0: {"const_weights": const_weights}})
    spec = plan.steps[0].specs[0]
    assert spec.params["const_weights"] is const_weights and ("__constant" in spec.source) is const_weights
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


def test_inference_priorities_map_to_precision():
    from tflgpu.delegate import GpuDelegate as G

    assert not G().wants_fp16()  # default: MAX_PRECISION first
    assert G(precision_loss_allowed=True).wants_fp16()
    assert G(inference_priority1="MIN_LATENCY").wants_fp16()
    assert G(inference_priority1="MIN_MEMORY_USAGE", inference_priority2="MAX_PRECISION").wants_fp16()
    assert not G(inference_priority1="AUTO", inference_priority2="MAX_PRECISION").wants_fp16()
    assert G(inference_priority1="AUTO").wants_fp16()  # all AUTO: precision may be traded
    with pytest.raises(ValueError):
        G(inference_priority1="FASTEST")
    with pytest.raises(ValueError):
        G(max_delegated_partitions=0)
    # FP16 for its memory (a CPU device stores it too) only where MIN_MEMORY_USAGE decides; the legacy flag wins
    assert G(inference_priority1="MIN_MEMORY_USAGE").fp16_for_memory()
    assert not G(precision_loss_allowed=True, inference_priority1="MIN_MEMORY_USAGE").fp16_for_memory()
    assert not G(inference_priority1="MIN_LATENCY", inference_priority2="MIN_MEMORY_USAGE").fp16_for_memory()


def test_a_cpu_device_stores_fp32_for_speed(opencl_device, monkeypatch, caplog):
    """Where precision loss is allowed for speed (the legacy flag, MIN_LATENCY, all AUTO), a CPU OpenCL device's
    plan stores FP32, which runs faster there (runtime.plan.CPU_DEVICE_FP32), and says so in the log; MIN_MEMORY_USAGE
    first stores FP16 on it; a GPU's plan stores FP16 either way. Checked on whatever device there is."""
    import logging

    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.delegate import fp16_storage

    if not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    monkeypatch.setattr("tflgpu.runtime.plan.CPU_DEVICE_FP32", True)
    x = np.ones((1, 4, 4, 8), np.float32)
    model, _ = op_model("ADD", [In(x), In(x)], [Out(shape=(1, 4, 4, 8))])
    cpu = opencl_device.identity.device_type == "CPU"
    cases = [({"precision_loss_allowed": True}, not cpu), ({"inference_priority1": "MIN_LATENCY"}, not cpu),
             ({"inference_priority1": "AUTO"}, not cpu), (fp16_storage(), True), (fp16_storage(False), False)]
    for options, fp16 in cases:
        with caplog.at_level(logging.INFO, logger="tflgpu"):
            caplog.clear()
            it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning="none", **options))
            it.allocate_tensors()
        assert it.gpu_plan.fp16 is fp16, options
        assert ("is a CPU device, where FP16 storage runs slower" in caplog.text) is (cpu and not fp16
                                                                                     and options != fp16_storage(False))


@pytest.mark.parametrize("shape,cout,tile,window", [
    ((1, 9, 11, 24), 40, {"group_tile": (16, 4), "tile_x": 2, "tile_s": 2, "k_chunk": 4}, None),  # 99 px: ragged
    ((2, 7, 6, 5), 6, {"group_tile": (8, 8), "tile_x": 1, "tile_s": 1, "k_chunk": 8}, None),  # 2 images, 2 slices
    ((1, 14, 14, 64), 30, {"group_tile": (32, 2), "tile_x": 4, "tile_s": 4, "k_chunk": 4}, None),
    ((1, 4, 4, 128), 64, {"group_tile": (64, 1), "tile_x": 1, "tile_s": 8, "k_chunk": 8}, None),  # px < the group
    # a conv with a window as an implicit GEMM over its taps (im2col_stage): a 3-channel stride-2 stem, SAME 3x3
    # with two images, a dilated 3x3, an unsquare VALID 5x3 whose 15 taps x 2 slices split across chunks of 8
    ((1, 17, 17, 3), 16, {"group_tile": (32, 8), "tile_x": 1, "tile_s": 1, "k_chunk": 8}, (3, 3, 2, 1, "SAME")),
    ((2, 9, 10, 12), 20, {"group_tile": (16, 4), "tile_x": 2, "tile_s": 2, "k_chunk": 4}, (3, 3, 1, 1, "SAME")),
    ((1, 12, 11, 8), 8, {"group_tile": (8, 8), "tile_x": 1, "tile_s": 1, "k_chunk": 16}, (3, 3, 1, 2, "SAME")),
    ((1, 10, 9, 6), 9, {"group_tile": (64, 1), "tile_x": 1, "tile_s": 4, "k_chunk": 8}, (5, 3, 1, 1, "VALID")),
    # the sum split among k_split work-items per output (k_split): 24 slices in steps of 4 x 4 (the last step's
    # second half zeros), two images of 9 slices by 2 x 2 tiles, and an implicit GEMM whose 18 slices leave two of
    # four shares nothing to sum
    ((1, 7, 7, 96), 40, {"group_tile": (8, 8), "tile_x": 1, "tile_s": 1, "k_chunk": 4, "k_split": 4}, None),
    ((2, 5, 6, 36), 20, {"group_tile": (16, 4), "tile_x": 2, "tile_s": 2, "k_chunk": 4, "k_split": 2}, None),
    ((1, 12, 11, 8), 8, {"group_tile": (8, 8), "tile_x": 1, "tile_s": 1, "k_chunk": 8, "k_split": 4},
     (3, 3, 1, 1, "SAME")),
    # 8 shares (a device whose work-groups take 512 work-items): 40 slices in steps of 8 x 4, six of the second step's
    # shares past the sum; two images of 17 slices in one step of 8 x 4
    ((1, 7, 7, 160), 40, {"group_tile": (16, 4), "tile_x": 1, "tile_s": 1, "k_chunk": 4, "k_split": 8}, None),
    ((2, 5, 3, 68), 20, {"group_tile": (8, 8), "tile_x": 1, "tile_s": 1, "k_chunk": 4, "k_split": 8}, None),
    # each step read one step ahead into registers (prefetch): 99 px by 2 x 2 tiles, 6 slices in steps of 4 (the
    # second half zeros); a sum of one step; 4 shares staging 16 slices of 8 px a step, so that half the group's 256
    # work-items have no input value to read; implicit GEMMs (taps computed ahead), alone and in 4 shares
    ((1, 9, 11, 24), 40, {"group_tile": (16, 4), "tile_x": 2, "tile_s": 2, "k_chunk": 4, "prefetch": True}, None),
    ((2, 7, 6, 5), 6, {"group_tile": (8, 8), "tile_x": 1, "tile_s": 1, "k_chunk": 8, "prefetch": True}, None),
    ((1, 7, 7, 96), 40, {"group_tile": (8, 8), "tile_x": 1, "tile_s": 1, "k_chunk": 4, "k_split": 4,
                         "prefetch": True}, None),
    ((2, 9, 10, 12), 20, {"group_tile": (16, 4), "tile_x": 2, "tile_s": 2, "k_chunk": 4, "prefetch": True},
     (3, 3, 1, 1, "SAME")),
    ((1, 12, 11, 8), 8, {"group_tile": (8, 8), "tile_x": 1, "tile_s": 1, "k_chunk": 8, "k_split": 4,
                         "prefetch": True}, (3, 3, 1, 2, "SAME")),
])
def test_conv_group_tile_variant(gpu, rng, shape, cout, tile, window):
    """The conv as a GEMM with local-memory tiles (a work-group stages input and weight tiles; the GPU way), a
    pointwise one over its input slices, one with a window (``window``: kh, kw, stride, dilation, padding) over
    its taps' input slices, computes the same conv, with its fused activation, where the group overhangs the
    pixels, the sum's slices and the output channels, and with its sum split among work-items."""
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    kh, kw, stride, dil, pad = window or (1, 1, 1, 1, "VALID")
    model, feeds = op_model("CONV_2D", [In(rand(rng, shape)), rand(rng, (cout, kh, kw, shape[3])),
                                        rand(rng, (cout,))], padding=pad, stride_w=stride, stride_h=stride,
                            dilation_w_factor=dil, dilation_h_factor=dil, fused_activation_function="RELU6")
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)),
                   params={0: {"k_split": 1, **tile, "lanes": 4, "vec_hint": "float4", "strided": False}})
    # (k_split: the tile as given, where a GPU's default would share a deep sum; strided: a GPU's default is True)
    (spec,) = plan.steps[0].specs
    split = tile.get("k_split", 1)
    assert spec.local_size == (tile["group_tile"][0], split, tile["group_tile"][1]) and "__local" in spec.source
    assert spec.global_size[1] == shape[0] * split
    assert {k: spec.params[k] for k in tile} == tile and plan.cpu_op_count == 0
    assert ("const int knext" in spec.source) == tile.get("prefetch", False)
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("shape,cout,k,stride,pad,tile_s", [
    ((1, 9, 11, 6), 10, 3, 1, "SAME", 2),  # 3 output slices, tiles of 2: the last tile half padding
    ((2, 8, 8, 5), 6, 3, 2, "VALID", 1),
    ((1, 17, 17, 3), 16, 3, 2, "SAME", 4),  # an RGB stem reading the dense graph input
    ((1, 7, 7, 40), 48, 1, 1, "VALID", 4),  # pointwise, as the direct kernel
])
def test_conv_image_weights_variant(gpu, rng, shape, cout, k, stride, pad, tile_s):
    """The direct conv reading its weights from a read-only image (the texture path; ``image_weights``), half
    texels in an FP16 plan where the device has them: the same conv as LiteRT."""
    from tflgpu import Interpreter
    from tflgpu.kernels.base import Target
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    model, feeds = op_model("CONV_2D", [In(rand(rng, shape)), rand(rng, (cout, k, k, shape[3])), rand(rng, (cout,))],
                            padding=pad, stride_w=stride, stride_h=stride, fused_activation_function="RELU6")
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    device = _device()
    if not Target.of(device.cl_device, device.identity.device_type).images:
        pytest.skip("the device has no image support")
    params = {"image_weights": True, "tile_x": 2, "tile_s": tile_s, "lanes": 4, "vec_hint": "float4",
              "group_tile": None, "split": 1}
    plan = GpuPlan(it.cpu_runner(), device, PlanConfig(fp16=_fp16(gpu)), params={0: params})
    (spec,) = plan.steps[0].specs
    assert {key: spec.params[key] for key in params} == params and "image2d_t wts" in spec.source
    assert [a.kind for a in spec.args][:2] == ["tensor", "image"] and plan.cpu_op_count == 0
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("shape,cout,k,stride,tile", [
    ((1, 9, 11, 6), 10, 3, 1, (2, 2, 4)),
    ((2, 8, 8, 5), 6, 3, 2, (1, 1, 4)),
    ((1, 17, 17, 3), 16, 3, 2, (4, 2, 8)),  # an RGB stem reading the dense input, rounded to half
    ((1, 12, 12, 64), 40, 3, 1, (2, 4, 16)),  # 576 terms per sum in half
])
@pytest.mark.parametrize("dense", [True, False])
def test_conv_half_math_variant(opencl_device, rng, shape, cout, k, stride, tile, dense):
    """FP16 arithmetic in the direct conv (``half_math``: half accumulators over half inputs and weights), in an
    FP16 plan: within FP16's tolerance of LiteRT, with 4-, 8- and 16-lane half accumulators, reading the graph
    input's dense buffer or (``dense`` off) its half slice layout."""
    tx, ts, lanes = tile
    params = {"half_math": True, "tile_x": tx, "tile_s": ts, "lanes": lanes, "vec_hint": None, "group_tile": None}
    it, plan, check = _half_math_conv(opencl_device, rng, shape, cout, k, stride, params, dense)
    (spec,) = plan.steps[0].specs
    assert f"half{lanes} acc" in spec.source and (it.model.main.inputs[0] in spec.dense) == dense
    check()


def _half_math_conv(opencl_device, rng, shape, cout, k, stride, params, dense):
    """A SAME-padded RELU6 conv's FP16 plan with ``params`` (FP16 arithmetic): the interpreter, the plan, and a
    check that the plan's kernel took them and computes LiteRT's values within FP16's tolerance."""
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    if not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    w = rand(rng, (cout, k, k, shape[3])) / np.float32(np.sqrt(k * k * shape[3]))
    model, feeds = op_model("CONV_2D", [In(rand(rng, shape)), w, rand(rng, (cout,))], padding="SAME",
                            stride_w=stride, stride_h=stride, fused_activation_function="RELU6")
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    plan = GpuPlan(it.cpu_runner(), opencl_device, PlanConfig(fp16=True, dense_boundary=dense),
                   params={0: params})

    def check():
        (spec,) = plan.steps[0].specs
        assert {key: spec.params[key] for key in params} == params
        assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], 1e-2)

    return it, plan, check


@pytest.mark.parametrize("shape,cout,k,stride,tile,kc", [
    ((1, 14, 14, 64), 48, 1, 1, (8, 8), 8),  # a pointwise conv: 64 terms per sum in half
    ((1, 7, 7, 256), 40, 1, 1, (16, 4), 4),  # 256 terms, a ragged last pixel group
    ((1, 9, 11, 6), 10, 3, 1, (8, 8), 4),  # a windowed conv as an implicit GEMM over its taps
    ((2, 8, 8, 5), 6, 3, 2, (16, 4), 8),
])
def test_conv_group_tile_half_math_variant(opencl_device, rng, shape, cout, k, stride, tile, kc):
    """FP16 arithmetic in the group tile (the GPU's GEMM through local memory: half4 tiles and accumulators), in an
    FP16 plan: within FP16's tolerance of LiteRT for pointwise and windowed convs, one and two images."""
    params = {"half_math": True, "group_tile": tile, "k_chunk": kc, "tile_x": 1, "tile_s": 1, "lanes": 4,
              "vec_hint": None, "strided": False}  # (a GPU's default strides a stride-2 conv's pixels)
    _, plan, check = _half_math_conv(opencl_device, rng, shape, cout, k, stride, params, dense=False)
    (spec,) = plan.steps[0].specs
    assert "__local half4 xs" in spec.source and "half4 acc0_0" in spec.source
    check()


@pytest.mark.parametrize("shape,cout,ls,tx", [
    ((1, 14, 14, 64), 48, 16, 4),
    ((2, 5, 7, 20), 37, 16, 2),  # 5 input slices (a partial step), two images, a padded last output slice
    ((1, 6, 6, 260), 70, 64, 1),  # 65 input slices, more work-items than output slices
])
def test_pointwise_conv_broadcast_variant(gpu, rng, shape, cout, ls, tx):
    """The pointwise conv as a GEMM sharing its input through sub-group broadcasts (``broadcast``: a work-group of
    ls work-items along the output slices): the same conv, with an epilogue-free RELU6, where the device has
    sub-group functions."""
    from tflgpu import Interpreter
    from tflgpu.kernels.base import Target
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    it0 = Interpreter(model_content=op_model("RELU", [In(rand(rng, (1, 4)))])[0], delegate=gpu["delegate"])
    if Target.of(it0.gpu_plan.device.cl_device, "").subgroups is None:
        pytest.skip("device has no sub-group functions")
    w = rand(rng, (cout, 1, 1, shape[3])) / np.float32(np.sqrt(shape[3]))
    model, feeds = op_model("CONV_2D", [In(rand(rng, shape)), w, rand(rng, (cout,))], padding="VALID",
                            stride_w=1, stride_h=1, fused_activation_function="RELU6")
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    params = {"broadcast": ls, "tile_x": tx, "tile_s": 1, "lanes": 4, "vec_hint": None, "group_tile": None}
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu), dense_boundary=False),
                   params={0: params})
    (spec,) = plan.steps[0].specs
    assert spec.local_size == (ls, 1, 1) and {k: spec.params[k] for k in params} == params
    assert "sub_group_broadcast" in spec.source and plan.cpu_op_count == 0
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("batch,cin,cout,split,ts", [(1, 1024, 1001, 32, 1), (2, 40, 30, 8, 2), (1, 6, 5, 64, 1)])
def test_one_pixel_conv_split_variant(gpu, rng, batch, cin, cout, split, ts):
    """A pointwise conv of one pixel (a classifier written as a 1x1 conv) with its sum over the input split among
    the work-items of a group (FULLY_CONNECTED's split kernel): the same conv, also with more work-items than input
    slices and with two images."""
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    model, feeds = op_model("CONV_2D", [In(rand(rng, (batch, 1, 1, cin))), rand(rng, (cout, 1, 1, cin)),
                                        rand(rng, (cout,))], padding="VALID", stride_w=1, stride_h=1,
                            fused_activation_function="RELU")
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)),
                   params={0: {"split": split, "tile_s": ts, "lanes": 4, "vec_hint": None}})
    (spec,) = plan.steps[0].specs
    assert spec.local_size == (split, 1, 1) and spec.params["split"] == split and plan.cpu_op_count == 0
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


GPU_SHAPED = {  # op, inputs (from rng), options, the knobs a GPU's defaults pick
    "pointwise": ("CONV_2D", lambda r: [In(rand(r, (1, 14, 14, 64))), rand(r, (96, 1, 1, 64)), rand(r, (96,))],
                  {"padding": "VALID", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU6"},
                  {"group_tile": (32, 8), "k_chunk": 8, "tile_x": 1, "tile_s": 1}),
    "stem": ("CONV_2D", lambda r: [In(rand(r, (1, 17, 17, 3))), rand(r, (16, 3, 3, 3)), rand(r, (16,))],
             {"padding": "SAME", "stride_w": 2, "stride_h": 2}, {"tile_x": 2, "tile_s": 1, "strided": True}),
    "classifier": ("CONV_2D", lambda r: [In(rand(r, (1, 1, 1, 256))), rand(r, (100, 1, 1, 256)), rand(r, (100,))],
                   {"padding": "VALID", "stride_w": 1, "stride_h": 1}, {"split": 32}),
    "depthwise": ("DEPTHWISE_CONV_2D", lambda r: [In(rand(r, (1, 14, 14, 32))), rand(r, (1, 3, 3, 32)),
                                                  rand(r, (32,))],
                  {"padding": "SAME", "stride_w": 2, "stride_h": 2, "depth_multiplier": 1}, {"tile_x": 1, "slices": 1}),
    "fully_connected": ("FULLY_CONNECTED", lambda r: [In(rand(r, (1, 200))), rand(r, (70, 200)), rand(r, (70,))],
                        {}, {"split": 32, "tile_s": 1, "wide": False}),
    "softmax": ("SOFTMAX", lambda r: [In(rand(r, (1, 1001), -4, 4))], {"beta": 1.0}, {"group": 256}),
    "softmax_rows": ("SOFTMAX", lambda r: [In(rand(r, (2, 3, 70), -4, 4))], {"beta": 0.5}, {"group": 32}),
    "mean": ("MEAN", lambda r: [In(rand(r, (2, 32, 32, 12))), np.array([1, 2], I32)], {"keep_dims": False},
             {"group": 256}),
}


@pytest.mark.parametrize("case", sorted(GPU_SHAPED))
def test_gpu_defaults_on_this_device(opencl_device, rng, monkeypatch, case):
    """The defaults the generators pick for a GPU (kernels.base.Target.gpu: local-memory GEMM tiles, split sums,
    one output per work-item) compute what LiteRT does, here on whatever device there is (the CPU runtime in CI)."""
    from tflgpu import Interpreter
    from tflgpu.kernels.base import Target

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
    op, inputs, options, expected = GPU_SHAPED[case]
    model, feeds = op_model(op, inputs(rng), **options)
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False))
    (spec,) = it.gpu_plan.steps[0].specs
    assert {k: spec.params[k] for k in expected} == expected and it.gpu_plan.cpu_op_count == 0
    assert_close(it.gpu_plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], 1e-4)


@pytest.mark.parametrize("shape,cout,pad", [((1, 9, 11, 8), 8, "SAME"), ((2, 7, 6, 5), 6, "VALID"),
                                            ((1, 16, 16, 16), 12, "SAME")])
def test_conv_winograd_variant(gpu, rng, shape, cout, pad):
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, run_model
    from .oputil import op_model

    model, feeds = op_model("CONV_2D", [In(rand(rng, shape)), rand(rng, (cout, 3, 3, shape[3])), rand(rng, (cout,))],
                            padding=pad, stride_w=1, stride_h=1, fused_activation_function="RELU6")
    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    plan = GpuPlan(it.cpu_runner(), _device(), PlanConfig(fp16=_fp16(gpu)),
                   params={0: {"winograd": True}})
    assert plan.steps[0].specs[0].params["winograd"] is True and plan.cpu_op_count == 0
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("maker", ["TOPK_V2", "input"])
@pytest.mark.parametrize("shape,k,axis", [((1, 6, 5, 12), 5, 3), ((9, 4), 2, 0), ((2, 7, 3), 4, 1)])
def test_gather_by_an_index_tensor(gpu, rng, shape, k, axis, maker):
    """GATHER reads an index tensor made on the device (TOPK_V2's) or uploaded (an int32 graph input), held as
    floats: three sets of indices through one plan, against LiteRT."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x = b.input("x", shape)
    y = b.tensor("y", shape[:axis] + (k,) + shape[axis + 1:])
    if maker == "TOPK_V2":
        scores = b.input("scores", (shape[axis],))
        top, order = b.tensor("top", (k,)), b.tensor("order", (k,), np.int32)
        b.op("TOPK_V2", [scores, b.const("k", np.array(k, np.int32))], [top, order])
    else:
        order = b.input("order", (k,), np.int32)
    b.op("GATHER", [x, order], [y], axis=axis, batch_dims=0)
    b.output(y)
    model = b.build()
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    assert it.gpu_plan.cpu_op_count == 0
    for _ in range(3):
        perm = rng.permutation(shape[axis])
        second = perm.astype(np.float32) if maker == "TOPK_V2" else perm[:k].astype(np.int32)  # (no ties)
        feeds = [rand(rng, shape), second]
        assert_close(run_model(lambda **kw: it, model, feeds)[0], run_model(litert(), model, feeds)[0],
                     gpu["rtol_scale"])


@pytest.mark.parametrize("shape,k", [((1, 32), 8), ((2, 3, 50), 5), ((3, 2, 4, 9), 9), ((5, 1), 1)])
def test_topk(gpu, rng, shape, k):
    """TOPK_V2 on the device: values and indices equal LiteRT's, ties (values on a coarse grid, exact in half)
    ordered by index as TFLite does, twice through one plan."""
    from tflgpu import Interpreter

    from .conftest import litert, run_model
    from .oputil import op_model

    def grid():
        return (rng.integers(-6, 6, shape) / 4).astype(np.float32)

    model, _ = op_model("TOPK_V2", [In(grid()), np.array(k, I32)], [Out(np.float32), Out(np.int32)])
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    assert it.gpu_plan.cpu_op_count == 0
    for _ in range(2):
        feeds = [grid()]
        for got, want in zip(run_model(lambda **kw: it, model, feeds), run_model(litert(), model, feeds)):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("source", ["TOPK_V2", "input"])
def test_moving_indices(gpu, rng, source):
    """TOPK_V2's indices sliced, reshaped and read by a GATHER all run on the device (their values are positions
    along an axis of 40: exact in any storage); the same moves of an int32 graph input, whose values may be any
    integer, stay on the CPU. Both against LiteRT, the indices output equal."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x = b.input("x", (1, 5, 40))
    if source == "TOPK_V2":
        scores = b.input("scores", (1, 40))
        top, order = b.tensor("top", (1, 6)), b.tensor("order", (1, 6), np.int32)
        b.op("TOPK_V2", [scores, b.const("k", np.array(6, np.int32))], [top, order])
    else:
        order = b.input("order", (1, 6), np.int32)
    part, flat, y = b.tensor("part", (1, 4), np.int32), b.tensor("flat", (4,), np.int32), b.tensor("y", (1, 5, 4))
    b.op("STRIDED_SLICE", [order, b.const("begin", np.array([0, 1], np.int32)),
                           b.const("end", np.array([1, 5], np.int32)), b.const("strides", np.array([1, 1], np.int32))],
         [part], begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0, offset=False)
    b.op("RESHAPE", [part, b.const("shape", np.array([4], np.int32))], [flat], new_shape=[4])
    b.op("GATHER", [x, flat], [y], axis=2, batch_dims=0)
    b.output(y, flat)
    model = b.build()
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    moves = [s.device for s in it.gpu_plan.steps if s.op.name in ("STRIDED_SLICE", "RESHAPE")]
    assert moves == (["gpu", "gpu"] if source == "TOPK_V2" else ["cpu", "cpu"])
    for _ in range(2):
        perm = rng.permutation(40)
        second = perm.astype(np.float32)[None] if source == "TOPK_V2" else perm[None, :6].astype(np.int32)
        feeds = [rand(rng, (1, 5, 40)), second]
        got, want = run_model(lambda **kw: it, model, feeds), run_model(litert(), model, feeds)
        assert_close(got[0], want[0], gpu["rtol_scale"])
        assert got[1].dtype == np.int32
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_cast_to_float_on_device(gpu, rng, dtype):
    """CAST of integers (from ARG_MAX on the device, or a graph input uploaded) and bools to float32; a cast of
    another kind stays on the CPU."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x = b.input("x", (1, 5, 6, 9))
    raw = b.input("raw", (1, 5, 6), dtype)
    idx, f_idx, f_raw, y = (b.tensor("idx", (1, 5, 6), np.int32), b.tensor("f_idx", (1, 5, 6)),
                            b.tensor("f_raw", (1, 5, 6)), b.tensor("y", (1, 5, 6)))
    b.op("ARG_MAX", [x, b.const("axis", np.array([3], np.int32))], [idx], output_type=2)
    b.op("CAST", [idx], [f_idx])
    b.op("CAST", [raw], [f_raw])
    b.op("ADD", [f_idx, f_raw], [y])
    back = b.tensor("back", (1, 5, 6), np.int32)
    b.op("CAST", [y], [back])  # (float to int: the CPU's)
    b.output(y, back)
    model = b.build()
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    casts = [s for s in it.gpu_plan.steps if s.op.name == "CAST"]
    assert [s.device for s in casts] == ["gpu", "gpu", "cpu"]
    if not it.gpu_plan.fp16:  # (the device holds the integers as floats: each cast is its input's buffer)
        assert all(s.link is not None and not s.specs for s in casts[:2])
    for _ in range(2):
        raw_v = rng.integers(0, 2, (1, 5, 6)).astype(dtype) if dtype is np.bool_ else \
            rng.integers(-1000, 1000, (1, 5, 6)).astype(dtype)
        feeds = [rand(rng, (1, 5, 6, 9)), raw_v]
        got, want = run_model(lambda **kw: it, model, feeds), run_model(litert(), model, feeds)
        assert_close(got[0], want[0], gpu["rtol_scale"])
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("shape,axis", [((1, 5, 6, 7), 3), ((1, 5, 6, 7), 1), ((4, 9), 0), ((3, 2, 10), -1)])
@pytest.mark.parametrize("exclusive,reverse", [(False, False), (True, False), (False, True), (True, True)])
def test_cumsum(gpu, rng, shape, axis, exclusive, reverse):
    check_op("CUMSUM", [In(rand(rng, shape)), np.array(axis, I32)], exclusive=exclusive, reverse=reverse, **gpu)


@pytest.mark.parametrize("shape,idx,axis", [
    ((16, 1, 32), np.array(3, np.int32), 0),
    ((4, 5, 6), np.array([4, 0, 2], np.int32), 1),
    ((2, 3, 4, 5), np.array([3, 3], np.int32), -1),
    ((7, 9), np.array([[6, 1], [0, 0]], np.int32), 0),
])
def test_gather_constant_indices(gpu, rng, shape, idx, axis):
    a = axis % len(shape)
    oshape = shape[:a] + idx.shape + shape[a + 1:]
    check_op("GATHER", [In(rand(rng, shape)), idx], [Out(np.float32, oshape)], axis=axis, batch_dims=0, **gpu)


_FRAMES = 128 * np.arange(40, dtype=np.int32)[:, None] + np.arange(256, dtype=np.int32)  # tf.signal.frame's table


@pytest.mark.parametrize("shape,idx,axis", [
    ((1, 5248, 2), _FRAMES, 1),  # a signal's 40 frames of 256 samples, hop 128 (BirdNET's STFT framing: 523,264)
    ((12000, 3), (11999 - 2 * np.arange(5000, dtype=np.int32)).reshape(50, 100), 0),  # reversed, stride 2
    ((2, 4100), np.full((4100,), 7, np.int32), 1),  # one column repeated
], ids=["frames", "reversed-strided", "repeated"])
def test_gather_affine_indices_past_the_table_limit(gpu, rng, shape, idx, axis):
    """Constant indices that are an affine function of their position (kernels.reindex._affine) are computed in
    the kernel however many there are; a table of the same size written out stayed on the CPU (over
    MAX_INDEX_TABLE)."""
    from tflgpu.kernels.reindex import MAX_INDEX_TABLE

    assert idx.size > MAX_INDEX_TABLE
    oshape = shape[:axis] + idx.shape + shape[axis + 1:]
    check_op("GATHER", [In(rand(rng, shape)), idx], [Out(np.float32, oshape)], axis=axis, batch_dims=0, **gpu)


def test_gather_of_a_large_table_that_is_not_affine_stays_on_the_cpu(gpu, rng):
    idx = rng.permutation(5000).astype(np.int32)
    check_op("GATHER", [In(rand(rng, (5000, 2))), idx], [Out(np.float32, (5000, 2))], axis=0, batch_dims=0,
             expect_on_device=False, **gpu)


@pytest.mark.parametrize("float_cond", [False, True])
def test_while_through_the_delegate(gpu, rng, float_cond):
    """A counted loop is unrolled onto the device (no op left on the CPU); one whose trip count depends
    on the data stays a loop on the CPU kernels. Both match LiteRT."""
    from tflgpu import Interpreter

    from .conftest import assert_close, litert, run_model
    from .oputil import while_model

    model, feeds = while_model(rng, float_cond=float_cond)
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    assert it.gpu_plan.pass_counts["unroll_while"] == (0 if float_cond else 1)
    assert (it.gpu_plan.cpu_op_count == 0) != float_cond
    got = run_model(lambda **kw: it, model, feeds)
    want = run_model(litert(), model, feeds)
    assert_close(got[0], want[0], gpu["rtol_scale"])
    assert int(got[1]) == int(want[1])


def test_an_unrolled_while_whose_state_is_an_output_takes_another_batch(gpu, rng):
    """The unrolled loop's state, a graph output, was copied into the output's tensor by a RESHAPE to the declared
    shape, baked in: resized to another batch, allocate_tensors() through the delegate failed ("cannot reshape 12
    elements into [2, 3]"; the fuzzer's seed 84 at batch 2 and 0), where LiteRT and the CPU kernels ran it. The
    copy now reshapes to a SHAPE of the state, which the plan folds for its input shapes."""
    from tflgpu import Interpreter

    from .conftest import assert_close, litert, run_model
    from .oputil import while_model

    model, _ = while_model(rng)
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    for batch in (4, 1, 2):
        feeds = [rng.uniform(0, 1, (batch, 3)).astype(np.float32)]
        got = run_model(lambda **kw: it, model, feeds)
        want = run_model(litert(), model, feeds)
        assert got[0].shape == want[0].shape == (batch, 3)
        assert_close(got[0], want[0], gpu["rtol_scale"])
        assert it.gpu_plan.pass_counts["unroll_while"] == 1 and it.gpu_plan.cpu_op_count == 0


def _concat_model(rng) -> bytes:
    """Three concatenations along channels: [a (8 ch), c (8), b (6): convs'], linkable (b
    ragged but last; a and b also read elsewhere; the result read by a conv and an output itself); [b, a] (b
    ragged first) and [x, a] (x a graph input), which are not. 64 pixels: every region starts on a 512-byte
    boundary, as sub-buffers must (CL_DEVICE_MEM_BASE_ADDR_ALIGN: 128 bytes here, 512 on NVIDIA's driver)."""
    from tflgpu.model.builder import ModelBuilder

    bld = ModelBuilder()
    x = bld.input("x", (1, 8, 8, 8))

    def conv(name, src, cin, cout, act="NONE"):
        y = bld.tensor(name, (1, 8, 8, cout))
        bld.op("CONV_2D", [src, bld.const(name + "_w", rand(rng, (cout, 1, 1, cin))),
                           bld.const(name + "_b", rand(rng, (cout,)))], [y], padding="SAME", stride_w=1,
               stride_h=1, fused_activation_function=act)
        return y

    def concat(name, parts, c):
        y = bld.tensor(name, (1, 8, 8, c))
        bld.op("CONCATENATION", parts, [y], axis=3, fused_activation_function="NONE")
        return y

    a, b = conv("a", x, 8, 8, "RELU"), conv("b", x, 8, 6)
    c = conv("c", conv("e", x, 8, 20), 20, 8)  # (e, made after a and b, would take cat's buffer were the regions'
    # lifetimes not cat's)
    cat = concat("cat", [a, c, b], 22)
    y = conv("y", cat, 22, 5)
    d = bld.tensor("d", (1, 8, 8, 6))
    bld.op("RELU6", [b], [d])
    ragged, given = concat("ragged", [b, a], 14), concat("given", [x, a], 16)
    bld.output(y, cat, d, conv("r", ragged, 14, 4), conv("g", given, 16, 4))
    return bld.build()


def _linked_plan_matches(it, model, feeds, gpu, device, switch: str):
    """The interpreter's plan gives LiteRT's outputs and, at FP32, exactly those of the plan built with the link
    ``switch`` (a PlanConfig field) off; returns that unlinked plan (None at FP16)."""
    from tflgpu.runtime.executor import GpuPlan

    from .conftest import assert_close, litert, on_optimized_code, run_model

    got = run_model(lambda **kw: on_optimized_code(it), model, feeds)
    for g, w in zip(got, run_model(litert(), model, feeds)):
        assert_close(g, w, gpu["rtol_scale"])
    if it.gpu_plan.fp16:
        return None
    unlinked = GpuPlan(it.cpu_runner(), device, PlanConfig(**{switch: False}))
    assert switch not in unlinked.pass_counts
    outs = unlinked.run(feeds)
    for g, t in zip(got, it.model.main.outputs):
        np.testing.assert_array_equal(g, outs[t])
    return unlinked


def test_a_channel_concatenation_is_written_by_its_producers(gpu, rng, opencl_device):
    """Linking (selection.link_concatenations): the producers of a concatenation along channels write straight
    into their slices of its output (sub-buffers of its buffer) and the op launches nothing; the plan gives
    LiteRT's outputs, and at FP32 exactly the unlinked plan's. A first input that is not whole slices, and a
    graph input, keep the concatenation's kernel."""
    from tflgpu import Interpreter


    model = _concat_model(rng)
    x = [rand(rng, (1, 8, 8, 8))]
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    plan = it.gpu_plan
    concats = [s for s in plan.steps if s.op.name == "CONCATENATION"]
    assert plan.pass_counts["link_concat"] == 1 and plan.cpu_op_count == 0
    assert [bool(s.link) for s in concats] == [True, False, False] and not concats[0].specs
    unlinked = _linked_plan_matches(it, model, x, gpu, opencl_device, "link_concat")
    if unlinked is not None:
        assert all(s.specs for s in unlinked.steps)


def _split_model(rng):
    """x -> 1x1 CONV_2D to 24 channels -> SPLIT into 3 x 8 (linkable: whole slices) -> TANH / LOGISTIC / as is,
    and the conv's output SPLIT_V into 6 + 18 (not: the first part ends mid-slice) -> RELU each; 4x8 pixels,
    so each 8-channel part starts on a 512-byte boundary."""
    from tflgpu.model.builder import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (1, 4, 8, 8))
    y = b.tensor("y", (1, 4, 8, 24))
    b.op("CONV_2D", [x, b.const("w", rand(rng, (24, 1, 1, 8))), b.const("b", rand(rng, (24,)))], [y],
         padding="VALID", stride_w=1, stride_h=1)
    parts = [b.tensor(f"p{k}", (1, 4, 8, 8)) for k in range(3)]
    b.op("SPLIT", [b.const("axis", np.array(3, np.int32)), y], parts, num_splits=3)
    t0, t1 = b.tensor("t0", (1, 4, 8, 8)), b.tensor("t1", (1, 4, 8, 8))
    b.op("TANH", [parts[0]], [t0])
    b.op("LOGISTIC", [parts[1]], [t1])
    ragged = [b.tensor("r0", (1, 4, 8, 6)), b.tensor("r1", (1, 4, 8, 18))]
    b.op("SPLIT_V", [y, b.const("sizes", np.array([6, 18], np.int32)), b.const("axis_v", np.array(-1, np.int32))],
         ragged, num_splits=2)
    relus = [b.tensor(f"u{k}", r_shape) for k, r_shape in enumerate([(1, 4, 8, 6), (1, 4, 8, 18)])]
    for r, u in zip(ragged, relus):
        b.op("RELU", [r], [u])
    b.output(t0, t1, parts[2], *relus)
    return b.build()


def test_a_channel_split_is_read_in_place_by_its_readers(gpu, rng, opencl_device):
    """Linking a split (selection.link_splits): the outputs of a split along channels into whole slices are
    regions (sub-buffers) of its input's buffer, read in place, and the op launches nothing; one whose part ends
    mid-slice keeps its kernels. LiteRT's outputs, and at FP32 exactly the unlinked plan's."""
    from tflgpu import Interpreter


    align = opencl_device.cl_device.mem_base_addr_align // 8
    if 512 % align:
        pytest.skip(f"the device aligns sub-buffers to {align} bytes")
    model = _split_model(rng)
    x = [rand(rng, (1, 4, 8, 8))]
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    plan = it.gpu_plan
    splits = [s for s in plan.steps if s.op.name in ("SPLIT", "SPLIT_V")]
    assert plan.pass_counts["link_split"] == 1 and plan.cpu_op_count == 0
    assert [bool(s.link) for s in splits] == [True, False] and not splits[0].specs and splits[1].specs
    _linked_plan_matches(it, model, x, gpu, opencl_device, "link_split")


def test_a_reshape_keeping_the_slice_order_is_its_inputs_buffer(gpu, rng, opencl_device):
    """Linking a reshape (selection.link_reshapes): (1, 4, 8, 8) -> (1, 32, 8) (the same pixels per image) and
    (1, 1, 1, 24) -> (1, 24) launch nothing, their outputs their inputs' buffers; (1, 4, 8, 8) -> (1, 4, 64)
    (channels regrouped) keeps its kernel. LiteRT's outputs, and at FP32 exactly the unlinked plan's."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder


    b = ModelBuilder()
    x = b.input("x", (1, 4, 8, 8))
    y = b.tensor("y", (1, 4, 8, 8))
    b.op("CONV_2D", [x, b.const("w", rand(rng, (8, 1, 1, 8))), b.const("b", rand(rng, (8,)))], [y],
         padding="VALID", stride_w=1, stride_h=1)
    outs = []
    for name, shape in [("rows", (1, 32, 8)), ("regroup", (1, 4, 64))]:
        r, t = b.tensor(name, shape), b.tensor(f"{name}_tanh", shape)
        b.op("RESHAPE", [y, b.const(f"{name}_shape", np.array(shape, np.int32))], [r], new_shape=list(shape))
        b.op("TANH", [r], [t])
        outs.append(t)
    pooled, flat, z = b.tensor("pooled", (1, 1, 1, 24)), b.tensor("flat", (1, 24)), b.tensor("z", (1, 24))
    b.op("CONV_2D", [y, b.const("w2", rand(rng, (24, 4, 8, 8))), b.const("b2", rand(rng, (24,)))], [pooled],
         padding="VALID", stride_w=1, stride_h=1)
    b.op("RESHAPE", [pooled, b.const("flat_shape", np.array([1, 24], np.int32))], [flat], new_shape=[1, 24])
    b.op("RELU", [flat], [z])
    b.output(*outs, z)
    model = b.build()
    feeds = [rand(rng, (1, 4, 8, 8))]
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    plan = it.gpu_plan
    reshapes = [s for s in plan.steps if s.op.name == "RESHAPE"]
    assert plan.pass_counts["link_reshape"] == 2 and plan.cpu_op_count == 0
    assert [bool(s.link) for s in reshapes] == [True, False, True] and not reshapes[0].specs
    _linked_plan_matches(it, model, feeds, gpu, opencl_device, "link_reshape")


def test_a_reshape_of_a_linked_concatenation_is_all_of_its_buffer(gpu, rng, opencl_device):
    """A concatenation its producers write (linked) reshaped into a graph output (opzoo's [1, 32, 32, 80] ->
    [1, 1024, 80]) and read by a MEAN: the reshape is linked too, its output the whole concatenation's buffer, with
    no copy (64 pixels: each region on the sub-buffer alignment). LiteRT's outputs, and at FP32 exactly the plan's without reshape links."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 8))
    parts = []
    for k in range(2):
        p = b.tensor(f"p{k}", (1, 8, 8, 8))
        b.op("CONV_2D", [x, b.const(f"w{k}", rand(rng, (8, 1, 1, 8))), b.const(f"b{k}", rand(rng, (8,)))], [p],
             padding="VALID", stride_w=1, stride_h=1)
        parts.append(p)
    cat, flat, mean = b.tensor("cat", (1, 8, 8, 16)), b.tensor("flat", (1, 64, 16)), b.tensor("mean", (1, 16))
    b.op("CONCATENATION", parts, [cat], axis=3)
    b.op("MEAN", [cat, b.const("axes", np.array([1, 2], np.int32))], [mean], keep_dims=False)
    b.op("RESHAPE", [cat, b.const("shape", np.array([1, 64, 16], np.int32))], [flat], new_shape=[1, 64, 16])
    b.output(mean, flat)
    model = b.build()
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    links = {s.op.name: type(s.link).__name__ for s in it.gpu_plan.steps if s.link is not None}
    assert links == {"CONCATENATION": "ConcatLink", "RESHAPE": "ReshapeLink"}
    for _ in range(2):
        _linked_plan_matches(it, model, [rand(rng, (1, 8, 8, 8))], gpu, opencl_device, "link_reshape")


def test_a_slice_taking_every_element_is_linked_as_a_reshape(gpu, rng, opencl_device):
    """A STRIDED_SLICE / SLICE selecting all of its input in order (unit strides) only changes the shape:
    (1, 1, 1, 24) -> (1, 24) by shrinking axes (and a reshape of its output), and a SLICE of everything, launch
    nothing; a slice of every other channel, one of a part and one reversing the channels keep their kernels.
    LiteRT's outputs, and at FP32 exactly the unlinked plan's."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (1, 4, 8, 8))
    pooled = b.tensor("pooled", (1, 1, 1, 24))
    b.op("CONV_2D", [x, b.const("w", rand(rng, (24, 4, 8, 8))), b.const("b", rand(rng, (24,)))], [pooled],
         padding="VALID", stride_w=1, stride_h=1)
    outs = []

    def strided(name, begin, end, strides, shape, **masks):
        r, t = b.tensor(name, shape), b.tensor(f"{name}_tanh", shape)
        b.op("STRIDED_SLICE", [pooled, *(b.const(f"{name}_{k}", np.array(v, np.int32))
                                         for k, v in (("begin", begin), ("end", end), ("strides", strides)))], [r],
             **{"begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0, "new_axis_mask": 0, "shrink_axis_mask": 0,
                **masks})
        b.op("TANH", [r], [t])
        outs.append(t)
        return r

    # (the kept ones first: once linked, a tensor is not linked again)
    strided("reversed", [0, 0, 0, -1], [1, 1, 1, 0], [1, 1, 1, -1], (1, 1, 1, 24), end_mask=8)
    strided("every_other", [0, 0, 0, 0], [1, 1, 1, 24], [1, 1, 1, 2], (1, 1, 1, 12))
    strided("part", [0, 0, 0, 4], [1, 1, 1, 24], [1, 1, 1, 1], (1, 1, 1, 20))
    whole = strided("whole", [0, 0, 0, 0], [1, 1, 1, 24], [1, 1, 1, 1], (1, 24), shrink_axis_mask=6)
    chained, chained_relu = b.tensor("chained", (1, 1, 24)), b.tensor("chained_relu", (1, 1, 24))
    b.op("RESHAPE", [whole, b.const("chained_shape", np.array([1, 1, 24], np.int32))], [chained], new_shape=[1, 1, 24])
    b.op("RELU", [chained], [chained_relu])  # (a reshape of a linked slice's output: a region of the same whole)
    outs.append(chained_relu)
    # (a tensor is the whole of one link at most: the SLICE takes another)
    p2, r, t = (b.tensor(n, (1, 1, 1, 24)) for n in ("pooled_relu", "sliced", "sliced_tanh"))
    b.op("RELU", [pooled], [p2])
    b.op("SLICE", [p2, b.const("s_begin", np.zeros(4, np.int32)), b.const("s_size", np.array([1, 1, 1, -1], np.int32))],
         [r])
    b.op("TANH", [r], [t])
    b.output(*outs, t)
    model = b.build()
    feeds = [rand(rng, (1, 4, 8, 8))]
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    plan = it.gpu_plan
    slices = [s for s in plan.steps if s.op.name in ("STRIDED_SLICE", "SLICE")]
    assert plan.pass_counts["link_reshape"] == 3 and plan.cpu_op_count == 0
    assert [bool(s.link) for s in slices] == [False, False, False, True, True]
    chain = next(s for s in plan.steps if s.op.name == "RESHAPE")
    assert chain.link is not None and chain.link.whole == next(s for s in slices if s.link).op.inputs[0]
    _linked_plan_matches(it, model, feeds, gpu, opencl_device, "link_reshape")


def test_a_linked_concatenation_takes_an_input_the_cpu_makes(gpu, rng):
    """A region made by a CPU step (oputil.cpu_op) is uploaded into the concatenation's buffer:
    the linked step read nothing, so the upload was never scheduled and the output held whatever the buffer did
    (4.9e33 in the valid-model fuzz, seed 1201955: an FC on the CPU feeding a concatenation)."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    bld = ModelBuilder()
    x = bld.input("x", (1, 8, 8, 8))
    a, c, cat = bld.tensor("a", (1, 8, 8, 8)), bld.tensor("c", (1, 8, 8, 8)), bld.tensor("cat", (1, 8, 8, 16))
    bld.op("RELU", [x], [a])
    cpu_op(bld, x, c)
    bld.op("CONCATENATION", [a, c], [cat], axis=3, fused_activation_function="NONE")
    bld.output(cat)
    model, feeds = bld.build(), [rand(rng, (1, 8, 8, 8))]
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    assert it.gpu_plan.pass_counts["link_concat"] == 1 and it.gpu_plan.cpu_op_count == 1
    assert_close(run_model(lambda **kw: it, model, feeds)[0], run_model(litert(), model, feeds)[0], gpu["rtol_scale"])


@pytest.mark.parametrize("op", ["ARG_MAX", "ARG_MIN"])
@pytest.mark.parametrize("shape,out", [((1, 5, 7, 6), I32), ((2, 3, 10), np.int64), ((4, 9), I32),
                                       ((1, 4, 4, 13), I32), ((3, 1, 2, 8), np.int64)])
def test_arg_over_channels_on_device(gpu, rng, op, shape, out):
    """A work-item per pixel ranks its channels (lanes past C never count); integer-valued inputs make ties, where
    the first index wins (TFLite's); int32 and int64 indices."""
    x = rng.integers(-3, 4, shape).astype(np.float32)
    got = check_op(op, [In(x), np.array([-1], I32)], [Out(out, shape[:-1])], output_type=4 if out is np.int64 else 2,
                   **gpu)
    np.testing.assert_array_equal(got[0], (np.argmax if op == "ARG_MAX" else np.argmin)(x, axis=-1))


def test_arg_over_another_axis_stays_on_the_cpu(opencl_device, rng):
    check_op("ARG_MAX", [In(rand(rng, (1, 5, 7, 6))), np.array([1], I32)], [Out(I32, (1, 7, 6))], output_type=2,
             delegate=GpuDelegate(), expect_on_device=False)


def _conv_arg_model(rng, shape, cout, k, stride, arg, sums_read: bool, out=I32) -> bytes:
    """x -> CONV_2D (RELU) -> ARG_MAX / ARG_MIN over its channels; with ``sums_read`` the conv's output is also
    read by a MUL (and is not a graph output)."""
    from tflgpu.model.builder import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", shape)
    n, h, w, c = shape
    oh, ow = -(-h // stride), -(-w // stride)
    y = b.tensor("y", (n, oh, ow, cout))
    b.op("CONV_2D", [x, b.const("w", rand(rng, (cout, k, k, c))), b.const("b", rand(rng, (cout,)))], [y],
         padding="SAME", stride_w=stride, stride_h=stride, fused_activation_function="RELU")
    i = b.tensor("i", (n, oh, ow), out)
    b.op(arg, [y, b.const("axis", np.array([3], I32))], [i], output_type=4 if out is np.int64 else 2)
    outs = [i]
    if sums_read:
        m = b.tensor("m", (n, oh, ow, cout))
        b.op("MUL", [y, b.const("s", rand(rng, (cout,)))], [m], fused_activation_function="NONE")
        outs.append(m)
    b.output(*outs)
    return b.build()


@pytest.mark.parametrize("shape,cout,k,stride,arg,sums_read,out", [
    ((1, 9, 11, 5), 16, 3, 1, "ARG_MAX", True, I32),
    ((2, 8, 8, 8), 13, 1, 1, "ARG_MIN", False, np.int64),  # pointwise (one row per image), ragged channels
    ((1, 10, 9, 3), 40, 3, 2, "ARG_MAX", False, I32),  # more slices than a work-item's tile: a loop over them
    ((1, 6, 6, 4), 7, 1, 2, "ARG_MAX", True, np.int64),
])
def test_conv_and_its_channel_rank_are_one_kernel(gpu, rng, opencl_device, shape, cout, k, stride, arg, sums_read,
                                                 out):
    """graph.conv_arg: CONV_2D + ARG_MAX / ARG_MIN over its channels run as one kernel keeping the index in
    registers; the sums are stored only where another op reads them. Indices exactly LiteRT's (FP16: the
    ranked conv keeps FP32, and its sums, which only the FP16 MUL reads, are stored half)."""
    from tflgpu import Interpreter

    from .conftest import assert_close, litert, run_model

    model = _conv_arg_model(rng, shape, cout, k, stride, arg, sums_read, out)
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    plan = it.gpu_plan
    (merged,) = [s for s in plan.steps if s.op.name == "TFLGPU_CONV_ARG"]
    assert plan.pass_counts["conv_arg"] == 1 and plan.cpu_op_count == 0 and len(merged.specs) == 1
    assert len(merged.specs[0].outputs) == (2 if sums_read else 1)
    x = [rand(rng, shape)]
    got, want = run_model(lambda **kw: it, model, x), run_model(litert(), model, x)
    np.testing.assert_array_equal(got[0], want[0])
    if sums_read:
        assert_close(got[1], want[1], gpu["rtol_scale"])
    if plan.fp16:
        assert plan.io.fp16_share == 1.0


@pytest.mark.parametrize("params", [
    {"tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": "float4"},
    {"tile_x": 2, "tile_s": 8, "lanes": 8, "vec_hint": "float8"},
    {"tile_x": 4, "tile_s": 8, "lanes": 16, "vec_hint": "float16"},
    {"tile_x": 4, "tile_s": 2, "lanes": 4, "vec_hint": None, "strided": True},
    {"tile_x": 8, "tile_s": 4, "const_weights": True},
])
def test_conv_arg_tiles(opencl_device, rng, params):
    """Every tile the tuner may give a CONV_ARG ranks the same: the work-item's slice loop steps by tile_s."""
    from tflgpu import Interpreter
    from tflgpu.runtime.executor import GpuPlan
    from tflgpu.runtime.selection import transform_graph

    model = _conv_arg_model(rng, (1, 7, 9, 6), 22, 3, 1, "ARG_MAX", True)
    runner = transform_graph(Interpreter(model_content=model).cpu_runner(), True).runner
    x = [rand(rng, (1, 7, 9, 6))]
    want = runner.run(x)
    plan = GpuPlan(runner, opencl_device, PlanConfig(), params={0: params})
    (merged,) = [s for s in plan.steps if s.op.name == "TFLGPU_CONV_ARG"]
    assert merged.specs[0].params["tile_s"] == params["tile_s"]
    got = plan.run(x)
    for t in plan.sg.outputs:
        np.testing.assert_allclose(got[t], want[t], rtol=1e-4, atol=1e-5)
    assert (got[plan.sg.outputs[0]] == want[plan.sg.outputs[0]]).all()


@pytest.mark.parametrize("dims", [(1, 5, 7, 3), (2, 3, 4, 9), (1, 1, 1, 1001), (1, 6, 2, 8)])
@pytest.mark.parametrize(("loop_slices", "fp32"), [(True, False), (False, False), (True, True), (False, True)])
def test_boundary_kernels_convert_both_ways(opencl_device, rng, dims, loop_slices, fp32):
    """The dense NHWC <-> slice layout kernels at the device boundary, in both grids (a CPU runtime's pixel per
    work-item looping over slices; a GPU's pixel and slice per work-item): what goes in comes back, and the
    slice-layout side is ``to_slices`` of it, padding lanes zero. The float32 form keeps float32 storage inside an
    FP16 program (where the device has fp16). A form's program serves every shape of its channel count: one
    program converts each tensor of that many channels here."""
    import pyopencl as cl

    from tflgpu.kernels.common import BoundaryForm, boundary_args, boundary_grid, to_slices
    from tflgpu.kernels.program import build, program_source
    from tflgpu.ops.layout import Layout

    if fp32 and not opencl_device.identity.fp16:
        pytest.skip("the OpenCL device has no cl_khr_fp16")
    ctx = cl.Context([opencl_device.cl_device])
    q = cl.CommandQueue(ctx)
    form = BoundaryForm(dims[3], loop_slices, fp32)
    prog = build(cl.Program(ctx, program_source([form.source()])), ["-DTFLGPU_FP16"] if fp32 else [])
    for shape in (dims, (2, dims[2] + 1, dims[1], dims[3])):  # (one program, shapes of the same channel count)
        lay = Layout(*shape)
        x = rng.standard_normal(shape).astype(np.float32)
        mf = cl.mem_flags
        dense = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=x)
        slices = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.full(lay.elements, 7.0, np.float32))
        back = cl.Buffer(ctx, mf.READ_WRITE, x.nbytes)
        grid = boundary_grid(lay, loop_slices)
        args = boundary_args(lay)
        cl.enqueue_nd_range_kernel(q, _kernel(cl, prog, form.name + "_in", dense, slices, *args), grid, None)
        cl.enqueue_nd_range_kernel(q, _kernel(cl, prog, form.name + "_out", slices, back, *args), grid, None)
        got_slices, got_back = np.empty(lay.elements, np.float32), np.empty_like(x)
        cl.enqueue_copy(q, got_slices, slices)
        cl.enqueue_copy(q, got_back, back)
        np.testing.assert_array_equal(got_slices, to_slices(x, lay, np.float32))
        np.testing.assert_array_equal(got_back, x)


def _kernel(cl, prog, name, *args):
    k = cl.Kernel(prog, name)
    k.set_args(*args)
    return k


def test_moves_store_through_their_fused_ops(gpu, rng):
    """A move's kernel (kernels.reindex) takes the elementwise ops after it: PAD -> RELU (its pad value too),
    a regrouping RESHAPE -> MUL by a per-channel constant, TRANSPOSE -> ADD of a tensor, GATHER -> TANH, each
    one launch with the padded lanes zeroed (an ADD of 0.5 to a 6-channel tensor), against LiteRT; a reshape
    the plan links keeps its link and its reader's kernel."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x = b.input("x", (1, 5, 6, 6))
    other = b.input("other", (1, 6, 5, 6))
    padded, relu = b.tensor("padded", (1, 7, 8, 6)), b.tensor("relu", (1, 7, 8, 6))
    b.op("PADV2", [x, b.const("pads", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32)),
                   b.const("cval", np.array(-0.25, np.float32))], [padded])
    b.op("RELU", [padded], [relu])
    regroup, scaled = b.tensor("regroup", (1, 5, 36)), b.tensor("scaled", (1, 5, 36))
    b.op("RESHAPE", [x, b.const("rshape", np.array([1, 5, 36], np.int32))], [regroup], new_shape=[1, 5, 36])
    b.op("MUL", [regroup, b.const("scale", rand(rng, (36,)))], [scaled])
    moved, summed, half = b.tensor("moved", (1, 6, 5, 6)), b.tensor("summed", (1, 6, 5, 6)), \
        b.tensor("half", (1, 6, 5, 6))
    b.op("TRANSPOSE", [x, b.const("perm", np.array([0, 2, 1, 3], np.int32))], [moved])
    b.op("ADD", [moved, other], [summed])
    b.op("ADD", [summed, b.const("c", np.array(0.5, np.float32))], [half])
    picked, tanh = b.tensor("picked", (1, 5, 3, 6)), b.tensor("tanh", (1, 5, 3, 6))
    b.op("GATHER", [x, b.const("idx", np.array([4, 0, 4], np.int32))], [picked], axis=2, batch_dims=0)
    b.op("TANH", [picked], [tanh])
    rows, rows_tanh = b.tensor("rows", (1, 30, 6)), b.tensor("rows_tanh", (1, 30, 6))
    b.op("RESHAPE", [x, b.const("rows_shape", np.array([1, 30, 6], np.int32))], [rows], new_shape=[1, 30, 6])
    b.op("TANH", [rows], [rows_tanh])
    b.output(relu, scaled, half, tanh, rows_tanh)
    model = b.build()
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    members = {s.op.name + str(s.op.index): [m.name for m, _ in s.members] for s in it.gpu_plan.steps}
    assert members["PADV2" + "0"] == ["PADV2", "RELU"] and members["RESHAPE2"] == ["RESHAPE", "MUL"]
    assert members["TRANSPOSE4"] == ["TRANSPOSE", "ADD", "ADD"] and members["GATHER7"] == ["GATHER", "TANH"]
    assert members["RESHAPE9"] == ["RESHAPE"] and members["TANH10"] == ["TANH"]
    assert it.gpu_plan.cpu_op_count == 0
    for _ in range(2):
        feeds = [rand(rng, (1, 5, 6, 6)), rand(rng, (1, 6, 5, 6))]
        for g, w in zip(run_model(lambda **kw: it, model, feeds), run_model(litert(), model, feeds)):
            assert_close(g, w, gpu["rtol_scale"])


def test_an_elementwise_op_whose_constant_has_more_dims_than_the_reshape_stays_before_it(gpu, rng):
    """The offline fuzz's seed 60616 (2 ops): MAXIMUM of a [1, 1, 1] constant and a [1, 5, 7] input, reshaped to
    [1, 35]. Moved after the reshape the constant broadcast the output to [1, 1, 35]; the op stays where it is, and
    the output is LiteRT's [1, 35]."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x = b.input("x", (1, 5, 7))
    top, flat = b.tensor("top", (1, 5, 7)), b.tensor("flat", (1, 35))
    b.op("MAXIMUM", [b.const("c", np.full((1, 1, 1), 0.25, np.float32)), x], [top])
    b.op("RESHAPE", [top, b.const("shape", np.array([1, 35], np.int32))], [flat], new_shape=[1, 35])
    b.output(flat)
    model = b.build()
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    assert it.gpu_plan.pass_counts["sink_elementwise"] == 0 and it.gpu_plan.cpu_op_count == 0
    feeds = [rand(rng, (1, 5, 7))]
    (got,), (want,) = run_model(lambda **kw: it, model, feeds), run_model(litert(), model, feeds)
    assert got.shape == want.shape == (1, 35)
    assert_close(got, want, gpu["rtol_scale"])


def test_an_elementwise_op_before_a_reshape_runs_after_it(gpu, rng):
    """graph.sink: an input scaled then regrouped ([1, 4, 6] -> [1, 4, 6, 1]) runs as RESHAPE -> MUL, one kernel
    (the MUL had no kernel before it to join); a TANH its conv takes, and one before a reshape the plan links, stay
    where they are. FP32/FP16 against LiteRT."""
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    from .conftest import assert_close, litert, run_model

    b = ModelBuilder()
    x = b.input("x", (1, 4, 6))
    scaled, grid = b.tensor("scaled", (1, 4, 6)), b.tensor("grid", (1, 4, 6, 1))
    b.op("MUL", [x, b.const("k", np.array(0.75, np.float32))], [scaled])
    b.op("RESHAPE", [scaled, b.const("gshape", np.array([1, 4, 6, 1], np.int32))], [grid], new_shape=[1, 4, 6, 1])
    y = b.input("y", (1, 4, 4, 8))
    conv, tanh, flat = b.tensor("conv", (1, 4, 4, 8)), b.tensor("tanh", (1, 4, 4, 8)), b.tensor("flat", (1, 2, 64))
    b.op("CONV_2D", [y, b.const("w", rand(rng, (8, 1, 1, 8))), b.const("b", rand(rng, (8,)))], [conv],
         padding="VALID", stride_w=1, stride_h=1)
    b.op("TANH", [conv], [tanh])
    b.op("RESHAPE", [tanh, b.const("fshape", np.array([1, 2, 64], np.int32))], [flat], new_shape=[1, 2, 64])
    neg, rows = b.tensor("neg", (1, 4, 4, 8)), b.tensor("rows", (1, 16, 8))
    b.op("NEG", [y], [neg])
    b.op("RESHAPE", [neg, b.const("rshape", np.array([1, 16, 8], np.int32))], [rows], new_shape=[1, 16, 8])
    b.output(grid, flat, rows)
    model = b.build()
    it = Interpreter(model_content=model, delegate=gpu["delegate"])
    plan = it.gpu_plan
    assert plan.pass_counts["sink_elementwise"] == 1 and plan.cpu_op_count == 0
    members = [[m.name for m, _ in s.members] for s in plan.steps]
    assert ["RESHAPE", "MUL"] in members and ["CONV_2D", "TANH"] in members and ["NEG"] in members
    for _ in range(2):
        feeds = [rand(rng, (1, 4, 6)), rand(rng, (1, 4, 4, 8))]
        for g, w in zip(run_model(lambda **kw: it, model, feeds), run_model(litert(), model, feeds)):
            assert_close(g, w, gpu["rtol_scale"])
