"""TFLite's GPU mapping of a tensor's shape onto BHWC (rank <= 4), with its 4-channel slice count."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """A tensor as BHWC (rank <= 4 mapped onto 4-D) with its slice count."""

    b: int
    h: int
    w: int
    c: int

    @property
    def s(self) -> int:
        return (self.c + 3) // 4

    @property
    def elements(self) -> int:
        """Storage elements (scalars), padding lanes included."""
        return self.b * self.s * self.h * self.w * 4

    @property
    def dims(self) -> tuple[int, int, int, int]:
        return (self.b, self.h, self.w, self.c)


def bhwc(shape: tuple[int, ...]) -> Layout | None:
    """TFLite's GPU mapping of a shape onto BHWC, or None for rank > 4."""
    r = len(shape)
    if r == 0:
        return Layout(1, 1, 1, 1)
    if r == 1:
        return Layout(1, 1, 1, shape[0])
    if r == 2:
        return Layout(shape[0], 1, 1, shape[1])
    if r == 3:
        return Layout(shape[0], 1, shape[1], shape[2])
    if r == 4:
        return Layout(*shape)
    return None
