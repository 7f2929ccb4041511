import numpy as np
import pytest

from cotsdl.train import sparse_ae_loss

CASES = [  # shape, size, stride, block, K, pool size, pool stride
    ((8, 7, 2, 3), (3, 3), (1, 1), (1, 1), 2, (2, 2), (1, 1)),
    ((9, 9, 1, 2), (4, 3), (2, 2), (2, 1), 2, (2, 2), (2, 2)),
    ((6, 8, 3, 1), (2, 4), (1, 2), (1, 2), 3, (1, 2), (1, 1)),
]


def make(case, seed=0):
    shape, size, stride, block, K, ps, pst = case
    rng = np.random.default_rng(seed)
    H, W, C, N = shape
    SH, SW = (H - size[0]) // stride[0] + 1, (W - size[1]) // stride[1] + 1
    x = rng.standard_normal(shape)
    w = rng.standard_normal((SH, SW, block[0] * block[1] * K, size[0], size[1], C)) * 0.3
    return x, w, dict(stride=stride, block=block, pool_size=ps, pool_stride=pst, lam=0.7, eps=0.05)


def loop_loss(x, w, kw, w_dec=None):
    """J straight from the definition, with the decoder as an explicit transpose."""
    from cotsdl import ops

    H, W, C, N = x.shape
    h = ops.local_filter(x, w, kw["stride"], kw["block"])
    # x_hat = F^T h via the definition of the adjoint: <F e_i, h> for every input unit e_i
    dec = w if w_dec is None else w_dec
    xh = np.zeros_like(x)
    for idx in np.ndindex(H, W, C):
        e = np.zeros((H, W, C, 1))
        e[idx] = 1.0
        col = ops.local_filter(e, dec, kw["stride"], kw["block"])[..., 0]
        xh[idx] = np.einsum("ijk,ijkn->n", col, h)
    p = ops.l2_pool(h, kw["pool_size"], kw["pool_stride"], kw["eps"])
    return (np.sum((xh - x) ** 2) + kw["lam"] * np.sum(p)) / N


@pytest.mark.parametrize("case", CASES)
def test_loss_matches_definition(case):
    x, w, kw = make(case)
    J, _ = sparse_ae_loss(x, w, **kw)
    assert J == pytest.approx(loop_loss(x, w, kw), rel=1e-12)


def coords(shape, n=80, seed=0):
    """A random sample of coordinates (all of them when there are few)."""
    every = list(np.ndindex(shape))
    if len(every) <= n:
        return every
    pick = np.random.default_rng(seed).choice(len(every), n, replace=False)
    return [every[i] for i in pick]


def check(analytic, f, a, h=1e-6):
    """Central differences of f at a sample of coordinates of a, against ``analytic``."""
    for i in coords(a.shape):
        old = a[i]
        a[i] = old + h
        fp = f()
        a[i] = old - h
        fm = f()
        a[i] = old
        num = (fp - fm) / (2 * h)
        assert abs(analytic[i] - num) <= 1e-6 * max(1.0, abs(num)), f"at {i}: {analytic[i]} vs {num}"


@pytest.mark.parametrize("case", CASES)
def test_tied_gradient_by_finite_differences(case):
    x, w, kw = make(case, seed=1)
    _, dw = sparse_ae_loss(x, w, **kw)
    check(dw, lambda: sparse_ae_loss(x, w, **kw)[0], w)


@pytest.mark.parametrize("case", CASES)
def test_untied_gradients_by_finite_differences(case):
    x, w, kw = make(case, seed=2)
    w_dec = np.random.default_rng(3).standard_normal(w.shape) * 0.3
    J, dw, dwd = sparse_ae_loss(x, w, w_dec=w_dec, **kw)
    assert J == pytest.approx(loop_loss(x, w, kw, w_dec), rel=1e-12)
    check(dw, lambda: sparse_ae_loss(x, w, w_dec=w_dec, **kw)[0], w)
    check(dwd, lambda: sparse_ae_loss(x, w, w_dec=w_dec, **kw)[0], w_dec)


def test_float32_stays_float32_and_eps_must_be_positive():
    x, w, kw = make(CASES[0])
    J, dw = sparse_ae_loss(x.astype(np.float32), w.astype(np.float32), **kw)
    assert dw.dtype == np.float32 and np.isfinite(J)
    with pytest.raises(ValueError, match="eps must be > 0"):
        sparse_ae_loss(x, w, **{**kw, "eps": 0.0})


def test_gradients_are_copies_unless_asked_for_the_buffers():
    """copy=False gives the cached plan's buffers (no allocation per call), overwritten by the next call;
    the default gives arrays of the caller's own, untouched by later calls."""
    x, w, kw = make(CASES[0], seed=5)
    _, mine = sparse_ae_loss(x, w, **kw)
    kept = mine.copy()
    _, b1 = sparse_ae_loss(x, w, copy=False, **kw)
    _, b2 = sparse_ae_loss(x * 2, w, copy=False, **kw)
    assert b1 is b2 and b1 is not mine
    np.testing.assert_array_equal(mine, kept)
    np.testing.assert_array_equal(sparse_ae_loss(x, w, **kw)[1], kept)
