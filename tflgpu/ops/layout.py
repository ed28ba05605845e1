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


def same_slice_order(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether tensors of shapes ``a`` and ``b`` hold the same values in the same slice-layout order (the same images,
    channels and pixels per image: (1, 256) and (256,), (1, 4, 8, C) and (1, 32, C)): a reshape between them moves
    nothing."""
    la, lb = bhwc(tuple(a)), bhwc(tuple(b))
    return la is not None and lb is not None and (la.b, la.c, la.h * la.w) == (lb.b, lb.c, lb.h * lb.w)
