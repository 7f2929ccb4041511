"""Balanced block partitions and the choice of a 2-D process grid.

Pure Python: no MPI, no array library.  Along an extent ``L`` split in ``P`` parts,
part ``p`` owns ``[floor(p*L/P), floor((p+1)*L/P))`` (DESIGN.md section 4); parts
differ in size by at most one and may be empty when ``L < P``.
"""
from __future__ import annotations

from itertools import product
from typing import Iterator, Sequence

from .box import Box


def block_range(length: int, parts: int, index: int) -> tuple[int, int]:
    """The half-open range owned by part ``index`` of ``parts`` over ``[0, length)``."""
    if length < 0 or parts < 1 or not 0 <= index < parts:
        raise ValueError(f"block_range: need length >= 0, parts >= 1, 0 <= index < parts; "
                         f"got length={length}, parts={parts}, index={index}")
    return index * length // parts, (index + 1) * length // parts


def block_owner(i: int, length: int, parts: int) -> int:
    """The part that owns index ``i`` (the non-empty one when some parts are empty)."""
    if not 0 <= i < length:
        raise ValueError(f"block_owner: index {i} outside [0, {length})")
    # Largest p with floor(p*L/P) <= i.
    return ((i + 1) * parts - 1) // length


def _divisor_pairs(n: int) -> list[tuple[int, int]]:
    return [(d, n // d) for d in range(1, n + 1) if n % d == 0]


def choose_grid(nprocs: int, extent: Sequence[int] | None = None) -> tuple[int, int]:
    """Pick a ``(Py, Px)`` grid with ``Py * Px == nprocs``.

    With ``extent = (H, W)`` the grid minimises the halo perimeter of the largest
    block, ``ceil(H/Py) + ceil(W/Px)``; without it, the most square grid.  Ties
    prefer more rows than columns: in the (H, W, C, N) layout a block that spans
    whole rows is one contiguous slab.  Prime counts give ``(P, 1)``.
    """
    if nprocs < 1:
        raise ValueError(f"choose_grid: nprocs must be >= 1, got {nprocs}")

    def cost(pair: tuple[int, int]) -> tuple[float, int]:
        py, px = pair
        if extent is None:
            return (abs(py - px), -py)
        h, w = extent
        return (-(-h // py) + -(-w // px), -py)

    return min(_divisor_pairs(nprocs), key=cost)


def grid_coords(dims: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """All coordinates of a grid in row-major order (the order of MPI Cartesian ranks)."""
    return product(*(range(d) for d in dims))


def block_box(shape: Sequence[int], dims: Sequence[int], coords: Sequence[int]) -> Box:
    """The block of an array of ``shape`` owned by grid position ``coords``.

    ``dims``/``coords`` cover the leading axes; the remaining axes are not split.
    """
    if len(dims) != len(coords) or len(dims) > len(shape):
        raise ValueError(f"block_box: dims {tuple(dims)} and coords {tuple(coords)} do not fit shape {tuple(shape)}")
    ranges = [block_range(L, P, c) for L, P, c in zip(shape, dims, coords)]
    ranges += [(0, L) for L in shape[len(dims):]]
    return Box([r[0] for r in ranges], [r[1] for r in ranges])


def block_boxes(shape: Sequence[int], dims: Sequence[int]) -> list[Box]:
    """The blocks of every grid position, in row-major (Cartesian rank) order."""
    return [block_box(shape, dims, c) for c in grid_coords(dims)]
