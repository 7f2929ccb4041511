"""Input whitening: a data source whose images are locally contrast-normalized.

``InputLCN(source, size, sigma, eps)`` wraps any data source (``HDF5Source``,
``InMemorySource``...) and applies the network's own LCN (``ops.lcn``: subtract a
Gaussian-weighted local mean, divide by the local standard deviation, floored by its
image mean and ``eps``) to every image it reads, after the source's per-image
preprocessing.  It removes what varies slowly across an image (illumination, large
bright or dark regions), which is what an edge-learning first stage should not have
to spend units on: a cheap stand-in for whitening (Jarrett et al. 2009 normalize the
input the same way).

LCN's divisor is a statistic of the whole image, so each read fetches whole images
(all rows, columns and channels) from the inner source and crops the window the
caller asked for: every rank of a model group reads the full images rather than its
window.  The images are small next to the network's activations, but on a large grid
this multiplies the file reads by the number of ranks in a group.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import ops
from ..array.box import Box
from ..ops.shapes import lcn_params


class InputLCN:
    """A data source: ``source`` with LCN applied to each image (see the module docstring).

    Parameters
    ----------
    source : data source
        Has ``image_shape`` and ``read(first, count, window)``; every other attribute
        (``labels()``, ``info``, ``close()``...) is the source's.
    size, sigma, eps
        The LCN's odd Gaussian window width, its standard deviation and the floor of
        the divisor (as a stage's ``lcn``).
    """

    def __init__(self, source: Any, size: int, sigma: float, eps: float):
        self.size, self.sigma, self.eps = lcn_params(size, sigma, eps, "input_lcn.")
        self.source = source
        self.image_shape: tuple[int, int, int] = tuple(source.image_shape)
        self._whole = Box((0, 0, 0), self.image_shape)

    def __getattr__(self, name: str) -> Any:
        if name == "source":  # not yet set (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.source, name)

    def __len__(self) -> int:
        return len(self.source)

    def __enter__(self) -> "InputLCN":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> dict[str, Any]:
        """The parameters, as a config's ``data.input_lcn`` table."""
        return {"size": self.size, "sigma": self.sigma, "eps": self.eps}

    def read(self, first: int, count: int, window: Box) -> np.ndarray:
        """Images [first, first + count) of the stream on ``window`` (H, W, C[, N]), normalized."""
        w = Box(window.lo[:3], window.hi[:3])
        if not self._whole.contains(w):
            raise ValueError(f"window {w} lies outside the images {self.image_shape}")
        x = self.source.read(first, count, self._whole)
        dtype = x.dtype
        y = ops.lcn(np.ascontiguousarray(x), self.size, self.sigma, self.eps)
        (r0, c0, k0), (r1, c1, k1) = w.lo, w.hi
        out = np.ascontiguousarray(y[r0:r1, c0:c1, k0:k1])
        assert out.dtype == dtype, (out.dtype, dtype)  # numpy 2 promotion is silent
        return out

    def prefetch(self, first: int, count: int, window: Box) -> None:
        """Announce the next read to the source (whole images: what :meth:`read` will ask for)."""
        if hasattr(self.source, "prefetch"):
            self.source.prefetch(first, count, self._whole)
