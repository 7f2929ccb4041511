"""The transport an exchange plan binds on first use (host arrays; the device ones: test_device_path.py).

Whole rows of an (H, W, C, N) window are one contiguous run of memory, so a Px1
grid with halos over H moves every message straight from and into the arrays
("direct"); a 1xP grid with halos over W sends column strips, which are packed.
The adjoint sums what it receives, so its receives are always packed.
"""
import numpy as np
import pytest

from cotsdl import backend
from cotsdl.array import Box, DistArray, ExchangePlan, ProcessGrid, grow
from helpers import P, agree

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
