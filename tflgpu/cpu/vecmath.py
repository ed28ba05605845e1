"""Vectorizable float32 exp, sigmoid and tanh for the numba kernels.

numba calls the C library's ``expf`` / ``tanhf`` once per value (llvmlite is built without a vector math
library), so a loop over them runs at a few nanoseconds a value; these are Cephes' polynomials, whose loops
vectorize (AVX-512 here): within 3e-7 relative of float64 from -100 to 100, NaN kept. Each loop vectorizes only
over distinct arrays, so the functions take their scratch arrays from the caller.
"""

from __future__ import annotations

import numpy as np

from ..ops.jit import njit

# Cephes' expf: a degree-6 polynomial of the remainder, times 2^k built from its bits
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)
_EXP_LO, _EXP_HI = np.float32(-86.6), np.float32(88.7)  # (2^(k-1) stays a normal float between these)


@njit(cache=True)
def exp_into(x, out, bits) -> None:
    """out = exp(x) for float32 arrays (within 2 ulp; clamped to [exp(-86.6), exp(88.7)], NaN kept); ``bits``:
    int32 scratch of x's size. ``out`` must not be ``x``: the loops vectorize only for distinct arrays."""
    n = x.size
    for i in range(n):
        v = min(max(x[i], _EXP_LO), _EXP_HI)
        k = np.floor(v * _LOG2E + np.float32(0.5))
        r = v - k * _LN2_HI - k * _LN2_LO
        p = np.float32(1.9875691500e-4)
        p = p * r + np.float32(1.3981999507e-3)
        p = p * r + np.float32(8.3334519073e-3)
        p = p * r + np.float32(4.1665795894e-2)
        p = p * r + np.float32(1.6666665459e-1)
        p = p * r + np.float32(5.0000001201e-1)
        p = p * r * r + r + np.float32(1.0)
        bits[i] = (np.int32(k) + np.int32(126)) << 23  # 2^(k-1): k = 128 at the top
        out[i] = x[i] if np.isnan(x[i]) else p
    scale = bits.view(np.float32)
    for i in range(n):
        out[i] = out[i] * scale[i] * np.float32(2.0)


@njit(cache=True)
def sigmoid_into(v, e, t, bits) -> None:
    """v = 1 / (1 + exp(-v)), in place; ``e``, ``t``: float32 scratch."""
    for i in range(v.size):
        e[i] = -v[i]
    exp_into(e, t, bits)
    for i in range(v.size):
        v[i] = np.float32(1.0) / (np.float32(1.0) + t[i])


@njit(cache=True)
def tanh_into(v, e, t, bits) -> None:
    """v = tanh(v), in place (Cephes' tanhf: an odd polynomial below 0.625, else 1 - 2 / (exp(2|v|) + 1));
    ``e``, ``t``: float32 scratch."""
    n = v.size
    for i in range(n):
        e[i] = np.float32(2.0) * abs(v[i])
    exp_into(e, t, bits)
    for i in range(n):
        x = v[i]
        z = x * x
        small = ((((np.float32(-5.70498872745e-3) * z + np.float32(2.06390887954e-2)) * z
                   - np.float32(5.37397155531e-2)) * z + np.float32(1.33314422036e-1)) * z
                 - np.float32(3.33332819422e-1)) * z * x + x
        big = np.float32(1.0) - np.float32(2.0) / (t[i] + np.float32(1.0))
        big = big if x >= 0 else -big
        v[i] = small if abs(x) < np.float32(0.625) else x if np.isnan(x) else big
