"""Single-op quantized models for tests: build, run through tflgpu and LiteRT, compare in quantization steps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tflgpu.model.builder import ModelBuilder

from .conftest import run_model
from .oputil import Const, In, Out, op_model, run_litert


@dataclass
class Q:
    """Per-tensor or per-channel quantization: ``real = scale * (q - zero_point)``."""

    scale: Any
    zero_point: Any = 0
    dim: int = 0

    def as_dict(self) -> dict:
        s = np.atleast_1d(np.asarray(self.scale, np.float32))
        z = np.atleast_1d(np.asarray(self.zero_point, np.int64))
        if len(z) == 1 and len(s) > 1:
            z = np.repeat(z, len(s))
        return {"scale": s, "zero_point": z, "quantized_dimension": self.dim}


@dataclass
class QIn:
    """A runtime (graph) input holding integer values."""

    value: np.ndarray
    q: Q | None = None


@dataclass
class QConst:
    value: np.ndarray
    q: Q | None = None


@dataclass
class QOut:
    shape: Sequence[int]
    dtype: Any
    q: Q | None = None


STEPS: dict[tuple[str, str], list[float]] = {}  # (op, path) -> worst step difference of each check
# Ops whose CPU integer kernels the README says equal LiteRT's ("conv, depthwise, FC, pools, softmax, logistic,
# tanh, hard-swish, mean, concat, pad, reshape equal"): checked at 0 steps on that path whatever max_steps says.
EQUAL_ON_CPU = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "AVERAGE_POOL_2D", "MAX_POOL_2D",
                          "SOFTMAX", "LOGISTIC", "TANH", "HARD_SWISH", "MEAN", "CONCATENATION", "PAD", "RESHAPE"})


def qop_model(op: str, inputs: Sequence[Any], outputs: Sequence[QOut], *, version: int = 1,
              **options: Any) -> tuple[bytes, list]:
    """oputil.op_model with quantized inputs (QIn), constants (QConst) and outputs (QOut)."""
    def q(x):
        return x.q.as_dict() if x.q else None

    ins = [In(v.value, q(v)) if isinstance(v, QIn) else Const(v.value, q(v)) if isinstance(v, QConst) else v
           for v in inputs]
    return op_model(op, ins, [Out(o.dtype, o.shape, q(o)) for o in outputs], version=version, **options)


def steps_apart(got: np.ndarray, want: np.ndarray, scale: float | None = None) -> float:
    """max |got - want| in quantization steps (integers: raw difference; floats: over ``scale``)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if got.dtype.kind in "iu":
        return float(np.abs(got.astype(np.int64) - want.astype(np.int64)).max(initial=0))
    return float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max(initial=0) / scale)


def check_qop(delegate, op: str, inputs, outputs, *, max_steps: float = 1.0, version: int = 1,
              builtin_only: bool = False, float_step: float = 1.0, **options) -> tuple[float, list]:
    """Run a quantized single-op model through LiteRT and tflgpu (``delegate``: None for the CPU kernels,
    or a GpuDelegate: the float view, every op on the device); every output within ``max_steps``.
    ``float_step``: the step a float output is measured in. ``builtin_only``: the reference is TFLite's builtin kernels (for cases LiteRT's XNNPACK refuses)."""
    from tflgpu import Interpreter

    model, feeds = qop_model(op, inputs, outputs, version=version, **options)
    want = run_litert(model, feeds, builtin_only)
    if delegate is None:
        got = run_model(Interpreter, model, feeds)
    else:
        it = Interpreter(model_content=model, delegate=delegate)
        plan = it.gpu_plan
        assert plan is not None and plan.cpu_op_count == 0, [(s.op.name, s.reason) for s in plan.steps
                                                              if s.device == "cpu"]
        got = run_model(lambda **kw: it, model, feeds)
    assert len(got) == len(want) == len(outputs), (len(got), len(want), len(outputs))
    if delegate is None and op in EQUAL_ON_CPU:
        max_steps = 0.0
    worst = 0.0
    for g, w, o in zip(got, want, outputs):
        d = steps_apart(g, w, float(np.atleast_1d(o.q.scale)[0]) if o.q else float_step)
        worst = max(worst, d)
        assert d <= max_steps, f"{op}: {d} steps from LiteRT (allowed {max_steps})"
    path = "cpu" if delegate is None else ("gpu-fp16" if delegate.wants_fp16() else "gpu-fp32")
    STEPS.setdefault((op, path), []).append(worst)
    return worst, got


def rand_q(rng, shape, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def small_quantized_model(seed: int = 0) -> bytes:
    """A small full-integer model with float I/O, like the converter writes: QUANTIZE, per-channel CONV_2D
    (RELU6), DEPTHWISE_CONV_2D, a residual ADD, AVERAGE_POOL_2D, FULLY_CONNECTED, SOFTMAX, DEQUANTIZE."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()

    def q(scale, zp=0):
        return {"scale": np.float32([scale]), "zero_point": np.int64([zp])}

    def per_channel(n, dim=0):
        s = rng.uniform(0.004, 0.02, n).astype(np.float32)
        return s, {"scale": s, "zero_point": np.zeros(n, np.int64), "quantized_dimension": dim}

    x = b.input("x", (1, 8, 8, 3), np.float32)
    xq = b.tensor("xq", (1, 8, 8, 3), np.int8, quant=q(0.02, -3))
    b.op("QUANTIZE", [x], [xq])
    s1, q1 = per_channel(8)
    w1 = b.const("w1", rng.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8), quant=q1)
    b1 = b.const("b1", rng.integers(-500, 500, 8).astype(np.int32), quant={"scale": 0.02 * s1, "zero_point": np.zeros(8, np.int64)})
    c1 = b.tensor("c1", (1, 8, 8, 8), np.int8, quant=q(0.03, -128))
    b.op("CONV_2D", [xq, w1, b1], [c1], version=3, padding="SAME", stride_h=1, stride_w=1,
         fused_activation_function="RELU6")
    s2, q2 = per_channel(8, 3)
    w2 = b.const("w2", rng.integers(-127, 128, (1, 3, 3, 8)).astype(np.int8), quant=q2)
    b2 = b.const("b2", rng.integers(-500, 500, 8).astype(np.int32), quant={"scale": 0.03 * s2, "zero_point": np.zeros(8, np.int64)})
    c2 = b.tensor("c2", (1, 8, 8, 8), np.int8, quant=q(0.04, 5))
    b.op("DEPTHWISE_CONV_2D", [c1, w2, b2], [c2], version=3, padding="SAME", stride_h=1, stride_w=1,
         depth_multiplier=1, fused_activation_function="NONE")
    a = b.tensor("a", (1, 8, 8, 8), np.int8, quant=q(0.06, -10))
    b.op("ADD", [c1, c2], [a], version=2, fused_activation_function="NONE")
    p = b.tensor("p", (1, 1, 1, 8), np.int8, quant=q(0.06, -10))
    b.op("AVERAGE_POOL_2D", [a], [p], version=2, padding="VALID", stride_h=8, stride_w=8, filter_height=8,
         filter_width=8, fused_activation_function="NONE")
    s3, _ = per_channel(1)
    w3 = b.const("w3", rng.integers(-127, 128, (5, 8)).astype(np.int8), quant=q(float(s3[0])))
    b3 = b.const("b3", rng.integers(-200, 200, 5).astype(np.int32), quant=q(float(0.06 * s3[0])))
    f = b.tensor("f", (1, 5), np.int8, quant=q(0.05, 2))
    b.op("FULLY_CONNECTED", [p, w3, b3], [f], version=4, fused_activation_function="NONE")
    sm = b.tensor("sm", (1, 5), np.int8, quant=q(1 / 256, -128))
    b.op("SOFTMAX", [f], [sm], version=2, beta=1.0)
    y = b.tensor("y", (1, 5), np.float32)
    b.op("DEQUANTIZE", [sm], [y], version=2)
    b.output(y)
    return b.build()
