"""Exchange plans: fill windows from owners, and the adjoint (sum windows into owners).

A plan is built once, collectively, from the box every rank owns in a source
layout and the window every rank needs in a destination layout (they may be
different grids).  ``exchange(src, dst)`` overwrites every destination window
with the owners' data; ``exchange_adjoint(window, owners)`` is its transpose: it
sends window contents back to their owners, which *add* them.  Only peers with a
non-empty intersection talk; a rank's intersection with itself is a local copy.
Messages are non-blocking.  Between ``start()`` and ``wait()`` neither array may be
touched: the source may still be being read by MPI.

How the messages travel (the *transport*) is decided the first time a plan meets
an array library and a pair of window boxes, and cached (``_Route``):

* ``direct``: host memory; every message is a box that is one contiguous run of
  its array (whole rows of (H, W, C, N)) and is sent from and received into the
  array itself;
* ``datatype``: host memory; every message goes straight from and into the
  arrays, the contiguous boxes as they lie and the others (column strips of a 1xP
  grid of at least ``DATATYPE_MIN_BYTES`` each, say) through an MPI derived
  datatype (a subarray type committed once per route, freed with the plan or by
  ``free()``): MPI reads and writes the strided box in place, with no copy in Python;
* ``packed``: host memory; some boxes travel through one packed buffer per
  direction: every box the adjoint sums (MPI cannot add with a receive; the
  adjoint's sends still use datatypes), every box of the ``cuda-emu`` backend, every
  box of an array that is not C-ordered or whose dtype MPI has no type for, and
  every strided box below ``DATATYPE_MIN_BYTES`` (1 MiB: there one NumPy copy on
  each side beats MPI's start-up cost for a strided type); the others still
  directly or through datatypes;
* ``staged``: device buffers, packed by the kernels, through page-locked host
  buffers (MPI not CUDA-aware);
* ``cuda-aware``: device buffers handed to MPI after a stream synchronisation.

``ExchangePlan.transport(direction)`` tells which one a call used.
"""
from __future__ import annotations

import time
import weakref
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from .. import backend
from .box import Box
from .collective import raise_collectively, wait_all
from .cudampi import cuda_aware_mpi
from .distarray import DistArray, fits
from .messages import Transfer, partition_error, transfers, window_error
from .routes import _Buffers, _free_types, _mpi_type, _Route, _Side

DATATYPE_MIN_BYTES = 1 << 20  # strided host boxes from this size travel as MPI datatypes (measured crossover)

_DIRECTIONS = {"forward": "fwd", "adjoint": "adj"}  # public name -> key of a direction's state
_TAG_SPACE = 16000  # two tags per plan stay under the MPI-guaranteed tag bound 32767
_last_tag = 0
_keyval = None


def private_comm(comm: MPI.Comm) -> MPI.Comm:
    """A duplicate of ``comm`` for plan traffic, made once per communicator (collective the first time).

    Exchange messages then never match the caller's own point-to-point messages
    (an ``ANY_TAG`` receive, say).  The duplicate is cached as an attribute of
    ``comm`` and freed with it.
    """
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=lambda c, k, dup: dup.Free() if not MPI.Is_finalized() else None)
    dup = comm.Get_attr(_keyval)
    if dup is None:
        dup = comm.Dup()
        comm.Set_attr(_keyval, dup)
    return dup


_IN_PLACE = object()  # _copy_self: the own part of a sum is already where it belongs


class _Pending:
    """A started exchange: call :meth:`wait` before touching either array; :meth:`progress` meanwhile."""

    def __init__(self, finish, reqs=()):
        self._finish, self._reqs = finish, reqs

    def progress(self) -> None:
        """Let MPI move the messages on (one ``Testall``; never blocks).  Between pieces of the work that
        overlaps an exchange: many MPI libraries move a message only inside an MPI call, and over TCP
        (MPICH's ofi netmod) a halo then waited for the whole overlapped computation."""
        if self._finish is not None and self._reqs:
            MPI.Request.Testall(self._reqs)

    def wait(self) -> None:
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()


class ExchangePlan:
    """Collective plan between an owned layout and a window layout of one array.

    Parameters
    ----------
    comm : MPI.Comm
        All ranks taking part; the constructor is collective over it.
    shape : sequence of int
        Global shape of the array (identical on every rank).
    owned : Box
        The box this rank owns in the source layout; the boxes of all ranks must
        tile the array exactly once.
    window : Box
        The box this rank needs in the destination layout (any box in the array,
        empty allowed).
    dtype : numpy dtype
        Element type of the buffers the plan moves.

    Raises
    ------
    ValueError
        On every rank, if any rank's arguments are inconsistent.
    """

    def __init__(self, comm: MPI.Comm, shape: Sequence[int], owned: Box | None, window: Box,
                 dtype: Any = np.float32):
        global _last_tag
        self.rank = comm.Get_rank()
        err = None
        try:
            self.shape = tuple(int(v) for v in shape)
            self.dtype = np.dtype(dtype)
            nd = len(self.shape)
            own = owned if owned is not None else Box.empty(nd)
            mine = (self.shape, self.dtype.str, own.to_tuple(), window.to_tuple(), _last_tag)
        except (TypeError, ValueError, AttributeError) as e:
            err = f"bad exchange-plan arguments on rank {self.rank}: {e}"
            mine = None
        everyone = comm.allgather(mine)
        if err is not None:
            pass  # this rank's own error is the one to report
        elif any(e is None for e in everyone):
            err = "bad exchange-plan arguments on another rank"
        elif owned is None:
            err = f"rank {self.rank} has no owned box: the source of an exchange must own a block"
        elif (everyone[0][0], everyone[0][1]) != (self.shape, self.dtype.str):
            err = (f"plan arguments differ between ranks: rank {self.rank} has shape {self.shape} dtype "
                   f"{self.dtype}, rank 0 has shape {everyone[0][0]} dtype {np.dtype(everyone[0][1])}")
        elif own.ndim != nd or window.ndim != nd:
            err = f"owned {own} and window {window} must have the rank of the shape {self.shape}"
        raise_collectively(comm, err)
        gbox = Box.from_shape(self.shape)
        self.owned_boxes = [Box.from_tuple(e[2]) for e in everyone]
        self.windows = [Box.from_tuple(e[3]) for e in everyone]
        raise_collectively(comm, partition_error(self.rank, self.owned_boxes, gbox)
                           or window_error(self.rank, self.windows, gbox))
        self.comm = comm
        self._wire = private_comm(comm)
        _last_tag = max(e[4] for e in everyone) % _TAG_SPACE + 1
        self._tags = (2 * _last_tag, 2 * _last_tag + 1)
        self.owned, self.window = own, window
        sends, recvs = transfers(self.rank, self.owned_boxes, self.windows)
        me = self.rank
        self._fwd = (_Side([t for t in sends if t.peer != me]), _Side([t for t in recvs if t.peer != me]))
        #: The part of this rank's window it owns itself: a local copy, never a message.
        self.self_box = next((t.box for t in sends if t.peer == me), Box.empty(nd))
        self._no_self = self.self_box.is_empty
        self._buffers: dict[tuple[str, int], _Buffers] = {}
        self._routes: dict[tuple, _Route] = {}
        self._last_route: dict[str, _Route] = {}
        item = self.dtype.itemsize
        #: Bytes this rank sends per exchange (and receives per adjoint): exactly the intersections.
        self.bytes_sent = self._fwd[0].total * item
        #: Bytes this rank receives per exchange (and sends per adjoint).
        self.bytes_received = self._fwd[1].total * item
        #: Bytes copied locally (self-intersection) per exchange.
        self.bytes_local = self.self_box.size * item
        self.messages_sent = len(self._fwd[0].transfers)
        self.messages_received = len(self._fwd[1].transfers)
        #: Bytes this rank handed to MPI sends, counted at each send, over all calls.
        self.total_bytes_sent = 0
        self.calls = 0
        #: Messages this rank posted (sends and receives) over all calls: what a step pays latency for.
        self.messages = 0
        #: Wall seconds spent inside this plan's exchanges (start and wait), over all calls.
        self.seconds = 0.0
        self._in_flight: set[str] = set()
        #: The element type MPI reads and writes in place (None: boxes that are not contiguous are packed).
        self._mpi_type = _mpi_type(self.dtype)
        self._types: list = []  # every committed datatype of every route, freed with the plan
        self._finalizer = weakref.finalize(self, _free_types, self._types)

    def free(self) -> None:
        """Free the MPI datatypes of the plan's routes now (also done when the plan is collected).

        Not collective.  The plan stays usable: a later call binds its routes again.
        """
        if self._in_flight:
            raise RuntimeError("free() while an exchange of this plan is in flight: call wait() first")
        _free_types(self._types)
        self._routes.clear()

    @classmethod
    def between(cls, src: DistArray, dst: DistArray) -> "ExchangePlan":
        """The plan from ``src``'s owned layout to ``dst``'s windows (collective)."""
        same = MPI.Comm.Compare(src.comm, dst.comm) in (MPI.IDENT, MPI.CONGRUENT)
        raise_collectively(src.comm, None if same else
                           "source and destination arrays live on different communicators (ranks differ)")
        return cls(src.comm, src.shape, src.owned, dst.window, src.dtype)

    @property
    def sends(self) -> list[Transfer]:
        """The messages this rank sends per exchange (self excluded: see ``self_box``)."""
        return list(self._fwd[0].transfers)

    @property
    def recvs(self) -> list[Transfer]:
        """The messages this rank receives per exchange."""
        return list(self._fwd[1].transfers)

    def transport(self, direction: str = "forward") -> str | None:
        """How the last call in ``direction`` ("forward" or "adjoint") moved its data.

        One of ``"direct"`` (host memory: every message is a contiguous box and goes
        straight from and into the arrays), ``"datatype"`` (host memory: every message
        goes straight from and into the arrays, boxes that are not one contiguous run
        through an MPI derived datatype), ``"packed"`` (host memory, some or all
        messages through the packed buffers: sums, kernel-handled arrays, arrays that
        are not C-ordered),
        ``"staged"`` (device buffers through page-locked host buffers) or
        ``"cuda-aware"`` (device buffers handed to MPI); None before the first call.
        The choice is made once per array library and pair of window boxes.
        """
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction must be one of {', '.join(_DIRECTIONS)}, got {direction!r}")
        route = self._last_route.get(_DIRECTIONS[direction])
        return None if route is None else route.name

    # -- public operations --------------------------------------------------
    def exchange(self, src: DistArray, dst: DistArray, validate: bool = True) -> None:
        """Overwrite ``dst``'s window with the owners' data from ``src``."""
        self.start(src, dst, validate).wait()

    def exchange_adjoint(self, window: DistArray, owners: DistArray, accumulate: bool = False,
                         validate: bool = True) -> None:
        """Sum the contents of ``window``'s window into the owned boxes of ``owners``.

        The transpose of :meth:`exchange`: data moves from ``window`` (an array of the
        plan's destination layout, read) to ``owners`` (an array of its source layout,
        written; only the owned box changes).  With ``accumulate`` the sums are added
        to what ``owners`` owns; otherwise they replace it.
        """
        self.start_adjoint(window, owners, accumulate, validate).wait()

    def start(self, src: DistArray, dst: DistArray, validate: bool = True) -> _Pending:
        """Begin :meth:`exchange`; work on *other* data may overlap until ``wait()``
        (the source is sent straight from its memory when a box is contiguous, so it
        must not change before ``wait()``).

        ``validate=False`` skips the collective check of the buffers (one small
        allreduce); hot loops whose buffers come from the plan's own arrays use it.
        """
        if validate:
            self._validate(src, dst, "destination")
        sends, recvs = self._fwd
        return self._run("fwd", sends, src, recvs, dst, self._tags[0], add=False, zero=None)

    def start_adjoint(self, window: DistArray, owners: DistArray, accumulate: bool = False,
                      validate: bool = True) -> _Pending:
        """Begin :meth:`exchange_adjoint` (same arguments); finish with ``wait()``."""
        if validate:
            self._validate(owners, window, "source")
        recvs, sends = self._fwd  # the adjoint reverses every message
        zero = None if accumulate else owners.owned_data
        return self._run("adj", sends, window, recvs, owners, self._tags[1], add=True, zero=zero)

    # -- machinery ----------------------------------------------------------
    def _validate(self, owners: DistArray, windowed: DistArray, written: str) -> None:
        """Check (collectively) that the arrays fit the plan: ``owners`` its source layout
        ("source"), ``windowed`` its destination windows ("destination")."""
        err = None
        for name, arr, box, attr in (("source", owners, self.owned, "owned"),
                                     ("destination", windowed, self.window, "window")):
            if getattr(arr, attr) != box:
                err = f"{name} array's {attr} box {getattr(arr, attr)} differs from the plan's {box}"
            elif arr.shape != self.shape or arr.dtype != self.dtype:
                err = (f"{name} array has shape {arr.shape} dtype {arr.dtype}, "
                       f"the plan was built for shape {self.shape} dtype {self.dtype}")
            elif not fits(arr.data, arr.window):
                err = f"{name} buffer shape {tuple(arr.data.shape)} does not match its window {arr.window}"
            elif name == written and not getattr(getattr(arr.data, "flags", None), "writeable", True):
                err = f"{name} buffer is read-only, and this exchange writes into it"
            if err:
                break
        if err is None and backend.is_device_array(owners.data) != backend.is_device_array(windowed.data):
            err = "source and destination buffers must both be host arrays or both device arrays"
        raise_collectively(self.comm, err)

    def _run(self, direction: str, out: _Side, src: DistArray, inc: _Side, dst: DistArray, tag: int,
             add: bool, zero: Any) -> _Pending:
        """Start one call: messages from ``src`` (the ``out`` side) into ``dst`` (``inc``).

        ``add`` sums the received boxes into ``dst`` (the adjoint); ``zero``, when
        given, is cleared just before the sums land (the adjoint without accumulate).
        """
        t_start = time.perf_counter()
        self._check_idle(direction)
        route = self._route(direction, out, src, inc, dst, add)
        comm = self._wire
        route.sync_before_mpi_writes()
        reqs = route.post_receives(comm, dst.data, tag)
        route.pack(src.data)
        route.make_sends_readable()
        sends, nbytes = route.post_sends(comm, src.data, tag)
        reqs += sends
        self.total_bytes_sent += nbytes
        self.calls += 1
        self.messages += len(out.transfers) + len(inc.transfers)
        self._in_flight.add(direction)
        mine = self._copy_self(route, src, dst, add, zero)  # while the messages travel
        if mine is _IN_PLACE:  # a sum whose own part already lies in place: nothing to clear or add
            mine = zero = None
        self.seconds += time.perf_counter() - t_start
        return _Pending(lambda: self._finish(direction, route, reqs, dst, add, zero, mine), reqs)

    def _check_idle(self, direction: str) -> None:
        """Refuse a second call of a direction before the first is waited for."""
        if direction in self._in_flight:
            raise RuntimeError(f"an exchange ({direction}) of this plan is still in flight: call wait() on it "
                               "before starting another (they would share the plan's message buffers)")

    def _route(self, direction: str, out: _Side, src: DistArray, inc: _Side, dst: DistArray, add: bool) -> _Route:
        """The cached route of this call's array library and window boxes, bound on first use.

        Arrays handled by the kernels (device arrays, the ``cuda-emu`` backend) always
        pack; other (C-contiguous) arrays move a box directly when it is one contiguous
        run of their memory and through a derived datatype otherwise; received boxes
        that are summed (``add``) are always packed.
        """
        xp = backend.array_module(src.data)
        direct_src = _plain_c_order(src.data)
        direct_dst = _plain_c_order(dst.data) and not add
        # The windows' corners, not the boxes: hashing a Box costs more than the rest of the key.
        key = (direction, id(xp), direct_src, direct_dst, src.window.to_tuple(), dst.window.to_tuple())
        route = self._routes.get(key)
        if route is None:
            device = backend.is_device_array(src.data)
            bufs = self._packed_buffers(direction, xp, device, out.total, inc.total)
            route = self._routes[key] = _Route(out, inc, src.window, dst.window, bufs, device,
                                               direct_src and not device, direct_dst and not device,
                                               self._mpi_type, self._types, DATATYPE_MIN_BYTES)
        self._last_route[direction] = route
        return route

    def _packed_buffers(self, direction: str, xp: Any, device: bool, n_send: int, n_recv: int) -> _Buffers:
        """The packed buffers of a direction and array library (allocated once, shared by its routes).

        Device buffers are staged through page-locked host buffers unless MPI is CUDA-aware.
        """
        key = (direction, id(xp))
        if key not in self._buffers:
            bufs = _Buffers(xp.empty(n_send, self.dtype), xp.empty(n_recv, self.dtype))
            if device and not cuda_aware_mpi():
                bufs.host_send = backend.empty_host_like(bufs.send)
                bufs.host_recv = backend.empty_host_like(bufs.recv)
            self._buffers[key] = bufs
        return self._buffers[key]

    def _copy_self(self, route: _Route, src: DistArray, dst: DistArray, add: bool, zero: Any) -> Any:
        """Move the part of the window this rank owns itself; returns what is still to add.

        The forward copy happens at once.  The adjoint's sum must wait until ``zero`` is
        cleared: its source is returned (copied if the clearing would erase it).  When
        source and destination are the same buffer (an in-place halo refresh) the
        forward part is already in place.
        """
        own = self.self_box
        if self._no_self or (src.data is dst.data and route.same_windows and not add):
            return None
        if (add and zero is not None and src.data is dst.data and route.same_windows and own == route.dst_box
                and zero.size == dst.data.size):
            # Summed into the same buffer, this rank's own part covering all of it: clearing it and
            # adding the own part back would leave it as it is (the plan's one-rank windows).
            return _IN_PLACE
        mine = src.data[own.slices_in(route.src_box)]
        if not add:
            dst.data[own.slices_in(route.dst_box)] = mine
            return None
        if zero is not None and backend.array_module(mine).may_share_memory(mine, zero):
            mine = mine.copy()  # zeroing the target would erase it
        return mine

    def _finish(self, direction: str, route: _Route, reqs: list, dst: DistArray, add: bool, zero: Any,
                mine: Any) -> None:
        """Complete one call: wait for the messages, then clear, add the self part and unpack."""
        t_wait = time.perf_counter()
        try:
            wait_all(reqs)
        finally:
            self._in_flight.discard(direction)
        route.unstage_receives()
        if zero is not None:
            zero[...] = 0
        if mine is not None:
            dst.data[self.self_box.slices_in(route.dst_box)] += mine
        route.unpack(dst.data, add)
        self.seconds += time.perf_counter() - t_wait


def _plain_c_order(arr: Any) -> bool:
    """True for a C-contiguous array the kernels do not handle: its contiguous boxes may be
    handed to MPI as they lie (device arrays and the ``cuda-emu`` backend always pack)."""
    return not backend.uses_kernels(arr) and bool(getattr(getattr(arr, "flags", None), "c_contiguous", False))
