"""``GreedyTrainer(overlap="auto")`` decides on rank 0 and every rank overlaps alike.

Run: mpiexec -n P python -m mpi4py tests/mpi_pytest.py tests/mpi -k overlap_auto  (P = 1..4)
"""
import json
import os
import tempfile

import numpy as np

from cotsdl.nn import Network
from cotsdl.planner import PRESETS
from cotsdl.train import GreedyTrainer, InMemorySource, Momentum
from helpers import P, all_same

DESC = {"input": [14, 13, 1], "stages": [
    {"filter": {"size": [4, 4], "stride": [1, 1], "channels": 3}, "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}}]}
#: messages free and every call 10 ms: the model says overlap's strips cost more than it hides
CALLS_COST = {**PRESETS["gtx680-fdr"], "name": "calls-cost", "overhead_s": 1e-2,
              "link": {"alpha_s": 1e-9, "beta_s_per_byte": 1e-15}}


def _trainer_in(comm, monkeypatch, prefix: str, machine: dict | None) -> GreedyTrainer:
    """A trainer with overlap="auto", started in a fresh folder holding ``machine`` as machine.json (if any)."""
    here = tempfile.mkdtemp(prefix=f"{prefix}-{comm.Get_rank()}-")
    if machine is not None:
        with open(os.path.join(here, "machine.json"), "w") as f:
            json.dump(machine, f)
    monkeypatch.chdir(here)
    imgs = np.random.default_rng(0).standard_normal((8, 14, 13, 1))
    return GreedyTrainer(Network.from_description(DESC), InMemorySource(imgs), Momentum(0.01), comm=comm, batch=2,
                         grid=(P, 1), log_every=0, overlap="auto")


def test_rank_0s_decision_holds_on_every_rank(comm, monkeypatch):
    """Only rank 0 has a machine file (off); the others alone would follow the rule, which says on where
    halos cross nodes: each rank is told it is alone on its node."""
    import cotsdl.array.grid

    monkeypatch.setattr(cotsdl.array.grid, "rank_nodes", lambda comm: list(range(comm.Get_size())))
    tr = _trainer_in(comm, monkeypatch, "cotsdl-overlap", CALLS_COST if comm.Get_rank() == 0 else None)
    assert all_same(comm, (tr.plan.overlap, tr.overlap_reason))
    assert tr.plan.overlap is False
    if P == 1:
        assert tr.overlap_reason == "1 rank, no halo to hide"
    else:
        assert "extra calls" in tr.overlap_reason and "machine calls-cost" in tr.overlap_reason
    tr.decomposition.free()


def test_the_reason_ends_with_the_load_warning(comm, monkeypatch):
    """A calibration recorded under a load no machine reaches (1000 other busy cores): wherever the model
    decides, the reason (the start log's line) ends with the warning; one rank has no model to warn about."""
    import socket

    loaded = {**CALLS_COST, "load": {"host": socket.gethostname(), "other_busy_cores": 1000.0}}
    tr = _trainer_in(comm, monkeypatch, "cotsdl-overlap-load", loaded)
    assert all_same(comm, tr.overlap_reason)
    if P == 1:
        assert "warning" not in tr.overlap_reason
    else:
        assert "machine calls-cost" in tr.overlap_reason
        assert "; warning: machine calls-cost was calibrated with 1000.0 other busy cores, now " in tr.overlap_reason
        assert tr.overlap_reason.endswith("recalibrate under the load you will run with (cotsdl bench calibrate)")
    tr.decomposition.free()
