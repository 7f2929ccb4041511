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
    tr.decomposition.free()
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


def trained_norm(comm, replicas, grid, batch, tied):
    imgs = np.random.default_rng(2).standard_normal((40, 14, 13, 1))
    tr = GreedyTrainer(Network.from_description(DESC), InMemorySource(imgs, seed=1), Momentum(0.05, 0.9), comm=comm,
                       batch=batch, replicas=replicas, grid=grid, lam=0.2, dtype=np.float64, log_every=0, tied=tied,
                       filter_norm=[0.3, 0.5])
    tr.train([3, 3])
    out = [tr.gather_weights(k) for k in range(2)]
    tr.decomposition.free()
    return out


@pytest.mark.parametrize("tied", [True, False])
def test_norm_constraint_is_exact_across_grid_splits_and_replicas(comm, tied):
    """The projection is per unit: any grid and any replica split gives the serial weights."""
    layouts = [(1, (1, 1), 8)] if P == 1 else [(1, (1, P), 8), (1, (P, 1), 8)]
    if P == 4:
        layouts += [(2, (1, 2), 4), (4, (1, 1), 2), (1, (2, 2), 8)]
    if P == 2:
        layouts += [(2, (1, 1), 4)]
    results = [trained_norm(comm, r, g, b, tied) for r, g, b in layouts]
    ok = True
    if comm.Get_rank() == 0:
        serial = trained_norm(MPI.COMM_SELF, 1, (1, 1), 8, tied)
        for res in results:
            for a, c, norm in zip(res, serial, (0.3, 0.5)):
                ok = ok and np.allclose(a, c, rtol=1e-10, atol=1e-12)
                ok = ok and np.allclose(np.sqrt((a ** 2).sum(axis=(-3, -2, -1))), norm)
    assert agree(comm, ok)
