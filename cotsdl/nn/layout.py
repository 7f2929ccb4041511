"""Where every layer of a network lives on a process grid: pure index arithmetic, no MPI.

For one rank (grid ``dims``, its ``coords``) and a minibatch of ``batch`` images: the
rank's block of the input images, and for every layer the sites it owns, the
output box they write, and the input window their receptive fields need.  The
network plan builds its exchanges from this; the run planner evaluates it for every
rank without starting MPI.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..array.box import Box
from ..array.partition import block_box, block_range
from .network import Network


@dataclass(frozen=True)
class LayerBoxes:
    """One layer on one rank (4-D boxes over (H, W, C, N), ``sites`` 2-D over the site grid)."""

    index: int
    layer: Any
    in_shape: tuple[int, int, int, int]
    out_shape: tuple[int, int, int, int]
    src_owned: Box  # what this rank owns of the layer's input
    window: Box  # the input window this rank needs
    out: Box  # the output box this rank owns
    sites: Box  # the sites this rank owns (receptive-field positions)

    @property
    def window_is_owned(self) -> bool:
        """The input window is exactly what this rank owns of the input (one rank, or a layer
        without halos): the network plan reads the input itself, no copy."""
        return not self.src_owned.is_empty and self.window == self.src_owned


def layout(network: Network, dims: Sequence[int], coords: Sequence[int], batch: int) -> tuple[Box, list[LayerBoxes]]:
    """(this rank's block of the input images, every layer's boxes on this rank)."""
    in_shape = network.input_shape + (int(batch),)
    input_owned = block_box(in_shape, dims, coords)
    src, rows = input_owned, []
    for li, layer in enumerate(network.layers):
        out_shape = tuple(layer.out_shape(in_shape))
        UH, UW = layer.sites(in_shape)
        (u0, u1), (v0, v1) = block_range(UH, dims[0], coords[0]), block_range(UW, dims[1], coords[1])
        sites = Box((u0, v0), (u1, v1))
        out = site_output_box(layer, sites, out_shape)
        rows.append(LayerBoxes(li, layer, in_shape, out_shape, src, layer.rf.input_box(out, in_shape), out, sites))
        src, in_shape = out, out_shape
    return input_owned, rows


def fused_pool(pool: LayerBoxes, lcn: LayerBoxes) -> LayerBoxes:
    """The pool of a stage whose pool and LCN share one exchange (``fuse``): the pool's boxes grown
    to every pooled output the LCN's window reads.

    Per layer, a rank pools its own sites, then receives the LCN's halo of pooled outputs from its
    neighbours.  Fused, it receives the pool's input once, on the window the grown sites read, and
    computes the pooled border itself (the same per-unit arithmetic as its owner: the same bits), so
    the LCN reads its window without an exchange.  ``pool`` and ``lcn`` are one rank's boxes of a
    stage's pool and LCN (:func:`layout`); the result has the pool's index, layer, shapes and owned
    input, and the grown sites, output box and input window.
    """
    if lcn.index != pool.index + 1 or pool.layer.kind != "pool" or lcn.layer.kind != "lcn":
        raise ValueError(f"layers {pool.index} and {lcn.index} are not a stage's pool and LCN")
    if lcn.out.is_empty:  # a rank without pixels: nothing to pool, no halo to take
        return pool
    win = lcn.window  # pooled outputs the LCN reads: every channel and image (the pool's block is 1x1)
    sites = Box(win.lo[:2], win.hi[:2])
    out = site_output_box(pool.layer, sites, pool.out_shape)
    if out != win:
        raise AssertionError(f"layer {lcn.index}: the LCN window {win} is not a pooled box {out}")
    return LayerBoxes(pool.index, pool.layer, pool.in_shape, pool.out_shape, pool.src_owned,
                      pool.layer.rf.input_box(out, pool.in_shape), out, sites)


def fused_filter(filt: LayerBoxes, pool: LayerBoxes) -> LayerBoxes:
    """The filter of a frozen stage whose filter, pool and LCN share one exchange (``fuse_filter``): the
    filter's sites grown (or moved) to every site whose output the grown pool reads.

    ``pool`` is the stage's pool grown by :func:`fused_pool`.  A rank then receives the stage's input
    once, on the window of those sites, and computes their filter outputs itself, with its
    neighbours' weights of the sites it does not own (the weight halo, fetched once while the
    weights stay fixed): the pool and LCN read their windows without an exchange.  The sites need not
    contain the rank's own: a layer's sites are split over the grid independently of the next
    layer's.  The result has the filter's index, layer, shapes and owned input, and the grown sites,
    output box and input window (all empty where the pool reads nothing).
    """
    if pool.index != filt.index + 1 or filt.layer.kind != "filter" or pool.layer.kind != "pool":
        raise ValueError(f"layers {filt.index} and {pool.index} are not a stage's filter and pool")
    if pool.window.is_empty:  # a rank without pooled pixels computes no filter output either
        return LayerBoxes(filt.index, filt.layer, filt.in_shape, filt.out_shape, filt.src_owned,
                          Box.empty(4), Box.empty(4), Box.empty(2))
    win, block = pool.window, filt.layer.unit_block
    sites = Box(tuple(win.lo[a] // block[a] for a in (0, 1)), tuple(-(-win.hi[a] // block[a]) for a in (0, 1)))
    out = site_output_box(filt.layer, sites, filt.out_shape)
    if not out.contains(win):
        raise AssertionError(f"layer {filt.index}: the sites {sites} write {out}, not the pool's window {win}")
    return LayerBoxes(filt.index, filt.layer, filt.in_shape, filt.out_shape, filt.src_owned,
                      filt.layer.rf.input_box(out, filt.in_shape), out, sites)


def fuse_rows(rows: list[LayerBoxes], stages: Sequence[int], roles: Sequence[tuple[int, str]],
              filters: Sequence[int] = ()) -> list[LayerBoxes]:
    """``rows`` (one rank's :func:`layout`) with the pool of every stage in ``stages`` grown by
    :func:`fused_pool`, and the filter of every stage in ``filters`` (a subset) by :func:`fused_filter`;
    the LCN rows stay (their window is now filled without an exchange)."""
    fused, ff = set(int(s) for s in stages), set(int(s) for s in filters)
    if not ff <= fused:
        raise ValueError(f"stages {sorted(ff - fused)} fuse their filter but not their pool and LCN")
    out = list(rows)
    for i, (stage, kind) in enumerate(roles):
        if kind == "pool" and stage in fused:
            out[i] = fused_pool(rows[i], rows[i + 1])
            if stage in ff:
                out[i - 1] = fused_filter(rows[i - 1], out[i])
    return out


def split_sites(layer: Any, in_shape: Sequence[int], sites: Box, ready: Box) -> tuple[Box, list[Box]]:
    """The sites of ``sites`` (2-D) whose inputs lie inside ``ready`` (4-D; the part of the input
    window a rank holds before any halo arrives), and the border strips that cover the rest.

    The interior can be computed while the halo messages travel; the strips after they
    arrive.  The interior may be empty; interior and strips tile ``sites`` exactly.
    """
    if sites.is_empty or ready.is_empty:
        return Box.empty(2), ([] if sites.is_empty else [sites])
    rng = []
    for a in (0, 1):
        b = layer.unit_block[a]
        spans = ((i, layer.rf.input_range(a, i * b, (i + 1) * b, in_shape[a])) for i in range(sites.lo[a], sites.hi[a]))
        inside = [i for i, (lo, hi) in spans if ready.lo[a] <= lo and hi <= ready.hi[a]]
        if not inside:  # input ranges move monotonically with i: the interior is one run
            return Box.empty(2), [sites]
        rng.append((inside[0], inside[-1] + 1))
    (a0, a1), (b0, b1) = rng
    (u0, v0), (u1, v1) = sites.lo, sites.hi
    strips = [Box((u0, v0), (a0, v1)), Box((a1, v0), (u1, v1)), Box((a0, v0), (a1, b0)), Box((a0, b1), (a1, v1))]
    return Box((a0, b0), (a1, b1)), [s for s in strips if not s.is_empty]


#: The interior of a split layer is computed in this many pieces (of whole site rows), with MPI given a
#: chance to move the halo messages between them (``ExchangePlan``'s ``progress``).  Measured on two
#: simulated nodes at 100 Mbit/s (demo network at 64x64, 2 ranks, bench scaling --overlap both): with 4
#: pieces the halo wait fell from 4.0 to 2.6 ms a step but the extra calls cost as much (hidden -0.29 and
#: -0.04 in two runs); 2 pieces 0.52 and 1 piece 0.20-0.33, all within this machine's noise.  So one
#: piece (the interior in one call, as before), until a quieter measurement says otherwise.
INTERIOR_PIECES = 1


def interior_pieces(inner: Box, pieces: int = INTERIOR_PIECES) -> list[Box]:
    """``inner`` (2-D sites) cut into at most ``pieces`` runs of whole rows that tile it, in order."""
    if inner.is_empty:
        return []
    rows = inner.hi[0] - inner.lo[0]
    k = max(1, min(int(pieces), rows))
    cuts = [inner.lo[0] + (rows * i) // k for i in range(k + 1)]
    return [Box((a, inner.lo[1]), (b, inner.hi[1])) for a, b in zip(cuts, cuts[1:])]


def site_output_box(layer: Any, sites: Box, out_shape: Sequence[int]) -> Box:
    """The 4-D output box written by the 2-D box of ``sites`` (all channels and images)."""
    bh, bw = layer.unit_block
    return Box((sites.lo[0] * bh, sites.lo[1] * bw, 0, 0),
               (sites.hi[0] * bh, sites.hi[1] * bw, out_shape[2], out_shape[3]))
