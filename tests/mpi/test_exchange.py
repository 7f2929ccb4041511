import numpy as np
import pytest

from cotsdl.array import Box, DistArray, ExchangePlan, ProcessGrid, grow
from helpers import P, agree, grids, random_box, random_halo_windows, random_shape


def _setup(comm, dims, seed, windows="halo", dtype=np.float64):
    rng = np.random.default_rng(seed)  # identical on every rank
    shape = random_shape(rng)
    x = rng.standard_normal(shape).astype(dtype)
    grid = ProcessGrid(comm, dims)
    owned = grid.owned_boxes(shape)
    if windows == "halo":
        wins = random_halo_windows(rng, owned, shape)
    else:
        wins = [random_box(rng, shape) for _ in range(P)]
    src = DistArray.on_grid(grid, shape, dtype)
    src.owned_data[...] = x[src.owned.slices_in(src.global_box)]
    dst = DistArray(comm, shape, wins[comm.Get_rank()], dtype=dtype)
    return rng, x, grid, owned, wins, src, dst


@pytest.mark.parametrize("windows", ["halo", "arbitrary"])
@pytest.mark.parametrize("dims", grids())
@pytest.mark.parametrize("seed", range(8))
def test_exchange_fills_every_window(comm, dims, seed, windows):
    _, x, grid, owned, wins, src, dst = _setup(comm, dims, seed, windows)
    dst.data[...] = np.nan
    plan = ExchangePlan.between(src, dst)
    plan.exchange(src, dst)
    filled = np.array_equal(dst.data, x[dst.window.slices_in(dst.global_box)])
    # Exactly the intersections move: nothing redundant, nothing to self over MPI.
    # total_bytes_sent is counted at each MPI send; the expectation comes from the windows.
    r = comm.Get_rank()
    expect = sum((owned[r] & w).size for p, w in enumerate(wins) if p != r) * 8
    counts = (plan.bytes_sent, plan.total_bytes_sent, plan.messages_sent)
    n_msgs = sum(1 for p, w in enumerate(wins) if p != r and not (owned[r] & w).is_empty)
    balanced = comm.allreduce(plan.bytes_sent) == comm.allreduce(plan.bytes_received)
    grid.free()
    assert agree(comm, filled), "a window differs from the global array"
    assert counts == (expect, expect, n_msgs)
    assert balanced


@pytest.mark.parametrize("dims", grids())
@pytest.mark.parametrize("seed", range(4))
def test_in_place_halo_update(comm, dims, seed):
    rng = np.random.default_rng(100 + seed)
    shape = random_shape(rng)
    x = rng.standard_normal(shape).astype(np.float32)
    grid = ProcessGrid(comm, dims)
    halo_lo, halo_hi = rng.integers(0, 4, 2), rng.integers(0, 4, 2)
    arr = DistArray.on_grid(grid, shape, np.float32, window=lambda b: grow(b, halo_lo, halo_hi, Box.from_shape(shape)))
    arr.data[...] = -1
    arr.owned_data[...] = x[arr.owned.slices_in(arr.global_box)]
    plan = ExchangePlan.between(arr, arr)
    for _ in range(2):  # the plan's buffers are reused
        plan.exchange(arr, arr)
        np.testing.assert_array_equal(arr.data, x[arr.window.slices_in(arr.global_box)])
    assert plan.calls == 2
    grid.free()


@pytest.mark.parametrize("windows", ["halo", "arbitrary"])
@pytest.mark.parametrize("dims", grids())
@pytest.mark.parametrize("seed", range(6))
def test_adjoint_identity(comm, dims, seed, windows):
    rng, _, grid, _, _, src, dst = _setup(comm, dims, 200 + seed, windows)
    local = np.random.default_rng([seed, comm.Get_rank()])
    y = local.standard_normal(dst.window.shape)
    plan = ExchangePlan.between(src, dst)
    plan.exchange(src, dst)
    lhs = comm.allreduce(float(np.sum(dst.data * y)))
    back = DistArray(comm, src.shape, src.window, src.owned, data=np.full(src.window.shape, 7.0))
    ydst = DistArray(comm, dst.shape, dst.window, data=y.copy())
    plan.exchange_adjoint(ydst, back)
    rhs = comm.allreduce(float(np.sum(src.owned_data * back.owned_data)))
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs))
    # accumulate adds the transpose to what is there
    before = back.owned_data.copy()
    plan.exchange_adjoint(ydst, back, accumulate=True)
    np.testing.assert_allclose(back.owned_data, 2 * before, rtol=1e-14, atol=1e-14)
    grid.free()


@pytest.mark.parametrize("seed", range(4))
def test_repartition_between_grids_round_trip(comm, seed):
    from cotsdl.array import redistribute

    rng = np.random.default_rng(300 + seed)
    shape = random_shape(rng, hi=20)
    x = rng.standard_normal(shape)
    dims_a, dims_b = grids()[0], grids()[-1]
    ga, gb = ProcessGrid(comm, dims_a), ProcessGrid(comm, dims_b)
    a = DistArray.on_grid(ga, shape, np.float64)
    a.owned_data[...] = x[a.owned.slices_in(a.global_box)]
    wins = random_halo_windows(rng, gb.owned_boxes(shape), shape)
    b = redistribute(a, gb.owned_box(shape), wins[comm.Get_rank()])
    np.testing.assert_array_equal(b.data, x[b.window.slices_in(b.global_box)])
    back = redistribute(b, a.owned)
    np.testing.assert_array_equal(back.data, a.owned_data)
    ga.free(), gb.free()


def test_float32_and_float64_plans_are_separate(comm):
    shape = (9, 7, 2, 3)
    grid = ProcessGrid(comm, grids()[0])
    for dtype in (np.float32, np.float64):
        x = np.arange(np.prod(shape), dtype=dtype).reshape(shape)
        arr = DistArray.on_grid(grid, shape, dtype, window=lambda b: grow(b, (1, 1), (1, 1), Box.from_shape(shape)))
        arr.owned_data[...] = x[arr.owned.slices_in(arr.global_box)]
        plan = ExchangePlan.between(arr, arr)
        plan.exchange(arr, arr)
        assert arr.data.dtype == dtype
        np.testing.assert_array_equal(arr.data, x[arr.window.slices_in(arr.global_box)])
    grid.free()


def test_split_phase_start_then_wait(comm):
    shape = (11, 10, 2, 2)
    grid = ProcessGrid(comm, grids()[-1])
    x = np.random.default_rng(5).standard_normal(shape)
    arr = DistArray.on_grid(grid, shape, np.float64, window=lambda b: grow(b, (2, 2), (2, 2), Box.from_shape(shape)))
    arr.owned_data[...] = x[arr.owned.slices_in(arr.global_box)]
    plan = ExchangePlan.between(arr, arr)
    pending = plan.start(arr, arr, validate=False)
    interior = float(arr.owned_data.sum())  # work on owned data while halos travel
    pending.wait()
    pending.wait()  # idempotent
    assert interior == pytest.approx(float(x[arr.owned.slices_in(arr.global_box)].sum()))
    np.testing.assert_array_equal(arr.data, x[arr.window.slices_in(arr.global_box)])
    grid.free()


@pytest.mark.parametrize("halo", [((1, 2), (2, 1)), ((0, 0), (0, 0))])  # the latter: window = owned box
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dims", grids())
def test_in_place_adjoint_equals_separate_buffers(comm, dims, accumulate, halo):
    rng = np.random.default_rng(77)
    shape = random_shape(rng, lo=3)
    grid = ProcessGrid(comm, dims)
    gbox = Box.from_shape(shape)
    win = lambda b: grow(b, halo[0], halo[1], gbox)  # noqa: E731
    local = np.random.default_rng([3, comm.Get_rank()])
    arr = DistArray.on_grid(grid, shape, np.float64, window=win)
    arr.data[...] = local.standard_normal(arr.window.shape)
    y = DistArray(comm, shape, arr.window, data=arr.data.copy())
    out = DistArray(comm, shape, arr.window, arr.owned, data=arr.data.copy())
    plan = ExchangePlan.between(arr, arr)
    plan.exchange_adjoint(y, out, accumulate=accumulate)
    plan.exchange_adjoint(arr, arr, accumulate=accumulate)  # aliased: window and owner share a buffer
    np.testing.assert_allclose(arr.owned_data, out.owned_data, rtol=1e-15, atol=0)
    grid.free()


def test_second_start_while_in_flight_is_refused(comm):
    shape = (9, 8, 2, 2)
    grid = ProcessGrid(comm, grids()[0])
    gbox = Box.from_shape(shape)
    a = DistArray.on_grid(grid, shape, np.float64, window=lambda b: grow(b, (1, 1), (1, 1), gbox))
    b = DistArray.on_grid(grid, shape, np.float64, window=lambda b_: grow(b_, (1, 1), (1, 1), gbox))
    a.owned_data[...], b.owned_data[...] = 1.0, 2.0
    plan = ExchangePlan.between(a, a)
    pa = plan.start(a, a)
    with pytest.raises(RuntimeError, match="still in flight"):
        plan.start(b, b)
    pa.wait()
    plan.exchange(b, b)  # fine once the first has completed
    assert np.all(a.data == 1.0) and np.all(b.data == 2.0)
    grid.free()


def test_plan_messages_do_not_match_user_messages(comm):
    """Plan traffic runs on a private duplicate: a user's ANY_TAG receive on the same
    communicator is not fed with halo data."""
    from mpi4py import MPI

    shape = (10, 9, 2, 2)
    grid = ProcessGrid(comm, grids()[0])
    gbox = Box.from_shape(shape)
    arr = DistArray.on_grid(grid, shape, np.float64, window=lambda b: grow(b, (2, 2), (2, 2), gbox))
    arr.owned_data[...] = comm.Get_rank()
    plan = ExchangePlan(grid.comm, shape, arr.owned, arr.window, np.float64)
    user = np.zeros(1)
    req = grid.comm.Irecv(user, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    plan.exchange(arr, arr)
    grid.comm.Send(np.array([42.0]), dest=grid.comm.Get_rank(), tag=12345)
    req.Wait()
    assert user[0] == 42.0
    grid.free()


def test_exchange_inside_a_replica_group(comm):
    from cotsdl.array import split_replicas

    replicas = 2 if P % 2 == 0 else 1
    lay = split_replicas(comm, replicas)
    shape = (11, 7, 2, 3)
    x = np.random.default_rng(9).standard_normal(shape) + lay.replica
    arr = DistArray.on_grid(lay.grid, shape, np.float64, window=lambda b: grow(b, (2, 1), (1, 2), Box.from_shape(shape)))
    arr.owned_data[...] = x[arr.owned.slices_in(arr.global_box)]
    ExchangePlan.between(arr, arr).exchange(arr, arr)
    ok = np.array_equal(arr.data, x[arr.window.slices_in(arr.global_box)])
    lay.free()
    assert agree(comm, ok)
