"""The linear probe's arithmetic: class-balanced ridge least squares in kernel form, one Gram matrix
for every split.

Features are standardized once, with the mean and standard deviation of each
feature over all evaluation images.  That uses no label (it is unsupervised
preprocessing, like the network's own contrast normalization), and it makes the
Gram matrix K = Z Z^T (N x N) the same for every split: the costly pass over
the features (N^2 F multiply-adds; F runs to tens of thousands for a first
stage) is made once, and each split's fit (centering with the selection half's
weights, an n x n solve, predictions for every image) is O(N n + n^3) on K alone.
This is the same fit as the primal ridge on the standardized features (the
dual of ridge regression), for any number of features.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def gram(X: np.ndarray) -> np.ndarray:
    """K = Z Z^T (N x N, float64) of the features X (N x F) standardized over all N images."""
    X = np.asarray(X, dtype=np.float64)
    mu, sd = X.mean(axis=0), X.std(axis=0)
    sd[sd == 0] = 1.0  # constant features: centered to zero, they add nothing
    Z = (X - mu) / sd
    return Z @ Z.T


def fit_calls(K: np.ndarray, y: np.ndarray, sel: np.ndarray, l2: float) -> np.ndarray:
    """The calls (N,) bool of ridge fitted on the rows ``sel`` of labels ``y`` (bool), on every image.

    Targets +-1 with class-balanced weights w (summing to n), an unpenalized bias
    and penalty lam = l2 * (mean squared weighted, centered row norm): with v =
    w / sum(w), centering is C = I - 1 v^T, the weighted centered Gram is
    G = W^1/2 C K_ss C^T W^1/2, alpha = (G + lam I)^-1 W^1/2 (t - tbar), and an
    image x scores (K_xs - v^T K_ss) C^T W^1/2 alpha + tbar; face iff >= 0.
    """
    ys = y[sel]
    n = len(sel)
    w = np.where(ys, n / (2 * ys.sum()), n / (2 * (~ys).sum()))
    v = w / w.sum()
    t = np.where(ys, 1.0, -1.0)
    tbar = float(v @ t)
    sw = np.sqrt(w)
    Kss = K[np.ix_(sel, sel)]
    r = Kss @ v  # = K_ss^T v: K is symmetric
    # C K_ss C^T as rank-one corrections: O(n^2)
    Kc = Kss - r[:, None] - r[None, :] + float(v @ r)
    G = sw[:, None] * Kc * sw[None, :]
    lam = l2 * max(float(np.trace(G)) / n, 1e-12)
    alpha = np.linalg.solve(G + lam * np.eye(n), sw * (t - tbar))
    Kxs = K[:, sel]
    M = Kxs - r[None, :] - (Kxs @ v)[:, None] + float(v @ r)  # (K_xs - 1 r^T) C^T
    return M @ (sw * alpha) + tbar >= 0.0


def calls(K: np.ndarray, y: np.ndarray, splits: Sequence[tuple[np.ndarray, np.ndarray]],
          l2: float) -> np.ndarray:
    """(k, N) calls of the probe fitted on each split's selection half."""
    return np.stack([fit_calls(K, y, np.asarray(sel), l2) for sel, _ in splits]) if len(splits) else \
        np.zeros((0, len(y)), bool)
