"""Receptive-field maps: which input box an output box of a layer needs.

Pure Python.  A layer with window ``(rh, rw)``, stride ``(sh, sw)``, block
``(bh, bw)`` and padding ``(ph, pw)`` has *sites*; site ``i`` reads input rows
``[i*sh - ph, i*sh - ph + rh)`` (clipped to the input) and writes output rows
``[i*bh, (i+1)*bh)``.  The filter of DESIGN.md section 3 has no padding; L2 pooling
is a filter-like map with block 1; LCN is window ``2*rho+1``, stride 1, padding
``rho`` (its window is cut at the border).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..checks import pair
from .box import Box


def sites(length: int, window: int, stride: int, pad: int = 0) -> int:
    """Number of window positions (sites) along one axis: THE output-extent formula.

    Every shape check, kernel wrapper, cost model and benchmark asks this function
    (as DistDL keeps ``_compute_out_shape`` in one place); 0 when the window does not fit.
    """
    return max(0, (length + 2 * pad - window) // stride + 1)


@dataclass(frozen=True)
class RFMap:
    """The receptive-field map of one layer over the spatial axes (0, 1) of (H, W, C, N).

    Parameters
    ----------
    window, stride, block, pad : pair of int
        Receptive field, site stride, output block per site, input padding.
    mixes_channels : bool
        True if every output needs all input channels (filter, LCN); False if
        output channel ``c`` needs input channel ``c`` only (pooling).
    """

    window: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    block: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)
    mixes_channels: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "window", pair("window", self.window, 1))
        object.__setattr__(self, "stride", pair("stride", self.stride, 1))
        object.__setattr__(self, "block", pair("block", self.block, 1))
        object.__setattr__(self, "pad", pair("pad", self.pad, 0))

    def sites(self, in_extent: Sequence[int]) -> tuple[int, int]:
        """Number of sites along H and W for an input of spatial extent ``(H, W)``."""
        return tuple(sites(L, r, s, p)  # type: ignore[return-value]
                     for L, p, r, s in zip(in_extent, self.pad, self.window, self.stride))

    def out_extent(self, in_extent: Sequence[int]) -> tuple[int, int]:
        """Spatial output extent ``(sites * block)`` for an input extent ``(H, W)``."""
        return tuple(n * b for n, b in zip(self.sites(in_extent), self.block))  # type: ignore[return-value]

    def input_range(self, axis: int, lo: int, hi: int, in_len: int) -> tuple[int, int]:
        """Input range needed by output range ``[lo, hi)`` along spatial ``axis``."""
        if hi <= lo:
            return (0, 0)
        b, s, p, r = self.block[axis], self.stride[axis], self.pad[axis], self.window[axis]
        first, last = lo // b, (hi - 1) // b  # sites touched
        return max(0, first * s - p), min(in_len, last * s - p + r)

    def input_box(self, out_box: Box, in_shape: Sequence[int]) -> Box:
        """The input window needed to compute ``out_box`` of a 4-D (H, W, C, N) output."""
        if out_box.ndim != 4 or len(in_shape) != 4:
            raise ValueError(f"input_box works on 4-D (H, W, C, N) boxes, got {out_box} and {tuple(in_shape)}")
        if out_box.is_empty:
            return Box.empty(4)
        rows = self.input_range(0, out_box.lo[0], out_box.hi[0], in_shape[0])
        cols = self.input_range(1, out_box.lo[1], out_box.hi[1], in_shape[1])
        chans = (0, in_shape[2]) if self.mixes_channels else (out_box.lo[2], out_box.hi[2])
        return Box((rows[0], cols[0], chans[0], out_box.lo[3]), (rows[1], cols[1], chans[1], out_box.hi[3]))
