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


@pytest.mark.parametrize("case", CASES)
def test_bands_over_threads_change_nothing(case, monkeypatch):
    """LCN's full-size steps in a band per row on 3 threads, with a workspace reused: bit for bit
    the one-band result, forward and backward, of whole images and of a window of one."""
    from cotsdl.array.box import Box
    from cotsdl.ops.cpu import parallel

    shape, size, sigma, eps = case[0], case[1], case[2], 1e-3
    x = np.random.default_rng(9).standard_normal(shape).astype(np.float32)
    dy = np.random.default_rng(10).standard_normal(shape).astype(np.float32)
    H, W = shape[:2]
    whole = Box((0, 0), (H, W))
    inner = Box((H // 3, 0), (H - H // 3, W)) if H >= 3 else whole

    def both(ws):
        got = []
        for out in (whole, inner):
            y, cache = ops.lcn_window(x, whole, out, (H, W), size, sigma, eps, workspace=ws)
            got += [y, ops.lcn_window_backward(dy[out.slices_in(whole)], cache)]
        return got

    ops.set_num_threads(1)
    try:
        want = both(None)
        monkeypatch.setattr(parallel, "CHUNK_BYTES", 1)
        monkeypatch.setattr(parallel, "PARALLEL_BYTES", 0)
        ops.set_num_threads(3)
        ws = ops.Workspace()
        for _ in range(2):
            for g, w in zip(both(ws), want):
                np.testing.assert_array_equal(g, w)
    finally:
        ops.set_num_threads(None)
