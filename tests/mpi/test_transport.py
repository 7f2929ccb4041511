"""The transport an exchange plan binds on first use (host arrays; the device ones: test_device_path.py).

Whole rows of an (H, W, C, N) window are one contiguous run of memory, so a Px1
grid with halos over H moves every message straight from and into the arrays
("direct"); a 1xP grid with halos over W sends column strips, which are packed
below DATATYPE_MIN_BYTES per message (these small cases) and from there on read
and written in place by MPI through derived datatypes ("datatype").  The adjoint
sums what it receives, so its receives are always packed ("packed"; its sends
still go direct or through datatypes).
"""
import gc

import numpy as np
import pytest
from mpi4py import MPI

from cotsdl import backend
from cotsdl.array import Box, DistArray, ExchangePlan, ProcessGrid, grow
from cotsdl.array import exchange as exchange_mod
from helpers import P, agree, random_box, random_halo_windows, random_shape
from test_device_path import FakeDeviceArray, fake_device, fake_xp  # noqa: F401 - the fixture

SHAPE = (12, 10, 2, 3)
GBOX = Box.from_shape(SHAPE)
X = np.random.default_rng(11).standard_normal(SHAPE)
ROWS = ((P, 1), lambda b: grow(b, (1, 0), (2, 0), GBOX))  # halos over H only
COLUMNS = ((1, P), lambda b: grow(b, (0, 1), (0, 2), GBOX))  # halos over W only


def _filled(comm, dims, window, data=None):
    grid = ProcessGrid(comm, dims)
    arr = DistArray.on_grid(grid, SHAPE, np.float64, window=window)
    if data is not None:
        arr = DistArray(comm, SHAPE, arr.window, arr.owned, data=data(arr.window.shape))
    arr.data[...] = np.nan
    arr.owned_data[...] = X[arr.owned.slices_in(GBOX)]
    return grid, arr


def _round_trip(comm, dims, window, data=None):
    """Forward and adjoint once on a fresh plan: their transports and whether the data is right."""
    grid, arr = _filled(comm, dims, window, data)
    plan = ExchangePlan.between(arr, arr)
    before = (plan.transport("forward"), plan.transport("adjoint"))
    plan.exchange(arr, arr)
    ok = np.array_equal(arr.data, X[arr.window.slices_in(GBOX)])
    out = DistArray(comm, SHAPE, arr.window, arr.owned, dtype=np.float64)
    plan.exchange_adjoint(arr, out)
    grid.free()
    return before, (plan.transport("forward"), plan.transport("adjoint")), ok


@pytest.mark.parametrize("case, expect", [
    (ROWS, ("direct", "packed" if P > 1 else "direct")),
    (COLUMNS, ("packed", "packed") if P > 1 else ("direct", "direct")),
])
def test_host_transport_is_direct_for_whole_rows_else_packed(comm, case, expect):
    before, after, ok = _round_trip(comm, *case)
    assert agree(comm, ok)
    assert before == (None, None)  # nothing bound before the first call
    assert after == expect


def test_kernel_backend_always_packs(comm, monkeypatch):
    monkeypatch.setattr(backend, "name", lambda: "cuda-emu")  # the halo kernels run emulated
    _, after, ok = _round_trip(comm, *ROWS)
    assert agree(comm, ok)
    assert after == ("packed", "packed")


def test_non_c_ordered_memory_is_packed(comm):
    """A Fortran-ordered buffer: whole rows are not contiguous in it, so nothing goes direct."""
    _, after, ok = _round_trip(comm, *ROWS, data=lambda shape: np.zeros(shape, order="F"))
    assert agree(comm, ok)
    assert after == ("packed", "packed")


def test_transport_is_bound_once_per_window_pair(comm, monkeypatch):
    """Later calls replay the first call's decisions; another source window binds its own route."""
    grid, arr = _filled(comm, *ROWS)
    plan = ExchangePlan.between(arr, arr)
    plan.exchange(arr, arr)

    def refuse(self, outer):
        raise AssertionError("transport decided again on a later call")

    with monkeypatch.context() as m:
        m.setattr(Box, "is_contiguous_in", refuse)
        arr.data[...] = np.nan
        arr.owned_data[...] = X[arr.owned.slices_in(GBOX)]
        plan.exchange(arr, arr)
    ok = np.array_equal(arr.data, X[arr.window.slices_in(GBOX)])
    # A source that holds only its owned block (another window, same plan): a new route.
    bare = DistArray(comm, SHAPE, arr.owned, arr.owned, data=X[arr.owned.slices_in(GBOX)].copy())
    dst = DistArray(comm, SHAPE, arr.window, dtype=np.float64)
    plan.exchange(bare, dst)
    ok = ok and np.array_equal(dst.data, X[dst.window.slices_in(GBOX)])
    routes, expect = len(plan._routes), 1 if arr.window == arr.owned else 2  # one rank: no halo
    grid.free()
    assert agree(comm, ok)
    assert plan.transport("forward") == "direct" and routes == expect


def test_transport_direction_is_checked(comm):
    grid, arr = _filled(comm, *ROWS)
    plan = ExchangePlan.between(arr, arr)
    grid.free()
    with pytest.raises(ValueError, match="forward, adjoint"):
        plan.transport("fwd")


# -- the datatype transport ------------------------------------------------------


@pytest.fixture
def datatypes_always(monkeypatch):
    """Every strided host box travels as a datatype, however small."""
    monkeypatch.setattr(exchange_mod, "DATATYPE_MIN_BYTES", 0)


def _packing_only(monkeypatch):
    """Plans built inside this context have no MPI element type: every strided box is packed."""
    monkeypatch.setattr(exchange_mod, "_mpi_type", lambda dtype: None)


def _case(comm, seed, dtype, windows):
    """Owners on a 1xP grid (column blocks); windows: asymmetric column halos, halos over
    both axes, or the blocks of another grid (Px1) grown by a halo, or arbitrary boxes."""
    rng = np.random.default_rng(seed)
    shape = random_shape(rng, lo=2, hi=12)
    x = rng.standard_normal(shape).astype(dtype)
    grid = ProcessGrid(comm, (1, P))
    owned = grid.owned_boxes(shape)
    gbox = Box.from_shape(shape)
    if windows == "columns":
        wins = [grow(b, (0, int(rng.integers(0, 4))), (0, int(rng.integers(0, 4))), gbox) for b in owned]
    elif windows == "halo":
        wins = random_halo_windows(rng, owned, shape)
    elif windows == "other-grid":
        other = ProcessGrid(comm, (P, 1))
        wins = [grow(b, (1, 2), (2, 1), gbox) for b in other.owned_boxes(shape)]
        other.free()
    else:
        wins = [random_box(rng, shape) for _ in range(P)]  # empty boxes included
    src = DistArray.on_grid(grid, shape, dtype)
    src.owned_data[...] = x[src.owned.slices_in(gbox)]
    dst = DistArray(comm, shape, wins[comm.Get_rank()], dtype=dtype)
    dst.data[...] = rng.standard_normal(dst.data.shape)  # what the adjoint sends
    return x, grid, src, dst


def _run_both(comm, seed, dtype, windows, accumulate, monkeypatch):
    """Forward and adjoint on the datatype path and on the packed path: their outputs and transports."""
    out = {}
    for name in ("datatype", "packed"):
        with monkeypatch.context() as m:
            if name == "packed":
                _packing_only(m)
            x, grid, src, dst = _case(comm, seed, dtype, windows)
            plan = ExchangePlan.between(src, dst)
        fwd = DistArray(comm, src.shape, dst.window, dtype=dtype)
        fwd.data[...] = np.nan
        plan.exchange(src, fwd)
        owners = DistArray.on_grid(grid, src.shape, dtype)
        owners.data[...] = 1.5  # kept with accumulate, replaced without
        plan.exchange_adjoint(dst, owners, accumulate=accumulate)
        right = np.array_equal(fwd.data, x[fwd.window.slices_in(fwd.global_box)])
        right = right and (name == "datatype" or not plan._types)  # the packed path commits no datatype
        out[name] = (fwd.data.copy(), owners.data.copy(), plan.transport("forward"), plan.transport("adjoint"), right)
        plan.free()
        grid.free()
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("windows", ["columns", "halo", "other-grid", "arbitrary"])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("min_bytes", [0, 200])
@pytest.mark.parametrize("seed", range(3))
def test_datatype_path_equals_packed_path_bitwise(comm, monkeypatch, dtype, windows, accumulate, min_bytes, seed):
    # Every strided box a datatype (0), or the small ones packed and the others datatypes (200).
    monkeypatch.setattr(exchange_mod, "DATATYPE_MIN_BYTES", min_bytes)
    out = _run_both(comm, 1000 + seed, dtype, windows, accumulate, monkeypatch)
    (f1, a1, *t1, ok1), (f2, a2, *t2, ok2) = out["datatype"], out["packed"]
    same = f1.tobytes() == f2.tobytes() and a1.tobytes() == a2.tobytes()
    # A rank that sums nothing in the adjoint (no receives) sends its strided boxes as datatypes.
    fwd_names = ("datatype", "direct") if min_bytes == 0 else ("datatype", "packed", "direct")
    named = (t1[0] in fwd_names and t1[1] in ("datatype", "packed", "direct")
             and t2[0] in ("packed", "direct") and t2[1] in ("packed", "direct"))
    assert agree(comm, ok1 and ok2), "a window differs from the global array"
    assert agree(comm, same), "the datatype and packed paths differ"
    assert agree(comm, named), f"transports {t1} (datatype path), {t2} (packed path)"


def test_column_halos_of_a_1xP_grid_travel_as_datatypes(comm, datatypes_always):
    """Every message of the forward call is a direct view or a committed datatype; none is packed."""
    _, arr = _filled(comm, *COLUMNS)
    plan = ExchangePlan.between(arr, arr)
    plan.exchange(arr, arr)
    plan.exchange_adjoint(arr, DistArray(comm, SHAPE, arr.window, arr.owned, dtype=np.float64))
    fwd, adj = plan._last_route["fwd"], plan._last_route["adj"]
    kinds = {k for k, _ in fwd.send_ways + fwd.recv_ways}
    adj_sends = {k for k, _ in adj.send_ways}
    adj_recvs = {k for k, _ in adj.recv_ways}
    n_types = len(plan._types)
    expect_types = len(plan.sends) + len(plan.recvs) + len(plan.recvs)  # forward both ways, adjoint sends
    assert kinds <= {"type"} and adj_sends <= {"type"} and adj_recvs <= {"slot"}  # sums are unpacked
    assert n_types == expect_types
    assert (plan.transport("forward") == "datatype") == (P > 1)


def test_datatypes_are_freed_with_the_plan(comm, datatypes_always):
    _, arr = _filled(comm, *COLUMNS)
    plan = ExchangePlan.between(arr, arr)
    plan.exchange(arr, arr)
    types = list(plan._types)
    plan.free()  # explicit: freed now, the plan still works and binds its route again
    freed = all(t == MPI.DATATYPE_NULL for t in types)
    arr.data[...] = np.nan
    arr.owned_data[...] = X[arr.owned.slices_in(GBOX)]
    plan.exchange(arr, arr)
    ok = np.array_equal(arr.data, X[arr.window.slices_in(GBOX)])
    again = list(plan._types)
    del plan
    gc.collect()  # the finalizer frees what the plan committed since
    collected = all(t == MPI.DATATYPE_NULL for t in again)
    assert agree(comm, ok)
    assert freed and collected
    assert len(types) == len(again) == (0 if P == 1 else len(types))


def test_free_while_in_flight_is_refused(comm, datatypes_always):
    _, arr = _filled(comm, *COLUMNS)
    plan = ExchangePlan.between(arr, arr)
    pending = plan.start(arr, arr)
    with pytest.raises(RuntimeError, match="in flight"):
        plan.free()
    pending.wait()
    plan.free()


def test_dtype_without_mpi_type_is_packed(comm, monkeypatch, datatypes_always):
    """Without an MPI element type for the dtype, strided boxes fall back to packing."""
    with monkeypatch.context() as m:
        _packing_only(m)
        before, after, ok = _round_trip(comm, *COLUMNS)
    assert agree(comm, ok)
    assert after == (("packed", "packed") if P > 1 else ("direct", "direct"))


def test_fake_device_arrays_still_pack(comm, fake_device, datatypes_always):  # noqa: F811 - the fixture
    """Device arrays never use derived datatypes (very slow on device memory): their boxes are packed."""
    grid, arr = _filled(comm, *COLUMNS)
    data = fake_xp.zeros(arr.window.shape, np.float64)
    data[...] = arr.data
    dev = DistArray(comm, SHAPE, arr.window, arr.owned, data=data)
    plan = ExchangePlan.between(dev, dev)
    plan.exchange(dev, dev)
    ok = np.array_equal(np.asarray(dev.data.view(np.ndarray)), X[arr.window.slices_in(GBOX)])
    route = plan._last_route["fwd"]
    ways = {k for k, _ in route.send_ways + route.recv_ways}
    grid.free()
    assert agree(comm, ok)
    assert plan._types == [] and ways <= {"slot"}
    assert plan.transport("forward") in ("staged", "cuda-aware")


@pytest.mark.parametrize("dtype, expect", [(np.float64, "datatype"), (np.float32, "packed")])
def test_default_threshold_sends_large_column_strips_as_datatypes(comm, dtype, expect):
    """With the default DATATYPE_MIN_BYTES (1 MiB) a 1 MiB column strip travels as a datatype,
    a 0.5 MiB one packed."""
    shape = (1024, 4 * P, 8, 16)  # a column of width 1: 1024 * 128 elements, 1 MiB of float64
    gbox = Box.from_shape(shape)
    grid = ProcessGrid(comm, (1, P))
    x = np.random.default_rng(5).standard_normal(shape).astype(dtype)
    arr = DistArray.on_grid(grid, shape, dtype, window=lambda b: grow(b, (0, 1), (0, 1), gbox))
    arr.data[...] = np.nan
    arr.owned_data[...] = x[arr.owned.slices_in(gbox)]
    plan = ExchangePlan.between(arr, arr)
    plan.exchange(arr, arr)
    ok = np.array_equal(arr.data, x[arr.window.slices_in(gbox)])
    n_types = len(plan._types)
    plan.free()
    grid.free()
    assert agree(comm, ok)
    assert plan.transport("forward") == (expect if P > 1 else "direct")
    assert n_types == (len(plan.sends) + len(plan.recvs) if expect == "datatype" else 0)
