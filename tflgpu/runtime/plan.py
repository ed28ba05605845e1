"""Building the delegated plan from GpuDelegate options, with the CPU as the fallback."""

from __future__ import annotations

import logging
import os
from dataclasses import replace

import numpy as np
import xxhash

from ..cache.plans import PlanCache
from ..cpu.executor import SubgraphRunner
from . import EmptyTensorError, ShapeError
from .config import PlanConfig, PlanRequest
from .device import DeviceInfo, NoDeviceError, check_process, choose_device
from .selection import transform_graph
from .startup import StartupClock

log = logging.getLogger("tflgpu")

# a CPU OpenCL device stores FP32 where FP16 storage was allowed for speed (precision_loss_allowed, MIN_LATENCY):
# each half load and store is a conversion there. Intel's CPU runtime (2 Xeon cores, Sapphire Rapids), tuning none,
# 6 shuffled rounds, FP32 time over FP16: BlazeFace 0.91, face landmark 0.95, palm detection lite 0.91, selfie
# segmentation 0.90, pose detection 0.88, MobileNet v1 0.85, v2 0.92, DeepLab 0.85, the U-Net 0.76, Basic Pitch 0.67
CPU_DEVICE_FP32 = True


def _arrays(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _arrays(y)
    else:
        yield np.ascontiguousarray(x)


def _precision_key(options: PlanRequest) -> dict:
    """An FP16 plan's PlanConfig fields of its precision choice: the error budget, the rules that choose
    (``precision.policy``), and a fingerprint of the caller's calibration inputs (left "" for the default ones)."""
    from .precision import policy

    key = {"fp16_error_budget": options.fp16_error_budget, "precision_policy": policy()}
    if options.calibration_inputs is None:
        return key
    h = xxhash.xxh64()
    for a in _arrays(options.calibration_inputs):
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return {**key, "calibration": h.hexdigest()}


def plan_device(options: PlanRequest) -> DeviceInfo | None:
    """The OpenCL device a plan of these options runs on, or None (one warning) when none can be used: the
    CPU kernels run the model. A device the user named (``device=``, ``$TFLGPU_DEVICE``) that is not there
    raises ValueError instead."""
    try:
        return choose_device(options.device)
    except NoDeviceError as e:
        if options.device is not None:
            raise ValueError(f"GpuDelegate(device={options.device!r}): {e}") from e
        named = os.environ.get("TFLGPU_DEVICE")
        if named:  # the user named a device, through the environment: as an error as through the option
            raise ValueError(f"TFLGPU_DEVICE={named!r}: {e} (unset it, or name another device)") from e
        log.warning("GpuDelegate: %s; the model runs on the CPU kernels", e)
        return None


def every_tensor_an_output(runner: SubgraphRunner) -> SubgraphRunner:
    """``runner`` over its graph with every tensor an op writes made an output too (after the graph's own, in
    the order the ops write them), so that no pass folds it away and each run reads it back."""
    sg = runner.sg
    outputs = list(dict.fromkeys([*sg.outputs, *(t for op in sg.operators for t in op.outputs if t >= 0)]))
    return runner.derived(replace(sg, outputs=tuple(outputs)), runner.steps)


def build_plan(runner: SubgraphRunner, options: PlanRequest, device: DeviceInfo, input_shapes=None,
               token: str | None = None, model_name: str = "", context=None):
    """A GpuPlan for the subgraph on ``device`` (``plan_device``'s), in ``context`` (its ``SharedContext``: an
    earlier plan's, where the caller bound buffers in it or enqueues on its queue; None: a new one).

    With the cache on, a plan stored for (model token, options, input shapes, device) is loaded
    instead of built, and a newly built one is stored; ``token`` (the model's fingerprint) is used when
    the delegate has no model_token. ``model_name`` (the model file's name) is stored with the plan, for
    ``tflgpu cache ls``.
    """
    check_process()
    clock = StartupClock()
    fp16 = options.fp16
    if fp16 and not device.identity.fp16:
        log.warning("GpuDelegate: %s has no cl_khr_fp16; running in FP32", device.identity.device)
        fp16 = False
    elif fp16 and CPU_DEVICE_FP32 and device.identity.device_type == "CPU" and not options.fp16_for_memory:
        log.info("GpuDelegate: %s is a CPU device, where FP16 storage runs slower than FP32: storing FP32 "
                 "(inference_priority1='MIN_MEMORY_USAGE' stores FP16)", device.identity.device)
        fp16 = False
    from .background import release_when_idle
    from .executor import GpuPlan

    token = options.model_token or token
    cacheable = options.store is not None and options.cacheable and token and not options.keep_all_tensors
    if options.keep_all_tensors:
        runner = every_tensor_an_output(runner)

    def plan(quantized_models_allowed: bool):
        clock.phase("graph transforms", "unrolling counted loops, the float view of a quantized model")
        graph = transform_graph(runner, quantized_models_allowed)
        config = PlanConfig(fp16, options.max_partitions, options.records, graph.runner.sg.index,
                            quantized_models_allowed, **(_precision_key(options) if fp16 else {}),
                            fuse_expansions=options.fuse_expansions)
        cache = PlanCache(options.store, token, config.key(), model_name) if cacheable else None
        try:
            return GpuPlan(graph.runner, device, config, profile=options.profile, input_shapes=input_shapes,
                           tuning=options.tuning, cache=cache, quant_io=graph.quant_io,
                           device_outputs=options.allow_buffer_handle_output, earlier_passes=graph.counts,
                           tiered=options.tiered, clock=clock, calibration=options.calibration_inputs,
                           context=context)
        except ShapeError as e:
            if graph.quant_io is None or isinstance(e, EmptyTensorError):  # (the integer kernels' graph too)
                raise
            # (float tensors are 4x the int8 ones: a view can pass the per-tensor limit where the model does not)
            log.warning("GpuDelegate: the float view of this quantized model cannot run on these inputs (%s); its "
                        "quantized ops run on the CPU integer kernels", e)
            return plan(False)

    built = plan(options.quantized_models_allowed)
    if built.background is None:  # (else its worker does, when done: it may compile)
        release_when_idle()
    return built
