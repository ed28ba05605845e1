"""LSTM (one step) and UNIDIRECTIONAL_SEQUENCE_LSTM, with peepholes, CIFG, projection,
layer normalization and clipping, as TFLite's float kernels define them; the basic RNN (RNN, one step, and
UNIDIRECTIONAL_SEQUENCE_RNN) with float weights.

State tensors (inputs 18 and 19) are variables: the final state is written
back into them, so it carries over to the next invoke, as in LiteRT. A state
that is not a variable (graph.lstm_loop's rewrite of a Keras loop: constants)
is the initial state of every invoke, read and left as it is.
"""

from __future__ import annotations

import numpy as np

from ..ops.jit import njit, readonly
from .conv import _float_weights
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
def _recurrence(xw, wh, bias, peep, ln, proj, proj_bias, flags, act, cell_clip, proj_clip, h, c, outs):
    """Every time step of an LSTM: ``xw`` [T, B, G*U] is the input's contribution (x @ wx, one product for
    all steps), ``h`` [B, out] and ``c`` [B, U] the state, updated in place; ``outs`` [T, B, out] gets each
    step's h. Gates in TFLite's order (i, f, c, o; CIFG: f, c, o and i = 1 - f). ``flags``: CIFG, peephole
    i / f / o, layer norm, projection, projection bias; ``peep`` [3, U] and ``ln`` [4, U] by gate."""
    steps, batch, width = xw.shape
    units = c.shape[1]
    n_out = h.shape[1]
    cifg, pi_on, pf_on, po_on, ln_on, proj_on, pbias_on = (flags[0], flags[1], flags[2], flags[3], flags[4],
                                                           flags[5], flags[6])
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
            if proj_on:
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
    def __init__(self, ctx: OpContext):
        w = lambda i: _float_weights(ctx, i) if ctx.has_input(i) else None
        self.cifg = not ctx.has_input(1)
        gates = ([] if self.cifg else [1]) + [2, 3, 4]
        rgates = ([] if self.cifg else [5]) + [6, 7, 8]
        for i in gates + rgates:
            if ctx.const(i) is None:
                raise ctx.fail(f"LSTM weight input {i} must be constant")
        self.wx = np.concatenate([w(i) for i in gates], axis=0).T.astype(np.float32)  # [in, G*units]
        self.wh = np.ascontiguousarray(np.concatenate([w(i) for i in rgates], axis=0).T, np.float32)  # [out, G*U]
        self.units = units = ctx.input_tensor(2).shape[0]
        peeps = [w(i) for i in (9, 10, 11)]
        layer_norm = [w(i) for i in (20, 21, 22, 23)] if len(ctx.op.inputs) > 20 else [None] * 4
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
        self.flags = np.array([self.cifg, *(v is not None for v in peeps), any(v is not None for v in layer_norm),
                               proj is not None, proj_bias is not None], np.bool_)
        # (read-only, as the recurrence kernel takes them: one compile whichever way they were made)
        self.weights = tuple(map(readonly, (self.wh, self.bias, self.peep, self.ln, self.proj, self.proj_bias,
                                            self.flags)))
        self.act = ctx.opt("fused_activation_function", 4)
        if self.act not in ACTIVATIONS:
            raise ctx.fail(f"LSTM activation {self.act} is not supported")
        self.cell_clip = float(ctx.opt("cell_clip", 0.0) or 0.0)
        self.proj_clip = float(ctx.opt("proj_clip", 0.0) or 0.0)

    def run(self, xw: np.ndarray, h: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Every step of ``xw`` [T, B, G*U] (the input's contribution, precomputed); ``h`` and ``c`` are
        updated in place; returns h of every step, [T, B, out]."""
        if h.shape[1] != self.n_out or c.shape[1] != self.units:
            raise KernelError(f"LSTM state of shape {list(h.shape)} / {list(c.shape)}, the weights need "
                              f"[batch, {self.n_out}] / [batch, {self.units}]")
        outs = np.empty((xw.shape[0], xw.shape[1], self.n_out), np.float32)
        _recurrence(np.ascontiguousarray(xw, np.float32), *self.weights, self.act, self.cell_clip, self.proj_clip, h, c,
                    outs)
        return outs


def _read_state(xs, cell: _LstmCell, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Copies of the state variables (inputs 18: h, 19: c) as [batch, width]; the kernel updates them in place. A
    state not of the input's batch is the op's failure, as in LiteRT ("NumElements(output_state) != n_batch *
    n_output"): a resize of the input's batch (to 0 too) leaves the model's state variables as they are."""
    h, c = np.array(xs[18], np.float32), np.array(xs[19], np.float32)
    for what, state, width in (("output state", h, cell.n_out), ("cell state", c, cell.units)):
        if state.size != batch * width:
            raise KernelError(f"the {what} holds {state.size} values where a batch of {batch} needs {batch} x {width}: "
                              f"the model's state variables are of another batch than the input")
    return h.reshape(batch, cell.n_out), c.reshape(batch, cell.units)


def _stateful(ctx: OpContext) -> bool:
    """Whether the op's state inputs are variables (written back after a run), not a constant initial state."""
    return all(ctx.op.inputs[i] >= 0 and ctx.subgraph.tensors[ctx.op.inputs[i]].is_variable for i in (18, 19))


def _write_state(xs, h, c):
    for idx, v in ((18, h), (19, c)):
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
        t_steps, batch = x.shape[0], x.shape[1]
        h, c = _read_state(xs, cell, batch)
        xw = (x.reshape(t_steps * batch, -1) @ cell.wx).reshape(t_steps, batch, -1)
        outs = cell.run(xw, h, c)
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
        cell.run((x.reshape(batch, -1) @ cell.wx)[None], h, c)
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
    hidden state (input 4): a variable carried across invokes, or a constant initial state."""

    def __init__(self, ctx: OpContext):
        self.act = int(ctx.opt("fused_activation_function", 0))
        if self.act not in ACTIVATIONS:
            raise ctx.fail(f"fused activation {self.act} is not one a basic RNN applies")
        for i, what in ((1, "weights"), (2, "recurrent weights"), (3, "bias")):
            t = ctx.input_tensor(i)
            if t is None or ctx.const(i) is None:
                raise ctx.fail(f"its {what} (input {i}) must be a constant")
            if t.dtype != np.float32:
                raise ctx.fail(f"its {what} are {t.type_name}: only float32 basic RNNs run here (a hybrid one, "
                               "with int8 weights, does not)")
        self.w, self.r, self.b = (np.asarray(ctx.const(i), np.float32) for i in (1, 2, 3))
        self.units = self.w.shape[0]
        if self.r.shape != (self.units, self.units) or self.b.shape != (self.units,):
            raise ctx.fail(f"weights {list(self.w.shape)}, recurrent weights {list(self.r.shape)} and bias "
                           f"{list(self.b.shape)} do not fit {self.units} units")
        state = ctx.input_tensor(4)
        self.stateful = state is not None and state.is_variable

    def state(self, xs, batch: int) -> np.ndarray:
        h = np.array(xs[4], np.float32)
        if h.size != batch * self.units:
            raise KernelError(f"the hidden state holds {h.size} values where a batch of {batch} needs {batch} x "
                              f"{self.units}: the model's state variable is of another batch than the input")
        return h.reshape(batch, self.units)

    def steps(self, x: np.ndarray, h: np.ndarray, xs) -> np.ndarray:
        """Outputs [time, batch, units] of ``x`` [time, batch, inputs] from state ``h``, the state written back."""
        if x.shape[-1] != self.w.shape[1]:
            raise KernelError(f"an input of {x.shape[-1]} values per step for weights of {self.w.shape[1]}")
        xw = (x.reshape(-1, x.shape[-1]) @ self.w.T).reshape(x.shape[0], x.shape[1], self.units)
        outs = np.empty_like(xw)
        for t in range(x.shape[0]):
            h = _rnn_activation((self.b + xw[t]) + h @ self.r.T, self.act).astype(np.float32)
            outs[t] = h
        if self.stateful and xs[4] is not None and xs[4].flags.writeable:
            np.copyto(xs[4], h.reshape(xs[4].shape))
        return outs


@register("RNN")
def rnn(ctx: OpContext):
    cell = _RnnCell(ctx)

    def run(xs):
        x = np.asarray(xs[0], np.float32)
        if x.ndim != 2:
            raise KernelError(f"RNN: input must be [batch, inputs], got {list(x.shape)}")
        return [cell.steps(x[None], cell.state(xs, x.shape[0]), xs)[0]]

    return run


@register("UNIDIRECTIONAL_SEQUENCE_RNN")
def unidirectional_sequence_rnn(ctx: OpContext):
    cell = _RnnCell(ctx)
    time_major = ctx.opt("time_major", False)

    def run(xs):
        x = _steps_first(xs, ctx.op.name, time_major)
        outs = cell.steps(np.ascontiguousarray(x), cell.state(xs, x.shape[1]), xs)
        return [outs if time_major else np.ascontiguousarray(np.swapaxes(outs, 0, 1))]

    return run
