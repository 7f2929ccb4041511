"""DistArray: one rank's part of an array distributed over a communicator.

Each rank holds a local buffer covering its *window* (a box in global
coordinates) and may *own* a box inside it: the part it computes and is the
authority for.  An input window with halos is a window larger than the owned
box; a destination window of another layout owns nothing (``owned=None``).
The buffer may be a NumPy or a CuPy array; nothing here assumes host memory.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np
from mpi4py import MPI

from .box import Box
from .collective import raise_collectively
from .grid import ProcessGrid


def layout_error(shape: Sequence[int], window: Box, owned: Box | None) -> str | None:
    """Why ``window``/``owned`` are not a valid layout of an array of ``shape``; else None."""
    gbox = Box.from_shape(shape)
    if window.ndim != len(shape) or not gbox.contains(window):
        return f"window {window} is not inside the array of shape {tuple(shape)}"
    if owned is not None and (owned.ndim != len(shape) or not window.contains(owned)):
        return f"owned box {owned} is not inside the window {window}"
    return None


@lru_cache(maxsize=4096)
def _layout_error_of(shape: tuple[int, ...], window: tuple[int, ...], owned: tuple[int, ...] | None) -> str | None:
    """:func:`layout_error` by the boxes' corners: a step makes a dozen arrays of the same few layouts
    (hashing corners is cheap, hashing a Box is not)."""
    return layout_error(shape, Box.from_tuple(window), None if owned is None else Box.from_tuple(owned))


def fits(data: Any, window: Box) -> bool:
    """True if ``data`` is a buffer for ``window`` (any zero-size buffer of its rank fits an empty box)."""
    if window.is_empty:
        return data.ndim == window.ndim and data.size == 0
    return tuple(data.shape) == window.shape


class DistArray:
    """A rank's window of a global array.

    The constructor is local (not collective): a bad argument raises on the
    calling rank only.  The collective constructors (:meth:`on_grid`, ``scatter``,
    ``redistribute``) validate on every rank together.

    Parameters
    ----------
    comm : MPI.Comm
        The communicator the array is distributed over.
    shape : sequence of int
        Global shape, (H, W, C, N) for activations.
    window : Box
        The global box covered by ``data``.
    owned : Box or None
        The box this rank owns, inside ``window``; None for a window-only array.
    data : array, optional
        Local buffer of shape ``window.shape``; zeros of ``dtype`` by default.
    dtype : numpy dtype
        Used when ``data`` is not given.
    """

    def __init__(self, comm: MPI.Comm, shape: Sequence[int], window: Box, owned: Box | None = None,
                 data: Any = None, dtype: Any = np.float32):
        self.comm = comm
        self.shape = tuple(int(s) for s in shape)
        self.window = window
        self.owned = owned
        err = _layout_error_of(self.shape, window.to_tuple(), None if owned is None else owned.to_tuple())
        if err:
            raise ValueError(err)
        if data is None:
            data = np.zeros(window.shape, dtype=dtype)
        elif not fits(data, window):
            raise ValueError(f"data of shape {tuple(data.shape)} does not match window {window} (shape {window.shape})")
        self.data = data

    @classmethod
    def on_grid(cls, grid: ProcessGrid, shape: Sequence[int], dtype: Any = np.float32,
                window: Callable[[Box], Box] | None = None, zeros: Callable[..., Any] = np.zeros) -> "DistArray":
        """A zero array owning this rank's balanced block of ``grid``.

        ``window(owned) -> Box`` widens the owned box (e.g. with :func:`grow`);
        ``zeros`` allocates the buffer (``cupy.zeros`` for device arrays).
        """
        owned = grid.owned_box(shape)
        win = owned if window is None else window(owned)
        raise_collectively(grid.comm, layout_error(shape, win, owned))
        return cls(grid.comm, shape, win, owned, data=zeros(win.shape, dtype=dtype))

    @property
    def global_box(self) -> Box:
        return Box.from_shape(self.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.data.dtype)

    def local(self, box: Box) -> Any:
        """View of the global ``box`` (which must lie in the window) inside ``data``."""
        return self.data[box.slices_in(self.window)]

    @property
    def owned_data(self) -> Any:
        """View of the owned box inside ``data``."""
        if self.owned is None:
            raise ValueError("this DistArray is a window-only array and owns no data")
        return self.local(self.owned)

    def __repr__(self) -> str:
        return (f"DistArray(shape={self.shape}, dtype={self.dtype}, rank {self.comm.Get_rank()}: "
                f"owned={self.owned}, window={self.window})")
