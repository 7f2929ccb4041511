"""Distributed execution of a network on a process grid: one plan, forward and backward.

The plan is computed once per (network, grid, minibatch size, dtype): for every
layer the owned output box of this rank (a balanced block of the layer's units),
the input window its receptive-field map needs, and the exchange plan that fills
that window from the owners of the previous layer's output (for layer 0, from a
balanced block of the input images).  Forward exchanges, then computes locally;
backward computes locally, then sums window gradients back to their owners with
the adjoint exchange.  A 1x1 grid runs exactly the same code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import backend
from ..array.box import Box
from ..array.distarray import DistArray
from ..array.exchange import ExchangePlan
from ..array.grid import ProcessGrid
from ..array.partition import block_box, block_range
from .layers import Context
from .network import Network, init_weights


@dataclass
class LayerPlan:
    layer: Any
    index: int
    in_shape: tuple[int, int, int, int]
    out_shape: tuple[int, int, int, int]
    src_owned: Box  # what this rank owns of the layer's input
    window: Box  # the input window this rank needs
    out: Box  # the output box this rank owns
    sites: Box  # the units (2-D) this rank owns
    exchange: ExchangePlan


@dataclass
class Tape:
    """What a forward pass keeps for the backward pass."""

    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    caches: list[Any]


class NetworkPlan:
    """A network laid out on ``grid`` for minibatches of ``batch`` images of ``dtype``."""

    def __init__(self, network: Network, grid: ProcessGrid, batch: int, dtype: Any = np.float32):
        if not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        self.network, self.grid, self.batch, self.dtype = network, grid, int(batch), np.dtype(dtype)
        comm, dims, coords = grid.comm, grid.dims, grid.coords
        in_shape = network.input_shape + (self.batch,)
        self.input_owned = block_box(in_shape, dims, coords)
        src = self.input_owned
        self.layers: list[LayerPlan] = []
        for li, layer in enumerate(network.layers):
            out_shape = tuple(layer.out_shape(in_shape))
            UH, UW = layer.units(in_shape)
            (u0, u1), (v0, v1) = block_range(UH, dims[0], coords[0]), block_range(UW, dims[1], coords[1])
            sites = Box((u0, v0), (u1, v1))
            bh, bw = layer.unit_block
            out = Box((u0 * bh, v0 * bw, 0, 0), (u1 * bh, v1 * bw, out_shape[2], self.batch))
            window = layer.rf.input_box(out, in_shape)
            ex = ExchangePlan(comm, in_shape, src, window, self.dtype)
            self.layers.append(LayerPlan(layer, li, in_shape, out_shape, src, window, out, sites, ex))
            src, in_shape = out, out_shape
        self.output_owned = src
        self.output_shape = in_shape

    # -- parameters -----------------------------------------------------------
    def init_params(self, seed: int = 0) -> dict[int, np.ndarray]:
        """This rank's weights of every filter layer (keyed by layer index), identical on any grid."""
        return {lp.index: init_weights(lp.layer, lp.in_shape, lp.sites, seed, lp.index, self.dtype)
                for lp in self.layers if lp.layer.kind == "filter"}

    def weight_box(self, index: int) -> tuple[tuple[int, ...], Box]:
        """Global shape and this rank's box of the weights of filter layer ``index`` (for gather)."""
        lp = self.layers[index]
        shape = lp.layer.weight_shape(lp.in_shape)
        return shape, Box(lp.sites.lo + (0,) * 4, lp.sites.hi + shape[2:])

    # -- arrays ---------------------------------------------------------------
    def input_array(self, data: np.ndarray | None = None) -> DistArray:
        """A DistArray in the input layout (this rank's block of the images)."""
        return DistArray(self.grid.comm, self.network.input_shape + (self.batch,), self.input_owned,
                         self.input_owned, data=data, dtype=self.dtype)

    def _allreduce(self, a: Any) -> Any:
        # Per-image sums of N numbers: staging through the host costs nothing here.
        host = np.ascontiguousarray(backend.to_numpy(a))
        self.grid.comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
        return backend.array_module(a).asarray(host)

    def context(self, lp: LayerPlan, params: dict[int, np.ndarray] | None) -> Context:
        """The boxes, group reduction and weights a layer computes with on this rank."""
        return Context(lp.in_shape, lp.window, lp.out, self._allreduce,
                       None if params is None else params.get(lp.index))

    # -- passes ---------------------------------------------------------------
    def forward(self, x: DistArray, params: dict[int, np.ndarray], upto: int | None = None) -> tuple[DistArray, Tape]:
        """Output of layers ``[0, upto)`` (all by default) on this rank's owned box, and the tape."""
        tape = Tape([], [], [])
        cur = x
        xp = backend.array_module(x.data)
        for lp in self.layers[:upto]:
            win = DistArray(cur.comm, lp.in_shape, lp.window, data=xp.empty(lp.window.shape, self.dtype))
            lp.exchange.exchange(cur, win, validate=False)
            y, cache = lp.layer.forward_local(win.data, self.context(lp, params))
            if y.dtype != self.dtype or y.shape != lp.out.shape:  # numpy 2 promotes silently
                raise AssertionError(f"layer {lp.index} produced {y.dtype} {y.shape}, expected {self.dtype} {lp.out.shape}")
            tape.inputs.append(win.data)
            tape.outputs.append(y)
            tape.caches.append(cache)
            cur = DistArray(cur.comm, lp.out_shape, lp.out, lp.out, data=y)
        return cur, tape

    def backward(self, dy: DistArray, tape: Tape, params: dict[int, np.ndarray]) -> tuple[DistArray, dict[int, np.ndarray]]:
        """Gradients w.r.t. the input (owned layout) and the weights, from dy on the owned output."""
        grads: dict[int, np.ndarray] = {}
        xp = backend.array_module(dy.data)
        cur = dy
        for lp in reversed(self.layers[:len(tape.inputs)]):
            i = lp.index
            dx, dw = lp.layer.backward_local(cur.data, tape.inputs[i], tape.outputs[i], tape.caches[i],
                                             self.context(lp, params))
            if dw is not None:
                grads[i] = dw
            dwin = DistArray(cur.comm, lp.in_shape, lp.window, data=dx.astype(self.dtype, copy=False))
            prev = DistArray(cur.comm, lp.in_shape, lp.src_owned, lp.src_owned, data=xp.empty(lp.src_owned.shape, self.dtype))
            lp.exchange.exchange_adjoint(dwin, prev, validate=False)
            cur = prev
        return cur, grads

    def describe(self) -> str:
        """A table of every layer: shapes, this rank's boxes, FLOPs and halo bytes."""
        rows = [f"grid {self.grid.dims[0]}x{self.grid.dims[1]}, batch {self.batch}, {self.dtype}"]
        for lp in self.layers:
            c = lp.layer.cost(lp.in_shape, self.dtype.itemsize)
            rows.append(f"  {lp.index:2d} {lp.layer.kind:6s} in {lp.in_shape} -> out {lp.out_shape}; owned {lp.out}; "
                        f"window {lp.window}; {c['forward'].flops / 1e9:.3f} GFLOP fwd (whole layer); "
                        f"halo in {lp.exchange.bytes_received} B")
        return "\n".join(rows)
