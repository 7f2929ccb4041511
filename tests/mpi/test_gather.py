import numpy as np
import pytest

from cotsdl.array import Box, DistArray, ProcessGrid, gather, grow, scatter
from helpers import P, grids, random_halo_windows, random_shape


@pytest.mark.parametrize("root", sorted({0, P - 1}))
@pytest.mark.parametrize("dims", grids())
@pytest.mark.parametrize("seed", range(4))
def test_scatter_gather_round_trip(comm, dims, seed, root):
    rng = np.random.default_rng(400 + seed)
    shape = random_shape(rng)
    x = rng.standard_normal(shape).astype(np.float32)
    grid = ProcessGrid(comm, dims)
    wins = random_halo_windows(rng, grid.owned_boxes(shape), shape)
    arr = scatter(comm, x if comm.Get_rank() == root else None, grid.owned_box(shape), wins[comm.Get_rank()], root=root)
    np.testing.assert_array_equal(arr.data, x[arr.window.slices_in(arr.global_box)])
    assert arr.data.dtype == np.float32
    got = gather(arr, root=root)
    if comm.Get_rank() == root:
        np.testing.assert_array_equal(got, x)
    else:
        assert got is None
    grid.free()


def test_gather_moves_only_owned_data(comm):
    shape = (8, 6, 1, 2)
    grid = ProcessGrid(comm, grids()[0])
    arr = DistArray.on_grid(grid, shape, np.float64, window=lambda b: grow(b, (2, 2), (2, 2), Box.from_shape(shape)))
    arr.data[...] = -1.0  # halos hold junk; only owned cells may reach the root
    arr.owned_data[...] = 1.0
    got = gather(arr)
    if comm.Get_rank() == 0:
        assert np.all(got == 1.0)
    grid.free()
