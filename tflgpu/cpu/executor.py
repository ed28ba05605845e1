"""Runs a model's subgraphs op by op on the CPU kernels.

Building a :class:`SubgraphRunner` does all per-model work once: it finds
each op's kernel (or fails with a clear error naming the op), lets the
kernel prepare its constants, and folds every op whose inputs are all
constant (float16 DEQUANTIZE, DENSIFY, shape arithmetic) into a constant.
``run`` is then a flat loop over the remaining steps.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
from collections.abc import Callable, Sequence

import numpy as np

from ..model import reader
from ..model.ir import Model, Operator, Subgraph
from ..model.sparse import densify
from ..ops.shapes import output_shapes
from ..ops.signatures import problems
from ..ops.traits import traits
from . import registry
from .registry import InvokeError, KernelError, OpContext, PrepareError, UnresolvedCustomOp

log = logging.getLogger("tflgpu")

NON_NUMERIC = frozenset({"STRING", "RESOURCE", "VARIANT"})


def unsupported_error(op: Operator, subgraph: int = 0, quantized: bool = False) -> ValueError:
    code = op.builtin_code if op.builtin_code >= 0 else "custom"
    where = f" in subgraph {subgraph}" if subgraph else ""
    what = "quantized " if quantized else ""
    return ValueError(
        f"Didn't find kernel: {what}op {op.name} (code {code}) at index {op.index}{where} "
        f"is not supported by tflgpu's CPU kernels"
    )


_INDEX_TYPES = frozenset({"INT32", "INT64"})  # (what shapes, axes and positions are computed in)
KERNEL_FAILURES = (KernelError, ValueError, IndexError, TypeError, AttributeError, ArithmeticError, MemoryError)


def invoke_failure(op: Operator, e: BaseException) -> InvokeError:
    """What a kernel raised on a hostile or broken model's data, as the RuntimeError naming the op."""
    why = str(e) if isinstance(e, KernelError) else f"{type(e).__name__}: {e}"
    return InvokeError(op, why)


def check_outputs(op: Operator, outs) -> None:
    """An output (its shape computed from data) larger than one tensor may be is the op's failure."""
    limit = reader.DEFAULT_MAX_TENSOR_BYTES
    for o in outs:
        if getattr(o, "nbytes", 0) > limit:
            raise InvokeError(op, f"its output of shape {list(o.shape)} exceeds {limit} bytes "
                                  f"(TFLGPU_MAX_TENSOR_BYTES)")


def run_cpu_op(op: Operator, fn: Callable, inputs: list) -> list:
    """One CPU kernel call; what a hostile or broken model makes it raise becomes a RuntimeError naming the op,
    and so does an output (its shape computed from data) larger than one tensor may be."""
    try:
        outs = fn(inputs)
    except KERNEL_FAILURES as e:
        raise invoke_failure(op, e) from e
    check_outputs(op, outs)
    return outs


class SubgraphRunner:
    def __init__(self, runtime: ModelRunner, sg: Subgraph):
        self.runtime = runtime
        self.sg = sg
        self.consts: dict[int, np.ndarray] = {
            t.index: t.data for t in sg.tensors if t.data is not None and t.sparsity is None
        }
        # sparse constants hold only their values: DENSIFY rebuilds them, and counts them as constant inputs;
        # one that another op reads directly (TFLite's sparse FULLY_CONNECTED) computes as its dense tensor
        self.sparse_consts = frozenset(t.index for t in sg.tensors if t.data is not None and t.sparsity is not None)
        read_directly = {i for op in sg.operators if op.name != "DENSIFY" for i in op.inputs} & self.sparse_consts
        for i in sorted(read_directly):
            t = sg.tensors[i]
            self.consts[i] = densify(t.data, t.shape, t.sparsity)
        self.variables: dict[int, np.ndarray] = {}
        self.reset_variables()
        self.steps: list[tuple[Operator, Callable]] = []

    def build(self) -> None:
        for op in self.sg.operators:
            found = problems(op, self.sg)  # (first: the lookups below read the node's tensors)
            if found:
                raise PrepareError(op, "; ".join(found), self.sg.index)
            fn = self.kernel(op)
            if self._foldable(op):
                self._fold(op, fn)
                continue
            self.steps.append((op, fn))

    def _fold(self, op: Operator, fn: Callable) -> None:
        """Evaluate an op whose inputs are all constant into constants (its kernel's refusal a PrepareError)."""
        try:
            outs = fn([self.consts.get(i) if i >= 0 else None for i in op.inputs])
        except (KernelError, ValueError, IndexError, TypeError, AttributeError, ArithmeticError,
                MemoryError) as e:  # (AttributeError: a required input marked omitted, -1)
            raise PrepareError(op, f"constant folding failed: {e}", self.sg.index) from e
        for t_idx, out in zip(op.outputs, outs):
            if t_idx >= 0:
                self.consts[t_idx] = self._coerce(t_idx, out)

    def folded(self, known: dict[int, np.ndarray]) -> SubgraphRunner:
        """A runner over the same graph and state with ``known`` tensors' values as constants too (a plan's
        SHAPEs, for its input shapes): the steps making them go, and every step then reading only constants
        folds as ``build`` folds. This runner where ``known`` is empty."""
        if not known:
            return self
        runner = copy.copy(self)
        runner.consts = {**self.consts, **known}
        runner.steps = []
        for op, fn in self.steps:
            if all(t < 0 or t in known for t in op.outputs):
                continue
            if runner._foldable(op):
                runner._fold(op, fn)
            else:
                runner.steps.append((op, fn))
        return runner

    def kernel(self, op: Operator) -> Callable:
        """The CPU kernel of ``op``, made from this runner's constants (a kernel keeps the constants it reads,
        laid out for its loops)."""
        from .quantized import hybrid_factory, is_hybrid_op, is_quantized_op, quantized_factory

        ctx = OpContext(op, self.sg, self.runtime, self.consts)
        quantized = is_quantized_op(op, self.sg)
        if quantized:
            factory = quantized_factory(ctx)
        elif is_hybrid_op(op, self.sg):
            factory = hybrid_factory
        else:
            factory = registry.factory_for(op.name)
        if factory is None:
            if op.builtin_code < 0 and not quantized:
                raise UnresolvedCustomOp(op, self.sg.index)
            raise unsupported_error(op, self.sg.index, quantized)
        try:
            return factory(ctx)
        except Exception as e:  # a model whose shapes/options the kernel cannot take
            why = str(e) if isinstance(e, (ValueError, KernelError)) else f"{type(e).__name__}: {e}"
            raise PrepareError(op, why, self.sg.index) from e

    def with_constants(self, consts: dict[int, np.ndarray]) -> SubgraphRunner:
        """A runner over the same graph and state whose kernels are made from ``consts`` instead (each of this
        runner's constants, changed: e.g. rounded to half as an FP16 plan stores them)."""
        runner = copy.copy(self)
        runner.consts = consts
        runner.steps = [(op, runner.kernel(op)) for op, _ in self.steps]
        return runner

    def derived(self, sg: Subgraph, steps: list[tuple[Operator, Callable]]) -> SubgraphRunner:
        """A runner over ``sg`` (this graph with ops added or rewired, e.g. a plan's storage casts) running
        ``steps``, sharing this runner's constants and variables (its state)."""
        runner = copy.copy(self)
        runner.sg, runner.steps = sg, list(steps)
        return runner

    def empty_aware(self) -> SubgraphRunner:
        """A runner over the same graph and state whose ops, reading a tensor with no elements, make outputs that
        have none (their shapes by ``ops.shapes``' rules) as such, without their kernels: an empty batch (a second
        stage given no detections) runs as in LiteRT, where kernels dividing their work by the batch would not.
        An op with side effects still runs (its state), as does one making a value of an empty input (SHAPE, a
        sum over the empty axis), on it; one no rule knows runs its kernel, which tells what fails (MobileNet v1's
        RESHAPE to [1, 1001]). For shapes holding such a tensor: each op pays the check."""
        dtypes, steps = self._frame()[1], []
        for op, fn in self.steps:
            if not traits(op.name).side_effects:
                outputs = [(t >= 0, dtypes[t] if t >= 0 else None) for t in op.outputs]
                declared = [self.sg.tensors[t].shape if t >= 0 else None for t in op.outputs]
                fn = functools.partial(_unless_empty, op, fn, outputs, declared)
            steps.append((op, fn))
        return self.derived(self.sg, steps)

    def merged(self) -> SubgraphRunner:
        """A runner over the same graph and state with the passes over a float tensor that the next op can make
        itself merged into it, as a device plan merges them: a zero PAD of the spatial axes that only a CONV_2D /
        DEPTHWISE_CONV_2D reads becomes its explicit padding (``graph.passes.padded_conv``: MediaPipe's full-range
        face detector pads before 43 of its convs), and a RELU / RELU6 / RELU_N1_TO_1 the only reader of an op that
        clamps nothing yet becomes that op's fused activation (``clamp_merged``: BlazeFace's 16 residual ADDs). The
        merged op runs at its reader's place; the tensor between is then never computed, as in a delegated plan.
        This runner where nothing merges."""
        from ..graph.passes import clamp_merged, padded_conv
        from .quantized import is_hybrid_op, is_quantized_op

        ops = [op for op, _ in self.steps]
        readers: dict[int, list[int]] = {}
        for n, op in enumerate(ops):
            for t in set(op.inputs):
                readers.setdefault(t, []).append(n)
        merged: dict[int, Operator] = {}  # step -> the op it runs now
        gone: set[int] = set()
        for n, op in enumerate(ops):
            op = merged.get(n, op)
            rs = readers.get(op.outputs[0], []) if len(op.outputs) == 1 else []
            if len(rs) != 1 or op.outputs[0] in self.sg.outputs or self.sg.tensors[op.outputs[0]].dtype != np.float32:
                continue
            reader = ops[rs[0]]
            new = padded_conv(op, reader, self.consts) or clamp_merged(op, reader)
            if new is None or is_quantized_op(new, self.sg) or is_hybrid_op(new, self.sg):
                continue
            merged[rs[0]] = new
            merged.pop(n, None)
            gone.add(n)
        if not merged:
            return self
        steps = [(merged[n], self.kernel(merged[n])) if n in merged else (op, fn)
                 for n, (op, fn) in enumerate(self.steps) if n not in gone]
        return self.derived(self.sg, steps)

    def _foldable(self, op: Operator) -> bool:
        if traits(op.name).side_effects or not op.inputs:
            return False
        return all(i < 0 or i in self.consts or i in self.sparse_consts for i in op.inputs)

    def reset_variables(self) -> None:
        for t in self.sg.tensors:
            if t.is_variable:
                init = t.data if t.data is not None else np.zeros(t.shape, t.dtype)
                self.variables[t.index] = np.array(init, dtype=t.dtype, copy=True)

    def _coerce(self, t_idx: int, out) -> np.ndarray:
        t = self.sg.tensors[t_idx]
        out = np.asarray(out)
        if t.type_name not in NON_NUMERIC and out.dtype != t.dtype:
            out = out.astype(t.dtype)
        return out

    def run(self, inputs: Sequence[np.ndarray]) -> list:
        """Run with the given input arrays; returns every tensor's value, by index."""
        sg = self.sg
        if len(inputs) != len(sg.inputs):
            raise RuntimeError(f"subgraph {sg.index} takes {len(sg.inputs)} inputs, got {len(inputs)}")
        values, dtypes = self._start(inputs)
        # run_op's work, inlined: a small model's ops take a few microseconds each, as much as a call costs
        limit = reader.DEFAULT_MAX_TENSOR_BYTES
        op = None
        try:
            for op, fn in self.steps:
                outs = fn([values[i] if i >= 0 else None for i in op.inputs])
                for t_idx, out in zip(op.outputs, outs):
                    if getattr(out, "nbytes", 0) > limit:
                        check_outputs(op, outs)
                    if t_idx >= 0:
                        values[t_idx] = out if getattr(out, "dtype", None) == dtypes[t_idx] else \
                            self._coerce(t_idx, out)
        except KERNEL_FAILURES as e:
            raise invoke_failure(op, e) from e
        return values

    def shapes(self, inputs: Sequence[np.ndarray]) -> list[tuple[int, ...] | None] | None:
        """Every tensor's shape (None: never made) when the graph runs on these inputs, running only the kernels
        the shapes need: an op whose output shapes ``ops.shapes`` knows gets zeros of them (its kernel does not run),
        and another op reading such stand-ins runs on them where its output shapes follow from its inputs' shapes
        (``OpTraits.shape_inputs``). None where they may not: an op whose shapes may depend on the stand-ins'
        values reads them, or a kernel refuses them; ``run`` then tells. Kernels that ran may have
        changed the variables, as ``run`` does."""
        if len(inputs) != len(self.sg.inputs):
            return None
        values, dtypes = self._start(inputs)
        stand_in: set[int] = set()  # tensors holding zeros for values their skipped producer did not compute
        limit = reader.DEFAULT_MAX_TENSOR_BYTES  # (an output over it is the op's failure: ``run`` raises it)
        for op, fn in self.steps:
            facts = traits(op.name)
            reads = [k for k, t in enumerate(op.inputs) if t in stand_in]
            if reads and (facts.shape_inputs is None or any(k in facts.shape_inputs for k in reads)):
                return None
            ins = [values[t] if t >= 0 else None for t in op.inputs]
            # (index arithmetic on known values, a shape's computed as BirdNET's SHAPE -> FLOOR_DIV -> PACK ->
            # STRIDED_SLICE does, keeps its values: a later op's shape may read them)
            arithmetic = not reads and all(t < 0 or self.sg.tensors[t].type_name in _INDEX_TYPES for t in op.outputs)
            known = None if arithmetic else output_shapes(
                op, [np.shape(v) if v is not None else None for v in ins],
                [None if t in stand_in else v for t, v in zip(op.inputs, ins)],
                [self.sg.tensors[t].shape if t >= 0 else None for t in op.outputs])
            made = [(t, shape) for t, shape in zip(op.outputs, known or ()) if t >= 0]  # (an omitted one: -1)
            if known is not None and len(known) == len(op.outputs) and all(dtypes[t] is not None for t, _ in made):
                if any(math.prod(shape) * dtypes[t].itemsize > limit for t, shape in made):
                    return None
                for t, shape in made:
                    values[t] = np.zeros(shape, dtypes[t])
                    stand_in.add(t)
                continue
            try:
                outs = fn(ins)
            except KERNEL_FAILURES:
                return None
            if len(outs) != len(op.outputs) or any(getattr(o, "nbytes", 0) > limit for o in outs):
                return None
            for t, out in zip(op.outputs, outs):
                if t >= 0:
                    values[t] = self._coerce(t, out)
                    if reads and not facts.values_from_shape:
                        stand_in.add(t)
        return [None if v is None else tuple(np.shape(v)) for v in values]

    def propagated_shapes(self, inputs: Sequence[np.ndarray]) -> list[tuple[int, ...] | None]:
        """Every tensor's shape (None: never made) when the graph runs on ``inputs`` (zeros: a resize's or a plan's
        shapes): ``shapes``' where it answers, else a run of every kernel's, which raises what fails at these
        shapes: the PrepareError naming the node, as LiteRT's allocate_tensors() does. The variables are reset
        afterwards."""
        try:
            with np.errstate(all="ignore"):  # (zeros make LOG / RSQRT / DIV warn; only the shapes matter)
                shapes = self.shapes(inputs)
                if shapes is None:
                    self.reset_variables()
                    # (ops reading a tensor with no elements skipped: what fails there is not a conv's loop)
                    shapes = [None if v is None else tuple(np.shape(v)) for v in self.empty_aware().run(inputs)]
        except InvokeError as e:
            raise PrepareError(e.op, e.why) from e
        finally:
            self.reset_variables()
        return shapes

    def _start(self, inputs: Sequence[np.ndarray]) -> tuple[list, list]:
        """A run's values before its first op (the constants, the variables, these inputs) and the dtypes
        (``_frame``)."""
        template, dtypes = self._frame()
        values = list(template)
        for i, v in self.variables.items():
            values[i] = v
        for i, v in zip(self.sg.inputs, inputs):
            values[i] = v
        return values, dtypes

    def _frame(self) -> tuple[list, list]:
        """What every run starts from, made once per graph and constants (a loop body runs many times): the
        values by tensor index holding the constants (copied per run), and each tensor's numeric dtype (an
        output of it is stored as is) or None (coerced)."""
        cached = self.__dict__.get("_frame_cache")  # (a runner derived or given other constants makes its own)
        if cached is None or cached[0] is not self.sg or cached[1] is not self.consts or cached[2] != len(self.consts):
            values: list = [None] * len(self.sg.tensors)
            for i, v in self.consts.items():
                values[i] = v
            dtypes = [None if t.type_name in NON_NUMERIC else np.dtype(t.dtype) for t in self.sg.tensors]
            cached = self._frame_cache = (self.sg, self.consts, len(self.consts), values, dtypes)
        return cached[3], cached[4]

    def run_op(self, op: Operator, fn: Callable, values) -> None:
        """Run one step's kernel on ``values`` (a list or dict by tensor index: every input the op reads must
        be there, an omitted one as -1) and store its outputs there in their declared dtypes."""
        outs = run_cpu_op(op, fn, [values[i] if i >= 0 else None for i in op.inputs])
        for t_idx, out in zip(op.outputs, outs):
            if t_idx >= 0:
                values[t_idx] = self._coerce(t_idx, out)

    def outputs(self, values: list) -> list[np.ndarray]:
        return [values[i] for i in self.sg.outputs]


class ModelRunner:
    """Owns one runner per subgraph (built on first use) and the resource variables."""

    def __init__(self, model: Model, code_dir=None):
        self.model = model
        self.code_dir = code_dir  # where generated CPU code (compiled WHILE loops) is kept, or None (in memory)
        self.loops: list = []  # every WHILE op's LoopSlot (tflgpu.cpu.loops)
        self._runners: dict[int, SubgraphRunner] = {}
        self.resources: dict[int, np.ndarray] = {}
        self._resource_ids: dict[tuple[str, str], int] = {}
        self._called_once: set[int] = set()
        self.hashtables: dict[int, object] = {}  # table_id -> its hash table (cpu.control)
        self.preparations = 0  # times the model was prepared for other input shapes (a random op's seed restarts)

    def runner(self, index: int) -> SubgraphRunner:
        r = self._runners.get(index)
        if r is None:
            if not 0 <= index < len(self.model.subgraphs):
                raise ValueError(f"subgraph index {index} out of range")
            r = SubgraphRunner(self, self.model.subgraphs[index])
            self._runners[index] = r  # registered first: kernels may look up its constants
            try:
                r.build()
            except Exception:
                del self._runners[index]
                raise
        return r

    def build_all(self) -> None:
        """Build every subgraph now, so unsupported ops fail at construction."""
        for i in range(len(self.model.subgraphs)):
            self.runner(i)

    def constant_value(self, subgraph: int, tensor: int) -> np.ndarray | None:
        r = self._runners.get(subgraph)
        return r.consts.get(tensor) if r else None

    def run_subgraph(self, index: int, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        r = self.runner(index)
        return r.outputs(r.run(inputs))

    def call_once(self, index: int) -> None:
        if index not in self._called_once:
            self._called_once.add(index)
            self.run_subgraph(index, [])

    def resource_id(self, key: tuple[str, str]) -> int:
        return self._resource_ids.setdefault(key, len(self._resource_ids))

    def reset_variables(self) -> None:
        for r in self._runners.values():
            r.reset_variables()
        self.resources.clear()
        self._called_once.clear()


def load_kernels() -> None:
    """Import every kernel module so the registry is complete."""
    from . import (  # noqa: F401
        attention,
        control,
        conv,
        conv3d,
        detection,
        elementwise,
        indexing,
        pool,
        projection,
        random_ops,
        recurrent,
        reduce,
        resize,
        spectral,
        stablehlo,
        svdf,
        tensor_ops,
    )


def _unless_empty(op: Operator, fn: Callable, outputs: list[tuple[bool, np.dtype | None]], declared: list,
                  ins: list) -> list:
    """A step of ``SubgraphRunner.empty_aware``: ``fn(ins)``, unless an input has no elements and so has each output
    the op makes (``outputs``: whether it makes it, not omitted, and its numeric dtype): zeros of those shapes."""
    if not any(getattr(v, "size", 1) == 0 for v in ins if v is not None):
        return fn(ins)
    known = output_shapes(op, [np.shape(v) if v is not None else None for v in ins], ins, declared)
    if known is None or len(known) != len(outputs) or any(
            made and (dtype is None or 0 not in shape) for shape, (made, dtype) in zip(known, outputs)):
        return fn(ins)
    return [np.zeros(shape, dtype) if made else None for shape, (made, dtype) in zip(known, outputs)]


load_kernels()
