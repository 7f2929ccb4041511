"""The selectivity experiment on a planted signal: a neuron set by hand to the face template is found and
called selective; the same network with random weights is not."""
import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.array import ProcessGrid
from cotsdl.evaluate import experiment
from cotsdl.io.dataset import write_dataset
from cotsdl.io.reader import HDF5Source
from cotsdl.nn import Network, NetworkPlan

NET = {"input": [12, 12, 1], "stages": [
    {"filter": {"size": [12, 12], "stride": [1, 1], "channels": 4}, "pool": {"size": [1, 1], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 1, "sigma": 1.0, "eps": 0.01}}]}


@pytest.fixture(scope="module")
def labeled(tmp_path_factory):
    """'Faces' carry a fixed weak pattern under noise (each pixel's signal is 1/3 of the noise); distractors are noise."""
    rng = np.random.default_rng(0)
    pattern = rng.standard_normal((12, 12))
    pattern *= 4.0 / np.linalg.norm(pattern)  # template SNR 4: a matched filter separates them, a random one hardly
    y = (np.arange(160) % 4 == 0).astype(np.int64)
    x = rng.standard_normal((160, 12, 12)) + y[:, None, None] * pattern
    path = tmp_path_factory.mktemp("planted") / "planted.h5"
    write_dataset(path, x.astype(np.float32), labels=y, recipe={"builder": "test: planted pattern"})
    return path, pattern


def subjects(pattern, planted):
    net = Network.from_description(NET)
    plan = NetworkPlan(net, ProcessGrid(MPI.COMM_SELF, (1, 1)), 16, np.float64)
    params = plan.init_params(7)
    random = experiment.Subject("random_weights", "random weights", plan, {k: v.copy() for k, v in params.items()})
    # stands in for the network trained without faces: other weights that know nothing of the pattern
    other = experiment.Subject("no_faces", "other random weights", plan, plan.init_params(8))
    if planted:
        params[0][0, 0, 2] = pattern[:, :, None]  # neuron 2 of the only site is the matched filter
    return experiment.Subject("network", "hand-set weights", plan, params), [random, other]


def test_a_planted_face_neuron_is_found_and_called_selective(labeled):
    path, pattern = labeled
    subject, controls = subjects(pattern, planted=True)
    with HDF5Source(path, shuffle=False, preprocess="none", prefetch=False) as src:
        report, figs = experiment.run(subject, controls, src, k=10, seed=0, stimulus_steps=50)
    net = next(r for r in report["rows"] if r["name"] == "network")
    assert net["test_balanced_acc_mean"] > 0.95
    assert report["best"]["layer"] == 0 and report["best"]["position"] == [0, 0, 2]
    rnd = next(r for r in report["rows"] if r["name"] == "random_weights")
    assert rnd["test_balanced_acc_mean"] < 0.8
    assert report["selective"] is True and report["verdicts"]["random_weights"]["beats"]
    assert {r["name"] for r in report["rows"]} == {"network", "random_weights", "no_faces", "pixel", "mean_face",
                                                   "linear_probe"}
    # the figure data: held-out responses on the chosen threshold's two sides, and a stimulus like the pattern
    assert np.median(figs["faces"]) > figs["threshold"] > np.median(figs["distractors"])
    corr = np.corrcoef(figs["stimulus"].ravel(), pattern.ravel())[0, 1]
    assert corr > 0.9, corr
    assert report["best"]["stimulus_trace"][-1] > report["best"]["stimulus_trace"][0]


def test_random_weights_are_not_called_selective(labeled):
    path, pattern = labeled
    subject, controls = subjects(pattern, planted=False)
    with HDF5Source(path, shuffle=False, preprocess="none", prefetch=False) as src:
        report, _ = experiment.run(subject, controls, src, k=10, seed=0, stimulus_steps=5)
        assert report["selective"] is False  # the same random network as its control: no margin
        undecided, _ = experiment.run(subject, controls[:1], src, k=10, seed=0, stimulus_steps=0)
        assert undecided["selective"] is None and undecided["missing_controls"] == ["no_faces"]
    mean_face = next(r for r in report["rows"] if r["name"] == "mean_face")
    assert mean_face["test_balanced_acc_mean"] > 0.7  # the template (from ~20 noisy faces) sees the planted pattern


def test_labels_are_checked_before_scoring(tmp_path):
    from cotsdl.evaluate.experiment import label_error

    assert label_error("f.h5", np.array([0, 1, 0, 1])) is None
    assert "found [2]" in label_error("f.h5", np.array([0, 1, 2, 1]))
    assert "got 1 face(s) and 3 distractor(s)" in label_error("f.h5", np.array([0, 1, 0, 0]))
    assert "got 4 face(s) and 0 distractor(s)" in label_error("f.h5", np.ones(4, int))
