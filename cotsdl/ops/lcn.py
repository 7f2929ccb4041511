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
from typing import Callable

import numpy as np

from .. import backend
from ..array.box import Box, grow
from ._dispatch import implementation

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
    """Border weights of the window over ``out``: rows zr, columns zc, and Z = zr zc^T (h, w, 1)."""
    zr, zc = (_border_weight(out.lo[a], out.hi[a], image.hi[a], g1) for a in (0, 1))
    return zr, zc, np.outer(zr, zc).astype(dtype)[:, :, None]


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
    t = u / xp.asarray(_renorm(out, image, g1, u.dtype)[2])
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


def forward_local(x: np.ndarray, x_box: Box, out: Box, image_hw: tuple[int, int], size: int, sigma: float,
                  eps: float, allreduce: Reduce | None = None) -> tuple[np.ndarray, LCNCache]:
    """LCN of the image restricted to ``out`` (2-D spatial boxes); x is (h, w, C, N) on ``x_box``."""
    xp = backend.array_module(x)
    C = x.shape[2]
    rho = size // 2
    g1 = gaussian(size, sigma)
    image = Box((0, 0), image_hw)
    r1 = grow(out, (rho, rho), (rho, rho), image)
    if not x_box.contains(grow(out, (2 * rho,) * 2, (2 * rho,) * 2, image)):
        raise ValueError(f"LCN input window {x_box} does not cover {out} plus its 2*rho={2 * rho} halo")
    inv_c = x.dtype.type(1.0 / C)
    mu1 = smooth(x.sum(axis=2) * inv_c, x_box, r1, image, g1)
    v1 = x[r1.slices_in(x_box)] - mu1[:, :, None, :]
    q1 = (v1 * v1).sum(axis=2) * inv_c
    s = xp.sqrt(smooth(q1, r1, out, image, g1))
    total = s.sum(axis=(0, 1))
    if allreduce is not None:
        total = allreduce(total)
    m = (total / x.dtype.type(image.size)).astype(x.dtype)
    d = xp.maximum(xp.maximum(s, m), x.dtype.type(eps))
    y = v1[out.slices_in(r1)] / d[:, :, None, :]
    return y, LCNCache(x_box, out, r1, image, g1, v1, s, m, d, eps)


def backward_local(dy: np.ndarray, cache: LCNCache, allreduce: Reduce | None = None) -> np.ndarray:
    """dx on the input window ``cache.x_box``, given dy on ``cache.out``."""
    c = cache
    xp = backend.array_module(dy)
    C = dy.shape[2]
    dt = dy.dtype.type
    inv_c = dt(1.0 / C)
    v0 = c.v1[c.out.slices_in(c.r1)]
    dv0 = dy / c.d[:, :, None, :]
    dd = -(dy * v0).sum(axis=2) / (c.d * c.d)
    s_wins = (c.s >= c.m) & (c.s >= dt(c.eps))
    m_wins = ~s_wins & (c.m >= dt(c.eps))
    ds = xp.where(s_wins, dd, dt(0))
    dm = xp.where(m_wins, dd, dt(0)).sum(axis=(0, 1))
    if allreduce is not None:
        dm = allreduce(dm)
    ds += (dm / dt(c.image.size)).astype(dy.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        du = xp.where(c.s > 0, ds / (dt(2) * c.s), dt(0))
    dq1 = smooth_adjoint(du, c.out, c.r1, c.image, c.g1)
    dv1 = (dt(2) * inv_c) * c.v1 * dq1[:, :, None, :]
    dv1[c.out.slices_in(c.r1)] += dv0
    dx_shape = c.x_box.shape + dy.shape[2:]
    dx = xp.zeros(dx_shape, dy.dtype)
    dx[c.r1.slices_in(c.x_box)] += dv1
    dmu1 = -dv1.sum(axis=2)
    dx += (smooth_adjoint(dmu1, c.r1, c.x_box, c.image, c.g1) * inv_c)[:, :, None, :]
    return dx
