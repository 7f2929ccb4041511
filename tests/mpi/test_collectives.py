"""The collectives module hands MPI host memory unless MPI is CUDA-aware, and synchronizes first.

No GPU here: ``Fake`` is host memory that claims to be a device array (it has
``__cuda_array_interface__``), so the collectives take their device branches; the
backend hooks and a recording communicator show which branch ran.
"""
import types

import numpy as np
import pytest

from cotsdl import backend
from cotsdl.array.collective import allreduce, sum_values
from cotsdl.train import allreduce as fused
from helpers import agree

LOG = []


class Fake(np.ndarray):
    @property
    def __cuda_array_interface__(self):
        return {**self.__array_interface__, "version": 3}

    def get(self, out):
        LOG.append("down")
        np.copyto(out, self.view(np.ndarray))
        return out

    def set(self, src):
        LOG.append("up")
        np.copyto(self.view(np.ndarray), src)


def fake(a):
    return np.ascontiguousarray(a).view(Fake)


fake_xp = types.SimpleNamespace(concatenate=lambda parts: fake(np.concatenate([np.asarray(p) for p in parts])),
                                ascontiguousarray=fake)


class Recording:
    """The communicator, logging what kind of memory every Allreduce is handed."""

    def __init__(self, comm):
        self.comm = comm

    def Get_size(self):
        return self.comm.Get_size()

    def Allreduce(self, send, recv, op):
        LOG.append("mpi:device" if backend.is_device_array(recv) else "mpi:host")
        return self.comm.Allreduce(send, recv.view(np.ndarray) if isinstance(recv, Fake) else recv, op=op)


@pytest.fixture
def device(monkeypatch):
    LOG.clear()
    monkeypatch.setattr(backend, "synchronize",
                        lambda a: LOG.append("sync") if backend.is_device_array(a) else None)
    monkeypatch.setattr(backend, "empty_host_like", lambda a: np.empty(a.shape, a.dtype))
    monkeypatch.setattr(backend, "array_module", lambda a: fake_xp if backend.is_device_array(a) else np)


@pytest.mark.parametrize("aware", ["0", "1"])
def test_a_device_buffer_reaches_mpi_only_as_mpi_can_take_it(comm, device, monkeypatch, aware):
    monkeypatch.setenv("COTSDL_CUDA_AWARE_MPI", aware)
    P, r = comm.Get_size(), comm.Get_rank()
    buf = fake(np.arange(6, dtype=np.float32) + r)
    out = allreduce(Recording(comm), buf)
    ok = out is buf and np.array_equal(np.asarray(buf), P * np.arange(6) + P * (P - 1) / 2)
    if P == 1:
        ok = ok and LOG == []  # nothing to reduce: no copies, no MPI
    elif aware == "0":
        # the stream synchronized, one copy down, host memory to MPI, one copy up
        ok = ok and [e for e in LOG if e != "sync"] == ["down", "mpi:host", "up"] and LOG[0] == "sync"
    else:
        ok = ok and LOG == ["sync", "mpi:device"]  # synchronized, then straight to MPI
    assert agree(comm, ok)


def test_fused_gradient_averaging_stages_device_buckets(comm, device, monkeypatch):
    monkeypatch.setenv("COTSDL_CUDA_AWARE_MPI", "0")
    P, r = comm.Get_size(), comm.Get_rank()
    grads = {"w": fake(np.full((3, 4), r, np.float32)), "w_dec": fake(np.full(5, 2.0 * r, np.float32))}
    out = fused.average(Recording(comm), grads, bucket_bytes=48)  # w alone fills a bucket: two reductions
    mean = (P - 1) / 2
    ok = np.allclose(np.asarray(out["w"]), mean) and np.allclose(np.asarray(out["w_dec"]), 2 * mean)
    if P > 1:
        ok = ok and "mpi:device" not in LOG and LOG.count("mpi:host") == 2
    assert agree(comm, ok)


def test_non_contiguous_buffers_are_refused(comm):
    with pytest.raises(ValueError, match="C-contiguous"):
        allreduce(comm, np.zeros((4, 4), np.float32)[:, ::2])


def test_sum_values_is_one_float64_reduction(comm):
    got = sum_values(comm, [1, np.float32(0.5), comm.Get_rank()])
    P = comm.Get_size()
    assert got.dtype == np.float64 and agree(comm, np.allclose(got, [P, 0.5 * P, P * (P - 1) / 2]))
    assert np.array_equal(sum_values(None, [2, 3]), [2.0, 3.0])
