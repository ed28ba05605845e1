"""The storage cast between an FP16 plan's half tensors and the FP32 ones of ops kept in FP32 (graph.precision)."""

from __future__ import annotations

from ..graph.precision import STORAGE_CAST
from .base import GenContext, generator, require_float
from .common import Arg, KernelSpec


@generator(STORAGE_CAST)
def storage_cast(ctx: GenContext) -> list[KernelSpec]:
    """A copy of a slice-layout tensor in the other storage precision (lanes past C are copied zeros)."""
    src_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, src_t, out, allow_bool=True)
    to_half = bool(ctx.op.options["to_fp16"])
    n = ctx.layout(out).elements // 4
    load, store = ("vload4", "vstore_half4") if to_half else ("vload_half4", "vstore4")
    src_type, dst_type = ("float", "half") if to_half else ("half", "float")
    src = (f"__kernel void {ctx.name}(__global const {src_type}* src, __global {dst_type}* dst) {{\n"
           f"  const int i = get_global_id(0);\n  if (i < {n}) {store}({load}(i, src), i, dst);\n}}")
    return [KernelSpec(ctx.name, src, (n,), None, [Arg("tensor", ctx.op.inputs[0]), Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0]], [ctx.op.outputs[0]], fp16=to_half, input_fp16=not to_half)]
