"""A plan's launches without an event each (runtime.enqueue.Launcher): what they compute, what a failed launch
raises, and the plan without the direct call."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.runtime import DeviceError

from .conftest import assert_close, litert, run_model


def _queue(device):
    import pyopencl as cl

    ctx = cl.Context([device.cl_device])
    return cl, ctx, cl.CommandQueue(ctx)


def test_a_launch_runs_the_kernel_on_its_sizes(opencl_device):
    """Each (kernel, sizes) launches as given: the same kernel over two grids, and again after its arguments
    change (set on the kernel, not in the launch)."""
    from tflgpu.runtime.enqueue import Launcher

    cl, ctx, q = _queue(opencl_device)
    k = cl.Program(ctx, "__kernel void k(__global float* x, float v) { x[get_global_id(0)] += v; }").build().k
    host = np.zeros(64, np.float32)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    launch = Launcher.make(cl, q)
    assert launch is not None
    k.set_args(buf, np.float32(1))
    launch(k, (64,), (16,))
    launch(k, (32,), None)
    k.set_arg(1, np.float32(10))
    launch(k, (16,), (16,))
    cl.enqueue_copy(q, host, buf)
    assert host.tolist() == [12.0] * 16 + [2.0] * 16 + [1.0] * 32


def test_a_failed_launch_is_a_device_error_naming_the_code(opencl_device):
    from tflgpu.runtime.enqueue import Launcher

    cl, ctx, q = _queue(opencl_device)
    k = cl.Program(ctx, "__attribute__((reqd_work_group_size(8, 1, 1))) __kernel void k(__global float* x) "
                        "{ x[get_global_id(0)] = 1.0f; }").build().k
    k.set_args(cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 256))
    with pytest.raises(DeviceError, match="CL_INVALID_WORK_GROUP_SIZE, global size \\(32,\\), work-group \\(16,\\)"):
        Launcher.make(cl, q)(k, (32,), (16,))


def test_a_plan_launches_directly_where_its_cadence_says_and_through_pyopencl_without_the_call(
        opencl_device, rng, monkeypatch):
    """A plan whose cadence launches with no event each computes what its pyopencl launches compute, and LiteRT's
    values; where the loader's entry point is not found the plan has no launcher, a GPU's trial does not try one,
    and a direct cadence launches through pyopencl."""
    from tflgpu.kernels.base import Target
    from tflgpu.runtime import enqueue
    from tflgpu.runtime.cadence import CANDIDATES, DIRECT, Cadence, CadenceTrial

    from .oputil import In, op_model, rand

    model, feeds = op_model("CONV_2D", [In(rand(rng, (1, 9, 11, 8))), rand(rng, (12, 3, 3, 8)), rand(rng, (12,))],
                            padding="SAME", stride_w=1, stride_h=1, fused_activation_function="RELU6")

    def outputs(cadence: Cadence):
        # (one build: a tiered start's swap to the optimized program would choose the cadence again, and its
        # quick build's values may differ from the optimized build's in the last bit)
        it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tiered_compile=False))
        it.allocate_tensors()
        plan = it.gpu_plan
        plan.cadence = CadenceTrial(plan.launch_count(), (cadence,))  # (one candidate: chosen at once)
        it.set_tensor(it.get_input_details()[0]["index"], feeds[0])
        it.invoke()
        return plan, it.get_tensor(it.get_output_details()[0]["index"])

    plan, direct = outputs(Cadence(direct=True))
    assert plan.launch is not None and plan.cpu_op_count == 0
    _, queued = outputs(Cadence())
    np.testing.assert_array_equal(direct, queued)
    assert_close(direct, run_model(litert(), model, feeds)[0])
    monkeypatch.setattr(enqueue, "opencl_function", lambda cl, name: (_ for _ in ()).throw(OSError("none")))
    plan, fallback = outputs(Cadence(direct=True))
    assert plan.launch is None
    np.testing.assert_array_equal(fallback, queued)
    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False))
    assert it.gpu_plan.cadences == CANDIDATES and not set(DIRECT) & set(it.gpu_plan.cadences)
