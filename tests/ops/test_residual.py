"""ops.residual: the autoencoder's residual and its sums in one pass (native kernel and numpy)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cotsdl.ops.cpu import native, parallel
from cotsdl.ops.residual import residual


def _exact(x_hat, x):
    """The sums in float64 of the residual as the array's dtype rounds it (as the gradient has it)."""
    r = (x_hat - x).astype(np.float64)
    return float((r * r).sum()), float((x.astype(np.float64) ** 2).sum())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 9), st.integers(1, 7), st.integers(1, 3), st.sampled_from([1, 5, 8, 13, 32]),
       st.sampled_from([np.float32, np.float64]), st.booleans(), st.integers(1, 3))
def test_native_and_numpy_agree(H, W, C, N, dtype, view, threads):
    rng = np.random.default_rng(H * 100 + W * 10 + C)
    big = rng.standard_normal((H + 2, W + 3, C, N)).astype(dtype)
    x = big[1:-1, 2:-1] if view else np.ascontiguousarray(big[1:-1, 2:-1])  # an owned box of a window
    x_hat = rng.standard_normal(x.shape).astype(dtype)
    scale = 2.0 / N
    outs, sums = [], []
    parallel.set_num_threads(threads)
    try:
        for use in (True, False):
            out = np.full(x.shape, np.nan, dtype)
            with native.use(use):
                sums.append(residual(x_hat, x, scale, out))
            outs.append(out)
    finally:
        parallel.set_num_threads(None)
    want = (x_hat - x) * dtype(scale)  # numpy's bits, on either path
    for out in outs:
        np.testing.assert_array_equal(out, want)
    exact = _exact(x_hat, x)
    for got in sums:
        np.testing.assert_allclose(got, exact, rtol=1e-12)


def test_bands_and_threads_give_the_same_sums():
    """Large enough for several bands: per-row float64 sums, so the threads do not change them."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 64, 8, 64)).astype(np.float32)
    x_hat = rng.standard_normal(x.shape).astype(np.float32)
    got = []
    for threads in (1, 2, 3):
        parallel.set_num_threads(threads)
        try:
            with native.use(True):
                got.append(residual(x_hat, x, 0.5, np.empty_like(x)))
        finally:
            parallel.set_num_threads(None)
    assert got[0] == got[1] == got[2]
    np.testing.assert_allclose(got[0], _exact(x_hat, x), rtol=1e-12)


def test_mismatched_arrays_are_refused():
    a = np.zeros((2, 2, 1, 3), np.float32)
    with pytest.raises(ValueError, match="must have one shape and dtype"):
        residual(a, a.astype(np.float64), 1.0, a.copy())
    with pytest.raises(ValueError, match="must have one shape and dtype"):
        residual(a, a, 1.0, np.zeros((2, 2, 1, 4), np.float32))


@pytest.mark.parametrize("use", [True, False])
def test_out_may_be_x_hat(use):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 4, 2, 9)).astype(np.float32)
    x_hat = rng.standard_normal(x.shape).astype(np.float32)
    want, sums = (x_hat - x) * np.float32(0.5), _exact(x_hat, x)
    with native.use(use):
        got = residual(x_hat, x, 0.5, x_hat)
    np.testing.assert_array_equal(x_hat, want)
    np.testing.assert_allclose(got, sums, rtol=1e-12)
