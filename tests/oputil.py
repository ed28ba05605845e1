"""Single-op models for tests: build, run through tflgpu and LiteRT, compare."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tflgpu.model.builder import ModelBuilder

from .conftest import assert_close, litert, run_model


@dataclass
class In:
    """A runtime input of the op (fed at invoke)."""

    value: np.ndarray
    quant: dict | None = None  # quantization parameters (ModelBuilder's form)


@dataclass
class Const:
    """A constant input with quantization parameters (plain arrays are constants too)."""

    value: np.ndarray
    quant: dict | None = None


@dataclass
class Out:
    dtype: Any = np.float32
    shape: Sequence[int] = (1,)
    quant: dict | None = None


def op_model(op: str, inputs: Sequence[Any], outputs: Sequence[Out] | int = 1, *,
             custom_options: bytes | None = None, version: int = 1, **options: Any) -> tuple[bytes, list]:
    """A model with one op. ``inputs``: In(array) for graph inputs, arrays or Const for constants, None for
    omitted.

    Returns the model bytes and the runtime input arrays (in graph-input order).
    """
    b = ModelBuilder()
    idx, feeds = [], []
    for i, v in enumerate(inputs):
        if v is None:
            idx.append(-1)
        elif isinstance(v, In):
            arr = np.asarray(v.value)
            idx.append(b.input(f"in{i}", arr.shape, arr.dtype, quant=v.quant))
            feeds.append(arr)
        else:
            arr = np.asarray(v.value if isinstance(v, Const) else v)
            idx.append(b.const(f"const{i}", arr, dtype=arr.dtype, quant=v.quant if isinstance(v, Const) else None))
    outs = [Out() for _ in range(outputs)] if isinstance(outputs, int) else list(outputs)
    out_idx = [b.tensor(f"out{i}", o.shape, o.dtype, quant=o.quant) for i, o in enumerate(outs)]
    b.op(op, idx, out_idx, custom_options=custom_options, version=version, **options)
    b.output(*out_idx)
    return b.build(), feeds


def check_op(op: str, inputs: Sequence[Any], outputs: Sequence[Out] | int = 1, *, rtol_scale: float = 1e-4,
             delegate: Any = None, expect_on_device: bool = True, **options: Any) -> list[np.ndarray]:
    """Run a single-op model through both runtimes; outputs must match within tolerance.

    With ``delegate`` (a GpuDelegate) tflgpu runs the op through it, and the op must have been
    placed on the OpenCL device unless ``expect_on_device`` is False.
    """
    from tflgpu import Interpreter

    model, feeds = op_model(op, inputs, outputs, **options)
    want = run_model(litert(), model, feeds)
    if delegate is None:
        got = run_model(Interpreter, model, feeds)
    else:
        it = Interpreter(model_content=model, delegate=delegate)
        assert it.gpu_plan is not None, "no OpenCL plan was built"
        if expect_on_device:
            assert it.gpu_plan.cpu_op_count == 0, [s.reason for s in it.gpu_plan.steps if s.device == "cpu"]
        got = run_model(lambda **kw: it, model, feeds)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, rtol_scale, what=f"{op} output {i}")
    return got


_POOL = None


def _litert_worker(model: bytes, feeds: list, builtin_only: bool = False) -> tuple[str, Any]:
    kw = {}
    if builtin_only:  # TFLite's own kernels, without the XNNPACK delegate LiteRT applies by default
        from ai_edge_litert.interpreter import OpResolverType

        kw["experimental_op_resolver_type"] = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    try:
        return "ok", run_model(litert(), model, feeds, **kw)
    except (RuntimeError, ValueError) as e:
        return "error", str(e)


def litert_isolated(model: bytes, feeds: list, builtin_only: bool = False) -> tuple[str, Any]:
    """Run LiteRT in a worker process: ("ok", outputs), ("error", message) or ("crashed", None).

    LiteRT segfaults on some inputs (e.g. unusual STRIDED_SLICE specs); a fuzz test must survive that.
    """
    global _POOL
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    if _POOL is None:
        _POOL = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        return _POOL.submit(_litert_worker, model, feeds, builtin_only).result(timeout=120)
    except BrokenProcessPool:
        _POOL = None
        return "crashed", None


def both_fail_or_match(op: str, inputs, outputs=1, *, isolated: bool = False, builtin_only: bool = False,
                       **options) -> str:
    """For inputs LiteRT may reject: if LiteRT fails, tflgpu must fail too; else results must match.

    With ``isolated`` the reference runs in a worker process and "reference crashed" is returned
    when LiteRT itself crashes (there is then nothing to compare against).
    """
    from tflgpu import Interpreter

    model, feeds = op_model(op, inputs, outputs, **options)
    if isolated:
        status, want = litert_isolated(model, feeds, builtin_only)
        if status == "crashed":
            return "reference crashed"
    else:
        try:
            status, want = "ok", run_model(litert(), model, feeds)
        except (RuntimeError, ValueError):
            status = "error"
    if status == "error":
        try:
            run_model(Interpreter, model, feeds)
        except (RuntimeError, ValueError):
            return "both rejected"
        raise AssertionError(f"LiteRT rejects this {op}, tflgpu accepted it")
    got = run_model(Interpreter, model, feeds)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, what=f"{op} output {i}")
    return "matched"


def rand(rng, shape, lo=-1.0, hi=1.0, dtype=np.float32) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(dtype)
