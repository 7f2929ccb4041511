"""A fast least-squares fit of a 2-D Gabor to one small filter.

The model, in pixel coordinates (``x`` the column index, ``y`` the row index)::

    g(x, y) = A exp(-(x'^2 / (2 sx^2) + y'^2 / (2 sy^2))) cos(2 pi x' / lam + phi) + c
    x' =  (x - x0) cos(theta) + (y - y0) sin(theta)
    y' = -(x - x0) sin(theta) + (y - y0) cos(theta)

so ``theta`` is the direction of the carrier's wave vector (from the column axis
towards the row axis) and ``sx`` the envelope's width along it.  Internally the
carrier is ``a cos(u) + b sin(u)`` with ``u = 2 pi x' / lam``: then amplitude and
phase enter linearly, which (1) gives every start its exact best phase by a 3-column
linear solve instead of trying a few phases, and (2) keeps the fit smooth at A = 0,
where phi is undefined.

The search: six starts (the two strongest FFT peaks of other orientations, each with
the energy's spread and with a one-cycle envelope; a blob at the longest wavelength;
an edge at half a cycle per envelope), all centred on the energy's centroid; a few
projected Levenberg-Marquardt steps on all of them at once (numpy, batched), more on
the best two, then a bounded ``scipy.optimize.least_squares`` (trf, analytic
Jacobian) from the best.  Batching the restarts is what makes it fast: on 7x7 filters
numpy's per-call overhead dominates, and scipy's trf costs ~0.5 ms per iteration.
Every step depends only on the filter, so a filter fits the same on any rank.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

__all__ = ["GaborFit", "gabor_fit", "gabor_model"]

_PAD = 32  # FFT size for the starts: 7x7 zero-padded to 32x32 resolves the frequency to 1/32 cycle/pixel
_LM_ITERS = (10, 20)  # batched LM steps over all starts, then over the best _KEEP
_KEEP = 2  # more starts or steps changed the median r2 of noise or of planted Gabors by < 0.005
_LM_RTOL = 1e-5  # a start has converged when a step gains less than this share of its SSE
_POLISH_FTOL = 1e-4  # stop when an SSE improves by less than this share: r2 to ~1e-4
_POLISH_NFEV = 10  # scipy least_squares evaluations from the best start


@dataclass(frozen=True)
class GaborFit:
    """A fitted Gabor: ``r2`` the share of the filter's variance it explains, in [0, 1].

    ``theta`` is in [0, pi), ``phi`` in (-pi, pi], ``amplitude`` >= 0; lengths in pixels.
    """

    r2: float
    amplitude: float
    x0: float
    y0: float
    theta: float
    sigma_x: float
    sigma_y: float
    wavelength: float
    phase: float
    offset: float

    @property
    def zero_crossing(self) -> float:
        """Distance (pixels, along x') from the centre to the carrier's nearest zero."""
        # cos(2 pi x'/lam + phi) = 0 where 2 pi x'/lam = pi/2 - phi + k pi.
        off = (np.pi / 2 - self.phase) % np.pi
        return float(self.wavelength / (2 * np.pi) * min(off, np.pi - off))

    @property
    def oriented(self) -> bool:
        """An edge or a bar with flanks, not a blob: the carrier changes sign within one sigma_x of the centre.

        Odd Gabors (edges) cross zero at the centre at any wavelength: a derivative
        of a Gaussian fits as a long-wavelength odd Gabor.  Even ones (bars) need
        ``wavelength <= 4 sigma_x``.  A blob fits as an even Gabor whose wavelength
        is long against its envelope, and fails.  (``wavelength <= 2 sigma_x``, a
        simpler rule, rejects textbook one-cycle Gabors such as lam = 4, sigma = 1.5.)
        """
        return bool(self.amplitude > 0 and self.zero_crossing <= self.sigma_x)


def gabor_model(shape: tuple[int, int], fit: GaborFit) -> np.ndarray:
    """The fitted Gabor evaluated on a ``shape`` (rows, cols) grid, float64."""
    y, x = np.mgrid[0:shape[0], 0:shape[1]].astype(np.float64)
    a, b = fit.amplitude * np.cos(fit.phase), -fit.amplitude * np.sin(fit.phase)
    p = np.array([fit.x0, fit.y0, fit.theta, fit.sigma_x, fit.sigma_y, fit.wavelength, a, b, fit.offset])
    return _model(p, x.ravel(), y.ravel()).reshape(shape)


def _model(p: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The model at ``p`` (..., 9) on the pixels ``x``, ``y`` (n,): shape (..., n)."""
    return _model_jac(p, x, y, jac=False)[0]


def _model_jac(p: np.ndarray, x: np.ndarray, y: np.ndarray, jac: bool = True):
    """The model (..., n) and its transposed Jacobian (..., 9, n), sharing every intermediate.

    Written op by op with in-place updates: on 7x7 filters numpy's per-call overhead,
    not arithmetic, is the cost, and this is the fitter's inner loop.
    """
    x0, y0, th, sx, sy, lam, a, b, c = (p[..., i, None] for i in range(9))
    ct, st, k = np.cos(th), np.sin(th), (2 * np.pi) / lam
    isx, isy = 1.0 / (sx * sx), 1.0 / (sy * sy)
    dx, dy = x - x0, y - y0
    xr = dx * ct
    xr += dy * st
    yr = dy * ct
    yr -= dx * st
    txr, tyr = xr * isx, yr * isy
    env = xr * txr
    env += yr * tyr
    env *= -0.5
    np.exp(env, out=env)
    u = k * xr
    JT = np.empty(env.shape[:-1] + (9, env.shape[-1]))
    ecu, esu = JT[..., 6, :], JT[..., 7, :]  # d/da, d/db
    np.multiply(env, np.cos(u), out=ecu)
    np.multiply(env, np.sin(u), out=esu)
    ec = a * ecu
    ec += b * esu  # env * carrier
    if not jac:
        ec += c
        return ec, None
    edc = b * ecu
    edc -= a * esu  # env * d carrier / du
    etx = ec * txr
    gx = k * edc
    gx -= etx  # d g / d x'
    gyn = ec * tyr  # -d g / d y'
    np.multiply(gx, -ct, out=JT[..., 0, :])  # x0: dx'/dx0 = -cos, dy'/dx0 = sin
    JT[..., 0, :] -= gyn * st
    np.multiply(gyn, ct, out=JT[..., 1, :])  # y0: dx'/dy0 = -sin, dy'/dy0 = -cos
    JT[..., 1, :] -= gx * st
    np.multiply(gx, yr, out=JT[..., 2, :])  # theta: dx'/dtheta = y', dy'/dtheta = -x'
    JT[..., 2, :] += gyn * xr
    np.multiply(etx, xr / sx, out=JT[..., 3, :])
    np.multiply(gyn, yr / sy, out=JT[..., 4, :])
    np.multiply(edc, xr * (-k / lam), out=JT[..., 5, :])
    JT[..., 8, :] = 1.0
    ec += c
    return ec, JT


def _jac(p: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d model / d p of one parameter vector, shape (n, 9) (what least_squares wants)."""
    return _model_jac(p, x, y)[1].T


def _linear(p: np.ndarray, x: np.ndarray, y: np.ndarray, f: np.ndarray) -> np.ndarray:
    """The starts ``p`` (S, 6) completed with their best (a, b, c): the exact best phase and amplitude."""
    q = np.concatenate([p, np.zeros((len(p), 3))], axis=1)
    B = _model_jac(q, x, y)[1][:, 6:, :]  # the model is linear in (a, b, c) with these columns
    BtB = B @ B.transpose(0, 2, 1) + 1e-12 * np.eye(3)
    q[:, 6:] = np.linalg.solve(BtB, (B @ f)[..., None])[..., 0]
    return q


def _batch_lm(p: np.ndarray, x, y, f, lo, hi, iters: int) -> tuple[np.ndarray, np.ndarray]:
    """Projected Levenberg-Marquardt steps on every start ``p`` (S, 9) at once: (p, SSE) after them."""
    g, J = _model_jac(p, x, y)
    r = g - f
    cost = (r * r).sum(-1)
    mu = np.full(len(p), 1e-2)
    done = np.zeros(len(p), bool)
    eye = np.eye(p.shape[1])
    for _ in range(iters):
        if done.all():
            break
        JtJ = J @ J.transpose(0, 2, 1)  # J is transposed: (S, 9, n)
        d = np.diagonal(JtJ, axis1=1, axis2=2)
        A = JtJ + mu[:, None, None] * (d[:, None, :] + 1e-9) * eye
        q = np.minimum(np.maximum(p - np.linalg.solve(A, J @ r[..., None])[..., 0], lo), hi)
        gq, Jq = _model_jac(q, x, y)
        rq = gq - f
        cq = (rq * rq).sum(-1)
        # A converged start is frozen; the loop ends when all are.
        ok = (cq < cost) & ~done
        done |= (ok & (cost - cq <= _LM_RTOL * cost)) | (mu > 1e10)
        p[ok], r[ok], J[ok], cost[ok] = q[ok], rq[ok], Jq[ok], cq[ok]
        mu = np.where(ok, mu / 3, mu * 4)
    return p, cost


def _starts(fc: np.ndarray, size: int) -> list[np.ndarray]:
    """Nonlinear starts (x0, y0, theta, sx, sy, lam) from the FFT peaks, the energy's moments, and a blob."""
    rh, rw = fc.shape
    y, x = np.mgrid[0:rh, 0:rw].astype(np.float64)
    e = fc * fc
    e = e / e.sum()
    cx, cy = float((e * x).sum()), float((e * y).sum())
    vxx, vyy, vxy = float((e * (x - cx) ** 2).sum()), float((e * (y - cy) ** 2).sum()), \
        float((e * (x - cx) * (y - cy)).sum())

    def spread(theta: float) -> tuple[float, float]:
        # Energy of a Gaussian envelope has std sigma/sqrt(2) along each axis.
        c, s = np.cos(theta), np.sin(theta)
        va = c * c * vxx + 2 * c * s * vxy + s * s * vyy
        vb = s * s * vxx - 2 * c * s * vxy + c * c * vyy
        return tuple(float(np.clip(np.sqrt(2 * max(v, 0.0)), 0.7, size)) for v in (va, vb))

    P = max(_PAD, 4 * size)
    power = np.abs(np.fft.rfft2(fc, s=(P, P))) ** 2  # rfft: half plane, the other half is the mirror
    fy = np.fft.fftfreq(P)[:, None]
    fx = np.fft.rfftfreq(P)[None, :]
    fr = np.hypot(fx, fy)
    power = np.where(fr >= 1.0 / (4 * size), power, 0.0)  # below the lowest allowed frequency: the blob start
    order = np.argsort(power, axis=None)[::-1]
    out: list[np.ndarray] = []
    first = None
    for idx in order[:64]:
        i, j = np.unravel_index(idx, power.shape)
        th = float(np.arctan2(fy[i, 0], fx[0, j]))
        if first is not None and abs(np.angle(np.exp(2j * (th - first)))) < np.pi / 6:
            continue  # the second peak must be another orientation
        lam = float(1.0 / fr[i, j])
        sa, sb = spread(th)
        out.append(np.array([cx, cy, th, sa, sb, lam]))
        out.append(np.array([cx, cy, th, max(lam / 2, 0.7), max(lam / 2, 0.7), lam]))  # about one cycle
        if first is not None:
            break
        first = th
    th = 0.5 * float(np.arctan2(2 * vxy, vxx - vyy))  # principal axis of the energy
    sa, sb = spread(th)
    out.append(np.array([cx, cy, th, sa, sb, 4.0 * size]))  # blob
    out.append(np.array([cx, cy, th, sa, sb, max(2.0, 4.0 * sa)]))  # edge: half a cycle across the envelope
    return out


def gabor_fit(f: np.ndarray) -> GaborFit:
    """Fit a 2-D Gabor to one filter by bounded least squares.

    Parameters
    ----------
    f : ndarray, float, shape (rh, rw) or (rh, rw, C)
        The filter, rh, rw >= 3.  With channels the channel sum (the luminance
        filter) is fitted: a colour-opponent filter may then score low.

    Returns
    -------
    GaborFit
        ``r2 = 1 - SSE / sum((f - mean f)^2)`` clipped at 0; 0 for a constant filter
        (it has no variance to explain).  Bounds: centre within the patch +-1,
        sigmas in [0.5, 2 size], wavelength in [2, 4 size], ``size = max(rh, rw)``.
    """
    f = np.asarray(f)
    if f.dtype.kind != "f":
        raise ValueError(f"gabor_fit: f must be a float array, got dtype {f.dtype}")
    if f.ndim == 3:
        f = f.astype(np.float64).sum(axis=2)
    if f.ndim != 2 or min(f.shape) < 3:
        raise ValueError(f"gabor_fit: f must be (rh, rw) or (rh, rw, C) with rh, rw >= 3, got shape {np.shape(f)}")
    if not np.all(np.isfinite(f)):
        raise ValueError("gabor_fit: f has non-finite values")
    f = f.astype(np.float64)
    rh, rw = f.shape
    size = max(rh, rw)
    fc = f - f.mean()
    tot = float(fc.ravel() @ fc.ravel())
    if tot <= (1e-12 * float(np.abs(f).max())) ** 2 * f.size:  # constant up to rounding
        return GaborFit(0.0, 0.0, (rw - 1) / 2, (rh - 1) / 2, 0.0, 1.0, 1.0, 4.0 * size, 0.0, float(f.mean()))
    y, x = np.mgrid[0:rh, 0:rw].astype(np.float64)
    x, y, fv = x.ravel(), y.ravel(), f.ravel()
    scale = float(np.sqrt(tot / f.size))
    lo = np.array([-1.0, -1.0, -np.inf, 0.5, 0.5, 2.0, -np.inf, -np.inf, -np.inf])
    hi = np.array([rw, rh, np.inf, 2.0 * size, 2.0 * size, 4.0 * size, np.inf, np.inf, np.inf])
    starts = np.clip(np.array(_starts(fc, size)), lo[:6] + 1e-6, hi[:6] - 1e-6)
    p, cost = _batch_lm(_linear(starts, x, y, fv), x, y, fv, lo, hi, _LM_ITERS[0])
    keep = np.argsort(cost)[:_KEEP]  # the most promising basins get the rest of the steps
    p, cost = _batch_lm(p[keep], x, y, fv, lo, hi, _LM_ITERS[1])
    best = int(np.argmin(cost))
    res = least_squares(lambda q: _model(q, x, y) - fv, p[best], jac=lambda q: _jac(q, x, y),
                        bounds=(lo, hi), method="trf", x_scale=np.r_[1, 1, 1, 1, 1, 1, scale, scale, scale],
                        ftol=_POLISH_FTOL, xtol=1e-6, gtol=1e-8, max_nfev=_POLISH_NFEV)
    best_p, best_sse = (res.x, float(2 * res.cost)) if 2 * res.cost < cost[best] else (p[best], float(cost[best]))
    return _result(best_p, best_sse, tot)


def _result(p: np.ndarray, sse: float, tot: float) -> GaborFit:
    x0, y0, th, sx, sy, lam, a, b, c = (float(v) for v in p)
    amp, phi = float(np.hypot(a, b)), float(np.arctan2(-b, a))  # a cos u + b sin u = A cos(u + phi)
    turns = np.floor(th / np.pi)
    th -= turns * np.pi
    if th >= np.pi:  # rounding
        th, turns = 0.0, turns + 1
    if turns % 2:  # theta + pi flips x' (and y'): cos(-u + phi) = cos(u - phi)
        phi = -phi
    th = max(th, 0.0)
    phi = float(np.angle(np.exp(1j * phi)))
    r2 = max(0.0, 1.0 - sse / tot)
    return GaborFit(min(r2, 1.0), amp, x0, y0, th, sx, sy, lam, phi, c)
