"""LCN's Gaussian smoothing on the CPU (numpy backend): the two separable passes and their transpose.

The LCN algebra around them (centering, the per-image mean, the divide) is backend
neutral and lives in :mod:`cotsdl.ops.lcn`.  Boxes are 2-D spatial boxes in global
image coordinates; arrays are (h, w, N).
"""
from __future__ import annotations

import numpy as np

from ...array.box import Box
from . import native
from .parallel import run_bands


def _corr(u: np.ndarray, g1: np.ndarray, axis: int, out_len: int) -> np.ndarray:
    """Valid correlation along ``axis``: out[t] = sum_k g1[k] u[t + k]."""
    u = np.moveaxis(u, axis, 0)
    out = g1[0] * u[0:out_len]
    for k in range(1, len(g1)):
        out += g1[k] * u[k:k + out_len]
    return np.moveaxis(out, 0, axis)


def _widen(box: Box, r: int) -> Box:
    """``box`` grown by ``r`` on every side, not clipped (padding may lie outside the image)."""
    return Box(tuple(l - r for l in box.lo), tuple(h + r for h in box.hi))


def _embed(u: np.ndarray, u_box: Box, into: Box, image: Box) -> np.ndarray:
    """``u`` (given on ``u_box``) placed in a zero array covering ``into``; outside ``image`` stays 0."""
    out = np.zeros(into.shape + u.shape[2:], u.dtype)
    part = into & u_box & image
    out[part.slices_in(into)] = u[part.slices_in(u_box)]
    return out


def _native_corr(u: np.ndarray, valid: Box, origin: tuple[int, int], g: np.ndarray, z: np.ndarray | None,
                 res: np.ndarray) -> bool:
    """``res`` = both correlation passes of ``u`` (0 outside ``valid``, in u's own coordinates),
    ``res[0, 0]``'s window starting at u's ``origin``, divided by ``z``: the native kernel, in
    bands of ``res``'s rows.  False (nothing done) when the kernel is off or the layout is not its."""
    fused, su, sr = native.kernel("corr2", u.dtype), native.strides(u, 1), native.strides(res, 1)
    if fused is None or su is None or sr is None:
        return False
    (r0, c0), (r1, c1) = (valid.lo, valid.hi) if not valid.is_empty else ((0, 0), (0, 0))
    g = np.ascontiguousarray(g, u.dtype)
    zz = None if z is None else np.ascontiguousarray(z.reshape(res.shape[:2]), u.dtype)
    N = res.shape[2]
    run_bands(res.shape[0], res.shape[1] * N * len(g) * res.itemsize,
              lambda i0, i1: fused(u, *su, N, r0, r1, c0, c1, *origin, g, len(g), zz, res, *sr, res.shape[1], i0, i1),
              one_pass=True)
    return True


def smooth(u: np.ndarray, u_box: Box, out: Box, image: Box, g1: np.ndarray, z: tuple) -> np.ndarray:
    """Window sums of ``u`` weighted by g = g1 g1^T over ``out``, divided by Z (``z`` = (zr, zc, Z))."""
    rho = len(g1) // 2
    g = g1.astype(u.dtype)
    res = np.empty(out.shape + u.shape[2:], u.dtype)
    have = u_box & image
    valid = have if have.is_empty else have.translate(tuple(-v for v in u_box.lo))
    if _native_corr(u, valid, (out.lo[0] - rho - u_box.lo[0], out.lo[1] - rho - u_box.lo[1]), g, z[2], res):
        return res
    padded = _embed(u, u_box, _widen(out, rho), image)
    return _corr(_corr(padded, g, 0, out.shape[0]), g, 1, out.shape[1]) / z[2]


def smooth_adjoint(t: np.ndarray, out: Box, target: Box, image: Box, g1: np.ndarray) -> np.ndarray:
    """Transpose of the window sums: ``t`` (already divided by Z) on ``out`` -> its contributions on ``target``."""
    rho = len(g1) // 2
    g = g1.astype(t.dtype)
    res = np.zeros(target.shape + t.shape[2:], t.dtype)
    spread = _widen(out, rho)
    part = spread & target & image
    if part.is_empty:
        return res
    whole = Box((0, 0), t.shape[:2])
    if _native_corr(t, whole, (part.lo[0] - out.lo[0] - rho, part.lo[1] - out.lo[1] - rho), g[::-1], None,
                    res[part.slices_in(target)]):
        return res
    padded = _embed(t, out, _widen(out, 2 * rho), out)
    # g is symmetric, so correlating with it is convolving with it.
    full = _corr(_corr(padded, g[::-1], 0, spread.shape[0]), g[::-1], 1, spread.shape[1])
    res[part.slices_in(target)] = full[part.slices_in(spread)]
    return res
