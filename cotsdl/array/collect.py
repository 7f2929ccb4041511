"""Gather, scatter and repartition: exchanges between special layouts.

Each is a single :class:`ExchangePlan` - gather is the layout where the root's
window is the whole array and the other windows are empty, scatter the layout
where the root owns everything - so they move exactly the bytes needed.  They
build a plan per call: meant for tests, checkpoints of small arrays, debugging.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .. import backend
from .box import Box
from .collective import raise_collectively
from .distarray import DistArray, layout_error
from .exchange import ExchangePlan


def gather(arr: DistArray, root: int = 0) -> np.ndarray | None:
    """The whole array on ``root`` (None on other ranks), from every rank's owned box."""
    comm = arr.comm
    raise_collectively(comm, _root_error(comm, root))
    gbox = arr.global_box
    window = gbox if comm.Get_rank() == root else Box.empty(gbox.ndim)
    dst = DistArray(comm, arr.shape, window, data=_zeros_like(arr.data, window.shape))
    ExchangePlan(comm, arr.shape, arr.owned, window, arr.dtype).exchange(arr, dst)
    return dst.data if comm.Get_rank() == root else None


def scatter(comm: MPI.Comm, data: Any, owned: Box, window: Box | None = None, root: int = 0) -> DistArray:
    """Distribute ``data`` (significant on ``root`` only) so that this rank gets ``window``.

    ``owned`` is this rank's box in the resulting layout; ``window`` defaults to it.
    """
    rank = comm.Get_rank()
    err = _root_error(comm, root)
    if err is None and rank == root and (data is None or getattr(data, "ndim", 0) < 1):
        err = f"scatter: root rank {root} must pass an array, got {type(data).__name__}"
    raise_collectively(comm, err)
    shape, dtype = comm.bcast((tuple(data.shape), np.dtype(data.dtype).str) if rank == root else None, root=root)
    gbox = Box.from_shape(shape)
    window = owned if window is None else window
    raise_collectively(comm, layout_error(shape, window, owned))
    src = DistArray(comm, shape, gbox if rank == root else Box.empty(len(shape)),
                    owned=gbox if rank == root else Box.empty(len(shape)),
                    data=data if rank == root else np.zeros((0,) * len(shape), dtype))
    out = DistArray(comm, shape, window, owned=owned, data=_zeros_like(src.data, window.shape, dtype))
    ExchangePlan(comm, shape, src.owned, window, dtype).exchange(src, out)
    return out


def redistribute(arr: DistArray, owned: Box, window: Box | None = None) -> DistArray:
    """The same global array in another layout (e.g. another process grid)."""
    window = owned if window is None else window
    raise_collectively(arr.comm, layout_error(arr.shape, window, owned))
    out = DistArray(arr.comm, arr.shape, window, owned=owned, data=_zeros_like(arr.data, window.shape))
    ExchangePlan(arr.comm, arr.shape, arr.owned, window, arr.dtype).exchange(arr, out)
    return out


def _root_error(comm: MPI.Comm, root: int) -> str | None:
    size = comm.Get_size()
    if not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        return f"root must be a rank in [0, {size}), got {root!r}"
    return None


def _zeros_like(sample: Any, shape: tuple[int, ...], dtype: Any = None) -> Any:
    xp = backend.array_module(sample)
    return xp.zeros(shape, dtype=sample.dtype if dtype is None else dtype)
