"""Exchange plans: fill windows from owners, and the adjoint (sum windows into owners).

A plan is built once, collectively, from the box every rank owns in a source
layout and the window every rank needs in a destination layout (they may be
different grids).  ``exchange`` overwrites every destination window with the
owners' data; ``exchange_adjoint`` is its transpose: it sends window contents
back to their owners, which *add* them.  Messages are non-blocking; a box that is one contiguous
run of memory (whole rows of (H, W, C, N)) is sent from and received into the arrays
directly, other boxes travel through one packed buffer per direction.  Only peers
with a non-empty intersection talk; a rank's intersection with itself is a local
copy.  Between ``start()`` and ``wait()`` neither array may be touched: the source
may still be being read by MPI.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from .. import backend
from . import boxcopy
from .box import Box
from .collective import raise_collectively
from .cudampi import cuda_aware_mpi
from .distarray import DistArray, fits
from .transfers import Transfer, partition_error, transfers, window_error

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


@dataclass
class _Side:
    """Transfers of one end of a message set and where they sit in the packed buffer."""

    transfers: list[Transfer]
    offsets: list[int] = field(default_factory=list)
    total: int = 0

    def __post_init__(self) -> None:
        off = 0
        for t in self.transfers:
            self.offsets.append(off)
            off += t.box.size
        self.total = off

    def slot(self, i: int) -> slice:
        return slice(self.offsets[i], self.offsets[i] + self.transfers[i].box.size)


class _Pending:
    """A started exchange: call :meth:`wait` before touching either array."""

    def __init__(self, finish):
        self._finish = finish

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
        self._buffers: dict[tuple[int, str], tuple[Any, Any, Any, Any]] = {}
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
        #: Wall seconds spent inside this plan's exchanges (start and wait), over all calls.
        self.seconds = 0.0
        self._in_flight: set[str] = set()

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

    # -- public operations --------------------------------------------------
    def exchange(self, src: DistArray, dst: DistArray, validate: bool = True) -> None:
        """Overwrite ``dst``'s window with the owners' data from ``src``."""
        self.start(src, dst, validate).wait()

    def exchange_adjoint(self, dst: DistArray, src: DistArray, accumulate: bool = False,
                         validate: bool = True) -> None:
        """Sum ``dst``'s window contents into the owners' boxes of ``src``.

        The transpose of :meth:`exchange`.  With ``accumulate`` the sums are added
        to what ``src`` owns; otherwise they replace it.
        """
        self.start_adjoint(dst, src, accumulate, validate).wait()

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
        return self._run(sends, src, src.window, recvs, dst, dst.window, self._tags[0], "fwd", add=False,
                         zero=None)

    def start_adjoint(self, dst: DistArray, src: DistArray, accumulate: bool = False,
                      validate: bool = True) -> _Pending:
        """Begin :meth:`exchange_adjoint`."""
        if validate:
            self._validate(src, dst, "source")
        recvs, sends = self._fwd  # the adjoint reverses every message
        zero = None if accumulate else src.owned_data
        return self._run(sends, dst, dst.window, recvs, src, src.window, self._tags[1], "adj", add=True,
                         zero=zero)

    # -- machinery ----------------------------------------------------------
    def _validate(self, src: DistArray, dst: DistArray, written: str) -> None:
        err = None
        for name, arr, box, attr in (("source", src, self.owned, "owned"), ("destination", dst, self.window, "window")):
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
        if err is None and backend.is_device_array(src.data) != backend.is_device_array(dst.data):
            err = "source and destination buffers must both be host arrays or both device arrays"
        raise_collectively(self.comm, err)

    def _channel(self, sample: Any, direction: str, n_send: int, n_recv: int):
        """Packed buffers for one direction and array library, allocated once."""
        xp = backend.array_module(sample)
        key = (id(xp), direction)
        if key not in self._buffers:
            send = xp.empty(n_send, self.dtype)
            recv = xp.empty(n_recv, self.dtype)
            stage = backend.is_device_array(sample) and not cuda_aware_mpi()
            hsend = backend.empty_host_like(send) if stage else None
            hrecv = backend.empty_host_like(recv) if stage else None
            self._buffers[key] = (send, recv, hsend, hrecv)
        return self._buffers[key]

    @staticmethod
    def _contiguous(arr: Any, box: Box, arr_box: Box) -> Any:
        """The view of ``box`` in ``arr`` if it is one contiguous block of memory, else None."""
        if backend.uses_kernels(arr):
            return None  # the kernel path (GPU or emulated) keeps its own packing
        view = arr[box.slices_in(arr_box)]
        return view if view.flags.c_contiguous else None

    def _run(self, out: _Side, src: DistArray, src_box: Box, inc: _Side, dst: DistArray, dst_box: Box,
             tag: int, direction: str, add: bool, zero: Any) -> _Pending:
        t_start = time.perf_counter()
        if direction in self._in_flight:
            raise RuntimeError(f"an exchange ({direction}) of this plan is still in flight: call wait() on it "
                               "before starting another (they would share the plan's message buffers)")
        send, recv, hsend, hrecv = self._channel(src.data, direction, out.total, inc.total)
        wire_send = send if hsend is None else hsend
        wire_recv = recv if hrecv is None else hrecv
        device = backend.is_device_array(send)
        if device:
            # MPI does not see CUDA streams: work queued earlier (the last unpack from
            # these buffers, a pool allocation) must finish before MPI writes to them.
            backend.synchronize(send)
        comm = self._wire
        # A box that is one contiguous run of the array (e.g. whole rows of (H, W, C, N))
        # travels straight from and into the arrays: no packing, no extra copy.
        direct_ok = hsend is None and not device
        recv_views = [self._contiguous(dst.data, t.box, dst_box) if direct_ok and not add else None
                      for t in inc.transfers]
        reqs = [comm.Irecv(v if v is not None else wire_recv[inc.slot(i)], source=t.peer, tag=tag)
                for i, (t, v) in enumerate(zip(inc.transfers, recv_views))]
        send_views = [self._contiguous(src.data, t.box, src_box) if direct_ok else None for t in out.transfers]
        for i, (t, v) in enumerate(zip(out.transfers, send_views)):
            if v is None:
                boxcopy.pack(src.data, src_box, t.box, send[out.slot(i)])
        if out.transfers and device:
            if hsend is None:
                backend.synchronize(send)  # the packing must be done before MPI reads
            else:
                backend.copy_to_host(send, hsend)
        for i, (t, v) in enumerate(zip(out.transfers, send_views)):
            buf = v if v is not None else wire_send[out.slot(i)]
            reqs.append(comm.Isend(buf, dest=t.peer, tag=tag))
            self.total_bytes_sent += buf.nbytes
        self.calls += 1
        self._in_flight.add(direction)
        # The self part moves while the messages travel.  When source and destination
        # are the same buffer (an in-place halo refresh) it is already in place.
        own = self.self_box
        mine = None
        if not own.is_empty and not (src.data is dst.data and src_box == dst_box and not add):
            mine = src.data[own.slices_in(src_box)]
            if add and zero is not None and backend.array_module(mine).may_share_memory(mine, zero):
                mine = mine.copy()  # zeroing the target below would erase it
            elif not add:
                dst.data[own.slices_in(dst_box)] = mine
                mine = None

        self.seconds += time.perf_counter() - t_start

        def finish() -> None:
            t_wait = time.perf_counter()
            try:
                MPI.Request.Waitall(reqs)
            finally:
                self._in_flight.discard(direction)
            if hrecv is not None and inc.transfers:
                backend.copy_from_host(hrecv, recv)  # one transfer for all messages
            if zero is not None:
                zero[...] = 0
            if mine is not None:
                dst.data[own.slices_in(dst_box)] += mine
            for i, (t, v) in enumerate(zip(inc.transfers, recv_views)):
                if v is None:
                    boxcopy.unpack(recv[inc.slot(i)], dst.data, dst_box, t.box, add)
            self.seconds += time.perf_counter() - t_wait

        return _Pending(finish)
