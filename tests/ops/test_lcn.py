import numpy as np
import pytest

from cotsdl import ops
from gradcheck import assert_grad
from reference import lcn as ref_lcn

CASES = [((7, 6, 2, 3), 3, 1.0), ((9, 8, 3, 2), 5, 1.5), ((5, 11, 1, 1), 7, 2.0), ((4, 4, 2, 2), 9, 3.0),
         ((6, 5, 3, 2), 1, 1.0)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_matches_loops(case, dtype):
    shape, size, sigma = case
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    y = ops.lcn(x, size, sigma, 1e-2)
    assert y.dtype == dtype and y.shape == x.shape
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, ref_lcn(x.astype(float), size, sigma, 1e-2), rtol=tol, atol=tol)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("floor", ["s_and_m", "flat_regions", "eps"])
def test_gradient_by_finite_differences(case, floor):
    """Every branch of max(s, m, eps) carries the gradient: with small eps about half
    the pixels take s and half the image mean m; a large eps floors them all."""
    shape, size, sigma = case
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    eps = 50.0 if floor == "eps" else 1e-3
    if floor == "flat_regions":  # low-contrast rows whose local std falls far below the mean
        x[: shape[0] // 2] *= 0.05
    r = rng.standard_normal(shape)
    dx = ops.lcn_backward(r, x, size, sigma, eps)
    assert_grad(dx, lambda x_: np.sum(ops.lcn(x_, size, sigma, eps) * r), x, rtol=1e-5)


def test_flat_image_is_finite():
    x = np.ones((6, 6, 2, 2), np.float32)
    y = ops.lcn(x, 3, 1.0, 1e-4)
    assert np.all(np.isfinite(y)) and np.allclose(y, 0)


def test_bad_arguments_are_named():
    x = np.zeros((4, 4, 1, 1), np.float32)
    with pytest.raises(ValueError, match="size must be an odd positive integer"):
        ops.lcn(x, 4, 1.0, 0.1)
    with pytest.raises(ValueError, match="sigma must be > 0"):
        ops.lcn(x, 3, 0.0, 0.1)
