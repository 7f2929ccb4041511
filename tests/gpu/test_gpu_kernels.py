"""On a real GPU: the same kernel comparisons the emulator tests make, on CuPy arrays."""
from pathlib import Path

import numpy as np
import pytest

from cotsdl.array import boxcopy
from cotsdl.array.box import Box
from testkit import BACKWARD_DATA_WAYS, FILTER_CASES, PIPELINE_CASES, backward_data_case

HERE = Path(__file__).resolve().parent.parent / "cudaemu"


@pytest.fixture(scope="module")
def cp():
    import cupy  # must import when a device exists

    return cupy


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", range(8))
def test_halo_kernels_on_device(cp, seed, dtype):
    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in rng.integers(1, 12, 4))
    arr_box = Box.from_shape(shape, tuple(int(v) for v in rng.integers(-3, 3, 4)))
    lo = [int(rng.integers(l, h)) for l, h in zip(arr_box.lo, arr_box.hi)]
    box = Box(lo, [int(rng.integers(a + 1, h + 1)) for a, h in zip(lo, arr_box.hi)])
    host = rng.standard_normal(shape).astype(dtype)
    arr = cp.asarray(host)
    buf = cp.empty(box.size, dtype)
    boxcopy.pack(arr, arr_box, box, buf)
    np.testing.assert_array_equal(cp.asnumpy(buf), host[box.slices_in(arr_box)].ravel())
    out = cp.zeros_like(arr)
    boxcopy.unpack(buf, out, arr_box, box, add=True)
    boxcopy.unpack(buf, out, arr_box, box, add=True)
    expect = np.zeros_like(host)
    expect[box.slices_in(arr_box)] = 2 * host[box.slices_in(arr_box)]
    np.testing.assert_array_equal(cp.asnumpy(out), expect)


def test_selftest_kernels_on_device(cp):
    mod = cp.RawModule(code=(HERE / "selftest.cu").read_text(), options=("-std=c++17",))
    rng = np.random.default_rng(0)
    n, k, m = 37, 21, 45
    A, B = rng.standard_normal((n, k), dtype=np.float32), rng.standard_normal((k, m), dtype=np.float32)
    C = cp.zeros((n, m), np.float32)
    mod.get_function("matmul_tiled")((3, 3), (16, 16), (cp.asarray(A), cp.asarray(B), C, np.int32(n), np.int32(k), np.int32(m)))
    np.testing.assert_allclose(cp.asnumpy(C), A @ B, rtol=1e-4, atol=1e-4)
    x = rng.standard_normal(3 * 48 - 7).astype(np.float32)
    out = cp.zeros(3, np.float32)
    mod.get_function("block_sum")((3,), (48,), (cp.asarray(x), out, np.int32(x.size)))
    np.testing.assert_allclose(cp.asnumpy(out), [x[b * 48:(b + 1) * 48].sum() for b in range(3)], rtol=1e-5, atol=1e-4)
    data = rng.integers(0, 256, 10007).astype(np.uint8)
    hist = cp.zeros(256, np.uint32)
    mod.get_function("histogram")((7,), (96,), (cp.asarray(data), np.int32(data.size), hist))
    np.testing.assert_array_equal(cp.asnumpy(hist), np.bincount(data, minlength=256))


@pytest.mark.parametrize("case", FILTER_CASES)  # every tile shape the wrappers choose
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_kernels_on_device_equal_numpy(cp, dtype, case):
    from cotsdl import ops

    (H, W, C, N), size, stride, block, K = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((H, W, C, N)).astype(dtype)
    SH, SW = (H - size[0]) // stride[0] + 1, (W - size[1]) // stride[1] + 1
    w = rng.standard_normal((SH, SW, block[0] * block[1] * K, size[0], size[1], C)).astype(dtype)
    dy = rng.standard_normal((SH * block[0], SW * block[1], K, N)).astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12

    def same(dev, host):
        host = np.asarray(host)
        assert float(np.abs(cp.asnumpy(dev) - host).max()) <= tol * max(float(np.abs(host).max()), 1e-30)

    X, W_, DY = cp.asarray(x), cp.asarray(w), cp.asarray(dy)
    same(ops.local_filter(X, W_, stride, block), ops.local_filter(x, w, stride, block))
    same(ops.local_filter_backward_data(DY, W_, stride, block, input_shape=x.shape),
         ops.local_filter_backward_data(dy, w, stride, block, input_shape=x.shape))
    same(ops.local_filter_backward_weights(X, DY, size, stride, block),
         ops.local_filter_backward_weights(x, dy, size, stride, block))
    start = rng.standard_normal(w.shape).astype(dtype)
    same(ops.local_filter_backward_weights(X, DY, size, stride, block, out=cp.asarray(start), accumulate=True),
         ops.local_filter_backward_weights(x, dy, size, stride, block, out=start.copy(), accumulate=True))
    x2, dy2 = rng.standard_normal(x.shape).astype(dtype), rng.standard_normal(dy.shape).astype(dtype)
    X2, DY2 = cp.asarray(x2), cp.asarray(dy2)
    same(ops.local_filter_backward_weights(X, DY, size, stride, block, also=(X2, DY2)),
         ops.local_filter_backward_weights(x, dy, size, stride, block, also=(x2, dy2)))
    p = ops.l2_pool(x, (2, 2), (1, 2), 0.01)
    same(ops.l2_pool(X, (2, 2), (1, 2), 0.01), p)
    dp = rng.standard_normal(p.shape).astype(dtype)
    same(ops.l2_pool_backward(cp.asarray(dp), X, cp.asarray(p), (2, 2), (1, 2)), ops.l2_pool_backward(dp, x, p, (2, 2), (1, 2)))
    same(ops.lcn(X, 3, 1.0, 1e-3), ops.lcn(x, 3, 1.0, 1e-3))
    dz = rng.standard_normal(x.shape).astype(dtype)
    same(ops.lcn_backward(cp.asarray(dz), X, 3, 1.0, 1e-3), ops.lcn_backward(dz, x, 3, 1.0, 1e-3))


@pytest.mark.parametrize("way", BACKWARD_DATA_WAYS)
@pytest.mark.parametrize("case", FILTER_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_data_every_way_on_device(cp, dtype, case, way, monkeypatch):
    from cotsdl import ops

    dy, w = backward_data_case(case, dtype, way, monkeypatch, np.random.default_rng(1))
    shape, _, stride, block, _ = case
    ref = ops.local_filter_backward_data(dy, w, stride, block, input_shape=shape)
    got = cp.asnumpy(ops.local_filter_backward_data(cp.asarray(dy), cp.asarray(w), stride, block, input_shape=shape))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert float(np.abs(got - ref).max()) <= tol * max(float(np.abs(ref).max()), 1e-30)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_weights_into_out_on_device(cp, dtype):
    """The kernel writes over, or adds into, the caller's gradient; a second pair adds to the first."""
    from cotsdl import ops

    (H, W, C, N), size, stride, block, K = FILTER_CASES[5]
    rng = np.random.default_rng(2)
    SH, SW = (H - size[0]) // stride[0] + 1, (W - size[1]) // stride[1] + 1
    x, x2 = (rng.standard_normal((H, W, C, N)).astype(dtype) for _ in range(2))
    dy, dy2 = (rng.standard_normal((SH * block[0], SW * block[1], K, N)).astype(dtype) for _ in range(2))
    start = rng.standard_normal((SH, SW, block[0] * block[1] * K) + size + (C,)).astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for accumulate in (False, True):
        for also in (None, (x2, dy2)):
            ref = ops.local_filter_backward_weights(x, dy, size, stride, block, out=start.copy(),
                                                    accumulate=accumulate, also=also)
            out = cp.asarray(start)
            got = ops.local_filter_backward_weights(cp.asarray(x), cp.asarray(dy), size, stride, block, out=out,
                                                    accumulate=accumulate,
                                                    also=None if also is None else tuple(cp.asarray(a) for a in also))
            assert got is out
            assert float(np.abs(cp.asnumpy(got) - ref).max()) <= tol * float(np.abs(ref).max())


@pytest.mark.parametrize("gemm", ["async2", "async3", "async4"])
@pytest.mark.parametrize("case", PIPELINE_CASES[:1] + FILTER_CASES[5:8])  # four distinct cases
def test_gemm_variants_on_device_equal_numpy(cp, case, gemm, monkeypatch):
    """The cp.async pipelines of the 128-row tiles (cuda/gemm_tile.cuh) on the device, every pass."""
    from cotsdl import ops
    from cotsdl.ops.cuda import filter as cuda_filter

    (H, W, C, N), size, stride, block, K = case
    rng = np.random.default_rng(3)
    SH, SW = (H - size[0]) // stride[0] + 1, (W - size[1]) // stride[1] + 1
    x = rng.standard_normal((H, W, C, N)).astype(np.float32)
    w = rng.standard_normal((SH, SW, block[0] * block[1] * K, size[0], size[1], C)).astype(np.float32)
    dy = rng.standard_normal((SH * block[0], SW * block[1], K, N)).astype(np.float32)

    def same(dev, host):
        assert float(np.abs(cp.asnumpy(dev) - host).max()) <= 1e-5 * max(float(np.abs(host).max()), 1e-30)

    X, W_, DY = cp.asarray(x), cp.asarray(w), cp.asarray(dy)
    monkeypatch.setattr(cuda_filter, "CELL_ROWS", 10**9)  # backward-data by sites: the (R x M)(M x N) products
    with cuda_filter.gemm_variant(gemm):
        same(ops.local_filter(X, W_, stride, block), ops.local_filter(x, w, stride, block))
        same(ops.local_filter_backward_data(DY, W_, stride, block, input_shape=x.shape),
             ops.local_filter_backward_data(dy, w, stride, block, input_shape=x.shape))
        start = rng.standard_normal(w.shape).astype(np.float32)
        same(ops.local_filter_backward_weights(X, DY, size, stride, block, out=cp.asarray(start), accumulate=True),
             ops.local_filter_backward_weights(x, dy, size, stride, block, out=start.copy(), accumulate=True))


@pytest.mark.parametrize("index", ["i32", "i64"])
def test_elementwise_kernels_with_either_index_width_on_device(cp, index, monkeypatch):
    """Pooling and LCN's smoothing through their 32-bit-index and 64-bit-index instances."""
    from cotsdl import ops
    from cotsdl.ops.cuda import _launch

    if index == "i64":
        monkeypatch.setattr(_launch, "MAX_I32_ELEMENTS", 0)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((19, 18, 3, 37)).astype(np.float32)
    X = cp.asarray(x)

    def same(dev, host):
        assert float(np.abs(cp.asnumpy(dev) - host).max()) <= 1e-5 * max(float(np.abs(host).max()), 1e-30)

    y = ops.l2_pool(x, (3, 2), (2, 1), 0.01)
    same(ops.l2_pool(X, (3, 2), (2, 1), 0.01), y)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    same(ops.l2_pool_backward(cp.asarray(dy), X, cp.asarray(y), (3, 2), (2, 1)), ops.l2_pool_backward(dy, x, y, (3, 2), (2, 1)))
    dz = rng.standard_normal(x.shape).astype(np.float32)
    same(ops.lcn(X, 5, 1.5, 1e-3), ops.lcn(x, 5, 1.5, 1e-3))
    same(ops.lcn_backward(cp.asarray(dz), X, 5, 1.5, 1e-3), ops.lcn_backward(dz, x, 5, 1.5, 1e-3))
