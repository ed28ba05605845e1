"""Single-op quantized models for tests: build, run through tflgpu and LiteRT, compare in quantization steps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tflgpu.model.builder import ModelBuilder

from .conftest import litert, run_model


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
    extra: dict = field(default_factory=dict)


STEPS: dict[tuple[str, str], list[float]] = {}  # (op, path) -> worst step difference of each check


def qop_model(op: str, inputs: Sequence[Any], outputs: Sequence[QOut], *, version: int = 1,
              **options: Any) -> tuple[bytes, list]:
    b = ModelBuilder()
    idx, feeds = [], []
    for i, v in enumerate(inputs):
        if v is None:
            idx.append(-1)
        elif isinstance(v, QIn):
            arr = np.asarray(v.value)
            idx.append(b.input(f"in{i}", arr.shape, arr.dtype, quant=v.q.as_dict() if v.q else None))
            feeds.append(arr)
        else:
            arr = np.asarray(v.value)
            idx.append(b.const(f"const{i}", arr, dtype=arr.dtype, quant=v.q.as_dict() if v.q else None))
    out_idx = [b.tensor(f"out{i}", o.shape, o.dtype, quant=o.q.as_dict() if o.q else None)
               for i, o in enumerate(outputs)]
    b.op(op, idx, out_idx, version=version, **options)
    b.output(*out_idx)
    return b.build(), feeds


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
    kw = {}
    if builtin_only:
        from ai_edge_litert.interpreter import OpResolverType

        kw["experimental_op_resolver_type"] = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    want = run_model(litert(), model, feeds, **kw)
    if delegate is None:
        got = run_model(Interpreter, model, feeds)
    else:
        it = Interpreter(model_content=model, delegate=delegate)
        plan = it.gpu_plan
        assert plan is not None and plan.cpu_op_count == 0, [(s.op.name, s.reason) for s in plan.steps
                                                              if s.device == "cpu"]
        got = run_model(lambda **kw: it, model, feeds)
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
