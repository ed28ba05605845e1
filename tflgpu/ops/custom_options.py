"""MediaPipe custom ops keep their options as raw C structs (not flexbuffers).

TfLitePadding in those structs: 0 unknown, 1 SAME, 2 VALID; we map to the
builtin schema's 0 SAME / 1 VALID.
"""

from __future__ import annotations

import struct

from .context import OpView

_PAD = {1: 0, 2: 1}


def transpose_conv_params(ctx: OpView) -> tuple[int, int, int]:
    """TfLiteTransposeConvParams: padding, stride_width, stride_height (int32 each)."""
    raw = ctx.op.custom_options
    if len(raw) < 12:
        raise ctx.fail(f"custom options hold {len(raw)} bytes, TfLiteTransposeConvParams needs 12")
    pad, sw, sh = struct.unpack_from("<3i", raw, 0)
    if pad not in _PAD or sw < 1 or sh < 1:
        raise ctx.fail(f"bad transpose-conv options padding={pad} stride={sw}x{sh}")
    return _PAD[pad], sw, sh


def pool_params(ctx: OpView) -> dict[str, int]:
    """TfLitePoolParams: padding, stride_w, stride_h, filter_w, filter_h, activation (+ computed)."""
    raw = ctx.op.custom_options
    if len(raw) < 24:
        raise ctx.fail(f"custom options hold {len(raw)} bytes, TfLitePoolParams needs at least 24")
    pad, sw, sh, fw, fh, act = struct.unpack_from("<6i", raw, 0)
    if pad not in _PAD or min(sw, sh, fw, fh) < 1:
        raise ctx.fail(f"bad pooling options padding={pad} stride={sw}x{sh} filter={fw}x{fh}")
    return {"padding": _PAD[pad], "stride_w": sw, "stride_h": sh, "filter_width": fw,
            "filter_height": fh, "fused_activation_function": act}
