"""What a labeled set says about its images beyond the labels: groups (identities) and kinds.

The ``faces`` builder records each image's group (the augmented views of one face,
and the phase-scrambled distractor made from it, share one) and kind (``face``,
``phase_scrambled``, ``matched_crop``, ...).  Older files have neither: then every
image is its own group and the kinds are ``face`` (label 1) and ``distractor``.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

#: The kinds of a labeled file that records none (label 1, label 0).
DEFAULT_KIND_NAMES = ("face", "distractor")


def _from_file(path: Any, key: str) -> tuple[np.ndarray | None, Any]:
    """The (N,) dataset ``key`` of the file and its ``kind_names`` attribute, or (None, None)."""
    import h5py  # noqa: PLC0415

    with h5py.File(path, "r") as f:
        if key not in f:
            return None, None
        return f[key][()], f[key].attrs.get("kind_names")


def groups_and_kinds(source: Any, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """(groups, kinds, kind_names) of the labeled images of ``source``, with defaults where absent.

    Takes them from the reader (``groups()``, ``kinds()``, ``kind_names``) or, for a
    reader without them, from the file at ``source.path``.  Raises ValueError when
    they do not fit the images (the same on every process: the same file).
    """
    n = len(y)
    if hasattr(source, "groups"):
        groups, kinds, names = source.groups(), source.kinds(), source.kind_names
    elif getattr(source, "path", None) is not None:
        groups = _from_file(source.path, "groups")[0]
        kinds, names = _from_file(source.path, "kinds")
        names = None if names is None else json.loads(names)
    else:
        groups = kinds = names = None
    groups = np.arange(n) if groups is None else np.asarray(groups)
    if kinds is None or names is None:
        kinds, names = np.where(np.asarray(y) == 1, 0, 1), DEFAULT_KIND_NAMES
    kinds, names = np.asarray(kinds).astype(np.int64), tuple(str(v) for v in names)
    if groups.shape != (n,) or not np.issubdtype(groups.dtype, np.integer):
        raise ValueError(f"dataset {source.path}: 'groups' must be {n} integers, got {groups.shape} {groups.dtype}")
    if kinds.shape != (n,) or (n and (kinds.min() < 0 or kinds.max() >= len(names))):
        raise ValueError(f"dataset {source.path}: 'kinds' must be {n} codes into kind_names {list(names)}")
    return groups.astype(np.int64), kinds, names


def distractor_kinds(y: np.ndarray, kinds: np.ndarray, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each distractor kind present, in code order: name -> mask of its (label 0) images."""
    y = np.asarray(y)
    out = {}
    for code, name in enumerate(names):
        mask = (kinds == code) & (y == 0)
        if mask.any():
            out[name] = mask
    return out
