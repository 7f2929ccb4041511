"""L2 pooling on the CPU (numpy backend).

    y[i, j, c, n] = sqrt(eps + sum_{p<ph, q<pw} x[i*qh+p, j*qw+q, c, n]^2)

Output (PH, PW, C, N), PH = (H - ph) // qh + 1.  Backward: dx += dy * x / y.
Window sums are separable: ph strided adds along H, then pw along W.
"""
from __future__ import annotations

import numpy as np

from ..shapes import window_sites


def _window_sum(a: np.ndarray, size, stride, out) -> np.ndarray:
    (ph, pw), (qh, qw), (PH, PW) = size, stride, out
    rows = a[0:qh * (PH - 1) + 1:qh].copy()
    for p in range(1, ph):
        rows += a[p:p + qh * (PH - 1) + 1:qh]
    acc = rows[:, 0:qw * (PW - 1) + 1:qw].copy()
    for q in range(1, pw):
        acc += rows[:, q:q + qw * (PW - 1) + 1:qw]
    return acc


def pool_forward(x: np.ndarray, size, stride, eps: float) -> np.ndarray:
    out = window_sites(x.shape[:2], size, stride)
    acc = _window_sum(x * x, size, stride, out)
    acc += x.dtype.type(eps)
    return np.sqrt(acc, out=acc)


def pool_backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray, size, stride) -> np.ndarray:
    """dx given dy, the input x and the forward output y (y == 0 contributes nothing)."""
    (ph, pw), (qh, qw) = size, stride
    PH, PW = y.shape[:2]
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.where(y > 0, dy / y, 0).astype(x.dtype, copy=False)
    # Spread each window's g back over its ph x pw inputs (adjoint of _window_sum).
    rows = np.zeros((PH, x.shape[1]) + x.shape[2:], x.dtype)
    for q in range(pw):
        rows[:, q:q + qw * (PW - 1) + 1:qw] += g
    dx = np.zeros_like(x)
    for p in range(ph):
        dx[p:p + qh * (PH - 1) + 1:qh] += rows
    dx *= x
    return dx
