"""What a labeled set says about its images beyond the labels: groups (identities) and kinds.

The ``faces`` builder records each image's group (the augmented views of one face,
and the phase-scrambled distractor made from it, share one) and kind (``face``,
``phase_scrambled``, ``matched_crop``, ...).  Older files have neither: then every
image is its own group and the kinds are ``face`` (label 1) and ``distractor``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..io.dataset import DEFAULT_KIND_NAMES


def groups_and_kinds(source: Any, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """(groups, kinds, kind_names) of the labeled images of ``source``, with defaults where absent.

    Takes them from the reader (``HDF5Source.groups()``, ``kinds()``, ``kind_names``);
    a source without them (an in-memory one) gets the defaults.  Raises ValueError
    when they do not fit the images (the same on every process: the same file).
    """
    n = len(y)
    if hasattr(source, "groups"):
        groups, kinds, names = source.groups(), source.kinds(), source.kind_names
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
