"""Unroll WHILE loops whose trip count is fixed by constants (a Keras RNN's time loop).

A loop variable is *static* when its initial value is constant and the body computes its next
value from static variables and constants only (the step counter); the loop is unrollable when
the condition reads static variables only. The static part is then run on the host once per
iteration (with the CPU kernels) and becomes constants; the body's other ops are inlined once per
iteration into the parent graph, reading those constants (a GATHER of ``x[t]`` gets a constant
``t``). The loop's float state then flows through ordinary ops the OpenCL path can run, with no
host round trip per iteration. Bounded: at most MAX_TRIPS iterations and MAX_OPS inlined ops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..model.ir import Operator, Subgraph, Tensor
from ..model.schema import BUILTIN_CODES, TENSOR_TYPE_CODES
from ..ops.traits import traits

log = logging.getLogger("tflgpu")

MAX_TRIPS = 256
MAX_OPS = 8192


class NotUnrollable(Exception):
    pass


def _static_tensors(body: Subgraph, static_inputs: set[int]) -> set[int]:
    """Body tensors computable from constants and the static inputs alone."""
    known = {t.index for t in body.tensors if t.data is not None} | {body.inputs[j] for j in static_inputs}
    for op in body.operators:
        if not traits(op.name).side_effects and all(i < 0 or i in known for i in op.inputs):
            known.update(op.outputs)
    return known


def loop_plan(while_op: Operator, cond: Subgraph, body: Subgraph, consts: dict):
    """The static loop-variable positions, or NotUnrollable."""
    n = len(while_op.inputs)
    if len(body.inputs) != n or len(body.outputs) != n or len(cond.inputs) != n:
        raise NotUnrollable("loop signature")
    if any(traits(op.name).side_effects for op in body.operators + cond.operators):
        raise NotUnrollable("the loop has control flow or state inside")
    if any(t.is_variable for t in body.tensors):
        raise NotUnrollable("variable tensors in the body")
    static = {j for j in range(n) if while_op.inputs[j] in consts}
    while True:  # fixpoint: a variable stays static only if the body keeps it static
        known = _static_tensors(body, static)
        keep = {j for j in static if body.outputs[j] in known}
        if keep == static:
            break
        static = keep
    cond_known = _static_tensors(cond, static)
    if any(o not in cond_known for o in cond.outputs):
        raise NotUnrollable("the condition depends on non-constant values")
    return static, known


@dataclass
class LoopEdit:
    """The parent graph a WHILE rewrite edits: its tensors (new ones appended, existing indices kept), its outputs,
    and the tensors later ops read instead of a WHILE output (``remap``)."""

    tensors: list[Tensor]
    outputs: list[int]
    remap: dict[int, int] = field(default_factory=dict)

    def add(self, like: Tensor, name: str, shape, data=None, **fields) -> int:
        """A new tensor shaped ``shape`` (constant ``data`` if given), otherwise as ``like``; its index."""
        self.tensors.append(replace(like, index=len(self.tensors), name=name, shape=tuple(shape),
                                    shape_signature=tuple(shape), data=data, is_variable=False, sparsity=None,
                                    **fields))
        return len(self.tensors) - 1

    def const(self, like: Tensor, name: str, value: np.ndarray) -> int:
        """A new constant tensor of ``value``'s type (int32 or float32)."""
        value = np.asarray(value)
        return self.add(like, name, value.shape, value, dtype=value.dtype, type_name=value.dtype.name.upper(),
                        quantization=None)

    def fix(self, out: int, value) -> None:
        """WHILE output ``out`` is the constant ``value`` (a static loop variable's final value)."""
        self.tensors[out] = replace(self.tensors[out], data=np.asarray(value).reshape(self.tensors[out].shape))

    def result(self, out: int, src: int, reshape: bool = False) -> list[Operator]:
        """WHILE output ``out`` is now ``src``: its readers read ``src``, or (a graph output keeps its index) a
        RESHAPE copies ``src`` into it: to ``src``'s own shape, a SHAPE of it (which a plan knows for its input
        shapes and folds: ``runtime.selection.fold_shapes``), so that the copy takes any batch; with ``reshape``
        (``src`` has another shape), to ``out``'s declared shape."""
        like = self.tensors[out]
        if out not in self.outputs and not reshape:
            self.remap[out] = src
            return []
        if reshape:
            shape_t = self.const(like, f"{like.name}@shape", np.asarray(like.shape, np.int32))
            return [_op("RESHAPE", (src, shape_t), out, new_shape=list(like.shape))]
        # (the declared shape baked in failed every other batch: "cannot reshape 640 elements into [1, 8, 8, 5]")
        shape_t = self.add(like, f"{like.name}@shape", (len(like.shape),), dtype=np.dtype(np.int32),
                           type_name="INT32", quantization=None)
        return [_op("SHAPE", (src,), shape_t, out_type=TENSOR_TYPE_CODES["INT32"]), _op("RESHAPE", (src, shape_t), out)]


def _op(name: str, inputs: tuple[int, ...], output: int, **options) -> Operator:
    """A builtin op of the rewritten graph (its index set when the graph's ops are numbered)."""
    return Operator(-1, name, BUILTIN_CODES[name], 1, inputs, (output,), options=options)


def rewrite_loops(sg: Subgraph, rewrite: Callable[[Operator, LoopEdit], list[Operator]], kept: str,
                  op_name: str = "WHILE") -> tuple[Subgraph, int]:
    """``sg`` with each WHILE (``op_name``) that ``rewrite`` takes replaced by the ops it returns (their inputs
    and outputs in ``LoopEdit``'s tensors); one it refuses (NotUnrollable) is kept, logged as ``kept`` with the
    reason. Returns the new subgraph and how many were rewritten."""
    if not any(op.name == op_name for op in sg.operators):
        return sg, 0
    edit = LoopEdit(list(sg.tensors), list(sg.outputs))
    ops: list[Operator] = []
    count = 0
    for op in sg.operators:
        op = replace(op, inputs=tuple(edit.remap.get(i, i) for i in op.inputs))
        if op.name != op_name:
            ops.append(op)
            continue
        try:
            new_ops = rewrite(op, edit)
        except NotUnrollable as e:
            log.info("%s at op %d %s: %s", op_name, op.index, kept, e)
            ops.append(op)
            continue
        ops.extend(new_ops)
        count += 1
    if not count:
        return sg, 0
    ops = [replace(o, index=i) for i, o in enumerate(ops)]
    return replace(sg, tensors=edit.tensors, operators=ops, outputs=tuple(edit.outputs)), count


def unroll_static_loops(sg: Subgraph, runtime, consts: dict) -> tuple[Subgraph, int]:
    """``sg`` with every unrollable WHILE inlined (new tensors appended; existing indices kept)."""
    return rewrite_loops(sg, lambda op, edit: _unroll_one(op, runtime, consts, edit), "stays a loop")


def static_trips(op: Operator, cond: Subgraph, body: Subgraph, runtime, static: set[int], values: list):
    """Run a WHILE's static part on the host (the CPU kernels): yields the body's values each iteration (static
    tensors exact, others from zeros); ``values`` (the loop variables' initial host values, None where not
    static) holds each static variable's value as the iteration starts, and after the last one, its final value.
    NotUnrollable past MAX_TRIPS iterations."""
    cond_runner, body_runner = runtime.runner(cond.index), runtime.runner(body.index)
    n = len(op.inputs)

    def feed():
        return [values[j] if j in static else np.zeros(body.tensors[body.inputs[j]].shape,
                                                        body.tensors[body.inputs[j]].dtype) for j in range(n)]

    for trip in range(MAX_TRIPS + 1):
        with np.errstate(all="ignore"):
            go = cond_runner.run(feed())[cond.outputs[0]]
        if not bool(np.asarray(go).reshape(-1)[0]):
            return
        if trip == MAX_TRIPS:
            raise NotUnrollable(f"more than {MAX_TRIPS} iterations")
        with np.errstate(all="ignore"):
            body_vals = body_runner.run(feed())
        yield body_vals
        for j in static:
            values[j] = np.asarray(body_vals[body.outputs[j]])


def _unroll_one(op: Operator, runtime, consts: dict, edit: LoopEdit) -> list[Operator]:
    model = runtime.model
    cond = model.subgraphs[op.options["cond_subgraph_index"]]
    body = model.subgraphs[op.options["body_subgraph_index"]]
    static, known = loop_plan(op, cond, body, consts)
    n = len(op.inputs)
    state = list(op.inputs)  # parent tensor of each loop variable
    values: list = [consts.get(t) for t in op.inputs]  # host values of the static variables
    body_consts: dict[int, int] = {}  # body constant tensor -> parent tensor
    new_ops: list[Operator] = []
    dynamic_ops = [b for b in body.operators if not all(o in known for o in b.outputs)]

    def new_tensor(like: Tensor, shape, data=None, suffix="") -> int:
        return edit.add(like, f"{like.name}{suffix}", shape, data)

    for trip, body_vals in enumerate(static_trips(op, cond, body, runtime, static, values)):
        if len(new_ops) + len(dynamic_ops) > MAX_OPS:
            raise NotUnrollable(f"more than {MAX_OPS} ops")
        where: dict[int, int] = {body.inputs[j]: state[j] for j in range(n) if j not in static}

        def parent_of(bt: int) -> int:
            if bt < 0:
                return bt
            if bt in where:
                return where[bt]
            t = body.tensors[bt]
            if t.data is not None:  # a true constant: one parent tensor for every iteration
                if bt not in body_consts:
                    body_consts[bt] = new_tensor(t, t.shape, t.data, suffix="")
                return body_consts[bt]
            if bt in known:  # static this iteration: its value becomes a constant
                v = np.asarray(body_vals[bt])
                where[bt] = new_tensor(t, v.shape, v, suffix=f"@{trip}")
                return where[bt]
            raise NotUnrollable(f"body tensor {bt} has no producer")

        for b in dynamic_ops:
            ins = tuple(parent_of(i) for i in b.inputs)
            outs = []
            for o in b.outputs:
                v = body_vals[o]
                shape = np.shape(v) if v is not None else body.tensors[o].shape
                where[o] = new_tensor(body.tensors[o], shape, suffix=f"@{trip}")
                outs.append(where[o])
            new_ops.append(replace(b, inputs=ins, outputs=tuple(outs)))
        state = [None if j in static else parent_of(body.outputs[j]) for j in range(n)]
    # the WHILE's outputs: constants for static variables, the last iteration's tensors otherwise
    for j, out in enumerate(op.outputs):
        if out < 0:
            continue
        if j in static:
            edit.fix(out, values[j])
        else:
            new_ops.extend(edit.result(out, state[j]))
    return new_ops
