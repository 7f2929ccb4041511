"""On GPUs: a multi-rank exchange and adjoint of CuPy arrays equals the host computation.

Skipped (by device count, not by whether CuPy imports) when there is no CUDA device.
"""
import numpy as np
import pytest

from cotsdl import backend
from cotsdl.array import Box, DistArray, ExchangePlan, ProcessGrid, grow, node_local_rank
from helpers import agree, grids

pytestmark = pytest.mark.skipif(backend.device_count() == 0, reason="no CUDA device")


@pytest.mark.parametrize("aware", ["0", "1"])
@pytest.mark.parametrize("dims", grids())
def test_device_exchange_equals_host(comm, monkeypatch, dims, aware):
    import cupy as cp

    monkeypatch.setenv("COTSDL_CUDA_AWARE_MPI", aware)
    if aware == "1" and backend.name() == "cuda":
        from cotsdl.array.cudampi import _query_library

        if not _query_library():
            pytest.skip("the MPI library is not CUDA-aware")
    cp.cuda.Device(node_local_rank(comm) % backend.device_count()).use()
    shape = (19, 17, 3, 8)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    grid = ProcessGrid(comm, dims)
    gbox = Box.from_shape(shape)
    win = lambda b: grow(b, (2, 1), (1, 2), gbox)  # noqa: E731
    dev = DistArray.on_grid(grid, shape, np.float32, window=win, zeros=cp.zeros)
    dev.owned_data[...] = cp.asarray(x[dev.owned.slices_in(gbox)])
    plan = ExchangePlan.between(dev, dev)
    plan.exchange(dev, dev)
    ok = np.array_equal(cp.asnumpy(dev.data), x[dev.window.slices_in(gbox)])
    plan.exchange_adjoint(dev, dev)
    host = DistArray.on_grid(grid, shape, np.float32, window=win)
    host.data[...] = x[host.window.slices_in(gbox)]
    ExchangePlan.between(host, host).exchange_adjoint(host, host)
    ok = ok and np.allclose(cp.asnumpy(dev.owned_data), host.owned_data, rtol=1e-6)
    grid.free()
    assert agree(comm, ok)
