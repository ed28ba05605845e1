"""Elementwise ops on float4 slices: unary math, binary ops with TFLite broadcasting, PRELU, SELECT."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..graph.passes import ELEMENTWISE_REGION
from ..ops.layout import Layout
from ..ops.traits import traits
from .base import GenContext, Unsupported, generator, require_float
from .common import Arg, KernelSpec, activation, c_float, pad_lanes_mask, to_slices, vec_slices
from .epilogue import Epilogue
from .expressions import BINARY, LOGIC, UNARY, unary_expr


def _slices_first(lay: Layout) -> bool:
    """Whether a per-float4 kernel's grid runs along the slices first: where each row holds one pixel (a rank-2
    tensor's [rows, features], a [1, 144000] signal), a grid along the pixels first would be 1 wide in its first
    dimension, along which a CPU runtime vectorizes work-items (Intel's: 16 at a time, so 1 of 16 lanes used)."""
    return lay.w == 1 and lay.s > 1


def grid(lay: Layout) -> tuple[int, int, int]:
    """The global size of a kernel of a work-item per output float4 (``grid_prologue``): (pixels of a row, rows of
    every image, slices), or (slices, rows, 1) where a row has one pixel (``_slices_first``)."""
    if _slices_first(lay):
        return (lay.s, lay.b * lay.h, 1)
    return pixel_grid(lay)


def pixel_grid(lay: Layout, per: int = 1) -> tuple[int, int, int]:
    """The global size of a kernel of a work-item per output pixel and ``per`` of its slices (``pixel_prologue``,
    ``slice_loop``): (pixels of a row, rows of every image, the slices' shares)."""
    return (lay.w, lay.b * lay.h, -(-lay.s // per))


def pixel_prologue(lay: Layout) -> str:
    """A ``pixel_grid`` kernel's pixel: x, Y, b and y (returning past the grid's edge)."""
    return ("  const int x = get_global_id(0); const int Y = get_global_id(1);\n"
            f"  if (x >= {lay.w} || Y >= {lay.b * lay.h}) return;\n"
            f"  const int b = Y / {lay.h}; const int y = Y % {lay.h};\n")


def slice_loop(lay: Layout, per: int) -> str:
    """The opening of a ``pixel_grid`` kernel's loop over its ``per`` slices S of the pixel (the caller closes it)."""
    return (f"  for (int S = get_global_id(2) * {per}; S < min((int)get_global_id(2) * {per} + {per}, {lay.s}); "
            "++S) {\n")


def grid_prologue(lay: Layout) -> str:
    """A ``grid`` kernel's coordinates of its float4: x, Y (b and y), S, and its index ``o`` in the slice layout."""
    ids = ("const int S = get_global_id(0); const int Y = get_global_id(1); const int x = 0;\n"
           if _slices_first(lay) else
           "const int x = get_global_id(0); const int Y = get_global_id(1); const int S = get_global_id(2);\n")
    return (f"  {ids}"
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


def _epilogue(ctx: GenContext, c: int) -> tuple[str, str, Epilogue]:
    """An elementwise kernel's fused ops (graph.passes.fuse_elementwise: a chain of elementwise ops is one kernel):
    their code over ``v`` at the output's index ``o`` and slice ``S``, and their kernel parameters."""
    ep = ctx.epilogue_code(c)
    code = f"  {{ const int oi = o; const int S_ep = S; {ep.code} }}\n" if ep.code else ""
    return code, "".join(f"{p}, " for p in ep.params), ep


@generator(*UNARY)
def unary(ctx: GenContext) -> list[KernelSpec]:
    x_t, out = ctx.input_tensor(0), ctx.output_tensor()
    require_float(ctx, x_t, out, allow_bool=ctx.op.name == "LOGICAL_NOT")
    lay = ctx.layout(out)
    expr = unary_expr(ctx.op)
    ep_code, ep_params, ep = _epilogue(ctx, lay.c)
    src = (f"__kernel void {ctx.name}(__global const STORE_T* src, {ep_params}__global STORE_T* dst) {{\n"
           + grid_prologue(lay) + f"  const float4 v0 = LD4(src, o);\n  float4 v = v0;\n  v = {expr};\n" + ep_code
           + f"  {pad_lanes_mask(lay.c, 'S', 'v')}\n  ST4(dst, o, v);\n}}")
    return [KernelSpec(ctx.name, src, grid(lay), None, [Arg("tensor", ctx.op.inputs[0]), *ep.args,
                                                         Arg("tensor", ctx.final_output)],
                       [ctx.op.inputs[0], *ep.inputs], [ctx.final_output])]


def _operand(ctx: GenContext, i: int, allow_bool: bool = False) -> tuple[Arg, Layout, list[int]]:
    """A binary operand: a device tensor, or a constant uploaded in slice layout. An operand of lower rank than
    the output broadcasts as numpy (and TFLite) does, its dims aligned to the output's last ones: its layout
    is that of its shape with 1s prepended to the output's rank (rank 3 maps to BHWC as B, W, C, so (3, 1, 2)
    against a rank-4 output is H=3, not B=3); each of its dims the output's or 1."""
    t = ctx.input_tensor(i)
    require_float(ctx, t, allow_bool=allow_bool or ctx.op.name.startswith("LOGICAL_"))
    rank = len(ctx.output_tensor().shape)
    shape = (1,) * (rank - len(t.shape)) + tuple(t.shape)
    lay, out = ctx.layout(replace(t, shape=shape)), ctx.layout(ctx.output_tensor())
    if any(d not in (1, od) for d, od in zip(lay.dims, out.dims)):
        raise Unsupported(f"broadcast of {lay.dims} to {out.dims}")
    c = ctx.const(i)
    if c is not None:
        return Arg("const", to_slices(np.asarray(c, np.float32).reshape(shape), lay, np.float32)), lay, []
    if lay.dims != ctx.layout(t).dims:  # (stored in its own rank's layout: another order of the same values)
        raise Unsupported(f"broadcast of a rank-{len(t.shape)} tensor {list(t.shape)} against rank {rank}")
    return Arg("tensor", ctx.op.inputs[i]), lay, [ctx.op.inputs[i]]


@generator(*BINARY, *LOGIC)
def binary(ctx: GenContext) -> list[KernelSpec]:
    out = ctx.output_tensor()
    require_float(ctx, out, allow_bool=ctx.op.name in LOGIC)
    lay = ctx.layout(out)
    (arg_a, la, ia), (arg_b, lb, ib) = _operand(ctx, 0), _operand(ctx, 1)
    if ctx.op.name in LOGIC:
        expr = LOGIC[ctx.op.name]
    else:
        expr = BINARY[ctx.op.name]
    act = activation(ctx.opt("fused_activation_function", 0), "v")
    ep_code, ep_params, ep = _epilogue(ctx, lay.c)
    src = (f"__kernel void {ctx.name}(__global const STORE_T* in0, __global const STORE_T* in1, "
           f"{ep_params}__global STORE_T* dst) {{\n" + grid_prologue(lay)
           + f"  const float4 va = {broadcast_read('in0', la, lay)};\n"
           + f"  const float4 vb = {broadcast_read('in1', lb, lay)};\n"
           + f"  float4 v = {expr};\n  {act}\n" + ep_code
           + f"  {pad_lanes_mask(lay.c, 'S', 'v')}\n  ST4(dst, o, v);\n}}")
    return [KernelSpec(ctx.name, src, grid(lay), None, [arg_a, arg_b, *ep.args, Arg("tensor", ctx.final_output)],
                       ia + ib + ep.inputs, [ctx.final_output])]


@generator("SELECT", "SELECT_V2")
def select_op(ctx: GenContext) -> list[KernelSpec]:
    """x where the condition holds, else y; SELECT_V2 broadcasts its three operands as a binary op does (SELECT's
    condition of rank 1 against larger operands picks whole rows: the CPU's)."""
    out = ctx.output_tensor()
    require_float(ctx, out)
    lay = ctx.layout(out)
    if ctx.op.name == "SELECT" and any(tuple(ctx.input_tensor(i).shape) != tuple(out.shape) for i in range(3)):
        raise Unsupported("SELECT of a condition picking rows")
    operands = [_operand(ctx, 0, allow_bool=True), _operand(ctx, 1), _operand(ctx, 2)]
    reads = "".join(f"  const float4 v{k} = {broadcast_read(f'in{k}', x, lay)};\n" for k, (_, x, _) in enumerate(operands))
    src = (f"__kernel void {ctx.name}(__global const STORE_T* in0, __global const STORE_T* in1, "
           f"__global const STORE_T* in2, __global STORE_T* dst) {{\n" + grid_prologue(lay) + reads
           + f"  float4 v = select(v2, v1, v0 != 0.0f);\n  {pad_lanes_mask(lay.c, 'S', 'v')}\n  ST4(dst, o, v);\n}}")
    return [KernelSpec(ctx.name, src, grid(lay), None, [a for a, _, _ in operands] + [Arg("tensor", ctx.final_output)],
                       [t for _, _, ins in operands for t in ins], [ctx.final_output])]


@generator(ELEMENTWISE_REGION)
def elementwise_region(ctx: GenContext) -> list[KernelSpec]:
    """One kernel for a region of elementwise steps (graph.passes.fuse_regions): its inputs loaded once, each op's
    value a register, each step's value rounded as its storage would round it (RND4: the values the unfused
    steps store and reload), a chain's intermediate values not (as in the chain's own kernel); only the region's
    outputs stored."""
    lay = ctx.layout(ctx.tensor(ctx.op.outputs[0]))
    lines, args, params = [], [], []
    reg = {}  # tensor -> its register
    for k, t in enumerate(ctx.op.inputs):
        params.append(f"__global const STORE_T* in{k}")
        args.append(Arg("tensor", t))
        lines.append(f"  const float4 r{k} = LD4(in{k}, o);")
        reg[t] = f"r{k}"

    def operand(t: int) -> str:
        if t in reg:
            return reg[t]
        c = np.asarray(ctx.consts[t], np.float32).reshape(-1)
        if c.size == 1:
            return f"(float4)({c_float(c[0])})"
        params.append(f"__global const STORE_T* c{len(args)}")
        args.append(Arg("const", vec_slices(c, lay.c)))
        return f"LD4(c{len(args) - 1}, S)"

    for first, chain in ctx.op.options["steps"]:
        ops = [first] + [f.op for f in chain]
        for n, op in enumerate(ops):
            q = f"q{len(reg)}"
            if traits(op.name).fusable == "unary":  # (its expression is written over a float4 named v)
                code = f"float4 v = {operand(op.inputs[0])}; v = {unary_expr(op)};"
            else:
                code = (f"const float4 va = {operand(op.inputs[0])}; const float4 vb = {operand(op.inputs[1])}; "
                        f"float4 v = {BINARY[op.name]}; {activation(op.options.get('fused_activation_function', 0), 'v')}")
            rounded = "RND4(v)" if n == len(ops) - 1 else "v"  # (a step's value is stored and reloaded: rounded)
            lines.append(f"  float4 {q}; {{ {code} {q} = {rounded}; }}")
            reg[op.outputs[0]] = q
    for k, t in enumerate(ctx.op.outputs):
        params.append(f"__global STORE_T* out{k}")
        args.append(Arg("tensor", t))
        lines.append(f"  {{ float4 v = {reg[t]}; {pad_lanes_mask(lay.c, 'S', 'v')} ST4(out{k}, o, v); }}")
    src = (f"__kernel void {ctx.name}({', '.join(params)}) {{\n" + grid_prologue(lay) + "\n".join(lines) + "\n}")
    return [KernelSpec(ctx.name, src, grid(lay), None, args, list(ctx.op.inputs), list(ctx.op.outputs))]
