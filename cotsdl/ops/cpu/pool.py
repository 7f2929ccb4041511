"""L2 pooling on the CPU (numpy backend).

    y[i, j, c, n] = sqrt(eps + sum_{p<ph, q<pw} x[i*qh+p, j*qw+q, c, n]^2)

Output (PH, PW, C, N), PH = (H - ph) // qh + 1.  Backward: dx = x * (adjoint of the
window sums)(dy / y).  Window sums are separable: ph strided adds along H, then pw
along W.  Both passes run in bands of rows over the thread pool, each band's
temporaries in a per-thread scratch about a cache's size, every ufunc writing with
``out=``: memory is read and written about once instead of once per temporary.
"""
from __future__ import annotations

import numpy as np

from ..shapes import window_sites
from . import native
from .parallel import run_bands
from .workspace import Workspace, or_new


def pool_forward(x: np.ndarray, size, stride, eps: float, workspace: Workspace | None = None) -> np.ndarray:
    (ph, pw), (qh, qw) = size, stride
    PH, PW = window_sites(x.shape[:2], size, stride)
    H, W, C, N = x.shape
    ws = or_new(workspace)
    y = ws.output((PH, PW, C, N), x.dtype)
    e = x.dtype.type(eps)
    fused, sx = native.kernel("pool_fwd", x.dtype), native.strides(x, 2)
    if fused is not None and sx is not None:  # the same sums in one pass (native/kernels.cpp)
        sy = native.strides(y, 2)
        run_bands(PH, qh * W * C * N * x.itemsize,
                  lambda i0, i1: fused(x, *sx, C * N, ph, pw, qh, qw, e, y, *sy, PW, i0, i1), one_pass=True)
        return y

    def band(i0: int, i1: int) -> None:
        n = i1 - i0
        sub = x[i0 * qh:(i1 - 1) * qh + ph]
        sq = ws.get("pool.sq", sub.shape, x.dtype)
        np.multiply(sub, sub, out=sq)
        if ph == 1:
            rows = sq[0:qh * (n - 1) + 1:qh]
        else:  # the first two window rows added straight into the scratch: no copy
            rows = ws.get("pool.rows", (n, W, C, N), x.dtype)
            np.add(sq[0:qh * (n - 1) + 1:qh], sq[1:1 + qh * (n - 1) + 1:qh], out=rows)
        for p in range(2, ph):
            np.add(rows, sq[p:p + qh * (n - 1) + 1:qh], out=rows)
        acc = y[i0:i1]
        cols = lambda q: rows[:, q:q + qw * (PW - 1) + 1:qw]  # noqa: E731
        if pw == 1:
            np.add(cols(0), e, out=acc)
        else:
            np.add(cols(0), cols(1), out=acc)
            np.add(acc, e, out=acc)
        for q in range(2, pw):
            np.add(acc, cols(q), out=acc)
        np.sqrt(acc, out=acc)

    run_bands(PH, qh * W * C * N * x.itemsize, band)
    return y


def pool_backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray, size, stride,
                  workspace: Workspace | None = None) -> np.ndarray:
    """dx given dy, the input x and the forward output y (y == 0 contributes nothing)."""
    (ph, pw), (qh, qw) = size, stride
    PH, PW = y.shape[:2]
    H, W, C, N = x.shape
    ws = or_new(workspace)
    dx = ws.output(x.shape, x.dtype)
    fused, sx, sg = native.kernel("pool_bwd", x.dtype), native.strides(x, 2), native.strides(y, 2)
    if fused is not None and sx is not None and sg is not None and native.strides(dy, 2) == sg:
        sd = native.strides(dx, 2)

        def fused_band(h0: int, h1: int) -> None:
            i_lo, i_hi = _window_rows(h0, h1, ph, qh, PH)
            spread = ws.get("pool.spread", (max(0, i_hi - i_lo) + 1, W, C, N), x.dtype)  # + a row of g
            fused(dy, y, *sg, x, *sx, W, C * N, ph, pw, qh, qw, PH, PW, dx, *sd, spread, i_lo, i_hi, h0, h1)

        run_bands(H, W * C * N * x.itemsize, fused_band, one_pass=True)
        return dx
    g = np.zeros_like(y)

    def ratio(i0: int, i1: int) -> None:
        np.divide(dy[i0:i1], y[i0:i1], out=g[i0:i1], where=y[i0:i1] > 0)

    def band(h0: int, h1: int) -> None:
        # dx's rows [h0, h1): the window rows that cover them spread along W once, added per
        # window row offset p, then times x.
        i_lo, i_hi = _window_rows(h0, h1, ph, qh, PH)
        out = dx[h0:h1]
        out.fill(0)
        if i_hi <= i_lo:
            return
        spread = ws.get("pool.spread", (i_hi - i_lo, W, C, N), x.dtype)
        spread.fill(0)
        for q in range(pw):
            cols = spread[:, q:q + qw * (PW - 1) + 1:qw]
            np.add(cols, g[i_lo:i_hi], out=cols)
        for p in range(ph):
            a, b = max(i_lo, -(-(h0 - p) // qh)), min(i_hi, (h1 - 1 - p) // qh + 1)
            if b > a:
                rows = out[a * qh + p - h0:(b - 1) * qh + p - h0 + 1:qh]
                np.add(rows, spread[a - i_lo:b - i_lo], out=rows)
        np.multiply(out, x[h0:h1], out=out)

    run_bands(PH, PW * C * N * y.itemsize, ratio)
    run_bands(H, W * C * N * x.itemsize, band)
    return dx


def _window_rows(h0: int, h1: int, ph: int, qh: int, PH: int) -> tuple[int, int]:
    """The window rows [i_lo, i_hi) whose windows cover input rows [h0, h1)."""
    return max(0, -(-(h0 - ph + 1) // qh)), min(PH, (h1 - 1) // qh + 1)
