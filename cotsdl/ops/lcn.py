"""Local contrast normalization on a window of a possibly larger image (backend neutral).

Math (DESIGN.md section 3): a Gaussian window g of size (2*rho+1)^2 and std sigma,
spread over the C channels with weight g/C, cut at the image border and
renormalized by Z[i,j] = sum of g over the in-bounds part (Z = zr[i]*zc[j] since g
is separable).  With G the normalized smoothing (H, W, C, N) -> (H, W, N):

    mu = G x,   v = x - mu,   s = sqrt(G v^2),   m[n] = mean_{i,j} s[i,j,n],
    y  = v / max(s, m, eps)

Locality: y on a box O needs v on O+rho, hence x on O+2*rho (all clipped to the
image).  The functions here take the input window X (any box containing
(O+2*rho) & image), the output box O and the image's (H, W); the only non-local
quantity, the per-image sums behind m (forward) and dm (backward), go through a
caller-supplied ``allreduce`` (identity in one process; an MPI allreduce over the
model-parallel group when the image is split).  One code path for both.

The algebra here runs on any array library; only the Gaussian smoothing passes
differ per backend (``ops/cpu/lcn.py``, ``ops/cuda/lcn.py``), chosen by
:func:`cotsdl.ops._dispatch.implementation`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from .. import backend
from ..array.box import Box, grow
from ._dispatch import implementation
from .cpu import native
from .cpu.parallel import run_bands
from .cpu.workspace import Workspace

Reduce = Callable[[np.ndarray], np.ndarray]


def gaussian(size: int, sigma: float) -> np.ndarray:
    """The 1-D Gaussian factor of the window (float64; its scale cancels in Z)."""
    r = size // 2
    t = np.arange(-r, r + 1, dtype=np.float64)
    return np.exp(-(t * t) / (2.0 * sigma * sigma))


def _border_weight(lo: int, hi: int, length: int, g1: np.ndarray) -> np.ndarray:
    """z[i] = sum of g1[k] over k with 0 <= i + k - rho < length, for i in [lo, hi)."""
    rho = len(g1) // 2
    i = np.arange(lo, hi)[:, None] + np.arange(len(g1))[None, :] - rho
    return ((i >= 0) & (i < length)) @ g1


def _renorm(out: Box, image: Box, g1: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Border weights of the window over ``out``: rows zr, columns zc, and Z = zr zc^T (h, w, 1).

    Kept per (box, image, window, dtype): a layer asks for the same few every step (read-only)."""
    return _renorm_cached(*_renorm_key(out, image, g1, dtype))


def _renorm_key(out: Box, image: Box, g1: np.ndarray, dtype) -> tuple:
    return out.lo, out.hi, image.hi, np.asarray(g1, np.float64).tobytes(), np.dtype(dtype).str


@lru_cache(maxsize=256)
def _renorm_cached(lo, hi, image_hi, g1_bytes: bytes, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g1 = np.frombuffer(g1_bytes, np.float64)
    zr, zc = (_border_weight(lo[a], hi[a], image_hi[a], g1) for a in (0, 1))
    res = zr, zc, np.outer(zr, zc).astype(dtype)[:, :, None]
    for a in res:
        a.flags.writeable = False
    return res


def smooth(u: np.ndarray, u_box: Box, out: Box, image: Box, g1: np.ndarray) -> np.ndarray:
    """(1/Z) * sum_{p,q} g[p,q] u[i+p-rho, j+q-rho] over ``out``; ``u`` (h, w, N) given on ``u_box``.

    ``u_box`` must contain (out + rho) & image.
    """
    if out.is_empty:
        return backend.array_module(u).zeros(out.shape + u.shape[2:], u.dtype)
    return implementation(u).smooth(u, u_box, out, image, g1, _renorm(out, image, g1, u.dtype))


def smooth_adjoint(u: np.ndarray, out: Box, target: Box, image: Box, g1: np.ndarray) -> np.ndarray:
    """Transpose of :func:`smooth`: ``u`` on ``out`` -> its contributions on ``target``."""
    xp = backend.array_module(u)
    if out.is_empty or target.is_empty:
        return xp.zeros(target.shape + u.shape[2:], u.dtype)
    key = _renorm_key(out, image, g1, u.dtype)  # Z is a box's size: kept on a device by its key, not its bytes
    t = u / backend.constant(_renorm_cached(*key)[2], u, key=("lcn.Z",) + key)
    return implementation(t).smooth_adjoint(t, out, target, image, g1)


@dataclass
class LCNCache:
    """What the backward pass needs from the forward pass."""

    x_box: Box
    out: Box
    r1: Box
    image: Box
    g1: np.ndarray
    v1: np.ndarray  # v on r1, (h1, w1, C, N)
    s: np.ndarray  # on out, (h, w, N)
    m: np.ndarray  # (N,)
    d: np.ndarray  # max(s, m, eps) on out
    eps: float
    workspace: Workspace | None = None  # the layer's scratch (numpy backend), for the backward's bands


def _rows(xp, n: int, bytes_per_row: int, fn: Callable[[int, int], None], one_pass: bool = False) -> None:
    """``fn(lo, hi)`` over the rows ``[0, n)``: on the numpy backend in bands (one band for small
    arrays, else cache-sized ones over the threads: :func:`~cotsdl.ops.cpu.parallel.row_bands`);
    in one call for device arrays."""
    if xp is np:
        run_bands(n, bytes_per_row, fn, one_pass)
    elif n:
        fn(0, n)


# On the numpy backend, a native kernel (the same bits as the numpy steps, in one memory pass),
# else None: then numpy or CuPy runs; and the spatial strides the kernels take.
_fused, _st = native.for_arrays, native.pixel_strides


def _scratch(ws: Workspace | None, xp, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    return ws.get(name, shape, dtype) if ws is not None and xp is np else xp.empty(shape, dtype)


def _result(ws: Workspace | None, xp, shape: tuple[int, ...], dtype) -> np.ndarray:
    """An array that outlives the call (the output, the cache): lent by the plan during a step."""
    return ws.output(shape, dtype) if ws is not None and xp is np else xp.empty(shape, dtype)


def forward_local(x: np.ndarray, x_box: Box, out: Box, image_hw: tuple[int, int], size: int, sigma: float,
                  eps: float, allreduce: Reduce | None = None, workspace: Workspace | None = None
                  ) -> tuple[np.ndarray, LCNCache]:
    """LCN of the image restricted to ``out`` (2-D spatial boxes); x is (h, w, C, N) on ``x_box``.

    The full-size steps (channel sums, centring, squares, the divide) run in bands of rows
    with ``out=`` (:func:`_rows`); the per-element arithmetic is the same in any band, so the
    result does not depend on the bands or threads.
    """
    xp = backend.array_module(x)
    C, N = x.shape[2], x.shape[3]
    rho = size // 2
    g1 = gaussian(size, sigma)
    image = Box((0, 0), image_hw)
    r1 = grow(out, (rho, rho), (rho, rho), image)
    if not x_box.contains(grow(out, (2 * rho,) * 2, (2 * rho,) * 2, image)):
        raise ValueError(f"LCN input window {x_box} does not cover {out} plus its 2*rho={2 * rho} halo")
    inv_c = x.dtype.type(1.0 / C)
    row = x.shape[1] * C * N * x.dtype.itemsize
    mean = _scratch(workspace, xp, "lcn.mean", x.shape[:2] + (N,), x.dtype)

    def channel_mean(a: int, b: int) -> None:
        xp.sum(x[a:b], axis=2, out=mean[a:b])
        xp.multiply(mean[a:b], inv_c, out=mean[a:b])

    fused = _fused(xp, "channel_mean", x, mean)
    if fused is not None:
        W = x.shape[1]
        _rows(xp, x.shape[0], row, lambda a, b: fused(x, *_st(x), W, C, N, inv_c, mean, *_st(mean), a, b), True)
    else:
        _rows(xp, x.shape[0], row, channel_mean)
    mu1 = smooth(mean, x_box, r1, image, g1)
    xr = x[r1.slices_in(x_box)]
    v1 = _result(workspace, xp, r1.shape + (C, N), x.dtype)
    q1 = xp.empty(r1.shape + (N,), x.dtype)

    def centre(a: int, b: int) -> None:
        xp.subtract(xr[a:b], mu1[a:b, :, None, :], out=v1[a:b])
        sq = _scratch(workspace, xp, "lcn.sq", v1[a:b].shape, x.dtype)
        xp.multiply(v1[a:b], v1[a:b], out=sq)
        xp.sum(sq, axis=2, out=q1[a:b])
        xp.multiply(q1[a:b], inv_c, out=q1[a:b])

    fused = _fused(xp, "centre", xr, mu1, v1, q1)
    if fused is not None:
        W1 = r1.shape[1]
        _rows(xp, r1.shape[0], row, lambda a, b: fused(xr, *_st(xr), mu1, *_st(mu1), W1, C, N, inv_c,
                                                        v1, *_st(v1), q1, *_st(q1), a, b), True)
    else:
        _rows(xp, r1.shape[0], row, centre)
    s = xp.sqrt(smooth(q1, r1, out, image, g1))
    total = s.sum(axis=(0, 1))
    if allreduce is not None:
        total = allreduce(total)
    m = (total / x.dtype.type(image.size)).astype(x.dtype)
    d = xp.maximum(xp.maximum(s, m), x.dtype.type(eps))
    v0 = v1[out.slices_in(r1)]
    y = _result(workspace, xp, out.shape + (C, N), x.dtype)
    fused = _fused(xp, "divide", v0, d, y)
    if fused is not None:
        Wo = out.shape[1]
        _rows(xp, out.shape[0], row, lambda a, b: fused(v0, *_st(v0), d, *_st(d), Wo, C, N, y, *_st(y), a, b), True)
    else:
        _rows(xp, out.shape[0], row, lambda a, b: xp.divide(v0[a:b], d[a:b, :, None, :], out=y[a:b]))
    return y, LCNCache(x_box, out, r1, image, g1, v1, s, m, d, eps, workspace)


def backward_local(dy: np.ndarray, cache: LCNCache, allreduce: Reduce | None = None) -> np.ndarray:
    """dx on the input window ``cache.x_box``, given dy on ``cache.out`` (full-size steps in bands of rows)."""
    c = cache
    xp = backend.array_module(dy)
    C, N = dy.shape[2], dy.shape[3]
    dt = dy.dtype.type
    inv_c = dt(1.0 / C)
    row = c.v1.shape[1] * C * N * dy.dtype.itemsize
    v0 = c.v1[c.out.slices_in(c.r1)]
    dd = xp.empty(c.out.shape + (N,), dy.dtype)

    def dot(a: int, b: int) -> None:
        prod = _scratch(c.workspace, xp, "lcn.prod", dy[a:b].shape, dy.dtype)
        xp.multiply(dy[a:b], v0[a:b], out=prod)
        xp.sum(prod, axis=2, out=dd[a:b])

    fused = _fused(xp, "channel_dot", dy, v0, dd)
    if fused is not None:
        Wo = c.out.shape[1]
        _rows(xp, c.out.shape[0], row,
              lambda a, b: fused(dy, *_st(dy), v0, *_st(v0), Wo, C, N, dd, *_st(dd), a, b), True)
    else:
        _rows(xp, c.out.shape[0], row, dot)
    oh, ow = c.out.shape
    small = ow * N * dy.dtype.itemsize  # a row of the (h, w, N) maps
    plain = xp is np and all(a.flags.c_contiguous for a in (dd, c.d, c.s, c.m))
    fused = _fused(xp, "lcn_branches", dd) if plain else None
    if fused is not None:  # the max()'s branches in one pass; the per-image sum by numpy, as below
        ds, mpart = xp.empty_like(dd), _scratch(c.workspace, xp, "lcn.mpart", dd.shape, dy.dtype)
        _rows(xp, oh, small, lambda a, b: fused(dd, c.d, c.s, c.m, dt(c.eps), ds, mpart, ow, N, a, b), True)
        dm = mpart.sum(axis=(0, 1))
    else:
        dd = -dd / (c.d * c.d)
        s_wins = (c.s >= c.m) & (c.s >= dt(c.eps))
        m_wins = ~s_wins & (c.m >= dt(c.eps))
        ds = xp.where(s_wins, dd, dt(0))
        dm = xp.where(m_wins, dd, dt(0)).sum(axis=(0, 1))
    if allreduce is not None:
        dm = allreduce(dm)
    q = (dm / dt(c.image.size)).astype(dy.dtype)
    fused = _fused(xp, "lcn_du", ds) if plain else None
    if fused is not None:
        du = xp.empty_like(ds)
        q = xp.ascontiguousarray(q)
        _rows(xp, oh, small, lambda a, b: fused(ds, c.s, q, du, ow, N, a, b), True)
    else:
        ds += q
        with np.errstate(divide="ignore", invalid="ignore"):
            du = xp.where(c.s > 0, ds / (dt(2) * c.s), dt(0))
    dq1 = smooth_adjoint(du, c.out, c.r1, c.image, c.g1)
    dx = _result(c.workspace, xp, c.x_box.shape + (C, N), dy.dtype)
    if c.r1 != c.x_box:  # r1's part is overwritten below; the rest only receives the adjoint's sums
        dx.fill(0)
    dv1 = dx[c.r1.slices_in(c.x_box)]
    dmu1 = xp.empty(c.r1.shape + (N,), dy.dtype)
    o_rows, o_cols = c.out.slices_in(c.r1)
    scale = dt(2) * inv_c

    def spread(a: int, b: int) -> None:
        t = dv1[a:b]
        xp.multiply(c.v1[a:b], scale, out=t)
        xp.multiply(t, dq1[a:b, :, None, :], out=t)
        lo, hi = max(a, o_rows.start), min(b, o_rows.stop)  # this band's rows of the output box
        if hi > lo:
            part = t[lo - a:hi - a, o_cols]
            q = _scratch(c.workspace, xp, "lcn.dv0", part.shape, dy.dtype)
            i = slice(lo - o_rows.start, hi - o_rows.start)
            xp.divide(dy[i], c.d[i, :, None, :], out=q)
            xp.add(part, q, out=part)
        xp.sum(t, axis=2, out=dmu1[a:b])
        xp.negative(dmu1[a:b], out=dmu1[a:b])

    fused = _fused(xp, "lcn_spread", c.v1, dq1, dy, c.d, dv1, dmu1)
    if fused is not None:
        oh, ow, W1 = c.out.shape[0], c.out.shape[1], c.r1.shape[1]
        _rows(xp, c.r1.shape[0], row, lambda a, b: fused(
            c.v1, *_st(c.v1), dq1, *_st(dq1), dy, *_st(dy), c.d, *_st(c.d), o_rows.start, o_cols.start, oh, ow,
            W1, C, N, scale, dv1, *_st(dv1), dmu1, *_st(dmu1), a, b), True)
    else:
        _rows(xp, c.r1.shape[0], row, spread)
    back = smooth_adjoint(dmu1, c.r1, c.x_box, c.image, c.g1) * inv_c
    fused = _fused(xp, "add_channels", dx, back)
    if fused is not None:
        Wx = dx.shape[1]
        _rows(xp, dx.shape[0], row, lambda a, b: fused(dx, *_st(dx), back, *_st(back), Wx, C, N, a, b), True)
    else:
        _rows(xp, dx.shape[0], row, lambda a, b: xp.add(dx[a:b], back[a:b, :, None, :], out=dx[a:b]))
    return dx
