"""The exchange's device path (stream sync, host staging) driven with a stand-in device array.

There is no GPU here.  ``FakeDeviceArray`` is host memory that *claims* to be a
device array (it has ``__cuda_array_interface__``), so the exchange takes its
device branches; the backend hooks are recorded to prove which branch ran.
"""
import types

import numpy as np
import pytest

from cotsdl import backend
from cotsdl.array import Box, DistArray, ExchangePlan, ProcessGrid, grow
from helpers import grids


LOG = []  # the order of stream syncs, host copies and MPI calls


class FakeDeviceArray(np.ndarray):
    gets = 0
    sets = 0

    @property
    def __cuda_array_interface__(self):
        return {**self.__array_interface__, "version": 3}

    def get(self, out):
        FakeDeviceArray.gets += 1
        LOG.append("get")
        np.copyto(out, self.view(np.ndarray))
        return out

    def set(self, src):
        FakeDeviceArray.sets += 1
        LOG.append("set")
        np.copyto(self.view(np.ndarray), src)


fake_xp = types.SimpleNamespace(
    empty=lambda shape, dtype: np.empty(shape, dtype).view(FakeDeviceArray),
    zeros=lambda shape, dtype: np.zeros(shape, dtype).view(FakeDeviceArray),
    may_share_memory=np.may_share_memory,
)


@pytest.fixture
def fake_device(monkeypatch):
    calls = {"sync": 0, "pinned": 0}

    def sync(arr):
        if backend.is_device_array(arr):
            calls["sync"] += 1
            LOG.append("sync")

    def pinned(arr):
        calls["pinned"] += 1
        return np.empty(arr.shape, arr.dtype)

    monkeypatch.setattr(backend, "array_module", lambda arr: fake_xp if backend.is_device_array(arr) else np)
    monkeypatch.setattr(backend, "synchronize", sync)
    monkeypatch.setattr(backend, "empty_host_like", pinned)
    # The stand-in device arrays are host memory: run the halo kernels through the emulator.
    real_kernel = backend.kernel
    monkeypatch.setattr(backend, "kernel", lambda f, fn, defines=None, device_array=True: real_kernel(f, fn, defines, False))
    FakeDeviceArray.gets = FakeDeviceArray.sets = 0
    LOG.clear()
    return calls


class RecordingComm:
    """Stands between the plan and its communicator and logs every message call."""

    def __init__(self, comm):
        self.comm = comm

    def Irecv(self, *a, **k):
        LOG.append("irecv")
        return self.comm.Irecv(*a, **k)

    def Isend(self, *a, **k):
        LOG.append("isend")
        return self.comm.Isend(*a, **k)


def _arrays(comm, shape, x):
    grid = ProcessGrid(comm, grids()[-1])
    gbox = Box.from_shape(shape)
    arr = DistArray.on_grid(grid, shape, np.float32, window=lambda b: grow(b, (2, 1), (1, 2), gbox),
                            zeros=fake_xp.zeros)
    arr.owned_data[...] = x[arr.owned.slices_in(gbox)]
    return grid, arr


@pytest.mark.parametrize("aware", ["0", "1"])
def test_device_exchange_and_adjoint(comm, fake_device, monkeypatch, aware):
    monkeypatch.setenv("COTSDL_CUDA_AWARE_MPI", aware)
    shape = (10, 9, 2, 3)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    grid, arr = _arrays(comm, shape, x)
    assert backend.is_device_array(arr.data)
    plan = ExchangePlan.between(arr, arr)
    plan._wire = RecordingComm(plan._wire)
    assert plan.transport("forward") is None
    plan.exchange(arr, arr)
    np.testing.assert_array_equal(np.asarray(arr.data), x[arr.window.slices_in(arr.global_box)])
    device_transport = "staged" if aware == "0" else "cuda-aware"
    assert plan.transport("forward") == device_transport
    remote = plan.messages_sent + plan.messages_received
    # The stream is synchronised before MPI may write a device (or staging) buffer ...
    if "irecv" in LOG:
        assert "sync" in LOG[:LOG.index("irecv")]
    # ... and the packed sends are complete (synchronised or copied to the host) before MPI reads them.
    if "isend" in LOG:
        before = LOG[:LOG.index("isend")]
        assert before.count("sync") >= 2 or "get" in before
    if aware == "0":
        assert fake_device["pinned"] == 2  # one staging buffer per direction of the packed wire
        assert FakeDeviceArray.gets == (1 if plan.messages_sent else 0)  # all sends go down in one copy
        assert FakeDeviceArray.sets == (1 if plan.messages_received else 0)  # all receives come up in one
    else:
        assert fake_device["pinned"] == 0 and FakeDeviceArray.gets == 0 and FakeDeviceArray.sets == 0
    assert remote == 0 or comm.Get_size() > 1
    # The adjoint through the same device path equals the host computation.
    y = DistArray(comm, shape, arr.window, data=fake_xp.zeros(arr.window.shape, np.float32))
    y.data[...] = 1.0
    out = DistArray(comm, shape, arr.window, arr.owned, data=fake_xp.zeros(arr.window.shape, np.float32))
    plan.exchange_adjoint(y, out)
    assert plan.transport("adjoint") == device_transport
    host_y = DistArray(comm, shape, arr.window, data=np.ones(arr.window.shape, np.float32))
    host_out = DistArray(comm, shape, arr.window, arr.owned, dtype=np.float32)
    host_plan = ExchangePlan.between(host_out, host_y)
    host_plan.exchange_adjoint(host_y, host_out)
    assert host_plan.transport("adjoint") in ("direct", "packed")  # host memory is never staged
    np.testing.assert_array_equal(np.asarray(out.owned_data), host_out.owned_data)
    grid.free()


def test_mixed_host_and_device_buffers_are_refused(comm, fake_device):
    shape = (6, 6, 1, 1)
    grid, dev = _arrays(comm, shape, np.zeros(shape, np.float32))
    host = DistArray(comm, shape, dev.window, dev.owned, dtype=np.float32)
    with pytest.raises(ValueError, match="must both be host arrays or both device arrays"):
        ExchangePlan.between(dev, host).exchange(dev, host)
    grid.free()
