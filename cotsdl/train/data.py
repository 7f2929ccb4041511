"""Data sources: what the trainer reads its minibatches from.

A source is an endless, shuffled stream of images.  The trainer asks for ``count``
consecutive images starting at stream position ``first``, cut to a spatial window::

    source.read(first, count, window) -> float32 array (h, w, C, count)

where ``window`` is a 4-D box of the (H, W, C, N) layout (its N extent is ignored).
Every rank of a model group asks for the same positions and its own window, so it
gets its part of the same images; replica r of R reads positions
``[(i*R + r)*B, (i*R + r + 1)*B)`` for batch i of size B, so replicas get different
images and one process reading ``[i*R*B, (i+1)*R*B)`` sees exactly their union.
The stream order depends only on the seed: resuming at a batch index needs no other
state.  Any object with ``image_shape`` and ``read`` is a source; one with a
``prefetch(first, count, window)`` method is told what the next ``read`` will be
(``cotsdl.io.reader.HDF5Source`` reads it in a background thread).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from ..array.box import Box
from ..io.order import StreamOrder


class DataSource(Protocol):
    image_shape: tuple[int, int, int]

    def read(self, first: int, count: int, window: Box) -> np.ndarray: ...


class InMemorySource:
    """Images held in memory, (N, H, W, C) as stored in HDF5 files, reshuffled every epoch.

    Parameters
    ----------
    images : array (N, H, W, C) or (N, H, W)
        The images (any real dtype; returned as float32).
    seed : int
        Seed of the per-epoch permutations.
    shuffle : bool
        False streams the images in order, epoch after epoch.
    """

    def __init__(self, images: np.ndarray, seed: int = 0, shuffle: bool = True):
        images = np.asarray(images)
        if images.ndim == 3:
            images = images[..., None]
        if images.ndim != 4 or min(images.shape) < 1:
            raise ValueError(f"images must be an (N, H, W, C) or (N, H, W) array, got shape {images.shape}")
        if not np.issubdtype(images.dtype, np.number):
            raise ValueError(f"images must be numeric, got dtype {images.dtype}")
        self.images = images
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.image_shape = tuple(int(v) for v in images.shape[1:])
        self.order = StreamOrder(len(images), seed, shuffle)

    def __len__(self) -> int:
        """Images in one epoch."""
        return len(self.images)

    def indices(self, first: int, count: int) -> np.ndarray:
        """Image indices at stream positions [first, first + count)."""
        return self.order.indices(first, count)

    def read(self, first: int, count: int, window: Box) -> np.ndarray:
        if first < 0 or count < 1:
            raise ValueError(f"read needs first >= 0 and count >= 1, got {first}, {count}")
        if not Box.from_shape(self.image_shape).contains(Box(window.lo[:3], window.hi[:3])):
            raise ValueError(f"window {window} lies outside the images {self.image_shape}")
        (r0, c0, k0), (r1, c1, k1) = window.lo[:3], window.hi[:3]
        sel = self.images[self.indices(first, count)][:, r0:r1, c0:c1, k0:k1]
        return np.ascontiguousarray(sel.transpose(1, 2, 3, 0), dtype=np.float32)
