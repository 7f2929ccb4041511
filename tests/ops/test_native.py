"""The native CPU kernels (ops/cpu/native): the same bits as the numpy path, and a clean fallback.

Every other ops test runs with the kernels on (``COTSDL_NATIVE=auto``, built on first
use); here each fused pass is compared with the numpy path, bit for bit, over fuzzed
shapes, windows, strides, dtypes and non-contiguous views.
"""
import ctypes
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cotsdl import ops
from cotsdl.array.box import Box
from cotsdl.ops.cpu import native, parallel

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def both(fn):
    """fn() with the native kernels off, then on."""
    with native.use(False):
        want = fn()
    with native.use(True):
        got = fn()
    return want, got


def assert_same(want, got):
    for w, g in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
        assert w.dtype == g.dtype and w.shape == g.shape
        np.testing.assert_array_equal(g, w)


def test_kernels_build_and_every_export_has_a_signature():
    lib = native.library()
    assert lib is not None, "the native kernels did not build here (a C++ compiler is on every CI machine)"
    sigs = {k: v for src in native.SOURCES for k, v in native.signatures(src.read_text()).items()}
    assert len(sigs) >= 12 and {"lc_fwd", "lc_bwd_data", "lc_bwd_w"} <= set(sigs)
    for name, kinds in sigs.items():
        assert set(kinds) <= set("pis")
        for suffix in ("f32", "f64"):
            assert isinstance(getattr(lib, f"cotsdl_{name}_{suffix}"), ctypes._CFuncPtr)


@st.composite
def pool_cases(draw):
    ph, pw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    qh, qw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    H, W = ph + draw(st.integers(0, 9)), pw + draw(st.integers(0, 9))
    C, N = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    return (H, W, C, N), (ph, pw), (qh, qw), draw(st.sampled_from([np.float32, np.float64])), draw(st.booleans())


@FUZZ
@given(pool_cases(), st.integers(1, 3))
def test_pool_native_is_bitwise_numpy(case, threads):
    shape, size, stride, dtype, view = case
    rng = np.random.default_rng(sum(shape))
    big = rng.standard_normal((shape[0] + 2, shape[1] + 3) + shape[2:]).astype(dtype)
    x = big[1:-1, 2:-1] if view else np.ascontiguousarray(big[1:-1, 2:-1])  # a strided window, or not
    parallel.set_num_threads(threads)
    try:
        y, y2 = both(lambda: ops.l2_pool(x, size, stride, 0.01))
        assert_same(y, y2)
        dy = rng.standard_normal(y.shape).astype(dtype)
        dy[0, 0] = 0
        y[-1, -1] = 0  # y == 0 contributes nothing, on both paths
        assert_same(*both(lambda: ops.l2_pool_backward(dy, x, y, size, stride)))
    finally:
        parallel.set_num_threads(None)


@pytest.mark.parametrize("size", [(1, 1), (1, 2), (2, 2), (2, 3), (3, 1), (3, 2), (3, 3), (4, 2)])
@pytest.mark.parametrize("rows", [1, 4, 9, 19])
def test_pool_rows_at_once_are_bitwise_numpy(size, rows, monkeypatch):
    # stride 1 along H: the fixed-size kernels (up to 3x3) take several output rows at once
    # (POOL_ROWS), the rest one by one; 9 rows in one band are two blocks and a remainder.  Small
    # bands are forced too (PARALLEL_BYTES = 1: two bands per thread), so with 19 rows blocks start
    # at i0 > 0; the input is a strided view as well as contiguous.
    rng = np.random.default_rng(rows)
    for dtype in (np.float32, np.float64):
        big = rng.standard_normal((rows + size[0] + 1, 10, 3, 8)).astype(dtype)
        for x in (np.ascontiguousarray(big[1:-1, 1:8]), big[1:-1, 1:8]):
            for threads, band_bytes in ((1, None), (2, None), (2, 1), (3, 1)):
                parallel.set_num_threads(threads)
                if band_bytes:
                    monkeypatch.setattr(parallel, "PARALLEL_BYTES", band_bytes)
                try:
                    assert_same(*both(lambda: ops.l2_pool(x, size, (1, 2), 0.01)))
                finally:
                    parallel.set_num_threads(None)
                    monkeypatch.undo()


def test_pool_layout_the_kernel_cannot_take_falls_back():
    x = np.random.default_rng(0).standard_normal((6, 5, 4, 3)).astype(np.float32)
    xt = x.transpose(0, 1, 3, 2).copy().transpose(0, 1, 3, 2)  # channels and images swapped in memory
    assert native.strides(xt, 2) is None
    with native.use(True):
        np.testing.assert_array_equal(ops.l2_pool(xt, (2, 2), (1, 1), 0.01), ops.l2_pool(x, (2, 2), (1, 1), 0.01))


@st.composite
def lcn_cases(draw):
    size = draw(st.sampled_from([1, 3, 5, 7]))
    H, W = draw(st.integers(1, 14)), draw(st.integers(1, 14))
    C, N = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    i0, j0 = draw(st.integers(0, H - 1)), draw(st.integers(0, W - 1))
    out = Box((i0, j0), (draw(st.integers(i0 + 1, H)), draw(st.integers(j0 + 1, W))))
    return (H, W, C, N), size, out, draw(st.sampled_from([np.float32, np.float64])), draw(st.integers(0, 2))


@FUZZ
@given(lcn_cases(), st.integers(0, 2), st.integers(1, 3))
def test_lcn_window_native_is_bitwise_numpy(case, margin, threads):
    """A window of a larger image, its input a strided view with a margin beyond what it needs."""
    (H, W, C, N), size, out, dtype, pad = case
    rng = np.random.default_rng(H * W + C)
    image = rng.standard_normal((H, W, C, N)).astype(dtype)
    image[: H // 2] *= 0.05  # some pixels take the image mean, some the local std
    rho = size // 2
    need = Box((max(0, out.lo[0] - 2 * rho - margin), max(0, out.lo[1] - 2 * rho - pad)),
               (min(H, out.hi[0] + 2 * rho + margin), min(W, out.hi[1] + 2 * rho)))
    x = image[need.slices_in(Box((0, 0), (H, W)))]
    dy = rng.standard_normal(out.shape + (C, N)).astype(dtype)
    parallel.set_num_threads(threads)
    try:
        def run():
            y, cache = ops.lcn_window(x, need, out, (H, W), size, 1.0, 1e-3, workspace=ops.Workspace())
            return y, ops.lcn_window_backward(dy, cache)
        assert_same(*both(run))
    finally:
        parallel.set_num_threads(None)


def test_lcn_banded_and_threaded_is_bitwise_numpy(monkeypatch):
    """Large enough to be cut into bands over 2 threads (the threaded, banded kernels)."""
    monkeypatch.setattr(parallel, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(parallel, "CHUNK_BYTES", 1 << 12)
    x = np.random.default_rng(3).standard_normal((24, 19, 3, 4)).astype(np.float32)
    dy = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
    parallel.set_num_threads(2)
    try:
        assert_same(*both(lambda: (ops.lcn(x, 5, 1.0, 1e-4), ops.lcn_backward(dy, x, 5, 1.0, 1e-4))))
        assert_same(*both(lambda: ops.l2_pool_backward(dy[:-2, :-2], x, ops.l2_pool(x, (3, 3), (1, 1), 0.1),
                                                       (3, 3), (1, 1))))
    finally:
        parallel.set_num_threads(None)


def test_mode_values(monkeypatch):
    try:
        monkeypatch.setenv("COTSDL_NATIVE", "0")
        native.reset()
        assert native.library() is None and native.kernel("pool_fwd", np.float32) is None
        monkeypatch.setenv("COTSDL_NATIVE", "yes")
        native.reset()
        with pytest.raises(ValueError, match="COTSDL_NATIVE must be auto, 0 or 1, got 'yes'"):
            native.library()
        monkeypatch.setenv("COTSDL_NATIVE", "auto")
        native.reset()
        assert native.kernel("pool_fwd", np.float32) is not None
        assert native.kernel("pool_fwd", np.int32) is None  # numpy handles other dtypes
    finally:
        monkeypatch.undo()
        native.reset()


@pytest.mark.parametrize("mode", ["auto", "1"])
@pytest.mark.parametrize("cxx", ["/bin/false", "/nonexistent/g++"])
def test_no_compiler(tmp_path, mode, cxx):
    """Without a working compiler: auto warns once and runs numpy; 1 refuses, naming the cause."""
    code = textwrap.dedent("""
        import warnings, numpy as np
        from cotsdl import ops
        x = np.ones((4, 4, 1, 1), np.float32)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            y = ops.l2_pool(x, (2, 2), (1, 1), 0.0)
            ops.l2_pool(x, (2, 2), (1, 1), 0.0)
        assert float(y[0, 0, 0, 0]) == 2.0
        print("WARNINGS", len([m for m in w if "native CPU kernels unavailable" in str(m.message)]))
    """)
    env = dict(os.environ, COTSDL_NATIVE=mode, CXX=cxx, COTSDL_KERNEL_CACHE=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if mode == "auto":
        assert res.returncode == 0, res.stderr
        assert "WARNINGS 1" in res.stdout
    else:
        assert res.returncode != 0
        assert "COTSDL_NATIVE=1 but the native kernels are unavailable" in res.stderr
        assert ("filter.cpp failed" if cxx == "/bin/false" else "No such file") in res.stderr
