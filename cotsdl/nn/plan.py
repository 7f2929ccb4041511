"""Distributed execution of a network on a process grid: one plan, forward and backward.

The plan is computed once per (network, grid, minibatch size, dtype): for every
layer the owned output box of this rank (a balanced block of the layer's sites),
the input window its receptive-field map needs, and the exchange plan that fills
that window from the owners of the previous layer's output (for layer 0, from a
balanced block of the input images).  Forward exchanges, then computes locally;
backward computes locally, then sums window gradients back to their owners with
the adjoint exchange.  A 1x1 grid runs exactly the same code.

This is the only module that combines :mod:`cotsdl.ops` (through the layers) with
exchanges.  Besides whole passes (:meth:`NetworkPlan.forward`, :meth:`NetworkPlan.backward`
over any contiguous run of layers) it offers the filter's adjoint as a distributed
operation (:meth:`NetworkPlan.adjoint`), the decoder of an autoencoder.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from .. import backend, ops
from ..array.box import Box
from ..array.collective import allreduce
from ..array.distarray import DistArray
from ..array.exchange import ExchangePlan
from ..array.grid import ProcessGrid
from .layers import Context
from .layout import LayerBoxes, fused_filter, fused_pool, interior_pieces, layout, split_sites, site_output_box
from .network import Network, init_weights


@dataclass(frozen=True)
class LayerPlan(LayerBoxes):
    """A layer's boxes on this rank (:class:`~cotsdl.nn.layout.LayerBoxes`) and its exchange."""

    exchange: ExchangePlan | None = None
    #: (interior sites, border strips) when the forward overlaps its exchange, else None
    split: tuple[Box, list[Box]] | None = None
    #: the key of the layer's scratch arrays in ``NetworkPlan.workspaces`` (a fused pool has its own)
    key: Any = None


@dataclass
class Tape:
    """What a forward pass over layers ``first, first + 1, ...`` keeps for the backward pass."""

    inputs: list[np.ndarray]  # each layer's input window
    outputs: list[np.ndarray]  # each layer's owned output
    caches: list[Any]
    first: int = 0
    #: the pools computed fused with their LCN (their input and output are the grown boxes)
    fused: frozenset = frozenset()
    #: the filters computed fused with their pool and LCN, forward only (``forward(frozen=...)``)
    frozen: frozenset = frozenset()

    @property
    def layers(self) -> range:
        return range(self.first, self.first + len(self.inputs))


class NetworkPlan:
    """A network laid out on ``grid`` for minibatches of ``batch`` images of ``dtype``.

    ``overlap`` (on by default) hides halo traffic behind work: a filter or pool layer
    computes the sites whose inputs this rank already holds while its halo messages
    travel, then the border strips; a filter's backward computes its weight gradient
    while the input gradient travels back to its owners.  Results are the same bit for
    bit either way (every unit is computed by the same per-unit arithmetic).

    ``fuse``: stages whose pool and LCN share one exchange (the pool computes the LCN's halo itself).
    ``fuse_filter`` (a subset of ``fuse``): stages whose filter joins them in a forward-only pass of
    fixed weights (``forward(frozen=...)``, the frozen stages below the one a step trains): the stage's
    input is exchanged once and the filter computes every output its grown pool reads, with a halo of
    its neighbours' weights fetched once per ``frozen`` token.
    """

    def __init__(self, network: Network, grid: ProcessGrid, batch: int, dtype: Any = np.float32,
                 overlap: bool = True, fuse: Sequence[int] = (), fuse_filter: Sequence[int] = ()):
        if not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        self.network, self.grid, self.batch, self.dtype = network, grid, int(batch), np.dtype(dtype)
        self.overlap = bool(overlap)
        self.fuse = check_fuse(fuse, len(network.stages))
        self.fuse_filter = check_fuse(fuse_filter, len(network.stages), "fuse_filter")
        if not set(self.fuse_filter) <= set(self.fuse):
            raise ValueError(f"fuse_filter: stage {sorted(set(self.fuse_filter) - set(self.fuse))[0]} fuses its filter "
                             f"but not its pool and LCN (fuse {list(self.fuse)})")
        self._travelling: list[Any] = []  # exchanges whose messages travel while ``_join`` runs other work
        self.input_owned, boxes = layout(network, grid.dims, grid.coords, self.batch)
        self.layers: list[LayerPlan] = [self._layer_plan(lb) for lb in boxes]
        #: pool index -> its fused twin (grown boxes, one exchange for pool and LCN), for stages in ``fuse``
        self.fused: dict[int, LayerPlan] = {
            p: self._layer_plan(fused_pool(boxes[p], boxes[p + 1]), key=("fused", p))
            for p in (network.layer_index(k, "pool") for k in self.fuse)}
        #: filter index -> its frozen fused twin (sites grown to what the grown pool reads), for ``fuse_filter``
        self.frozen: dict[int, LayerPlan] = {
            f: self._layer_plan(fused_filter(boxes[f], self.fused[f + 1]), key=("frozen", f))
            for f in (network.layer_index(k, "filter") for k in self.fuse_filter)}
        #: filter index -> the exchange of its weight halo (its own sites' weights -> the grown sites')
        self.weight_exchanges: dict[int, ExchangePlan] = {
            f: ExchangePlan(grid.comm, self.weight_box(f)[0], self.weight_box(f)[1], self.weight_box(f, lp.sites)[1],
                            self.dtype) for f, lp in self.frozen.items()}
        self._halos: dict[int, tuple[Any, Any, Any]] = {}  # filter -> (frozen token, its weights, their halo)
        #: weight halos fetched so far (each a collective exchange; once per frozen token and weights)
        self.halo_fetches = 0
        self.output_owned = boxes[-1].out
        self.output_shape = boxes[-1].out_shape
        # Each layer's scratch (gathers, per-chunk products) kept from step to step, and inside
        # step() its results and windows too: without them a script pays page faults on them
        # every step unless the process's allocator was tuned.
        self.outputs = ops.Outputs()
        self.workspaces = {lp.key: ops.Workspace(self.outputs)
                           for lp in self.layers + list(self.fused.values()) + list(self.frozen.values())}
        self._buffers: dict[Any, Any] = {}

    def _layer_plan(self, lb: LayerBoxes, key: Any = None) -> LayerPlan:
        """A layer's boxes with the exchange that fills its window (collective: every rank makes it)."""
        ex = ExchangePlan(self.grid.comm, lb.in_shape, lb.src_owned, lb.window, self.dtype)
        split = None
        if lb.layer.kind in ("filter", "pool") and ex.messages_received:  # LCN's per-image mean is global
            inner, strips = split_sites(lb.layer, lb.in_shape, lb.sites, ex.self_box)
            split = (inner, strips) if not inner.is_empty else None
        return LayerPlan(**{f.name: getattr(lb, f.name) for f in fields(lb)}, exchange=ex, split=split,
                         key=lb.index if key is None else key)

    def exchanges(self) -> list[ExchangePlan]:
        """Every exchange plan of the network: each layer's, each fused pool's and frozen filter's, and
        each weight halo's."""
        return ([lp.exchange for lp in self.layers] + [lp.exchange for lp in self.fused.values()]
                + [lp.exchange for lp in self.frozen.values()] + list(self.weight_exchanges.values()))

    # -- parameters -----------------------------------------------------------
    def init_params(self, seed: int = 0, norms: Sequence[float | None] | None = None) -> dict[int, np.ndarray]:
        """This rank's weights of every filter layer (keyed by layer index), identical on any grid.

        ``norms`` (one per stage, None for none) scales every unit's filter of a stage to
        that norm, as the trainer's norm constraint keeps it (``nn.network.init_weights``).
        """
        filters = [lp for lp in self.layers if lp.layer.kind == "filter"]
        norms = [None] * len(filters) if norms is None else list(norms)
        if len(norms) != len(filters):
            raise ValueError(f"norms needs one entry per stage ({len(filters)}), got {len(norms)}")
        return {lp.index: init_weights(lp.layer, lp.in_shape, lp.sites, seed, lp.index, self.dtype, norm)
                for lp, norm in zip(filters, norms)}

    def weight_box(self, index: int, sites: Box | None = None) -> tuple[tuple[int, ...], Box]:
        """Global shape and this rank's box of the weights of filter layer ``index`` (for gather), or
        the box of the weights of ``sites`` (2-D)."""
        lp = self.layers[index]
        shape = lp.layer.weight_shape(lp.in_shape)
        if sites is None:  # its own: a rank without sites holds (0 or more, ...) like init_params makes them
            sites = lp.sites
        elif sites.is_empty:
            return shape, Box.empty(len(shape))
        return shape, Box(sites.lo + (0,) * 4, sites.hi + shape[2:])

    def weight_halo(self, index: int, params: dict[int, Any], frozen: Any) -> Any:
        """The weights of frozen filter ``index``'s grown sites (:attr:`frozen`), fetched from their
        owners the first time and kept: fetched again (collectively) when ``frozen`` differs from the
        token of the last fetch or ``params[index]`` is another array (e.g. a resumed run's)."""
        w = params[index]
        hit = self._halos.get(index)
        if hit is not None and hit[0] == frozen and hit[1] is w:
            return hit[2]
        self._halos.pop(index, None)  # the old halo's memory goes before the new one's is taken
        shape, own = self.weight_box(index)
        win = self.weight_box(index, self.frozen[index].sites)[1]
        xp = backend.array_module(w)
        comm = self.grid.comm
        dst = DistArray(comm, shape, win, data=xp.empty(win.shape, self.dtype))
        self.weight_exchanges[index].exchange(DistArray(comm, shape, own, own, data=w), dst, validate=False)
        self._halos[index] = (frozen, w, dst.data)
        self.halo_fetches += 1
        return dst.data

    # -- arrays ---------------------------------------------------------------
    def input_array(self, data: np.ndarray | None = None) -> DistArray:
        """A DistArray in the input layout (this rank's block of the images)."""
        return DistArray(self.grid.comm, self.network.input_shape + (self.batch,), self.input_owned,
                         self.input_owned, data=data, dtype=self.dtype)

    def _allreduce(self, a: Any) -> Any:
        # LCN's per-image sums over the model group (N numbers)
        return allreduce(self.grid.comm, backend.array_module(a).ascontiguousarray(a))

    def buffer(self, name: Any, like: Any) -> Any:
        """A persistent array shaped and typed as ``like`` (same array library), kept under ``name``:
        the same memory every step, for results the caller consumes before asking again."""
        xp = backend.array_module(like)
        buf = self._buffers.get(name)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype or backend.array_module(buf) is not xp:
            buf = self._buffers[name] = xp.empty(like.shape, like.dtype)
        return buf

    @contextmanager
    def step(self) -> Iterator[None]:
        """One training step: inside it, windows, layer results and the sums sent back come from
        memory lent for the step and taken back when the next ``step()`` begins, the same memory
        every step (:class:`~cotsdl.ops.Outputs`).  So arrays made inside one step (tapes, outputs,
        input gradients, weight gradients not written into ``grads_into``) are valid until the next
        step begins; copy what must live longer.
        Outside a step every array is new.  Nested calls are part of the outer step."""
        with self.outputs.step():
            yield

    def context(self, lp: LayerPlan, params: dict[int, np.ndarray] | None) -> Context:
        """The boxes, group reduction and weights a layer computes with on this rank."""
        return Context(lp.in_shape, lp.window, lp.out, self._allreduce,
                       None if params is None else params.get(lp.index), self.workspaces[lp.key])

    # -- the two halves of a layer's communication --------------------------------
    def _fill_window(self, lp: LayerPlan, x: DistArray) -> Any:
        """Layer ``lp``'s input window on this rank, filled from the owners of ``x``."""
        xp = backend.array_module(x.data)
        if self._is_window(x.data, x.window, lp):  # this rank needs only what it owns: no copy
            data = x.data
        else:
            data = self.outputs.empty(lp.window.shape, self.dtype, xp)
        win = DistArray(x.comm, lp.in_shape, lp.window, data=data)
        lp.exchange.exchange(x, win, validate=False)
        return win.data

    def _is_window(self, data: Any, box: Box, lp: LayerPlan) -> bool:
        """Whether ``data`` (laid out on ``box``) can serve as layer ``lp``'s input window itself:
        where the window is the owned block (:attr:`~cotsdl.nn.layout.LayerBoxes.window_is_owned`)
        the exchange moves nothing into it and leaves it in place (the layers only read their
        input windows)."""
        return (lp.window_is_owned and box == lp.window and data.dtype == self.dtype
                and tuple(data.shape) == lp.window.shape
                and bool(getattr(getattr(data, "flags", None), "c_contiguous", False)))

    def _start_sum_window(self, lp: LayerPlan, dwin: Any) -> tuple[DistArray, Any]:
        """Begin summing the contributions on layer ``lp``'s input window into their owners (the adjoint
        of :meth:`_fill_window`): (the owners' array, in the owned layout of the layer's input, valid
        after ``wait()`` of the pending call)."""
        xp = backend.array_module(dwin)
        comm = self.grid.comm
        src = DistArray(comm, lp.in_shape, lp.window, data=dwin.astype(self.dtype, copy=False))
        if self._is_window(src.data, lp.src_owned, lp):  # the sums land where they lie (see _is_window)
            data = src.data
        else:
            data = self.outputs.empty(lp.src_owned.shape, self.dtype, xp)
        owners = DistArray(comm, lp.in_shape, lp.src_owned, lp.src_owned, data=data)
        return owners, lp.exchange.start_adjoint(src, owners, validate=False)

    def _layers(self, start: int, upto: int | None) -> list[LayerPlan]:
        stop = len(self.layers) if upto is None else upto
        if not 0 <= start <= stop <= len(self.layers):
            raise ValueError(f"layers [{start}, {upto}) are not a run of this network's {len(self.layers)} layers")
        return self.layers[start:stop]

    # -- passes ---------------------------------------------------------------
    def forward(self, x: DistArray, params: dict[int, np.ndarray], upto: int | None = None, *,
                start: int = 0, frozen: Any = None) -> tuple[DistArray, Tape]:
        """Output of layers ``[start, upto)`` (all by default) on this rank's owned box, and the tape.

        ``x`` is in the owned layout of layer ``start``'s input (the images for ``start`` 0).
        ``frozen`` (not None): a forward-only pass of fixed weights, whose tape no backward takes;
        the whole stages of ``fuse_filter`` in the run then exchange only their input
        (:meth:`weight_halo`).  The token names the weights' values: pass the same one (an equal
        value, on every rank) while they stay as they are, and a new one once they may have changed
        in place.
        """
        run = self._layers(start, upto)
        tape = Tape([], [], [], first=start)
        stop = start + len(run)
        fused = frozenset(p for p in self.fused if start <= p and p + 1 < stop)  # the run holds pool and LCN
        tape.fused = fused
        if frozen is not None:  # the run holds the whole stage
            tape.frozen = frozenset(f for f in self.frozen if start <= f and f + 1 in fused)
        cur = x
        for lp in run:
            this = self.fused[lp.index] if lp.index in fused else lp  # a fused pool computes on its grown boxes
            if lp.index in tape.frozen:  # a frozen fused filter: the grown sites, with the weight halo
                this = self.frozen[lp.index]
                xwin, y, cache = self._forward_layer(this, cur, {lp.index: self.weight_halo(lp.index, params, frozen)})
            elif lp.index - 1 in tape.frozen:  # its pool: its grown window lies in the filter's grown output
                xwin = _crop(tape.outputs[-1], self.frozen[lp.index - 1].out, this.window)
                y, cache = lp.layer.forward_local(xwin, self.context(this, params))
            elif lp.index - 1 in fused:  # the LCN of a fused pool: its window is the pool's grown output
                xwin = tape.outputs[-1]
                y, cache = lp.layer.forward_local(xwin, self.context(lp, params))
            else:
                xwin, y, cache = self._forward_layer(this, cur, params)
            if y.dtype != self.dtype or y.shape != this.out.shape:  # numpy 2 promotes silently
                raise AssertionError(f"layer {lp.index} produced {y.dtype} {y.shape}, expected {self.dtype} "
                                     f"{this.out.shape}")
            tape.inputs.append(xwin)
            tape.outputs.append(y)
            tape.caches.append(cache)
            grown = lp.index in fused or lp.index in tape.frozen
            cur = None if grown else DistArray(x.comm, lp.out_shape, lp.out, lp.out, data=y)
        return cur, tape

    def _forward_layer(self, lp: LayerPlan, x: DistArray, params: dict[int, Any] | None) -> tuple[Any, Any, Any]:
        """(input window, owned output, cache) of one layer, overlapping its exchange when split."""
        if not (self.overlap and lp.split):
            xwin = self._fill_window(lp, x)
            return (xwin,) + tuple(lp.layer.forward_local(xwin, self.context(lp, params)))
        xp = backend.array_module(x.data)
        win = DistArray(x.comm, lp.in_shape, lp.window, data=self.outputs.empty(lp.window.shape, self.dtype, xp))
        pending = lp.exchange.start(x, win, validate=False)  # this rank's own part lands at once
        y = self.outputs.empty(lp.out.shape, self.dtype, xp)
        inner, strips = lp.split
        for piece in interior_pieces(inner):  # MPI moves the halos on between the pieces
            self._forward_sites(lp, win.data, y, piece, params)
            pending.progress()
            for other in self._travelling:  # and the sums this forward runs beside (``_join``)
                if other is not None:
                    other.progress()
        pending.wait()
        for sites in strips:
            self._forward_sites(lp, win.data, y, sites, params)
        return win.data, y, None

    def _forward_sites(self, lp: LayerPlan, xwin: Any, y: Any, sites: Box, params: dict[int, Any] | None) -> None:
        """The output of the sites ``sites`` (a sub-box of ``lp.sites``) written into ``y``."""
        out = site_output_box(lp.layer, sites, lp.out_shape)
        inp = lp.layer.rf.input_box(out, lp.in_shape)
        w = None
        if lp.layer.kind == "filter":  # this rank's weights are indexed by its own sites
            w = params[lp.index][sites.slices_in(lp.sites)]
        part, _ = lp.layer.forward_local(xwin[inp.slices_in(lp.window)],
                                         Context(lp.in_shape, inp, out, self._allreduce, w, self.workspaces[lp.key]))
        y[out.slices_in(lp.out)] = part

    def backward(self, dy: DistArray, tape: Tape, params: dict[int, np.ndarray], *, input_grad: bool = True,
                 meanwhile: Callable[[], Any] | None = None,
                 grads_into: dict[int, Any] | None = None, accumulate: bool = False,
                 also: dict[int, tuple[Any, Any]] | None = None,
                 weight_grads: bool = True) -> tuple[DistArray | None, dict[int, np.ndarray]]:
        """Gradients w.r.t. the tape's input (owned layout) and the weights, from dy on the owned output.

        ``input_grad=False`` stops at the weights of the tape's first layer (no input gradient
        is computed or exchanged; None is returned for it).  ``meanwhile`` (other work that
        does not touch these arrays) runs while the last input gradient travels, with overlap.
        ``grads_into``: arrays (by layer index) the weight gradients are written into, e.g.
        :meth:`buffer`'s, kept from step to step instead of allocated and page-faulted each time;
        ``accumulate``: the gradients are added to those arrays.  ``also``: per filter layer, a
        second (input window, output gradient) pair whose weight gradient its pass adds (a tied
        autoencoder's decoder, in the encoder's pass).  ``weight_grads=False``: the input gradient
        only (an optimal stimulus), without the filters' backward-weights passes; the dict is empty.
        """
        if accumulate and not grads_into:
            raise ValueError("accumulate=True needs grads_into (the arrays to add the gradients to)")
        if tape.frozen:
            raise ValueError(f"the tape is of a frozen forward (filters {sorted(tape.frozen)} fused with their pool "
                             "and LCN): it has no backward; run the forward without frozen=")
        if not weight_grads and (grads_into or also or not input_grad):
            raise ValueError("weight_grads=False computes the input gradient only: it takes no grads_into or also, "
                             "and needs input_grad=True")
        grads: dict[int, np.ndarray] = {}
        cur = dy
        for i in reversed(tape.layers):
            lp, k = self.layers[i], i - tape.first
            need = input_grad or i > tape.first
            extra = meanwhile if i == tape.first else None
            if i - 1 in tape.fused:  # an LCN whose pool was fused: its window gradient feeds the pool here
                dwin, _ = lp.layer.backward_local(cur.data, tape.inputs[k], tape.outputs[k], tape.caches[k],
                                                  self.context(lp, params))
                cur = dwin  # (no exchange: the pool's backward below takes it on the grown box)
                continue
            if i in tape.fused:  # the partial sums of every rank's grown pool go to their owners once
                lp = self.fused[i]
                cur = DistArray(dy.comm, lp.out_shape, lp.out, lp.out, data=cur)
            ctx = self.context(lp, params)
            if lp.layer.kind == "filter":
                owners = pending = None
                if need:  # the weight gradient is computed while the input gradient travels to its owners
                    owners, pending = self._start_sum_window(lp, lp.layer.adjoint_local(cur.data, ctx))
                    if not self.overlap:
                        pending.wait()
                if weight_grads:
                    into = None if grads_into is None else grads_into.get(i)
                    grads[i] = lp.layer.weight_grad_local(tape.inputs[k], cur.data, ctx, out=into,
                                                          accumulate=accumulate and into is not None,
                                                          also=None if also is None else also.get(i))
                cur = self._join(pending, extra, owners)
                continue
            dx, dw = lp.layer.backward_local(cur.data, tape.inputs[k], tape.outputs[k], tape.caches[k], ctx,
                                             input_grad=need)
            if dw is not None and weight_grads:
                grads[i] = dw
            if need:
                owners, pending = self._start_sum_window(lp, dx)
                cur = self._join(pending, extra, owners)
            else:
                cur = self._join(None, extra, None)
        return cur, grads

    def _join(self, pending: Any, extra: Callable[[], Any] | None, result: Any) -> Any:
        """Wait for ``pending`` and run ``extra``: ``extra`` first (while messages travel) with overlap."""
        if self.overlap and extra is not None:
            self._travelling.append(pending)  # moved on between the pieces of the work in ``extra``
            try:
                extra()
            finally:
                self._travelling.pop()
            extra = None
        if pending is not None:
            pending.wait()
        if extra is not None:
            extra()
        return result

    def adjoint(self, index: int, h: DistArray, w: Any, meanwhile: Callable[[], Any] | None = None) -> DistArray:
        """F_w^T h for filter layer ``index``: its adjoint (backward-data) applied to ``h`` (owned
        output layout) with weights ``w``, summed into the owned layout of the layer's input.
        The decoder of a tied-weight autoencoder.  ``meanwhile`` runs while the sums travel."""
        lp = self.layers[index]
        if lp.layer.kind != "filter":
            raise ValueError(f"layer {index} is a {lp.layer.kind} layer; only filters have an adjoint here")
        owners, pending = self._start_sum_window(lp, lp.layer.adjoint_local(h.data, self.context(lp, {index: w})))
        return self._join(pending, meanwhile, owners)

    def describe(self) -> str:
        """A table of every layer: shapes, this rank's boxes, FLOPs and halo bytes."""
        rows = [f"grid {self.grid.dims[0]}x{self.grid.dims[1]}, batch {self.batch}, {self.dtype}"]
        for lp in self.layers:
            c = lp.layer.cost(lp.in_shape, self.dtype.itemsize)
            rows.append(f"  {lp.index:2d} {lp.layer.kind:6s} in {lp.in_shape} -> out {lp.out_shape}; owned {lp.out}; "
                        f"window {lp.window}; {c['forward'].flops / 1e9:.3f} GFLOP fwd (whole layer); "
                        f"halo in {lp.exchange.bytes_received} B")
            if lp.index in self.frozen:
                fp = self.frozen[lp.index]
                rows.append(f"     frozen, fused with its pool and LCN (one exchange): filters {fp.out} from window "
                            f"{fp.window}; halo in {fp.exchange.bytes_received} B; weight halo in "
                            f"{self.weight_exchanges[lp.index].bytes_received} B once")
            if lp.index in self.fused:
                fp = self.fused[lp.index]
                rows.append(f"     fused with its LCN (one exchange): pools {fp.out} from window {fp.window}; "
                            f"halo in {fp.exchange.bytes_received} B, the LCN's none")
        return "\n".join(rows)


def _crop(a: Any, box: Box, part: Box) -> Any:
    """The part ``part`` of ``a`` (laid out on ``box``), C-contiguous (a copy only where it is a strict part)."""
    if part == box:
        return a
    return backend.array_module(a).ascontiguousarray(a[part.slices_in(box)])


def check_fuse(fuse: Sequence[int], stages: int, name: str = "fuse") -> tuple[int, ...]:
    """The stages whose pool and LCN share one exchange, checked (``name``: the setting, for the message):
    distinct stage indices of the network, sorted."""
    if not isinstance(fuse, (list, tuple)) or not all(
            isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in fuse):
        raise ValueError(f"{name} must be a list of stage indices, got {fuse!r}")
    bad = [int(k) for k in fuse if not 0 <= k < stages]
    if bad:
        raise ValueError(f"{name}: stage {bad[0]} is not a stage of the network (0..{stages - 1})")
    return tuple(sorted({int(k) for k in fuse}))
