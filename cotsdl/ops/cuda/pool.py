"""L2 pooling on the CUDA kernels of ``cuda/pool.cu`` (forward, and a gather backward without atomics)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ... import backend
from ..shapes import window_sites
from ._launch import THREADS, contig, grid_for, indexed, kernel


def _ints(x: Any, size, stride, PH: int, PW: int) -> tuple:
    H, W, C, N = x.shape
    return tuple(np.int32(v) for v in (H, W, C, N, size[0], size[1], stride[0], stride[1], PH, PW))


def pool_forward(x: Any, size, stride, eps: float, workspace: Any = None) -> Any:
    PH, PW = window_sites(x.shape[:2], size, stride)
    y = backend.array_module(x).empty((PH, PW) + tuple(x.shape[2:]), x.dtype)
    if y.size:
        backend.launch(kernel("pool.cu", indexed("l2pool_fwd", y.size), x), grid_for(y.size), (THREADS,),
                       (contig(x), y) + _ints(x, size, stride, PH, PW) + (np.dtype(x.dtype).type(eps),))
    return y


def pool_backward(dy: Any, x: Any, y: Any, size, stride, workspace: Any = None) -> Any:
    PH, PW = y.shape[:2]
    dx = backend.array_module(x).empty(x.shape, x.dtype)
    if dx.size:
        backend.launch(kernel("pool.cu", indexed("l2pool_bwd", dx.size), x), grid_for(dx.size), (THREADS,),
                       (contig(dy), contig(x), contig(y), dx) + _ints(x, size, stride, PH, PW))
    return dx
