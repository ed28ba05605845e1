"""Winograd F(4x4, 3x3) for 3x3, stride-1, undilated CONV_2D (a variant of the conv generator).

Per 4x4 output tile and output slice: for each input slice, the 6x6 input tile d becomes
V = B^T d B; the 36 positions multiply with the pre-transformed weights U = G g G^T (a 4x4
channel block each, the same float4 mads as the direct conv) into M; finally Y = A^T M A.
That is 36 channel products per 16 outputs instead of 144 (4x fewer), paid for with transforms.
The transformed weights stay float32 under FP16 storage: the transforms amplify their rounding
(16-channel conv, FP16 storage: 7.4e-2 max error with FP16 weights, 4.5e-3 with float32 weights;
the direct conv: 6.1e-3).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from .common import c_float

F = Fraction
BT = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
      [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
G = [[F(1, 4), 0, 0], [F(-1, 6), F(-1, 6), F(-1, 6)], [F(-1, 6), F(1, 6), F(-1, 6)],
     [F(1, 24), F(1, 12), F(1, 6)], [F(1, 24), F(-1, 12), F(1, 6)], [0, 0, 1]]
AT = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]


def transform_weights(w: np.ndarray) -> np.ndarray:
    """[O, 3, 3, I] -> U = G g G^T as [O, 6, 6, I] (float64 math, float32 result)."""
    g = np.array(G, dtype=np.float64)
    return np.einsum("ak,okli,bl->oabi", g, w.astype(np.float64), g).astype(np.float32)


def _lin(coefs, terms) -> str:
    """C expression for sum(c * term) skipping zeros (terms are float4 names)."""
    parts = []
    for c, t in zip(coefs, terms):
        c = F(c)
        if c == 0:
            continue
        if c == 1:
            parts.append(f"+{t}")
        elif c == -1:
            parts.append(f"-{t}")
        else:
            parts.append(f"+({c_float(c)})*{t}")
    return "".join(parts).lstrip("+") or "(float4)(0.0f)"


def winograd_source(name, *, ih, iw, sin, oh, ow, sout, pt, pl, batch, act_code: str, store, ep_params,
                    hint="float4") -> str:
    """``store(index)``: C code applying fused ops/masking to ``v`` and storing it at ``index``."""
    th, tw = (oh + 3) // 4, (ow + 3) // 4
    extra = "".join(f"{p}, " for p in ep_params)
    L = [f"__attribute__((vec_type_hint({hint}))) __kernel void {name}(__global const STORE_T* src, "
         f"__global const float* wts, __global const STORE_T* bias, {extra}__global STORE_T* dst) {{",
         "  const int tx = get_global_id(0); const int Y = get_global_id(1); const int S = get_global_id(2);",
         f"  if (tx >= {tw} || Y >= {batch * th} || S >= {sout}) return;",
         f"  const int b = Y / {th}; const int ty = Y % {th};",
         f"  const int iy0 = ty * 4 - {pt}; const int ix0 = tx * 4 - {pl};"]
    L += [f"  float4 m{p} = (float4)(0.0f);" for p in range(36)]
    L.append(f"  for (int i = 0; i < {sin}; ++i) {{")
    L.append(f"    const int base = (b * {sin} + i) * {ih};")
    for r in range(6):
        for c in range(6):
            L.append(f"    const float4 d{r}_{c} = (iy0 + {r} >= 0 && iy0 + {r} < {ih} && ix0 + {c} >= 0 && "
                     f"ix0 + {c} < {iw}) ? LD4(src, (base + iy0 + {r}) * {iw} + ix0 + {c}) : (float4)(0.0f);")
    for r in range(6):  # t = B^T d
        for c in range(6):
            L.append(f"    const float4 t{r}_{c} = {_lin(BT[r], [f'd{k}_{c}' for k in range(6)])};")
    for r in range(6):  # V = t B  (B = BT transposed)
        for c in range(6):
            L.append(f"    const float4 v{r * 6 + c} = {_lin(BT[c], [f't{r}_{k}' for k in range(6)])};")
    L.append("    const int wb = (S * " + str(sin) + " + i) * 144;")
    for p in range(36):
        L.append(f"    m{p} = mad((float4)(v{p}.x), vload4(wb + {p * 4}, wts), mad((float4)(v{p}.y), vload4(wb + {p * 4 + 1}, wts), "
                 f"mad((float4)(v{p}.z), vload4(wb + {p * 4 + 2}, wts), mad((float4)(v{p}.w), vload4(wb + {p * 4 + 3}, wts), m{p}))));")
    L.append("  }")
    for r in range(4):  # s = A^T m
        for c in range(6):
            L.append(f"  const float4 s{r}_{c} = {_lin(AT[r], [f'm{k * 6 + c}' for k in range(6)])};")
    L.append("  const float4 bv = LD4(bias, S);")
    for r in range(4):
        for c in range(4):
            L.append(f"  if (ty * 4 + {r} < {oh} && tx * 4 + {c} < {ow}) {{")
            L.append(f"    float4 v = {_lin(AT[c], [f's{r}_{k}' for k in range(6)])} + bv;")
            L.append(f"    {act_code}")
            L.append("    " + store(f"((b * {sout} + S) * {oh} + ty * 4 + {r}) * {ow} + tx * 4 + {c}"))
            L.append("  }")
    L.append("}")
    return "\n".join(L)
