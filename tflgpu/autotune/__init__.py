"""Autotuning: measure candidate kernels on the device and keep the fastest per device and kernel.

- ``measure``: time a step's kernels with OpenCL profiling events on real buffers, check outputs.
- ``tuner``: grid or optuna TPE search per kernel identity, budgets, shared optuna storage.
- ``records``: the tuning database (in memory, or a JSON file in the cache directory).
"""

from ..cache.records import TuningRecord
from .records import FileTuningDB, MemoryTuningDB, TuningDB, default_tuning_db
from .tuner import MODES, TuneResult, TuneTask, TuningConfig, kernel_key, tune_tasks

__all__ = ["MODES", "FileTuningDB", "MemoryTuningDB", "TuneResult", "TuneTask", "TuningConfig", "TuningDB",
           "TuningRecord", "default_tuning_db", "kernel_key", "tune_tasks"]
