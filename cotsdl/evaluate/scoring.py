"""Honest face-selectivity scores: a neuron and its threshold are chosen on one half
of the images and measured on the other.

Every neuron's responses to N labeled images (faces = 1, distractors = 0) form a
column of ``R`` (N images x M neurons).  A neuron classifies in one of two
polarities: "face iff r >= t" (it fires more for faces) or "face iff r < t" (it
is silenced by faces: after pooling and contrast normalization a unit tuned to
what faces lack is as informative as one tuned to faces).  Picking the best of
many thousands of neurons, its polarity and its threshold on a few hundred images
inflates the score, so the selection is made on one half of a split (whole
groups: :mod:`.splits`) and the score is measured on the other, over ``k`` splits.  Classes are
unbalanced, so neurons and thresholds are chosen by balanced accuracy
((TPR + TNR) / 2); plain accuracy is reported beside it.

Pure numpy: distributed callers pass ``combine`` (which picks the global best
candidate across processes) and global neuron ids, so the result does not depend
on how the neurons are split over processes.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import ridge
from .splits import group_splits

# Columns sorted at a time: bounds the (columns x images) temporaries (~ a few MiB each).
_CHUNK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class Candidate:
    """The best neuron of some set on a selection half, with its test-half metrics.

    Attributes
    ----------
    score : float
        Balanced accuracy on the selection rows.
    neuron : int
        Global neuron id.
    threshold : float
        Chosen on the selection rows.
    test_acc, test_balanced_acc : float
        Accuracy and balanced accuracy of the rule on the test rows.
    polarity : int
        1: "face iff r >= threshold"; -1: "face iff r < threshold".
    """

    score: float
    neuron: int
    threshold: float
    test_acc: float
    test_balanced_acc: float
    polarity: int = 1


def better(a: Candidate, b: Candidate) -> bool:
    """True when ``a`` beats ``b``: higher score, ties to the smaller global neuron id, then to polarity 1."""
    return (a.score, -a.neuron, a.polarity) > (b.score, -b.neuron, b.polarity)


def rule(r: Any, threshold: float, polarity: int = 1) -> np.ndarray:
    """The images a neuron calls faces: r >= threshold (polarity 1) or r < threshold (polarity -1)."""
    face = np.asarray(r) >= threshold
    return face if polarity > 0 else ~face


def _labels(y: Any, n: int | None = None) -> np.ndarray:
    """``y`` as a boolean vector (True = face); checks it is 0/1 and that both classes occur."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"labels must be a vector; got shape {y.shape}")
    if n is not None and len(y) != n:
        raise ValueError(f"{len(y)} labels for {n} images")
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("labels must be 1 (face) or 0 (distractor)")
    y = y.astype(bool)
    _check_classes(int(y.sum()), int((~y).sum()))
    return y


def _check_classes(faces: int, distractors: int, where: str = "") -> None:
    if faces == 0 or distractors == 0:
        raise ValueError(f"scoring needs both faces (label 1) and distractors (label 0){where}; "
                         f"got {faces} faces and {distractors} distractors")


def _matrix(R: Any) -> np.ndarray:
    R = np.asarray(R)
    if R.ndim != 2:
        raise ValueError(f"responses must be (images x neurons); got shape {R.shape}")
    if not np.issubdtype(R.dtype, np.floating):
        R = R.astype(np.float64)
    return R


def _midpoint(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A threshold t with a < t <= b for a < b, exact in the responses' own dtype.

    Halves first so huge values do not overflow; for adjacent floats the midpoint
    rounds onto a (or out of range), and then b itself splits them.
    """
    with np.errstate(over="ignore", under="ignore"):
        m = a / 2 + b / 2
    return np.where((m > a) & (m <= b), m, b)


def _scan(V: np.ndarray, y: np.ndarray, masks: Sequence[np.ndarray]):
    """Best threshold of every row of ``V`` (columns x images) on each row mask of images.

    Each column is sorted once; its dense ranks (equal values, equal rank) then
    order any subset of images by a fast integer sort of rank * 2^b + position.
    Boundary i calls the top n - i selected images faces; it is a valid split
    only where sorted ranks i - 1 and i differ (equal responses cannot be split).

    Returns, per mask, (numerator, threshold, tp, tn, P, D, neg_numerator,
    neg_threshold): the balanced accuracy is numerator / (2 P D), an exact integer
    so that equal scores compare equal, and argmax takes the first best, the lowest
    threshold.  The other polarity ("face iff r < t") at the same boundary scores
    2 P D - numerator (it swaps every call), so its best is the valid boundary
    with the smallest numerator: no second sort.
    """
    C, N = V.shape
    order = np.argsort(V, axis=1)
    vs = np.take_along_axis(V, order, axis=1)
    # rank * 2^b + position < 2 N^2: int32 (half the memory traffic) up to 30k images
    it = np.int32 if N < 30_000 else np.int64
    g = np.zeros((C, N), it)  # dense rank in sorted order
    np.cumsum(vs[:, 1:] != vs[:, :-1], axis=1, out=g[:, 1:])
    del vs
    rank = None
    rows = np.arange(C)
    out = []
    for m in masks:
        idx = np.flatnonzero(m)
        n = len(idx)
        ym = y[idx]
        P = int(ym.sum())
        D = n - P
        if n == N:
            gs, pos = g, order
        else:
            if rank is None:  # dense rank of every image, in image order
                rank = np.empty_like(g)
                np.put_along_axis(rank, order, g, axis=1)
            b = max(1, (n - 1).bit_length())
            key = np.take(rank, idx, axis=1) << b
            key |= np.arange(n, dtype=it)
            key.sort(axis=1)
            gs, pos = key >> b, key & ((1 << b) - 1)
        # numerators below P (D + n) < 2 N^2 fit the same integer type
        cf = np.zeros((C, n + 1), it)  # faces below boundary i
        np.cumsum(ym[pos], axis=1, out=cf[:, 1:])
        i = np.arange(n + 1, dtype=it)
        # tp = P - cf, tn = i - cf:  tp D + tn P = P (D + i) - n cf
        num = P * (D + i) - n * cf
        num[:, 1:n][gs[:, 1:] == gs[:, :-1]] = -1
        best = np.argmax(num, axis=1)
        c = cf[rows, best].astype(np.int64)
        thr = _threshold(V, idx, pos, best, n)
        # the other polarity: 2PD - num where valid, so the valid minimum of num (-1 marks invalid)
        neg = np.argmin(np.where(num < 0, np.iinfo(it).max, num), axis=1)
        out.append((num[rows, best].astype(np.int64), thr, P - c, best - c, P, D,
                    2 * P * D - num[rows, neg].astype(np.int64), _threshold(V, idx, pos, neg, n)))
    return out


def _threshold(V: np.ndarray, idx: np.ndarray, pos: np.ndarray, best: np.ndarray, n: int) -> np.ndarray:
    """The threshold of boundary ``best`` of every row: the top n - best selected images lie at or above it."""
    rows = np.arange(len(V))
    lo = V[rows, idx[pos[rows, np.maximum(best - 1, 0)]]]
    hi = V[rows, idx[pos[rows, np.minimum(best, n - 1)]]]
    thr = np.where(best == 0, hi,  # at the min: everything face
                   np.where(best == n, np.nextafter(lo, np.asarray(np.inf, V.dtype)),  # above the max
                            _midpoint(lo, hi)))
    return thr.astype(np.float64)


def _chunks(R: np.ndarray, ids: np.ndarray | None = None):
    """(start, columns x images contiguous block) over the columns of R; checks finiteness."""
    N, M = R.shape
    step = max(1, _CHUNK_ELEMENTS // max(N, 1))
    for c0 in range(0, M, step):
        V = np.ascontiguousarray(R[:, c0:c0 + step].T)
        bad = ~np.isfinite(V).all(axis=1)
        if bad.any():
            j = c0 + int(np.argmax(bad))
            raise ValueError(f"non-finite response in column {j}" + ("" if ids is None else f" (neuron {ids[j]})"))
        yield c0, V


def best_thresholds(R: Any, y: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The best "face iff r >= t" rule of every neuron, by balanced accuracy.

    Parameters
    ----------
    R : (N, M) array
        Responses of M neurons to N images.
    y : (N,) array of 0/1
        1 = face, 0 = distractor; both must occur.

    Returns
    -------
    thresholds, balanced_acc, acc : (M,) float64 arrays
        Thresholds lie between consecutive distinct responses, at the minimum
        (everything face) or just above the maximum (everything distractor); of
        equally good thresholds the lowest.  A constant column scores 0.5.
    """
    R = _matrix(R)
    N, M = R.shape
    y = _labels(y, N)
    thr, bal, acc = np.empty(M), np.empty(M), np.empty(M)
    everything = np.ones(N, bool)
    for c0, V in _chunks(R):
        num, t, tp, tn, P, D = _scan(V, y, [everything])[0][:6]
        sl = slice(c0, c0 + len(V))
        thr[sl], bal[sl], acc[sl] = t, num / (2 * P * D), (tp + tn) / N
    return thr, bal, acc


def apply_threshold(r: Any, y: Any, t: float, polarity: int = 1) -> tuple[float, float]:
    """(accuracy, balanced accuracy) of the rule ``t``, ``polarity`` (:func:`rule`) on responses ``r``."""
    r = np.asarray(r)
    y = _labels(y, len(r))
    return _accuracies(rule(r, t, polarity), y)


def _accuracies(face: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(accuracy, balanced accuracy) of the bool calls ``face`` against bool labels ``y``."""
    tpr = np.count_nonzero(face & y) / np.count_nonzero(y)
    tnr = np.count_nonzero(~face & ~y) / np.count_nonzero(~y)
    return float(np.mean(face == y)), float((tpr + tnr) / 2)


def stratified_splits(y: Any, k: int, seed: int, groups: Any = None,
                      kinds: Any = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """``k`` deterministic (selection_idx, test_idx) halves of the images, per class.

    For split s, the distractors and then the faces are each permuted by
    ``np.random.default_rng([seed, s])``; selection gets floor(n/2) of each class,
    test the rest.  Index arrays are sorted; the halves are disjoint and cover all
    images.  With ``groups`` (and ``kinds``) the halves are made of whole groups:
    :func:`.splits.group_splits`, which this is with one image per group.
    """
    return group_splits(np.asarray(y), k, seed, groups, kinds)


def _candidates(R: np.ndarray, y: np.ndarray, splits: Sequence[tuple[np.ndarray, np.ndarray]],
                ids: np.ndarray) -> list[Candidate | None]:
    """The local candidate of every split (either polarity), sorting each column once for all splits."""
    N, M = R.shape
    masks = []
    for sel, _ in splits:
        m = np.zeros(N, bool)
        m[sel] = True
        # check here, before any M-dependent work, so every process fails alike
        _check_classes(int((m & y).sum()), int((m & ~y).sum()), " in the selection half")
        masks.append(m)
    best: list[tuple | None] = [None] * len(splits)  # (numerator, -id, polarity, column, threshold)
    for c0, V in _chunks(R, ids):
        for i, (num, thr, _, _, _, _, neg, neg_thr) in enumerate(_scan(V, y, masks)):
            for pol, n_, t_ in ((1, num, thr), (-1, neg, neg_thr)):
                top = n_.max()
                cols = np.flatnonzero(n_ == top)
                j = cols[np.argmin(ids[c0 + cols])]  # ties: smallest global id
                cand = (int(top), -int(ids[c0 + j]), pol, c0 + int(j), float(t_[j]))
                if best[i] is None or cand[:3] > best[i][:3]:  # then polarity 1 (see better)
                    best[i] = cand
    out = []
    for (sel, test), m, b in zip(splits, masks, best):
        if b is None:
            out.append(None)
            continue
        num, neg_id, pol, j, t = b
        P, D = int((m & y).sum()), int((m & ~y).sum())
        acc, bal = apply_threshold(R[test, j], y[test], t, pol)
        out.append(Candidate(num / (2 * P * D), -neg_id, t, acc, bal, pol))
    return out


def local_candidate(R: Any, y: Any, sel: Any, test: Any, ids: Any) -> Candidate | None:
    """The best column of ``R`` chosen on rows ``sel``, measured on rows ``test``.

    Parameters
    ----------
    R : (N, M) array
        Responses of this process's neurons to all N images.
    y : (N,) array of 0/1
    sel, test : index arrays
        Distinct selection rows and test rows.
    ids : (M,) int array
        Global neuron id of each column (ties go to the smallest).

    Returns
    -------
    Candidate or None
        None when M = 0.
    """
    R = _matrix(R)
    y = _labels(y, R.shape[0])
    return _candidates(R, y, [(np.asarray(sel), np.asarray(test))], np.asarray(ids))[0]


def _identity(c: Candidate | None) -> Candidate | None:
    return c


def honest_scores(R: Any, y: Any, k: int = 20, seed: int = 0, ids: Any = None,
                  combine: Callable[[Candidate | None], Candidate | None] | None = None,
                  splits: Sequence[tuple[np.ndarray, np.ndarray]] | None = None) -> dict[str, Any]:
    """Held-out scores of the best neuron over ``k`` stratified splits.

    On each split the best neuron, polarity and threshold are chosen on the selection half
    and scored on the test half; ``combine`` (default identity) turns this
    process's candidate, or None when it has no neurons, into the global best and
    is called on every split and once more for ``in_sample``.

    Parameters
    ----------
    R : (N, M) array
        Responses of this process's neurons to all N images.
    y : (N,) array of 0/1
    k, seed : int
        Splits of :func:`stratified_splits`.
    ids : (M,) int array, optional
        Global neuron ids of the columns; default 0..M-1.
    combine : callable, optional
        Candidate-or-None -> global best Candidate (every process calls it alike).
    splits : list of (selection, test) index arrays, optional
        Given splits (e.g. by group) instead of ``k`` and ``seed``'s.

    Returns
    -------
    dict
        ``splits``; per split ``test_acc``, ``test_balanced_acc``, ``neurons``,
        ``thresholds``, ``polarities`` (:func:`rule`); ``mean_/std_balanced_acc``
        and ``mean_/std_acc`` over splits (population std); ``in_sample``: the
        neuron chosen and scored on ALL images (``neuron``, ``threshold``,
        ``polarity``, ``acc``, ``balanced_acc``), the optimistic number the
        papers report, for comparison only.
    """
    R = _matrix(R)
    y = _labels(y, R.shape[0])
    splits = stratified_splits(y, k, seed) if splits is None else splits
    return summarize(honest_candidates(R, y, splits, ids, combine))


def honest_candidates(R: Any, y: Any, splits: Sequence[tuple[np.ndarray, np.ndarray]], ids: Any = None,
                      combine: Callable[[Candidate | None], Candidate | None] | None = None) -> list[Candidate]:
    """The global best Candidate of every split, then the in-sample one (see :func:`honest_scores`)."""
    R = _matrix(R)
    N, M = R.shape
    y = _labels(y, N)
    ids = np.arange(M) if ids is None else np.asarray(ids)
    if len(ids) != M:
        raise ValueError(f"{len(ids)} ids for {M} neurons")
    combine = combine or _identity
    splits = [(np.asarray(a), np.asarray(b)) for a, b in splits]
    everything = np.arange(N)
    chosen = []
    for c in _candidates(R, y, splits + [(everything, everything)], ids):
        g = combine(c)
        if g is None:
            raise ValueError("no neurons to score")
        chosen.append(g)
    return chosen


def best_of(*sets: list[Candidate]) -> list[Candidate]:
    """Split by split, the best of several sets' candidates (:func:`better`): the candidates of all
    neurons from those of each layer, without scanning the neurons again."""
    out = []
    for cands in zip(*sets):
        best = cands[0]
        for c in cands[1:]:
            if better(c, best):
                best = c
        out.append(best)
    return out


def summarize(chosen: list[Candidate]) -> dict[str, Any]:
    """The dict of :func:`honest_scores` from the candidates of every split and the in-sample one."""
    *chosen, ins = chosen
    acc = [c.test_acc for c in chosen]
    bal = [c.test_balanced_acc for c in chosen]
    return {"splits": len(chosen), "test_acc": acc, "test_balanced_acc": bal,
            "neurons": [int(c.neuron) for c in chosen], "thresholds": [float(c.threshold) for c in chosen],
            "polarities": [int(c.polarity) for c in chosen],
            "mean_balanced_acc": float(np.mean(bal)), "std_balanced_acc": float(np.std(bal)),
            "mean_acc": float(np.mean(acc)), "std_acc": float(np.std(acc)),
            "in_sample": {"neuron": int(ins.neuron), "threshold": float(ins.threshold), "polarity": int(ins.polarity),
                          "acc": float(ins.test_acc), "balanced_acc": float(ins.test_balanced_acc)}}


def _balanced_list(s: Any) -> np.ndarray:
    return np.asarray(s["test_balanced_acc"] if isinstance(s, Mapping) else s, dtype=np.float64)


def paired_verdict(net_scores: Any, control_scores: Any) -> dict[str, Any]:
    """Does the network beat a control by more than the split-to-split spread?

    Parameters
    ----------
    net_scores, control_scores : dict or sequence
        Results of :func:`honest_scores` (or :func:`linear_probe`) on the same
        splits and seed, or their ``test_balanced_acc`` lists.

    Returns
    -------
    dict
        ``mean_diff`` and ``std_diff`` (population std) of the per-split
        differences net - control of test balanced accuracy; ``beats``:
        mean_diff > std_diff.
    """
    a, b = _balanced_list(net_scores), _balanced_list(control_scores)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired scores need the same splits; got {a.size} and {b.size}")
    d = a - b
    mean, std = float(d.mean()), float(d.std())
    return {"mean_diff": mean, "std_diff": std, "beats": bool(mean > std)}


def split_scores(calls: Any, y: Any, splits: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """Held-out scores of fixed per-split calls: ``calls[s]`` (N,) bool, scored on split s's test half.

    Returns the keys of :func:`linear_probe`."""
    y = np.asarray(y).astype(bool)
    acc, bal = [], []
    for c, (_, test) in zip(np.asarray(calls, bool), splits):
        a, b = _accuracies(c[test], y[test])
        acc.append(a)
        bal.append(b)
    return {"splits": len(acc), "test_acc": acc, "test_balanced_acc": bal,
            "mean_balanced_acc": float(np.mean(bal)), "std_balanced_acc": float(np.std(bal)),
            "mean_acc": float(np.mean(acc)), "std_acc": float(np.std(acc))}


def probe_calls(X: Any, y: Any, splits: Sequence[tuple[np.ndarray, np.ndarray]], l2: float = 1e-3) -> np.ndarray:
    """The calls (k, N) bool of the linear probe fitted on each split's selection half, on every image
    (:mod:`.ridge`: one Gram matrix of the standardized features serves every split)."""
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"features must be (images x features); got shape {X.shape}")
    y = _labels(y, X.shape[0])
    for sel, _ in splits:
        _check_classes(int(y[sel].sum()), int((~y[sel]).sum()), " in the selection half")
    return ridge.calls(ridge.gram(X), y, splits, l2)


def linear_probe(X: Any, y: Any, k: int, seed: int, l2: float = 1e-3,
                 splits: Sequence[tuple[np.ndarray, np.ndarray]] | None = None) -> dict[str, Any]:
    """A linear classifier on all features, over the same splits.

    Standardize each feature over all images (no labels: :mod:`.ridge`), then on
    each split fit ridge least squares to targets +-1 with class-balanced sample
    weights on the selection half, classify by sign (threshold 0), and score on
    the test half.

    Parameters
    ----------
    X : (N, F) array
        Features of N images (F may far exceed N).
    y : (N,) array of 0/1
    k, seed : int
        Splits of :func:`stratified_splits`.
    l2 : float
        Ridge penalty relative to the mean squared row norm of the weighted,
        centered selection features.
    splits : list of (selection, test) index arrays, optional
        Given splits instead of ``k`` and ``seed``'s.

    Returns
    -------
    dict
        ``splits``, ``test_acc``, ``test_balanced_acc``, ``mean_/std_balanced_acc``,
        ``mean_/std_acc`` as in :func:`honest_scores`.
    """
    y = np.asarray(y)
    splits = stratified_splits(y, k, seed) if splits is None else splits
    return split_scores(probe_calls(X, y, splits, l2), y, splits)
