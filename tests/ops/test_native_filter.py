"""The native filter kernels (ops/cpu/native/filter.cpp) against the numpy path.

They contract products into FMAs and sum in their own order, so they are not bitwise
the numpy path: each result is held to the error bound of a float sum, against the
numpy path in float64, ``|got - exact| <= c * eps * sum |terms|``, where the sum of
absolute terms is the same pass run on absolute values.  Shapes are fuzzed to cover
the register tiles' edges: rows not a multiple of 6 or 8, images not a multiple of
the vector width, blocks, strided views, 1-3 threads.
"""
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cotsdl.ops.cpu import filter as cf
from cotsdl.ops.cpu import native, parallel

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def cases(draw):
    rh, rw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    # Rows and columns no field covers too: past the last field, and between fields (stride > size).
    H = rh + sh * draw(st.integers(0, 3)) + draw(st.integers(0, sh - 1))
    W = rw + sw * draw(st.integers(0, 3)) + draw(st.integers(0, sw - 1))
    C, N = draw(st.integers(1, 4)), draw(st.sampled_from([1, 3, 8, 13, 16, 24, 37]))
    block, K = (draw(st.integers(1, 2)), draw(st.integers(1, 2))), draw(st.integers(1, 7))
    return (H, W, C, N), (rh, rw), (sh, sw), block, K, draw(st.sampled_from([np.float32, np.float64]))


def arrays(case, view, seed=0):
    (H, W, C, N), (rh, rw), (sh, sw), block, K, dtype = case
    rng = np.random.default_rng(seed)
    SH, SW = (H - rh) // sh + 1, (W - rw) // sw + 1
    big = rng.standard_normal((H + 2, W + 3, C, N)).astype(dtype)
    x = big[1:-1, 2:-1] if view else np.ascontiguousarray(big[1:-1, 2:-1])  # a window of a larger array
    w = rng.standard_normal((SH, SW, block[0] * block[1] * K, rh, rw, C)).astype(dtype)
    dy = rng.standard_normal((SH * block[0], SW * block[1], K, N)).astype(dtype)
    return x, w, dy


def passes(x, w, dy, size, stride, block):
    return (cf.filter_forward(x, w, stride, block).copy(),
            cf.filter_backward_data(dy, w, stride, block, x.shape).copy(),
            cf.filter_backward_weights(x, dy, size, stride, block).copy())


def assert_within_sum_bound(got, exact, terms, length, dtype):
    """|got - exact| <= (length + 2) * eps * sum |terms|, elementwise (a float sum's bound)."""
    eps = np.finfo(dtype).eps
    excess = np.abs(got.astype(np.float64) - exact) - (length + 2) * eps * terms
    assert excess.max(initial=0.0) <= 1e-300, f"error beyond the bound by {excess.max():.3g}"


@FUZZ
@given(cases(), st.booleans(), st.integers(1, 3), st.booleans())
def test_native_filter_within_the_sum_bound(case, view, threads, by_dx_rows):
    """Backward-data both ways: by sites (scatter) and by rows of dx (gather), whichever the
    traffic model would pick."""
    (H, W, C, N), size, stride, block, K, dtype = case
    x, w, dy = arrays(case, view)
    parallel.set_num_threads(threads)
    try:
        with native.use(True), mock.patch.object(cf, "by_dx_rows", lambda *a: by_dx_rows), \
                mock.patch.object(cf, "whole_vectors", lambda *a: True):  # the kernels at any N, tails too
            got = passes(x, w, dy, size, stride, block)
        with native.use(False):
            exact = passes(x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64), size, stride, block)
            terms = passes(np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)),
                           np.abs(dy.astype(np.float64)), size, stride, block)
    finally:
        parallel.set_num_threads(None)
    R, M = size[0] * size[1] * C, block[0] * block[1] * K
    for g, e, t, length in zip(got, exact, terms, (R, M * size[0] * size[1], N)):
        assert g.dtype == dtype and g.shape == e.shape
        assert_within_sum_bound(g, e, t, length, dtype)


@pytest.mark.parametrize("by_dx_rows", [False, True])
def test_paper_like_shape_with_chunked_rows(by_dx_rows):
    """More than 32 neurons: backward-data's reduction (by sites) and backward-weights' columns
    run in chunks; by rows of dx, a number's 9 sites in chunks of 6 (256 // M)."""
    case = ((14, 12, 3, 16), (6, 5), (2, 2), (2, 2), 10, np.float32)  # M = 40, R = 90
    x, w, dy = arrays(case, view=False, seed=1)
    with native.use(True), mock.patch.object(cf, "by_dx_rows", lambda *a: by_dx_rows):
        got = passes(x, w, dy, (6, 5), (2, 2), (2, 2))
    with native.use(False):
        want = passes(x, w, dy, (6, 5), (2, 2), (2, 2))
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-5 * np.abs(e).max())


@pytest.mark.parametrize("dtype, n, whole", [(np.float32, 1, False), (np.float32, 13, False), (np.float32, 16, True),
                                             (np.float64, 4, True), (np.float64, 6, False)])
def test_images_short_of_whole_vectors_take_the_numpy_path_for_forward_and_backward_data(dtype, n, whole):
    """Where the images do not fill whole 32-byte vectors the native forward and backward-data
    would run scalar tails (up to 14x slower than BLAS), so the numpy path runs them; backward-weights
    stays native (it vectorizes over the fields)."""
    case = ((9, 8, 3, n), (3, 3), (2, 2), (1, 2), 3, dtype)
    x, w, dy = arrays(case, view=False)
    called = set()
    real = native.kernel

    def spy(name, dt):
        k = real(name, dt)
        return None if k is None else (lambda *a: called.add(name) or k(*a))

    with native.use(True), mock.patch.object(cf.native, "kernel", spy):
        got = passes(x, w, dy, (3, 3), (2, 2), (1, 2))
    assert ("lc_fwd" in called) == whole and ("lc_bwd_data" in called or "lc_bwd_data_rows" in called) == whole
    assert "lc_bwd_w" in called
    with native.use(False):
        want = passes(x, w, dy, (3, 3), (2, 2), (1, 2))
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5 * np.abs(e).max())


def test_layouts_the_kernels_cannot_take_fall_back():
    case = ((9, 8, 3, 5), (3, 3), (2, 2), (1, 2), 3, np.float32)
    x, w, dy = arrays(case, view=False)
    xt = x.transpose(0, 1, 3, 2).copy().transpose(0, 1, 3, 2)  # images not contiguous
    out = np.zeros((w.shape[0], w.shape[1] * 2) + w.shape[2:], w.dtype)[:, ::2]  # a strided out=
    with native.use(True):
        got = cf.filter_forward(xt, w, (2, 2), (1, 2)).copy()
        dw = cf.filter_backward_weights(xt, dy, (3, 3), (2, 2), (1, 2), out=out)
    with native.use(False):
        want = cf.filter_forward(x, w, (2, 2), (1, 2))
        dw_want = cf.filter_backward_weights(x, dy, (3, 3), (2, 2), (1, 2))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert dw is out
    np.testing.assert_allclose(out, dw_want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_backward_weights_into_out(threads):
    case = ((10, 10, 2, 16), (4, 4), (2, 2), (1, 1), 7, np.float32)
    x, w, dy = arrays(case, view=True)
    out = np.full_like(w, np.nan)
    parallel.set_num_threads(threads)
    try:
        with native.use(True):
            assert cf.filter_backward_weights(x, dy, (4, 4), (2, 2), (1, 1), out=out) is out
        with native.use(False):
            want = cf.filter_backward_weights(x, dy, (4, 4), (2, 2), (1, 1))
    finally:
        parallel.set_num_threads(None)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@FUZZ
@given(cases(), st.booleans(), st.integers(1, 3), st.booleans())
def test_backward_weights_accumulates_bitwise(case, view, threads, use_native):
    """``accumulate=True`` adds the pass's own result to ``out``: exactly start + fresh, on
    both paths (the tied autoencoder's gradient must not depend on how it was summed)."""
    (H, W, C, N), size, stride, block, K, dtype = case
    x, w, dy = arrays(case, view)
    start = np.random.default_rng(1).standard_normal(w.shape).astype(dtype)
    parallel.set_num_threads(threads)
    try:
        with native.use(use_native):
            fresh = cf.filter_backward_weights(x, dy, size, stride, block).copy()
            out = start.copy()
            assert cf.filter_backward_weights(x, dy, size, stride, block, out=out, accumulate=True) is out
    finally:
        parallel.set_num_threads(None)
    np.testing.assert_array_equal(out, start + fresh)


@pytest.mark.parametrize("M, N, dtype, fields", [(16, 37, np.float32, True), (12, 37, np.float32, False),
                                                (28, 16, np.float32, False), (32, 32, np.float32, False),
                                                (8, 9, np.float64, True), (6, 9, np.float64, False)])
def test_backward_weights_goes_by_fields_with_fewer_neurons_than_images_in_whole_vectors(M, N, dtype, fields):
    assert cf.by_fields(M, N, dtype) is fields


@pytest.mark.parametrize("case", [
    ((11, 10, 3, 37), (4, 3), (2, 1), (2, 1), 8, np.float32),  # M = 16 < N: by fields (T_s = X_s dY_s^T)
    ((11, 10, 3, 37), (4, 3), (2, 1), (2, 1), 6, np.float32),  # M = 12 < N, not whole vectors: panels
    ((11, 10, 3, 16), (4, 3), (2, 1), (2, 2), 7, np.float32),  # M = 28 >= N: X_s^T packed in panels
    ((9, 9, 2, 9), (3, 3), (2, 2), (1, 1), 8, np.float64),     # M = 8 < N = 9, float64: by fields
], ids=["by-fields", "by-panels-partial-vectors", "by-panels", "by-fields-f64"])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("way", [None, False, True], ids=["chosen", "panels-forced", "fields-forced"])
def test_backward_weights_both_ways_within_the_sum_bound(case, accumulate, way):
    """The kernel's two ways (by fields where a site has fewer neurons than images, in whole
    vectors, else by packed panels of X_s^T), as chosen and each forced on every case (tails of
    either dimension), one pair and two, set and added, against the exact sum."""
    (H, W, C, N), size, stride, block, K, dtype = case
    x, w, dy = arrays(case, view=False, seed=4)
    x2, _, dy2 = arrays(case, view=True, seed=5)
    start = np.random.default_rng(6).standard_normal(w.shape).astype(dtype)
    choose = cf.by_fields if way is None else (lambda *a: way)
    for also in (None, (x2, dy2)):
        with native.use(True), mock.patch.object(cf, "by_fields", choose):
            got = cf.filter_backward_weights(x, dy, size, stride, block, out=start.copy() if accumulate else None,
                                             accumulate=accumulate, also=also)
        pairs = [(x, dy)] + ([] if also is None else [also])
        f64 = [(a.astype(np.float64), d.astype(np.float64)) for a, d in pairs]
        with native.use(False):
            exact = sum(cf.filter_backward_weights(a, d, size, stride, block) for a, d in f64)
            terms = sum(cf.filter_backward_weights(np.abs(a), np.abs(d), size, stride, block) for a, d in f64)
        if accumulate:
            exact, terms = exact + start, terms + np.abs(start)
        assert got.dtype == dtype
        assert_within_sum_bound(got, exact, terms, len(pairs) * N + 1, dtype)


@FUZZ
@given(cases(), st.booleans(), st.booleans(), st.integers(1, 3))
def test_backward_weights_of_two_pairs_in_one_pass(case, view, accumulate, threads):
    """``also=(x2, dy2)``: the native kernel sums both products in one reduction of 2N, or by fields
    adds the second to the first before the transpose (within a sum's bound of the exact result); the numpy path adds the second product to the first,
    exactly as two calls would.  x2 may be a view where x is not."""
    (H, W, C, N), size, stride, block, K, dtype = case
    x, w, dy = arrays(case, view)
    x2, _, dy2 = arrays(case, not view, seed=2)
    start = np.random.default_rng(3).standard_normal(w.shape).astype(dtype)
    parallel.set_num_threads(threads)
    try:
        with native.use(True):
            got = cf.filter_backward_weights(x, dy, size, stride, block, out=start.copy() if accumulate else None,
                                             accumulate=accumulate, also=(x2, dy2))
        with native.use(False):
            numpy_path = cf.filter_backward_weights(x, dy, size, stride, block, out=start.copy(),
                                                    accumulate=accumulate, also=(x2, dy2))
            two_calls = cf.filter_backward_weights(x, dy, size, stride, block, out=start.copy(), accumulate=accumulate)
            cf.filter_backward_weights(x2, dy2, size, stride, block, out=two_calls, accumulate=True)
            f64 = [(a.astype(np.float64), d.astype(np.float64)) for a, d in ((x, dy), (x2, dy2))]
            exact = sum(cf.filter_backward_weights(a, d, size, stride, block) for a, d in f64)
            terms = sum(cf.filter_backward_weights(np.abs(a), np.abs(d), size, stride, block) for a, d in f64)
    finally:
        parallel.set_num_threads(None)
    np.testing.assert_array_equal(numpy_path, two_calls)
    assert got.dtype == dtype and got.shape == w.shape
    if accumulate:  # got = start + (the pass's sum): the bound is the pass's, plus start's rounding
        exact, terms = exact + start, terms + np.abs(start)
    assert_within_sum_bound(got, exact, terms, 2 * N + 1, dtype)
