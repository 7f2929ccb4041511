"""Waits that give the core away (``array.collective.yield_waits``): where a node runs more ranks than it
has cores, ``cotsdl train`` turns them on, and training is bit for bit what busy-polling waits give.

Run: mpiexec -n P python -m mpi4py tests/mpi_pytest.py tests/mpi -k yield  (P = 1..4)
"""
import types

import numpy as np
import pytest

from cotsdl import ops
from cotsdl.array import DistArray, gather
from cotsdl.array.collective import allreduce, wait_all, waits_yield, yield_waits
from cotsdl.array.grid import node_local_size
from cotsdl.nn import Network
from cotsdl.train import GreedyTrainer, InMemorySource, Momentum
from helpers import P

DESC = {"input": [14, 12, 1], "stages": [
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 2}, "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}}]}


@pytest.fixture
def yielding():
    yield_waits(True)
    yield
    yield_waits(False)


def _train(comm, overlap):
    imgs = np.random.default_rng(1).standard_normal((12, 14, 12, 1))
    tr = GreedyTrainer(Network.from_description(DESC), InMemorySource(imgs), Momentum(0.01), comm=comm, batch=3,
                       grid=(P, 1), log_every=0, overlap=overlap)
    tr.train([4])
    shape, box = tr.plan.weight_box(0)
    w = gather(DistArray(comm, shape, box, box, data=np.asarray(tr.params[0])))
    tr.decomposition.free()
    return w, [h["loss"] for h in tr.history]


@pytest.mark.parametrize("overlap", [False, True])
def test_training_with_yielding_waits_is_bitwise_the_same(comm, overlap):
    busy = _train(comm, overlap)
    yield_waits(True)
    try:
        polite = _train(comm, overlap)
    finally:
        yield_waits(False)
    assert busy[1] == polite[1]
    if comm.Get_rank() == 0:
        np.testing.assert_array_equal(busy[0], polite[0])


def test_a_yielding_reduction_and_wait(comm, yielding):
    assert waits_yield()
    a = np.arange(5, dtype=np.float64) + comm.Get_rank()
    allreduce(comm, a)
    np.testing.assert_array_equal(a, np.arange(5) * P + P * (P - 1) / 2)
    right, left = (comm.Get_rank() + 1) % P, (comm.Get_rank() - 1) % P
    got = np.zeros(3)
    wait_all([comm.Irecv(got, source=left, tag=7), comm.Isend(np.full(3, float(comm.Get_rank())), dest=right, tag=7)])
    assert (got == left).all()


def test_train_setup_yields_exactly_where_a_node_has_more_ranks_than_cores(comm):
    from cotsdl.cli.train import setup_backend

    prev = ops.num_threads()
    try:
        setup_backend(types.SimpleNamespace(backend="numpy", threads=None), comm)
        assert waits_yield() == (node_local_size(comm) > ops.available_cores())
    finally:
        yield_waits(False)
        ops.set_num_threads(prev if prev != ops.available_cores() else None)
