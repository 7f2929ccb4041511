"""The order in which a data source streams its images: a seeded permutation per epoch.

Stream position ``t`` is image ``perm_e[t mod N]`` of epoch ``e = t // N``, where
``perm_e`` depends only on (seed, e).  Every rank computes the same order without
talking to the others, and resuming at a position needs no other state.
"""
from __future__ import annotations

import numpy as np


class StreamOrder:
    """Image indices of an endless stream over ``n`` images.

    Parameters
    ----------
    n : int
        Images in one epoch.
    seed : int
        Seed of the per-epoch permutations.
    shuffle : bool
        False streams the images in order, epoch after epoch.
    """

    def __init__(self, n: int, seed: int = 0, shuffle: bool = True):
        if n < 1:
            raise ValueError(f"a stream needs at least one image, got {n}")
        self.n, self.seed, self.shuffle = int(n), int(seed), bool(shuffle)
        self._cached: tuple[int, np.ndarray] | None = None

    def epoch(self, e: int) -> np.ndarray:
        """The permutation of epoch ``e``."""
        cached = self._cached  # one read: a prefetch thread may replace it meanwhile
        if cached is None or cached[0] != e:
            p = np.random.default_rng([self.seed, e]).permutation(self.n) if self.shuffle else np.arange(self.n)
            cached = self._cached = (e, p)
        return cached[1]

    def indices(self, first: int, count: int) -> np.ndarray:
        """Image indices at stream positions [first, first + count)."""
        if first < 0 or count < 0:
            raise ValueError(f"stream positions need first >= 0 and count >= 0, got {first}, {count}")
        pos = np.arange(first, first + count)
        out = np.empty(count, np.int64)
        for e in np.unique(pos // self.n):
            sel = pos // self.n == e
            out[sel] = self.epoch(int(e))[pos[sel] % self.n]
        return out
