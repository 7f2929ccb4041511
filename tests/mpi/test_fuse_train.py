"""``GreedyTrainer(fuse=...)``: a stage's pool and LCN on one exchange train bit for bit like one each, and
``fuse="auto"`` decides on rank 0 for every rank.

Run: mpiexec -n P python -m mpi4py tests/mpi_pytest.py tests/mpi -k fuse  (P = 1..4)
"""
import json
import os
import tempfile

import numpy as np

from cotsdl.array import DistArray, gather
from cotsdl.nn import Network
from cotsdl.planner import PRESETS
from cotsdl.train import GreedyTrainer, InMemorySource, Momentum
from helpers import P, all_same, grids
import pytest

DESC = {"input": [15, 13, 1], "stages": [
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 2}, "pool": {"size": [3, 3], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 2}, "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}}]}
#: messages cost 1 s each and bytes nothing: one exchange fewer always wins
LATENCY_BOUND = {**PRESETS["gtx680-fdr"], "name": "latency-bound",
                 "link": {"alpha_s": 1.0, "beta_s_per_byte": 1e-15}}


def _train(comm, fuse, steps=3, fuse_filter=(), grid=(P, 1), overlap=False, free=True):
    imgs = np.random.default_rng(0).standard_normal((12, 15, 13, 1))
    tr = GreedyTrainer(Network.from_description(DESC), InMemorySource(imgs), Momentum(0.01), comm=comm, batch=3,
                       grid=grid, log_every=0, overlap=overlap, fuse=fuse, fuse_filter=fuse_filter)
    tr.train([steps, steps])
    out = {}
    for i in tr.plan.network.filter_layers():
        shape, box = tr.plan.weight_box(i)
        out[i] = gather(DistArray(comm, shape, box, box, data=np.asarray(tr.params[i])))
    losses = [h["loss"] for h in tr.history]
    if free:
        tr.decomposition.free()
    return out, losses, tr


def test_fused_training_is_bitwise_the_per_layer_training(comm):
    (a, la, ta), (b, lb, tb) = _train(comm, "off"), _train(comm, "on")
    assert tb.plan.fuse == (0, 1) and ta.plan.fuse == ()
    assert la == lb
    if comm.Get_rank() == 0:
        for i in a:
            np.testing.assert_array_equal(a[i], b[i], err_msg=f"layer {i}")


def test_auto_fuses_on_rank_0s_machine_for_every_rank(comm, monkeypatch):
    here = tempfile.mkdtemp(prefix=f"cotsdl-fuse-{comm.Get_rank()}-")
    if comm.Get_rank() == 0:  # only rank 0's machine counts
        with open(os.path.join(here, "machine.json"), "w") as f:
            json.dump(LATENCY_BOUND, f)
    monkeypatch.chdir(here)
    imgs = np.random.default_rng(0).standard_normal((6, 15, 13, 1))
    tr = GreedyTrainer(Network.from_description(DESC), InMemorySource(imgs), Momentum(0.01), comm=comm, batch=3,
                       grid=(P, 1), log_every=0, fuse="auto")
    assert all_same(comm, (tr.plan.fuse, tr.fuse_reason))
    if P == 1:
        assert tr.plan.fuse == () and "one rank per model group" in tr.fuse_reason
    else:
        assert tr.plan.fuse == (0,), tr.fuse_reason
        assert "stage 0 fused" in tr.fuse_reason and "top stage" in tr.fuse_reason
    tr.decomposition.free()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("grid", grids())
def test_training_over_a_frozen_fused_stage_is_bitwise_the_per_layer_training(comm, grid, overlap):
    """Stage 1 trains over stage 0 frozen with its filter, pool and LCN on one exchange: the same losses
    and weights bit for bit as one exchange per layer; the weight halo is fetched once per stage
    trained over it (not per step), and again after the weights below changed in place."""
    (a, la, ta), (b, lb, tb) = (_train(comm, "off", grid=grid, overlap=overlap, free=False),
                                _train(comm, "on", fuse_filter="on", grid=grid, overlap=overlap, free=False))
    assert tb.plan.fuse == (0, 1) and tb.plan.fuse_filter == (0, 1) and ta.plan.fuse_filter == ()
    assert la == lb
    assert tb.plan.halo_fetches == 1  # stage 1's three steps over stage 0
    if comm.Get_rank() == 0:
        for i in a:
            np.testing.assert_array_equal(a[i], b[i], err_msg=f"layer {i}")
    tb.train_stage(1, 1)  # stage 1 again: nothing below it changed, nothing fetched
    ta.train_stage(1, 1)
    assert tb.plan.halo_fetches == 1
    # stage 0 trained again (in place), then stage 1: the new weights below are fetched, and used
    for t in (ta, tb):
        t.train_stage(0, 1)
        t.train_stage(1, 1)
    assert tb.plan.halo_fetches == 2
    assert [h["loss"] for h in ta.history] == [h["loss"] for h in tb.history]
    ta.decomposition.free()
    tb.decomposition.free()


def test_a_fuse_filter_outside_fuse_is_refused(comm):
    imgs = np.random.default_rng(0).standard_normal((6, 15, 13, 1))
    with pytest.raises(ValueError, match="parallel.fuse_filter: stage 1's filter joins its pool and LCN only where"):
        GreedyTrainer(Network.from_description(DESC), InMemorySource(imgs), Momentum(0.01), comm=comm, batch=3,
                      grid=(P, 1), log_every=0, fuse=[0], fuse_filter=[1])
