"""Scratch arrays that outlive one call: the numpy backend's gathers and per-chunk products.

Every chunk of a filter pass gathers receptive fields and multiplies them in buffers
of about a cache's size (:data:`~cotsdl.ops.cpu.parallel.CHUNK_BYTES`).  Allocated
afresh they cost page faults on first touch, every chunk of every step, unless the
process-wide allocator was tuned (:mod:`~cotsdl.ops.cpu.allocator`).  A
:class:`Workspace` keeps them instead: one buffer per (name, thread), grown when a
larger one is asked for, never shrunk.  :class:`~cotsdl.nn.plan.NetworkPlan` holds one
per layer, so scripts that train get the command's speed without touching malloc.

Results are another matter: a layer's output lives on (in the tape) until the backward
pass.  :class:`Outputs` lends them for one training step and takes them back when the
next one starts (:meth:`~cotsdl.nn.plan.NetworkPlan.step`): the same memory every
step, and outside a step every result is a fresh array as usual.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np


class Outputs:
    """Result arrays lent for one step and recycled at the start of the next.

    While :attr:`active`, :meth:`empty` hands out an array of the asked shape that was
    lent in the previous step and is not yet lent in this one, else a new one; inactive,
    it is ``xp.empty``.  :meth:`recycle` begins a step (what was lent may be lent again),
    :meth:`release_unused` ends one (arrays it did not ask for are let go), so the memory
    held between steps is one step's results.
    """

    def __init__(self) -> None:
        self.active = False
        self._lock = threading.Lock()
        self._free: dict[tuple, list[Any]] = {}
        self._lent: list[tuple[tuple, Any]] = []

    def empty(self, shape: tuple[int, ...], dtype: Any, xp: Any = np) -> Any:
        """An array of ``shape`` and ``dtype`` of the array library ``xp`` (contents undefined)."""
        if not self.active:
            return xp.empty(shape, dtype)
        key = (tuple(int(d) for d in shape), np.dtype(dtype).str, id(xp))
        with self._lock:
            free = self._free.get(key)
            a = free.pop(0) if free else None  # in the order lent: each call gets its array of last step
        if a is None:
            a = xp.empty(key[0], dtype)
        with self._lock:
            self._lent.append((key, a))
        return a

    def recycle(self) -> None:
        """A step begins: everything lent so far may be lent again."""
        with self._lock:
            for key, a in self._lent:
                self._free.setdefault(key, []).append(a)
            self._lent = []

    @contextmanager
    def step(self) -> Iterator[None]:
        """One step: lend inside the block, take back at the next step; nested calls join the outer step."""
        if self.active:
            yield
            return
        self.recycle()
        self.active = True
        try:
            yield
        finally:
            self.active = False
            self.release_unused()

    def release_unused(self) -> None:
        """A step ended: let go of what it did not ask for, so memory stays at one step's results."""
        with self._lock:
            self._free = {}

    @property
    def nbytes(self) -> int:
        """Bytes held (lent and free)."""
        with self._lock:
            return sum(a.nbytes for _, a in self._lent) + sum(a.nbytes for v in self._free.values() for a in v)


class Workspace:
    """Named scratch arrays, one per calling thread; contents are undefined on each :meth:`get`.

    ``outputs``: where the layer's results come from (:meth:`output`); None: fresh arrays.
    """

    def __init__(self, outputs: Outputs | None = None) -> None:
        self._bufs: dict[tuple[str, int, np.dtype], np.ndarray] = {}
        self.outputs = outputs

    def output(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A result array (contents undefined): lent by :attr:`outputs` during a step, else new."""
        return np.empty(shape, dtype) if self.outputs is None else self.outputs.empty(shape, dtype)

    def get(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A C-contiguous array of ``shape`` and ``dtype``, private to the calling thread until its next ``get(name)``."""
        dtype = np.dtype(dtype)
        key = (name, threading.get_ident(), dtype)
        size = 1
        for d in shape:
            size *= int(d)
        buf = self._bufs.get(key)
        if buf is None:  # a new thread (a resized pool): drop the buffers of threads that have ended
            alive = {t.ident for t in threading.enumerate()}
            for k in [k for k in list(self._bufs) if k[1] not in alive]:
                self._bufs.pop(k, None)
        if buf is None or buf.size < size:
            buf = np.empty(max(size, 1), dtype)
            self._bufs[key] = buf
        return buf[:size].reshape(shape)

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return sum(b.nbytes for b in list(self._bufs.values()))

    def clear(self) -> None:
        """Give every buffer back."""
        self._bufs.clear()


def or_new(ws: Workspace | None) -> Workspace:
    """``ws``, or a workspace for this call only (scratch still reused across its chunks)."""
    return Workspace() if ws is None else ws
