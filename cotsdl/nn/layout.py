"""Where every layer of a network lives on a process grid: pure index arithmetic, no MPI.

For one rank (grid ``dims``, its ``coords``) and a minibatch of ``batch`` images: the
rank's block of the input images, and for every layer the units (sites) it owns, the
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
    """One layer on one rank (4-D boxes over (H, W, C, N), ``sites`` 2-D over units)."""

    index: int
    layer: Any
    in_shape: tuple[int, int, int, int]
    out_shape: tuple[int, int, int, int]
    src_owned: Box  # what this rank owns of the layer's input
    window: Box  # the input window this rank needs
    out: Box  # the output box this rank owns
    sites: Box  # the units this rank owns


def layout(network: Network, dims: Sequence[int], coords: Sequence[int], batch: int) -> tuple[Box, list[LayerBoxes]]:
    """(this rank's block of the input images, every layer's boxes on this rank)."""
    in_shape = network.input_shape + (int(batch),)
    input_owned = block_box(in_shape, dims, coords)
    src, rows = input_owned, []
    for li, layer in enumerate(network.layers):
        out_shape = tuple(layer.out_shape(in_shape))
        UH, UW = layer.units(in_shape)
        (u0, u1), (v0, v1) = block_range(UH, dims[0], coords[0]), block_range(UW, dims[1], coords[1])
        bh, bw = layer.unit_block
        out = Box((u0 * bh, v0 * bw, 0, 0), (u1 * bh, v1 * bw, out_shape[2], int(batch)))
        rows.append(LayerBoxes(li, layer, in_shape, out_shape, src, layer.rf.input_box(out, in_shape), out,
                               Box((u0, v0), (u1, v1))))
        src, in_shape = out, out_shape
    return input_owned, rows
