"""TFLite's conventions for op attributes, as both backends apply them."""

from __future__ import annotations

import numpy as np

# fused_activation_function codes (the schema's ActivationFunctionType)
ACTIVATION_NAMES = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}
# As in TFLite's CalculateActivationRange only the RELU family clamps: a fused TANH or SIGN_BIT on
# conv/pool/elementwise ops is a no-op there, and LiteRT's outputs are what we reproduce.
_CLAMPS = {1: (0.0, np.inf), 2: (-1.0, 1.0), 3: (0.0, 6.0)}
ACTIVATION_CODES = {ACTIVATION_NAMES[code]: code for code in _CLAMPS}  # (the ops a fused activation clamps as)


def activation_bounds(code: int | None) -> tuple[float, float]:
    """Clamp bounds of a fused activation ((-inf, inf) where it clamps nothing). TFLite clamps as
    ``std::min(std::max(x, lo), hi)``, ``std::max(a, b)`` being ``a < b ? b : a``: a value is replaced only where it
    lies strictly outside, so -0.0 above a lower bound of 0 stays -0.0 (a division by it then gives -inf, not +inf)
    and NaN stays NaN. OpenCL's ``fmax`` / ``clamp`` may return either zero and return the bound for NaN, numpy's
    ``maximum(-0.0, 0.0)`` returns +0.0; ``np.clip`` and the compare-and-select forms are TFLite's."""
    return _CLAMPS.get(code or 0, (-np.inf, np.inf))


def conv_padding(in_size: int, k: int, stride: int, dilation: int, padding: int, before: int = 0,
                 after: int = 0) -> tuple[int, int]:
    """(output size, padding before) for TFLite's SAME (0) / VALID (1) padding, of an input with ``before`` and
    ``after`` zeros added (a merged PAD's, ``explicit_padding``: the conv sees the padded size; its reads outside the
    input are zeros either way, so only the offset moves)."""
    size = in_size + before + after
    eff = (k - 1) * dilation + 1
    if padding == 0:
        out = (size + stride - 1) // stride
    else:
        out = (size - eff + stride) // stride
    total = max((out - 1) * stride + eff - size, 0)
    return out, total // 2 + before


def pixel_for_pixel(kh: int, kw: int, sh: int, sw: int, pt: int, pl: int, in_hw: tuple[int, int],
                    out_hw: tuple[int, int]) -> bool:
    """A conv whose output pixel i reads input pixel i alone (1x1, stride 1, no padding on any side): a GEMM over
    the image's pixels. A merged PAD's zeros after the input (``explicit_padding``'s bottom / right) leave the
    leading padding 0 but make the output larger than the input: not this."""
    return kh == kw == sh == sw == 1 and pt == pl == 0 and tuple(out_hw) == tuple(in_hw)


def explicit_padding(options: dict) -> tuple[int, int, int, int]:
    """The zeros (top, bottom, left, right) a merged PAD adds around a conv's input (graph.passes.padded_conv)."""
    return tuple(options.get("explicit_padding", (0, 0, 0, 0)))


def conv_options(options: dict) -> tuple[int, int, int, int, int]:
    """(stride_h, stride_w, dilation_h, dilation_w, padding) of a convolution's options."""
    return (options.get("stride_h", 1), options.get("stride_w", 1), options.get("dilation_h_factor", 1) or 1,
            options.get("dilation_w_factor", 1) or 1, options.get("padding", 0))


def resize_scale(in_size: int, out_size: int, align_corners: bool) -> float:
    """Input pixels per output pixel of RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR."""
    if align_corners and out_size > 1:
        return (in_size - 1) / (out_size - 1)
    return in_size / out_size


def axis_slice(b: int, e: int, s: int, size: int, begin_masked: bool, end_masked: bool, offset: bool) -> slice:
    """One axis of STRIDED_SLICE with TFLite's rules (wrap negatives, clamp by stride sign)."""
    lo, hi = (0, size) if s > 0 else (-1, size - 1)
    if begin_masked:
        start = 0 if s > 0 else size - 1
    else:
        start = min(max(b + size if b < 0 else b, lo), hi)
    if offset:  # end is relative to start: not wrapped, and end_mask does not apply
        stop = min(max(start + e, lo), hi)
    elif end_masked:
        stop = size if s > 0 else -1
    else:
        stop = min(max(e + size if e < 0 else e, lo), hi)
    if start < 0:  # only possible with a negative stride: nothing to take
        return slice(0, 0)
    return slice(start, stop if stop >= 0 else None, s)
