"""A kernel's constant arrays bound as one buffer (kernels.program.const_pack): the packed kernels compute exactly
what the generated ones do, each launch takes one constant buffer, and what cannot be packed runs as generated."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.builder import ModelBuilder
from tflgpu.runtime.config import PlanConfig

from .conftest import assert_close, litert, run_model
from .oputil import In, lstm_model, op_model, rand

PRECISIONS = [False, True]


@pytest.fixture(params=PRECISIONS, ids=["fp32", "fp16"])
def fp16(request, opencl_device):
    if request.param and not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    return request.param


def _convs(rng) -> tuple[bytes, list]:
    """Four 3x3 convs of one shape (different weights: the two in the middle share their code) and a residual ADD."""
    b = ModelBuilder()
    x = b.input("x", (1, 9, 11, 8))
    t = x
    for i in range(4):
        y = b.tensor(f"y{i}", (1, 9, 11, 8))
        b.op("CONV_2D", [t, b.const(f"w{i}", rand(rng, (8, 3, 3, 8))), b.const(f"b{i}", rand(rng, (8,)))], [y],
             padding="SAME", stride_w=1, stride_h=1, fused_activation_function="RELU6")
        t = y
    out = b.tensor("out", (1, 9, 11, 8))
    b.op("ADD", [t, x], [out])
    b.output(out)
    return b.build(), [rand(rng, (1, 9, 11, 8))]


def _plan(model: bytes, fp16: bool, params: dict):
    from tflgpu.runtime.device import choose_device
    from tflgpu.runtime.executor import GpuPlan

    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    return it, GpuPlan(it.cpu_runner(), choose_device(), PlanConfig(fp16=fp16), params=params)


def test_packed_kernels_compute_what_the_generated_ones_do(fp16, rng, monkeypatch):
    """The first conv as Winograd (its weights float32 whatever the storage, its bias in the storage precision:
    both in one buffer), the others direct: bit for bit the outputs of the same plan with every constant its
    own buffer, and LiteRT's. Each packed launch takes one constant buffer (its arrays on PACK_ALIGN) and no
    argument in their place; layers sharing code share one function and bind their own constants."""
    import pyopencl as cl

    from tflgpu.kernels import program

    model, feeds = _convs(rng)
    params = {0: {"winograd": True}}
    it, plan = _plan(model, fp16, params)
    out = it.model.main.outputs[0]
    packed = plan.run(feeds)[out]
    assert_close(packed, run_model(litert(), model, feeds)[0], 1e-2 if fp16 else 1e-4)
    convs = [(i, s) for i, s in enumerate(plan.steps) if s.op.name == "CONV_2D"]
    assert len(convs) == 4 and convs[0][1].specs[0].params["winograd"] and plan.cpu_op_count == 0
    bound = []
    for i, s in convs:
        (spec,) = s.specs
        pack = program.const_pack(spec)
        assert pack is not None and len(pack.args) == 2
        (args,) = plan.io.args[i]
        assert len(args) == len(spec.args) - 1 and all(isinstance(a, cl.MemoryObjectHolder) for a in args)
        assert sum(a.kind == "tensor" for a in spec.args) == len(args) - 1  # (input, output; one constant)
        assert pack.offsets[0] == 0 and all(o % program.PACK_ALIGN == 0 for o in pack.offsets)
        assert pack.offsets[1] > pack.offsets[0] and args[-1].size == pack.size
        (source,) = program.compiled_sources([spec])
        bound.append((source, args[-1]))
        assert "tflgpu_consts" in source and "tflgpu_consts" not in spec.source
    assert bound[1][0] == bound[2][0] and bound[1][1] is not bound[2][1]
    assert bound[0][0] != bound[1][0]

    monkeypatch.setattr(program, "PACK_CONSTANTS", False)
    it, unpacked = _plan(model, fp16, params)
    assert all(program.const_pack(sp) is None for s in unpacked.steps for sp in s.specs)
    np.testing.assert_array_equal(packed, unpacked.run(feeds)[out])


def test_one_packed_buffer_serves_every_launch_that_shares_the_arrays(opencl_device, rng, monkeypatch):
    """An LSTM's launches (one per time step) read the same weights: they bind one packed buffer, as they shared
    one buffer per array before."""
    from tflgpu.kernels import program, recurrent

    monkeypatch.setattr(recurrent, "SEQUENCE_UNITS", 0)  # (the one-launch-per-step form)
    model, feeds = lstm_model("UNIDIRECTIONAL_SEQUENCE_LSTM", rng, steps=6)
    it = Interpreter(model_content=model, delegate=GpuDelegate(cache=False, tuning_db=False))
    plan = it.gpu_plan

    steps = [(i, s) for i, s in enumerate(plan.steps) if s.device == "gpu"
             and sum(program.const_pack(sp) is not None for sp in s.specs) > 1]
    assert steps, "no step with more than one packed launch"
    for i, s in steps:
        per_launch = {id(args[-1]) for sp, args in zip(s.specs, plan.io.args[i]) if program.const_pack(sp)}
        assert len(per_launch) == 1 and len(plan.io.const_buffers[i]) == 1
    assert_close(run_model(Interpreter, model, feeds, delegate=GpuDelegate(cache=False, tuning_db=False))[0],
                 run_model(litert(), model, feeds)[0], 1e-4)


def test_a_constant_the_code_does_not_declare_as_a_global_array_is_not_packed(opencl_device, rng):
    """Weights in __constant memory (the small-filter variant) stay their own argument: with the bias alone left,
    nothing is packed, and the conv runs as generated."""
    from tflgpu.kernels import program

    model, feeds = op_model("CONV_2D", [In(rand(rng, (1, 7, 6, 4))), rand(rng, (8, 3, 3, 4)), rand(rng, (8,))],
                            padding="SAME", stride_w=1, stride_h=1)
    it, plan = _plan(model, False, {0: {"const_weights": True}})
    (spec,) = plan.steps[0].specs
    assert "__constant" in spec.source and program.const_pack(spec) is None
    assert program.compiled_sources([spec]) == [spec.source] and program.kernel_name(spec) == spec.name
    assert_close(plan.run(feeds)[it.model.main.outputs[0]], run_model(litert(), model, feeds)[0], 1e-4)


@pytest.mark.corpus
@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-target", "gpu-target"])
@pytest.mark.parametrize("name", ["mobilenet_v2_1.0_224.tflite", "unet_small_256.tflite", "opzoo_small.tflite",
                                  "fallback_ops.tflite"])
def test_every_kernel_with_two_constant_arrays_is_packed(name, gpu, opencl_device):
    """The packing reads the generated code's signature: every kernel of these models with two or more constant
    arrays (FP32 and FP16, a CPU's defaults and a GPU's with the expansions fused, nothing compiled) is packed,
    but for weights a kernel declares in ``__constant`` memory; so a generator whose signature the packing no
    longer reads fails here, not silently in a GPU's launch cost. One program's functions are each defined once."""
    import re

    from tflgpu.kernels import base, program

    from .conftest import corpus_model, selected_steps

    target = base.Target(float_lanes=1, gpu=True, images=True) if gpu else base.Target(float_lanes=16)
    seen = 0
    for fp16 in (False, True):
        specs = [sp for s in selected_steps(corpus_model(name), target, fp16, gpu or None).steps for sp in s.specs]
        for sp in specs:
            if sum(a.kind in ("const", "const32") for a in sp.args) >= 2 and "__constant " not in sp.source:
                assert program.const_pack(sp) is not None, (sp.name, sp.source[:400])
                seen += 1
        defined = re.findall(r"__kernel\s+(?:__attribute__\(\(.*?\)\)\s*)?void\s+(\w+)\s*\(",
                             "\n".join(program.compiled_sources(specs)))
        assert len(defined) == len(set(defined)) and {program.kernel_name(sp) for sp in specs} <= set(defined)
    assert seen


def test_the_packing_reads_only_a_kernel_function_it_can_delimit():
    """On hand-written sources: a kernel with three constant arrays (one declared ``restrict``, one float32) packs
    them at 64-byte offsets in storage bytes (half in an FP16 kernel) and keeps its other parameters in order; a
    function not qualified ``__kernel`` right before its name (here ``kernel``, after another kernel) is not
    packed, nor is one whose parameters do not match its arguments."""
    from tflgpu.kernels import program
    from tflgpu.kernels.common import Arg, KernelSpec

    src = ("__kernel void other(__global float* y) { y[0] = 1.0f; }\n"
           "__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void k(__global const STORE_T* x, "
           "__global const STORE_T* restrict w, int n, __global const float* u, __global const STORE_T* b, "
           "__global STORE_T* y) { y[0] = x[n] + w[0] + u[0] + b[0]; }\n")
    args = [Arg("tensor", 0), Arg("const", np.ones(40)), Arg("int", 3), Arg("const32", np.ones(3)),
            Arg("const", np.ones(17)), Arg("tensor", 1)]
    for fp16, offsets, size in ((False, (0, 192, 256), 384), (True, (0, 128, 192), 256)):
        spec = KernelSpec("k", src, (1,), (1,), args, fp16=fp16)
        pack = program.const_pack(spec)
        assert pack.args == (1, 3, 4) and pack.offsets == offsets and pack.size == size
        assert ("__attribute__((reqd_work_group_size(1, 1, 1))) void " + pack.name + "(__global const STORE_T* x, "
                "int n, __global STORE_T* y, __global const uchar* tflgpu_consts)") in pack.function
        assert f"__global const float* u = (__global const float*)(tflgpu_consts + {offsets[1]});" in pack.function
        assert program.argument_positions(spec) == [0, None, 1, None, None, 2]  # (the buffer last: 3)
        (compiled,) = program.compiled_sources([spec])
        assert compiled.startswith("__kernel void other(") and "void k(" not in compiled
    plain = src.replace("__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void k", "kernel void k")
    assert program.const_pack(KernelSpec("k", plain, (1,), (1,), args)) is None
    fewer = src.replace("int n, ", "")  # (a parameter list that does not match the arguments)
    assert program.const_pack(KernelSpec("k", fewer, (1,), (1,), args)) is None
