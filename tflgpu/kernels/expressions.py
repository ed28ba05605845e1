"""The float4 expressions of elementwise ops, over ``v`` (unary) or ``va`` / ``vb`` (binary): what the
elementwise generators and every fused epilogue compute."""

from __future__ import annotations

import numpy as np

from ..graph.float_view import sim_grid
from ..graph.passes import SWISH
from ..ops.quantization import RAW_MEAN_SNAP
from .common import c_float, clamped
from .errors import Unsupported

UNARY = {
    "RELU": clamped("v", 0.0, np.inf),
    "RELU6": clamped("v", 0.0, 6.0),
    "RELU_N1_TO_1": clamped("v", -1.0, 1.0),
    "LOGISTIC": "1.0f / (1.0f + exp(-v))",
    "TANH": "tanh(v)",
    "EXP": "exp(v)",
    "LOG": "log(v)",
    # (TFLite's order: x * 6 would overflow near float32's largest)
    "HARD_SWISH": "(v * (1.0f / 6.0f)) * clamp(v + 3.0f, (float4)(0.0f), (float4)(6.0f))",
    "ABS": "fabs(v)",
    "RSQRT": "rsqrt(v)",
    "SQRT": "sqrt(v)",
    "NEG": "-v",
    "SQUARE": "v * v",
    "SIN": "sin(v)",
    "COS": "cos(v)",
    "ELU": "select(expm1(v), v, isgreater(v, (float4)(0.0f)))",
    "LOGICAL_NOT": "convert_float4(-(v == 0.0f))",
    "LEAKY_RELU": "select(v * ALPHA, v, isgreaterequal(v, (float4)(0.0f)))",
    "QUANT_SIM": "QSIM",  # graph.float_view's quantization simulator: see unary_expr
    # (TFLite's 0.5 x erfc(-x / sqrt 2), exact in the negative tail where 1 + erf(x) cancels; ``approximate``:
    # GELU_TANH)
    "GELU": "0.5f * v * erfc(v * -0.70710678118654752f)",
    "FLOOR": "floor(v)",
    "CEIL": "ceil(v)",
    "ROUND": "rint(v)",  # (half to even, as TFLite)
    # (LiteRT's: +0.0 for a zero of either sign, NaN for NaN; a vector comparison's true is -1)
    "SIGN": "select(convert_float4(isless(v, (float4)(0.0f)) - isgreater(v, (float4)(0.0f))), v, isnan(v))",
    "RELU_0_TO_1": clamped("v", 0.0, 1.0),
    # (graph.passes.fuse_swish: MUL(x, LOGISTIC(x)) as those two ops compute it, so its values are theirs)
    SWISH: "v * (1.0f / (1.0f + exp(-v)))",
}
# GELU with ``approximate`` set: TFLite's 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
GELU_TANH = "0.5f * v * (1.0f + tanh(0.79788456080286536f * (v + 0.044715f * v * v * v)))"


def unary_expr(op) -> str:
    """The float4 expression of a unary op over ``v``, with the op's options filled in."""
    expr = GELU_TANH if op.name == "GELU" and op.options.get("approximate") else UNARY[op.name]
    if op.name == "QUANT_SIM":
        o = op.options
        if not o.get("tflgpu_sim"):
            raise Unsupported("a model's own custom op named QUANT_SIM")
        if "scale" not in o:
            return "v"
        if o.get("rounding") == "raw_mean":  # (a mean of integers: .5 exactly, up to float error; OpenCL's
            # round() is half away from zero)
            inv = float(np.float32(1.0) / np.float32(o["scale"]))
            zp, lo, hi, scale = (float(o[k]) for k in ("zero_point", "qmin", "qmax", "scale"))
            q = f"round(rint((v * {c_float(inv)} + {c_float(zp)}) * {c_float(RAW_MEAN_SNAP)}) * {c_float(1 / RAW_MEAN_SNAP)})"
            return (f"(clamp({q}, (float4)({c_float(lo)}), (float4)({c_float(hi)})) - {c_float(zp)})"
                    f" * {c_float(np.float32(scale))}")
        grid = sim_grid(o)  # (ops.quantization.SimGrid: TFLite's rounding in five steps, an activation's clamp
        # taken over included)
        if grid is None:
            raise Unsupported(f"a quantization simulator whose clamp {o.get('clamp')} leaves no value on its grid")
        q = f"rint(clamp(v * {c_float(grid.inv)}, (float4)({c_float(grid.lo)}), (float4)({c_float(grid.hi)})))"
        return f"({q}{' + 0.0f' if grid.plus_zero else ''}) * {c_float(grid.scale)}"
    return expr.replace("ALPHA", c_float(op.options.get('alpha', 0.2)))

# comparisons and logic produce/consume bool tensors, stored as exact 0.0 / 1.0 (a vector comparison's true is -1:
# negated as an integer before the conversion, since 0 times -1.0f is -0.0, which a product or a division would
# carry on)
LOGIC = {
    "LESS": "convert_float4(-(isless(va, vb)))",
    "LESS_EQUAL": "convert_float4(-(islessequal(va, vb)))",
    "GREATER": "convert_float4(-(isgreater(va, vb)))",
    "GREATER_EQUAL": "convert_float4(-(isgreaterequal(va, vb)))",
    "EQUAL": "convert_float4(-(isequal(va, vb)))",
    "NOT_EQUAL": "convert_float4(-(isnotequal(va, vb)))",
    "LOGICAL_AND": "convert_float4(-((va != 0.0f) && (vb != 0.0f)))",
    "LOGICAL_OR": "convert_float4(-((va != 0.0f) || (vb != 0.0f)))",
}

BINARY = {
    "ADD": "va + vb", "SUB": "va - vb", "MUL": "va * vb", "DIV": "va / vb",
    # (TFLite's a > b ? a : b: the second of two equal zeros, the second where either is NaN; fmax may differ)
    "MAXIMUM": "select(vb, va, va > vb)", "MINIMUM": "select(vb, va, va < vb)",
    "SQUARED_DIFFERENCE": "(va - vb) * (va - vb)",
    # (vb: alpha, per channel; a conv's epilogue where its output is va: U-Net's PReLUs)
    "PRELU": "select(va * vb, va, isgreaterequal(va, (float4)(0.0f)))",
    "POW": "pow(va, vb)",
    # (TFLite's float floor mod: fmod (exact in OpenCL too), then the divisor added where the remainder is nonzero
    # and their signs differ. Not FLOOR_DIV: TFLite's floor of the correctly rounded quotient, where OpenCL's
    # division may be 2.5 ulp off, which moves floor(6 / 3) to 1: it stays on the CPU)
    "FLOOR_MOD": ("select(fmod(va, vb), fmod(va, vb) + vb, "
                  "(fmod(va, vb) != 0.0f) & ((vb < 0.0f) != (fmod(va, vb) < 0.0f)))"),
    "ATAN2": "atan2(va, vb)",
}
