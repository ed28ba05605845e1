"""Building the delegated plan from GpuDelegate options, with the CPU as the fallback."""

from __future__ import annotations

import logging

from ..cpu.executor import SubgraphRunner
from ..delegate import GpuDelegate
from .device import NoDeviceError, choose_device

log = logging.getLogger("tflgpu")


def build_plan(runner: SubgraphRunner, options: GpuDelegate, input_shapes=None):
    """A GpuPlan for the subgraph, or None (one warning) when no OpenCL device can be used."""
    try:
        device = choose_device(options.device)
    except NoDeviceError as e:
        if options.device is not None:
            raise ValueError(f"GpuDelegate(device={options.device!r}): {e}") from e
        log.warning("GpuDelegate: %s; the model runs on the CPU kernels", e)
        return None
    fp16 = options.wants_fp16()
    if fp16 and not device.identity.fp16:
        log.warning("GpuDelegate: %s has no cl_khr_fp16; running in FP32", device.identity.device)
        fp16 = False
    from .executor import GpuPlan

    plan = GpuPlan(runner, device, fp16, options.max_delegated_partitions, options.profile,
                   input_shapes=input_shapes, tuning=options.tuning_config())
    plan.device_outputs = options.allow_buffer_handle_output
    return plan
