"""The halo pack/unpack kernels, run by the emulator, equal NumPy slicing on random boxes."""
import numpy as np
import pytest

from cotsdl import backend
from cotsdl.array import boxcopy
from cotsdl.array.box import Box

ORDERS = ["forward", "reverse"]


@pytest.fixture(autouse=True)
def emulated():
    with backend.using("cuda-emu"):
        yield


def random_case(rng, dtype):
    shape = tuple(int(v) for v in rng.integers(1, 9, 4))
    origin = tuple(int(v) for v in rng.integers(-5, 5, 4))
    arr_box = Box.from_shape(shape, origin)
    lo = [int(rng.integers(l, h)) for l, h in zip(arr_box.lo, arr_box.hi)]
    hi = [int(rng.integers(a + 1, h + 1)) for a, h in zip(lo, arr_box.hi)]
    return rng.standard_normal(shape).astype(dtype), arr_box, Box(lo, hi)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", range(12))
def test_pack_and_unpack_equal_slicing(monkeypatch, seed, dtype, order):
    monkeypatch.setenv("COTSDL_EMU_ORDER", order)
    rng = np.random.default_rng(seed)
    arr, arr_box, box = random_case(rng, dtype)
    buf = np.full(box.size + 3, np.nan, dtype)[:box.size]  # a view, as the exchange passes
    boxcopy.pack(arr, arr_box, box, buf)
    np.testing.assert_array_equal(buf, arr[box.slices_in(arr_box)].ravel())
    target = rng.standard_normal(arr.shape).astype(dtype)
    expect = target.copy()
    expect[box.slices_in(arr_box)] = buf.reshape(box.shape)
    got = target.copy()
    boxcopy.unpack(buf, got, arr_box, box, add=False)
    np.testing.assert_array_equal(got, expect)
    expect = target.copy()
    expect[box.slices_in(arr_box)] += buf.reshape(box.shape)
    got = target.copy()
    boxcopy.unpack(buf, got, arr_box, box, add=True)
    np.testing.assert_array_equal(got, expect)


def test_large_box_uses_the_grid_stride_loop():
    rng = np.random.default_rng(0)
    arr = rng.standard_normal((40, 37, 8, 16)).astype(np.float32)
    box = Box((1, 2, 0, 0), (39, 35, 8, 16))
    assert box.size > boxcopy.MAX_BLOCKS * boxcopy.THREADS / 8
    buf = np.empty(box.size, np.float32)
    boxcopy.pack(arr, Box.from_shape(arr.shape), box, buf)
    np.testing.assert_array_equal(buf, arr[1:39, 2:35].ravel())
