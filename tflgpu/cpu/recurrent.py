"""LSTM (one step) and UNIDIRECTIONAL_SEQUENCE_LSTM, with peepholes, CIFG, projection,
layer normalization and clipping, as TFLite's float kernels define them; the basic RNN (RNN, one step, and
UNIDIRECTIONAL_SEQUENCE_RNN) with float weights; BIDIRECTIONAL_SEQUENCE_LSTM and _RNN (a forward and a backward
cell, with TFLite's auxiliary input). (SVDF: cpu.svdf.)

State tensors (inputs 18 and 19 of an LSTM) are variables: the final state is written
back into them, so it carries over to the next invoke, as in LiteRT. A state
that is not a variable (graph.lstm_loop's rewrite of a Keras loop: constants)
is the initial state of every invoke, read and left as it is.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

import numpy as np

from ..ops.jit import njit, readonly
from .conv import _float_weights
from .hybrid import HybridWeights, accumulate_product, is_hybrid, quantize_row
from .registry import KernelError, OpContext, apply_activation, register
from .vecmath import sigmoid_into, tanh_into

LAYER_NORM_EPS = 1e-8


ACTIVATIONS = (0, 1, 2, 3, 4, 6)  # none, RELU, RELU_N1_TO_1, RELU6, TANH, SIGMOID (TANH and SIGMOID apply here)


@njit(cache=True)
def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + np.exp(-x))  # (float64: exp overflows to inf, giving 0)


@njit(cache=True)
def _act(x: float, code: int) -> float:
    """The LSTM's gate/cell activation: unlike fused activations, TANH and SIGMOID apply here."""
    if code == 1:
        return max(x, 0.0)
    if code == 2:
        return min(max(x, -1.0), 1.0)
    if code == 3:
        return min(max(x, 0.0), 6.0)
    if code == 4:
        return np.tanh(x)
    if code == 6:
        return _sigmoid(x)
    return x


@njit(cache=True)
def _act_into(v, code: int, e, t, bits) -> None:
    """_act over a float32 array, in place."""
    if code == 4:
        tanh_into(v, e, t, bits)
    elif code == 6:
        sigmoid_into(v, e, t, bits)
    else:
        for i in range(v.size):
            v[i] = _act(v[i], code)


@njit(cache=True)
def _normalize(g, lo: int, units: int, coeff, use: bool) -> None:
    """Layer normalization of one gate's pre-activations g[lo:lo+units], in place."""
    if not use:
        return
    mean = 0.0
    for k in range(units):
        mean += g[lo + k]
    mean /= units
    var = 0.0
    for k in range(units):
        var += (g[lo + k] - mean) ** 2
    inv = 1.0 / np.sqrt(var / units + LAYER_NORM_EPS)
    for k in range(units):
        g[lo + k] = (g[lo + k] - mean) * inv * coeff[k]


@njit(cache=True)
def _recurrence(xw, wh, bias, peep, ln, proj, proj_bias, flags, hy_r, hy_p, act, cell_clip, proj_clip, h, c, outs):
    """Every time step of an LSTM: ``xw`` [T, B, G*U] is the input's contribution (x @ wx, one product for
    all steps), ``h`` [B, out] and ``c`` [B, U] the state, updated in place; ``outs`` [T, B, out] gets each
    step's h. Gates in TFLite's order (i, f, c, o; CIFG: f, c, o and i = 1 - f). ``flags``: CIFG, peephole
    i / f / o, layer norm, projection, projection bias, hybrid, asymmetric; ``peep`` [3, U] and ``ln`` [4, U] by
    gate. Hybrid: the hidden state's rows (and the projection's input) quantized each step, their products with
    the int8 recurrent (projection) weights ``hy_r`` (``hy_p``: values, scales, row sums) as LiteRT's hybrid
    kernel takes them; ``xw`` then holds the bias too (without layer norm), added first as LiteRT adds it."""
    steps, batch, width = xw.shape
    units = c.shape[1]
    n_out = h.shape[1]
    cifg, pi_on, pf_on, po_on, ln_on, proj_on, pbias_on = (flags[0], flags[1], flags[2], flags[3], flags[4],
                                                           flags[5], flags[6])
    hybrid, asymmetric = flags[7], flags[8]
    q_h, q_hid = np.empty(n_out, np.int32), np.empty(units, np.int32)
    gi, gf, gc, go = (-1, 0, units, 2 * units) if cifg else (0, units, 2 * units, 3 * units)
    pre = np.empty(width, np.float32)
    hid = np.empty(units, np.float32)
    zf, zi, zg, zo = (np.empty(units, np.float32), np.empty(units, np.float32), np.empty(units, np.float32),
                      np.empty(units, np.float32))
    scratch, scratch2 = np.empty(units, np.float32), np.empty(units, np.float32)
    bits = np.empty(units, np.int32)
    for t in range(steps):
        for b in range(batch):
            for j in range(width):
                pre[j] = xw[t, b, j]
            if hybrid:
                scale, zp = quantize_row(h[b], q_h, asymmetric)
                accumulate_product(pre, q_h, scale, zp, hy_r[0], hy_r[1], hy_r[2])
            else:
                for k in range(n_out):
                    hk = h[b, k]
                    if hk != 0.0:
                        for j in range(width):
                            pre[j] += hk * wh[k, j]
            if not cifg:
                if pi_on:
                    for u in range(units):
                        pre[gi + u] += c[b, u] * peep[0, u]
                _normalize(pre, gi, units, ln[0], ln_on)
            if pf_on:
                for u in range(units):
                    pre[gf + u] += c[b, u] * peep[1, u]
            _normalize(pre, gf, units, ln[1], ln_on)
            _normalize(pre, gc, units, ln[2], ln_on)
            for u in range(units):  # (each gate's activations as one vector loop)
                zf[u] = pre[gf + u] + bias[gf + u]
                zg[u] = pre[gc + u] + bias[gc + u]
                if not cifg:
                    zi[u] = pre[gi + u] + bias[gi + u]
            sigmoid_into(zf, scratch, scratch2, bits)
            _act_into(zg, act, scratch, scratch2, bits)
            if not cifg:
                sigmoid_into(zi, scratch, scratch2, bits)
            for u in range(units):
                f = zf[u]
                i = np.float32(1.0) - f if cifg else zi[u]
                cn = f * c[b, u] + i * zg[u]
                if cell_clip > 0:
                    cn = min(max(cn, -cell_clip), cell_clip)
                c[b, u] = cn
                if po_on:
                    pre[go + u] += cn * peep[2, u]
            _normalize(pre, go, units, ln[3], ln_on)
            for u in range(units):
                zo[u] = pre[go + u] + bias[go + u]
                hid[u] = c[b, u]
            sigmoid_into(zo, scratch, scratch2, bits)
            _act_into(hid, act, scratch, scratch2, bits)
            for u in range(units):
                hid[u] *= zo[u]
            if proj_on and hybrid:
                for k in range(n_out):
                    h[b, k] = proj_bias[k] if pbias_on else 0.0
                scale, zp = quantize_row(hid, q_hid, asymmetric)
                accumulate_product(h[b], q_hid, scale, zp, hy_p[0], hy_p[1], hy_p[2])
                if proj_clip > 0:
                    for k in range(n_out):
                        h[b, k] = min(max(h[b, k], -proj_clip), proj_clip)
            elif proj_on:
                for k in range(n_out):
                    s = proj_bias[k] if pbias_on else 0.0
                    for u in range(units):
                        s += proj[k, u] * hid[u]
                    if proj_clip > 0:
                        s = min(max(s, -proj_clip), proj_clip)
                    h[b, k] = s
            else:
                for u in range(units):
                    h[b, u] = hid[u]
            for k in range(n_out):
                outs[t, b, k] = h[b, k]


class _LstmCell:
    """An LSTM's constant weights. ``shift``: where the op's inputs hold them past the unidirectional op's places
    (1 to 17): a bidirectional LSTM's backward cell is 17 places on; ``layer_norm``: whether inputs 20 to 23 are
    the layer-norm coefficients (the bidirectional op has none)."""

    def __init__(self, ctx: OpContext, shift: int = 0, layer_norm: bool = True):
        w = lambda i: _float_weights(ctx, i + shift) if ctx.has_input(i + shift) else None
        self.cifg = not ctx.has_input(1 + shift)
        gates = ([] if self.cifg else [1]) + [2, 3, 4]
        rgates = ([] if self.cifg else [5]) + [6, 7, 8]
        self.gates = gates
        for i in gates + rgates:
            if ctx.const(i + shift) is None:
                raise ctx.fail(f"LSTM weight input {i + shift} must be constant")
        self.wx = np.concatenate([w(i) for i in gates], axis=0).T.astype(np.float32)  # [in, G*units]
        self.wh = np.ascontiguousarray(np.concatenate([w(i) for i in rgates], axis=0).T, np.float32)  # [out, G*U]
        self.units = units = ctx.input_tensor(2 + shift).shape[0]
        peeps = [w(i) for i in (9, 10, 11)]
        layer_norm = ([w(i) for i in (20, 21, 22, 23)] if layer_norm and len(ctx.op.inputs) > 20
                      else [None] * 4)
        bias = [w(i) for i in ([] if self.cifg else [12]) + [13, 14, 15]]
        self.bias = np.concatenate([b if b is not None else np.zeros(units, np.float32) for b in bias]).astype(
            np.float32)
        proj, proj_bias = w(16), w(17)
        self.n_out = proj.shape[0] if proj is not None else units
        if self.wh.shape[0] != self.n_out or self.wx.shape[1] != self.wh.shape[1] or self.bias.size != self.wh.shape[1]:
            raise ctx.fail("LSTM weights of inconsistent sizes")

        def rows(vs):  # per-gate vectors (peepholes, layer norm) as rows; an absent one is zeros (and off)
            for v in vs:
                if v is not None and v.size != units:
                    raise ctx.fail(f"LSTM peephole / layer-norm weights of {v.size} values, expected {units}")
            return np.stack([np.zeros(units, np.float32) if v is None else v.reshape(-1).astype(np.float32)
                             for v in vs])

        self.peep, self.ln = rows(peeps), rows(layer_norm)
        self.proj = (np.ascontiguousarray(proj, np.float32) if proj is not None
                     else np.zeros((0, units), np.float32))
        self.proj_bias = proj_bias.astype(np.float32) if proj_bias is not None else np.zeros(0, np.float32)
        # hybrid (int8 weights, float input): LiteRT's quantized products, the bias first where no layer norm
        self.hybrid = is_hybrid(ctx, 2 + shift)
        self.asymmetric = bool(ctx.opt("asymmetric_quantize_inputs", False))
        self.layer_norm = any(v is not None for v in layer_norm)
        self.shift = shift
        empty = (np.zeros((0, 0), np.int32), np.zeros(0, np.float32), np.zeros(0, np.int32))
        hy_r = hy_p = empty
        if self.hybrid:
            self.xq = HybridWeights.of(ctx, [i + shift for i in gates])
            hy_r = astuple(HybridWeights.of(ctx, [i + shift for i in rgates]))
            if proj is not None:
                hy_p = astuple(HybridWeights.of(ctx, [16 + shift]))
        self.flags = np.array([self.cifg, *(v is not None for v in peeps), self.layer_norm, proj is not None,
                               proj_bias is not None, self.hybrid, self.asymmetric], np.bool_)
        end_bias = np.zeros_like(self.bias) if self.hybrid and not self.layer_norm else self.bias
        # (read-only, as the recurrence kernel takes them: one compile whichever way they were made)
        self.weights = (*map(readonly, (self.wh, end_bias, self.peep, self.ln, self.proj, self.proj_bias,
                                        self.flags)), tuple(map(readonly, hy_r)), tuple(map(readonly, hy_p)))
        self.act = ctx.opt("fused_activation_function", 4)
        if self.act not in ACTIVATIONS:
            raise ctx.fail(f"LSTM activation {self.act} is not supported")
        self.cell_clip = float(ctx.opt("cell_clip", 0.0) or 0.0)
        self.proj_clip = float(ctx.opt("proj_clip", 0.0) or 0.0)

    def aux_weights(self, ctx: OpContext, inputs: tuple[int, ...]) -> np.ndarray | HybridWeights:
        """The auxiliary input's weights at ``inputs`` (per gate, absent ones skipped): float [G*U, aux], or
        int8 ones for the hybrid arithmetic."""
        present = [i for i in inputs if ctx.has_input(i)]
        if len(present) != len(self.gates):
            raise ctx.fail(f"{len(present)} auxiliary input weights for a cell of {len(self.gates)} gates")
        if self.hybrid:
            return HybridWeights.of(ctx, present)
        return np.concatenate([_float_weights(ctx, i) for i in present], axis=0).astype(np.float32)

    def input_part(self, x: np.ndarray, aux: np.ndarray | None = None, aux_weights=None) -> np.ndarray:
        """What the input ``x`` [T, B, n] (and an auxiliary input) add to the gates before the recurrence, [T, B,
        G*U]: float products; hybrid, the bias (where no layer norm) plus the products of each step's rows
        quantized, in LiteRT's order."""
        steps, batch = x.shape[:2]
        rows = x.reshape(steps * batch, -1)
        if self.hybrid:
            part = self.xq.product(rows, self.asymmetric)
            if not self.layer_norm:
                part = self.bias + part
            if aux is not None:
                part = part + aux_weights.product(aux.reshape(steps * batch, -1), self.asymmetric)
        else:
            part = rows @ self.wx
            if aux is not None:
                part += aux.reshape(steps * batch, -1) @ aux_weights.T
        return part.reshape(steps, batch, -1)

    def run(self, xw: np.ndarray, h: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Every step of ``xw`` [T, B, G*U] (``input_part``); ``h`` and ``c`` are updated in place; returns h
        of every step, [T, B, out]."""
        if h.shape[1] != self.n_out or c.shape[1] != self.units:
            raise KernelError(f"LSTM state of shape {list(h.shape)} / {list(c.shape)}, the weights need "
                              f"[batch, {self.n_out}] / [batch, {self.units}]")
        outs = np.empty((xw.shape[0], xw.shape[1], self.n_out), np.float32)
        _recurrence(np.ascontiguousarray(xw, np.float32), *self.weights, self.act, self.cell_clip, self.proj_clip, h, c,
                    outs)
        return outs


def _read_state(xs, cell: _LstmCell, batch: int, at: tuple[int, int] = (18, 19)) -> tuple[np.ndarray, np.ndarray]:
    """Copies of the state variables (inputs ``at``: h, c) as [batch, width]; the kernel updates them in place. A
    state not of the input's batch is the op's failure, as in LiteRT ("NumElements(output_state) != n_batch *
    n_output"): a resize of the input's batch (to 0 too) leaves the model's state variables as they are."""
    h, c = np.array(xs[at[0]], np.float32), np.array(xs[at[1]], np.float32)
    for what, state, width in (("output state", h, cell.n_out), ("cell state", c, cell.units)):
        if state.size != batch * width:
            raise KernelError(f"the {what} holds {state.size} values where a batch of {batch} needs {batch} x {width}: "
                              f"the model's state variables are of another batch than the input")
    return h.reshape(batch, cell.n_out), c.reshape(batch, cell.units)


def _stateful(ctx: OpContext, at: tuple[int, int] = (18, 19)) -> bool:
    """Whether the op's state inputs are variables (written back after a run), not a constant initial state."""
    return all(ctx.op.inputs[i] >= 0 and ctx.subgraph.tensors[ctx.op.inputs[i]].is_variable for i in at)


def _write_state(xs, h, c, at: tuple[int, int] = (18, 19)):
    for idx, v in zip(at, (h, c)):
        dst = xs[idx]
        if dst is not None and dst.flags.writeable and dst.shape == v.shape:
            np.copyto(dst, v)


def _steps_first(xs, name: str, time_major: bool) -> np.ndarray:
    """A sequence op's input as [time, batch, features], float32."""
    x = np.asarray(xs[0], np.float32)
    if x.ndim != 3:
        raise KernelError(f"{name}: input must be 3-D, got shape {list(x.shape)}")
    return x if time_major else np.swapaxes(x, 0, 1)


@register("UNIDIRECTIONAL_SEQUENCE_LSTM")
def unidirectional_sequence_lstm(ctx: OpContext):
    cell = _LstmCell(ctx)
    time_major = ctx.opt("time_major", False)
    stateful = _stateful(ctx)

    def run(xs):
        x = _steps_first(xs, ctx.op.name, time_major)
        h, c = _read_state(xs, cell, x.shape[1])
        outs = cell.run(cell.input_part(x), h, c)
        if stateful:
            _write_state(xs, h, c)
        if not time_major:
            outs = np.ascontiguousarray(np.swapaxes(outs, 0, 1))
        return [outs]

    return run


@register("LSTM")
def lstm(ctx: OpContext):
    if ctx.opt("kernel_type", 0) == 1:
        raise ctx.fail("the BASIC LSTM kernel type is not supported")
    cell = _LstmCell(ctx)

    def run(xs):
        x = np.asarray(xs[0], np.float32)
        batch = x.shape[0]
        h, c = _read_state(xs, cell, batch)
        cell.run(cell.input_part(x.reshape(1, batch, -1)), h, c)
        _write_state(xs, h, c)
        return [h] if len(ctx.op.outputs) == 1 else [np.zeros(0, np.float32), h, c, h][: len(ctx.op.outputs)]

    return run


# -- RNN / UNIDIRECTIONAL_SEQUENCE_RNN: h = act(x W^T + h R^T + b) -----------------------------------------------


def _rnn_activation(x: np.ndarray, code: int) -> np.ndarray:
    """A basic RNN's fused activation (TFLite's ApplyActivationToVector): TANH, SIGMOID, else the RELU family's
    clamp."""
    if code == 4:
        return np.tanh(x)
    if code == 6:
        return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)
    return apply_activation(x, code)


class _RnnCell:
    """A basic RNN's constant weights [units, inputs], recurrent weights [units, units], bias [units] and its
    hidden state: a variable carried across invokes, or a constant initial state. ``first``: the weights'
    input (the state is three on); a bidirectional RNN's backward cell starts at 5. Int8 weights with a float
    input: LiteRT's hybrid arithmetic (each step's input and hidden state quantized per row)."""

    def __init__(self, ctx: OpContext, first: int = 1):
        self.act = int(ctx.opt("fused_activation_function", 0))
        if self.act not in ACTIVATIONS:
            raise ctx.fail(f"fused activation {self.act} is not one a basic RNN applies")
        self.hybrid = is_hybrid(ctx, first)
        self.asymmetric = bool(ctx.opt("asymmetric_quantize_inputs", False))
        for i, what in ((first, "weights"), (first + 1, "recurrent weights"), (first + 2, "bias")):
            t = ctx.input_tensor(i)
            if t is None or ctx.const(i) is None:
                raise ctx.fail(f"its {what} (input {i}) must be a constant")
            if t.dtype != (np.int8 if self.hybrid and i < first + 2 else np.float32):
                raise ctx.fail(f"its {what} are {t.type_name}: a basic RNN takes float32 weights, or int8 ones "
                               "with a float32 bias (dynamic-range)")
        self.w, self.r, self.b = (_float_weights(ctx, i) for i in (first, first + 1, first + 2))
        self.units = self.w.shape[0]
        if self.r.shape != (self.units, self.units) or self.b.shape != (self.units,):
            raise ctx.fail(f"weights {list(self.w.shape)}, recurrent weights {list(self.r.shape)} and bias "
                           f"{list(self.b.shape)} do not fit {self.units} units")
        if self.hybrid:
            self.wq, self.rq = HybridWeights.of(ctx, [first]), HybridWeights.of(ctx, [first + 1])
        self.state_input = first + 3
        state = ctx.input_tensor(self.state_input)
        self.stateful = state is not None and state.is_variable

    def state(self, xs, batch: int) -> np.ndarray:
        h = np.array(xs[self.state_input], np.float32)
        if h.size != batch * self.units:
            raise KernelError(f"the hidden state holds {h.size} values where a batch of {batch} needs {batch} x "
                              f"{self.units}: the model's state variable is of another batch than the input")
        return h.reshape(batch, self.units)

    def aux_weights(self, ctx: OpContext, inputs: tuple[int, ...] | None):
        """The auxiliary input's weights (input ``inputs[0]``): float [units, aux], or int8 ones (hybrid)."""
        if inputs is None:
            return None
        if self.hybrid:
            return HybridWeights.of(ctx, list(inputs))
        return _float_weights(ctx, inputs[0])

    def _product(self, x: np.ndarray, weights) -> np.ndarray:
        """``x`` [time, batch, n] through ``weights`` [units, n] (float, or int8 ones on x's rows quantized)."""
        rows = x.reshape(-1, x.shape[-1])
        n = weights.values.shape[1] if self.hybrid else weights.shape[1]
        if x.shape[-1] != n:
            raise KernelError(f"an input of {x.shape[-1]} values per step for weights of {n}")
        part = weights.product(rows, self.asymmetric) if self.hybrid else rows @ weights.T
        return part.reshape(x.shape[0], x.shape[1], self.units)

    def input_part(self, x: np.ndarray, aux: np.ndarray | None = None, aux_weights=None) -> np.ndarray:
        """What the input ``x`` [time, batch, n] (and an auxiliary input) add per step, [time, batch, units];
        hybrid: with the bias, added first as LiteRT adds it."""
        part = self._product(x, self.wq if self.hybrid else self.w)
        if self.hybrid:
            part = self.b + part
        if aux is not None:
            part = part + self._product(aux, aux_weights)
        return part

    def steps(self, xw: np.ndarray, xs, reverse: bool = False) -> np.ndarray:
        """Outputs [time, batch, units] from ``input_part`` (``reverse``: last step first, each output in its
        step's place), the state read and written back."""
        h = self.state(xs, xw.shape[1])
        outs = np.empty_like(xw)
        for t in (range(xw.shape[0] - 1, -1, -1) if reverse else range(xw.shape[0])):
            if self.hybrid:
                pre = xw[t] + self.rq.product(h, self.asymmetric)
            else:
                pre = (self.b + xw[t]) + h @ self.r.T
            h = _rnn_activation(pre, self.act).astype(np.float32)
            outs[t] = h
        dst = xs[self.state_input]
        if self.stateful and dst is not None and dst.flags.writeable:
            np.copyto(dst, h.reshape(dst.shape))
        return outs


@register("RNN")
def rnn(ctx: OpContext):
    cell = _RnnCell(ctx)

    def run(xs):
        x = np.asarray(xs[0], np.float32)
        if x.ndim != 2:
            raise KernelError(f"RNN: input must be [batch, inputs], got {list(x.shape)}")
        return [cell.steps(cell.input_part(x[None]), xs)[0]]

    return run


@register("UNIDIRECTIONAL_SEQUENCE_RNN")
def unidirectional_sequence_rnn(ctx: OpContext):
    cell = _RnnCell(ctx)
    time_major = ctx.opt("time_major", False)

    def run(xs):
        x = _steps_first(xs, ctx.op.name, time_major)
        outs = cell.steps(cell.input_part(x), xs)
        return [outs if time_major else np.ascontiguousarray(np.swapaxes(outs, 0, 1))]

    return run


# -- BIDIRECTIONAL_SEQUENCE_RNN / _LSTM: a forward and a backward cell over the same sequence ----------------------


@dataclass(frozen=True)
class _Bidirectional:
    """What a bidirectional op's inputs and options say beyond its two cells: its auxiliary input (``aux``: its
    index, or None) and the two cells' weights for it (``fw_aux``, ``bw_aux``: input indices, or None), and how
    its outputs are laid out. TFLite's three cases: no auxiliary input, both cells read the input; an auxiliary
    input with weights, both cells read the input and add the auxiliary input's contribution (a stacked layer);
    an auxiliary input without weights, the backward cell reads it in place of the input."""

    aux: int | None
    fw_aux: tuple[int, ...] | None
    bw_aux: tuple[int, ...] | None
    time_major: bool
    merge_outputs: bool

    @classmethod
    def of(cls, ctx: OpContext, aux: int, fw_aux: tuple[int, ...], bw_aux: tuple[int, ...]) -> _Bidirectional:
        has_aux = ctx.has_input(aux)
        weighted = any(ctx.has_input(i) for i in fw_aux + bw_aux)
        if weighted and not has_aux:
            raise ctx.fail(f"auxiliary input weights without the auxiliary input (input {aux})")
        for i in fw_aux + bw_aux if weighted else ():
            if ctx.has_input(i) and ctx.const(i) is None:
                raise ctx.fail(f"auxiliary input weights (input {i}) must be constant")
        merge = bool(ctx.opt("merge_outputs", False))
        if len(ctx.op.outputs) != (1 if merge else 2):
            raise ctx.fail(f"{len(ctx.op.outputs)} outputs; merge_outputs={merge} needs {1 if merge else 2}")
        return cls(aux if has_aux else None, fw_aux if weighted else None, bw_aux if weighted else None,
                   bool(ctx.opt("time_major", False)), merge)

    def inputs(self, xs, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The forward cell's input, the backward cell's, and the auxiliary input the cells weigh (or None), each
        [time, batch, features]."""
        x = _steps_first(xs, name, self.time_major)
        if self.aux is None:
            return x, x, None
        aux = _steps_first([xs[self.aux]], name, self.time_major)
        if aux.shape[:2] != x.shape[:2]:
            raise KernelError(f"{name}: auxiliary input of shape {list(xs[self.aux].shape)} for an input of shape "
                              f"{list(xs[0].shape)}")
        return (x, x, aux) if self.fw_aux is not None else (x, aux, None)

    def outputs(self, fw: np.ndarray, bw: np.ndarray) -> list[np.ndarray]:
        """The cells' outputs [time, batch, *] in the op's layout: one output (concatenated) or two."""
        outs = [np.concatenate([fw, bw], axis=2)] if self.merge_outputs else [fw, bw]
        return outs if self.time_major else [np.ascontiguousarray(np.swapaxes(o, 0, 1)) for o in outs]


@register("BIDIRECTIONAL_SEQUENCE_RNN")
def bidirectional_sequence_rnn(ctx: OpContext):
    fw, bw = _RnnCell(ctx, 1), _RnnCell(ctx, 5)
    how = _Bidirectional.of(ctx, 9, (10,), (11,))
    fw_aux, bw_aux = fw.aux_weights(ctx, how.fw_aux), bw.aux_weights(ctx, how.bw_aux)

    def run(xs):
        x_fw, x_bw, aux = how.inputs(xs, ctx.op.name)
        fw_xw, bw_xw = fw.input_part(x_fw, aux, fw_aux), bw.input_part(x_bw, aux, bw_aux)
        return how.outputs(fw.steps(fw_xw, xs), bw.steps(bw_xw, xs, reverse=True))

    return run


@register("BIDIRECTIONAL_SEQUENCE_LSTM")
def bidirectional_sequence_lstm(ctx: OpContext):
    cells = _LstmCell(ctx, 0, layer_norm=False), _LstmCell(ctx, 17, layer_norm=False)
    states = (35, 36), (37, 38)
    how = _Bidirectional.of(ctx, 39, (40, 41, 42, 43), (44, 45, 46, 47))
    aux_weights = [cell.aux_weights(ctx, at) if at is not None else None
                   for cell, at in zip(cells, (how.fw_aux, how.bw_aux))]
    stateful = [_stateful(ctx, at) for at in states]

    def run(xs):
        x_fw, x_bw, aux = how.inputs(xs, ctx.op.name)
        outs = []
        for cell, x, w, at, keep, reverse in zip(cells, (x_fw, x_bw), aux_weights, states, stateful, (False, True)):
            h, c = _read_state(xs, cell, x.shape[1], at)
            xw = cell.input_part(x, aux, w)
            outs.append(cell.run(xw[::-1], h, c)[::-1] if reverse else cell.run(xw, h, c))
            if keep:
                _write_state(xs, h, c, at)
        return how.outputs(*outs)

    return run
