"""`cotsdl evaluate` as a user runs it: a tiny trained run, scored on 1 and on 2 ranks, figures and report."""
import json
import re
import struct

import h5py
import numpy as np
import pytest

from cotsdl.io.dataset import write_dataset
from test_train_cli import cotsdl, setup  # noqa: F401 - pytest finds the fixture by its name here


@pytest.mark.timeout(400)
def test_evaluate_writes_the_report_and_agrees_across_ranks(setup):  # noqa: F811
    tmp, make = setup
    assert cotsdl("train", str(make(steps=4, every=100))).returncode == 0
    rng = np.random.default_rng(3)
    y = (np.arange(60) % 3 == 0).astype(np.int64)
    faces = rng.integers(0, 256, (60, 12, 12), dtype=np.uint8)
    faces[y == 1, 3:9, 3:9] = 255  # a bright square: something to find
    write_dataset(tmp / "faces.h5", faces, labels=y)
    with h5py.File(tmp / "faces.h5", "a") as f:  # identities of two views, two kinds of distractor
        f["groups"] = np.arange(60) // 2
        f.create_dataset("kinds", data=np.where(y == 1, 0, 1 + (np.arange(60) // 2) % 2).astype(np.int8))
        f["kinds"].attrs["kind_names"] = json.dumps(["face", "photo_crop", "phase_scrambled"])
    one = cotsdl("evaluate", str(tmp / "run"), "--splits", "6", "--stimulus-steps", "5", "--json", str(tmp / "one.json"),
                 ranks=1, timeout=300)
    assert one.returncode == 0, one.stderr
    two = cotsdl("evaluate", str(tmp / "run"), "--splits", "6", "--stimulus-steps", "5", ranks=2, timeout=300)
    assert two.returncode == 0, two.stderr
    assert two.stdout.count("report: ") == 1 and "held-out balanced accuracy" in two.stdout
    a, b = json.loads((tmp / "one.json").read_text()), json.loads((tmp / "run" / "report.json").read_text())
    assert a["run"]["ranks"] == 1 and b["run"]["ranks"] == 2
    for name in a["scores"]:
        assert a["scores"][name]["test_balanced_acc"] == pytest.approx(b["scores"][name]["test_balanced_acc"])
        assert a["scores"][name].get("neurons") == b["scores"][name].get("neurons")
        assert a["scores"][name].get("polarities") == b["scores"][name].get("polarities")
    assert a["groups"] == 30 and a["bootstrap"]["resamples"] == 1000
    for key in ("comparisons", "per_kind", "probes", "intervals", "stages"):
        assert json.dumps(a[key], sort_keys=True) == json.dumps(b[key], sort_keys=True), key
    for x, y in zip(a["by_stage"], b["by_stage"]):  # (float32 thresholds may differ in the last bit)
        assert x["intervals"] == y["intervals"] and x["best"]["neuron"] == y["best"]["neuron"]
    assert [k["kind"] for k in a["per_kind"]] == ["photo_crop", "phase_scrambled"]
    # the random-weight control is the run's start: the filter norm it was trained under ("auto")
    assert [s["stage"] for s in a["stages"]] == [0, 1]
    for s in a["stages"]:
        assert s["random_median_norm"] == pytest.approx(s["median_norm"], rel=1e-4)
        assert 0.9 < s["cosine_to_init"] <= 1.0 + 1e-6  # 4 steps: near the start
        assert 0 < s["recon_rel"] < 10 and 0 < s["random_recon_rel"] < 10  # from the run's metrics.jsonl
    md = (tmp / "run" / "report.md").read_text()
    links = re.findall(r"\]\(([^)]+\.png)\)", md)
    assert len(links) == 6
    for link in links:
        png = (tmp / "run" / link).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        w, h = struct.unpack(">II", png[16:24])
        assert 300 <= w <= 4000 and 200 <= h <= 4000
    assert a["verdict"]["sentence"] in md
    overall = [c for c in a["comparisons"] if c["measure"] == "best_neuron" and "stage" not in c]
    # once overall, once within the last stage, once for the weakest kind when it is the control named there
    weakest = a["weakest_kind"]["control"] == "random_weights"
    assert a["verdict"]["sentence"].count("random_weights") == 2 + weakest
    assert f"the weakest kind is {a['weakest_kind']['kind']}" in a["verdict"]["sentence"]
    assert f"random_weights {overall[0]['difference']:+.3f}" in a["verdict"]["sentence"]
    assert "## Faces against each kind of distractor" in md and "### Linear probes on each stage" in md
    # the per-kind table comes first after the verdict
    assert md.index("## Verdict") < md.index("## Faces against each kind of distractor") < md.index("## Setup")
    assert "## Stages" in md and "### The best neuron of each stage" in md
    assert "## Setup: where this run departs from the paper" in md and "inputs 12×12×1" in md
    assert a["setup"]["face_fraction"] is None  # the tiny set was not built by `natural`


def test_evaluate_bad_input(setup):  # noqa: F811
    tmp, make = setup
    res = cotsdl("evaluate", str(tmp / "nowhere"), ranks=2)
    assert res.returncode == 2 and res.stderr.count("is not a run folder of cotsdl train") == 1
    assert cotsdl("train", str(make(steps=2, every=100))).returncode == 0
    unlabeled = cotsdl("evaluate", str(tmp / "run"), "--dataset", str(tmp / "tiny.h5"), ranks=2)
    assert unlabeled.returncode == 2 and unlabeled.stderr.count("no 'labels'") == 1, unlabeled.stderr
    missing = cotsdl("evaluate", str(tmp / "run"), ranks=2)  # no --dataset and no faces.h5 beside the data
    assert missing.returncode == 2 and "pass --dataset FILE" in missing.stderr
    write_dataset(tmp / "allfaces.h5", np.zeros((20, 12, 12), np.uint8), labels=np.ones(20, np.int64))
    allfaces = cotsdl("evaluate", str(tmp / "run"), "--dataset", str(tmp / "allfaces.h5"), ranks=2)
    assert allfaces.returncode == 2 and allfaces.stderr.count("got 20 face(s) and 0 distractor(s)") == 1
    write_dataset(tmp / "ok.h5", np.zeros((20, 12, 12), np.uint8), labels=np.arange(20) % 2)
    (tmp / "afile").write_text("")
    unwritable = cotsdl("evaluate", str(tmp / "run"), "--dataset", str(tmp / "ok.h5"), "--figures",
                        str(tmp / "afile" / "sub"), ranks=2)
    assert unwritable.returncode == 2 and unwritable.stderr.count("cannot write into") == 1
    assert not (tmp / "run" / "report.md").exists()
    assert cotsdl("train", str(make("other.toml", run=tmp / "other", steps=2, every=100)),
                  "--set", "network.stages[0].filter.channels=5").returncode == 0
    other = cotsdl("evaluate", str(tmp / "run"), "--dataset", str(tmp / "ok.h5"), "--control-run", str(tmp / "other"),
                   ranks=2)
    assert other.returncode == 2 and other.stderr.count("must be the same architecture") == 1
    assert cotsdl("train", str(make("whitened.toml", run=tmp / "whitened", steps=2, every=100)),
                  "--set", "data.input_lcn.size=3").returncode == 0
    whitened = cotsdl("evaluate", str(tmp / "run"), "--dataset", str(tmp / "ok.h5"), "--control-run",
                      str(tmp / "whitened"), ranks=2)
    assert whitened.returncode == 2 and whitened.stderr.count("must see the same input") == 1, whitened.stderr
    few = cotsdl("evaluate", str(tmp / "run"), "--dataset", str(tmp / "ok.h5"), "--splits", "1", ranks=1)
    assert few.returncode == 2 and "need --splits >= 2" in few.stderr
    resamples = cotsdl("evaluate", str(tmp / "run"), "--dataset", str(tmp / "ok.h5"), "--bootstrap", "10", ranks=1)
    assert resamples.returncode == 2 and "need --bootstrap >= 100" in resamples.stderr
    write_dataset(tmp / "one.h5", np.zeros((20, 12, 12), np.uint8), labels=np.arange(20) % 2)
    with h5py.File(tmp / "one.h5", "a") as f:
        f["groups"] = np.where(np.arange(20) % 2 == 1, 0, np.arange(20))  # every face one identity
    one = cotsdl("evaluate", str(tmp / "run"), "--dataset", str(tmp / "one.h5"), ranks=2)
    assert one.returncode == 2 and one.stderr.count("at least 2 groups with faces") == 1, one.stderr
    everything = (unlabeled.stderr + missing.stderr + allfaces.stderr + unwritable.stderr + other.stderr + few.stderr
                  + resamples.stderr + one.stderr + whitened.stderr)
    assert "Traceback" not in everything and "Abort" not in everything
