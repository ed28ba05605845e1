"""A drop-in for ``ai_edge_litert.interpreter.Interpreter``.

Same constructor forms, methods, detail dicts, dtypes and error types, so
code written for LiteRT runs by changing the import::

    from tflgpu import Interpreter
    interp = Interpreter(model_path="model.tflite")
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    y = interp.get_tensor(interp.get_output_details()[0]["index"])
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import operator
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .cpu.executor import ModelRunner, SubgraphRunner
from .cpu.registry import PrepareError
from .cpu.threads import cpu_threads
from .delegate import GpuDelegate, load_delegate  # noqa: F401 (LiteRT's interpreter module has load_delegate)
from .model import ModelBytes, read_model
from .model.ir import Model, Subgraph, Tensor
from .ops.jit import check_fork
from .runtime import DeviceError, EmptyTensorError, ShapeError
from .runtime.startup import StartupClock, format_phases

log = logging.getLogger("tflgpu")
_EMPTY_SCALES = np.zeros(0, np.float32)
_EMPTY_ZPS = np.zeros(0, np.int32)


def tensor_details(t: Tensor, shape: tuple[int, ...] | None = None, compress_zero_points: bool = False
                   ) -> dict[str, Any]:
    """The detail dict LiteRT returns for one tensor; ``compress_zero_points``: per-channel zero points that are
    all equal are given as one (LiteRT's ``experimental_compress_quantization_zero_points``)."""
    q = t.quantization
    shape = t.shape if shape is None else shape
    zero_points = q.zero_points.astype(np.int32) if q else _EMPTY_ZPS.copy()
    if compress_zero_points and len(zero_points) > 1 and (zero_points == zero_points[0]).all():
        zero_points = zero_points[:1].copy()
    return {
        "name": t.name,
        "index": t.index,
        "shape": np.array(shape, dtype=np.int32),
        # the model's, even after a resize; where the model stores none, the current shape (as LiteRT's)
        "shape_signature": np.array(t.shape_signature if t.signature_stored else shape, dtype=np.int32),
        "dtype": t.dtype.type if t.type_name != "STRING" else np.bytes_,
        "quantization": q.per_tensor if q else (0.0, 0),
        "quantization_parameters": {
            "scales": q.scales.astype(np.float32) if q else _EMPTY_SCALES.copy(),
            "zero_points": zero_points,
            "quantized_dimension": q.quantized_dimension if q else 0,
            "block_size": q.block_size if q else 0,
        },
        "sparsity_parameters": dict(t.sparsity) if t.sparsity else {},
    }


class _Session:
    """Input buffers, allocation state and last values for one subgraph."""

    def __init__(self, runtime: ModelRunner, subgraph: int, preserve: bool = False):
        self.runtime = runtime
        self.preserve = preserve  # every op runs as the model has it (none merged into its reader)
        self.sg = runtime.model.subgraphs[subgraph]
        self.input_shapes: dict[int, tuple[int, ...]] = {i: self.sg.tensors[i].shape for i in self.sg.inputs}
        self.shapes: dict[int, tuple[int, ...]] = {}
        self.buffers: dict[int, np.ndarray] = {}
        self.values: list | None = None
        self.invoked = False  # values holds an invoke's results (not only the inputs and constants)
        self.readable = False  # an allocation succeeded once: tensors read (the last one's values, after a resize)
        self.allocated = False
        self.gpu_plan = None  # the delegated plan for the current input shapes (subgraph 0, with a GpuDelegate)
        self.gpu_factory = None  # input shapes -> plan
        self.refused_shapes = None  # input shapes plan() found no plan for (allocate_tensors() says why)
        self.empty_shapes = None  # input shapes whose graph holds a tensor with no elements: the CPU kernels run them
        self.gpu_failed = False  # the device raised during invoke: rebuild before the next one
        self.bindings: dict[int, object] = {}  # tensor -> user's device buffer (zero-copy I/O)
        self.merged_runner: SubgraphRunner | None = None  # what a CPU invoke runs: runner.merged(), made once
        self.empty = False  # the current shapes have a tensor with no elements (an empty batch)
        self.empty_runner: SubgraphRunner | None = None  # merged_runner.empty_aware() (any shapes), made once

    def input_shape_list(self) -> list[tuple[int, ...]]:
        """The inputs' current shapes, in the subgraph's input order (what a plan is built for)."""
        return [self.input_shapes[i] for i in self.sg.inputs]

    @property
    def runner(self) -> SubgraphRunner:
        """The subgraph's prepared CPU runner (a model that failed to prepare raises its PrepareError here)."""
        return self.runtime.runner(self.sg.index)

    def plan(self):
        """The delegated plan, built now for the current input shapes where none was built yet (as
        allocate_tensors() builds it); None without one: no GpuDelegate or device, or input shapes that do not
        run, which allocate_tensors() then reports. In a child forked after OpenCL was opened, a
        ForkedProcessError: nothing of the plan (its context, queue, buffers) is usable there."""
        if self.gpu_factory is not None:
            from .runtime.device import check_process  # (loaded with the delegate's device)

            check_process()
        if self.gpu_plan is None and self.gpu_factory is not None:
            shapes = self.input_shape_list()
            if shapes != self.refused_shapes and shapes != self.empty_shapes:
                try:
                    self.build_plan(shapes)
                except ShapeError as e:
                    # (a dynamic input stored as [1, 1], made to be resized first: LiteRT's delegates refuse
                    # such shapes at allocate_tensors(), not before)
                    log.info("GpuDelegate: no plan for the input shapes %s: %s", shapes, e)
                    self.refused_shapes = shapes
        return self.gpu_plan

    def cpu_fallback_reason(self) -> str | None:
        if self.empty_shapes is not None and self.empty_shapes == self.input_shape_list():
            return "an empty batch, which the OpenCL device leaves to the CPU kernels"
        return None

    def drop_plan(self) -> None:
        if self.gpu_plan is not None:
            self.gpu_plan.close()  # (its background work ends)
        self.gpu_plan, self.gpu_failed = None, False

    def build_plan(self, shapes: list) -> None:
        """A new plan for ``shapes``, with the caller's bound buffers (in the context every plan of this
        interpreter shares). One too small for its tensor's new shape is unbound, and a ValueError says so."""
        self.drop_plan()  # (the old plan's buffers first)
        self.gpu_plan = self.gpu_factory(shapes)
        refused = []
        for t, buf in list(self.bindings.items()):
            try:
                self.gpu_plan.bind(t, buf)
            except ValueError as e:
                del self.bindings[t]  # (the tensor goes through host memory, as if never bound)
                refused.append(f"tensor {t} ({e})")
        if refused:
            raise ValueError(f"a buffer bound with bind_buffer() no longer fits after the resize, and is unbound: "
                             f"{'; '.join(refused)}; bind_buffer() a buffer of the new size, then allocate_tensors()")

    def shape_of(self, idx: int) -> tuple[int, ...]:
        if idx in self.input_shapes:
            return self.input_shapes[idx]
        if self.invoked and self.values is not None and -1 in self.sg.tensors[idx].shape_signature:
            made = self.values[idx]  # (a size the last invoke's data set, a WHERE's: LiteRT reports it)
            if made is not None:
                return tuple(np.shape(made))
        return self.shapes.get(idx, self.sg.tensors[idx].shape)

    def resize(self, idx: int, size, strict: bool) -> None:
        n = len(self.sg.tensors)
        if not 0 <= idx < n:
            raise RuntimeError(f"tensor_index < context_.tensors_size && tensor_index >= 0 was not true: "
                               f"tensor {idx} is not one of subgraph {self.sg.index}'s {n} tensors")
        new = _shape_argument(size)
        if idx not in self.input_shapes:
            t = self.sg.tensors[idx]
            if t.is_constant or t.is_variable:
                what = "a constant" if t.is_constant else "a variable"
                raise RuntimeError(f"Attempting to resize a fixed-size tensor. (tensor {idx} is {what} of the "
                                   f"model; resize_tensor_input() takes the model's inputs)")
            # (another op's output: as in LiteRT, accepted and without effect, its shape follows from the inputs'
            # at allocate_tensors())
            return
        if any(d < 0 for d in new):
            raise ValueError(f"Cannot resize tensor {idx} to {list(new)}: negative dimension")
        t = self.sg.tensors[idx]
        if strict:
            sig = t.shape_signature
            if len(new) != len(sig):
                raise RuntimeError(
                    f"ResizeInputTensorStrict only allows mutating unknown dimensions identified by -1; "
                    f"rank {len(sig)} cannot become {len(new)}."
                )
            for d, (old, want) in enumerate(zip(sig, new)):
                if old != -1 and old != want:
                    raise RuntimeError(
                        f"Attempting to resize dimension {d} of tensor {idx} with value {old} to {want}. "
                        f"ResizeInputTensorStrict only allows mutating unknown dimensions identified by -1."
                    )
        # (LiteRT's short cut for the same shape needs the tensor's memory: one with no elements has none, so
        # even that resize asks for allocate_tensors() again)
        if new != self.input_shapes[idx] or 0 in new:
            self.input_shapes[idx] = new
            self.allocated = False

    def allocate(self) -> None:
        prepared = not self.allocated  # (first, or after a resize that changed a shape: LiteRT prepares the graph)
        for i in self.sg.inputs:
            t = self.sg.tensors[i]
            shape = self.input_shapes[i]
            buf = self.buffers.get(i)
            if buf is None or buf.shape != shape:
                self.buffers[i] = np.zeros(shape, dtype=t.dtype)
        resized = any(self.input_shapes[i] != self.sg.tensors[i].shape for i in self.sg.inputs)
        shapes = self.input_shape_list()
        if self.gpu_factory is not None and shapes == self.empty_shapes:
            self.drop_plan()  # (another batch's)
        elif self.gpu_factory is not None:
            if self.gpu_plan is None or self.gpu_plan.input_shapes != shapes or self.gpu_failed:
                try:
                    self.build_plan(shapes)
                except EmptyTensorError as e:  # (an empty batch: the CPU kernels run it)
                    self.empty_shapes = shapes
                    log.info("GpuDelegate: %s; the CPU kernels run these shapes", e)
            if self.gpu_plan is not None:
                self.gpu_plan.activity.use()  # (its background work may start: the optimized build, a search)
            arrays = self.gpu_plan.input_arrays() if self.gpu_plan is not None else {}
            for t, host in arrays.items():  # (set_tensor writes where the uploads read)
                if self.buffers.get(t) is not host and host.shape == self.buffers[t].shape:
                    host[...] = self.buffers[t]
                    self.buffers[t] = host
        if resized and self.gpu_plan is not None:  # the plan already propagated these shapes
            self.shapes = {t.index: t.shape for t in self.gpu_plan.sg.tensors}
        elif resized:
            # (the new shapes, on zeros: ops.shapes' rules where they know them, else a run of every kernel)
            known = self.runner.propagated_shapes([self.buffers[i].copy() for i in self.sg.inputs])
            self.shapes = {i: s for i, s in enumerate(known) if s is not None}
        else:
            self.shapes = {}
        # (tensors with no elements: their ops make them without their kernels, SubgraphRunner.empty_aware)
        self.empty = any(t.empty_values(self.shape_of(t.index)) for t in self.sg.tensors)
        self.values = None
        self.invoked = False
        self.allocated = self.readable = True
        if prepared:  # (a random op's generator starts over, whatever the plan's build ran of it)
            self.runtime.preparations += 1

    def set(self, idx: int, value) -> None:
        if not self.allocated:
            raise ValueError("Cannot set tensor: Tensor is unallocated. Try calling allocate_tensors() first")
        t = self.sg.tensors[idx]
        if t.is_constant:
            raise ValueError(f"Cannot set tensor: tensor {idx} ({t.name}) is a constant of the model; its values are "
                             f"the model's weights and cannot be set (set the inputs: get_input_details())")
        value = np.asarray(value) if not isinstance(value, np.ndarray) else value
        string = t.type_name == "STRING"
        if not takes_value_type(t.dtype, value.dtype, string):
            raise ValueError(
                f"Cannot set tensor: Got value of type {_type_name(value.dtype)} but expected type "
                f"{t.type_name} for input {idx}, name: {t.name} "
            )
        if value.dtype != t.dtype and not string:  # (the other byte order: its values, converted)
            value = value.astype(t.dtype)
        want = self.shape_of(idx)
        if value.ndim != len(want):
            raise ValueError(
                f"Cannot set tensor: Dimension mismatch. Got {value.ndim} but expected {len(want)} for input {idx}."
            )
        for d, (got, exp) in enumerate(zip(value.shape, want)):
            if got != exp:
                raise ValueError(
                    f"Cannot set tensor: Dimension mismatch. Got {got} but expected {exp} "
                    f"for dimension {d} of input {idx}."
                )
        if idx in self.buffers:
            np.copyto(self.buffers[idx], value)
        elif idx in self.runner.variables:
            if self.gpu_plan is not None:
                self.gpu_plan.state_written()  # (the device may hold the state's latest value)
            np.copyto(self.runner.variables[idx], value)
        else:
            if self.values is None:
                self.values = self._initial_values()
            self.values[idx] = np.array(value, copy=True)

    def threads(self, num_threads: int | None):
        """The invoke's CPU thread settings (cpu.threads), or nothing to set where every op runs on the device."""
        if self.gpu_plan is not None and not self.gpu_plan.cpu_op_count and not self.gpu_failed:
            return contextlib.nullcontext()
        return cpu_threads(num_threads)

    def invoke(self) -> None:
        if not self.allocated:
            raise RuntimeError("Invoke called on model that is not ready.")
        inputs = [self.buffers[i] for i in self.sg.inputs]
        if self.gpu_failed:
            raise RuntimeError("the OpenCL device failed in an earlier invoke(); call allocate_tensors() to rebuild "
                               "the device plan (or create a new Interpreter)")
        if self.gpu_plan is not None:
            n = len(self.sg.tensors)
            values: list = [None] * n
            try:
                out = self.gpu_plan.run(inputs)
            except DeviceError as e:  # out of resources, a lost device...: this plan is not trusted again
                self.gpu_failed = True
                raise DeviceError(f"{e}; call allocate_tensors() to rebuild the device plan") from e
            for i, v in out.items():
                if i < n:  # (a plan's own tensors, e.g. of an unrolled loop, are not the model's)
                    values[i] = v
            self.values = values
        else:
            if self.merged_runner is None:
                self.merged_runner = self.runner if self.preserve else self.runner.merged()
            runner = self.merged_runner
            if self.empty:
                if self.empty_runner is None:
                    self.empty_runner = runner.empty_aware()
                runner = self.empty_runner
            self.values = runner.run(inputs)
        self.invoked = True

    def _initial_values(self) -> list:
        vals: list = [None] * len(self.sg.tensors)
        for i, v in self.runner.consts.items():
            vals[i] = v
        for i, v in self.runner.variables.items():
            vals[i] = v
        for i, v in self.buffers.items():
            vals[i] = v
        return vals

    def value(self, idx: int, writable: bool = True) -> np.ndarray:
        """Tensor idx's current array; ``writable``: the caller may write into it (``Interpreter.tensor``)."""
        n = len(self.sg.tensors)
        if not 0 <= idx < n:
            raise ValueError(f"Invalid tensor index {idx} exceeds max tensor index {n}")
        if not self.readable:  # (after a resize, or a failed allocate_tensors(), the last values read on, as LiteRT's)
            raise ValueError(f"Tensor {idx} is unallocated. Try calling allocate_tensors() first")
        if idx in self.runner.variables:  # the live state (reset_all_variables() replaces its arrays)
            if self.gpu_plan is not None:  # (state the device may hold)
                if writable:
                    self.gpu_plan.state_written()  # (read now; uploaded by the next invoke, in case it was written)
                else:
                    self.gpu_plan.sync_state()
            return self.runner.variables[idx]
        if idx in self.buffers and idx not in self.bindings:
            return self.buffers[idx]
        if self.values is None:
            self.values = self._initial_values()
        v = self.values[idx]
        if v is None and self.gpu_plan is not None and idx in self.gpu_plan.bound:
            v = self.gpu_plan.read_bound(idx)  # an output left on the device: read on demand
        if v is None:  # a delegated invoke returns only what crossed to the host: constants live here
            v = self.runner.consts.get(idx)
        if v is None and self.invoked:  # (before the first invoke, an output reads as zeros, as in LiteRT)
            t = self.sg.tensors[idx]
            why = ("the GpuDelegate's plan keeps it on the device, or fuses it away" if self.gpu_plan is not None
                   else "its op ran merged into the op reading it")
            raise ValueError(f"Tensor {idx} ({t.name}) holds no value after this invoke: {why}; "
                             f"Interpreter(..., experimental_preserve_all_tensors=True) keeps every tensor")
        if v is None:
            t = self.sg.tensors[idx]
            v = np.zeros(self.shape_of(idx), dtype=t.dtype)
            self.values[idx] = v
        return v


def _model_arguments(model, model_path, model_content) -> tuple:
    """(model_path, model_content) from the constructor's three ways of naming the model, with LiteRT's errors.
    The first positional argument is LiteRT's ``model_path`` (its positional order: model_path, model_content,
    experimental_delegates, num_threads), or tflgpu's shortcut for the model's bytes."""
    if model is not None:
        if model_path is not None:
            raise ValueError("Can't both provide `model` and `model_path`/`model_content`")
        if isinstance(model, (str, os.PathLike)):
            model_path = model
        elif model_content is not None:
            raise ValueError("Can't both provide `model` and `model_path`/`model_content`")
        else:
            model_content = model
    if model_path is not None and model_content is not None:
        raise ValueError("Can't both provide `model_path` and `model_content`")
    if model_path is None and model_content is None:
        raise ValueError("`model_path` or `model_content` must be specified.")
    if model_content is not None and not isinstance(model_content, (bytes, bytearray, memoryview)):
        raise ValueError(f"model_content must be bytes, got {type(model_content).__name__}")
    return model_path, model_content


def _check_litert_arguments(num_threads, litert_options: dict) -> None:
    """LiteRT's errors for num_threads, and a TypeError for a keyword neither LiteRT nor tflgpu has."""
    if num_threads is not None:
        if not isinstance(num_threads, int) or isinstance(num_threads, bool):
            raise ValueError("type of num_threads should be int")
        if num_threads < 1:
            raise ValueError("num_threads should >= 1")
    unknown = set(litert_options) - _LITERT_EXPERIMENTAL
    if unknown:
        raise TypeError(f"Interpreter() got unexpected keyword argument(s) {sorted(unknown)}")


def op_details(sg: Subgraph, i: int, details: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    """Node ``i`` of ``sg`` as LiteRT's ``_get_op_details`` gives it: index, op name (a custom op's own), input and
    output tensor indices (-1: an omitted optional input) and their dtypes (omitted ones left out); ``details``:
    a tensor index's detail dict. The model's nodes, whatever runs them."""
    if not 0 <= i < len(sg.operators):
        raise ValueError("Invalid node index")
    op = sg.operators[i]

    def dtypes(tensors):
        return [details(t)["dtype"] for t in tensors if t != -1]

    return {"index": i, "op_name": op.name, "inputs": np.array(op.inputs, dtype=np.int32),
            "outputs": np.array(op.outputs, dtype=np.int32), "operand_types": dtypes(op.inputs),
            "result_types": dtypes(op.outputs)}


def check_model_file(source: ModelBytes) -> None:
    """A RuntimeError where the mapped model file was truncated or rewritten in place since it was read (the
    next read of a weight would end the process with SIGBUS, or read other weights)."""
    changed = source.changed_on_disk()
    if changed:
        raise RuntimeError(
            f"the model file {source.path} changed after this Interpreter read it: {changed}. Its weights are "
            f"read from the file as it was, so the Interpreter cannot run on: make a new one. (Writing a new "
            f"model to another file and renaming it over this one leaves running Interpreters intact.)")


def _shape_argument(size) -> tuple[int, ...]:
    """``resize_tensor_input``'s tensor_size as LiteRT reads it (any 1-D sequence of whole numbers: ints, floats,
    numeric strings), but a fraction is refused rather than cut."""
    try:
        dims = np.array(size, dtype=np.int32)
    except (TypeError, ValueError) as e:
        raise ValueError(f"tensor_size must be a 1-D sequence of whole numbers, got {size!r} ({e})") from e
    if dims.ndim != 1:
        raise ValueError(f"Shape should be 1D instead of {dims.ndim}.")
    given = np.asarray(size)
    if given.dtype.kind in "fc" and not np.array_equal(given, dims):
        raise ValueError(f"tensor_size must be a 1-D sequence of whole numbers, got {given.tolist()}")
    return tuple(int(d) for d in dims)


def takes_value_type(want: np.dtype, got: np.dtype, string: bool) -> bool:
    """Whether set_tensor takes an array of dtype ``got`` for a tensor of dtype ``want``: the same type in either byte
    order (the other one, as a big-endian file loads, converted by value; LiteRT copies its bytes, numbers no one
    wrote), or any numpy strings for a STRING tensor (``string``)."""
    return got.newbyteorder("=") == want or (string and got.kind in "SUO")


def _index(value, what: str = "tensor_index") -> int:
    """An index argument as an int: ints, numpy's integers and bools, as LiteRT's bindings take them; a float or a
    string is a TypeError (``int()`` would have read 0.9 as 0 and "3" as 3)."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(value).__name__} {value!r}") from None


def _type_name(dtype: np.dtype) -> str:
    names = {"float32": "FLOAT32", "float64": "FLOAT64", "float16": "FLOAT16", "int8": "INT8",
             "int16": "INT16", "int32": "INT32", "int64": "INT64", "uint8": "UINT8", "uint16": "UINT16",
             "uint32": "UINT32", "uint64": "UINT64", "bool": "BOOL", "complex64": "COMPLEX64"}
    return names.get(np.dtype(dtype).name, np.dtype(dtype).name.upper())


def _code_dir(delegates: list):
    """Where generated CPU code is kept: under the delegate's serialization_dir, else tflgpu's cache directory."""
    from .cache.paths import default_cache_dir

    if any(not d.cache for d in delegates):  # (GpuDelegate(cache=False): nothing written to disk)
        return None
    root = next((d.serialization_dir for d in delegates if d.serialization_dir is not None), None)
    try:
        return (default_cache_dir() if root is None else Path(root)) / "cpu_code"
    except (OSError, RuntimeError, KeyError) as e:  # (no home directory...): the code is compiled in memory
        log.debug("tflgpu: no directory for generated CPU code (%s)", e)
        return None


class Interpreter:
    """Runs a TFLite model; the API of ``ai_edge_litert.interpreter.Interpreter``.

    Args:
        model: a path (``str`` / ``os.PathLike``) or the model bytes; tflgpu's
            positional shortcut for ``model_path`` / ``model_content``. The first four positional arguments
            are LiteRT's: model_path, model_content, experimental_delegates, num_threads.
        model_path: path to a ``.tflite`` file (memory-mapped, weights zero-copy).
        model_content: the model as ``bytes`` / ``bytearray`` / ``memoryview``.
        experimental_delegates: a list holding at most one tflgpu delegate.
        num_threads: CPU threads for the CPU kernels (``None``: all cores).
        delegate: tflgpu's delegate (``GpuDelegate``); same as passing it in
            ``experimental_delegates``.

    Raises:
        ValueError: the model cannot be read, is malformed, or uses an op
            no backend supports; bad arguments.
    """

    def __init__(
        self,
        model: str | os.PathLike | bytes | bytearray | memoryview | None = None,
        model_content: bytes | bytearray | memoryview | None = None,
        experimental_delegates: list | None = None,
        num_threads: int | None = None,
        *,
        model_path: str | os.PathLike | None = None,
        delegate: Any = None,
        **litert_options: Any,
    ):
        model_path, model_content = _model_arguments(model, model_path, model_content)
        _check_litert_arguments(num_threads, litert_options)
        self._num_threads = num_threads
        # (intermediate tensors keep their values for get_tensor(): the CPU kernels run every op as the model
        # has it, and a delegated plan reads each tensor back)
        preserve = bool(litert_options.get("experimental_preserve_all_tensors", False))
        self._compress_zero_points = bool(litert_options.get("experimental_compress_quantization_zero_points", False))
        delegates = list(experimental_delegates or [])
        if delegate is not None:
            delegates.append(delegate)
        for d in delegates:
            if not isinstance(d, GpuDelegate):
                raise ValueError(
                    f"Unsupported delegate {type(d).__name__}: tflgpu runs only its own delegates (tflgpu.GpuDelegate)"
                )
        if len(delegates) > 1:
            raise ValueError("at most one GpuDelegate per Interpreter")
        self._delegates = delegates
        self._startup, self._first_invoke_s = StartupClock(), None
        self._startup.phase("read", "the model file")
        source = ModelBytes.from_path(model_path) if model_path is not None else ModelBytes.from_content(model_content)
        self._model_bytes = source
        self._model: Model = read_model(source)
        self._runtime = ModelRunner(self._model, code_dir=_code_dir(self._delegates))
        self._startup.phase("cpu kernels", "preparing every op's CPU kernel, folding constants")
        check_fork()  # (in a forked child where a numba kernel would end the process: what to change instead)
        try:
            self._runtime.build_all()
            self._prepare_error: PrepareError | None = None
        except PrepareError as e:  # refused at allocate_tensors(), as LiteRT's Prepare does; details stay readable
            self._prepare_error = e
        self._startup.stop()
        self._sessions: dict[int, _Session] = {}
        self._preserve = preserve
        self._invoke_lock = threading.Lock()
        self._signature_defs = {s.key: s for s in self._model.signature_defs}
        if delegates and self._prepare_error is None:
            from .runtime.plan import build_plan, plan_device

            options = delegates[0]
            request = options.plan_request()
            if preserve:
                request = dataclasses.replace(request, keep_all_tensors=True)
            self._startup.phase("device", "finding the OpenCL device, making its context")
            # (a device named and missing raises here, as a delegate that fails to load; every plan works in the one
            # context and queue, so that buffers bound in it stay usable across resizes, and what the caller
            # enqueues on gpu_queue is ordered with each plan's invokes)
            device = plan_device(request)
            context = device.shared_context(request.profile) if device is not None else None
            self._startup.stop()
            if device is not None:
                runner = self._runtime.runner(0)
                token = None
                if options.cache and options.model_token is None:
                    from .cache.plans import model_token

                    token = model_token(self._model_bytes.data)
                name = os.path.basename(source.path) if source.path else ""  # stored with the plan, for `cache ls`

                def factory(shapes):
                    plan = build_plan(runner, request, device, shapes, token=token, model_name=name, context=context)
                    source.release_pages()  # (the weights are on the device now)
                    # (its background work reads weights from the file: a truncated one would end the process)
                    plan.activity.source_intact = lambda: source.changed_on_disk(now=True) is None
                    return plan

                # The plan is built at its first need, for the input shapes then set: by allocate_tensors(), or
                # by what asks for it (gpu_plan, gpu_context, bind_buffer...). So a resize_tensor_input() before
                # the first allocate_tensors(), LiteRT's way to another batch, builds only the plan it runs.
                self._session(0).gpu_factory = factory

    def __reduce__(self):
        raise TypeError("cannot pickle a tflgpu Interpreter (it holds prepared kernels, buffers and device state): "
                        "send the model's path or bytes to the other process and create an Interpreter there")

    def __copy__(self) -> Interpreter:
        """A second handle on this interpreter's state, as ``copy.copy`` of LiteRT's gives (pickling is refused)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    # -- internals ----------------------------------------------------------

    def _session(self, subgraph: int = 0) -> _Session:
        s = self._sessions.get(subgraph)
        if s is None:
            if not 0 <= subgraph < len(self._model.subgraphs):
                raise ValueError(f"Invalid subgraph index {subgraph} exceeds max subgraph index "
                                 f"{len(self._model.subgraphs)}")
            s = self._sessions[subgraph] = _Session(self._runtime, subgraph, self._preserve)
        return s

    def _details(self, idx: int, subgraph: int = 0) -> dict[str, Any]:
        s = self._session(subgraph)
        n = len(s.sg.tensors)
        if not 0 <= idx < n:
            raise ValueError(f"Invalid tensor index {idx} exceeds max tensor index {n}")
        return tensor_details(s.sg.tensors[idx], s.shape_of(idx), self._compress_zero_points)

    # -- LiteRT API ---------------------------------------------------------

    def allocate_tensors(self) -> None:
        """Allocate input buffers (and propagate shapes after ``resize_tensor_input``).

        Raises:
            RuntimeError: a node the model's kernels cannot take ("Node number N (OP) failed to prepare: ...").
        """
        if self._prepare_error is not None:
            raise self._prepare_error
        check_model_file(self._model_bytes)
        check_fork()
        session = self._session(0)
        try:
            session.allocate()
        except ShapeError as e:
            unresized = [t for t in (session.sg.tensors[i] for i in session.sg.inputs)
                         if -1 in t.shape_signature and session.input_shapes[t.index] == t.shape]
            if not unresized:
                raise
            t = unresized[0]
            raise ShapeError(f"{e} (input {t.name!r} has the dynamic shape {list(t.shape_signature)}, stored as "
                             f"{list(t.shape)}: resize_tensor_input() it to the shape it will be given before "
                             f"allocate_tensors())") from e

    def get_input_details(self) -> list[dict[str, Any]]:
        """Details of each model input: name, index, shape, dtype, quantization..."""
        return [self._details(i) for i in self._model.main.inputs]

    def get_output_details(self) -> list[dict[str, Any]]:
        """Details of each model output."""
        return [self._details(i) for i in self._model.main.outputs]

    def get_tensor_details(self, subgraph_index: int = 0) -> list[dict[str, Any]]:
        """Details of every tensor in a subgraph."""
        subgraph_index = _index(subgraph_index, "subgraph_index")
        if not 0 <= subgraph_index < len(self._model.subgraphs):  # (LiteRT's words here differ from get_tensor's)
            raise ValueError(f"subgraph_index is out of range: {subgraph_index} for the model, which has "
                             f"{len(self._model.subgraphs)} subgraphs.")
        s = self._session(subgraph_index)
        return [self._details(i, subgraph_index) for i in range(len(s.sg.tensors))]

    def set_tensor(self, tensor_index: int, value: np.ndarray) -> None:
        """Copy ``value`` into the tensor (dtype and shape must match exactly)."""
        s = self._session(0)
        idx = _index(tensor_index)
        if not 0 <= idx < len(s.sg.tensors):
            raise ValueError(f"Invalid tensor index {idx} exceeds max tensor index {len(s.sg.tensors)}")
        s.set(idx, value)

    def get_tensor(self, tensor_index: int, subgraph_index: int = 0) -> np.ndarray:
        """A copy of the tensor's current value."""
        s = self._session(_index(subgraph_index, "subgraph_index"))
        return np.array(s.value(_index(tensor_index), writable=False), copy=True)

    def tensor(self, tensor_index: int) -> Callable[[], np.ndarray]:
        """A function returning a numpy view of the tensor's current buffer (no copy)."""
        idx = _index(tensor_index)
        return lambda: self._session(0).value(idx)

    def invoke(self) -> None:
        """Run the model on the inputs set so far.

        One Interpreter serves one thread at a time (as in LiteRT); use one Interpreter per thread.
        A second thread invoking while one is running gets a RuntimeError instead of mixed results."""
        if not self._invoke_lock.acquire(blocking=False):
            raise RuntimeError("invoke() called while another thread is invoking this Interpreter; "
                               "an Interpreter is not thread-safe: use one per thread")
        try:
            check_model_file(self._model_bytes)
            check_fork()
            t0 = time.perf_counter()
            session = self._session(0)
            with session.threads(self._num_threads):
                session.invoke()
            if self._first_invoke_s is None:
                self._first_invoke_s = time.perf_counter() - t0
                log.info("start-up: %s", format_phases(self.startup_report()))
        finally:
            self._invoke_lock.release()

    def tuning_status(self):
        """Where the delegated plan's background work stands (a ``tflgpu.runtime.background.BackgroundStatus``:
        compile tier, kernels searched and left, speed-up so far, finished), or None when it has none (no
        delegate, a warm start from a tuned plan, or ``tuning`` other than "background" with nothing to
        compile)."""
        plan = self._session(0).plan()
        return plan.background_status() if plan is not None else None

    def wait_background(self, timeout: float | None = None, tuning: bool = True) -> bool:
        """Block until the delegated plan's background work (optimized build, background tuning) is finished,
        or without a plan, until the CPU kernels' WHILE loops are compiled; False if ``timeout`` seconds passed
        first. ``tuning=False``: only until the optimized program is built.
        What it made is installed by the next ``invoke()``."""
        plan = self._session(0).plan()
        if plan is None:  # the CPU kernels run it: its WHILE loops' compilation (tflgpu.cpu.loops) is the work
            deadline = None if timeout is None else time.monotonic() + timeout
            return all(slot.settle(None if deadline is None else max(0.0, deadline - time.monotonic()))
                       for slot in list(self._runtime.loops))
        if plan.background is None:
            return True
        return plan.background.wait(timeout, tuning)

    def startup_report(self) -> dict[str, float]:
        """Seconds per start-up phase, in order: reading the model, preparing the CPU kernels, then the
        delegated plan's (stored plan, shapes, passes and kernels, tuning records, compile or load, buffers),
        and the first invoke once it ran."""
        out = dict(self._startup.seconds)
        plan = self._session(0).gpu_plan
        if plan is not None:
            out.update(plan.clock.seconds)
        if self._first_invoke_s is not None:
            out["first invoke"] = self._first_invoke_s
        return out

    def resize_tensor_input(self, input_index: int, tensor_size, strict: bool = False) -> None:
        """Change an input's shape; call ``allocate_tensors()`` afterwards."""
        self._session(0).resize(_index(input_index, "input_index"), tensor_size, strict)

    def reset_all_variables(self) -> None:
        """Reset variable tensors (e.g. LSTM state) to their initial values."""
        self._runtime.reset_variables()
        for s in self._sessions.values():
            if s.gpu_plan is not None:
                s.gpu_plan.state_written(reset=True)

    def _get_op_details(self, op_index: int) -> dict[str, Any]:
        """One node of the main subgraph, as LiteRT's private helper gives it (``op_details``)."""
        return op_details(self._model.main, _index(op_index, "op_index"), self._details)

    def _get_ops_details(self) -> list[dict[str, Any]]:
        """``_get_op_details`` of every node of the main subgraph, in order."""
        return [self._get_op_details(i) for i in range(len(self._model.main.operators))]

    def _get_tensor_details(self, tensor_index: int, subgraph_index: int) -> dict[str, Any]:
        """One tensor's details (LiteRT's private form of ``get_tensor_details``)."""
        return self._details(int(tensor_index), int(subgraph_index))  # (LiteRT's helper takes floats)

    def _get_full_signature_list(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{key: {"inputs": {name: tensor index}, "outputs": {...}}}`` for each SignatureDef (LiteRT's private
        helper); the indices are of the signature's own subgraph."""
        return {k: {"inputs": dict(sorted(s.inputs.items())), "outputs": dict(sorted(s.outputs.items()))}
                for k, s in self._signature_defs.items()}

    def num_subgraphs(self) -> int:
        return len(self._model.subgraphs)

    @property
    def experimental_compress_quantization_zero_points(self) -> bool:
        """Whether tensor details give equal per-channel zero points as one (the constructor's option)."""
        return self._compress_zero_points

    def get_signature_list(self) -> dict[str, dict[str, list[str]]]:
        """``{key: {"inputs": [names], "outputs": [names]}}`` for each SignatureDef."""
        return {k: {"inputs": list(s.inputs), "outputs": list(s.outputs)} for k, s in self._signature_defs.items()}

    def get_signature_runner(self, signature_key: str | None = None) -> SignatureRunner:
        """A callable that runs one SignatureDef with keyword inputs, returning a dict."""
        if signature_key is None:
            if len(self._signature_defs) != 1:
                raise ValueError(
                    f"SignatureDef signature_key is None and model has {len(self._signature_defs)} Signatures. "
                    "None is only allowed when the model has 1 SignatureDef"
                )
            signature_key = next(iter(self._signature_defs))
        return SignatureRunner(self, signature_key)

    # -- tflgpu extras ------------------------------------------------------

    @property
    def model(self) -> Model:
        """The parsed graph IR."""
        return self._model

    def cpu_runner(self, subgraph_index: int = 0) -> SubgraphRunner:
        """The subgraph's CPU runner: its prepared kernels, folded constants (``consts``) and the steps left
        to run (``steps``), which a ``tflgpu.runtime.executor.GpuPlan`` is built over."""
        return self._runtime.runner(int(subgraph_index))

    @property
    def backend(self) -> str:
        """Where the model runs: 'cpu (numba)', or the OpenCL device, precision and op split."""
        plan = self.gpu_plan
        if plan is None:
            why = self.cpu_fallback_reason
            return f"cpu (numba; {why})" if why else "cpu (numba)"
        ident = plan.device.identity
        return (f"opencl: {ident.platform} / {ident.device} ({'fp16' if plan.fp16 else 'fp32'}; "
                f"{plan.gpu_op_count} ops on device, {plan.cpu_op_count} on cpu)")

    @property
    def cpu_fallback_reason(self) -> str | None:
        """Why the model itself (an empty batch) leaves a GpuDelegate's device nothing to run, or None."""
        return self._session(0).cpu_fallback_reason()

    def bind_buffer(self, tensor_index: int, buffer) -> None:
        """Bind a pyopencl Buffer/Array (dense NHWC float32, created in ``gpu_context``) to a model input
        or output: inputs are read from it without a host copy (set_tensor is not needed), outputs are
        written to it (and, with ``allow_buffer_handle_output``, not copied to the host).
        TFLite's bindGlBufferToTensor analogue; bindings survive resizes where the buffer holds the new shape."""
        s = self._session(0)
        if s.plan() is None:
            raise ValueError("bind_buffer needs a GpuDelegate with an OpenCL device")
        idx = _index(tensor_index)
        if idx not in s.sg.inputs and idx not in s.sg.outputs:
            raise ValueError(f"tensor {idx} is neither an input nor an output of the model")
        s.gpu_plan.bind(idx, buffer)
        s.bindings[idx] = buffer

    @property
    def gpu_context(self):
        """The pyopencl Context of the delegated plan (create buffers to bind in it)."""
        plan = self.gpu_plan
        return plan.ctx if plan is not None else None

    @property
    def gpu_queue(self):
        """The pyopencl CommandQueue invoke() runs on."""
        plan = self.gpu_plan
        return plan.queue if plan is not None else None

    @property
    def gpu_plan(self):
        """The delegated plan (None without a GpuDelegate or without a usable OpenCL device); built now where
        allocate_tensors() has not built it yet."""
        return self._session(0).plan()


class InterpreterWithCustomOps(Interpreter):
    """LiteRT's ``InterpreterWithCustomOps``, for code that uses it. Its ``custom_op_registerers`` (symbol names or
    functions) add C kernels to LiteRT's op resolver, which tflgpu does not have: the custom ops tflgpu runs
    (MediaPipe's) are its own kernels, and a model's custom op it lacks is refused at ``allocate_tensors()`` as
    LiteRT refuses an unresolved one ("Encountered unresolved custom op: ...")."""

    def __init__(self, custom_op_registerers=None, **kwargs):
        if custom_op_registerers:
            log.info("InterpreterWithCustomOps: custom_op_registerers %s are LiteRT's kernels, not called: tflgpu "
                     "runs its own", list(custom_op_registerers))
        super().__init__(**kwargs)


class OpResolverType(enum.Enum):
    """LiteRT's ``experimental_op_resolver_type`` values, for code that passes one: tflgpu runs its own kernels
    whichever is given (LiteRT's choose between its optimized and reference kernels, and XNNPACK)."""

    AUTO = 0
    BUILTIN = 1
    BUILTIN_REF = 2
    BUILTIN_WITHOUT_DEFAULT_DELEGATES = 3


_LITERT_EXPERIMENTAL = frozenset({
    "experimental_op_resolver_type", "experimental_preserve_all_tensors",
    "experimental_disable_delegate_clustering", "experimental_default_delegate_latest_features",
    "experimental_compress_quantization_zero_points", "experimental_disable_delegate_node_fusion",
    "experimental_force_delegate_node_profiling",
})


class SignatureRunner:
    """Runs one SignatureDef: ``runner(x=array) -> {"out": array}``."""

    def __init__(self, interpreter: Interpreter | None = None, signature_key: str | None = None):
        if interpreter is None:
            raise ValueError("None interpreter provided.")
        if signature_key is None:
            raise ValueError("None signature_key provided.")
        sig = interpreter._signature_defs.get(signature_key)
        if sig is None:
            raise ValueError(f'Invalid signature_key provided: "{signature_key}".')
        self._interp = interpreter
        self._sig = sig
        self._session = interpreter._session(sig.subgraph_index)

    def __call__(self, **kwargs: np.ndarray) -> dict[str, np.ndarray]:
        sig, s = self._sig, self._session
        if len(kwargs) != len(sig.inputs):
            raise ValueError(
                "Invalid number of inputs provided for running a SignatureDef, "
                f"expected {len(sig.inputs)} vs provided {len(kwargs)}"
            )
        for name, value in kwargs.items():
            if name not in sig.inputs:
                raise ValueError(f"Invalid Input name ({name}) for SignatureDef")
            s.resize(sig.inputs[name], np.shape(value), False)
        if not s.allocated:
            s.allocate()
        for name, value in kwargs.items():
            s.set(sig.inputs[name], value)
        with s.threads(self._interp._num_threads):
            s.invoke()
        return {name: np.array(s.value(idx), copy=True) for name, idx in sig.outputs.items()}

    def get_input_details(self) -> dict[str, dict[str, Any]]:
        return {n: self._interp._details(i, self._sig.subgraph_index) for n, i in self._sig.inputs.items()}

    def get_output_details(self) -> dict[str, dict[str, Any]]:
        return {n: self._interp._details(i, self._sig.subgraph_index) for n, i in self._sig.outputs.items()}
