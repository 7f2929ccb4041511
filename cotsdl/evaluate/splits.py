"""Selection/test halves of a labeled set that never split a group.

Augmented views of one face, and a phase-scrambled distractor made from that face,
share a group (an identity).  Views of an identity are strongly correlated, so a
neuron chosen on some views and scored on other views of the same identity would
be scored on images it has in effect already seen.  The halves are therefore made
of whole groups, stratified by what a group holds (its labels and distractor
kinds) so that both halves get about half of every class and kind, as far as the
groups allow.

Pure numpy and deterministic: every process computes the same halves.
"""
from __future__ import annotations

import numpy as np


def dense(groups: np.ndarray) -> tuple[np.ndarray, int]:
    """Group ids as 0..G-1 in the order of their first image, and G (ids may be any integers)."""
    groups = np.asarray(groups)
    _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse.ravel()], len(first)


def _strata(y: np.ndarray, kinds: np.ndarray, g: np.ndarray, G: int) -> np.ndarray:
    """The stratum of every group: its set of (label, kind) pairs; a stratum of one group is merged.

    Strata are numbered in the sorted order of their keys, so that with one image
    per group and no kinds the distractors come first and then the faces, as the
    plain per-class split draws them (:func:`group_splits` reproduces it exactly).
    """
    pairs = np.unique(np.stack([g, y.astype(np.int64), np.asarray(kinds, np.int64)], axis=1), axis=0)
    fine: list[list] = [[] for _ in range(G)]
    for gi, label, kind in pairs:
        fine[gi].append((int(label), int(kind)))
    keys = [(0, tuple(key)) for key in fine]
    labels = {key: tuple(sorted({label for label, _ in key[1]})) for key in set(keys)}
    # A stratum of one group would always land on the same side: it joins the largest stratum with
    # the same labels, else (a lone label set) all such go together, and a last lone one joins the largest.
    count = _counts(keys)
    for i, key in enumerate(keys):
        if count[key] == 1:
            kin = [k for k in count if count[k] > 1 and labels[k] == labels[key]]
            keys[i] = max(kin, key=lambda k: (count[k], [-v for v in _flat(k)])) if kin else (1, ())
    count = _counts(keys)
    if count.get((1, ()), 0) == 1 and len(count) > 1:
        big = max((k for k in count if k != (1, ())), key=lambda k: (count[k], [-v for v in _flat(k)]))
        keys = [big if k == (1, ()) else k for k in keys]
    index = {key: i for i, key in enumerate(sorted(set(keys)))}
    return np.array([index[key] for key in keys], np.int64)


def _counts(keys: list) -> dict:
    out: dict = {}
    for key in keys:
        out[key] = out.get(key, 0) + 1
    return out


def _flat(key: tuple) -> list[int]:
    """A stratum key as integers, for deterministic tie-breaking."""
    return [key[0]] + [v for pair in key[1] for v in pair]


def group_splits(y, k: int, seed: int, groups=None, kinds=None) -> list[tuple[np.ndarray, np.ndarray]]:
    """``k`` deterministic (selection_idx, test_idx) halves made of whole groups.

    For split s, the groups of each stratum (see :func:`_strata`) are permuted by
    ``np.random.default_rng([seed, s])``, strata in order; a group goes to the
    selection half while the images before it plus half its own stay within
    floor(half the stratum's images), the rest to the test half.  With one image
    per group and no kinds this is the plain per-class split: floor(n/2) of each
    class to selection, the rest to test.

    Parameters
    ----------
    y : (N,) array of 0/1
    k, seed : int
    groups : (N,) int array, optional
        The group (identity) of every image; default: every image its own group.
    kinds : (N,) int array, optional
        The kind of every image (e.g. which distractor builder made it); default:
        the label.

    Returns
    -------
    list of (selection, test)
        Sorted index arrays; disjoint, covering all images; no group on both sides.
    """
    y = np.asarray(y).astype(np.int64)
    N = len(y)
    g, G = dense(np.arange(N) if groups is None else groups)
    kinds = y if kinds is None else np.asarray(kinds)
    if len(g) != N or len(kinds) != N:
        raise ValueError(f"{len(g)} groups and {len(kinds)} kinds for {N} images")
    stratum = _strata(y, kinds, g, G)
    size = np.bincount(g, minlength=G)
    members = [np.flatnonzero(stratum == s) for s in range(int(stratum.max()) + 1)]
    out = []
    for s in range(k):
        rng = np.random.default_rng([seed, s])
        selected = np.zeros(G, bool)
        for m in members:
            p = rng.permutation(m)  # groups in order of first image: one image per group permutes like images
            before = np.cumsum(size[p]) - size[p]
            selected[p] = 2 * before + size[p] <= 2 * (int(size[p].sum()) // 2)
        sel = selected[g]
        out.append((np.flatnonzero(sel), np.flatnonzero(~sel)))
    return out


def split_error(y, splits) -> str | None:
    """Why some half lacks a class (too few groups of faces or distractors), or None."""
    y = np.asarray(y).astype(bool)
    for s, halves in enumerate(splits):
        for name, idx in zip(("selection", "test"), halves):
            f = int(y[idx].sum())
            if f == 0 or f == len(idx):
                return (f"split {s + 1}: the {name} half has {f} face(s) and {len(idx) - f} distractor(s); "
                        "halves are made of whole groups (identities), so the labeled set needs at least 2 "
                        "groups with faces and 2 with distractors")
    return None
