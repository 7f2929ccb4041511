"""Copy a box of an (H, W, C, N) window to or from a contiguous message buffer.

With the CUDA backend (CuPy arrays) or the emulator (``COTSDL_BACKEND=cuda-emu``) the
copies run as the ``pack_box``/``unpack_box`` kernels of ``cuda/halo.cu``; otherwise
(and for arrays that are not 4-D C-contiguous float32/float64) as array slicing.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import backend
from .box import Box

_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
THREADS = 256
MAX_BLOCKS = 4096  # the kernels loop (grid-stride), so the grid need not cover the box


def _kernel_args(arr: Any, arr_box: Box, box: Box) -> tuple | None:
    if arr.ndim != 4 or not arr.flags.c_contiguous or np.dtype(arr.dtype) not in _SUFFIX:
        return None
    H, W, C, N = arr.shape
    sH, sW, sC = W * C * N, C * N, N
    lo = [b - w for b, w in zip(box.lo, arr_box.lo)]
    base = lo[0] * sH + lo[1] * sW + lo[2] * sC + lo[3]
    bh, bw, bc, bn = box.shape
    return (np.int64(base), np.int64(sH), np.int64(sW), np.int64(sC),
            np.int32(bh), np.int32(bw), np.int32(bc), np.int32(bn))


def _grid(box: Box) -> tuple[int]:
    return (max(1, min(MAX_BLOCKS, -(-box.size // THREADS))),)


def pack(arr: Any, arr_box: Box, box: Box, out: Any) -> None:
    """``out[:] = arr[box]`` in C order (``box`` in global coordinates, ``arr`` covers ``arr_box``)."""
    ka = _kernel_args(arr, arr_box, box) if backend.uses_kernels(arr) else None
    if ka is None:
        out.reshape(box.shape)[...] = arr[box.slices_in(arr_box)]
        return
    k = backend.kernel("halo.cu", f"pack_box_{_SUFFIX[np.dtype(arr.dtype)]}", device_array=backend.is_device_array(arr))
    backend.launch(k, _grid(box), (THREADS,), (arr, out) + ka)


def unpack(buf: Any, arr: Any, arr_box: Box, box: Box, add: bool) -> None:
    """``arr[box] = buf`` (or ``+=`` with ``add``), the inverse of :func:`pack`."""
    ka = _kernel_args(arr, arr_box, box) if backend.uses_kernels(arr) else None
    if ka is None:
        view = arr[box.slices_in(arr_box)]
        piece = buf.reshape(box.shape)
        if add:
            view += piece
        else:
            view[...] = piece
        return
    k = backend.kernel("halo.cu", f"unpack_box_{_SUFFIX[np.dtype(arr.dtype)]}", device_array=backend.is_device_array(arr))
    backend.launch(k, _grid(box), (THREADS,), (buf, arr) + ka + (np.int32(1 if add else 0),))
