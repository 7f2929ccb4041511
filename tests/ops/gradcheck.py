"""Finite-difference gradient checks in float64."""
import numpy as np


def numeric_grad(f, x, h=1e-6):
    """Central differences of the scalar f at x, every coordinate."""
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        fp = f(x)
        flat[i] = old - h
        fm = f(x)
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * h)
    return g


def assert_grad(analytic, f, x, rtol=1e-6, atol=1e-8):
    num = numeric_grad(f, x)
    err = np.abs(analytic - num).max()
    scale = max(np.abs(num).max(), 1.0)
    assert err <= atol + rtol * scale, f"gradient mismatch: max abs err {err:.3e}, scale {scale:.3e}"
