"""Greedy-by-size assignment of intermediate tensors to shared buffers (TFLite's memory manager idea).

Tensors are placed largest first into the smallest existing buffer that is
big enough and free over the tensor's whole lifetime; otherwise a new buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SharedBuffer:
    size: int
    intervals: list[tuple[int, int]] = field(default_factory=list)

    def free_during(self, first: int, last: int) -> bool:
        return all(last < a or first > b for a, b in self.intervals)


def plan_memory(tensors: dict[int, tuple[int, int, int]]) -> tuple[dict[int, int], list[int]]:
    """tensors: id -> (bytes, first use, last use). Returns (id -> buffer index, buffer sizes)."""
    buffers: list[SharedBuffer] = []
    assignment: dict[int, int] = {}
    for tid, (size, first, last) in sorted(tensors.items(), key=lambda kv: (-kv[1][0], kv[0])):
        best = None
        for i, buf in enumerate(buffers):
            if buf.size >= size and buf.free_during(first, last) and (best is None or buf.size < buffers[best].size):
                best = i
        if best is None:
            # grow a free buffer rather than add one, when one is free but small
            for i, buf in enumerate(buffers):
                if buf.free_during(first, last) and (best is None or buf.size > buffers[best].size):
                    best = i
            if best is None:
                buffers.append(SharedBuffer(size))
                best = len(buffers) - 1
            buffers[best].size = max(buffers[best].size, size)
        buffers[best].intervals.append((first, last))
        assignment[tid] = best
    return assignment, [b.size for b in buffers]
