"""A bad argument on one rank raises the same ValueError on every rank, and nothing hangs."""
import numpy as np
import pytest

from cotsdl.array import Box, DistArray, ExchangePlan, ProcessGrid, split_replicas
from helpers import P, all_same, grids

LAST = P - 1


def raises_everywhere(comm, fn, match):
    with pytest.raises(ValueError, match=match) as info:
        fn()
    assert all_same(comm, str(info.value)), "ranks raised different messages"
    return str(info.value)


def test_grid_that_does_not_match_communicator(comm):
    msg = raises_everywhere(comm, lambda: ProcessGrid(comm, (P + 1, 1)), "needs")
    assert f"{P + 1}x1" in msg and str(P) in msg


def test_grid_forced_on_one_rank_only(comm):
    dims = (P, 2) if comm.Get_rank() == LAST else (P, 1)
    raises_everywhere(comm, lambda: ProcessGrid(comm, dims), "needs")


def test_bad_replica_count(comm):
    raises_everywhere(comm, lambda: split_replicas(comm, replicas=P + 1), "replicas")


def test_window_outside_array_on_one_rank(comm):
    shape = (6, 5, 1, 2)
    grid = ProcessGrid(comm, grids()[0])
    owned = grid.owned_box(shape)
    window = Box((0, 0, 0, 0), (7, 5, 1, 2)) if comm.Get_rank() == LAST else owned
    msg = raises_everywhere(comm, lambda: ExchangePlan(comm, shape, owned, window), "outside")
    assert f"rank {LAST}" in msg
    grid.free()


def test_overlapping_owned_boxes(comm):
    shape = (6, 5, 1, 2)
    owned = Box.from_shape(shape)  # every rank claims everything
    if P == 1:
        ExchangePlan(comm, shape, owned, owned)  # the one-rank case is a valid partition
    else:
        raises_everywhere(comm, lambda: ExchangePlan(comm, shape, owned, owned), "overlap")


def test_shape_differs_between_ranks(comm):
    if P == 1:
        pytest.skip("needs two ranks to disagree")
    shape = (6, 5, 1, 2) if comm.Get_rank() != LAST else (6, 5, 1, 3)
    grid = ProcessGrid(comm, grids()[0])
    owned = grid.owned_box(shape)
    raises_everywhere(comm, lambda: ExchangePlan(comm, shape, owned, owned), "differ")
    grid.free()


@pytest.mark.parametrize("what", ["dtype", "shape", "window"])
def test_buffer_mismatch_on_one_rank(comm, what):
    shape = (7, 6, 2, 2)
    grid = ProcessGrid(comm, grids()[-1])
    src = DistArray.on_grid(grid, shape, np.float64)
    dst = DistArray.on_grid(grid, shape, np.float64)
    plan = ExchangePlan.between(src, dst)
    if comm.Get_rank() == LAST:
        if what == "dtype":
            dst = DistArray(comm, shape, dst.window, dst.owned, dtype=np.float32)
        elif what == "shape":
            dst = DistArray(comm, (7, 6, 2, 3), dst.window.replace(3, 0, 3), dst.owned.replace(3, 0, 3))
        else:
            dst = DistArray(comm, shape, Box.from_shape(shape))
    raises_everywhere(comm, lambda: plan.exchange(src, dst), "differs|plan was built")
    raises_everywhere(comm, lambda: plan.exchange_adjoint(dst, src), "differs|plan was built")
    # The plan still works afterwards: no rank was left inside a half-done exchange.
    good = DistArray.on_grid(grid, shape, np.float64)
    plan.exchange(src, good)
    grid.free()


def test_source_without_owned_box(comm):
    shape = (4, 4, 1, 1)
    window = Box.from_shape(shape) if comm.Get_rank() == 0 else Box.empty(4)
    src = DistArray(comm, shape, window)  # window-only: owns nothing
    raises_everywhere(comm, lambda: ExchangePlan.between(src, src), "no owned box")


def test_local_construction_errors_are_clear(comm):
    with pytest.raises(ValueError, match="not inside the array"):
        DistArray(comm, (4, 4, 1, 1), Box((0, 0, 0, 0), (5, 4, 1, 1)))
    with pytest.raises(ValueError, match="does not match window"):
        DistArray(comm, (4, 4, 1, 1), Box.from_shape((4, 4, 1, 1)), data=np.zeros((4, 4, 1, 2)))
    with pytest.raises(ValueError, match="owned box"):
        DistArray(comm, (4, 4, 1, 1), Box.from_shape((2, 4, 1, 1)), owned=Box.from_shape((4, 4, 1, 1)))


def test_on_grid_with_a_bad_window_on_one_rank(comm):
    shape = (6, 5, 1, 2)
    grid = ProcessGrid(comm, grids()[0])
    bad = lambda b: Box((0, 0, 0, 0), (7, 5, 1, 2)) if comm.Get_rank() == LAST else b  # noqa: E731
    msg = raises_everywhere(comm, lambda: DistArray.on_grid(grid, shape, window=bad), "not inside the array")
    assert f"rank {LAST}" in msg
    grid.free()


def test_scatter_and_redistribute_with_a_bad_box_on_one_rank(comm):
    from cotsdl.array import redistribute, scatter

    shape = (6, 5, 1, 2)
    grid = ProcessGrid(comm, grids()[0])
    owned = grid.owned_box(shape)
    bad = Box((0, 0, 0, 0), (6, 6, 1, 2)) if comm.Get_rank() == LAST else owned
    x = np.zeros(shape) if comm.Get_rank() == 0 else None
    raises_everywhere(comm, lambda: scatter(comm, x, owned, bad), "not inside the array")
    arr = scatter(comm, x, owned)
    raises_everywhere(comm, lambda: redistribute(arr, bad), "not inside the array")
    grid.free()


def test_ranks_that_disagree_on_the_grid(comm):
    if P == 1:
        pytest.skip("needs two ranks to disagree")
    dims = (1, P) if comm.Get_rank() == 0 else None  # the others choose (P, 1) or (2, 2)
    raises_everywhere(comm, lambda: ProcessGrid(comm, dims), "ranks disagree on the grid")
    reps = 1 if comm.Get_rank() == 0 else P
    raises_everywhere(comm, lambda: split_replicas(comm, reps), "ranks disagree on the number of replicas")


def test_bad_plan_arguments_on_one_rank(comm):
    shape = (6, 5, 1, 2)
    grid = ProcessGrid(comm, grids()[0])
    owned = grid.owned_box(shape)
    window = None if comm.Get_rank() == LAST else owned
    raises_everywhere(comm, lambda: ExchangePlan(comm, shape, owned, window), "bad exchange-plan arguments")
    grid.free()


def test_gather_root_out_of_range(comm):
    from cotsdl.array import gather

    shape = (4, 4, 1, 1)
    grid = ProcessGrid(comm, grids()[0])
    arr = DistArray.on_grid(grid, shape)
    raises_everywhere(comm, lambda: gather(arr, root=P), "root must be a rank")
    grid.free()


def test_arrays_on_communicators_with_different_ranks(comm):
    if P == 1:
        pytest.skip("needs two ranks")
    shape = (4, 4, 1, 1)
    rev = comm.Split(0, key=P - comm.Get_rank())  # same group, reversed order
    grid = ProcessGrid(comm, grids()[0])
    src = DistArray.on_grid(grid, shape)
    dst = DistArray(rev, shape, src.owned)
    raises_everywhere(comm, lambda: ExchangePlan.between(src, dst), "different communicators")
    rev.Free()
    grid.free()


def test_read_only_destination_is_refused_everywhere(comm):
    shape = (6, 5, 1, 2)
    grid = ProcessGrid(comm, grids()[0])
    src = DistArray.on_grid(grid, shape, np.float64)
    dst = DistArray.on_grid(grid, shape, np.float64)
    plan = ExchangePlan.between(src, dst)
    if comm.Get_rank() == LAST:
        dst.data.setflags(write=False)
    raises_everywhere(comm, lambda: plan.exchange(src, dst), "read-only")
    src.data.setflags(write=False)  # a read-only source is fine for the forward exchange
    dst.data.setflags(write=True)
    plan.exchange(src, dst)
    grid.free()
