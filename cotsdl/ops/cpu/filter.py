"""Block locally-connected filter on the CPU (numpy backend): forward, backward-data, backward-weights.

Math (DESIGN.md section 3): x (H, W, C, N), weights w (SH, SW, M, rh, rw, C) with
M = bh*bw*K, untied per site; output y (SH*bh, SW*bw, K, N) with

    y[i*bh+a, j*bw+b, k, n] = sum_{p,q,c} w[i, j, (a*bw+b)*K+k, p, q, c] * x[i*sh+p, j*sw+q, c, n]

Per site s it is one dense product Y_s (M x N) = W_s (M x R) X_s (R x N), R = rh*rw*C.
Work goes in bands of site rows, each band's operands about a cache's size
(:func:`~cotsdl.ops.cpu.parallel.chunk_bounds`), over a thread pool (numpy releases
the GIL in copies and matmul; BLAS runs single-threaded meanwhile).  Per band:

- forward: gather the fields X (sites, R, N), ``matmul(W, X, out=)`` straight into y's
  rows (through a scratch product only when blocks reorder the neurons);
- backward-data: ``W^T dY`` into scratch, then summed into dx's rows by one sparse 0/1
  product (col2im, compiled in scipy: 1.2-5.6x faster than strided numpy adds here).
  Bands write rows that the next ``ceil(rh/sh) - 1`` site rows write too, so the site
  rows are cut into blocks at least that tall and the even blocks run first, then the
  odd ones (:func:`~cotsdl.ops.cpu.parallel.colored_blocks`): no private copies of dx;
- backward-weights: ``matmul(dY, X^T, out=)`` straight into dw (BLAS takes X transposed).

Gathers and products live in a :class:`~cotsdl.ops.cpu.workspace.Workspace`, the
caller's (a layer's, held by the network plan) or one for this call.

With the native kernels on (:mod:`~cotsdl.ops.cpu.native`, ``filter.cpp``) the three
passes are instead register-tiled products that read x, w and dy where they lie: no
gather, no col2im, one near-equal share of the sites per thread; backward-data by rows
of dx instead where :func:`by_dx_rows` says it moves less memory.  They agree with this
numpy path to rounding (FMAs, another summation order), not bit for bit.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp
from numpy.lib.stride_tricks import as_strided

from ..shapes import check_backward_data, check_backward_weights, check_weights
from . import native
from .parallel import chunk_bounds, colored_blocks, run_ranges, run_split
from .workspace import Workspace, or_new


def _patches(x: np.ndarray, size: tuple[int, int], stride: tuple[int, int], sites: tuple[int, int]) -> np.ndarray:
    """Strided view (SH, SW, rh, rw, C, N) of the receptive fields; no copy."""
    H, W, C, N = x.shape
    s0, s1, s2, s3 = x.strides
    return as_strided(x, shape=(sites[0], sites[1], size[0], size[1], C, N),
                      strides=(stride[0] * s0, stride[1] * s1, s0, s1, s2, s3), writeable=False)


def _gather(p6: np.ndarray, i0: int, i1: int, ws: Workspace) -> np.ndarray:
    """Receptive fields of the site rows [i0, i1) as one contiguous (sites, R, N) scratch band."""
    n, sw, rh, rw, c, N = p6[i0:i1].shape
    band = ws.get("fields", (n, sw, rh, rw, c, N), p6.dtype)
    np.copyto(band, p6[i0:i1])
    return band.reshape(n * sw, rh * rw * c, N)


def _site_rows(y: np.ndarray, block: tuple[int, int], i0: int, i1: int) -> np.ndarray:
    """View (n, SW, bh, bw, K, N) of the output rows of site rows [i0, i1): neurons in site order."""
    H, W, K, N = y.shape
    bh, bw = block
    return y[i0 * bh:i1 * bh].reshape(i1 - i0, bh, W // bw, bw, K, N).transpose(0, 2, 1, 3, 4, 5)


def _dy_sites(dy: np.ndarray, block: tuple[int, int], i0: int, i1: int, ws: Workspace) -> np.ndarray:
    """dY of the site rows [i0, i1) as (sites, M, N): a view without blocks, else a scratch copy."""
    H, W, K, N = dy.shape
    bh, bw = block
    n = i1 - i0
    if block == (1, 1):
        return dy[i0:i1].reshape(n * W, K, N)
    band = ws.get("dy", (n, W // bw, bh, bw, K, N), dy.dtype)
    np.copyto(band, _site_rows(dy, block, i0, i1))
    return band.reshape(n * (W // bw), bh * bw * K, N)


#: The native kernels' vector (filter.cpp's ``Vec``: 32-byte GCC vectors).
VECTOR_BYTES = 32


def whole_vectors(n: int, dtype: Any) -> bool:
    """Whether ``n`` numbers of ``dtype`` fill whole native vectors.  The native forward and
    backward-data vectorize over the images and need it to beat BLAS (the rest went to scalar
    loops: with 4 images over, N = 12, 20, 36, forward was 3.3-7x slower than the numpy path and
    backward-data 1.1-4.2x; at N = 1-4, as an optimal stimulus runs, forward 1.8-14x and
    backward-data from 1.3x faster to 10x slower).  Backward-weights is native at any N."""
    return n * np.dtype(dtype).itemsize % VECTOR_BYTES == 0


def by_fields(M: int, N: int, dtype: Any) -> bool:
    """Whether the native backward-weights goes by fields (T_s = X_s dY_s^T, transposed into dW:
    R*M numbers copied a site) rather than by panels (X_s^T packed: R*N): fewer neurons than
    images, in whole vectors, since they are its vector dimension.  By fields against panels:
    A 1.09-1.12x, C 1.09-1.19x; with M = N (B) 0.95-0.98; with M = 4 or 12 4-9x slower."""
    return M < N and whole_vectors(M, dtype)


def filter_forward(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], block: tuple[int, int],
                   workspace: Workspace | None = None) -> np.ndarray:
    SH, SW, M, rh, rw, C, K = check_weights(x.shape, w, stride, block)
    N = x.shape[3]
    R = rh * rw * C
    ws = or_new(workspace)
    y = ws.output((SH * block[0], SW * block[1], K, N), x.dtype)
    kern, sx = native.kernel("lc_fwd", x.dtype), native.strides(x, 1)
    if kern is not None and sx is not None and w.dtype == x.dtype and whole_vectors(N, x.dtype):
        w, sy = np.ascontiguousarray(w), native.strides(y, 1)
        run_split(SH * SW, lambda s0, s1: kern(x, *sx, C, N, w, rh, rw, *stride, SW, y, *sy, *block, K, s0, s1))
        return y
    p6 = _patches(x, (rh, rw), stride, (SH, SW))
    wf = w.reshape(SH * SW, M, R)

    def work(i0: int, i1: int) -> None:
        # Gather a cache-sized band of site rows, multiply while it is still in cache.
        n = i1 - i0
        if block == (1, 1):
            np.matmul(wf[i0 * SW:i1 * SW], _gather(p6, i0, i1, ws), out=y[i0:i1].reshape(n * SW, M, N))
        else:
            prod = ws.get("product", (n * SW, M, N), x.dtype)
            np.matmul(wf[i0 * SW:i1 * SW], _gather(p6, i0, i1, ws), out=prod)
            np.copyto(_site_rows(y, block, i0, i1), prod.reshape(n, SW, block[0], block[1], K, N))

    run_ranges(chunk_bounds(SH, SW * R * N * x.dtype.itemsize), work)
    return y


@lru_cache(maxsize=32)
def _col2im(n: int, SW: int, rh: int, rw: int, C: int, sh: int, sw: int, W: int, dtype: np.dtype) -> sp.csr_matrix:
    """The sum of ``n`` site rows' field products into their x rows, as a 0/1 CSR matrix.

    Rows: (row, column, channel) of the band's ``(n-1)*sh + rh`` x rows; columns: (site, p, q, c)
    of the products.  Each x number sums the fields that cover it in one compiled pass (scipy's
    CSR product), instead of one strided numpy add per field row.
    """
    i, j, p, q, c = np.meshgrid(np.arange(n), np.arange(SW), np.arange(rh), np.arange(rw), np.arange(C),
                                indexing="ij")
    src = ((((i * SW + j) * rh + p) * rw + q) * C + c).ravel()
    dst = (((i * sh + p) * W + j * sw + q) * C + c).ravel()
    rows = (n - 1) * sh + rh
    return sp.csr_matrix((np.ones(src.size, dtype), (dst, src)), shape=(rows * W * C, n * SW * rh * rw * C))


def by_dx_rows(x_shape: tuple[int, int, int, int], size: tuple[int, int], stride: tuple[int, int],
               sites: tuple[int, int], M: int, itemsize: int) -> bool:
    """Whether the native backward-data should run by rows of dx rather than by sites.

    By sites, each site adds its product into dx: dx is read and written once per site
    covering it (``coverage`` = SH*SW*rh*rw / (H*W) on average; cleared first, run in
    colours), the weights are read once.  By rows of dx, each dx number sums its sites in
    registers and is written once, but the weights come a run of ``sw*C`` field rows at a
    time: a cache line is read once per run it serves (64 / (sw*C*itemsize) runs when
    shorter than a line).  The smaller memory traffic wins.  Measured (one process, two
    threads, interleaved): by rows 1.24-1.94x faster on the bench shapes A-D (modelled
    traffic 2.3-5.3x lower), 2x slower on P-paper (56 sites cover a number, but a run is 24
    bytes of an 800 MB weight array: 1.2 GB by sites against 2.1 GB by rows).
    """
    (H, W, C, N), (rh, rw), (sh, sw), (SH, SW) = x_shape, size, stride, sites
    dx = H * W * C * N * itemsize
    weights = SH * SW * M * rh * rw * C * itemsize
    coverage = SH * SW * rh * rw / (H * W)
    return dx + weights * max(1.0, 64 / (sw * C * itemsize)) < 2 * coverage * dx + weights


def filter_backward_data(dy: np.ndarray, w: np.ndarray, stride: tuple[int, int], block: tuple[int, int],
                         input_shape: Sequence[int], workspace: Workspace | None = None) -> np.ndarray:
    H, W = int(input_shape[0]), int(input_shape[1])
    N = dy.shape[3]
    SH, SW, M, rh, rw, C, K = check_backward_data(dy.shape, w, stride, block, input_shape)
    dy = np.ascontiguousarray(dy)
    ws = or_new(workspace)
    R = rh * rw * C
    sh, sw = stride
    dx = ws.output((H, W, C, N), dy.dtype)
    kern = native.kernel("lc_bwd_data", dy.dtype) if w.dtype == dy.dtype and whole_vectors(N, dy.dtype) else None
    if kern is not None:
        wc, sd, sx = np.ascontiguousarray(w), native.strides(dy, 1), native.strides(dx, 1)
        if by_dx_rows((H, W, C, N), (rh, rw), stride, (SH, SW), M, dy.itemsize):
            by_rows = native.kernel("lc_bwd_data_rows", dy.dtype)
            run_split(H, lambda h0, h1: by_rows(dy, *sd, wc, rh, rw, C, N, sh, sw, SH, SW, *block, K, dx, *sx, W,
                                                h0, h1))
            return dx
    dx.fill(0)
    # A site row writes the x rows of the next ceil(rh/sh) - 1 site rows too.
    even, odd = colored_blocks(SH, -(-rh // sh) - 1)
    if kern is not None:
        def rows(i0: int, i1: int) -> None:
            kern(dy, *sd, wc, rh, rw, C, N, sh, sw, SW, *block, K, dx, *sx, i0, i1)
        run_ranges(even, rows)
        run_ranges(odd, rows)
        return dx
    wt = w.reshape(SH * SW, M, R).transpose(0, 2, 1)

    def band(i0: int, i1: int) -> None:
        # The products of a band of site rows, summed into dx's rows while still in cache.
        n = i1 - i0
        d = ws.get("product", (n * SW, R, N), dy.dtype)
        np.matmul(wt[i0 * SW:i1 * SW], _dy_sites(dy, block, i0, i1, ws), out=d)
        part = _col2im(n, SW, rh, rw, C, sh, sw, W, dy.dtype) @ d.reshape(n * SW * R, N)
        dx[i0 * sh:i0 * sh + (n - 1) * sh + rh] += part.reshape(-1, W, C, N)

    def block_of_bands(b0: int, b1: int) -> None:
        for lo, hi in chunk_bounds(b1 - b0, SW * R * N * dy.itemsize, threads=1):
            band(b0 + lo, b0 + hi)

    run_ranges(even, block_of_bands)
    run_ranges(odd, block_of_bands)
    return dx


def filter_backward_weights(x: np.ndarray, dy: np.ndarray, size: tuple[int, int], stride: tuple[int, int],
                            block: tuple[int, int], workspace: Workspace | None = None,
                            out: np.ndarray | None = None, accumulate: bool = False,
                            also: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    H, W, C, N = x.shape
    rh, rw = size
    SH, SW, K = check_backward_weights(x.shape, dy.shape, size, stride, block)
    bh, bw = block
    M, R = bh * bw * K, rh * rw * C
    dy = np.ascontiguousarray(dy)
    pairs = [(x, dy)] if also is None else [(x, dy), (also[0], np.ascontiguousarray(also[1]))]
    ws = or_new(workspace)
    dw = ws.output((SH * SW, M, R), x.dtype) if out is None else out.reshape(SH * SW, M, R)
    kern, sx = native.kernel("lc_bwd_w", x.dtype), [native.strides(a, 1) for a, _ in pairs]
    if (kern is not None and None not in sx and all(d.dtype == x.dtype for _, d in pairs)
            and (out is None or out.flags.c_contiguous)):
        sd, panel = [native.strides(d, 1) for _, d in pairs], 2 * VECTOR_BYTES // x.dtype.itemsize
        # the second pair's arguments, or a null pair
        second = (pairs[1][0], *sx[1], pairs[1][1], *sd[1]) if also is not None else (None, 0, 0, 0, None, 0, 0, 0)
        fields = int(by_fields(M, N, x.dtype))

        def sites_(s0: int, s1: int) -> None:
            # by fields dY_s^T and T_s; else dY_s^T and X_s^T in panels of two vectors of field
            # rows, per pair (filter.cpp)
            size = N * M + R * M if fields else len(pairs) * N * (M + -(-R // panel) * panel)
            scratch = ws.get("lc_bwd_w", (size,), x.dtype)
            kern(x, *sx[0], C, N, dy, *sd[0], *second, rh, rw, *stride, SW, bh, bw, K, dw, int(accumulate), fields,
                 scratch, s0, s1)
        run_split(SH * SW, sites_)
        return dw.reshape(SH, SW, M, rh, rw, C) if out is None else out
    p6s = [(_patches(a, size, stride, (SH, SW)), d) for a, d in pairs]

    def work(i0: int, i1: int) -> None:
        # dW_s = dY_s X_s^T: BLAS reads the gathered X transposed, dw is written once, in place.
        part = dw[i0 * SW:i1 * SW]
        for t, (p6, d) in enumerate(p6s):
            add = accumulate or t > 0
            prod = ws.get("dw_sum", part.shape, x.dtype) if add else part
            np.matmul(_dy_sites(d, block, i0, i1, ws), _gather(p6, i0, i1, ws).transpose(0, 2, 1), out=prod)
            if add:
                part += prod

    run_ranges(chunk_bounds(SH, len(pairs) * SW * R * N * x.dtype.itemsize), work)
    return dw.reshape(SH, SW, M, rh, rw, C) if out is None else out
