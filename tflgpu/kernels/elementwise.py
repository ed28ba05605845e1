"""Elementwise ops on float4 slices: unary math, binary ops with TFLite broadcasting, PRELU."""

from __future__ import annotations

import numpy as np

from .base import GenContext, Unsupported, generator, require_float
from .common import Arg, KernelSpec, Layout, activation, pad_lanes_mask, to_slices

UNARY = {
    "RELU": "fmax(v, (float4)(0.0f))",
    "RELU6": "clamp(v, (float4)(0.0f), (float4)(6.0f))",
    "RELU_N1_TO_1": "clamp(v, (float4)(-1.0f), (float4)(1.0f))",
    "LOGISTIC": "1.0f / (1.0f + exp(-v))",
    "TANH": "tanh(v)",
    "EXP": "exp(v)",
    "LOG": "log(v)",
    "HARD_SWISH": "v * clamp(v + 3.0f, (float4)(0.0f), (float4)(6.0f)) * (1.0f / 6.0f)",
    "ABS": "fabs(v)",
    "RSQRT": "rsqrt(v)",
    "SQRT": "sqrt(v)",
    "NEG": "-v",
    "SQUARE": "v * v",
    "SIN": "sin(v)",
    "COS": "cos(v)",
    "ELU": "select(expm1(v), v, isgreater(v, (float4)(0.0f)))",
    "LOGICAL_NOT": "convert_float4(v == 0.0f) * -1.0f",
    "LEAKY_RELU": "select(v * ALPHA, v, isgreaterequal(v, (float4)(0.0f)))",
    "QUANT_SIM": "QSIM",  # graph.float_view's quantization simulator: see unary_expr
}


def unary_expr(op) -> str:
    """The float4 expression of a unary op over ``v``, with the op's options filled in."""
    expr = UNARY[op.name]
    if op.name == "QUANT_SIM":
        o = op.options
        if not o.get("tflgpu_sim"):
            raise Unsupported("a model's own custom op named QUANT_SIM")
        if "scale" not in o:
            return "v"
        inv = float(np.float32(1.0) / np.float32(o["scale"]))
        zp, lo, hi, scale = (float(o[k]) for k in ("zero_point", "qmin", "qmax", "scale"))
        return (f"(clamp(rint(v * {inv!r}f) + {zp!r}f, (float4)({lo!r}f), (float4)({hi!r}f)) - {zp!r}f)"
                f" * {float(np.float32(scale))!r}f")
    return expr.replace("ALPHA", f"{float(op.options.get('alpha', 0.2))!r}f")

# comparisons and logic produce/consume bool tensors, stored as exact 0.0 / 1.0
LOGIC = {
    "LESS": "convert_float4(isless(va, vb)) * -1.0f",
    "LESS_EQUAL": "convert_float4(islessequal(va, vb)) * -1.0f",
    "GREATER": "convert_float4(isgreater(va, vb)) * -1.0f",
    "GREATER_EQUAL": "convert_float4(isgreaterequal(va, vb)) * -1.0f",
    "EQUAL": "convert_float4(isequal(va, vb)) * -1.0f",
    "NOT_EQUAL": "convert_float4(isnotequal(va, vb)) * -1.0f",
    "LOGICAL_AND": "convert_float4((va != 0.0f) && (vb != 0.0f)) * -1.0f",
    "LOGICAL_OR": "convert_float4((va != 0.0f) || (vb != 0.0f)) * -1.0f",
}

BINARY = {
    "ADD": "va + vb", "SUB": "va - vb", "MUL": "va * vb", "DIV": "va / vb", "MAXIMUM": "fmax(va, vb)",
    "MINIMUM": "fmin(va, vb)", "SQUARED_DIFFERENCE": "(va - vb) * (va - vb)",
}


def grid(lay: Layout) -> tuple[int, int, int]:
    return (lay.w, lay.b * lay.h, lay.s)


def grid_prologue(lay: Layout) -> str:
    return (f"  const int x = get_global_id(0); const int Y = get_global_id(1); const int S = get_global_id(2);\n"
            f"  if (x >= {lay.w} || Y >= {lay.b * lay.h} || S >= {lay.s}) return;\n"
            f"  const int b = Y / {lay.h}; const int y = Y % {lay.h};\n"
            f"  const int o = ((b * {lay.s} + S) * {lay.h} + y) * {lay.w} + x;\n")


def broadcast_read(var: str, inp: Layout, out: Layout) -> str:
    """float4 of input ``var`` at the output position (b, y, x, S), broadcasting size-1 dims."""
    if inp.dims == out.dims:
        return f"LD4({var}, o)"
    bb = "b" if inp.b > 1 else "0"
    yy = "y" if inp.h > 1 else "0"
    xx = "x" if inp.w > 1 else "0"
    pix = f"(({bb} * {inp.s} + {{s}}) * {inp.h} + {yy}) * {inp.w} + {xx}"
    if inp.c == out.c:
        return f"LD4({var}, {pix.format(s='S')})"
    if inp.c == 1:
        return f"(float4)(LD1({var}, ({pix.format(s='0')}) * 4))"
    raise Unsupported(f"channel broadcast {inp.c} -> {out.c}")


@generator(*UNARY)
def unary(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.inp(0), ctx.out()
    require_float(ctx, x_t, out, allow_bool=ctx.op.name == "LOGICAL_NOT")
    lay = ctx.layout(out)
    expr = unary_expr(ctx.op)
    src = (f"__kernel void {ctx.name}(__global const STORE_T* src, __global STORE_T* dst) {{\n"
           + grid_prologue(lay) + f"  const float4 v0 = LD4(src, o);\n  float4 v = v0;\n  v = {expr};\n"
           + f"  {pad_lanes_mask(lay.c, 'S', 'v')}\n  ST4(dst, o, v);\n}}")
    return [KernelSpec(ctx.name, src, grid(lay), None, [Arg("tensor", ctx.op.inputs[0]),
                                                         Arg("tensor", ctx.op.outputs[0])],
                       [ctx.op.inputs[0]], [ctx.op.outputs[0]])]


def _operand(ctx: GenContext, i: int) -> tuple[Arg, Layout, list[int]]:
    """A binary operand: a device tensor, or a constant uploaded in slice layout."""
    t = ctx.inp(i)
    require_float(ctx, t, allow_bool=ctx.op.name.startswith("LOGICAL_"))
    lay = ctx.layout(t)
    c = ctx.const(i)
    if c is not None:
        return Arg("const", to_slices(np.asarray(c, np.float32), lay, np.float32)), lay, []
    return Arg("tensor", ctx.op.inputs[i]), lay, [ctx.op.inputs[i]]


@generator(*BINARY, *LOGIC, "PRELU")
def binary(ctx: GenContext) -> list[KernelSpec]:
    out = ctx.out()
    require_float(ctx, out, allow_bool=ctx.op.name in LOGIC)
    lay = ctx.layout(out)
    (arg_a, la, ia), (arg_b, lb, ib) = _operand(ctx, 0), _operand(ctx, 1)
    for x in (la, lb):
        if any(d not in (1, od) for d, od in zip(x.dims, lay.dims)):
            raise Unsupported(f"broadcast of {x.dims} to {lay.dims}")
    if ctx.op.name == "PRELU":
        expr = "select(va * vb, va, isgreaterequal(va, (float4)(0.0f)))"
    elif ctx.op.name in LOGIC:
        expr = LOGIC[ctx.op.name]
    else:
        expr = BINARY[ctx.op.name]
    act = activation(ctx.opt("fused_activation_function", 0), "v")
    src = (f"__kernel void {ctx.name}(__global const STORE_T* in0, __global const STORE_T* in1, "
           f"__global STORE_T* dst) {{\n" + grid_prologue(lay)
           + f"  const float4 va = {broadcast_read('in0', la, lay)};\n"
           + f"  const float4 vb = {broadcast_read('in1', lb, lay)};\n"
           + f"  float4 v = {expr};\n  {act}\n  {pad_lanes_mask(lay.c, 'S', 'v')}\n  ST4(dst, o, v);\n}}")
    return [KernelSpec(ctx.name, src, grid(lay), None, [arg_a, arg_b, Arg("tensor", ctx.op.outputs[0])],
                       ia + ib, [ctx.op.outputs[0]])]
