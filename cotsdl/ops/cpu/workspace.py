"""Scratch arrays that outlive one call: the numpy backend's gathers and per-chunk products.

Every chunk of a filter pass gathers receptive fields and multiplies them in buffers
of about a cache's size (:data:`~cotsdl.ops.cpu.parallel.CHUNK_BYTES`).  Allocated
afresh they cost page faults on first touch, every chunk of every step, unless the
process-wide allocator was tuned (:mod:`~cotsdl.ops.cpu.allocator`).  A
:class:`Workspace` keeps them instead: one buffer per (name, thread), grown when a
larger one is asked for, never shrunk.  :class:`~cotsdl.nn.plan.NetworkPlan` holds one
per layer, so scripts that train get the command's speed without touching malloc.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np


class Workspace:
    """Named scratch arrays, one per calling thread; contents are undefined on each :meth:`get`."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, int, np.dtype], np.ndarray] = {}

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
