"""Read minibatches of an HDF5 image dataset, each rank only its own input window.

``HDF5Source`` is a data source of the trainer (``cotsdl.train.data``): every rank
opens the file read-only (no parallel HDF5 or MPI-IO) and reads the hyperslab
``[indices, y0:y1, x0:x1, c0:c1]`` of the images of a minibatch — just its window,
so the first layer needs no exchange.  The stream order is a seeded permutation per
epoch (:class:`~cotsdl.io.order.StreamOrder`), the same on every rank.  Indices are
sorted (and made unique) for the HDF5 read and put back in stream order after.
uint8 pixels become float32 in [0, 1]; the paper's per-image preprocessing (mean
subtraction and division by the standard deviation, with a floor) uses statistics
stored in the file at build time, so a rank needs no other rank's pixels.  A
background thread reads the next minibatch while the current one is trained on.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np

from ..checks import Param
from ..array.box import Box
from .dataset import DEFAULT_KIND_NAMES, DatasetError, check_for_network, inspect, pixel_scale
from .order import StreamOrder

#: The floor of the per-image std, a float32 divisor: beyond these bounds it rounds to 0 or to
#: infinity in float32 (every image would be NaN or 0, and the error would blame the data).
STD_FLOOR = Param(0.01, lo=1e-30, hi=1e30, doc="floor of the per-image std (float32: 1e-30 .. 1e30)")
PREPROCESS = ("standardize", "center", "none")


class HDF5Source:
    """An endless shuffled stream of the images of a dataset file.

    Parameters
    ----------
    path : str or Path
        The dataset file (format: :mod:`cotsdl.io.dataset`).
    seed : int
        Seed of the per-epoch permutations (give every rank the same).
    shuffle : bool
        False streams the images in file order.
    preprocess : "standardize", "center" or "none"
        Per image: subtract its mean and divide by ``max(std, std_floor)``; only
        subtract the mean; or use the pixels as they are.
    std_floor : float
        Floor of the per-image standard deviation (in reader units: uint8 pixels are
        scaled to [0, 1]), so that flat images are not blown up.
    prefetch : bool
        Read the minibatch announced by :meth:`prefetch` in a background thread.

    Raises
    ------
    DatasetError
        A missing, unreadable or malformed file, naming the file and the problem.
    """

    def __init__(self, path: str | os.PathLike, *, seed: int = 0, shuffle: bool = True,
                 preprocess: str = "standardize", std_floor: float = 0.01, prefetch: bool = True):
        self.path = Path(path)
        if preprocess not in PREPROCESS:
            raise ValueError(f"preprocess must be one of {', '.join(PREPROCESS)}, got {preprocess!r}")
        STD_FLOOR.check("std_floor", std_floor)
        self.info = inspect(self.path)
        problems = check_for_network(self.info, self.info.image_shape, needs_stats=preprocess != "none")
        if problems:
            raise DatasetError(f"dataset {self.path}: " + "; ".join(problems))
        self.preprocess, self.std_floor = preprocess, float(std_floor)
        self.seed = int(seed)
        self.image_shape: tuple[int, int, int] = self.info.image_shape
        self.order = StreamOrder(self.info.count, seed, shuffle)
        try:
            self._file = h5py.File(self.path, "r")
            self._images = self._file["images"]
            self._mean = self._file["image_mean"][()].astype(np.float64) if preprocess != "none" else None
            self._std = self._file["image_std"][()].astype(np.float64) if preprocess == "standardize" else None
        except OSError as e:
            raise DatasetError(f"dataset {self.path}: cannot read it (truncated or corrupt?): {e}") from None
        self._scale = pixel_scale(self._images.dtype)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="cotsdl-prefetch") if prefetch else None
        self._pending: tuple[tuple, Future] | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Images in one epoch."""
        return self.info.count

    # -- the data-source interface -------------------------------------------------
    def read(self, first: int, count: int, window: Box) -> np.ndarray:
        """float32 (h, w, c, count): the ``window`` of the images at stream positions
        ``[first, first + count)`` (the window's N extent is ignored)."""
        key = self._key(first, count, window)
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            if pending[0] == key:
                return pending[1].result()  # an error in the thread surfaces here
            pending[1].cancel()
        return self._read(first, count, window)

    def prefetch(self, first: int, count: int, window: Box) -> None:
        """Start reading what the next :meth:`read` will ask for (no-op without prefetch)."""
        if self._pool is None:
            return
        key = self._key(first, count, window)
        with self._lock:
            if self._pending is not None:
                if self._pending[0] == key:
                    return
                self._pending[1].cancel()
            self._pending = (key, self._pool.submit(self._read, first, count, window))

    def labels(self) -> np.ndarray | None:
        """The ``labels`` dataset (N,), or None when the file has none."""
        if self.info.labels is None:
            return None
        return self._column("labels")

    def groups(self) -> np.ndarray:
        """(N,) int64: each image's group, the unit of bootstrap resampling (the views of one
        face identity share one): the ``groups`` dataset, or ``arange(N)`` (each image its own
        group) when the file has none."""
        if self.info.groups is None:
            return np.arange(self.info.count, dtype=np.int64)
        return self._column("groups")

    @property
    def kind_names(self) -> tuple[str, ...] | None:
        """Names of the codes :meth:`kinds` returns; for a labeled file without ``kinds``
        ``("face", "distractor")``; None for an unlabeled one."""
        if self.info.kind_names is not None:
            return tuple(self.info.kind_names)
        return None if self.info.labels is None else DEFAULT_KIND_NAMES

    def kinds(self) -> np.ndarray | None:
        """(N,) int64 codes into :attr:`kind_names`: the ``kinds`` dataset; for a labeled file
        without one, 0 ("face") for label 1 and 1 ("distractor") otherwise; None when unlabeled."""
        if self.info.kind_names is not None:
            return self._column("kinds")
        labels = self.labels()
        return None if labels is None else np.where(labels == 1, 0, 1).astype(np.int64)

    def _column(self, key: str) -> np.ndarray:
        try:
            return self._file[key][()].astype(np.int64)
        except OSError as e:
            raise DatasetError(f"dataset {self.path}: cannot read '{key}' (truncated or corrupt?): {e}") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._file.close()

    def __enter__(self) -> "HDF5Source":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- reading --------------------------------------------------------------------
    def _key(self, first: int, count: int, window: Box) -> tuple:
        if first < 0 or count < 1:
            raise ValueError(f"read needs first >= 0 and count >= 1, got {first}, {count}")
        w = Box(window.lo[:3], window.hi[:3])
        if not Box.from_shape(self.image_shape).contains(w):
            raise ValueError(f"window {w} lies outside the images {self.image_shape}")
        return (int(first), int(count), w.lo, w.hi)

    def indices(self, first: int, count: int) -> np.ndarray:
        """Image indices at stream positions [first, first + count)."""
        return self.order.indices(first, count)

    def _read(self, first: int, count: int, window: Box) -> np.ndarray:
        idx = self.indices(first, count)
        # HDF5 wants increasing, unique indices; a batch across an epoch boundary may repeat one.
        uniq, inverse = np.unique(idx, return_inverse=True)
        try:
            raw = self._read_rows(uniq, window)
        except OSError as e:
            raise DatasetError(f"dataset {self.path}: cannot read images {idx.min()}..{idx.max()} "
                               f"(truncated or corrupt?): {e}") from None
        # (h, w, c, N) at once: the transpose moves the stored bytes, not 4-byte floats; each element
        # then gets the same float32 operations in the same order as before (the same bits)
        x = np.empty(raw.shape[1:] + (len(idx),), np.float32)
        np.copyto(x, raw.transpose(1, 2, 3, 0)[..., inverse], casting="unsafe")
        if self._scale != 1.0:
            x *= np.float32(self._scale)
        else:
            self._check_finite(x, idx, "has NaN or Inf pixels")
        if self._mean is not None:
            x -= self._mean[idx].astype(np.float32)
        if self._std is not None:
            x /= np.maximum(self._std[idx], self.std_floor).astype(np.float32)
        if self._mean is not None:
            self._check_finite(x, idx, "has non-finite statistics (image_mean/image_std)")
        return x

    def _read_rows(self, uniq: np.ndarray, window: Box) -> np.ndarray:
        """(len(uniq), h, w, c) as stored: the ``window`` of the images ``uniq`` (increasing), one
        hyperslab per run of consecutive indices (h5py's selection by a list of indices took 30x as
        long: 0.49 s against 0.017 s for 96 windows of 100x200x3; cotsdl/bench/README.md, "`cotsdl bench
        reader`")."""
        (r0, c0, k0), (r1, c1, k1) = window.lo[:3], window.hi[:3]
        gray = self._images.ndim == 3
        out = np.empty((len(uniq), r1 - r0, c1 - c0) + (() if gray else (k1 - k0,)), self._images.dtype)
        cuts = np.flatnonzero(np.diff(uniq) != 1) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(uniq)]):
            a, b = int(uniq[lo]), int(uniq[lo]) + int(hi - lo)
            src = np.s_[a:b, r0:r1, c0:c1] if gray else np.s_[a:b, r0:r1, c0:c1, k0:k1]
            self._images.read_direct(out, src, np.s_[int(lo):int(hi)])
        return out[..., None] if gray else out

    def _check_finite(self, x: np.ndarray, idx: np.ndarray, what: str) -> None:
        ok = np.isfinite(x.reshape(-1, x.shape[-1])).all(axis=0)  # per image (the last axis)
        if not ok.all():
            bad = idx[~ok]
            more = f" (and {len(bad) - 1} more in this minibatch)" if len(bad) > 1 else ""
            raise DatasetError(f"dataset {self.path}: image {int(bad[0])} {what}{more}")
