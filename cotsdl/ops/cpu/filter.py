"""Block locally-connected filter on the CPU (numpy backend): forward, backward-data, backward-weights.

Math (DESIGN.md section 3): x (H, W, C, N), weights w (SH, SW, M, rh, rw, C) with
M = bh*bw*K, untied per site; output y (SH*bh, SW*bw, K, N) with

    y[i*bh+a, j*bw+b, k, n] = sum_{p,q,c} w[i, j, (a*bw+b)*K+k, p, q, c] * x[i*sh+p, j*sw+q, c, n]

Per site s it is one dense product Y_s (M x N) = W_s (M x R) X_s (R x N), R = rh*rw*C.
The receptive fields X_s are gathered once into a (S, R, N) buffer and multiplied in
one batched matmul (BLAS per site); the work is split into chunks of sites over a
thread pool so both the gathering copies and the products keep every core busy.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..shapes import check_backward_data, check_backward_weights, check_weights
from .parallel import chunked

SMALL_ROW = 1024  # numbers in one receptive-field row (rw * C * N), see filter_backward_data


def _patches(x: np.ndarray, size: tuple[int, int], stride: tuple[int, int], sites: tuple[int, int]) -> np.ndarray:
    """Strided view (SH, SW, rh, rw, C, N) of the receptive fields; no copy."""
    H, W, C, N = x.shape
    s0, s1, s2, s3 = x.strides
    return as_strided(x, shape=(sites[0], sites[1], size[0], size[1], C, N),
                      strides=(stride[0] * s0, stride[1] * s1, s0, s1, s2, s3), writeable=False)


def _sites_to_output(ys: np.ndarray, block: tuple[int, int], k: int) -> np.ndarray:
    """(SH, SW, M, N) per-site products -> (SH*bh, SW*bw, K, N) output layout."""
    SH, SW, _, N = ys.shape
    bh, bw = block
    return ys.reshape(SH, SW, bh, bw, k, N).transpose(0, 2, 1, 3, 4, 5).reshape(SH * bh, SW * bw, k, N)


def _output_to_sites(y: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """(SH*bh, SW*bw, K, N) -> (SH, SW, M, N) view-or-copy in site order."""
    H, W, K, N = y.shape
    bh, bw = block
    return y.reshape(H // bh, bh, W // bw, bw, K, N).transpose(0, 2, 1, 3, 4, 5).reshape(H // bh, W // bw, bh * bw * K, N)


def _gather(p6: np.ndarray, i0: int, i1: int) -> np.ndarray:
    """Receptive fields of the site rows [i0, i1) as one contiguous (sites, R, N) band."""
    band = np.ascontiguousarray(p6[i0:i1])
    n, sw, rh, rw, c, N = band.shape
    return band.reshape(n * sw, rh * rw * c, N)


def filter_forward(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], block: tuple[int, int]) -> np.ndarray:
    SH, SW, M, rh, rw, C, K = check_weights(x.shape, w, stride, block)
    N = x.shape[3]
    R = rh * rw * C
    p6 = _patches(x, (rh, rw), stride, (SH, SW))
    wf = w.reshape(SH * SW, M, R)
    ys = np.empty((SH * SW, M, N), x.dtype)

    def work(i0: int, i1: int) -> None:
        # Gather a cache-sized band of site rows, multiply while it is still in cache.
        np.matmul(wf[i0 * SW:i1 * SW], _gather(p6, i0, i1), out=ys[i0 * SW:i1 * SW])

    chunked(SH, work, bytes_per_item=SW * R * N * x.dtype.itemsize)
    return _sites_to_output(ys.reshape(SH, SW, M, N), block, K)


def filter_backward_data(dy: np.ndarray, w: np.ndarray, stride: tuple[int, int], block: tuple[int, int],
                  input_shape: Sequence[int]) -> np.ndarray:
    H, W = int(input_shape[0]), int(input_shape[1])
    N = dy.shape[3]
    SH, SW, M, rh, rw, C, K = check_backward_data(dy.shape, w, stride, block, input_shape)
    dys = np.ascontiguousarray(_output_to_sites(dy, block)).reshape(SH * SW, M, N)
    wt = w.reshape(SH * SW, M, rh * rw * C).transpose(0, 2, 1)
    sh, sw = stride

    # A receptive-field row of fewer than SMALL_ROW numbers makes rh * SW adds too small to pay
    # for their call: then add every site of a row at once, rh * rw strided adds (the demo's
    # 7x7 single-channel first layer: 18 -> 8 ms here; larger rows are faster the first way).
    by_site = rw * C * N >= SMALL_ROW

    def work(i0: int, i1: int) -> tuple[int, np.ndarray]:
        # Products of a band of site rows, scattered into a private band of x rows
        # while still in cache; overlapping receptive fields add up.
        n = i1 - i0
        d = np.matmul(wt[i0 * SW:i1 * SW], dys[i0 * SW:i1 * SW]).reshape(n, SW, rh, rw, C, N)
        band = np.zeros(((n - 1) * sh + rh, W, C, N), dy.dtype)
        if by_site:
            flat = band.reshape(band.shape[0], W * C, N)
            for p in range(rh):
                rows = flat[p:p + sh * (n - 1) + 1:sh]
                for j in range(SW):
                    rows[:, j * sw * C:(j * sw + rw) * C] += d[:, j, p].reshape(n, rw * C, N)
        else:
            for p in range(rh):
                for q in range(rw):
                    band[p:p + sh * (n - 1) + 1:sh, q:q + sw * (SW - 1) + 1:sw] += d[:, :, p, q]
        return i0 * sh, band

    dx = np.zeros((H, W, C, N), dy.dtype)
    for row, band in chunked(SH, work, bytes_per_item=SW * rh * rw * C * N * dy.dtype.itemsize):
        dx[row:row + band.shape[0]] += band
    return dx


def filter_backward_weights(x: np.ndarray, dy: np.ndarray, size: tuple[int, int], stride: tuple[int, int],
                     block: tuple[int, int]) -> np.ndarray:
    H, W, C, N = x.shape
    rh, rw = size
    SH, SW, K = check_backward_weights(x.shape, dy.shape, size, stride, block)
    bh, bw = block
    M, R = bh * bw * K, rh * rw * C
    # dY_s^T (N x M) per site: then dW_s^T = X_s dY_s^T is a plain (R x N)(N x M)
    # product, which BLAS runs about twice as fast as the transposed-operand form
    # dY_s X_s^T on these small shapes; the (R x M) result is transposed in cache.
    dyt = np.ascontiguousarray(_output_to_sites(dy, block).transpose(0, 1, 3, 2)).reshape(SH * SW, N, M)
    p6 = _patches(x, size, stride, (SH, SW))
    dw = np.empty((SH * SW, M, R), x.dtype)

    def work(i0: int, i1: int) -> None:
        prod = np.matmul(_gather(p6, i0, i1), dyt[i0 * SW:i1 * SW])
        np.copyto(dw[i0 * SW:i1 * SW], prod.transpose(0, 2, 1))

    chunked(SH, work, bytes_per_item=SW * R * N * x.dtype.itemsize)
    return dw.reshape(SH, SW, M, rh, rw, C)
