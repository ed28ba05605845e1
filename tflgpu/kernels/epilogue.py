"""The C code of a fused epilogue: the elementwise ops the fusion pass appended to a producer's kernel."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .common import Arg, activation, c_float, pad_lanes_mask, vec_slices
from .expressions import BINARY, unary_expr


@dataclass(frozen=True)
class Epilogue:
    """What a producer's kernel adds for its fused ops: C statements over the float4 ``v`` (reading
    ``oi``, the output's slice-layout index, and ``S_ep``, its slice), the kernel parameters they read,
    the matching kernel arguments, and the device tensors among those."""

    code: str = ""
    params: list[str] = field(default_factory=list)
    args: list[Arg] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)


def epilogue(fused: list, var: str, index: str, cout: int) -> Epilogue:
    """The epilogue applying ``fused`` (graph.passes.Fused, in order) to ``var`` at slice-layout ``index``."""
    if not fused:
        return Epilogue()
    lines, args = [], []
    for k, f in enumerate(fused):
        name = f.op.name
        if f.other_tensor is None and f.other_const is None:
            lines.append(unary_chain([f], var))
            continue
        if f.other_tensor is not None:
            args.append(Arg("tensor", f.other_tensor))
            other = f"LD4(ep{k}, {index})" if f.other_pool is None else _pooled_load(f"ep{k}", index, f.other_pool)
            if f.other_channels is not None:  # (a folded channel PAD: a batch-1 tensor of fewer slices, the rest 0)
                other = f"(S_ep < {(f.other_channels + 3) // 4} ? {other} : (float4)(0.0f))"
        elif f.other_const.size == 1:
            other = f"(float4)({c_float(f.other_const.reshape(-1)[0])})"
        else:
            args.append(Arg("const", vec_slices(f.other_const.reshape(-1), cout)))
            other = f"LD4(ep{k}, S_ep)"
        a, b = (var, "eo") if f.producer_is_lhs else ("eo", var)
        expr = BINARY[name].replace("va", "EA").replace("vb", "EB").replace("EA", a).replace("EB", b)
        lines.append(f"{{ const float4 eo = {other}; {var} = {expr}; }}")
        act = activation(f.op.options.get("fused_activation_function", 0), var)
        if act:
            lines.append(act)
    params = [f"__global const STORE_T* ep{k}" for k, f in enumerate(fused)
              if f.other_tensor is not None or (f.other_const is not None and f.other_const.size > 1)]
    return Epilogue(" ".join(lines), params, args, [a.value for a in args if a.kind == "tensor"])


def _pooled_load(ptr: str, index: str, pool) -> str:
    """The float4 a MAX_POOL (graph.passes.PoolRead) of the batch-1 tensor ``ptr`` would hold at slice-layout
    ``index`` of its output (slice ``S_ep``): the maximum of its window, every tap inside the input (VALID)."""
    (fh, fw), (sh, sw), (ih, iw), (oh, ow) = pool.filter, pool.stride, pool.size, pool.out
    pixel = f"(({index}) - S_ep * {oh * ow})"  # (of the output's image)
    at = f"(S_ep * {ih * iw} + {pixel} / {ow} * {sh * iw} + {pixel} % {ow} * {sw})"
    value = "(float4)(-INFINITY)"  # (as the MAX_POOL_2D kernel folds its window: kernels.pool.WINDOWS)
    for tap in (f"LD4({ptr}, {at} + {ky * iw + kx})" for ky in range(fh) for kx in range(fw)):
        value = f"fmax({value}, {tap})"
    return value


def unary_chain(fused, var: str, vtype: str = "float4") -> str:
    """C statements applying unary fused ops (graph.passes.Fused with no operand: a merged op's ``BETWEEN``, say a
    quantized model's QUANT_SIM after a depthwise conv) to ``var``, a ``vtype`` (float4 / float8 / float16)."""
    lines = []
    for f in fused:
        if f.other_tensor is not None or f.other_const is not None:
            raise ValueError(f"{f.op.name} has an operand: not a unary op")
        expr = re.sub(r"\bv\b", var, unary_expr(f.op)).replace("(float4)", f"({vtype})")
        expr = expr.replace("convert_float4", f"convert_{vtype}")
        lines.append(f"{var} = {expr};")
    return " ".join(lines)


def stored_at_slice(ep: Epilogue, c: int) -> str:
    """The statements of a kernel holding the float4 ``v`` of slice-layout index ``o``, slice ``S``, before its store:
    ``ep``'s code, then the lanes past channel ``c`` zeroed (a fused op may make them nonzero: an ADD of a
    constant, the LOG of a padded zero); "" without fused ops."""
    if not ep.code:
        return ""
    return f"  {{ const int oi = o; const int S_ep = S; {ep.code} }}\n  {pad_lanes_mask(c, 'S', 'v')}\n"


def first_values(act: int | None, between, var: str, vtype: str = "float4") -> str:
    """What a merged op (graph.passes: SEPARABLE_CONV, EXPAND_DEPTHWISE, POOLED_DENSE, GATE) applies to its first
    op's values ``var`` (a float4, float8 or float16): that op's fused activation, the unary ops between the two
    (``BETWEEN``), then the rounding of the storage the unfused pair keeps them in (``RND4``: half and back in an
    FP16 plan). The FP16 precision choice simulates the pair; where the merged op kept its values in float, the
    device's output differed from the simulation's (by whole steps after a quantization simulator)."""
    rounded = f"{var} = RND{vtype.removeprefix('float')}({var});"
    return " ".join(c for c in (activation(act, var, vtype), unary_chain(between, var, vtype), rounded) if c)
