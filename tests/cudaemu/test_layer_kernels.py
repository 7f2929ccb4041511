"""Every layer kernel, driven through the CUDA backend's own wrappers on the emulator
(the cuda-emu backend), equals the numpy backend, in both thread orders."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cotsdl import backend, ops
from cotsdl.ops._dispatch import implementation
from cotsdl.cudaemu import asan_environment
from cotsdl.ops.cuda import filter as cuda_filter
from testkit import BACKWARD_DATA_WAYS, FILTER_CASES, PIPELINE_CASES, backward_data_case

ORDERS = ["forward", "reverse"]


def both(fn):
    """fn() on the numpy backend and on the emulated CUDA backend."""
    with backend.using("numpy"):
        ref = fn()
    with backend.using("cuda-emu"):
        got = fn()
    return ref, got


def test_the_emulated_backend_runs_the_cuda_wrappers():
    x = np.zeros((1, 1, 1, 1), np.float32)
    with backend.using("cuda-emu"):
        assert implementation(x) is ops.cuda
    with backend.using("numpy"):
        assert implementation(x) is ops.cpu


@pytest.fixture(autouse=True)
def order(request, monkeypatch):
    monkeypatch.setenv("COTSDL_EMU_ORDER", getattr(request, "param", "forward"))


def close(ref, got, dtype):
    assert got.dtype == ref.dtype == dtype and got.shape == ref.shape
    tol = 1e-5 if dtype == np.float32 else 1e-12
    scale = max(float(np.abs(ref).max()), 1e-30)
    assert float(np.abs(got - ref).max()) <= tol * scale


@pytest.mark.parametrize("order", ORDERS, indirect=True)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", FILTER_CASES)
def test_filter_kernels(case, dtype, order):
    shape, size, stride, block, K = case
    rng = np.random.default_rng(sum(shape))
    H, W, C, N = shape
    SH, SW = (H - size[0]) // stride[0] + 1, (W - size[1]) // stride[1] + 1
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal((SH, SW, block[0] * block[1] * K, size[0], size[1], C)).astype(dtype)
    dy = rng.standard_normal((SH * block[0], SW * block[1], K, N)).astype(dtype)
    close(*both(lambda: ops.local_filter(x, w, stride, block)), dtype)
    close(*both(lambda: ops.local_filter_backward_data(dy, w, stride, block, input_shape=x.shape)), dtype)
    close(*both(lambda: ops.local_filter_backward_weights(x, dy, size, stride, block)), dtype)
    start = rng.standard_normal(w.shape).astype(dtype)  # accumulate: added to a kept gradient
    close(*both(lambda: ops.local_filter_backward_weights(x, dy, size, stride, block, out=start.copy(),
                                                         accumulate=True)), dtype)
    x2, dy2 = rng.standard_normal(x.shape).astype(dtype), rng.standard_normal(dy.shape).astype(dtype)
    close(*both(lambda: ops.local_filter_backward_weights(x, dy, size, stride, block, also=(x2, dy2))), dtype)
    # written into out by the kernel: over it, or added to it, one pair or two
    close(*both(lambda: ops.local_filter_backward_weights(x, dy, size, stride, block, out=start.copy())), dtype)
    close(*both(lambda: ops.local_filter_backward_weights(x, dy, size, stride, block, out=start.copy(),
                                                         accumulate=True, also=(x2, dy2))), dtype)


@pytest.mark.parametrize("copies", ["late", "early"])
@pytest.mark.parametrize("order", ORDERS, indirect=True)
@pytest.mark.parametrize("gemm", [v for v in cuda_filter.VARIANTS if v != "registers"])
@pytest.mark.parametrize("case", PIPELINE_CASES)
def test_filter_gemm_variants(case, gemm, order, copies, monkeypatch):
    """Every cp.async pipeline of the 128-row tiles equals numpy, its copies landing as late (when
    waited for) or as early (at issue) as PTX allows, in both thread orders: a missing wait or barrier
    would read a stale or overwritten stage in one of them."""
    monkeypatch.setenv("COTSDL_EMU_ASYNC", copies)
    shape, size, stride, block, K = case
    rng = np.random.default_rng(sum(shape) + 7)
    H, W, C, N = shape
    SH, SW = (H - size[0]) // stride[0] + 1, (W - size[1]) // stride[1] + 1
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((SH, SW, block[0] * block[1] * K, size[0], size[1], C)).astype(np.float32)
    dy = rng.standard_normal((SH * block[0], SW * block[1], K, N)).astype(np.float32)
    assert cuda_filter._tiles(block[0] * block[1] * K, N, np.float32, gemm)["GT_STAGES"] == cuda_filter.VARIANTS[gemm]
    with cuda_filter.gemm_variant(gemm):
        close(*both(lambda: ops.local_filter(x, w, stride, block)), np.float32)
        monkeypatch.setattr(cuda_filter, "CELL_ROWS", 10**9)  # by sites: the (R x M)(M x N) products
        close(*both(lambda: ops.local_filter_backward_data(dy, w, stride, block, input_shape=x.shape)), np.float32)
        start = rng.standard_normal(w.shape).astype(np.float32)
        close(*both(lambda: ops.local_filter_backward_weights(x, dy, size, stride, block, out=start.copy(),
                                                             accumulate=True)), np.float32)


def test_gemm_variant_names_are_checked():
    with pytest.raises(ValueError, match="no GEMM variant 'async9'"):
        with cuda_filter.gemm_variant("async9"):
            pass
    env = dict(os.environ, COTSDL_GEMM_VARIANT="fast")
    r = subprocess.run([sys.executable, "-c", "import cotsdl.ops.cuda.filter"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "COTSDL_GEMM_VARIANT: no GEMM variant 'fast'" in r.stderr


@pytest.mark.parametrize("way", BACKWARD_DATA_WAYS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", FILTER_CASES)
def test_backward_data_every_way(case, dtype, way, monkeypatch):
    """Every way of backward-data (cuda/filter.cu) on every case, whichever by_sites would choose."""
    dy, w = backward_data_case(case, dtype, way, monkeypatch, np.random.default_rng(sum(case[0]) + 1))
    shape, _, stride, block, _ = case
    close(*both(lambda: ops.local_filter_backward_data(dy, w, stride, block, input_shape=shape)), dtype)


@pytest.mark.parametrize("index", ["i32", "i64"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_elementwise_kernels_with_either_index_width(index, dtype, monkeypatch):
    """Pooling and LCN's smoothing decode their linear index in 32 bits where it fits (the _i32
    kernels) and in 64 bits beyond: both instances equal numpy (the 64-bit one forced here)."""
    from cotsdl.ops.cuda import _launch

    if index == "i64":
        monkeypatch.setattr(_launch, "MAX_I32_ELEMENTS", 0)
    assert _launch.indexed("k", 10) == ("k_i32" if index == "i32" else "k")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((9, 8, 3, 5)).astype(dtype)
    y = ops.l2_pool(x, (3, 2), (2, 1), 0.01)
    dy = rng.standard_normal(y.shape).astype(dtype)
    close(*both(lambda: ops.l2_pool(x, (3, 2), (2, 1), 0.01)), dtype)
    close(*both(lambda: ops.l2_pool_backward(dy, x, y, (3, 2), (2, 1))), dtype)
    dz = rng.standard_normal(x.shape).astype(dtype)
    close(*both(lambda: ops.lcn(x, 5, 1.5, 1e-3)), dtype)
    close(*both(lambda: ops.lcn_backward(dz, x, 5, 1.5, 1e-3)), dtype)


@pytest.mark.parametrize("order", ORDERS, indirect=True)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, size, stride, eps", [((8, 7, 3, 4), (2, 2), (2, 2), 0.01), ((9, 10, 1, 1), (3, 2), (2, 3), 0.0),
                                                     ((7, 6, 2, 33), (3, 3), (1, 2), 1e-3)])
def test_pool_kernels(shape, size, stride, eps, dtype, order):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(dtype)
    x[0, 0] = 0  # a zero window element
    y = ops.l2_pool(x, size, stride, eps)
    dy = rng.standard_normal(y.shape).astype(dtype)
    close(*both(lambda: ops.l2_pool(x, size, stride, eps)), dtype)
    close(*both(lambda: ops.l2_pool_backward(dy, x, y, size, stride)), dtype)


@pytest.mark.parametrize("order", ORDERS, indirect=True)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, size, sigma", [((7, 6, 2, 3), 3, 1.0), ((9, 8, 3, 2), 5, 1.5), ((5, 11, 1, 1), 7, 2.0),
                                                ((4, 4, 2, 2), 9, 3.0)])
def test_lcn_kernels(shape, size, sigma, dtype, order):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    close(*both(lambda: ops.lcn(x, size, sigma, 1e-3)), dtype)
    close(*both(lambda: ops.lcn_backward(dy, x, size, sigma, 1e-3)), dtype)


@pytest.mark.timeout(900)
def test_the_kernel_suite_is_clean_under_asan():
    """The tests above once more, every kernel built with AddressSanitizer."""
    env = {**os.environ, **asan_environment(), "COTSDL_EMU_ASAN": "1"}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__)),
                          "-k", "not asan"], capture_output=True, text=True, env=env,
                         timeout=880)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert "AddressSanitizer" not in res.stderr


def test_offsets_too_large_for_32_bits_are_refused(monkeypatch):
    """The kernels' index tables are 32-bit: a layer whose field offsets exceed them is refused by
    name, not computed wrong (the limit is lowered here instead of allocating 8 GB)."""
    from cotsdl.ops.cuda import filter as cuda_filter

    x = np.zeros((6, 7, 2, 5), np.float32)
    w = np.zeros((2, 3, 4, 3, 3, 2), np.float32)  # sites 2 x 3 with stride (3, 2), M = 4
    cuda_filter._offsets.cache_clear()
    last = ((2 * 7 + 2) * 2 + 1) * 5 + 5 - 1  # x's last element a site's field reaches from its corner
    monkeypatch.setattr(cuda_filter, "MAX_OFFSET", last - 1)
    try:
        with backend.using("cuda-emu"), pytest.raises(ValueError, match=r"input x spans 170 elements .*6x7x2, "
                                                                           r"batch 5.*32-bit offsets"):
            ops.local_filter(x, w, (3, 2), (1, 1))
        monkeypatch.setattr(cuda_filter, "MAX_OFFSET", last)  # exactly fits
        with backend.using("cuda-emu"):
            assert ops.local_filter(x, w, (3, 2), (1, 1)).shape == (2, 3, 4, 5)
        # y's offsets: 1x1 fields, blocks of 3x3x4 units on 6x7 sites; backward-data reads dy through them
        dy, w1 = np.zeros((18, 21, 4, 5), np.float32), np.zeros((6, 7, 36, 1, 1, 1), np.float32)
        cuda_filter._offsets.cache_clear()
        last_y = ((2 * 7 * 3 + 2) * 4 + 3) * 5 + 5 - 1
        monkeypatch.setattr(cuda_filter, "MAX_OFFSET", last_y - 1)
        with backend.using("cuda-emu"), pytest.raises(ValueError, match=r"output y spans 900 elements"):
            ops.local_filter_backward_data(dy, w1, (1, 1), (3, 3), input_shape=(6, 7, 1, 5))
    finally:
        cuda_filter._offsets.cache_clear()
