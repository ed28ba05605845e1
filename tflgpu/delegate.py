"""GpuDelegate: the options of TFLite's GPU delegate, plus tflgpu's own (device choice).

    from tflgpu import Interpreter, GpuDelegate
    interp = Interpreter("model.tflite", delegate=GpuDelegate(precision_loss_allowed=True))
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields

import numpy as np

from .runtime.config import DEFAULT_FP16_ERROR_BUDGET, PlanRequest

# TFLite's TfLiteGpuInferencePriority
AUTO, MAX_PRECISION, MIN_LATENCY, MIN_MEMORY_USAGE = 0, 1, 2, 3
_PRIORITIES = {"AUTO": AUTO, "MAX_PRECISION": MAX_PRECISION, "MIN_LATENCY": MIN_LATENCY,
               "MIN_MEMORY_USAGE": MIN_MEMORY_USAGE}

log = logging.getLogger("tflgpu")


def _priority(v) -> int:
    if isinstance(v, str):
        if v.upper() not in _PRIORITIES:
            raise ValueError(f"unknown inference priority {v!r}; one of {sorted(_PRIORITIES)}")
        return _PRIORITIES[v.upper()]
    if v not in _PRIORITIES.values():
        raise ValueError(f"unknown inference priority {v!r}")
    return int(v)


_FLAG_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _flag(name: str, v, none_allowed: bool = False):
    """An on/off option as a bool: a bool (numpy's too), 0 / 1, or the strings TFLite's ``load_delegate`` options
    carry ("true" / "false", "1" / "0"); None where the option allows it. Anything else is refused rather than
    read by its truth ("false" is a true string)."""
    if v is None and none_allowed:
        return None
    if isinstance(v, str) and v.strip().lower() in _FLAG_WORDS:
        return _FLAG_WORDS[v.strip().lower()]
    if isinstance(v, np.bool_) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise ValueError(f"{name} must be True or False{' or None' if none_allowed else ''}; got {v!r}")


def _is_tuning_db(db) -> bool:
    from .autotune import TuningDB

    return isinstance(db, TuningDB)


def _check_storage_url(url) -> None:
    """``tuning_storage`` as optuna opens it: a database URL (SQLAlchemy's form, e.g. 'sqlite:///tune.db')."""
    if isinstance(url, str):
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            make_url(url)
            return
        except ArgumentError:
            pass
    raise ValueError(f"tuning_storage must be an optuna storage URL, such as 'sqlite:///tuning.db'; got {url!r}")


def fp16_storage(on: bool = True) -> dict:
    """GpuDelegate's options for FP16 storage on every device with cl_khr_fp16, CPU devices included (``on``; else
    FP32): TFLite's MIN_MEMORY_USAGE priority. precision_loss_allowed asks for FP16 for speed, which a CPU device's
    plan does not get from it (runtime.plan.CPU_DEVICE_FP32)."""
    return {"inference_priority1": MIN_MEMORY_USAGE if on else MAX_PRECISION}


@dataclass
class GpuDelegate:
    """Options for running a model on an OpenCL device.

    On/off options take a bool, 0 / 1, or the strings TFLite's ``load_delegate`` options use ("true" / "false",
    "1" / "0"); an option of the wrong kind raises a ValueError naming it here.

    Args:
        precision_loss_allowed: allow FP16 storage (TFLite's flag; accumulation stays FP32), for speed: a CPU
            OpenCL device, where FP16 storage runs slower, stores FP32 (runtime.plan.CPU_DEVICE_FP32).
        inference_priority1..3: TFLite's priorities (AUTO, MAX_PRECISION, MIN_LATENCY,
            MIN_MEMORY_USAGE, as names or numbers); MAX_PRECISION first forces FP32, MIN_MEMORY_USAGE first
            FP16 storage on any device with cl_khr_fp16.
        max_delegated_partitions: at most this many GPU partitions (the largest); the rest run on CPU.
        device: an index into ``tflgpu inspect --devices`` or a name substring; default
            $TFLGPU_DEVICE, else the first GPU, else a CPU OpenCL device.
        profile: enable OpenCL profiling events (``Interpreter.gpu_plan.profile_report()``).
        allow_buffer_handle_output: outputs bound with ``Interpreter.bind_buffer`` stay on the device
            (TFLite's flag): invoke() does not copy them to the host; ``get_tensor`` still can, on demand.
        serialization_dir: TFLite's option: where compiled programs, tuning records and built plans
            are stored (a private directory: created 0700; one owned by another user or writable by
            others is refused). Default: $TFLGPU_CACHE_DIR, else the user cache dir for tflgpu.
        model_token: TFLite's option: the key of this model's plans (letters, digits, '.', '_', '-';
            at most 128). Default: a 64-bit xxhash fingerprint of the model bytes, in hex.
        cache: False turns serialization off (nothing read or written; tuning defaults to "none"); the shipped
            tuning records (package data) still start the kernels, and a search's records last this run.
        max_cache_bytes: bound on the cache directory; least-recently-used entries are evicted.
        tuning: what to do for kernels with no tuning record on this device: "none" (heuristic
            parameters), "background" (no search before the first invoke: once the plan runs, a worker
            searches the slowest kernels while the interpreter is idle, 10 candidates per kernel, 60 s per
            model unless ``tuning_budget_s``, and swaps winners in between invokes; see
            ``Interpreter.tuning_status()``), "fast" (the same small search, before the plan is built: blocking),
            "exhaustive" (every point of each kernel's space, blocking, within ``tuning_budget_s`` if
            given). Default: $TFLGPU_TUNING, else "background" with the cache on and "none" without.
            Records (from ``tflgpu tune`` or earlier runs) are used in every mode.
            A ``tflgpu.autotune.TuningConfig`` sets everything at once (the other tuning_* options
            are then ignored).
        tuning_budget_s: wall-clock budget for searching, per model (0 with "background": no search).
        tuning_trials: candidates a search compiles per kernel (default: 10 in "fast" and "background",
            every point of the space in "exhaustive").
        tiered_compile: a program the cache does not hold is first built without the compiler's
            optimizations (MobileNet v2 on the Intel CPU runtime: 0.8 s instead of 3.2 s), and the
            optimized program is built on a worker thread, stored, and swapped in between invokes.
            Default: True unless $TFLGPU_TIERED_COMPILE is 0. False: the optimized build, blocking.
        tuning_db: where records are read and written: None = the cache (``serialization_dir``), a
            path to a JSON records file, a ``tflgpu.autotune.TuningDB``, or False for no records.
        tuning_storage: an optuna storage URL to share the search with other processes (default: in memory).
        tuning_progress: called as ``tuning_progress(result, done, total)`` after each kernel a blocking search
            ("fast", "exhaustive") decided (``result``: a ``tflgpu.autotune.TuneResult``); not part of the
            plan's identity.
        quantized_models_allowed: TFLite's ENABLE_QUANT flag (on by default, as in recent TFLite): a
            quantized model runs through a float view on the device (weights dequantized once,
            quantized inputs/outputs converted on the host, quantization simulators keeping
            activations on the integer model's grid). False: quantized ops stay on the CPU integer
            kernels.
        fp16_error_budget: with FP16 allowed, ops whose FP16 storage would move any output by more than this
            (relative to the output's largest value) keep FP32 storage; the rest stay FP16. Measured on the CPU
            kernels when the plan is built (and stored with it); ``tflgpu inspect MODEL --precision`` lists
            what stays FP32 and why. Default 4e-3. A large value (1.0) keeps FP16 everywhere FP16 can hold the
            values at all.
        calibration_inputs: the inputs that choice is measured on: a list of samples, each a list of arrays
            in input order (or one array per sample for a one-input model; the model's integers for a
            quantized input). Default: one random sample in each input's range (a quantized input's whole
            integer range, [-1, 1] for a float one).
        fuse_expansions: a depthwise + pointwise block and the pointwise conv expanding its output (the next
            MobileNet v2 block's first conv) as one step, which one kernel can run: one launch per such block
            instead of two, for a GPU whose launches cost more host time than its kernels take. None (default): on
            a GPU each such step starts as the two convs' own kernels (what runs without it) and the tuner fuses
            a block where that measures faster, host time included; on a CPU device, no such steps. True: every
            block starts fused, on any device (the tuner still times it against its two kernels). False: none.
    """

    precision_loss_allowed: bool = False
    inference_priority1: int | str = MAX_PRECISION
    inference_priority2: int | str = AUTO
    inference_priority3: int | str = AUTO
    max_delegated_partitions: int = 1 << 30
    device: int | str | None = None
    profile: bool = False
    allow_buffer_handle_output: bool = False
    serialization_dir: str | os.PathLike | None = None
    model_token: str | None = None
    cache: bool = True
    max_cache_bytes: int = 1 << 30
    tuning: object = None  # "none" | "fast" | "exhaustive" | TuningConfig; None: see above
    tuning_budget_s: float | None = None
    tuning_db: object = None
    tuning_storage: str | None = None
    tuning_progress: object = None  # callable(result, done, total), or None
    quantized_models_allowed: bool = True
    tiered_compile: bool | None = None
    fp16_error_budget: float = DEFAULT_FP16_ERROR_BUDGET
    calibration_inputs: object = None
    fuse_expansions: bool | None = None
    tuning_trials: int | None = None

    def __post_init__(self):
        for name in ("precision_loss_allowed", "profile", "allow_buffer_handle_output", "cache",
                     "quantized_models_allowed"):
            setattr(self, name, _flag(name, getattr(self, name)))
        self.tiered_compile = _flag("tiered_compile", self.tiered_compile, none_allowed=True)
        db = self.tuning_db
        if not (db is None or db is False or isinstance(db, (str, os.PathLike)) or _is_tuning_db(db)):
            raise ValueError(f"tuning_db must be None (the cache), a path to a JSON records file, a "
                             f"tflgpu.autotune.TuningDB, or False (no records); got {db!r}")
        if self.tuning_storage is not None:
            _check_storage_url(self.tuning_storage)
        cal = self.calibration_inputs
        if cal is not None and (isinstance(cal, (str, bytes)) or not hasattr(cal, "__len__")):
            raise ValueError(f"calibration_inputs must be a list of samples, each a list of arrays in input order "
                             f"(or one array for a one-input model); got {type(cal).__name__}")
        self.inference_priority1 = _priority(self.inference_priority1)
        self.inference_priority2 = _priority(self.inference_priority2)
        self.inference_priority3 = _priority(self.inference_priority3)
        if not isinstance(self.max_delegated_partitions, int) or self.max_delegated_partitions < 1:
            raise ValueError("max_delegated_partitions must be a positive int")
        if self.model_token is not None:
            from .cache.plans import check_token

            check_token(self.model_token)
        if not isinstance(self.max_cache_bytes, int) or self.max_cache_bytes < 1:
            raise ValueError("max_cache_bytes must be a positive int")
        trials = self.tuning_trials
        if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 1):
            raise ValueError(f"tuning_trials must be a positive int (candidates per kernel); got {trials!r}")
        if not (self.fuse_expansions is None or isinstance(self.fuse_expansions, bool)):
            raise ValueError(f"fuse_expansions must be None (the tuner decides, on a GPU), True or False; "
                             f"got {self.fuse_expansions!r}")
        self.tuning_config(None)  # validates tuning / tuning_budget_s early
        budget = self.fp16_error_budget
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
            raise ValueError(f"fp16_error_budget must be a positive number (a relative error, e.g. 4e-3); "
                             f"got {budget!r}")

    def cache_store(self):
        """The cache these options use (a ``tflgpu.cache.CacheStore``), or None with cache=False."""
        if not self.cache:
            return None
        from .cache.paths import CacheDirError
        from .cache.store import CacheStore

        named_by = "GpuDelegate(serialization_dir=...)" if self.serialization_dir is not None else None
        try:
            return CacheStore(self.serialization_dir, self.max_cache_bytes, named_by)
        except CacheDirError as e:
            if e.named_by:  # the user chose it: say so, rather than run slower than asked without a word
                raise
            log.warning("GpuDelegate: %s; running without it", e)
            return None

    def tuning_mode(self, store=None) -> str:
        """The tuning mode asked for, else "background" with the cache on; "none" where ``store`` (the cache's
        ``CacheStore``) is read-only: what a search found could not be kept, and each start would search again."""
        from .autotune import TuningConfig

        if isinstance(self.tuning, TuningConfig):
            return self.tuning.mode
        keeps = self.cache and not (store is not None and store.read_only)
        return self.tuning or os.environ.get("TFLGPU_TUNING") or ("background" if keeps else "none")

    def tiered(self) -> bool:
        if self.tiered_compile is not None:
            return bool(self.tiered_compile)
        return os.environ.get("TFLGPU_TIERED_COMPILE", "1").strip().lower() not in ("0", "false", "no", "off")

    def tuning_config(self, store):
        """The autotuner's configuration for these options (records in ``store`` unless tuning_db says)."""
        from .autotune import TuningConfig, TuningDB
        from .autotune.records import CacheTuningDB, FileTuningDB, MemoryTuningDB

        if isinstance(self.tuning, TuningConfig):
            return self.tuning
        db = self.tuning_db
        if db is None:  # (without a cache, this run's records alone, kept in memory: the shipped ones still apply)
            db = CacheTuningDB(store) if store is not None else MemoryTuningDB()
        elif db is False:
            db = None
        elif not isinstance(db, TuningDB):
            db = FileTuningDB(db)
        if self.tuning_progress is not None and not callable(self.tuning_progress):
            raise ValueError("tuning_progress must be callable: tuning_progress(result, done, total)")
        return TuningConfig(mode=self.tuning_mode(store), budget_s=self.tuning_budget_s, trials=self.tuning_trials,
                            db=db, storage=self.tuning_storage, progress=self.tuning_progress)

    def wants_fp16(self) -> bool:
        """TFLite's rule: the legacy flag wins; else the first non-AUTO priority decides
        (MAX_PRECISION -> FP32; MIN_LATENCY / MIN_MEMORY_USAGE -> FP16); all AUTO -> FP16."""
        return self._deciding_priority() != MAX_PRECISION

    def fp16_for_memory(self) -> bool:
        """FP16 storage is wanted for the memory it saves (MIN_MEMORY_USAGE decides), not for speed: a CPU
        device stores FP16 then too."""
        return self._deciding_priority() == MIN_MEMORY_USAGE

    def _deciding_priority(self) -> int:
        """The priority TFLite's rule goes by: the legacy flag as MIN_LATENCY (as TFLite maps it), else the first
        non-AUTO priority, else AUTO."""
        if self.precision_loss_allowed:
            return MIN_LATENCY
        return next((p for p in (self.inference_priority1, self.inference_priority2, self.inference_priority3)
                     if p != AUTO), AUTO)

    def plan_request(self) -> PlanRequest:
        """These options as the runtime takes them."""
        store = self.cache_store()
        # a plan is stored only where its options describe it fully: records from the cache itself (or
        # none), not from a caller's own TuningDB / TuningConfig, which a later run could not match
        cacheable = self.tuning_db in (None, False) and isinstance(self.tuning, (str, type(None)))
        return PlanRequest(self.device, self.wants_fp16(), self.max_delegated_partitions, self.profile,
                           self.allow_buffer_handle_output, self.quantized_models_allowed, self.tuning_config(store),
                           self.tuning_db is not False, store, self.model_token, cacheable, self.tiered(),
                           float(self.fp16_error_budget), self.calibration_inputs, self.fuse_expansions,
                           self.fp16_for_memory())


# TFLite's names for GpuDelegate's options where they differ: its GPU delegate's C options
# (TfLiteGpuDelegateOptionsV2), its delegate providers' flags (benchmark_model's) and LiteRT's GPU settings
TFLITE_OPTION_NAMES = {
    "is_precision_loss_allowed": "precision_loss_allowed",
    "gpu_precision_loss_allowed": "precision_loss_allowed",
    "enable_quantized_inference": "quantized_models_allowed",
    "gpu_experimental_enable_quant": "quantized_models_allowed",
    "delegate_serialize_dir": "serialization_dir",
    "cache_directory": "serialization_dir",
    "delegate_serialize_token": "model_token",
}
# what a GPU delegate's library name holds: TFLite's (libtensorflowlite_gpu_delegate.so, ..._gpu_gl.so) or ours
GPU_DELEGATE_LIBRARIES = ("tensorflowlite_gpu", "tflgpu")


def load_delegate(library: str | os.PathLike, options: dict | None = None) -> GpuDelegate:
    """LiteRT's ``load_delegate``, for code written for it: a ``library`` naming TFLite's GPU delegate
    (``libtensorflowlite_gpu_delegate.so``) gives the ``GpuDelegate`` of ``options``, under TFLite's option names
    (``TFLITE_OPTION_NAMES``) or GpuDelegate's, with TFLite's string values ("1", "true", "2") or Python ones.
    Any other delegate (the Edge TPU's, Hexagon's...) is a ValueError: tflgpu runs models through its own only."""
    name = os.path.basename(os.fspath(library)).lower()
    if not any(n in name for n in GPU_DELEGATE_LIBRARIES):
        raise ValueError(f"Failed to load delegate from {library}: tflgpu runs models through its own OpenCL "
                         "delegate only: pass tflgpu.GpuDelegate(...), or no delegate for its CPU kernels")
    types = {f.name: str(f.type) for f in fields(GpuDelegate)}
    kwargs = {}
    for key, value in (options or {}).items():
        field = TFLITE_OPTION_NAMES.get(key, key)
        if field not in types:
            raise ValueError(f"load_delegate({library!r}): unknown GPU delegate option {key!r}; tflgpu takes "
                             f"GpuDelegate's options ({', '.join(types)}) and TFLite's "
                             f"{', '.join(TFLITE_OPTION_NAMES)}")
        if isinstance(value, str) and ("int" in types[field] or "float" in types[field]):
            for number in (int, float):  # (a number as TFLite passes every option: a string)
                try:
                    value = number(value)
                    break
                except ValueError:
                    continue
        kwargs[field] = value
    return GpuDelegate(**kwargs)
