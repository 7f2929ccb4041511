"""Do a stage's filters at the image border prefer other orientations than those inside?

A locally connected stage learns a filter bank per site, so what it learns at a site
reflects what the training images show there.  Aligned views of faces, padding,
reflection, or a normalization window clipped at the border can all make the border
sites differ from the inner ones; these numbers show whether they do.

- :func:`orientations`: every unit's dominant orientation ``theta`` (the direction of the
  wave vector of its strongest spatial frequencies, GaborFit's convention: from the
  column axis towards the row axis; ``theta = 0`` is a vertical grating) and how
  strongly it is oriented, from its power spectrum (no fit: cheap for every unit);
- :func:`border_sites`: the outer ring of sites, whose fields reach the image's edge;
- :func:`compare`: the orientation histograms of the border and the interior sites, and
  the share of units that are gratings parallel to the nearest image edge in each, with
  a bootstrap interval of the border-minus-interior difference over sites.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

#: Centres (degrees of ``theta``) of the histogram's bins, each 45 degrees wide: 0 = vertical
#: gratings, 90 = horizontal ones.
BIN_CENTRES = (0, 45, 90, 135)
_PAD = 16  # FFT size: a 7x7 filter zero-padded to 16x16, 1/16 cycle per pixel: enough for a power-weighted mean angle
_CHUNK = 2048  # units transformed at a time (bounded memory for any stage)


def orientations(w: Any) -> tuple[np.ndarray, np.ndarray]:
    """Every unit's dominant orientation and its strength.

    Parameters
    ----------
    w : ndarray, float, (..., rh, rw, C)
        Filters; with C > 1 the channel sum (the luminance filter) is used, as by ``gabor_fit``.

    Returns
    -------
    theta, strength : ndarray, float64, shape ``w.shape[:-3]``
        With the power spectrum P of the mean-free filter at wave vectors of angle phi,
        ``z = sum(P exp(2i phi)) / sum(P)``; ``theta = angle(z) / 2`` in [0, pi) and
        ``strength = |z|`` in [0, 1] (0 for a filter without orientation or variance).
    """
    w = np.asarray(w)
    if w.ndim < 3 or w.dtype.kind != "f":
        raise ValueError(f"w must be a float array (..., rh, rw, C), got dtype {w.dtype}, shape {w.shape}")
    lead = w.shape[:-3]
    f = w.reshape((-1,) + w.shape[-3:]).sum(axis=-1, dtype=np.float64)
    f -= f.mean(axis=(1, 2), keepdims=True)
    P = max(_PAD, 2 * max(f.shape[1:]))
    fy, fx = np.fft.fftfreq(P)[:, None], np.fft.fftfreq(P)[None, :]
    rot = np.exp(2j * np.arctan2(fy, fx))  # the doubled angle: phi and phi + pi are one orientation
    z = np.empty(len(f), np.complex128)
    for i in range(0, len(f), _CHUNK):
        power = np.abs(np.fft.fft2(f[i:i + _CHUNK], s=(P, P))) ** 2
        total = power.sum(axis=(1, 2))
        z[i:i + _CHUNK] = np.divide((power * rot).sum(axis=(1, 2)), total, out=np.zeros(len(total), complex),
                                    where=total > 0)
    theta = (np.angle(z) / 2) % np.pi
    return theta.reshape(lead), np.abs(z).reshape(lead)


def border_sites(sites_shape: Sequence[int], ring: int = 1) -> np.ndarray:
    """(SH, SW) bool: the sites within ``ring`` of the grid's edge (at stride 1 without cropping,
    exactly the sites whose fields reach the image's edge)."""
    sh, sw = (int(v) for v in sites_shape)
    i, j = np.meshgrid(np.arange(sh), np.arange(sw), indexing="ij")
    return (i < ring) | (j < ring) | (i >= sh - ring) | (j >= sw - ring)


def histogram(theta: np.ndarray) -> list[float]:
    """The share of the units whose ``theta`` lies within 22.5 degrees of each of :data:`BIN_CENTRES`."""
    t = np.ravel(theta)
    if not t.size:
        return [float("nan")] * len(BIN_CENTRES)
    return (np.bincount(_bins(t), minlength=len(BIN_CENTRES)) / t.size).tolist()


def parallel_bins(sites_shape: Sequence[int]) -> np.ndarray:
    """(SH, SW) int: per site, the :data:`BIN_CENTRES` index of a grating parallel to the nearest image
    edge (0: vertical, for sites nearer the left or right edge; 2: horizontal, for the top or bottom
    one); -1 where two edges are equally near (the diagonals: no single edge to be parallel to)."""
    sh, sw = (int(v) for v in sites_shape)
    i, j = np.meshgrid(np.arange(sh), np.arange(sw), indexing="ij")
    to_side, to_top = np.minimum(j, sw - 1 - j), np.minimum(i, sh - 1 - i)
    return np.where(to_side < to_top, 0, np.where(to_top < to_side, 2, -1))


def _bins(theta: np.ndarray) -> np.ndarray:
    """The :data:`BIN_CENTRES` index of each ``theta`` (the nearest centre, in degrees mod 180)."""
    return np.floor(((np.degrees(theta) + 22.5) % 180.0) / 45.0).astype(int) % len(BIN_CENTRES)


def compare(theta: np.ndarray, border: np.ndarray, resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Border against interior sites: their orientation histograms, and how many units are
    gratings parallel to the nearest image edge (what an effect of the edge itself makes).

    Parameters
    ----------
    theta : (SH, SW, M)
        Every unit's orientation (:func:`orientations`).
    border : (SH, SW) bool
        The border sites (:func:`border_sites`); the others are the interior.
    resamples, seed
        The bootstrap of the difference: sites drawn with replacement within each region
        (a site's units are drawn together: they see the same pixels).

    Returns
    -------
    dict
        ``border_orientations`` /
        ``interior_orientations`` (:func:`histogram`); ``border_edge_parallel`` /
        ``interior_edge_parallel``: the share of units within 22.5 degrees of the grating
        parallel to their site's nearest edge (:func:`parallel_bins`; diagonal sites left
        out; 0.25 for orientations spread evenly, whatever one orientation dominates
        overall); ``edge_parallel_diff`` (border − interior) and
        ``edge_parallel_diff_ci_low`` / ``_ci_high`` (its 95% percentile interval).
    """
    theta = np.asarray(theta, np.float64)
    border = np.asarray(border, bool)
    if theta.ndim != 3 or border.shape != theta.shape[:2]:
        raise ValueError(f"theta must be (SH, SW, M) and border (SH, SW), got {theta.shape} and {border.shape}")
    want = parallel_bins(border.shape)
    share = (_bins(theta) == want[..., None]).mean(axis=2)  # per site: its units parallel to its edge
    sb, si = share[border & (want >= 0)], share[~border & (want >= 0)]
    out = {"border_orientations": histogram(theta[border]), "interior_orientations": histogram(theta[~border]),
           "border_edge_parallel": float(sb.mean()) if sb.size else float("nan"),
           "interior_edge_parallel": float(si.mean()) if si.size else float("nan")}
    out["edge_parallel_diff"] = out["border_edge_parallel"] - out["interior_edge_parallel"]
    if sb.size and si.size:
        rng = np.random.default_rng(seed)
        diffs = (sb[rng.integers(sb.size, size=(resamples, sb.size))].mean(axis=1)
                 - si[rng.integers(si.size, size=(resamples, si.size))].mean(axis=1))
        lo, hi = np.percentile(diffs, [2.5, 97.5])
    else:
        lo = hi = float("nan")
    out.update(edge_parallel_diff_ci_low=float(lo), edge_parallel_diff_ci_high=float(hi))
    return out
