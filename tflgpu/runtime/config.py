"""What a delegated plan is built from: the caller's request (from ``GpuDelegate``) and the plan's identity."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

# an FP16 plan keeps FP32 storage where FP16's would move any output by more than this, relative to the
# output's largest value (runtime.precision)
DEFAULT_FP16_ERROR_BUDGET = 4e-3


@dataclass(frozen=True)
class PlanRequest:
    """The delegate options the runtime acts on (``GpuDelegate.plan_request()`` makes one)."""

    device: int | str | None  # an index or name substring; None: $TFLGPU_DEVICE, else the first GPU
    fp16: bool  # FP16 storage wanted (used where the device has cl_khr_fp16)
    max_partitions: int
    profile: bool
    allow_buffer_handle_output: bool
    quantized_models_allowed: bool
    # a tflgpu.autotune.TuningConfig. Not part of the plan's identity: a stored plan's parameters are a start, checked
    # against the records at every start (and searched where there is none, as the mode says)
    tuning: Any
    records: bool  # tuning records are read (and written)
    store: Any  # a tflgpu.cache.CacheStore, or None: nothing read or written
    model_token: str | None
    cacheable: bool  # the options describe the plan fully, so it may be stored and reused
    tiered: bool = True  # quick build first, optimized build and "background" tuning on a worker thread
    fp16_error_budget: float = DEFAULT_FP16_ERROR_BUDGET
    calibration_inputs: Any = None  # the caller's samples for the FP16 precision choice; None: random ones
    fuse_expansions: bool | None = None  # graph.passes.fuse_expansions (PlanConfig's)
    fp16_for_memory: bool = False  # FP16 storage wanted for its memory, so on a CPU device too (plan.CPU_DEVICE_FP32)
    # every tensor an op writes is one of the plan's outputs, read back by each run (the Interpreter's
    # experimental_preserve_all_tensors); such a plan is not stored
    keep_all_tensors: bool = False


@dataclass(frozen=True)
class PlanConfig:
    """Everything that decides what a built plan is, besides the model, its input shapes and the device.
    A stored plan's key derives from every field, so a field added here is part of the key by itself."""

    fp16: bool = False
    max_partitions: int = 1 << 30
    records: bool = True
    subgraph: int = 0
    quantized_models_allowed: bool = True
    fp16_error_budget: float = DEFAULT_FP16_ERROR_BUDGET  # (an FP16 plan's precision choice)
    calibration: str = ""  # a fingerprint of the caller's calibration inputs; "": the default random ones
    precision_policy: str = ""  # (an FP16 plan's: runtime.precision.policy(), the rules its choice was made by)
    fuse_regions: bool = True  # connected elementwise steps share one kernel (graph.passes.fuse_regions)
    link_concat: bool = True  # producers write straight into a channel concatenation's slices (selection)
    link_split: bool = True  # readers read a channel split's outputs in place in its input (selection)
    link_reshape: bool = True  # a reshape keeping the slice layout is its input's buffer (selection)
    # the one kernel reading a graph input / writing a graph output does the layout conversion (selection)
    dense_boundary: bool = True
    # on a CPU device, a tensor between two steps written and read pixel by pixel where both can (selection)
    hand_over: bool = True
    # a separable conv and the pointwise conv expanding its output as one step (graph.passes.fuse_expansions): True,
    # its kernel fused; None, on a GPU, starting as the two convs' kernels for the tuner to fuse; False, no such step
    fuse_expansions: bool | None = None

    def key(self) -> str:
        return ";".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))

    @classmethod
    def from_key(cls, key: str) -> PlanConfig | None:
        """The config a stored plan's ``key()`` came from; None for a key this version does not read."""
        import ast

        known = {f.name for f in fields(cls)}
        try:
            values = {}
            for part in key.split(";"):
                name, _, text = part.partition("=")
                if name in known:
                    values[name] = ast.literal_eval(text)
            return cls(**values)
        except (ValueError, SyntaxError, TypeError):
            return None

    def summary(self) -> str:
        """In a few words, for listings: precision, and what differs from the defaults."""
        words = ["fp16" if self.fp16 else "fp32"]
        if self.fp16 and self.fp16_error_budget != DEFAULT_FP16_ERROR_BUDGET:
            words.append(f"fp16 error budget {self.fp16_error_budget:g}")
        if self.fp16 and self.calibration:
            words.append("own calibration inputs")
        if self.subgraph:
            words.append(f"subgraph {self.subgraph}")
        if self.max_partitions != PlanConfig.max_partitions:
            words.append(f"max {self.max_partitions} partitions")
        if not self.records:
            words.append("no tuning records")
        if self.fuse_expansions is not None:
            words.append("fused expansions" if self.fuse_expansions else "no expansion blocks")
        if not self.quantized_models_allowed:
            words.append("quantized models not allowed")
        return ", ".join(words)
