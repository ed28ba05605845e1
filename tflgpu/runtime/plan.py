"""Building the delegated plan from GpuDelegate options, with the CPU as the fallback."""

from __future__ import annotations

import logging

from ..cache.plans import PlanCache
from ..cpu.executor import SubgraphRunner
from .config import PlanConfig, PlanRequest
from .device import NoDeviceError, choose_device

log = logging.getLogger("tflgpu")


def build_plan(runner: SubgraphRunner, options: PlanRequest, input_shapes=None, token: str | None = None):
    """A GpuPlan for the subgraph, or None (one warning) when no OpenCL device can be used.

    With the cache on, a plan stored for (model token, options, input shapes, device) is loaded
    instead of built, and a newly built one is stored; ``token`` (the model's fingerprint) is used when
    the delegate has no model_token.
    """
    try:
        device = choose_device(options.device)
    except NoDeviceError as e:
        if options.device is not None:
            raise ValueError(f"GpuDelegate(device={options.device!r}): {e}") from e
        log.warning("GpuDelegate: %s; the model runs on the CPU kernels", e)
        return None
    fp16 = options.fp16
    if fp16 and not device.identity.fp16:
        log.warning("GpuDelegate: %s has no cl_khr_fp16; running in FP32", device.identity.device)
        fp16 = False
    from .executor import GpuPlan

    unrolled = 0
    if not any(t.is_variable for t in runner.sg.tensors):  # (a separate runner must not own state)
        from ..graph.unroll import unroll_static_loops

        sg, unrolled = unroll_static_loops(runner.sg, runner.runtime, runner.consts)
        if unrolled:
            runner = SubgraphRunner(runner.runtime, sg)
            runner.build()
    view = None
    if options.quantized_models_allowed:
        runner, view = _float_view(runner)
    config = PlanConfig(fp16, options.max_partitions, options.tuning.mode, options.records, runner.sg.index,
                        options.quantized_models_allowed)
    token = options.model_token or token
    cacheable = options.store is not None and options.cacheable and token
    cache = PlanCache(options.store, token, config.key()) if cacheable else None
    return GpuPlan(runner, device, config, profile=options.profile, input_shapes=input_shapes, tuning=options.tuning,
                   cache=cache, quant_io=view.io if view is not None else None,
                   device_outputs=options.allow_buffer_handle_output, earlier_passes={"unroll_while": unrolled})


def _float_view(runner: SubgraphRunner):
    """(a runner over the float view, the view) of a quantized subgraph; (``runner``, None) for a float one,
    or (one warning) when the view cannot be built: its quantized ops then keep their integer kernels."""
    from ..graph.float_view import float_view, needs_float_view

    if not needs_float_view(runner.sg):
        return runner, None
    try:
        view = float_view(runner.sg)
        view_runner = SubgraphRunner(runner.runtime, view.sg)
        view_runner.build()
    except ValueError as e:  # a quantized model whose float view has no kernel somewhere
        log.warning("GpuDelegate: no float view of this quantized model (%s); its quantized ops run "
                    "on the CPU integer kernels", e)
        return runner, None
    log.info("float view of a quantized model: %d quantization simulators%s", view.simulators,
             f"; on integer kernels: {', '.join(view.kept_integer)}" if view.kept_integer else "")
    return view_runner, view
