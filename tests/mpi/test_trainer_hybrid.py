"""Hybrid parallelism: 2 replicas x (1x2) == 1 rank with both replicas' images == 1 replica x (2x2)."""
import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.nn import Network
from cotsdl.train import GreedyTrainer, InMemorySource, Momentum
from helpers import P, agree

DESC = {"input": [14, 13, 1], "stages": [
    {"filter": {"size": [4, 4], "stride": [1, 1], "channels": 3}, "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
    {"filter": {"size": [3, 2], "stride": [1, 1], "block": [1, 2], "channels": 2},
     "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01}, "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}}]}


def trained(comm, replicas, grid, batch, steps=(3, 3)):
    imgs = np.random.default_rng(0).standard_normal((40, 14, 13, 1))
    tr = GreedyTrainer(Network.from_description(DESC), InMemorySource(imgs, seed=1), Momentum(0.01, 0.9), comm=comm,
                       batch=batch, replicas=replicas, grid=grid, lam=0.2, dtype=np.float64, log_every=0)
    tr.train(list(steps))
    out = [tr.gather_weights(k) for k in range(2)]
    tr.layout.free()
    return out


@pytest.mark.skipif(P != 4, reason="the hybrid split needs 4 ranks")
def test_replicas_times_grid_equals_serial_and_pure_model_parallel(comm):
    hybrid = trained(comm, 2, (1, 2), batch=4)
    model = trained(comm, 1, (2, 2), batch=8)
    ok = True
    if comm.Get_rank() == 0:
        serial = trained(MPI.COMM_SELF, 1, (1, 1), batch=8)
        for a, b, c in zip(hybrid, model, serial):
            ok = ok and np.allclose(a, c, rtol=1e-10, atol=1e-12) and np.allclose(b, c, rtol=1e-10, atol=1e-12)
            ok = ok and not np.array_equal(c, 0)
    assert agree(comm, ok)
