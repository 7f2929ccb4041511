"""The block locally-connected filter on the CUDA kernels of ``cuda/filter.cu``: forward,
backward-data and backward-weights, all tiled GEMMs, none with atomics.

Backward-data goes one of two ways (:func:`by_sites` chooses): per site P_s = W_s^T dY_s
into a buffer, then a gather-sum of each pixel's sites (``filter_col2im``); or per cell
of sh x sw pixels, one product over the candidate sites (``filter_bwd_data``).

``workspace`` is accepted for the one interface and ignored: CuPy's memory pool keeps
device buffers between calls already."""
from __future__ import annotations

import os
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterator

import numpy as np

from ... import backend
from ..shapes import check_backward_data, check_backward_weights, check_weights
from ._launch import THREADS, grid_for, kernel
from ._launch import contig as _contig

#: Backward-data by sites holds the products of at most this many bytes of sites at once
#: (at least one row of sites); more rows are done in turn.  The paper layer's sites
#: need R*N*4 = 373 KB each, 3.2 GB in all.
SITES_BUFFER_BYTES = 256 << 20


#: Backward-data by cells needs a cell's sh*sw*C pixel rows to fill at least this many rows of a
#: GEMM tile; fewer go by sites.  Measured on an H100 (cuda/README.md): the paper layer's 12 rows
#: took 81.5 ms by cells and 15.0 by sites; D-blocks' 48, 0.119 and 0.098 ms; A's 128 and C's 64,
#: 0.077 and 0.123 ms by cells against 0.094 and 0.149 by sites; B's 192 the same both ways.
CELL_ROWS = 64


def by_sites(sh: int, sw: int, C: int) -> bool:
    """Backward-data by sites (where a cell's rows would leave a GEMM tile mostly idle), else by cells."""
    return sh * sw * C < CELL_ROWS


def sites_rows(SH: int, SW: int, R: int, N: int, itemsize: int) -> int:
    """Rows of sites whose products backward-data by sites holds at once: as many whole rows as
    fit in :data:`SITES_BUFFER_BYTES`, at least one, at most all ``SH``."""
    return max(1, min(SH, SITES_BUFFER_BYTES // max(1, SW * R * N * itemsize)))


#: How the 128-row float32 tiles load their K chunks (cuda/gemm_tile.cuh, "Loading"): the variant's
#: name -> GT_STAGES.  "registers": through registers, two barriers a chunk; "asyncS": a cp.async
#: pipeline of S chunks in shared memory.
VARIANTS = {"registers": 1, "async2": 2, "async3": 3, "async4": 4}
#: Each GEMM kernel's default variant: the one a GPU measured fastest on the paper layer (an H200,
#: cotsdl bench gemm, cuda/README.md): forward 7.62 ms with async3 against 10.81 through registers,
#: backward-data by sites 11.83 against 16.45, backward-weights 11.02 with async2 against 11.97;
#: backward-data by cells on shape A's 128 x 64 tile 0.061 ms with async3 against 0.068.
#: ``COTSDL_GEMM_VARIANT`` (read once, when this module is imported) or :func:`gemm_variant` sets one
#: variant for every kernel instead.
DEFAULT_VARIANTS = {"filter_fwd": "async3", "filter_bwd_data_sites": "async3", "filter_bwd_weights": "async2",
                    "filter_bwd_data": "async3"}
#: Static shared memory a block may have (gemm_tile.cuh checks the same bound)
_SHARED_BYTES = 48 * 1024


def _checked_variant(name: str | None, where: str) -> str | None:
    if name is not None and name not in VARIANTS:
        raise ValueError(f"{where}: no GEMM variant {name!r}; the variants are {', '.join(VARIANTS)}")
    return name


_variant = _checked_variant(os.environ.get("COTSDL_GEMM_VARIANT") or None, "COTSDL_GEMM_VARIANT")


def variant(kernel_name: str = "filter_fwd") -> str:
    """The GEMM variant GEMM kernel ``kernel_name`` is launched with now."""
    return _variant or DEFAULT_VARIANTS.get(kernel_name, "registers")


@contextmanager
def gemm_variant(name: str | None) -> Iterator[str | None]:
    """Launch every filter GEMM kernel with variant ``name`` (a key of :data:`VARIANTS`; None: each its
    default, :data:`DEFAULT_VARIANTS`) inside the block."""
    global _variant
    before, _variant = _variant, _checked_variant(name, "gemm_variant")
    try:
        yield name
    finally:
        _variant = before


def _stage_depth(tm: int, tn: int, stages: int, itemsize: int) -> int:
    """TK for ``stages`` chunks of a tm x tn tile in the static shared memory: 16 if they fit, else 8."""
    return 16 if stages * 16 * (tm + 4 + tn + 4) * itemsize <= _SHARED_BYTES else 8


def _tiles(m: int, n: int, dtype: Any = np.float32, gemm: str | None = None,
           kernel_name: str = "filter_fwd") -> dict[str, int]:
    """GEMM tile for an (m x k)(k x n) product: small products get small tiles so fewer
    threads idle; large float32 ones 128-row tiles with 8 x RN outputs per thread (more
    FMAs per shared-memory read), TN chosen to waste the fewest columns of n, loaded as GEMM
    variant ``gemm`` says (default: :func:`variant` of ``kernel_name``; the small tiles always
    through registers)."""
    if m >= 128 and n >= 64 and np.dtype(dtype) == np.float32:
        tn = min((64, 96, 128), key=lambda t: (-(-n // t) * t - n, -t))
        t = {"TM": 128, "TN": tn, "RM": 8, "RN": tn // 16}
        stages = VARIANTS[gemm or variant(kernel_name)]
        if stages > 1:  # the "check-kernels variant" lines of filter.cu build exactly these
            t["GT_STAGES"] = stages
            tk = _stage_depth(128, tn, stages, 4)
            if tk != 16:
                t["TK"] = tk
        return t
    return {"TM": 16 if m <= 16 else 32 if m <= 32 else 64, "TN": 32 if n <= 32 else 64, "RM": 4, "RN": 4}


#: The largest offset from a site's corner the kernels' 32-bit index tables can hold.
MAX_OFFSET = 2**31 - 1


@lru_cache(maxsize=64)
def _offsets(H, W, C, N, SW, rh, rw, block, K) -> tuple[np.ndarray, np.ndarray]:
    """xoff[r]: offset of receptive-field element r = (p*rw + q)*C + c from a site's corner in x;
    yoff[m]: offset of neuron m = (a*bw + b)*K + k from a site's corner in y (n excluded).
    32-bit (cuda/filter.cu says why)."""
    p, q, c = np.meshgrid(np.arange(rh, dtype=np.int64), np.arange(rw, dtype=np.int64),
                          np.arange(C, dtype=np.int64), indexing="ij")
    xoff = (((p * W + q) * C + c) * N).ravel()
    bh, bw = block
    a, b, k = np.meshgrid(np.arange(bh, dtype=np.int64), np.arange(bw, dtype=np.int64),
                          np.arange(K, dtype=np.int64), indexing="ij")
    yoff = (((a * (SW * bw) + b) * K + k) * N).ravel()
    for name, off in (("input x", xoff), ("output y", yoff)):
        if off.size and int(off.max()) + N - 1 > MAX_OFFSET:
            raise ValueError(f"local filter on the GPU: a receptive field of the {name} spans {int(off.max()) + N} "
                             f"elements (input {H}x{W}x{C}, batch {N}), more than the kernels' 32-bit offsets "
                             f"hold ({MAX_OFFSET}); use more ranks along the image or a smaller batch")
    xoff, yoff = xoff.astype(np.int32), yoff.astype(np.int32)
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
                 table: Any = None, extra: tuple = ()) -> None:
    """Launch a filter GEMM kernel; ``table`` replaces ``xoff`` (backward-data's cell indices, as
    :func:`backend.constant` gives them); ``extra``: the kernel's arguments after the geometry."""
    t = _tiles(rows, cols, like.dtype, kernel_name=name)
    k = kernel("filter.cu", name, like, t)
    H, W, C, N, SH, SW, rh, rw, sh, sw, bh, bw, K = (int(v) for v in geom)
    key = (H, W, C, N, SW, rh, rw, (bh, bw), K)
    xoff, yoff = _offsets(*key)
    first = backend.constant(xoff, like, ("xoff",) + key) if table is None else table
    grid = (blocks * -(-cols // t["TN"]), -(-rows // t["TM"]), 1)
    backend.launch(k, grid, (t["TN"] // t["RN"], t["TM"] // t["RM"]),  # tables kept on the device
                   args + (first, backend.constant(yoff, like, ("yoff",) + key)) + geom + extra)


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
    if N == 0 or not H * W * C:
        return xp.empty((H, W, C, N), dy.dtype)
    sh, sw = stride
    geom = _geom(H, W, C, N, SH, SW, rh, rw, stride, block, K)
    dy, w = _contig(dy), _contig(w)
    if not by_sites(sh, sw, C):
        dx = xp.empty((H, W, C, N), dy.dtype)
        cells = -(-H // sh) * -(-W // sw)
        ck = (C, sh, sw, rh, rw, M)
        _gemm_launch("filter_bwd_data", dy, sh * sw * C, N, cells, (dy, w, dx), geom,
                     backend.constant(_cell_table(*ck), dy, ("cells",) + ck))
        return dx
    # By sites, in chunks of site rows: each chunk's products, then its sums added into dx
    # (a pixel's sites may span two chunks; pixels no site covers stay 0).
    dx = xp.zeros((H, W, C, N), dy.dtype)
    R = rh * rw * C
    rows = sites_rows(SH, SW, R, N, dy.dtype.itemsize)
    buf = xp.empty(rows * SW * R * N, dy.dtype)
    col2im = kernel("filter.cu", "filter_col2im", dy, _tiles(R, N, dy.dtype, kernel_name="filter_bwd_data_sites"))
    for i0 in range(0, SH, rows):
        i1 = min(SH, i0 + rows)
        _gemm_launch("filter_bwd_data_sites", dy, R, N, (i1 - i0) * SW, (dy, w, buf), geom, extra=(np.int32(i0),))
        y0, y1 = i0 * sh, (i1 - 1) * sh + rh
        backend.launch(col2im, grid_for((y1 - y0) * W * C * N), (THREADS,),
                       (buf, dx) + geom + tuple(np.int32(v) for v in (i0, i1, y0, y1)))
    return dx


def filter_backward_weights(x: Any, dy: Any, size: tuple[int, int], stride: tuple[int, int], block: tuple[int, int],
                            workspace: Any = None, out: Any = None, accumulate: bool = False,
                            also: tuple[Any, Any] | None = None) -> Any:
    """dw (SH, SW, M, rh, rw, C) [+ ``also``'s, a second (x, dy) pair's], written into (``accumulate``:
    added to) ``out`` when given (one interface with the numpy backend) by the kernel itself."""
    H, W, C, N = x.shape
    rh, rw = size
    SH, SW, K = check_backward_weights(x.shape, dy.shape, size, stride, block)
    M, R = block[0] * block[1] * K, rh * rw * C
    xp = backend.array_module(x)
    dw = out if out is not None else xp.empty((SH, SW, M, rh, rw, C), x.dtype)
    add = bool(accumulate and out is not None)
    if N == 0 or not dw.size:  # no images: the gradient is zero
        if not add:
            dw.fill(0)
        return dw
    geom = _geom(H, W, C, N, SH, SW, rh, rw, stride, block, K)
    for xi, dyi in ((x, dy),) if also is None else ((x, dy), also):
        _gemm_launch("filter_bwd_weights", x, M, R, SH * SW, (_contig(xi), _contig(dyi), dw), geom,
                     extra=(np.int32(add),))
        add = True  # the second pair adds to the first's
    return dw
