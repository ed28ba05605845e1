"""Compiling generated kernels and binding their arguments: shared by the plan and the autotuner."""

from __future__ import annotations

import warnings

import numpy as np

from ..kernels import PREAMBLE, KernelSpec

BUILD_OPTIONS = ["-cl-mad-enable"]


def build_program(cl, ctx, sources: list[str], fp16: bool):
    """One program from the preamble and ``sources`` (duplicates dropped); raises ``cl.Error``."""
    sources = list(dict.fromkeys(sources))  # specs may share a source (e.g. one per LSTM time step)
    opts = BUILD_OPTIONS + (["-DTFLGPU_FP16"] if fp16 else [])
    with warnings.catch_warnings():  # the Intel compiler always prints something: not a problem
        warnings.simplefilter("ignore", cl.CompilerWarning)
        return cl.Program(ctx, "\n\n".join([PREAMBLE] + sources)).build(options=opts)


def bind_kernel(cl, ctx, program, spec: KernelSpec, tensor_buffer: dict, np_dtype) -> tuple[object, list]:
    """A kernel instance of ``spec`` with every argument set; returns it and the constant buffers it made."""
    mf = cl.mem_flags
    k = cl.Kernel(program, spec.name)  # independent instances: args differ per spec
    args, consts = [], []
    for a in spec.args:
        if a.kind == "tensor":
            args.append(tensor_buffer[a.value])
        elif a.kind in ("const", "const32"):  # const32: float32 whatever the storage precision
            data = np.ascontiguousarray(a.value, dtype=np.float32 if a.kind == "const32" else np_dtype)
            buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=data)
            consts.append(buf)
            args.append(buf)
        elif a.kind == "int":
            args.append(np.int32(a.value))
        else:
            args.append(np.float32(a.value))
    k.set_args(*args)
    return k, consts
