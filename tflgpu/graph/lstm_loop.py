"""A Keras LSTM's time loop, a WHILE whose body is one LSTM cell, as one UNIDIRECTIONAL_SEQUENCE_LSTM.

Keras 3 converts an LSTM layer into a WHILE over the time steps: the body gathers x[t], multiplies it and the
previous h by the kernel and the recurrent kernel (two FULLY_CONNECTEDs), adds the bias, splits the sum into
four gates and applies them: c = f*c + i*g, h = o*tanh(c). Unrolled (``graph.unroll``), that is about eight
kernels a step; as the fused op it is one launch for the whole sequence (``kernels.recurrent``).

A loop is rewritten only when its body is exactly that cell: a trip count fixed by constants, step t gathering
x[t] along the first axis for t = 0..N-1, constant weights and initial state, sigmoid gates and a TANH cell
activation (in any gate order: the weights are reordered to TFLite's i, f, g, o), and nothing after the loop
reading the final c. The fused op's state inputs are those constants, not variables, so every invoke starts
from them as the loop did (the LSTM kernels read a non-variable state as the initial state and leave it as it
is). The loop's h results become the last step of the op's output sequence. Pure IR.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..model.ir import Operator, Subgraph
from .unroll import LoopEdit, NotUnrollable, loop_plan, rewrite_loops, static_trips

log = logging.getLogger("tflgpu")

LSTM_OP, LSTM_CODE = "UNIDIRECTIONAL_SEQUENCE_LSTM", 44
TANH_ACTIVATION = 4  # TFLite's fused-activation code of the cell's activation


class NotACell(NotUnrollable):
    """A loop that is not one LSTM cell a step (it may still be unrolled)."""


@dataclass(frozen=True)
class LstmCell:
    """What a loop body matched: the loop-variable slots and the weights in TFLite's gate order (i, f, g, o)."""

    x_slot: int  # the sequence, time-major [N, batch, features], passed through unchanged
    h_slot: int
    c_slot: int
    out_slots: tuple[int, ...]  # other slots whose next value is h (maybe reshaped)
    index: int  # the body tensor GATHER takes its row index from (a static one)
    wx: np.ndarray  # [4U, features]
    wh: np.ndarray  # [4U, U]
    bias: np.ndarray  # [4U]


def _ops_by_output(sg: Subgraph) -> dict[int, Operator]:
    return {t: op for op in sg.operators for t in op.outputs if t >= 0}


def match_cell(body: Subgraph, static: set[int], known: set[int], values: dict) -> LstmCell:
    """The LSTM cell ``body`` computes (``known``: its tensors fixed by constants and the ``static`` loop
    variables; ``values``: their host values in one iteration), or NotACell naming what differs."""
    producer = _ops_by_output(body)
    readers: dict[int, list[Operator]] = {}
    dynamic = [op for op in body.operators if not all(o in known for o in op.outputs)]
    for op in dynamic:
        for t in set(op.inputs):
            if t >= 0:
                readers.setdefault(t, []).append(op)
    used: set[int] = set()  # op indices matched

    def only_reader(t: int, name: str) -> Operator:
        rs = readers.get(t, [])
        if len(rs) != 1 or rs[0].name != name:
            raise NotACell(f"tensor {t} is not read by one {name} alone")
        return rs[0]

    def plain(op: Operator) -> Operator:
        if op.options.get("fused_activation_function", 0):
            raise NotACell(f"{op.name} {op.index} has a fused activation")
        used.add(op.index)
        return op

    def other(op: Operator, t: int) -> int:
        a, b = op.inputs[:2]
        return b if a == t else a

    def const(t: int) -> np.ndarray:
        if t < 0 or t not in known or values.get(t) is None:
            raise NotACell(f"tensor {t} is not a constant")
        return np.asarray(values[t])

    splits = [op for op in dynamic if op.name == "SPLIT"]
    if len(splits) != 1 or len(splits[0].outputs) != 4:
        raise NotACell("no four-way SPLIT of the gates")
    split = plain(splits[0])
    z = split.inputs[1]
    z_shape = body.tensors[z].shape
    if len(z_shape) != 2 or int(const(split.inputs[0]).reshape(-1)[0]) % 2 != 1:
        raise NotACell("the gates are not split along the last axis of a [batch, 4 * units] sum")
    batch, units = z_shape[0], z_shape[1] // 4
    gates = {}
    for k, t in enumerate(split.outputs):
        act = plain(readers[t][0]) if len(readers.get(t, [])) == 1 else None
        if act is None or act.name not in ("LOGISTIC", "TANH"):
            raise NotACell(f"gate {k} is not one LOGISTIC / TANH")
        gates[k] = act
    tanh_gates = [k for k, a in gates.items() if a.name == "TANH"]
    if len(tanh_gates) != 1:
        raise NotACell("not one TANH gate and three sigmoid gates")
    k_g = tanh_gates[0]
    gate_of = {a.outputs[0]: k for k, a in gates.items()}
    # i * g, then c' = f * c + i * g, then h' = o * tanh(c')
    mul_ig = plain(only_reader(gates[k_g].outputs[0], "MUL"))
    k_i = gate_of.get(other(mul_ig, gates[k_g].outputs[0]))
    add_c = plain(only_reader(mul_ig.outputs[0], "ADD"))
    mul_fc = producer.get(other(add_c, mul_ig.outputs[0]))
    if k_i is None or k_i == k_g or mul_fc is None or mul_fc.name != "MUL":
        raise NotACell("the cell update is not f * c + i * g")
    plain(mul_fc)
    f_side = [t for t in mul_fc.inputs[:2] if t in gate_of and gate_of[t] not in (k_i, k_g)]
    if len(f_side) != 1:
        raise NotACell("the cell update is not f * c + i * g")
    k_f, c_in = gate_of[f_side[0]], other(mul_fc, f_side[0])
    c_new = add_c.outputs[0]
    tanh_c = next((r for r in readers.get(c_new, []) if r.name == "TANH"), None)
    if tanh_c is None:
        raise NotACell("h does not take tanh(c)")
    plain(tanh_c)
    mul_h = plain(only_reader(tanh_c.outputs[0], "MUL"))
    k_o = gate_of.get(other(mul_h, tanh_c.outputs[0]))
    if k_o is None or k_o in (k_i, k_f, k_g):
        raise NotACell("h is not o * tanh(c)")
    h_new = mul_h.outputs[0]
    if readers.get(c_new, []) != [tanh_c] or len(readers.get(h_new, [])) > 1:
        raise NotACell("the new c or h is read by other ops")

    # the gates' sum: the input and recurrent products and bias vectors, through ADDs and layout reshapes
    fcs, biases = [], []

    def terms(t: int) -> None:
        if t in known:
            biases.append(const(t).reshape(-1))
            return
        op = producer.get(t)
        if op is not None and op.name == "ADD":
            plain(op)
            terms(op.inputs[0])
            terms(op.inputs[1])
        elif op is not None and op.name == "RESHAPE" and body.tensors[op.inputs[0]].shape[-1:] == (4 * units,):
            used.add(op.index)
            terms(op.inputs[0])
        elif op is not None and op.name == "FULLY_CONNECTED":
            fcs.append(plain(op))
        else:
            raise NotACell(f"tensor {t} of the gates' sum is not a product, a bias or a sum")

    terms(z)
    if len(fcs) != 2 or any(b.size != 4 * units for b in biases):
        raise NotACell("the gates' sum is not x W + h U + bias")
    inputs = {body.inputs[j]: j for j in range(len(body.inputs)) if j not in static}
    x_fc = next((fc for fc in fcs if fc.inputs[0] not in inputs), None)
    h_fc = next((fc for fc in fcs if fc.inputs[0] in inputs), None)
    if x_fc is None or h_fc is None:
        raise NotACell("not one product with the gathered step and one with the previous h")
    for fc in fcs:
        if len(fc.inputs) > 2 and fc.inputs[2] >= 0:
            biases.append(const(fc.inputs[2]).reshape(-1))
        if fc.options.get("weights_format", 0) or fc.options.get("keep_num_dims", False):
            raise NotACell("a product in another weights format")
    gather = producer.get(x_fc.inputs[0])
    if (gather is None or gather.name != "GATHER" or gather.options.get("axis", 0) != 0
            or gather.options.get("batch_dims", 0) != 0 or gather.inputs[0] not in inputs
            or gather.inputs[1] not in known or body.tensors[gather.outputs[0]].shape[0] != batch):
        raise NotACell("the step's input is not the sequence's row at the counter")
    used.add(gather.index)
    wx, wh = const(x_fc.inputs[1]), const(h_fc.inputs[1])
    h_in = h_fc.inputs[0]
    if wx.shape[0] != 4 * units or wh.shape != (4 * units, units) or body.tensors[h_in].shape != (batch, units):
        raise NotACell("weights of other shapes")

    # loop variables: the sequence, h, c, and outputs taking h's new value
    x_slot, h_slot, c_slot = inputs[gather.inputs[0]], inputs[h_in], inputs.get(c_in)
    if c_slot is None or body.outputs[c_slot] != c_new or body.outputs[h_slot] != h_new \
            or body.outputs[x_slot] != gather.inputs[0]:
        raise NotACell("the loop does not carry h, c and the sequence")
    out_slots = []
    for j in range(len(body.inputs)):
        if j in static or j in (x_slot, h_slot, c_slot):
            continue
        t = body.outputs[j]
        op = producer.get(t)
        if op is not None and op.name == "RESHAPE" and op.inputs[0] == h_new:
            used.add(op.index)
        elif t != h_new:
            raise NotACell(f"loop variable {j} is not h")
        if body.inputs[j] in readers:
            raise NotACell(f"loop variable {j} is read in the body")
        out_slots.append(j)
    if {op.index for op in dynamic} != used:
        raise NotACell("the body computes more than one LSTM cell")
    floats = {t for op in dynamic for t in (*op.inputs, *op.outputs) if t >= 0 and t not in known}
    if any(body.tensors[t].dtype != np.float32 for t in floats) \
            or any(w.dtype != np.float32 for w in (wx, wh, *biases)):
        raise NotACell("the cell is not float32 (a quantized cell keeps its ops)")
    order = [k_i, k_f, k_g, k_o]

    def gate_rows(w: np.ndarray) -> np.ndarray:
        return np.concatenate([w[k * units:(k + 1) * units] for k in order], axis=0).astype(np.float32)

    return LstmCell(x_slot, h_slot, c_slot, tuple(out_slots), gather.inputs[1], gate_rows(wx), gate_rows(wh),
                    gate_rows(np.sum(biases, axis=0) if biases else np.zeros(4 * units, np.float32)))


def fuse_lstm_loops(sg: Subgraph, runtime, consts: dict) -> tuple[Subgraph, int]:
    """``sg`` with each WHILE that runs one LSTM cell a step replaced by a UNIDIRECTIONAL_SEQUENCE_LSTM (new
    tensors appended, existing indices kept); the count replaced."""
    readers = {t for op in sg.operators for t in op.inputs} | set(sg.outputs)
    producer = _ops_by_output(sg)

    def fuse(op: Operator, edit: LoopEdit) -> list[Operator]:
        fused = _fuse_one(op, runtime, consts, edit, readers, producer)
        log.info("WHILE at op %d: an LSTM time loop, one %s", op.index, LSTM_OP)
        return fused

    return rewrite_loops(sg, fuse, "is not an LSTM time loop")


def _fuse_one(op: Operator, runtime, consts: dict, edit: LoopEdit, readers: set[int],
              producer: dict[int, Operator]) -> list[Operator]:
    model = runtime.model
    cond = model.subgraphs[op.options["cond_subgraph_index"]]
    body = model.subgraphs[op.options["body_subgraph_index"]]
    static, known = loop_plan(op, cond, body, consts)
    values = [consts.get(t) for t in op.inputs]
    trips = []
    cell = None
    for body_vals in static_trips(op, cond, body, runtime, static, values):
        if cell is None:
            cell = match_cell(body, static, known, dict(enumerate(body_vals)))
        trips.append(int(np.asarray(body_vals[cell.index]).reshape(-1)[0]))
    if cell is None:
        raise NotACell("the loop runs no iteration")
    tensors = edit.tensors
    x = op.inputs[cell.x_slot]
    steps, batch, units = len(trips), *tensors[op.inputs[cell.h_slot]].shape[-2:]
    if (trips != list(range(steps)) or tensors[x].shape != (steps, batch, cell.wx.shape[1])
            or tensors[x].dtype != np.float32):
        raise NotACell("the steps do not read the sequence's rows in order, each once")
    h0, c0 = consts.get(op.inputs[cell.h_slot]), consts.get(op.inputs[cell.c_slot])
    if h0 is None or c0 is None:
        raise NotACell("the initial state is not constant")
    if op.outputs[cell.c_slot] in readers:
        raise NotACell("the final c is read after the loop")
    like = tensors[x]
    # one sequence made time-major by a reshape of a batch-major one (Keras's transpose, for a batch of one: the
    # same elements in the same order): the op reads the batch-major one, and the reshape is left to no reader
    source, time_major = x, True
    made = producer.get(x)
    if batch == 1 and made is not None and made.name == "RESHAPE" \
            and tensors[made.inputs[0]].shape == (1, steps, cell.wx.shape[1]):
        source, time_major = made.inputs[0], False

    prefix = tensors[op.outputs[cell.h_slot]].name

    def new(name: str, shape) -> int:
        return edit.add(like, f"{prefix}/{name}", shape, quantization=None)

    def const(name: str, value) -> int:
        return edit.const(like, f"{prefix}/{name}", value)

    def blocks(w: np.ndarray, what: str) -> list[int]:
        return [const(f"{what}_{g}", np.ascontiguousarray(w[k * units:(k + 1) * units])) for k, g in enumerate("ifgo")]

    wx, wh, bias = blocks(cell.wx, "wx"), blocks(cell.wh, "wh"), blocks(cell.bias, "bias")
    h_init = const("h0", np.asarray(h0, np.float32).reshape(batch, units))
    c_init = const("c0", np.asarray(c0, np.float32).reshape(batch, units))
    seq_shape = (steps, batch, units) if time_major else (batch, steps, units)
    seq, last = new("sequence", seq_shape), new("h", (batch, units))
    begin = [steps - 1, 0, 0] if time_major else [0, steps - 1, 0]
    new_ops = [Operator(-1, LSTM_OP, LSTM_CODE, 1,
                        (source, *wx, *wh, -1, -1, -1, *bias, -1, -1, h_init, c_init, -1, -1, -1, -1), (seq,),
                        options={"fused_activation_function": TANH_ACTIVATION, "cell_clip": 0.0, "proj_clip": 0.0,
                                 "time_major": time_major, "asymmetric_quantize_inputs": False}),
               Operator(-1, "STRIDED_SLICE", 45, 1,  # (the last step: its h)
                        (seq, const("begin", np.array(begin, np.int32)), const("end", np.array(seq_shape, np.int32)),
                         const("strides", np.array([1, 1, 1], np.int32))), (last,),
                        options={"begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0, "new_axis_mask": 0,
                                 "shrink_axis_mask": 1 if time_major else 2, "offset": False})]
    for j, out in enumerate(op.outputs):
        if out < 0 or out not in readers:
            continue
        if j in static:  # (a counter read after the loop: its final value)
            edit.fix(out, values[j])
        elif j == cell.x_slot:
            new_ops.extend(edit.result(out, x))
        else:  # (h, maybe reshaped)
            new_ops.extend(edit.result(out, last, reshape=tensors[out].shape != (batch, units)))
    return new_ops
