"""The block locally-connected filter on the CUDA kernels of ``cuda/filter.cu``: forward,
backward-data (a gather form, no atomics) and backward-weights, all tiled GEMMs.

``workspace`` is accepted for the one interface and ignored: CuPy's memory pool keeps
device buffers between calls already."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from ... import backend
from ..shapes import check_backward_data, check_backward_weights, check_weights
from ._launch import contig as _contig
from ._launch import kernel


def _tiles(m: int, n: int, dtype: Any = np.float32) -> dict[str, int]:
    """GEMM tile for an (m x k)(k x n) product: small products get small tiles so fewer
    threads idle; large float32 ones 128-row tiles with 8 x RN outputs per thread (more
    FMAs per shared-memory read), TN chosen to waste the fewest columns of n."""
    if m >= 128 and n >= 64 and np.dtype(dtype) == np.float32:
        tn = min((64, 96, 128), key=lambda t: (-(-n // t) * t - n, -t))
        return {"TM": 128, "TN": tn, "RM": 8, "RN": tn // 16}
    return {"TM": 16 if m <= 16 else 32 if m <= 32 else 64, "TN": 32 if n <= 32 else 64, "RM": 4, "RN": 4}


@lru_cache(maxsize=64)
def _offsets(H, W, C, N, SW, rh, rw, block, K) -> tuple[np.ndarray, np.ndarray]:
    """xoff[r]: offset of receptive-field element r = (p*rw + q)*C + c from a site's corner in x;
    yoff[m]: offset of neuron m = (a*bw + b)*K + k from a site's corner in y (n excluded)."""
    p, q, c = np.meshgrid(np.arange(rh), np.arange(rw), np.arange(C), indexing="ij")
    xoff = (((p * W + q) * C + c) * N).astype(np.int64).ravel()
    bh, bw = block
    a, b, k = np.meshgrid(np.arange(bh), np.arange(bw), np.arange(K), indexing="ij")
    yoff = (((a * (SW * bw) + b) * K + k) * N).astype(np.int64).ravel()
    xoff.setflags(write=False)  # cached and shared between calls
    yoff.setflags(write=False)
    return xoff, yoff


@lru_cache(maxsize=64)
def _cell_table(C: int, sh: int, sw: int, rh: int, rw: int, M: int) -> np.ndarray:
    """Backward-data's decoded indices: rows (dy, dx, c) of a cell, then K entries (ti, tj, m)."""
    dy, dx, c = (a.ravel() for a in np.meshgrid(np.arange(sh), np.arange(sw), np.arange(C), indexing="ij"))
    ci, cj = -(-rh // sh), -(-rw // sw)
    ti, tj, m = (a.ravel() for a in np.meshgrid(np.arange(ci), np.arange(cj), np.arange(M), indexing="ij"))
    tab = np.concatenate([dy, dx, c, ti, tj, m]).astype(np.int32)
    tab.setflags(write=False)  # cached and shared between calls
    return tab


def _gemm_launch(name: str, like: Any, rows: int, cols: int, blocks: int, args: tuple, geom: tuple,
                 table: np.ndarray | None = None) -> None:
    """Launch a filter GEMM kernel; ``table`` replaces ``xoff`` (backward-data's cell indices)."""
    t = _tiles(rows, cols, like.dtype)
    k = kernel("filter.cu", name, like, t)
    xp = backend.array_module(like)
    H, W, C, N, SH, SW, rh, rw, sh, sw, bh, bw, K = (int(v) for v in geom)
    xoff, yoff = (xp.asarray(o) for o in _offsets(H, W, C, N, SW, rh, rw, (bh, bw), K))
    first = xoff if table is None else xp.asarray(table)
    grid = (blocks * -(-cols // t["TN"]), -(-rows // t["TM"]), 1)
    backend.launch(k, grid, (t["TN"] // t["RN"], t["TM"] // t["RM"]), args + (first, yoff) + geom)


def _geom(H, W, C, N, SH, SW, rh, rw, stride, block, K) -> tuple:
    return tuple(np.int32(v) for v in (H, W, C, N, SH, SW, rh, rw, stride[0], stride[1], block[0], block[1], K))


def filter_forward(x: Any, w: Any, stride: tuple[int, int], block: tuple[int, int], workspace: Any = None) -> Any:
    SH, SW, M, rh, rw, C, K = check_weights(x.shape, w, stride, block)
    H, W, _, N = x.shape
    xp = backend.array_module(x)
    y = xp.empty((SH * block[0], SW * block[1], K, N), x.dtype)
    if y.size:
        _gemm_launch("filter_fwd", x, M, N, SH * SW, (_contig(x), _contig(w), y),
                     _geom(H, W, C, N, SH, SW, rh, rw, stride, block, K))
    return y


def filter_backward_data(dy: Any, w: Any, stride: tuple[int, int], block: tuple[int, int], input_shape,
                         workspace: Any = None) -> Any:
    H, W = int(input_shape[0]), int(input_shape[1])
    SH, SW, M, rh, rw, C, K = check_backward_data(dy.shape, w, stride, block, input_shape)
    N = dy.shape[3]
    xp = backend.array_module(dy)
    dx = xp.empty((H, W, C, N), dy.dtype)
    if dx.size:
        sh, sw = stride
        cells = -(-H // sh) * -(-W // sw)
        _gemm_launch("filter_bwd_data", dy, sh * sw * C, N, cells, (_contig(dy), _contig(w), dx),
                     _geom(H, W, C, N, SH, SW, rh, rw, stride, block, K), _cell_table(C, sh, sw, rh, rw, M))
    return dx


def filter_backward_weights(x: Any, dy: Any, size: tuple[int, int], stride: tuple[int, int], block: tuple[int, int],
                            workspace: Any = None, out: Any = None, accumulate: bool = False,
                            also: tuple[Any, Any] | None = None) -> Any:
    """dw (SH, SW, M, rh, rw, C) [+ ``also``'s, a second (x, dy) pair's]; copied into (``accumulate``:
    added to) ``out`` when given (one interface with the numpy backend)."""
    dw = _filter_backward_weights(x, dy, size, stride, block)
    if also is not None:
        dw += _filter_backward_weights(also[0], also[1], size, stride, block)
    if out is None:
        return dw
    if accumulate:
        out += dw
    else:
        out[...] = dw
    return out


def _filter_backward_weights(x: Any, dy: Any, size: tuple[int, int], stride: tuple[int, int],
                             block: tuple[int, int]) -> Any:
    H, W, C, N = x.shape
    rh, rw = size
    SH, SW, K = check_backward_weights(x.shape, dy.shape, size, stride, block)
    M, R = block[0] * block[1] * K, rh * rw * C
    xp = backend.array_module(x)
    if N == 0:  # no images: the gradient is zero
        return xp.zeros((SH, SW, M, rh, rw, C), x.dtype)
    dw = xp.empty((SH, SW, M, rh, rw, C), x.dtype)
    _gemm_launch("filter_bwd_weights", x, M, R, SH * SW, (_contig(x), _contig(dy), dw),
                 _geom(H, W, C, N, SH, SW, rh, rw, stride, block, K))
    return dw
