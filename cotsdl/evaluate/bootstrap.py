"""Confidence intervals of held-out scores by resampling groups (identities), paired across measures.

What varies from one evaluation set to the next is *which identities* it holds:
the augmented views of one face (and the distractors made from it) come and go
together, and they are strongly correlated (a neuron that gets one view of a face
right gets most of them right).  Resampling single images would treat 10 views as
10 independent draws and give an interval about sqrt(10) times too narrow.  So a
resample draws G groups with replacement from the G groups of the set; every
image of a group drawn m times gets weight m.

Each split keeps its selected rule fixed (neuron, threshold and polarity, or the
probe's fitted weights): re-running the selection on every resample would mean
scanning every neuron a thousand times.  The interval therefore measures the
test-set sampling variability by identity of the chosen rules' held-out balanced
accuracy (averaged over the splits, as the point estimate is), which is the
uncertainty of the comparison with a control; it does not re-draw the selection.

Every measure (the network's best neuron, each control, each probe) is scored on
the same resamples, so the difference network - control of each resample is a
paired difference: identities that are hard for both cancel out, and its interval
is narrower than the two intervals alone would suggest.

Cheap and vectorized: the calls of a rule are reduced to per-group counts once,
and a resample's counts are one matrix product with its group multiplicities.
Pure numpy and deterministic (seeded), so every process gets the same numbers.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .splits import dense

#: Two-sided level of the percentile intervals.
LEVEL = 0.95


class GroupBootstrap:
    """Resamples of the groups of a labeled set, and the held-out scores of fixed calls on them.

    Parameters
    ----------
    y : (N,) array of 0/1
        1 = face.
    splits : list of (selection, test) index arrays
        The splits the calls were made on (test halves are scored).
    groups : (N,) int array, optional
        The group (identity) of every image; default: every image its own group
        (the per-image bootstrap).
    resamples : int
        Number of resamples B.
    seed : int

    Attributes
    ----------
    weights : (B + 1, G) float array
        Group multiplicities; row 0 takes every group once (the observed set, the
        point estimate), rows 1..B are the resamples.
    """

    def __init__(self, y: Any, splits: Sequence[tuple[np.ndarray, np.ndarray]], groups: Any = None,
                 resamples: int = 1000, seed: int = 0):
        self.y = np.asarray(y).astype(bool)
        N = len(self.y)
        self.group, G = dense(np.arange(N) if groups is None else groups)
        self.test = np.zeros((len(splits), N), bool)
        for s, (_, test) in enumerate(splits):
            self.test[s, test] = True
        rng = np.random.default_rng([seed, 0xB007])  # a stream of its own, apart from the splits'
        draws = rng.integers(0, G, (resamples, G))
        counts = np.bincount((draws + G * np.arange(resamples)[:, None]).ravel(), minlength=resamples * G)
        self.weights = np.vstack([np.ones((1, G)), counts.reshape(resamples, G)]).astype(np.float64)

    @property
    def resamples(self) -> int:
        return len(self.weights) - 1

    def _per_group(self, rows: np.ndarray) -> np.ndarray:
        """(G, R) sums over the images of each group of (R, N) 0/1 rows."""
        out = np.zeros((self.weights.shape[1], len(rows)))
        np.add.at(out, self.group, rows.T.astype(np.float64))
        return out

    def scores(self, calls: Any, distractors: Any = None) -> np.ndarray:
        """(B + 1,) held-out balanced accuracy of ``calls`` (k, N) bool, averaged over the splits.

        Only distractors in the mask ``distractors`` (default all) count against
        the faces (per-kind scores).  A split whose resampled test half has no
        faces or no such distractors is left out of that resample's average; a
        resample with none left is NaN.
        """
        calls = np.asarray(calls, bool)
        if calls.shape != self.test.shape:
            raise ValueError(f"calls of shape {calls.shape} for {self.test.shape[0]} splits of {self.test.shape[1]} "
                             "images")
        faces = self.test & self.y
        other = self.test & ~self.y & (True if distractors is None else np.asarray(distractors, bool))
        k = len(calls)
        sums = self.weights @ self._per_group(np.vstack([faces & calls, faces, other & ~calls, other]))
        tp, P, tn, D = sums[:, :k], sums[:, k:2 * k], sums[:, 2 * k:3 * k], sums[:, 3 * k:]
        ok = (P > 0) & (D > 0)
        bal = np.where(ok, (tp / np.where(ok, P, 1) + tn / np.where(ok, D, 1)) / 2, 0.0)
        n = ok.sum(axis=1)
        return np.where(n > 0, bal.sum(axis=1) / np.maximum(n, 1), np.nan)


def interval(values: Any, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval of the resamples ``values[1:]`` (``values[0]`` is the observed set)."""
    v = np.asarray(values, np.float64)[1:]
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    lo, hi = np.percentile(v, [100 * a, 100 * (1 - a)])
    return float(lo), float(hi)


def summary(values: Any, level: float = LEVEL) -> dict[str, float]:
    """``score`` (the observed set) with ``ci_low`` and ``ci_high`` of one measure's (B + 1,) scores."""
    lo, hi = interval(values, level)
    return {"score": float(np.asarray(values)[0]), "ci_low": lo, "ci_high": hi}


def difference(a: Any, b: Any, level: float = LEVEL) -> dict[str, float]:
    """``difference`` a - b on the observed set with the interval of the paired resampled differences."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    lo, hi = interval(d, level)
    return {"difference": float(d[0]), "ci_low": lo, "ci_high": hi}
