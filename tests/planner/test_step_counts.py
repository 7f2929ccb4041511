"""The run planner's step is the trainer's step: every pass, exchange and reduction that a real
training step makes, counted as it runs, appears in ``planner.model.step_ops`` as often.

A new operation, exchange or collective in the objective or the trainer that the
planner does not model fails here.  Counts per step are the difference of a
two-step and a one-step stage (what a stage does once cancels).
"""
import collections
import importlib
import os

import numpy as np
import pytest
from mpi4py import MPI

import cotsdl.array.collective as collective
from cotsdl import ops
from cotsdl.array.exchange import ExchangePlan
from cotsdl.nn import Network
from cotsdl.planner.model import layer_counts, step_ops
from cotsdl.train import Adam, GreedyTrainer, InMemorySource, Momentum

NET = {"input": [10, 10, 1], "stages": [
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 2}, "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 0.01}},
    {"filter": {"size": [2, 2], "stride": [1, 1], "channels": 2}, "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 0.01}}]}

real_allreduce = collective.allreduce

PASSES = {"local_filter": ("filter", "forward"), "local_filter_backward_data": ("filter", "backward_data"),
          "local_filter_backward_weights": ("filter", "backward_weights"), "l2_pool": ("pool", "forward"),
          "l2_pool_backward": ("pool", "backward"), "lcn_window": ("lcn", "forward"),
          "lcn_window_backward": ("lcn", "backward")}


class CountingComm:
    """The trainer's world communicator, with its reductions counted (everything else passes through)."""

    def __init__(self, comm, tally):
        self._comm, self._tally = comm, tally

    def allreduce(self, *a, **k):
        self._tally["reduce"] += 1
        return self._comm.allreduce(*a, **k)

    def __getattr__(self, name):
        return getattr(self._comm, name)


def counted_step(monkeypatch, stage, steps, optimizer, tied, fuse=(), fuse_filter=()):
    """What ``steps`` steps of ``stage`` did: Counter of exchanges (layer, direction), passes, reductions."""
    tally = collections.Counter()
    images = np.random.default_rng(0).standard_normal((16, 10, 10, 1))
    tr = GreedyTrainer(Network.from_description(NET), InMemorySource(images), optimizer, comm=MPI.COMM_SELF,
                       batch=4, log_every=0, overlap=False, tied=tied, should_stop=lambda: False,
                       log=open(os.devnull, "w"), fuse=fuse, fuse_filter=fuse_filter)
    index = {id(lp.exchange): lp.index
             for lp in list(tr.plan.layers) + list(tr.plan.fused.values()) + list(tr.plan.frozen.values())}
    index.update({id(ex): ("weights", f) for f, ex in tr.plan.weight_exchanges.items()})  # once a stage: cancels
    real_start, real_adjoint = ExchangePlan.start, ExchangePlan.start_adjoint

    def start(self, *a, **k):
        tally[("exchange", index[id(self)], "forward")] += 1
        return real_start(self, *a, **k)

    def start_adjoint(self, *a, **k):
        tally[("exchange", index[id(self)], "adjoint")] += 1
        return real_adjoint(self, *a, **k)

    monkeypatch.setattr(ExchangePlan, "start", start)
    monkeypatch.setattr(ExchangePlan, "start_adjoint", start_adjoint)
    for name, key in PASSES.items():
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _r=real, _k=key, **k: (tally.update([("compute",) + _k]), _r(*a, **k))[1])
    for mod, name in ((collective, "sum_values"), (collective, "allreduce")):
        real = getattr(mod, name)

        def counted(*a, _r=real, **k):
            tally["reduce"] += 1
            with monkeypatch.context() as m:  # sum_values reduces through allreduce: count the outer call once
                m.setattr(collective, "allreduce", real_allreduce)
                return _r(*a, **k)
        monkeypatch.setattr(mod, name, counted)
        for user in ("cotsdl.train.objective", "cotsdl.train.trainer", "cotsdl.nn.plan", "cotsdl.train.allreduce"):
            m = importlib.import_module(user)
            if getattr(m, name, None) is real:
                monkeypatch.setattr(m, name, counted)
    tr.world = CountingComm(tr.world, tally)
    tr.train_stage(stage, steps)
    monkeypatch.undo()
    return tally


@pytest.mark.parametrize("stage", [0, 1])
@pytest.mark.parametrize("optimizer, tied, fuse, fuse_filter", [(Momentum, True, (), ()), (Adam, False, (), ()),
                                                             (Momentum, True, (0, 1), ()),
                                                             (Momentum, True, (0, 1), (0, 1))])
def test_the_planned_step_makes_the_calls_of_a_real_step(monkeypatch, stage, optimizer, tied, fuse, fuse_filter):
    two = counted_step(monkeypatch, stage, 2, optimizer(0.01), tied, fuse, fuse_filter)
    one = counted_step(monkeypatch, stage, 1, optimizer(0.01), tied, fuse, fuse_filter)
    if fuse_filter and stage:  # the weight halo of the frozen filter: fetched once a stage, not per step
        assert two[("exchange", ("weights", 0), "forward")] == one[("exchange", ("weights", 0), "forward")] == 1
    real = two - one
    net = Network.from_description(NET)
    planned = collections.Counter()
    below = tuple(k for k in fuse if k < stage)  # as predict_step: a step fuses the frozen stages only
    filters = tuple(k for k in fuse_filter if k < stage)
    for op in step_ops(net, layer_counts(net, 4, (1, 1), fuse=below, fuse_filter=filters), stage, 4, 1, 8,
                       optimizer_slots=1, tied=tied):
        if op.kind == "exchange":
            planned[("exchange", op.layer, op.what)] += 1
        elif op.kind == "compute" and op.what != "elementwise":
            kind, _, pas = op.what.partition("_")
            planned[("compute", kind, pas)] += 1
        elif op.kind == "reduce":
            planned["reduce"] += 1
    assert real == planned
