"""The selectivity experiment on a planted signal: a neuron set by hand to the face template is found and
called selective; the same network with random weights is not."""
import json

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.array import ProcessGrid
from cotsdl.evaluate import experiment, scoring
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
    assert {r["name"] for r in report["rows"]} == {"network", "random_weights", "no_faces", "best_pixel", "mean_face",
                                                   "linear_probe"}
    # the figure data: held-out responses on the chosen threshold's two sides, and a stimulus like the pattern
    assert np.median(figs["faces"]) > figs["threshold"] > np.median(figs["distractors"])
    corr = np.corrcoef(figs["stimulus"].ravel(), pattern.ravel())[0, 1]
    assert corr > 0.9, corr
    assert report["best"]["stimulus_trace"][-1] > report["best"]["stimulus_trace"][0]
    # the stimulus measure: correlation with the mean face, far above the random-weight network's best unit
    net_st, rnd_st = report["stimulus"]["units"][:2]
    assert (net_st["network"], rnd_st["network"]) == ("network", "random_weights")
    assert net_st["own"]["correlation"] > 0.8 and net_st["own"]["ci_low"] > 0.8
    assert net_st["own"]["correlation"] > max(rnd_st["own"]["correlation"], rnd_st["opposite"]["correlation"]) + 0.4
    assert net_st["opposite"]["correlation"] < -0.8  # a linear unit: the other polarity gives minus the face


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


def grouped_set(path, pattern, sign_of_views):
    """Identities of 4 views (noise around one base image); faces carry nothing, distractors carry the
    pattern with sign ``sign_of_views(rng, n)``; kinds: face, plus two distractor kinds."""
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(60), 4)
    y = (groups % 3 == 0).astype(np.int64)
    base = rng.standard_normal((60, 12, 12))[groups]
    x = 0.6 * base + 0.8 * rng.standard_normal((240, 12, 12))
    x += ((1 - y) * sign_of_views(rng, 60)[groups])[:, None, None] * pattern
    kinds = np.where(y == 1, 0, 1 + groups % 2)
    write_dataset(path, x.astype(np.float32), labels=y, recipe={"builder": "test: grouped"})
    with h5py.File(path, "a") as f:  # as prepare-data faces records them (written here for any reader)
        f["groups"] = groups * 10 + 1
        f.create_dataset("kinds", data=kinds.astype(np.int8)).attrs["kind_names"] = json.dumps(
            ["face", "lfw_nonface", "phase_scrambled"])
    return y, groups, kinds


def test_a_planted_unit_low_for_faces_is_found_and_scored_high(tmp_path):
    """Distractors carry the pattern with either sign, faces do not: the filter unit is high for half the
    distractors and low for the other half, useless as a threshold; its L2-pooled output is LOW for faces."""
    pattern = np.random.default_rng(0).standard_normal((12, 12))
    pattern *= 4.0 / np.linalg.norm(pattern)
    grouped_set(tmp_path / "low.h5", pattern, lambda rng, n: rng.choice([-1.0, 1.0], n))
    subject, controls = subjects(pattern, planted=True)
    with HDF5Source(tmp_path / "low.h5", shuffle=False, preprocess="none", prefetch=False) as src:
        report, figs = experiment.run(subject, controls, src, k=8, seed=0, stimulus_steps=20, resamples=300)
    b = report["best"]
    assert b["layer"] in (1, 2) and b["position"] == [0, 0, 2] and b["polarity"] == -1, b
    assert report["intervals"]["network"]["score"] > 0.9 and report["selective"] is True
    assert figs["polarity"] == -1 and np.median(figs["faces"]) < figs["threshold"] < np.median(figs["distractors"])
    assert np.mean(figs["top_y"]) > np.mean(figs["bottom_y"])  # most face-like first: the lowest responses


def test_the_report_numbers_schema_groups_and_kinds(tmp_path):
    rng = np.random.default_rng(0)
    pattern = rng.standard_normal((12, 12))
    pattern *= 4.0 / np.linalg.norm(pattern)
    y, groups, kinds = grouped_set(tmp_path / "g.h5", -pattern, lambda rng, n: np.ones(n))  # distractors: -pattern
    subject, controls = subjects(pattern, planted=True)
    with HDF5Source(tmp_path / "g.h5", shuffle=False, preprocess="none", prefetch=False) as src:
        report, _ = experiment.run(subject, controls, src, k=6, seed=3, stimulus_steps=0, resamples=200)
    (st,) = report["stages"]  # one stage: its filters and units beside the random-weight start
    assert st["stage"] == 0 and st["units"] == 4
    assert st["cosine_to_init"] == pytest.approx(1.0)  # 3 of its 4 units are the random start
    assert st["random_silent_fraction"] == 0 and 0 <= st["silent_fraction"] <= 1
    assert st["best_balanced_acc"] == pytest.approx(report["scores"]["network"]["mean_balanced_acc"])
    assert st["random_best_balanced_acc"] == pytest.approx(report["scores"]["random_weights"]["mean_balanced_acc"])
    assert {"gabor_fraction", "random_gabor_fraction", "median_norm"} <= set(st)
    # the first stage's border sites against its interior (cotsdl.nn.orientation.compare)
    assert {"border_orientations", "interior_orientations", "border_edge_parallel", "interior_edge_parallel",
            "edge_parallel_diff", "edge_parallel_diff_ci_low", "edge_parallel_diff_ci_high"} <= set(st)
    assert len(st["border_orientations"]) == 4 and abs(sum(st["border_orientations"]) - 1) < 1e-9
    assert np.isnan(st["interior_edge_parallel"])  # its one site is a corner: no interior, no one nearest edge
    (top,) = report["by_stage"]  # one stage: its best neuron is the best neuron
    assert top["stage"] == 0 and top["intervals"]["network"] == report["intervals"]["network"]
    assert report["groups"] == 60 and report["kinds"] == {"face": 80, "lfw_nonface": 80, "phase_scrambled": 80}
    assert report["bootstrap"] == {"resamples": 200, "unit": "group", "level": 0.95, "seed": 3}
    for c in report["comparisons"]:
        assert {"measure", "control", "difference", "ci_low", "ci_high"} <= set(c)
        assert c["measure"] in ("best_neuron", "linear_probe")
        assert c["control"] in ("random_weights", "no_faces", "best_pixel", "mean_face")
        assert c["ci_low"] <= c["difference"] <= c["ci_high"] or c["ci_low"] == c["ci_high"]
    best = [(c["control"]) for c in report["comparisons"] if c["measure"] == "best_neuron" and "stage" not in c]
    assert best == ["random_weights", "no_faces", "best_pixel", "mean_face"]
    tops = [c for c in report["comparisons"] if c["measure"] == "best_neuron" and "stage" in c]
    assert [(c["stage"], c["control"]) for c in tops] == [(0, "random_weights"), (0, "no_faces")]
    probes = [c for c in report["comparisons"] if c["measure"] == "linear_probe"]
    assert [(c.get("stage"), c["control"]) for c in probes] == [
        (0, "random_weights"), (0, "no_faces"), (None, "random_weights"), (None, "no_faces")]
    assert probes[2]["last_stage"] == 0 and probes[2]["difference"] == probes[0]["difference"]
    for c in ("random_weights", "no_faces"):  # the verdict reads the same numbers
        v = report["verdicts"][c]
        entry = next(e for e in report["comparisons"] if e["measure"] == "best_neuron" and e["control"] == c)
        assert (v["difference"], v["ci_low"], v["ci_high"]) == (entry["difference"], entry["ci_low"], entry["ci_high"])
        assert v["beats"] == (entry["ci_low"] > 0)
    net = report["intervals"]["network"]
    assert net["score"] == pytest.approx(report["scores"]["network"]["mean_balanced_acc"])
    assert net["ci_low"] < net["score"] < net["ci_high"]
    assert [k["kind"] for k in report["per_kind"]] == ["lfw_nonface", "phase_scrambled"]
    for k in report["per_kind"]:
        assert k["distractors"] == 80 and k["groups"] == 20
        assert set(k["scores"]) == {"network", "random_weights", "no_faces", "best_pixel", "mean_face"}
        assert k["scores"]["network"]["ci_low"] <= k["scores"]["network"]["score"] <= k["scores"]["network"]["ci_high"]
        assert set(k["differences"]) == {"random_weights", "no_faces", "best_pixel", "mean_face"}
    # the two kinds together give the overall score (equal numbers of each in every test half: up to rounding)
    mean_kinds = np.mean([k["scores"]["network"]["score"] for k in report["per_kind"]])
    assert mean_kinds == pytest.approx(net["score"], abs=0.05)
    (row,) = report["probes"]
    assert row["stage"] == 0 and row["features"] == 4 and set(row["scores"]) == {
        "network", "random_weights", "no_faces", "pixels"}
    for sel, test in scoring.stratified_splits(y, 6, 3, groups, kinds):
        assert not set(groups[sel]) & set(groups[test])


def test_the_verdict_per_kind_names_the_weakest_kind(tmp_path):
    """Distractors of two kinds: noise, and 'lookalikes' that carry the faces' pattern. The planted neuron
    beats every control on the noise but on no control on the lookalikes: per kind it is selective on one
    kind only, and the lookalikes are the weakest kind; a third, named control run decides too."""
    rng = np.random.default_rng(1)
    pattern = rng.standard_normal((12, 12))
    pattern *= 4.0 / np.linalg.norm(pattern)
    kinds = np.arange(240) % 3  # 0 face, 1 noise, 2 lookalike
    x = rng.standard_normal((240, 12, 12)) + (kinds != 1)[:, None, None] * pattern
    path = tmp_path / "kinds.h5"
    write_dataset(path, x.astype(np.float32), labels=(kinds == 0).astype(np.int64), groups=np.arange(240),
                  kinds=kinds.astype(np.int8), kind_names=["face", "noise", "lookalike"],
                  recipe={"builder": "test: planted pattern, two distractor kinds"})
    subject, controls = subjects(pattern, planted=True)
    plan = controls[0].plan
    controls.append(experiment.Subject("matched", "yet other random weights", plan, plan.init_params(9)))
    with HDF5Source(path, shuffle=False, preprocess="none", prefetch=False) as src:
        report, _ = experiment.run(subject, controls, src, k=6, seed=0, stimulus_steps=0, stimulus_starts=1,
                                   resamples=200)
    assert report["must_beat"] == ["random_weights", "no_faces", "matched"]
    assert "matched" in report["verdicts"] and any(c["control"] == "matched" for c in report["comparisons"])
    by = {k["kind"]: k for k in report["per_kind"]}
    assert by["noise"]["selective"] is True and set(by["noise"]["beats"]) == {"random_weights", "no_faces", "matched"}
    assert by["lookalike"]["selective"] is False and not any(by["lookalike"]["beats"].values())
    assert report["selective_every_kind"] is False
    weak = report["weakest_kind"]
    assert weak["kind"] == "lookalike" and weak["control"] in report["must_beat"] and weak["beats"] is False
    assert weak["difference"] == min(by["lookalike"]["differences"][c]["difference"] for c in report["must_beat"])
    probes = {c["control"] for c in report["comparisons"] if c["measure"] == "linear_probe"}
    assert probes == {"random_weights", "no_faces", "matched"}
