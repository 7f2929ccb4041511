"""How an exchange plan moves its messages: packed-buffer slots, the per-route transport
decisions (direct views, MPI derived datatypes, packed and staged buffers) and the steps of
one call.  Used by :class:`cotsdl.array.exchange.ExchangePlan`, which caches one route per
direction, array library and pair of window boxes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import backend
from . import boxcopy
from .box import Box
from .messages import Transfer


@dataclass
class _Side:
    """The messages of one end of a direction (all sends, or all receives) and their slots
    in that end's packed buffer (message ``i`` occupies ``slots[i]``)."""

    transfers: list[Transfer]
    slots: list[slice] = field(default_factory=list)
    total: int = 0

    def __post_init__(self) -> None:
        off = 0
        for t in self.transfers:
            self.slots.append(slice(off, off + t.box.size))
            off += t.box.size
        self.total = off


@dataclass(eq=False)
class _Buffers:
    """The packed message buffers of one direction and array library, allocated once.

    All routes of that direction share them (only one call per direction is in
    flight), so binding a new pair of windows costs no device memory.  With
    ``host_send``/``host_recv`` (device buffers, MPI not CUDA-aware) the messages
    travel through these page-locked host copies.
    """

    send: Any
    recv: Any
    host_send: Any = None
    host_recv: Any = None

    @property
    def staged(self) -> bool:
        return self.host_send is not None


class _Route:
    """How one direction of a plan moves data for one array library and pair of window boxes.

    Built the first time the plan meets that combination and cached on the plan, so
    every later call only replays the decisions made here.  Each message travels one
    of three ways, decided per message:

    * straight from or into the array (``direct``): a box that is one contiguous run
      of a C-ordered host array;
    * as an MPI derived datatype (a committed subarray type, ``datatype``): any other
      box of a C-ordered host array of at least ``min_bytes`` bytes
      (:data:`cotsdl.array.exchange.DATATYPE_MIN_BYTES`), read or
      written in place by MPI (never a box whose receive is summed: MPI cannot add
      into memory with a receive);
    * through its slot of the packed buffers: every box of a device or kernel-handled
      array, every summed receive, and every box of other host memory (not C-ordered,
      a dtype MPI has no type for).

    Device buffers may be staged through host memory.  Each method below is one step
    of a call.
    """

    def __init__(self, out: _Side, inc: _Side, src_box: Box, dst_box: Box, bufs: _Buffers, device: bool,
                 direct_src: bool, direct_dst: bool, mpi_type: Any = None, types: list | None = None,
                 min_bytes: int = 1 << 20):
        self.out, self.inc, self.bufs, self.device = out, inc, bufs, device
        self.src_box, self.dst_box = src_box, dst_box
        self.same_windows = src_box == dst_box
        #: The derived datatypes this route committed (owned by the plan's list ``types``).
        self.types: list = []

        itemsize = bufs.send.dtype.itemsize

        def ways(side: _Side, box: Box, allowed: bool) -> list[tuple[str, Any]]:
            # Per message: ("view", slices in the array), ("type", committed datatype) or ("slot", slice).
            out_ = []
            for t, slot in zip(side.transfers, side.slots):
                if allowed and t.box.is_contiguous_in(box):
                    out_.append(("view", t.box.slices_in(box)))
                elif allowed and mpi_type is not None and t.box.size * itemsize >= min_bytes:
                    dt = _subarray_type(mpi_type, box, t.box)
                    self.types.append(dt)
                    out_.append(("type", dt))
                else:
                    out_.append(("slot", slot))
            return out_

        self.send_ways = ways(out, src_box, direct_src)
        self.recv_ways = ways(inc, dst_box, direct_dst)
        if types is not None:
            types.extend(self.types)
        kinds = {k for k, _ in self.send_ways + self.recv_ways}
        if device:
            self.name = "staged" if bufs.staged else "cuda-aware"
        elif "slot" in kinds or not direct_src:
            self.name = "packed"
        else:
            self.name = "datatype" if "type" in kinds else "direct"
        self.wire_send = bufs.host_send if bufs.staged else bufs.send
        self.wire_recv = bufs.host_recv if bufs.staged else bufs.recv
        self.send_bytes = out.total * bufs.send.dtype.itemsize
        # Host messages that travel through the packed buffers: the box's slices in its
        # array and its slot of the buffer shaped like the box, computed once.
        host = not device and not backend.uses_kernels(bufs.send)
        self._host_pack = host and _host_slicing(bufs.send)
        self._packs = [(t.box, slot, self._slot_copy(t.box, src_box, bufs.send[slot]))
                       for t, (k, slot) in zip(out.transfers, self.send_ways) if k == "slot"]
        self._unpacks = [(t.box, slot, self._slot_copy(t.box, dst_box, bufs.recv[slot]))
                         for t, (k, slot) in zip(inc.transfers, self.recv_ways) if k == "slot"]

    def _slot_copy(self, box: Box, arr_box: Box, buf: Any) -> tuple | None:
        """(slices of ``box`` in its array, the slot viewed in the box's shape) for a host copy; else None."""
        return (box.slices_in(arr_box), buf.reshape(box.shape)) if self._host_pack else None

    def sync_before_mpi_writes(self) -> None:
        """MPI does not see CUDA streams: work queued earlier (the last unpack from these
        buffers, a pool allocation) must finish before MPI writes into them.  Nothing to wait for
        without receives (one rank): a step's device work then never waits for the host (a CUDA graph
        can capture it)."""
        if self.device and self.inc.transfers:
            backend.synchronize(self.bufs.send)

    def post_receives(self, comm: Any, dst: Any, tag: int) -> list:
        """Post every receive first, so that no peer's send waits for a matching receive."""
        return [comm.Irecv(_message(dst, way, self.wire_recv), source=t.peer, tag=tag)
                for t, way in zip(self.inc.transfers, self.recv_ways)]

    def pack(self, src: Any) -> None:
        """Copy each message that travels through the packed buffer into its slot."""
        for box, slot, host in self._packs:
            if host is not None:
                np.copyto(host[1], src[host[0]])
            else:
                boxcopy.pack(src, self.src_box, box, self.bufs.send[slot])

    def make_sends_readable(self) -> None:
        """On a device the packing is queued work: finish it (CUDA-aware MPI reads the
        device buffer) or bring all sends down to the host in one copy (staged)."""
        if self.out.transfers and self.device:
            if self.bufs.staged:
                backend.copy_to_host(self.bufs.send, self.bufs.host_send)
            else:
                backend.synchronize(self.bufs.send)

    def post_sends(self, comm: Any, src: Any, tag: int) -> tuple[list, int]:
        """Hand every message to MPI; returns the requests and the bytes handed over."""
        wire = self.wire_send
        return ([comm.Isend(_message(src, way, wire), dest=t.peer, tag=tag)
                 for t, way in zip(self.out.transfers, self.send_ways)], self.send_bytes)

    def unstage_receives(self) -> None:
        """Bring all staged receives up to the device in one copy."""
        if self.bufs.staged and self.inc.transfers:
            backend.copy_from_host(self.bufs.host_recv, self.bufs.recv)

    def unpack(self, dst: Any, add: bool) -> None:
        """Copy (or add) each packed message from the receive buffer into its box of ``dst``."""
        for box, slot, host in self._unpacks:
            if host is None:
                boxcopy.unpack(self.bufs.recv[slot], dst, self.dst_box, box, add)
            elif add:
                view = dst[host[0]]
                view += host[1]
            else:
                np.copyto(dst[host[0]], host[1])


def _message(arr: Any, way: tuple[str, Any], wire: Any) -> Any:
    """The MPI buffer of one message: a view of ``arr``, ``arr`` through a datatype, or a buffer slot."""
    kind, what = way
    if kind == "view":
        return arr[what]
    if kind == "type":
        return [arr, 1, what]
    return wire[what]


def _subarray_type(base: MPI.Datatype, arr_box: Box, box: Box) -> MPI.Datatype:
    """A committed datatype selecting ``box`` inside a C-ordered array covering ``arr_box``.

    Every trailing axis that both span whole is merged into the one before it, so a
    column strip of (H, W, C, N) becomes H runs of w*C*N elements (a 2-D subarray,
    which MPI handles as a plain strided vector; MPICH sends a 4-D subarray of the
    same elements through its much slower pack pipeline).
    """
    outer, inner = list(arr_box.shape), list(box.shape)
    starts = [b - a for b, a in zip(box.lo, arr_box.lo)]
    while len(outer) > 1 and inner[-1] == outer[-1]:
        n = outer.pop()
        inner.pop()
        starts.pop()
        outer[-1], inner[-1], starts[-1] = outer[-1] * n, inner[-1] * n, starts[-1] * n
    return base.Create_subarray(outer, inner, starts, order=MPI.ORDER_C).Commit()


#: Boxes that are not one contiguous run travel as derived datatypes from this many
#: bytes per message on; smaller ones are packed.  Measured with MPICH 5 (ch4, shared
#: memory, two ranks exchanging both ways, 1x2 grid): a strided datatype costs ~45 us
#: to start and then moves at nearly contiguous speed, packing costs two host copies,
#: and the two cross near 1 MiB (at 8 MiB the datatype takes a third of the time).
#: Read when a route is bound.


def _free_types(types: list) -> None:
    """Free committed datatypes (once: the list is emptied); nothing to do once MPI is finalized."""
    if types and MPI.Is_initialized() and not MPI.Is_finalized():
        for dt in types:
            if dt != MPI.DATATYPE_NULL:
                dt.Free()
    types.clear()


def _host_slicing(buf: Any) -> bool:
    """True for a plain numpy buffer: packed host messages are copied with precomputed views."""
    return type(buf) is np.ndarray


def _mpi_type(dtype: np.dtype) -> MPI.Datatype | None:
    """The predefined MPI datatype of a native numpy element type; None where there is none (pack instead)."""
    return _MPI_TYPES.get(np.dtype(dtype))


_MPI_TYPES = {np.dtype(t): m for t, m in ((np.float32, MPI.FLOAT), (np.float64, MPI.DOUBLE),
                                          (np.int32, MPI.INT32_T), (np.int64, MPI.INT64_T),
                                          (np.uint8, MPI.UINT8_T), (np.complex64, MPI.C_FLOAT_COMPLEX),
                                          (np.complex128, MPI.C_DOUBLE_COMPLEX))}


