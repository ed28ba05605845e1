"""SVDF: a rank-r singular value decomposition filter over a memory of past feature activations (keyword
spotters), float, dynamic-range (int8 weights, LiteRT's hybrid arithmetic) and integer (LiteRT's values exactly).
Its state (input 4) is a variable carried across invokes."""

from __future__ import annotations

import numpy as np

from ..ops.quantization import qparams
from .conv import _float_weights
from .hybrid import HybridWeights, is_hybrid
from .quantized import multiply_by_quantized_multiplier, quantize_multiplier, register_int
from .recurrent import ACTIVATIONS, _rnn_activation
from .registry import KernelError, OpContext, register


class _Svdf:
    """SVDF's constant feature weights [filters, inputs], time weights [filters, memory] and bias [units]
    (filters = units x rank), float32, or int8 weights (LiteRT's hybrid SVDF: the input's rows quantized for the
    feature product, the time weights dequantized); its state (input 4) [batch, memory x filters] holds each
    filter's last ``memory`` feature activations, oldest first, and is a variable carried across invokes."""

    def __init__(self, ctx: OpContext):
        self.rank = int(ctx.opt("rank", 0) or 0)
        self.act = int(ctx.opt("fused_activation_function", 0))
        if self.act not in ACTIVATIONS:
            raise ctx.fail(f"fused activation {self.act} is not one SVDF applies")
        self.hybrid = is_hybrid(ctx, 1)  # (int8 feature and time weights, float input: dynamic-range)
        self.asymmetric = bool(ctx.opt("asymmetric_quantize_inputs", False))
        for i, what in ((1, "feature weights"), (2, "time weights"), (3, "bias")):
            t = ctx.input_tensor(i)
            if t is None:
                if i == 3:
                    continue
                raise ctx.fail(f"its {what} (input {i}) are missing")
            if ctx.const(i) is None:
                raise ctx.fail(f"its {what} (input {i}) must be a constant")
            if t.dtype != (np.int8 if self.hybrid and i < 3 else np.float32):
                raise ctx.fail(f"its {what} are {t.type_name}: a float SVDF takes float32 weights, or int8 ones "
                               "with a float32 bias (dynamic-range)")
        self.feature = np.ascontiguousarray(_float_weights(ctx, 1))
        self.time = np.ascontiguousarray(_float_weights(ctx, 2))  # (hybrid: dequantized once, as LiteRT does)
        if self.hybrid:
            self.feature_q = HybridWeights.of(ctx, [1])
        filters = self.feature.shape[0] if self.feature.ndim == 2 else 0
        if self.rank < 1 or filters % self.rank:
            raise ctx.fail(f"rank {self.rank} must be positive and divide the {filters} filters")
        self.units = filters // self.rank
        self.bias = np.asarray(ctx.const(3), np.float32) if ctx.has_input(3) else np.zeros(self.units, np.float32)
        if self.time.ndim != 2 or self.time.shape[0] != filters or self.bias.shape != (self.units,):
            raise ctx.fail(f"feature weights {list(self.feature.shape)}, time weights {list(self.time.shape)} and "
                           f"bias {list(self.bias.shape)} do not fit {filters} filters of rank {self.rank}")
        self.memory = self.time.shape[1]
        state = ctx.input_tensor(4)
        if state is None or not state.is_variable:
            raise ctx.fail("its state (input 4) must be a variable tensor")

    def step(self, x: np.ndarray, state: np.ndarray) -> np.ndarray:
        """One step: ``x`` [batch, inputs]; ``state`` (the variable, [batch, memory x filters]) shifted by one
        and updated in place; returns [batch, units]."""
        batch, filters = x.shape[0], self.feature.shape[0]
        if x.shape[1] != self.feature.shape[1]:
            raise KernelError(f"SVDF: an input of {x.shape[1]} values for feature weights of "
                              f"{self.feature.shape[1]}")
        if state.size != batch * filters * self.memory:
            raise KernelError(f"SVDF: the state holds {state.size} values where a batch of {batch} needs {batch} "
                              f"x {self.memory * filters}: the model's state variable is of another batch")
        s = state.reshape(batch, filters, self.memory)
        s[:, :, :-1] = s[:, :, 1:].copy()
        s[:, :, -1] = self.feature_q.product(x, self.asymmetric) if self.hybrid else x @ self.feature.T
        per_filter = np.einsum("bfm,fm->bf", s, self.time, dtype=np.float32)
        out = self.bias + per_filter.reshape(batch, self.units, self.rank).sum(axis=2, dtype=np.float32)
        return _rnn_activation(out.astype(np.float32), self.act).astype(np.float32)


@register("SVDF")
def svdf(ctx: OpContext):
    cell = _Svdf(ctx)

    def run(xs):
        x = np.asarray(xs[0], np.float32)
        if x.ndim != 2:
            raise KernelError(f"SVDF: input must be [batch, inputs], got {list(x.shape)}")
        state = xs[4]
        if state is None or not state.flags.writeable:
            state = np.array(state, np.float32)
        return [cell.step(x, state)]

    return run


_INT_SVDF_TYPES = ((0, np.int8, "input"), (1, np.int8, "feature weights"), (2, np.int16, "time weights"),
                   (3, np.int32, "bias"), (4, np.int16, "state"))


def _wrap_int32(v: np.ndarray) -> np.ndarray:
    """int64 sums as the int32 sums of C would hold them (numpy's cast wraps around, as two's complement does)."""
    return v.astype(np.int32).astype(np.int64)


@register_int("SVDF")
def svdf_integer(ctx: OpContext):
    """TFLite's integer SVDF (int8 input and output, int8 feature weights, int16 time weights and state, int32
    bias): the feature products rescaled into the int16 state, the time products summed with the bias in int32
    and rescaled into the output, with TFLite's fixed-point multipliers; as LiteRT, RELU only."""
    if int(ctx.opt("fused_activation_function", 0)) != 1:
        raise ctx.fail("an integer SVDF takes the RELU activation only (as LiteRT)")
    params = {}
    for i, dtype, what in _INT_SVDF_TYPES + ((-1, np.int8, "output"),):
        t = ctx.output_tensor(0) if i < 0 else ctx.input_tensor(i)
        if t is None:
            if i == 3:
                continue
            raise ctx.fail(f"its {what} (input {i}) is missing")
        if t.dtype != dtype or (qparams(t) is None and i != 3):  # (the bias's scale is implied)
            raise ctx.fail(f"its {what} is {t.type_name}{'' if qparams(t) else ' without quantization'}: an "
                           f"integer SVDF takes {np.dtype(dtype).name} quantized there")
        if i in (1, 2, 3) and ctx.const(i) is None:
            raise ctx.fail(f"its {what} (input {i}) must be a constant")
        params[i] = qparams(t)
    rank = int(ctx.opt("rank", 0) or 0)
    feature = np.asarray(ctx.const(1), np.int64)
    time = np.asarray(ctx.const(2), np.int64)
    filters = feature.shape[0] if feature.ndim == 2 else 0
    if rank < 1 or filters % rank or time.ndim != 2 or time.shape[0] != filters:
        raise ctx.fail(f"rank {rank}, feature weights {list(feature.shape)} and time weights {list(time.shape)} do "
                       "not fit")
    units, memory = filters // rank, time.shape[1]
    bias = np.asarray(ctx.const(3), np.int64) if ctx.has_input(3) else np.zeros(units, np.int64)
    if bias.shape != (units,):
        raise ctx.fail(f"bias {list(bias.shape)} for {units} units")
    if not ctx.input_tensor(4).is_variable:
        raise ctx.fail("its state (input 4) must be a variable tensor")
    f32 = lambda i: np.float32(params[i].s)
    # (the scale ratios in float32, as LiteRT computes them, then QuantizeMultiplier in double)
    to_state = quantize_multiplier(np.float64(f32(0) * f32(1) / f32(4)))
    to_output = quantize_multiplier(np.float64(f32(4) * f32(2) / f32(-1)))
    in_zp, out_zp = params[0].z, params[-1].z

    def run(xs):
        x = np.asarray(xs[0])
        if x.ndim != 2 or x.shape[1] != feature.shape[1]:
            raise KernelError(f"SVDF: input of shape {list(x.shape)} for feature weights {list(feature.shape)}")
        batch = x.shape[0]
        state = xs[4]
        if state.size != batch * filters * memory:
            raise KernelError(f"SVDF: the state holds {state.size} values where a batch of {batch} needs "
                              f"{batch} x {memory * filters}")
        if not state.flags.writeable:
            state = np.array(state)
        s = state.reshape(batch, filters, memory)
        s[:, :, :-1] = s[:, :, 1:].copy()
        acc = _wrap_int32((x.astype(np.int64) - in_zp) @ feature.T)
        s[:, :, -1] = np.clip(multiply_by_quantized_multiplier(acc, *to_state), -32768, 32767)
        per_filter = np.einsum("bfm,fm->bf", s.astype(np.int64), time)
        total = _wrap_int32(bias + per_filter.reshape(batch, units, rank).sum(axis=2))
        out = multiply_by_quantized_multiplier(total, *to_output) + out_zp
        return [np.clip(out, -128, 127).astype(np.int8)]

    return run
