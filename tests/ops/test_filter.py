import numpy as np
import pytest

from cotsdl import ops
from gradcheck import assert_grad
from reference import local_filter as ref_filter

CASES = [  # (H, W, C, N), size, stride, block, K
    ((9, 8, 3, 4), (3, 3), (2, 2), (1, 1), 2),
    ((10, 7, 1, 1), (4, 2), (3, 2), (2, 1), 3),   # stride does not divide, C = 1, N = 1
    ((8, 9, 2, 5), (5, 4), (1, 2), (2, 3), 1),    # blocks bh, bw > 1
    ((6, 6, 2, 3), (6, 6), (1, 1), (1, 1), 4),    # one site
    ((11, 13, 2, 2), (3, 5), (4, 3), (3, 2), 2),
    ((20, 9, 2, 3), (5, 3), (2, 2), (1, 1), 2),   # 8 site rows, each writing 2 more rows' x rows
    ((21, 10, 1, 2), (6, 4), (3, 2), (2, 2), 1),
]


def make(case, dtype, seed=0):
    shape, size, stride, block, K = case
    rng = np.random.default_rng(seed)
    H, W, C, N = shape
    SH, SW = (H - size[0]) // stride[0] + 1, (W - size[1]) // stride[1] + 1
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal((SH, SW, block[0] * block[1] * K, size[0], size[1], C)).astype(dtype)
    return x, w, size, stride, block


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_matches_loops(case, dtype):
    x, w, size, stride, block = make(case, dtype)
    y = ops.local_filter(x, w, stride, block)
    assert y.dtype == dtype
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, ref_filter(x.astype(float), w.astype(float), stride, block), rtol=tol, atol=tol)


@pytest.fixture(params=["serial", "threads-small-bands"])
def scatter(request, monkeypatch):
    """Backward-data's schedules: one thread, one band; or 3 threads, a band per site row, so the
    colored blocks of site rows (and their shared x rows) are exercised wherever the sizes allow."""
    from cotsdl.ops.cpu import parallel

    if request.param == "serial":
        ops.set_num_threads(1)
    else:
        ops.set_num_threads(3)
        monkeypatch.setattr(parallel, "CHUNK_BYTES", 1)
    yield request.param
    ops.set_num_threads(None)


@pytest.mark.parametrize("case", CASES)
def test_adjoint_identity(case, scatter):
    x, w, size, stride, block = make(case, np.float64, seed=1)
    y = ops.local_filter(x, w, stride, block)
    r = np.random.default_rng(2).standard_normal(y.shape)
    xt = ops.local_filter_backward_data(r, w, stride, block, input_shape=x.shape)
    assert xt.shape == x.shape
    lhs, rhs = np.sum(y * r), np.sum(x * xt)
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs))


@pytest.mark.parametrize("case", CASES)
def test_gradients_by_finite_differences(case, scatter):
    x, w, size, stride, block = make(case, np.float64, seed=3)
    r = np.random.default_rng(4).standard_normal(ops.local_filter(x, w, stride, block).shape)
    loss = lambda x_, w_: np.sum(ops.local_filter(x_, w_, stride, block) * r)  # noqa: E731
    dx = ops.local_filter_backward_data(r, w, stride, block, input_shape=x.shape)
    dw = ops.local_filter_backward_weights(x, r, size, stride, block)
    assert dw.shape == w.shape
    assert_grad(dx, lambda x_: loss(x_, w), x)
    assert_grad(dw, lambda w_: loss(x, w_), w)


def test_threads_do_not_change_results():
    x, w, size, stride, block = make(CASES[4], np.float64, seed=5)
    outs = []
    for n in (1, 2, 3):
        ops.set_num_threads(n)
        try:
            outs.append((ops.local_filter(x, w, stride, block), ops.local_filter_backward_weights(x, ops.local_filter(x, w, stride, block), size, stride, block)))
        finally:
            ops.set_num_threads(None)
    for y, dw in outs[1:]:
        np.testing.assert_array_equal(y, outs[0][0])
        np.testing.assert_array_equal(dw, outs[0][1])


def test_bad_arguments_are_named():
    x, w, size, stride, block = make(CASES[0], np.float32)
    with pytest.raises(ValueError, match="stride must be a pair"):
        ops.local_filter(x, w, (0, 1))
    with pytest.raises(ValueError, match="sites"):
        ops.local_filter(x, w, (1, 1))
    with pytest.raises(ValueError, match="dtypes differ"):
        ops.local_filter(x, w.astype(np.float64), stride)
    with pytest.raises(ValueError, match="4-D"):
        ops.local_filter(x[0], w, stride)
    with pytest.raises(ValueError, match="input channels"):
        ops.local_filter(x[:, :, :2], w, stride)
    with pytest.raises(ValueError, match="multiple of the block"):
        ops.local_filter(x, w[:, :, :1], stride, (2, 1))


def test_a_workspace_serves_calls_of_any_shape():
    """One workspace (as a layer holds) reused across passes, shapes, dtypes and threads gives the same results."""
    from cotsdl.ops.cpu.workspace import Workspace

    ws = Workspace()
    for case in CASES:
        for dtype in (np.float32, np.float64):
            x, w, size, stride, block = make(case, dtype, seed=6)
            y = ops.local_filter(x, w, stride, block)
            dx = ops.local_filter_backward_data(y, w, stride, block, input_shape=x.shape)
            dw = ops.local_filter_backward_weights(x, y, size, stride, block)
            for threads in (1, 2):
                ops.set_num_threads(threads)
                try:
                    np.testing.assert_array_equal(ops.local_filter(x, w, stride, block, workspace=ws), y)
                    np.testing.assert_allclose(ops.local_filter_backward_data(y, w, stride, block, input_shape=x.shape,
                                                                              workspace=ws), dx, rtol=1e-5, atol=1e-5)
                    np.testing.assert_array_equal(ops.local_filter_backward_weights(x, y, size, stride, block,
                                                                                    workspace=ws), dw)
                finally:
                    ops.set_num_threads(None)
    assert ws.nbytes > 0


def test_weight_gradient_into_a_kept_buffer():
    x, w, size, stride, block = make(CASES[2], np.float32, seed=11)
    dy = ops.local_filter(x, w, stride, block)
    want = ops.local_filter_backward_weights(x, dy, size, stride, block)
    buf = np.full(w.shape, np.nan, np.float32)
    got = ops.local_filter_backward_weights(x, dy, size, stride, block, out=buf)
    assert got is buf
    np.testing.assert_array_equal(buf, want)
    for bad in (np.empty(w.shape, np.float64), np.empty(w.shape[:-1], np.float32),
                np.empty(w.shape[::-1], np.float32).T):
        with pytest.raises(ValueError, match="out must be a C-contiguous float32 array of shape"):
            ops.local_filter_backward_weights(x, dy, size, stride, block, out=bad)
    with pytest.raises(ValueError, match="accumulate=True needs out="):
        ops.local_filter_backward_weights(x, dy, size, stride, block, accumulate=True)
    start = np.random.default_rng(12).standard_normal(w.shape).astype(np.float32)
    acc = start.copy()
    assert ops.local_filter_backward_weights(x, dy, size, stride, block, out=acc, accumulate=True) is acc
    np.testing.assert_array_equal(acc, start + want)


def test_weight_gradient_of_two_pairs_checks_them():
    """``also``: a second (x, dy) pair of the same shapes and dtype, named when it is not."""
    x, w, size, stride, block = make(CASES[2], np.float32, seed=13)
    dy = ops.local_filter(x, w, stride, block)
    x2, dy2 = x[::-1].copy(), dy[:, ::-1].copy()
    got = ops.local_filter_backward_weights(x, dy, size, stride, block, also=(x2, dy2))
    want = ops.local_filter_backward_weights(x, dy, size, stride, block) + \
        ops.local_filter_backward_weights(x2, dy2, size, stride, block)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    with pytest.raises(ValueError, match="also must be a pair"):
        ops.local_filter_backward_weights(x, dy, size, stride, block, also=[x2, dy2])
    with pytest.raises(ValueError, match=r"also: x2 .* must have the shapes of"):
        ops.local_filter_backward_weights(x, dy, size, stride, block, also=(x2[1:], dy2))
    with pytest.raises(ValueError, match="dtypes differ"):
        ops.local_filter_backward_weights(x, dy, size, stride, block, also=(x2, dy2.astype(np.float64)))
