"""Evaluation over P ranks equals one rank: every neuron's responses, the honest scores, the stimulus,
and the whole experiment (both polarities, group splits, bootstrap intervals, stage probes, per kind)."""
from types import SimpleNamespace

import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.array import ProcessGrid
from cotsdl.evaluate import experiment, responses, scoring, stimulus
from cotsdl.nn import Network, NetworkPlan
from helpers import agree, grids

NET = {"input": [11, 10, 1], "stages": [
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 3}, "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.1},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 0.01}},
    {"filter": {"size": [2, 2], "stride": [1, 1], "channels": 2}, "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.1},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 0.01}}]}
N = 30


class Images:
    """A non-shuffling source of fixed random images (what HDF5Source(shuffle=False) gives)."""

    def __init__(self):
        self.x = np.random.default_rng(5).standard_normal((11, 10, 1, N))
        self.image_shape = (11, 10, 1)

    def read(self, first, count, window):
        idx = np.arange(first, first + count) % N
        (r0, c0, k0), (r1, c1, k1) = window.lo[:3], window.hi[:3]
        return self.x[r0:r1, c0:c1, k0:k1][..., idx]


class Labeled(Images):
    """A labeled set as the reader gives it: 10 identities of 3 views, faces and two distractor kinds."""

    path = "labeled-in-memory"
    kind_names = ("face", "photo_crop", "phase_scrambled")

    def __init__(self):
        super().__init__()
        self.info = SimpleNamespace(labels={"0": 18, "1": 12})
        self._groups = np.repeat(np.arange(10), 3)
        self._y = (self._groups % 3 == 0).astype(np.int64)
        self.x[..., self._y == 1] += 0.7 * np.random.default_rng(6).standard_normal((11, 10, 1, 1))  # "a face"

    def __len__(self):
        return N

    def labels(self):
        return self._y

    def groups(self):
        return self._groups

    def kinds(self):
        return np.where(self._y == 1, 0, 1 + self._groups % 2)


def evaluate(comm, dims):
    net = Network.from_description(NET)
    grid = ProcessGrid(comm, dims)
    plan = NetworkPlan(net, grid, 8, np.float64)
    params = plan.init_params(2)
    R, ids = responses.collect(plan, params, Images(), N)
    y = (np.arange(N) % 3 == 0).astype(np.int64)
    scores = scoring.honest_scores(R, y, 5, 1, ids=ids, combine=responses.combine_best(comm))
    full = np.empty((N, sum(i.size for i in responses.layer_infos(plan))))
    for got_ids, block in comm.allgather((ids, R)):
        full[:, got_ids] = block
    one = NetworkPlan(net, grid, 1, np.float64)
    img, trace = stimulus.optimal_stimulus(one, params, 4, (2, 1, 2), norm=3.0, steps=10)
    grid.free()
    return full, scores, img, trace


@pytest.mark.parametrize("dims", grids())
def test_evaluation_is_the_same_on_any_grid(comm, dims):
    dist = evaluate(comm, dims)
    ok = True
    if comm.Get_rank() == 0:
        serial = evaluate(MPI.COMM_SELF, (1, 1))
        ok = np.allclose(dist[0], serial[0], rtol=1e-12, atol=1e-12)
        ds, ss = dist[1]["in_sample"], serial[1]["in_sample"]
        ok = ok and dist[1]["neurons"] == serial[1]["neurons"] and ds["neuron"] == ss["neuron"]
        ok = ok and np.allclose([ds["threshold"], ds["balanced_acc"]], [ss["threshold"], ss["balanced_acc"]])
        ok = ok and np.allclose(dist[1]["thresholds"], serial[1]["thresholds"])
        ok = ok and np.allclose(dist[1]["test_balanced_acc"], serial[1]["test_balanced_acc"])
        ok = ok and np.allclose(dist[2], serial[2], rtol=1e-9, atol=1e-12)
        ok = ok and np.allclose(dist[3], serial[3], rtol=1e-9)
    assert agree(comm, ok)


def experiment_numbers(comm, dims):
    net = Network.from_description(NET)
    grid = ProcessGrid(comm, dims)
    plan = NetworkPlan(net, grid, 8, np.float64)
    subject = experiment.Subject("network", "net", plan, plan.init_params(2))
    controls = [experiment.Subject("random_weights", "rnd", plan, plan.init_params(3)),
                experiment.Subject("no_faces", "other", plan, plan.init_params(4))]
    report, figs = experiment.run(subject, controls, Labeled(), k=6, seed=1, stimulus_steps=3, resamples=200)
    grid.free()
    keep = ("comparisons", "per_kind", "probes", "intervals", "verdicts", "per_layer", "selective", "groups", "kinds",
            "stages", "by_stage")
    return {key: report[key] for key in keep} | {"scores": report["scores"], "best": report["best"]}, figs


def _close(a, b):
    """Nested report numbers equal (floats to 1e-9; everything else exactly)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return bool(np.isclose(a, b, rtol=1e-9, atol=1e-12) or (np.isnan(a) and np.isnan(b)))
    return a == b


@pytest.mark.parametrize("dims", grids())
def test_the_experiment_is_the_same_on_any_grid(comm, dims):
    dist, figs = experiment_numbers(comm, dims)
    same = all(_close(x, dist) for x in comm.allgather(dist))  # every rank holds the same report
    ok = True
    if comm.Get_rank() == 0:
        serial, sfigs = experiment_numbers(MPI.COMM_SELF, (1, 1))
        ok = _close(dist, serial) and np.allclose(figs["stimulus"], sfigs["stimulus"], rtol=1e-9, atol=1e-12)
        ok = ok and len(dist["comparisons"]) == 4 + 2 * 2 + 2 + 2 * 2 and len(dist["stages"]) == 2 and len(dist["probes"]) == 2 and len(dist["per_kind"]) == 2
    assert agree(comm, same and ok)
