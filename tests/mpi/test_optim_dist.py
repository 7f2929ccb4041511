"""LARS, LAMB and clipping give the same update on P ranks as on one: their norms span whole layers."""
import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.array.partition import block_range
from cotsdl.train import optim
from helpers import agree

MAKERS = {
    "lars": lambda comm: optim.LARS(0.5, momentum=0.9, eta=0.02, weight_decay=1e-3, comm=comm),
    "lamb": lambda comm: optim.LAMB(0.05, weight_decay=0.01, comm=comm),
    "clipped-momentum": lambda comm: optim.Momentum(0.1, 0.9, clip_norm=0.3, comm=comm),
    "clipped-lamb": lambda comm: optim.LAMB(0.05, clip_norm=0.3, comm=comm),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_same_update_on_any_number_of_ranks(comm, kind):
    rng = np.random.default_rng(0)
    shapes = {"w0": (7, 3), "w1": (2, 5), "w2": (11,)}  # some ranks own no rows of w1
    params = {k: rng.standard_normal(s) for k, s in shapes.items()}
    grads = [{k: rng.standard_normal(s) for k, s in shapes.items()} for _ in range(3)]
    r, P = comm.Get_rank(), comm.Get_size()
    part = {k: slice(*block_range(s[0], P, r)) for k, s in shapes.items()}
    mine = {k: v[part[k]].copy() for k, v in params.items()}
    whole = {k: v.copy() for k, v in params.items()}
    dist, serial = MAKERS[kind](comm), MAKERS[kind](MPI.COMM_SELF)
    for g in grads:
        dist.step(mine, {k: v[part[k]].copy() for k, v in g.items()})
        serial.step(whole, {k: v.copy() for k, v in g.items()})
    ok = all(np.allclose(mine[k], whole[k][part[k]], rtol=1e-12, atol=1e-14) for k in shapes)
    assert agree(comm, ok)
