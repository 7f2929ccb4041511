"""The messages (transfers) of an exchange between two layouts of one array: pure index arithmetic.

Given the boxes every rank *owns* in a source layout (a partition of the global
box) and the *window* every rank needs in a destination layout, rank ``r`` sends
``owned[r] & windows[p]`` to each peer ``p`` and receives ``owned[p] & windows[r]``.
Only non-empty intersections appear, so the bytes that move are exactly the
intersections.  No MPI here: the MPI executor (``ExchangePlan``) lives in ``exchange.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .box import Box


@dataclass(frozen=True)
class Transfer:
    """One message of a plan: ``box`` (global coordinates) goes to or comes from ``peer``."""

    peer: int
    box: Box


def transfers(rank: int, owned: Sequence[Box], windows: Sequence[Box]) -> tuple[list[Transfer], list[Transfer]]:
    """The sends and receives of ``rank``, ordered by peer.

    A transfer whose peer is ``rank`` itself is a local copy.
    """
    mine, need = owned[rank], windows[rank]
    return ([Transfer(p, mine & w) for p, w in enumerate(windows) if mine.overlaps(w)],
            [Transfer(p, o & need) for p, o in enumerate(owned) if o.overlaps(need)])


def partition_error(rank: int, owned: Sequence[Box], global_box: Box) -> str | None:
    """Why ``owned`` is not a partition of ``global_box``, as seen from ``rank``; else None.

    Each rank checks its own box against every other (O(P) per rank); together
    with the total size this proves the boxes tile the global box exactly once.
    """
    mine = owned[rank]
    if not global_box.contains(mine):
        return f"owned box {mine} of rank {rank} lies outside the array {global_box}"
    for p, other in enumerate(owned):
        if p != rank and not (mine & other).is_empty:
            return f"owned boxes of ranks {rank} and {p} overlap: {mine} and {other}"
    total = sum(b.size for b in owned)
    if total != global_box.size:
        return f"owned boxes cover {total} elements, the array {global_box} has {global_box.size}"
    return None


def window_error(rank: int, windows: Sequence[Box], global_box: Box) -> str | None:
    """Why the window of ``rank`` is not inside ``global_box``; else None."""
    w = windows[rank]
    if not global_box.contains(w):
        return f"window {w} of rank {rank} lies outside the array {global_box}"
    return None
