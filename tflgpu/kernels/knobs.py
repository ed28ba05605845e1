"""Typed generator knobs: what a tunable generator family takes, as a frozen dataclass.

Each family (conv, depthwise, fully connected, transposed conv) declares, next to its source function:

- its knobs, as the fields of a frozen dataclass derived from ``Knobs``;
- ``default(shape)``: the heuristic point for a shape (the fields' own defaults where no heuristic applies);
- ``space(shape)``: the values the tuner searches for that shape (pruned to values that can change its code);
- ``problems(shape)``: why a point is invalid for that shape (empty when it is valid).

``resolve`` turns a caller's parameters (a tuning record, a tuner's candidate, a test's explicit point) into
knobs: the default with those values in place, then checked. An invalid point is rejected with
``InvalidKnobs`` — never quietly mapped to a neighbouring point — so the tuner sees exactly the points it
asked for, and a stored record always means the kernel it was measured as.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import Unsupported

# the knobs that change how a kernel is launched rather than what each work-item computes: how many launches
# (a composite op's ``fused``) and the work-group (``local_size``, a ``group_tile``'s own); all a step bound by its
# host's enqueues can gain from (autotune.tuner.KernelTuner.neighbors tries them first there)
LAUNCH_KNOBS = ("fused", "local_size", "group_tile")


class InvalidKnobs(Unsupported):
    """A point a generator family does not take for this shape (or a knob it does not have)."""


@dataclass(frozen=True)
class Knobs:
    """Base of the knob dataclasses; subclasses add fields and override the three classmethods/methods below."""

    @classmethod
    def default(cls, shape: Any) -> Knobs:
        return cls()

    @classmethod
    def space(cls, shape: Any) -> dict[str, list]:
        return {}

    def problems(self, shape: Any) -> list[str]:
        return []

    @classmethod
    def resolve(cls, shape: Any, params: dict[str, Any] | None = None) -> Knobs:
        """The default for ``shape`` with ``params`` in place; raises InvalidKnobs for an unknown knob or an
        invalid point."""
        params = dict(params or {})
        unknown = sorted(set(params) - {f.name for f in fields(cls)})
        if unknown:
            raise InvalidKnobs(f"{cls.__name__} has no knob {', '.join(unknown)}")
        knobs = replace(cls.default(shape), **params)
        bad = knobs.problems(shape)
        if bad:
            raise InvalidKnobs(f"{cls.__name__}: " + "; ".join(bad))
        return knobs

    def params(self) -> dict[str, Any]:
        """Every knob's value by name (what a KernelSpec records as generated with)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def fitted(global_size: tuple[int, ...], local_size: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """A ``local_size`` knob's work-group for a grid: in each dimension the largest divisor of the grid's size that
    is not above the knob's (OpenCL 1.2 launches only groups dividing the grid), so a knob's value means the same
    for every shape (a kernel launched without a work-group costs NVIDIA's OpenCL ~5 us more host time)."""
    if local_size is None:
        return None
    return tuple(max(d for d in range(1, min(g, w) + 1) if g % d == 0) for g, w in zip(global_size, local_size))


def positive_int(name: str, v: Any) -> list[str]:
    return [] if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else [f"{name} must be a positive int"]


def one_of(name: str, v: Any, allowed) -> list[str]:
    """``v`` is one of ``allowed``, a bool only where a bool is allowed (Python's ``1 == True`` would let a flag
    take 1 and a count take True)."""
    ok = any(v == a and isinstance(v, bool) == isinstance(a, bool) for a in allowed)
    return [] if ok else [f"{name}={v!r} is not one of {list(allowed)}"]


def work_group(v: Any, dims: int = 3) -> list[str]:
    """A local size: None (the driver's choice) or ``dims`` positive ints, each the most a dimension takes (the
    kernel's work-group is ``fitted`` to its grid; whether it fits the device is the launcher's check)."""
    if v is None:
        return []
    if isinstance(v, tuple) and len(v) == dims and all(not positive_int("", d) for d in v):
        return []
    return [f"local_size={v!r} is not None or {dims} positive ints"]
