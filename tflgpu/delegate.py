"""GpuDelegate: the options of TFLite's GPU delegate, plus tflgpu's own (device choice).

    from tflgpu import Interpreter, GpuDelegate
    interp = Interpreter("model.tflite", delegate=GpuDelegate(precision_loss_allowed=True))
"""

from __future__ import annotations

from dataclasses import dataclass

# TFLite's TfLiteGpuInferencePriority
AUTO, MAX_PRECISION, MIN_LATENCY, MIN_MEMORY_USAGE = 0, 1, 2, 3
_PRIORITIES = {"AUTO": AUTO, "MAX_PRECISION": MAX_PRECISION, "MIN_LATENCY": MIN_LATENCY,
               "MIN_MEMORY_USAGE": MIN_MEMORY_USAGE}


def _priority(v) -> int:
    if isinstance(v, str):
        if v.upper() not in _PRIORITIES:
            raise ValueError(f"unknown inference priority {v!r}; one of {sorted(_PRIORITIES)}")
        return _PRIORITIES[v.upper()]
    if v not in _PRIORITIES.values():
        raise ValueError(f"unknown inference priority {v!r}")
    return int(v)


@dataclass
class GpuDelegate:
    """Options for running a model on an OpenCL device.

    Args:
        precision_loss_allowed: allow FP16 storage (TFLite's flag; accumulation stays FP32).
        inference_priority1..3: TFLite's priorities (AUTO, MAX_PRECISION, MIN_LATENCY,
            MIN_MEMORY_USAGE, as names or numbers); MAX_PRECISION first forces FP32.
        max_delegated_partitions: at most this many GPU partitions (the largest); the rest run on CPU.
        device: an index into ``tflgpu inspect --devices`` or a name substring; default
            $TFLGPU_DEVICE, else the first GPU, else a CPU OpenCL device.
        profile: enable OpenCL profiling events (``Interpreter.gpu_plan.profile_report()``).
        allow_buffer_handle_output: outputs bound with ``Interpreter.bind_buffer`` stay on the device
            (TFLite's flag): invoke() does not copy them to the host; ``get_tensor`` still can, on demand.
        tuning: what to do for kernels with no tuning record on this device: "none" (heuristic
            parameters), "fast" (a small search: 10 candidates per kernel, 30 s per model unless
            ``tuning_budget_s``), "exhaustive" (every point of each kernel's space, within
            ``tuning_budget_s`` if given). Records (from ``tflgpu tune`` or earlier runs) are used in
            every mode. A ``tflgpu.autotune.TuningConfig`` sets everything at once (the other
            tuning_* options are then ignored).
        tuning_budget_s: wall-clock budget for searching, per model.
        tuning_db: where records are read and written: None = the file in the cache directory
            ($TFLGPU_CACHE_DIR or the user cache dir), a path to such a file, a
            ``tflgpu.autotune.TuningDB``, or False for no records at all.
        tuning_storage: an optuna storage URL to share the search with other processes (default: in memory).
    """

    precision_loss_allowed: bool = False
    inference_priority1: int | str = MAX_PRECISION
    inference_priority2: int | str = AUTO
    inference_priority3: int | str = AUTO
    max_delegated_partitions: int = 1 << 30
    device: int | str | None = None
    profile: bool = False
    allow_buffer_handle_output: bool = False
    tuning: str = "none"
    tuning_budget_s: float | None = None
    tuning_db: object = None
    tuning_storage: str | None = None

    def __post_init__(self):
        self.inference_priority1 = _priority(self.inference_priority1)
        self.inference_priority2 = _priority(self.inference_priority2)
        self.inference_priority3 = _priority(self.inference_priority3)
        if not isinstance(self.max_delegated_partitions, int) or self.max_delegated_partitions < 1:
            raise ValueError("max_delegated_partitions must be a positive int")
        self.tuning_config()  # validates tuning / tuning_budget_s early

    def tuning_config(self):
        """The autotuner's configuration for these options."""
        from .autotune import TuningConfig, TuningDB, default_tuning_db
        from .autotune.records import FileTuningDB

        if isinstance(self.tuning, TuningConfig):
            return self.tuning
        db = self.tuning_db
        if db is None:
            db = default_tuning_db()
        elif db is False:
            db = None
        elif not isinstance(db, TuningDB):
            db = FileTuningDB(db)
        return TuningConfig(mode=self.tuning, budget_s=self.tuning_budget_s, db=db, storage=self.tuning_storage)

    def wants_fp16(self) -> bool:
        """TFLite's rule: the legacy flag wins; else the first non-AUTO priority decides
        (MAX_PRECISION -> FP32; MIN_LATENCY / MIN_MEMORY_USAGE -> FP16); all AUTO -> FP16."""
        if self.precision_loss_allowed:
            return True
        for p in (self.inference_priority1, self.inference_priority2, self.inference_priority3):
            if p == MAX_PRECISION:
                return False
            if p in (MIN_LATENCY, MIN_MEMORY_USAGE):
                return True
        return True
