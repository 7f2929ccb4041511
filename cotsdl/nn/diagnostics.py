"""Does a stage learn structure?  Gabor-likeness, drift from init, norms, silent units.

Weights have the layout ``(SH, SW, M, rh, rw, C)``: SH x SW sites, M units per
site, each unit an ``rh x rw x C`` filter.  Activations are ``(H, W, K, N)``.
Everything here is numpy/scipy; ``stage_filter_stats`` takes an mpi4py
communicator but only calls its lowercase collectives.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..checks import integral, pair, positive_int, real
from .gabor import GaborFit, gabor_fit, gabor_model

__all__ = ["GaborFit", "gabor_fit", "gabor_model", "gabor_fraction", "cosines", "unit_norms", "silent_units",
           "sample_units", "stage_filter_stats"]


def _weights(name: str, w: Any) -> np.ndarray:
    w = np.asarray(w)
    if w.ndim != 6:
        raise ValueError(f"{name} must be (SH, SW, M, rh, rw, C), got shape {w.shape}")
    if w.dtype.kind != "f":
        raise ValueError(f"{name} must be a float array, got dtype {w.dtype}")
    return w


def _options(threshold: Any, sample: Any, seed: Any) -> tuple[float, int, int]:
    t = real("threshold", threshold)
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
    if not integral(seed) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return t, positive_int("sample", sample), int(seed)


def sample_units(sites_shape: Sequence[int], units: int, sample: int, seed: int) -> np.ndarray:
    """The sampled units' flat indices into ``(SH, SW, M)`` (C order), sorted: all when there are few.

    Depends on the global shape and the seed alone, so every grid split samples the same units.
    """
    total = int(np.prod(sites_shape)) * int(units)
    if total <= sample:
        return np.arange(total, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(total, size=sample, replace=False)).astype(np.int64)


def _fit(w: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(r2, oriented) of the units at local flat indices ``idx`` into w's (SH, SW, M)."""
    flat = w.reshape((int(np.prod(w.shape[:3])),) + w.shape[3:])
    fits = [gabor_fit(flat[i]) for i in idx]
    return (np.array([g.r2 for g in fits], dtype=np.float64),
            np.array([g.oriented for g in fits], dtype=bool))


def _summary(r2: np.ndarray, oriented: np.ndarray, threshold: float) -> dict:
    good = r2 >= threshold
    return {"fraction": float(good.mean()), "oriented": float((good & oriented).mean()),
            "median_r2": float(np.median(r2)), "fitted": int(r2.size)}


def gabor_fraction(w: np.ndarray, threshold: float = 0.5, sample: int = 256, seed: int = 0) -> dict:
    """How Gabor-like a stage's filters are, on a seeded sample of units.

    Parameters
    ----------
    w : ndarray, float, (SH, SW, M, rh, rw, C)
        Filters, rh, rw >= 3; with C > 1 the channel sum is fitted (see ``gabor_fit``).
    threshold : float
        A unit is Gabor-like when its fit explains at least this share of its variance.
    sample, seed :
        Units fitted: ``sample`` drawn without replacement by ``seed`` (all if fewer).

    Returns
    -------
    dict
        ``fraction`` (share with r2 >= threshold), ``oriented`` (share that is
        Gabor-like and ``GaborFit.oriented``: an edge or bar, not a blob),
        ``median_r2``, ``fitted`` (units fitted).
    """
    w = _weights("w", w)
    threshold, sample, seed = _options(threshold, sample, seed)
    if w.shape[0] * w.shape[1] * w.shape[2] == 0:
        raise ValueError(f"w has no units, shape {w.shape}")
    idx = sample_units(w.shape[:2], w.shape[2], sample, seed)
    return _summary(*_fit(w, idx), threshold)


#: float64 bytes of the units' rows converted at a time: a copy of all of them was 2x the layer's
#: float32 weights, and the cosines held three (1.5 GiB per rank for the 185M-parameter paper network
#: on 2 ranks: the peak of the whole run, at every log line).
PIECE_BYTES = 8 << 20


def _pieces(w: np.ndarray) -> tuple[np.ndarray, list[slice]]:
    """w as one row per unit, (SH*SW*M, rh*rw*C) (a view of a contiguous w), and runs of whole rows
    of about :data:`PIECE_BYTES` in float64."""
    rows = w.reshape(-1, int(np.prod(w.shape[3:])))
    step = max(1, PIECE_BYTES // (8 * rows.shape[1]))
    return rows, [slice(i, i + step) for i in range(0, rows.shape[0], step)]


def _rows(rows: np.ndarray) -> np.ndarray:
    """Rows as a fresh C-contiguous float64 copy."""
    return np.ascontiguousarray(rows, dtype=np.float64)


def _dots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # A row-wise reduce sums each row the same way wherever it sits (numpy's pairwise sum
    # depends on the row length only), so a unit's value does not depend on the grid split
    # or on the piece it is computed in.
    return (a * b).sum(axis=-1)


def unit_norms(w: np.ndarray) -> np.ndarray:
    """Every unit's filter norm (over rh, rw, C): shape (SH, SW, M), float64."""
    w = _weights("w", w)
    rows, pieces = _pieces(w)
    out = np.empty(rows.shape[0])
    for s in pieces:  # float64 a piece at a time: no weight-sized copies
        a = _rows(rows[s])
        out[s] = np.sqrt(_dots(a, a))
    return out.reshape(w.shape[:3])


def cosines(w: np.ndarray, w0: np.ndarray) -> np.ndarray:
    """Cosine of every unit's filter to its initial filter ``w0``: shape (SH, SW, M), float64.

    0 where either filter is zero (no direction to compare).
    """
    w, w0 = _weights("w", w), _weights("w0", w0)
    if w.shape != w0.shape:
        raise ValueError(f"w0 must have w's shape {w.shape}, got {w0.shape}")
    rows, pieces = _pieces(w)
    rows0 = w0.reshape(rows.shape)
    dot, den = np.empty(rows.shape[0]), np.empty(rows.shape[0])
    for s in pieces:  # float64 a piece at a time: no weight-sized copies
        a, b = _rows(rows[s]), _rows(rows0[s])
        den[s] = np.sqrt(_dots(a, a)) * np.sqrt(_dots(b, b))
        dot[s] = _dots(a, b)
    out = np.divide(dot, den, out=np.zeros(den.shape), where=den > 0)
    return np.clip(out, -1.0, 1.0).reshape(w.shape[:3])  # rounding can leave |cos| a hair above 1


def silent_units(h: np.ndarray, rel: float = 0.05) -> np.ndarray:
    """Units that stay quiet over a batch: shape (H, W, K), bool.

    A unit (position, channel) is silent when its largest ``|h|`` over the N
    images is below ``rel`` times the median of that statistic over all units, or
    exactly 0.  Relative, because the outputs of linear filters (and of pooling
    with an epsilon) are almost never exactly 0: an absolute test would find
    nothing, and the scale of ``h`` depends on the stage and the weights' norm.

    Parameters
    ----------
    h : ndarray, float, (H, W, K, N)
        Activations of one stage on a (held-out) batch, N >= 1.
    rel : float
        In [0, 1).
    """
    h = np.asarray(h)
    if h.ndim != 4 or h.shape[3] < 1:
        raise ValueError(f"h must be (H, W, K, N) with N >= 1, got shape {h.shape}")
    if h.dtype.kind != "f":
        raise ValueError(f"h must be a float array, got dtype {h.dtype}")
    r = real("rel", rel)
    if not 0.0 <= r < 1.0:
        raise ValueError(f"rel must be in [0, 1), got {rel!r}")
    peak = np.abs(h).max(axis=3).astype(np.float64)
    if not np.all(np.isfinite(peak)):
        raise ValueError("h has non-finite values")
    if peak.size == 0:
        return np.zeros(peak.shape, bool)
    return (peak < r * float(np.median(peak))) | (peak == 0)


def _agree(comm: Any, problem: str | None) -> None:
    """Raise the same ValueError on every rank when any rank found a problem (no rank left in a collective)."""
    problems = [p for p in comm.allgather(problem) if p]
    if problems:
        raise ValueError("stage_filter_stats: " + "; ".join(sorted(set(problems))))


def _gathered(comm: Any, keys: np.ndarray, *values: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every rank's (keys, values) gathered and sorted by key: the same arrays, in the same order, on any split."""
    parts = comm.allgather((keys, *values))
    k = np.concatenate([p[0] for p in parts])
    order = np.argsort(k, kind="stable")
    return (k[order],) + tuple(np.concatenate([p[i + 1] for p in parts])[order] for i in range(len(values)))


def stage_filter_stats(comm: Any, w_local: np.ndarray, w0_local: np.ndarray, sites_lo: Sequence[int],
                       sites_shape: Sequence[int], sample: int = 256, seed: int = 0,
                       threshold: float = 0.5) -> dict:
    """A stage's filter diagnostics over every rank: the same numbers on any grid split.

    Collective over ``comm``.  Each rank holds whole sites: ``w_local`` is the box
    ``[lo0:lo0+h, lo1:lo1+w]`` of the global ``(SH, SW) = sites_shape`` (possibly
    empty); the boxes must tile the sites.  The Gabor sample is drawn from the seed
    and the global shape alone (``sample_units``), each rank fits the sampled units it
    holds, and the results are gathered and ordered by global index, so a one-rank
    call gives exactly ``gabor_fraction(w, threshold, sample, seed)``.

    Returns
    -------
    dict of plain numbers
        ``gabor_fraction``, ``oriented_fraction``, ``median_r2``, ``fitted`` (as
        ``gabor_fraction``), and over all units ``median_cosine_to_init``,
        ``median_norm``, ``mean_norm``.
    """
    problem = None
    try:
        w, w0 = _weights("w_local", w_local), _weights("w0_local", w0_local)
        if w.shape != w0.shape:
            raise ValueError(f"w0_local must have w_local's shape {w.shape}, got {w0.shape}")
        lo, shape = pair("sites_lo", sites_lo, 0), pair("sites_shape", sites_shape, 1)
        threshold, sample, seed = _options(threshold, sample, seed)
        if not (np.all(np.isfinite(w)) and np.all(np.isfinite(w0))):
            raise ValueError("w_local or w0_local has non-finite values")
        if min(w.shape[3:5]) < 3:
            raise ValueError(f"filters must be at least 3x3 to fit a Gabor, got rh, rw = {w.shape[3:5]}")
        if lo[0] + w.shape[0] > shape[0] or lo[1] + w.shape[1] > shape[1]:
            raise ValueError(f"the local sites {w.shape[:2]} at sites_lo {lo} leave sites_shape {shape}")
    except ValueError as e:  # checked before any work, so no rank is left waiting in a collective
        problem = str(e)
    _agree(comm, problem)
    per_unit = tuple(w.shape[2:])
    shapes, sites = comm.allgather(per_unit), comm.allreduce(w.shape[0] * w.shape[1])
    problem = None
    if len(set(shapes)) != 1:
        problem = f"ranks disagree on (M, rh, rw, C): {sorted(set(shapes))}"
    elif sites != shape[0] * shape[1]:
        problem = f"the ranks' site boxes hold {sites} sites, sites_shape {shape} has {shape[0] * shape[1]}"
    _agree(comm, problem)
    M = w.shape[2]
    # Global flat (site_i, site_j, unit) index of every local unit.
    gi, gj, gm = np.meshgrid(np.arange(lo[0], lo[0] + w.shape[0]), np.arange(lo[1], lo[1] + w.shape[1]),
                             np.arange(M), indexing="ij")
    keys = ((gi * shape[1] + gj) * M + gm).ravel().astype(np.int64)
    chosen = sample_units(shape, M, sample, seed)
    mine = np.flatnonzero(np.isin(keys, chosen))  # local flat indices, in global order
    skeys, r2, oriented = _gathered(comm, keys[mine], *_fit(w, mine))
    ukeys, cos, norms = _gathered(comm, keys, cosines(w, w0).ravel(), unit_norms(w).ravel())
    if not (np.array_equal(ukeys, np.arange(shape[0] * shape[1] * M)) and np.array_equal(skeys, chosen)):
        # Every rank holds the same gathered arrays, so every rank raises here.
        raise ValueError("stage_filter_stats: the ranks' site boxes overlap or leave gaps")
    s = _summary(r2, oriented, threshold)
    return {"gabor_fraction": s["fraction"], "oriented_fraction": s["oriented"], "median_r2": s["median_r2"],
            "fitted": s["fitted"], "median_cosine_to_init": float(np.median(cos)),
            "median_norm": float(np.median(norms)), "mean_norm": float(norms.mean())}
