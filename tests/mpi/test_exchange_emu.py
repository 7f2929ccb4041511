"""The exchange with COTSDL_BACKEND=cuda-emu (halo kernels run by the emulator) equals the numpy backend."""
import numpy as np
import pytest

from cotsdl import backend
from cotsdl.array import DistArray, ExchangePlan, ProcessGrid
from helpers import agree, grids, random_halo_windows, random_shape


def exchange_both_ways(comm, dims, seed):
    rng = np.random.default_rng(seed)
    shape = random_shape(rng)
    x = rng.standard_normal(shape).astype(np.float32)
    grid = ProcessGrid(comm, dims)
    wins = random_halo_windows(rng, grid.owned_boxes(shape), shape)
    src = DistArray.on_grid(grid, shape, np.float32)
    src.owned_data[...] = x[src.owned.slices_in(src.global_box)]
    dst = DistArray(comm, shape, wins[comm.Get_rank()], dtype=np.float32)
    plan = ExchangePlan.between(src, dst)
    plan.exchange(src, dst)
    y = DistArray(comm, shape, dst.window, data=np.random.default_rng([seed, comm.Get_rank()])
                  .standard_normal(dst.window.shape).astype(np.float32))
    back = DistArray(comm, shape, src.window, src.owned, dtype=np.float32)
    plan.exchange_adjoint(y, back)
    grid.free()
    return dst.data.copy(), back.owned_data.copy()


@pytest.mark.parametrize("dims", grids())
@pytest.mark.parametrize("seed", range(3))
def test_emulated_kernels_equal_numpy(comm, dims, seed):
    with backend.using("numpy"):
        ref = exchange_both_ways(comm, dims, seed)
    with backend.using("cuda-emu"):
        emu = exchange_both_ways(comm, dims, seed)
    ok = np.array_equal(ref[0], emu[0]) and np.array_equal(ref[1], emu[1])
    assert agree(comm, ok)
