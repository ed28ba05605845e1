"""A pixel's rank over its channels (ARG_MAX / ARG_MIN) as OpenCL C statements: ARG_MAX's own kernel
(pool.arg_over_channels) and a conv's fused into its output (conv.CONV_ARG) write the same ones."""

from __future__ import annotations

from ..graph.conv_arg import HALF_EXACT
from ..model.ir import Tensor
from ..ops.layout import Layout
from .base import GenContext, Unsupported


def arg_init(greater: bool, best: str, arg: str) -> str:
    """Declarations of a running rank (``arg_lanes``): each lane's best value so far and its channel."""
    return f"float4 {best} = (float4)({'-INFINITY' if greater else 'INFINITY'}); int4 {arg} = (int4)(0);"


def arg_lanes(v: str, s_expr: str, c: int, greater: bool, best: str, arg: str) -> str:
    """A statement folding the float4 ``v`` of slice ``s_expr`` (channels 4S..4S+3, those below ``c``) into the
    running (``best``, ``arg``) lane by lane, without branches: a strictly better value wins, so each lane keeps
    the first of equal ones; ``arg_pick`` then takes the lowest channel among the lanes' best (TFLite's first)."""
    cmp = "isgreater" if greater else "isless"
    return (f"{{ const int4 ch_ = (int4)(({s_expr}) * 4) + (int4)(0, 1, 2, 3); "
            f"const int4 m_ = {cmp}({v}, {best}) & (ch_ < (int4)({c})); "
            f"{best} = select({best}, {v}, m_); {arg} = select({arg}, ch_, m_); }}")


def arg_pick(greater: bool, best: str, arg: str, out: str) -> str:
    """Statements declaring ``int out``: the first channel holding the best of the lanes' best values."""
    pick = "fmax" if greater else "fmin"
    return (f"const float m_{out} = {pick}({pick}({best}.x, {best}.y), {pick}({best}.z, {best}.w)); "
            f"const int4 c_{out} = select((int4)(INT_MAX), {arg}, isequal({best}, (float4)(m_{out}))); "
            f"const int {out} = min(min(c_{out}.x, c_{out}.y), min(c_{out}.z, c_{out}.w));")


def channel_arg(ctx: GenContext, name: str, out: Tensor, channels: int) -> tuple[bool, Layout]:
    """(ARG_MAX?, the index layout) of a rank ``name`` over ``channels`` channels into ``out`` (one that
    graph.conv_arg.ranks_channels accepts), its indices exact in the storage (half holds integers up to 2048)."""
    if ctx.fp16 and channels > HALF_EXACT:
        raise Unsupported(f"indices past {HALF_EXACT} are not exact in FP16 storage")
    return name == "ARG_MAX", ctx.layout(out)
