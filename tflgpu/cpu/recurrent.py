"""LSTM (one step) and UNIDIRECTIONAL_SEQUENCE_LSTM, with peepholes, CIFG, projection,
layer normalization and clipping, as TFLite's float kernels define them.

State tensors (inputs 18 and 19) are variables: the final state is written
back into them, so it carries over to the next invoke, as in LiteRT.
"""

from __future__ import annotations

import numpy as np

from .conv import _float_weights
from .registry import KernelError, OpContext, register

LAYER_NORM_EPS = 1e-8


def _cell_activation(x: np.ndarray, code: int) -> np.ndarray:
    """The LSTM's gate/cell activation: unlike fused activations, TANH and SIGMOID apply here."""
    if code == 0:
        return x
    if code == 1:
        return np.maximum(x, 0)
    if code == 2:
        return np.clip(x, -1, 1)
    if code == 3:
        return np.clip(x, 0, 6)
    if code == 4:
        return np.tanh(x)
    if code == 6:
        return _sigmoid(x)
    raise ValueError(f"LSTM activation {code} is not supported")


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


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
        self.wh = np.concatenate([w(i) for i in rgates], axis=0).T.astype(np.float32)  # [out, G*units]
        self.units = ctx.input_tensor(2).shape[0]
        self.peep_i, self.peep_f, self.peep_o = (w(i) for i in (9, 10, 11))
        self.layer_norm = [w(i) for i in (20, 21, 22, 23)] if len(ctx.op.inputs) > 20 else [None] * 4
        self.use_ln = any(v is not None for v in self.layer_norm)
        bias = [w(i) for i in ([] if self.cifg else [12]) + [13, 14, 15]]
        bias = [b if b is not None else np.zeros(self.units, np.float32) for b in bias]
        self.bias = np.concatenate(bias).astype(np.float32)
        self.proj = w(16)
        self.proj_bias = w(17)
        self.act = ctx.opt("fused_activation_function", 4)
        self.cell_clip = float(ctx.opt("cell_clip", 0.0) or 0.0)
        self.proj_clip = float(ctx.opt("proj_clip", 0.0) or 0.0)

    def _norm(self, g, coeff):
        mean = g.mean(axis=-1, keepdims=True)
        var = ((g - mean) ** 2).mean(axis=-1, keepdims=True)
        return (g - mean) / np.sqrt(var + LAYER_NORM_EPS) * coeff

    def step(self, xw: np.ndarray, h: np.ndarray, c: np.ndarray):
        """One time step; xw is the input's contribution x @ wx, precomputed for all steps."""
        u = self.units
        pre = xw + h @ self.wh
        parts = np.split(pre, pre.shape[-1] // u, axis=-1)
        if self.cifg:
            pi = None
            pf, pc, po = parts
        else:
            pi, pf, pc, po = parts
        ln_i, ln_f, ln_c, ln_o = self.layer_norm
        biases = np.split(self.bias, len(parts))
        if self.cifg:
            bf, bc, bo = biases
        else:
            bi, bf, bc, bo = biases
        if pi is not None:
            if self.peep_i is not None:
                pi = pi + c * self.peep_i
            if self.use_ln:
                pi = self._norm(pi, ln_i)
            i = _sigmoid(pi + bi)
        if self.peep_f is not None:
            pf = pf + c * self.peep_f
        if self.use_ln:
            pf = self._norm(pf, ln_f)
        f = _sigmoid(pf + bf)
        if self.use_ln:
            pc = self._norm(pc, ln_c)
        g = _cell_activation((pc + bc).astype(np.float32), self.act)
        if pi is None:
            i = 1.0 - f
        c_new = f * c + i * g
        if self.cell_clip > 0:
            c_new = np.clip(c_new, -self.cell_clip, self.cell_clip)
        if self.peep_o is not None:
            po = po + c_new * self.peep_o
        if self.use_ln:
            po = self._norm(po, ln_o)
        o = _sigmoid(po + bo)
        h_new = o * _cell_activation(c_new.astype(np.float32), self.act)
        if self.proj is not None:
            h_new = h_new @ self.proj.T
            if self.proj_bias is not None:
                h_new = h_new + self.proj_bias
            if self.proj_clip > 0:
                h_new = np.clip(h_new, -self.proj_clip, self.proj_clip)
        return h_new.astype(np.float32), c_new.astype(np.float32)


def _write_state(xs, h, c):
    for idx, v in ((18, h), (19, c)):
        dst = xs[idx]
        if dst is not None and dst.flags.writeable and dst.shape == v.shape:
            np.copyto(dst, v)


@register("UNIDIRECTIONAL_SEQUENCE_LSTM")
def unidirectional_sequence_lstm(ctx: OpContext):
    cell = _LstmCell(ctx)
    time_major = ctx.opt("time_major", False)

    def run(xs):
        x = np.asarray(xs[0], np.float32)
        if x.ndim != 3:
            raise KernelError(f"UNIDIRECTIONAL_SEQUENCE_LSTM: input must be 3-D, got shape {list(x.shape)}")
        if not time_major:
            x = np.swapaxes(x, 0, 1)  # [time, batch, features]
        t_steps, batch = x.shape[0], x.shape[1]
        h = np.array(xs[18], np.float32).reshape(batch, -1)
        c = np.array(xs[19], np.float32).reshape(batch, -1)
        xw = (x.reshape(t_steps * batch, -1) @ cell.wx).reshape(t_steps, batch, -1)
        outs = np.empty((t_steps, batch, h.shape[-1]), np.float32)
        for t in range(t_steps):
            h, c = cell.step(xw[t], h, c)
            outs[t] = h
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
        h = np.array(xs[18], np.float32).reshape(batch, -1)
        c = np.array(xs[19], np.float32).reshape(batch, -1)
        h, c = cell.step(x.reshape(batch, -1) @ cell.wx, h, c)
        _write_state(xs, h, c)
        return [h] if len(ctx.op.outputs) == 1 else [np.zeros(0, np.float32), h, c, h][: len(ctx.op.outputs)]

    return run
