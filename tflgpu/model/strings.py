"""TFLite's packed string tensors: int32 count, int32 offsets[count + 1], then the bytes."""

from __future__ import annotations

import struct


def decode_strings(raw: bytes) -> list[bytes]:
    if len(raw) < 4:
        raise ValueError("Invalid string tensor: shorter than its header")
    (count,) = struct.unpack_from("<i", raw, 0)
    if count < 0 or 4 * (count + 2) > len(raw):
        raise ValueError(f"Invalid string tensor: count {count} does not fit in {len(raw)} bytes")
    offsets = struct.unpack_from(f"<{count + 1}i", raw, 4)
    out = []
    for a, b in zip(offsets, offsets[1:]):
        if not 0 <= a <= b <= len(raw):
            raise ValueError("Invalid string tensor: offsets out of range")
        out.append(raw[a:b])
    return out


def encode_strings(items: list[bytes]) -> bytes:
    count = len(items)
    header = 4 * (count + 2)
    offsets, pos = [], header
    for s in items:
        offsets.append(pos)
        pos += len(s)
    offsets.append(pos)
    return struct.pack(f"<i{count + 1}i", count, *offsets) + b"".join(items)
