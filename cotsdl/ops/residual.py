"""The sparse autoencoder's reconstruction residual in one pass (backend neutral).

Given the reconstruction x_hat and the input x (H, W, C, N) on this rank's owned box::

    out = scale * (x_hat - x),   returns (sum (x_hat - x)^2, sum x^2)

``out`` is the reconstruction's gradient (scale = 2 / N); the two sums are the loss term
and the signal it is measured against, in float64.  On the numpy backend a native kernel
(``ops/cpu/native/kernels.cpp``) reads each array once, in bands of rows on the thread
pool; elsewhere (CuPy, or the kernels off) array expressions compute the same.  ``out``
has numpy's bits either way; the sums agree to float64 rounding, not bit for bit.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import backend
from .cpu import native
from .cpu.parallel import run_bands


def residual(x_hat: Any, x: Any, scale: float, out: Any, read: bool = True) -> tuple[Any, Any]:
    """``out[...] = scale * (x_hat - x)``; returns (sum (x_hat - x)^2, sum x^2) as floats.

    ``out`` may be ``x_hat`` itself but must not overlap ``x`` (x is read after out is written).
    ``read=False``: the sums as 0-d arrays of ``x``'s library, not read back (device work that must
    not wait for the host, e.g. a captured CUDA graph); the native kernel's are floats anyway.
    """
    if not (x_hat.shape == x.shape == out.shape and x_hat.dtype == x.dtype == out.dtype):
        raise ValueError(f"residual: x_hat {x_hat.shape} {x_hat.dtype}, x {x.shape} {x.dtype} and out "
                         f"{out.shape} {out.dtype} must have one shape and dtype")
    xp = backend.array_module(x)
    s = x.dtype.type(scale)
    kern = native.for_arrays(xp, "residual", x_hat, x, out) if x.ndim >= 3 else None
    if kern is not None:
        H, W = x.shape[:2]
        L = int(np.prod(x.shape[2:]))
        sums = np.empty((H, 2), np.float64)
        st = native.pixel_strides
        run_bands(H, W * L * x.dtype.itemsize * 3,
                  lambda h0, h1: kern(x_hat, *st(x_hat), x, *st(x), W, L, s, out, *st(out), sums, h0, h1), True)
        rec, sig = sums.sum(axis=0)
        return float(rec), float(sig)
    r = xp.subtract(x_hat, x, out=out)
    rec = xp.square(r, dtype=xp.float64).sum()  # squares of the rounded r, taken in float64
    sig = xp.square(x, dtype=xp.float64).sum()
    xp.multiply(r, s, out=out)
    return (float(rec), float(sig)) if read else (rec, sig)
