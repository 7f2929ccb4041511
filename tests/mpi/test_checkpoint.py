"""Checkpoints saved on P ranks load on 1 and 2 ranks (resharding) with identical weights."""
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.io import checkpoint
from cotsdl.nn import Network
from cotsdl.train import Adam, GreedyTrainer, InMemorySource
from helpers import agree
from test_trainer_hybrid import DESC


def make(comm, grid=None, replicas=1, ckdir=None, batch=4):
    imgs = np.random.default_rng(0).standard_normal((30, 14, 13, 1)).astype(np.float32)
    return GreedyTrainer(Network.from_description(DESC), InMemorySource(imgs), Adam(0.01), comm=comm, batch=batch,
                         replicas=replicas, grid=grid, lam=0.1, log_every=0, checkpoint_dir=ckdir)


def test_save_on_p_load_on_1_and_2(comm, tmp_path_factory):
    folder = comm.bcast(str(tmp_path_factory.mktemp("ck")) if comm.Get_rank() == 0 else None)
    tr = make(comm, ckdir=folder)
    tr.train_stage(0, 2)
    tr.train_stage(1, 1)
    path = tr.save()
    ref = [tr.gather_weights(k) for k in range(2)]
    tr.decomposition.free()
    ok = True
    # one rank alone
    if comm.Get_rank() == 0:
        one = GreedyTrainer.resume(path, tr.data, Adam(0.01), comm=MPI.COMM_SELF, log=open("/dev/null", "w"))
        ok = all(np.array_equal(one.gather_weights(k), ref[k]) for k in range(2))
        ok = ok and (one.stage, one.stage_step, one.step) == (1, 1, 3) and one.optimizer.t == 1
        one.decomposition.free()
    # two ranks, in a 1x2 grid
    sub = comm.Split(0 if comm.Get_rank() < 2 else MPI.UNDEFINED, comm.Get_rank())
    if sub != MPI.COMM_NULL and sub.Get_size() == 2:
        two = GreedyTrainer.resume(folder, tr.data, Adam(0.01), comm=sub, grid=(1, 2), log=open("/dev/null", "w"))
        got = [two.gather_weights(k) for k in range(2)]
        if sub.Get_rank() == 0:
            ok = ok and all(np.array_equal(got[k], ref[k]) for k in range(2))
        two.decomposition.free()
    if sub != MPI.COMM_NULL:
        sub.Free()
    assert agree(comm, ok)


def test_interrupted_write_leaves_the_previous_checkpoint(comm, tmp_path_factory, monkeypatch):
    folder = comm.bcast(str(tmp_path_factory.mktemp("ck2")) if comm.Get_rank() == 0 else None)
    tr = make(comm, ckdir=folder)
    tr.train_stage(0, 1)
    first = tr.save()
    tr.train_stage(0, 1)
    import h5py

    real = h5py.File

    def broken(path, mode="r", *a, **k):  # the disk fills up while rank files are written
        if "w" in mode:
            raise OSError("No space left on device")
        return real(path, mode, *a, **k)

    monkeypatch.setattr(h5py, "File", broken)
    with pytest.raises(OSError, match="No space left"):
        tr.save()
    monkeypatch.setattr(h5py, "File", real)
    assert checkpoint.latest(folder) == first
    comm.Barrier()
    assert not list(Path(folder).glob(".ckpt-*.partial"))  # the failed write does not keep the disk full
    again = GreedyTrainer.resume(folder, tr.data, Adam(0.01), comm=comm, log=open("/dev/null", "w"))
    assert again.step == 1
    tr.decomposition.free()
    again.decomposition.free()


def test_a_read_error_on_one_rank_stops_every_rank(comm):
    class Flaky(InMemorySource):
        def read(self, first, count, window):
            if comm.Get_rank() == comm.Get_size() - 1 and first >= 8:
                raise OSError("disk gone")
            return super().read(first, count, window)

    imgs = np.random.default_rng(0).standard_normal((30, 14, 13, 1)).astype(np.float32)
    tr = GreedyTrainer(Network.from_description(DESC), Flaky(imgs), Adam(0.01), comm=comm, batch=4, log_every=0)
    with pytest.raises(RuntimeError, match="disk gone"):
        tr.train_stage(0, 5)
    assert tr.step == 2
    tr.decomposition.free()


def test_resume_on_the_same_ranks_keeps_the_saved_grid(comm, tmp_path_factory):
    if comm.Get_size() < 2:
        pytest.skip("needs a grid that is not the default")
    folder = comm.bcast(str(tmp_path_factory.mktemp("ck3")) if comm.Get_rank() == 0 else None)
    tr = make(comm, grid=(1, comm.Get_size()), ckdir=folder)
    tr.train_stage(0, 1)
    tr.save()
    again = GreedyTrainer.resume(folder, tr.data, Adam(0.01), comm=comm, log=open("/dev/null", "w"))
    assert again.decomposition.grid.dims == (1, comm.Get_size()) and again.replicas == 1
    tr.decomposition.free()
    again.decomposition.free()
