import numpy as np
import pytest

from cotsdl import ops
from gradcheck import assert_grad
from reference import l2_pool as ref_pool

CASES = [((8, 7, 3, 4), (2, 2), (2, 2)), ((9, 10, 1, 1), (3, 2), (2, 3)), ((5, 5, 2, 3), (5, 5), (1, 1)),
         ((7, 6, 2, 2), (1, 1), (1, 1)), ((10, 9, 2, 3), (3, 3), (1, 2))]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("eps", [0.0, 0.01])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_matches_loops(case, eps, dtype):
    shape, size, stride = case
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    y = ops.l2_pool(x, size, stride, eps)
    assert y.dtype == dtype
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, ref_pool(x.astype(float), size, stride, eps), rtol=tol, atol=tol)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("eps, scale", [(0.01, 1.0), (0.01, 1e-3), (0.0, 1.0), (1e-4, 0.0)])
def test_gradient_by_finite_differences(case, eps, scale):
    """Also at (scale 0: the gradient there is exactly 0 with eps > 0) and near zero input."""
    shape, size, stride = case
    x = scale * np.random.default_rng(1).standard_normal(shape)
    r = np.random.default_rng(2).standard_normal(ops.l2_pool(x, size, stride, eps).shape)
    y = ops.l2_pool(x, size, stride, eps)
    dx = ops.l2_pool_backward(r, x, y, size, stride)
    assert_grad(dx, lambda x_: np.sum(ops.l2_pool(x_, size, stride, eps) * r), x, rtol=1e-5)


def test_zero_input_without_eps_gives_zero_gradient():
    x = np.zeros((4, 4, 1, 2))
    y = ops.l2_pool(x, (2, 2), (2, 2), 0.0)
    assert np.all(y == 0)
    dx = ops.l2_pool_backward(np.ones_like(y), x, y, (2, 2), (2, 2))
    assert np.all(dx == 0) and np.all(np.isfinite(dx))


def test_bad_arguments_are_named():
    x = np.zeros((4, 4, 1, 1), np.float32)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        ops.l2_pool(x, (2, 2), (2, 2), -1)
    with pytest.raises(ValueError, match="pooling size"):
        ops.l2_pool(x, (5, 2), (2, 2), 0)


@pytest.mark.parametrize("case", CASES)
def test_bands_over_threads_give_the_loops_result(case, monkeypatch):
    """Every row band on its own thread (a band per row, all sizes threaded): the same values as the
    loops, and the backward the same as in one band."""
    from cotsdl.ops.cpu import parallel

    x = np.random.default_rng(7).standard_normal(case[0])
    size, stride = case[1], case[2]
    y = ops.l2_pool(x, size, stride, 0.01)
    dy = np.random.default_rng(8).standard_normal(y.shape)
    dx = ops.l2_pool_backward(dy, x, y, size, stride)
    monkeypatch.setattr(parallel, "CHUNK_BYTES", 1)
    monkeypatch.setattr(parallel, "PARALLEL_BYTES", 0)
    ops.set_num_threads(3)
    try:
        ws = ops.Workspace()
        for _ in range(2):  # the second time with the workspace's buffers reused
            yb = ops.l2_pool(x, size, stride, 0.01, workspace=ws)
            np.testing.assert_allclose(yb, ref_pool(x, size, stride, 0.01), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(ops.l2_pool_backward(dy, x, yb, size, stride, workspace=ws), dx,
                                       rtol=1e-12, atol=1e-12)
    finally:
        ops.set_num_threads(None)
