"""Half-open n-D index boxes ``[lo, hi)``, the unit of all index arithmetic.

Pure Python: no MPI, no array library.  A box whose extent is zero on any axis is
*empty*.  Extents are clamped at zero per axis (``hi >= lo``), so an empty box keeps
the extents of its other axes (a rank that owns no rows still has C and N), and
all empty boxes of one rank compare equal: they hold the same (no) points.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True, eq=False)
class Box:
    """An n-D half-open box ``[lo, hi)`` in global coordinates.

    Parameters
    ----------
    lo, hi : sequence of int
        Lower (inclusive) and upper (exclusive) corners, same length.
    """

    lo: tuple[int, ...]
    hi: tuple[int, ...]

    def __init__(self, lo: Sequence[int], hi: Sequence[int]):
        lo_t = tuple(int(v) for v in lo)
        hi_t = tuple(int(v) for v in hi)
        if len(lo_t) != len(hi_t):
            raise ValueError(f"Box corners differ in rank: lo={lo_t}, hi={hi_t}")
        hi_t = tuple(max(l, h) for l, h in zip(lo_t, hi_t))
        object.__setattr__(self, "lo", lo_t)
        object.__setattr__(self, "hi", hi_t)
        # kept: asked for thousands of times a step (slices, exchanges, ops' checks)
        object.__setattr__(self, "_shape", tuple(h - l for l, h in zip(lo_t, hi_t)))

    # -- construction -------------------------------------------------------
    @classmethod
    def from_shape(cls, shape: Sequence[int], origin: Sequence[int] | None = None) -> "Box":
        """The box of an array of ``shape`` whose first element is at ``origin``."""
        origin = (0,) * len(shape) if origin is None else tuple(origin)
        return cls(origin, tuple(o + s for o, s in zip(origin, shape)))

    @classmethod
    def empty(cls, ndim: int) -> "Box":
        return cls((0,) * ndim, (0,) * ndim)

    # -- properties ---------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.lo)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def is_empty(self) -> bool:
        return self.size == 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Box):
            return NotImplemented
        if self.is_empty or other.is_empty:
            return self.ndim == other.ndim and self.is_empty and other.is_empty
        return self.lo == other.lo and self.hi == other.hi

    def __hash__(self) -> int:
        return hash(("empty", self.ndim)) if self.is_empty else hash((self.lo, self.hi))

    # -- algebra ------------------------------------------------------------
    def _check(self, other: "Box") -> None:
        if self.ndim != other.ndim:
            raise ValueError(f"boxes of different rank: {self} and {other}")

    def intersect(self, other: "Box") -> "Box":
        """The common part of two boxes (possibly empty)."""
        self._check(other)
        return Box(tuple(map(max, self.lo, other.lo)), tuple(map(min, self.hi, other.hi)))

    __and__ = intersect

    def hull(self, other: "Box") -> "Box":
        """The smallest box containing both (an empty box is ignored)."""
        self._check(other)
        if self.is_empty:
            return other
        if other.is_empty:
            return self
        return Box(tuple(map(min, self.lo, other.lo)), tuple(map(max, self.hi, other.hi)))

    def overlaps(self, other: "Box") -> bool:
        """True if the two boxes share an element: ``not (self & other).is_empty``, without building it
        (an exchange plan asks it of every pair of ranks and most pairs are apart)."""
        self._check(other)
        return all(max(a, c) < min(b, d) for a, b, c, d in zip(self.lo, self.hi, other.lo, other.hi))

    def contains(self, other: "Box") -> bool:
        """True if ``other`` lies inside this box (the empty box lies in every box)."""
        self._check(other)
        if other.is_empty:
            return True
        return all(a <= c and d <= b for a, b, c, d in zip(self.lo, self.hi, other.lo, other.hi))

    def contains_point(self, point: Sequence[int]) -> bool:
        return len(point) == self.ndim and all(l <= p < h for l, p, h in zip(self.lo, point, self.hi))

    def translate(self, offset: Sequence[int]) -> "Box":
        if len(offset) != self.ndim:
            raise ValueError(f"offset {tuple(offset)} does not match box rank {self.ndim}")
        return Box(tuple(l + o for l, o in zip(self.lo, offset)), tuple(h + o for h, o in zip(self.hi, offset)))

    def replace(self, axis: int, lo: int, hi: int) -> "Box":
        """This box with the extent of one axis replaced by ``[lo, hi)``."""
        los, his = list(self.lo), list(self.hi)
        los[axis], his[axis] = lo, hi
        return Box(los, his)

    def slices_in(self, outer: "Box") -> tuple[slice, ...]:
        """Slices selecting this box in an array that covers ``outer``.

        This is the local view of a global box inside a rank's window.  An empty
        box gives an empty view that keeps the extents of its other axes where
        they lie inside ``outer``.
        """
        if not outer.contains(self):
            raise ValueError(f"{self} is not inside {outer}")
        ext = outer.shape
        return tuple(slice(min(max(l - o, 0), e), min(max(h - o, 0), e))
                     for l, h, o, e in zip(self.lo, self.hi, outer.lo, ext))

    def is_contiguous_in(self, outer: "Box") -> bool:
        """True if this box is one contiguous run of memory in a C-ordered array covering ``outer``.

        Pure index arithmetic, no array needed: after the leading axes of extent 1,
        the first axis longer than 1 may be cut anywhere, but every axis after it
        must span ``outer`` whole (whole rows of an (H, W, C, N) window, say).  Boxes
        of at most one element, the empty box included, are contiguous.  This is
        what NumPy's ``c_contiguous`` flag says of ``arr[self.slices_in(outer)]``
        for a C-contiguous ``arr``; an exchange sends such a box without packing it.
        """
        if not outer.contains(self):
            raise ValueError(f"{self} is not inside {outer}")
        if self.size <= 1:
            return True
        inner, full = self.shape, outer.shape
        first = next(ax for ax, n in enumerate(inner) if n > 1)
        return inner[first + 1:] == full[first + 1:]

    def __repr__(self) -> str:
        if self.is_empty:
            return f"Box.empty({self.ndim})"
        return "Box(" + ", ".join(f"{l}:{h}" for l, h in zip(self.lo, self.hi)) + ")"

    # -- serialisation (for MPI allgather of plain ints) ---------------------
    def to_tuple(self) -> tuple[int, ...]:
        return self.lo + self.hi

    @classmethod
    def from_tuple(cls, t: Sequence[int]) -> "Box":
        n = len(t) // 2
        return cls(t[:n], t[n:])


def hull_of(boxes: Iterable[Box]) -> Box:
    """The smallest box containing every box of a non-empty iterable."""
    it = iter(boxes)
    try:
        out = next(it)
    except StopIteration:
        raise ValueError("hull_of() needs at least one box") from None
    for b in it:
        out = out.hull(b)
    return out


def grow(box: Box, before: Sequence[int], after: Sequence[int], bounds: Box) -> Box:
    """``box`` widened by ``before``/``after`` cells per axis, clipped to ``bounds``.

    The usual input window of a halo exchange; asymmetric widths are allowed.
    An empty box stays empty.
    """
    if box.is_empty:
        return box
    pad = lambda v: tuple(v) + (0,) * (box.ndim - len(v))  # noqa: E731 - trailing axes unpadded
    b, a = pad(before), pad(after)
    if any(x < 0 for x in b + a):
        raise ValueError(f"halo widths must be >= 0, got before={tuple(before)}, after={tuple(after)}")
    return Box(tuple(l - x for l, x in zip(box.lo, b)), tuple(h + x for h, x in zip(box.hi, a))) & bounds
