"""What a delegated plan is built from: the caller's request (from ``GpuDelegate``) and the plan's identity."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class PlanRequest:
    """The delegate options the runtime acts on (``GpuDelegate.plan_request()`` makes one)."""

    device: int | str | None  # an index or name substring; None: $TFLGPU_DEVICE, else the first GPU
    fp16: bool  # FP16 storage wanted (used where the device has cl_khr_fp16)
    max_partitions: int
    profile: bool
    allow_buffer_handle_output: bool
    quantized_models_allowed: bool
    tuning: Any  # a tflgpu.autotune.TuningConfig (its mode is part of the plan's identity)
    records: bool  # tuning records are read (and written)
    store: Any  # a tflgpu.cache.CacheStore, or None: nothing read or written
    model_token: str | None
    cacheable: bool  # the options describe the plan fully, so it may be stored and reused
    tiered: bool = True  # quick build first, optimized build and "background" tuning on a worker thread


@dataclass(frozen=True)
class PlanConfig:
    """Everything that decides what a built plan is, besides the model, its input shapes and the device.
    A stored plan's key derives from every field, so a field added here is part of the key by itself."""

    fp16: bool = False
    max_partitions: int = 1 << 30
    tuning: str = "none"
    records: bool = True
    subgraph: int = 0
    quantized_models_allowed: bool = True

    def key(self) -> str:
        return ";".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
