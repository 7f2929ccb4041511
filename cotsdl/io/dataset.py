"""The HDF5 image-dataset format: writing a file, and checking what a file holds.

A dataset file holds

- ``images``: (N, H, W, C) or (N, H, W), uint8, float32 or float64, any chunking
  and compression (the writer makes one image per chunk);
- ``labels`` (optional): (N,) integers (the ``faces`` set: 1 = face, 0 = distractor);
- ``groups`` (optional): (N,) integers, the unit of bootstrap resampling in the
  evaluation: images of one group (the views of one face identity, and the
  distractors made from it) are drawn together. Absent: each image is its own group;
- ``kinds`` (optional): (N,) integers, each image's kind as a code into the JSON list
  in its attribute ``kind_names`` (e.g. ``["face", "lfw_nonface", ...]``), so that
  each kind of distractor can be scored on its own. Where the names hold ``"face"``,
  exactly the images of that kind have label 1. Absent: "face" for label 1,
  "distractor" for the others;
- ``image_mean``, ``image_std``: (N,) float64 per-image statistics of the pixel
  values *as the reader returns them* (uint8 scaled to [0, 1]) over all pixels and
  channels, so that every rank can standardize its own window of an image without
  any other rank's pixels;
- attributes ``cotsdl_format`` (the version, 1) and ``recipe`` (JSON: how it was built).

Files are written to a temporary name in the destination folder and renamed when
complete, so a failed or interrupted build leaves no half-written file.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import h5py
import numpy as np

from .. import stops
from .atomic import DiskError, ensure_free
from .h5safe import storage_problems

FORMAT_VERSION = 1
DTYPES = (np.dtype(np.uint8), np.dtype(np.float32), np.dtype(np.float64))
#: What the reader reports for a labeled file without ``kinds``: label 1, then the rest.
DEFAULT_KIND_NAMES = ("face", "distractor")


class DatasetError(ValueError):
    """A dataset file that cannot be used; the message names the file and what is wrong."""


def kind_names_problem(names: Any) -> str | None:
    """Why ``names`` cannot be the ``kind_names`` of a file (None: it can): distinct non-empty strings,
    at most 127 (the codes are int8)."""
    if not isinstance(names, (list, tuple)) or not 1 <= len(names) <= 127:
        return f"'kind_names' must be a list of 1 to 127 names, got {names!r}"
    if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        return f"'kind_names' must be distinct non-empty strings, got {list(names)!r}"
    return None


def _bad_codes(codes: np.ndarray, names: Sequence[str]) -> str | None:
    bad = (codes < 0) | (codes >= len(names))
    if bad.any():
        return f"'kinds' must be codes 0..{len(names) - 1} of kind_names {list(names)}, found {int(codes[bad][0])}"
    return None


def pixel_scale(dtype: Any) -> float:
    """The factor the reader applies to stored values (uint8 -> [0, 1])."""
    return 1.0 / 255.0 if np.dtype(dtype) == np.uint8 else 1.0


def image_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-image mean and standard deviation (float64, over all pixels and channels) of
    (n, H, W[, C]) stored values, in the units the reader returns."""
    x = np.asarray(images).reshape(len(images), -1).astype(np.float64) * pixel_scale(images.dtype)
    return x.mean(axis=1), x.std(axis=1)


class DatasetWriter:
    """Write a dataset file image batch by image batch (constant memory for big builds).

    Parameters
    ----------
    path : str or Path
        The file to create (replaced only when the new one is complete).
    count : int
        Number of images N.
    image_shape : (H, W) or (H, W, C)
    dtype : uint8, float32 or float64
    recipe : dict
        How the file was built (stored as JSON in the ``recipe`` attribute).
    labels : bool
        Whether ``add`` receives labels.
    compression : None, "gzip" or "lzf"
    groups : bool
        Whether ``add`` receives groups.
    kind_names : sequence of str, optional
        The names of the kind codes that ``add`` receives (None: no ``kinds``).

    Use as a context manager; on an exception the temporary file is removed.
    """

    def __init__(self, path: str | os.PathLike, count: int, image_shape: Sequence[int], dtype: Any = np.uint8,
                 recipe: dict[str, Any] | None = None, labels: bool = False, compression: str | None = None,
                 groups: bool = False, kind_names: Sequence[str] | None = None):
        self.path = Path(path)
        dtype = np.dtype(dtype)
        if kind_names is not None and kind_names_problem(list(kind_names)):
            raise DatasetError(f"{self.path}: {kind_names_problem(list(kind_names))}")
        if dtype not in DTYPES:
            raise DatasetError(f"{self.path}: images must be uint8, float32 or float64, got {dtype}")
        if count < 1 or len(image_shape) not in (2, 3) or min(image_shape) < 1:
            raise DatasetError(f"{self.path}: need count >= 1 and an (H, W) or (H, W, C) image shape, "
                               f"got {count} and {tuple(image_shape)}")
        if self.path.is_dir():
            raise DatasetError(f"{self.path} is a folder: give a file name (e.g. {self.path / 'images.h5'})")
        folder = self.path.parent if str(self.path.parent) else Path(".")
        # missing folders are made (and removed again if the build fails)
        self._made = [p for p in [folder, *folder.parents] if not p.exists()]
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise DatasetError(f"{self.path}: {folder} is not a folder") from None
        except OSError as e:
            raise DatasetError(f"{self.path}: cannot make folder {folder}: {e.strerror}") from None
        # free space first: HDF5 that meets a full disk mid-file fails obscurely (and may crash at exit)
        need = int(count) * int(np.prod(image_shape)) * dtype.itemsize * (1 if compression is None else 0) + 8 * count * 6
        try:
            ensure_free(folder, need + (16 << 20), f"{self.path} ({count} images of {tuple(image_shape)} {dtype})")
        except DiskError:
            for p in reversed(self._made):
                p.rmdir()
            raise
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".partial", dir=folder)
        os.close(fd)
        self._tmp = Path(tmp)
        self.count, self.n = int(count), 0
        self._file = h5py.File(self._tmp, "w")
        shape = (self.count,) + tuple(int(v) for v in image_shape)
        self._images = self._file.create_dataset("images", shape, dtype, chunks=(1,) + shape[1:],
                                                 compression=compression)
        self._labels = self._file.create_dataset("labels", (self.count,), np.int64) if labels else None
        self._groups = self._file.create_dataset("groups", (self.count,), np.int64) if groups else None
        self._kinds, self.kind_names = None, None if kind_names is None else [str(n) for n in kind_names]
        if kind_names is not None:
            self._kinds = self._file.create_dataset("kinds", (self.count,), np.int8)
            self._kinds.attrs["kind_names"] = json.dumps(self.kind_names)
        self._mean = np.zeros(self.count)
        self._std = np.zeros(self.count)
        self._file.attrs["cotsdl_format"] = FORMAT_VERSION
        self._file.attrs["recipe"] = json.dumps(recipe or {}, sort_keys=True)

    def add(self, images: np.ndarray, labels: Sequence[int] | None = None, groups: Sequence[int] | None = None,
            kinds: Sequence[int] | None = None) -> None:
        """Append (n, H, W[, C]) images (and their labels, groups and kind codes)."""
        images = np.asarray(images)
        if images.ndim == len(self._images.shape) - 1:
            images = images[None]
        if images.shape[1:] != self._images.shape[1:] or images.dtype != self._images.dtype:
            raise DatasetError(f"{self.path}: images of shape {images.shape[1:]} and dtype {images.dtype} added to "
                               f"a dataset of {self._images.shape[1:]} {self._images.dtype}")
        if images.dtype != np.uint8 and not np.all(np.isfinite(images)):
            bad = int(np.flatnonzero(~np.isfinite(images.reshape(len(images), -1)).all(axis=1))[0])
            raise DatasetError(f"{self.path}: image {self.n + bad} has NaN or Inf values")
        k = len(images)
        if self.n + k > self.count:
            raise DatasetError(f"{self.path}: more than the {self.count} images announced")
        columns = {"labels": (labels, self._labels), "groups": (groups, self._groups), "kinds": (kinds, self._kinds)}
        values = {key: self._column(key, v, d, k) for key, (v, d) in columns.items()}
        self._images[self.n:self.n + k] = images
        for key, v in values.items():
            if v is not None:
                columns[key][1][self.n:self.n + k] = v
        self._mean[self.n:self.n + k], self._std[self.n:self.n + k] = image_stats(images)
        self.n += k

    def _column(self, key: str, values: Any, dataset: Any, k: int) -> np.ndarray | None:
        """``values`` checked as k integers of the optional dataset ``key`` (None where it has none)."""
        if (values is None) != (dataset is None):
            raise DatasetError(f"{self.path}: {key} {'missing' if values is None else 'not expected'}")
        if values is None:
            return None
        v = np.asarray(values)
        if v.shape != (k,) or not (np.issubdtype(v.dtype, np.integer) or np.issubdtype(v.dtype, np.bool_)):
            raise DatasetError(f"{self.path}: '{key}' of a batch of {k} images must be ({k},) integers, "
                               f"got shape {v.shape} {v.dtype}")
        v = v.astype(np.int64)
        problem = _bad_codes(v, self.kind_names) if key == "kinds" else None
        if problem:
            raise DatasetError(f"{self.path}: {problem}")
        return v

    def close(self) -> Path:
        """Finish the file and move it into place (not after a stop signal, even a swallowed one)."""
        if self.n != self.count:
            raise DatasetError(f"{self.path}: {self.n} images written, {self.count} announced")
        self._file.create_dataset("image_mean", data=self._mean)
        self._file.create_dataset("image_std", data=self._std)
        self._file.close()
        os.chmod(self._tmp, 0o644)
        stops.checkpoint()  # last, after HDF5's own work (where callbacks run and may swallow a stop)
        try:
            os.replace(self._tmp, self.path)
        except OSError as e:
            raise DatasetError(f"{self.path}: cannot move the finished file into place: {e.strerror}") from None
        return self.path

    def abort(self) -> None:
        try:
            if self._file.id.valid:
                self._file.close()
        finally:
            self._tmp.unlink(missing_ok=True)
            for p in self._made:  # deepest first
                try:
                    p.rmdir()
                except OSError:
                    break

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
            return
        try:
            self.close()
        except BaseException:
            self.abort()
            raise


def write_dataset(path: str | os.PathLike, images: np.ndarray, labels: Sequence[int] | None = None,
                  recipe: dict[str, Any] | None = None, compression: str | None = None,
                  groups: Sequence[int] | None = None, kinds: Sequence[int] | None = None,
                  kind_names: Sequence[str] | None = None) -> Path:
    """Write (N, H, W[, C]) ``images`` (and labels, groups, kinds) as a dataset file in one call.

    ``kinds`` are codes into ``kind_names`` (both or neither).
    """
    images = np.asarray(images)
    if images.ndim not in (3, 4):
        raise DatasetError(f"{path}: images must be (N, H, W) or (N, H, W, C), got shape {images.shape}")
    if (kinds is None) != (kind_names is None):
        raise DatasetError(f"{path}: 'kinds' and 'kind_names' go together, got only "
                           f"{'kind_names' if kinds is None else 'kinds'}")
    columns = {"labels": labels, "groups": groups, "kinds": kinds}
    for key, v in columns.items():
        if v is not None and np.shape(v) != (len(images),):
            raise DatasetError(f"{path}: '{key}' must be ({len(images)},), one per image, got shape {np.shape(v)}")
    with DatasetWriter(path, len(images), images.shape[1:], images.dtype, recipe, labels is not None,
                       compression, groups is not None, kind_names) as w:
        for i in range(0, len(images), 256):
            w.add(images[i:i + 256], **{k: None if v is None else np.asarray(v)[i:i + 256]
                                        for k, v in columns.items()})
    return Path(path)


@dataclass
class DatasetInfo:
    """What a dataset file holds (``inspect`` fills it; ``problems`` lists what is wrong)."""

    path: str
    count: int = 0
    image_shape: tuple[int, int, int] = (0, 0, 0)
    dtype: str = ""
    stored_shape: tuple[int, ...] = ()
    chunks: tuple[int, ...] | None = None
    compression: str | None = None
    labels: dict[str, int] | None = None
    groups: int | None = None
    kind_names: list[str] | None = None
    kinds: dict[str, int] | None = None
    has_stats: bool = False
    format_version: int | None = None
    recipe: Any = None
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"{self.path}: cotsdl dataset format {self.format_version}" if self.format_version is not None
                 else f"{self.path}: no cotsdl_format attribute (a plain HDF5 file)"]
        if self.count:
            h, w, c = self.image_shape
            lines.append(f"  images: {self.count} x {h}x{w}x{c} {self.dtype} (stored as {self.stored_shape}, "
                         f"chunks {self.chunks}, compression {self.compression})")
        if self.labels is not None:
            lines.append("  labels: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.labels.items())))
        if self.kinds is not None:
            lines.append("  kinds: " + ", ".join(f"{k}: {v}" for k, v in self.kinds.items()))
        if self.groups is not None:
            lines.append(f"  groups: {self.groups} (the unit of bootstrap resampling)")
        lines.append("  per-image statistics: yes" if self.has_stats else "  per-image statistics: no (preprocessing "
                     f"needs them: cotsdl prepare-data stats {self.path})")
        if self.recipe:
            lines.append(f"  recipe: {json.dumps(_abridged(self.recipe), sort_keys=True)}")
        return "\n".join(lines)


def _abridged(value: Any, items: int = 6) -> Any:
    """A recipe for printing: long lists (file names, split indices) cut to their first items."""
    if isinstance(value, dict):
        return {k: _abridged(v, items) for k, v in value.items()}
    if isinstance(value, list) and len(value) > items:
        return [_abridged(v, items) for v in value[:items]] + [f"... {len(value) - items} more"]
    return value


def inspect(path: str | os.PathLike) -> DatasetInfo:
    """Read a file's structure (not its pixels) and list its problems.

    Raises
    ------
    DatasetError
        When the file is missing or not a readable HDF5 file.
    """
    path = Path(path)
    info = DatasetInfo(str(path))
    if not path.is_file():
        raise DatasetError(f"dataset {path}: no such file" if not path.exists() else f"dataset {path}: not a file")
    try:
        with h5py.File(path, "r") as f:
            _inspect_open(f, info)
    except OSError as e:
        raise DatasetError(f"dataset {path}: cannot read it as HDF5 (truncated or corrupt?): {e}") from None
    return info


def _inspect_open(f: h5py.File, info: DatasetInfo) -> None:
    foreign = storage_problems(f)  # before anything is read through them
    if foreign:
        info.problems.extend(foreign)
        return
    v = f.attrs.get("cotsdl_format")
    info.format_version = int(v) if v is not None else None
    if info.format_version is not None and info.format_version > FORMAT_VERSION:
        info.problems.append(f"format version {info.format_version} is newer than this cotsdl's {FORMAT_VERSION}")
    try:
        info.recipe = json.loads(f.attrs.get("recipe", "{}"))
    except (TypeError, ValueError):
        info.recipe = str(f.attrs.get("recipe"))
    if "images" not in f:
        info.problems.append(f"no 'images' dataset (it holds: {', '.join(sorted(f.keys())) or 'nothing'})")
        return
    d = f["images"]
    if not isinstance(d, h5py.Dataset):
        info.problems.append("'images' is a group, not a dataset")
        return
    info.stored_shape, info.dtype, info.chunks, info.compression = tuple(d.shape), str(d.dtype), d.chunks, d.compression
    if d.ndim not in (3, 4):
        info.problems.append(f"'images' must be (N, H, W) or (N, H, W, C), got shape {d.shape}")
        return
    if np.dtype(d.dtype) not in DTYPES:
        info.problems.append(f"'images' must be uint8, float32 or float64, got dtype {d.dtype}")
    info.count = int(d.shape[0])
    info.image_shape = tuple(int(s) for s in d.shape[1:3]) + (int(d.shape[3]) if d.ndim == 4 else 1,)
    if info.count == 0 or min(info.image_shape) == 0:
        info.problems.append(f"'images' is empty (shape {d.shape})")
    if "labels" in f:
        lab = f["labels"]
        if not isinstance(lab, h5py.Dataset) or lab.shape != (info.count,) or not np.issubdtype(lab.dtype, np.integer):
            info.problems.append(f"'labels' must be ({info.count},) integers, got "
                                 f"{getattr(lab, 'shape', 'a group')} {getattr(lab, 'dtype', '')}")
        else:
            values, counts = np.unique(lab[()], return_counts=True)
            info.labels = {str(int(k)): int(c) for k, c in zip(values, counts)}
    _inspect_groups(f, info)
    _inspect_kinds(f, info)
    stats = [f.get(k) for k in ("image_mean", "image_std")]
    info.has_stats = all(isinstance(s, h5py.Dataset) and s.shape == (info.count,) for s in stats)
    if any(s is not None for s in stats) and not info.has_stats:
        info.problems.append(f"'image_mean'/'image_std' must both be ({info.count},) arrays")


def _column(f: h5py.File, key: str, info: DatasetInfo) -> np.ndarray | None:
    """The optional (N,) integer dataset ``key`` as int64, or None (absent, or malformed: a problem)."""
    if key not in f:
        return None
    d = f[key]
    if not isinstance(d, h5py.Dataset) or d.shape != (info.count,) or not np.issubdtype(d.dtype, np.integer):
        info.problems.append(f"'{key}' must be ({info.count},) integers, got "
                             f"{getattr(d, 'shape', 'a group')} {getattr(d, 'dtype', '')}")
        return None
    return d[()].astype(np.int64)


def _inspect_groups(f: h5py.File, info: DatasetInfo) -> None:
    groups = _column(f, "groups", info)
    if groups is not None:
        info.groups = int(len(np.unique(groups)))


def _inspect_kinds(f: h5py.File, info: DatasetInfo) -> None:
    codes = _column(f, "kinds", info)
    if codes is None:
        return
    try:
        names = json.loads(f["kinds"].attrs.get("kind_names", "null"))
    except (TypeError, ValueError):
        names = str(f["kinds"].attrs.get("kind_names"))
    problem = kind_names_problem(names) or _bad_codes(codes, names)
    if problem is None and "face" in names and info.labels is not None:
        disagree = int(np.sum((codes == names.index("face")) != (f["labels"][()] == 1)))
        if disagree:
            problem = f"'kinds' and 'labels' disagree on {disagree} image(s): kind \"face\" is label 1, no other"
    if problem:
        info.problems.append(problem)
        return
    info.kind_names = list(names)
    counts = np.bincount(codes, minlength=len(names))
    info.kinds = {n: int(c) for n, c in zip(names, counts)}


def check_for_network(info: DatasetInfo, input_shape: Sequence[int], global_batch: int | None = None,
                      needs_stats: bool = False) -> list[str]:
    """Why the dataset cannot feed a network with ``input_shape`` (H, W, C) and batch (empty: it can)."""
    out = list(info.problems)
    if not info.count:
        return out
    want = tuple(int(v) for v in input_shape)
    if info.image_shape != want:
        h, w, c = info.image_shape
        out.append(f"images are {h}x{w}x{c}, the network's input is {want[0]}x{want[1]}x{want[2]} (make a "
                   f"matching file: cotsdl prepare-data resize {info.path} OUT --size {want[0]} {want[1]} "
                   f"--channels {want[2]})")
    if global_batch is not None and info.count < global_batch:
        out.append(f"{info.count} image(s), fewer than one global batch of {global_batch}")
    if needs_stats and not info.has_stats:
        out.append("no per-image statistics ('image_mean', 'image_std'), which preprocessing needs "
                   "(add them: cotsdl prepare-data stats FILE, or set data.preprocess = \"none\")")
    return out
