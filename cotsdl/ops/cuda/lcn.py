"""LCN's Gaussian smoothing on the CUDA kernels of ``cuda/lcn.cu``: one separable pass per launch.

The LCN algebra around them is backend neutral (:mod:`cotsdl.ops.lcn`); its reductions
are CuPy's (or NumPy's, emulated).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ... import backend
from ...array.box import Box
from ._launch import THREADS, contig, grid_for, indexed, kernel


def corr_axis(u: Any, u_box: Box, out_box: Box, image_hw, g1: np.ndarray, axis: int,
              z: tuple[Any, Any] | None = None) -> Any:
    """One separable Gaussian pass over ``out_box`` along ``axis`` (2-D boxes); with ``z`` = (zr, zc)
    the pass also divides by the border weight Z = zr zc^T."""
    xp = backend.array_module(u)
    N = u.shape[2]
    out = xp.empty(out_box.shape + (N,), u.dtype)
    if out.size == 0:
        return out
    dt = np.dtype(u.dtype)
    g = backend.constant(g1.astype(dt), u)  # kept on the device
    zr, zc = (backend.constant(z[0].astype(dt), u), backend.constant(z[1].astype(dt), u)) if z is not None else (g, g)
    ints = tuple(np.int32(v) for v in (u_box.lo[0], u_box.lo[1], u_box.shape[0], u_box.shape[1], out_box.lo[0],
                                       out_box.lo[1], out_box.shape[0], out_box.shape[1], N, axis, len(g1),
                                       image_hw[0], image_hw[1], 1 if z is not None else 0))
    backend.launch(kernel("lcn.cu", indexed("lcn_corr_axis", out.size), u), grid_for(out.size), (THREADS,),
                   (contig(u), out, g, zr, zc) + ints)
    return out


def smooth(u: Any, u_box: Box, out: Box, image: Box, g1: np.ndarray, z: tuple) -> Any:
    """Rows, then columns; the second pass divides by Z (``z`` = (zr, zc, Z))."""
    mid = Box((out.lo[0], u_box.lo[1]), (out.hi[0], u_box.hi[1]))
    rows = corr_axis(u, u_box, mid, image.hi, g1, 0)
    return corr_axis(rows, mid, out, image.hi, g1, 1, z=z[:2])


def smooth_adjoint(t: Any, out: Box, target: Box, image: Box, g1: np.ndarray) -> Any:
    """The transpose: g is symmetric, so it is the same two passes from ``out`` onto ``target``."""
    mid = Box((target.lo[0], out.lo[1]), (target.hi[0], out.hi[1]))
    return corr_axis(corr_axis(t, out, mid, image.hi, g1, 0), mid, target, image.hi, g1, 1)
