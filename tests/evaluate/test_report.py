"""report.md of the new numbers: intervals and paired differences, polarity, per-kind rows, stage probes,
the trainer's per-stage diagnostics when present; the verdict sentence."""
import json
import re

import pytest

from cotsdl.cli.evaluate import _sentence, control_runs
from cotsdl.evaluate import report as rep


def diff(d, lo, hi):
    return {"difference": d, "ci_low": lo, "ci_high": hi}


def score(s, lo, hi):
    return {"score": s, "ci_low": lo, "ci_high": hi}


def make(selective=True, missing=()):
    comparisons = [{"measure": "best_neuron", "control": c, **diff(*v)} for c, v in
                   {"random_weights": (0.12, 0.05, 0.2), "no_faces": (0.08, 0.01, 0.15),
                    "best_pixel": (0.02, -0.03, 0.07), "mean_face": (-0.1, -0.16, -0.04)}.items()
                   if c not in missing]
    comparisons += [{"measure": "linear_probe", "control": "random_weights", **diff(0.1, 0.02, 0.2), "stage": 0},
                    {"measure": "linear_probe", "control": "random_weights", **diff(0.1, 0.02, 0.2), "last_stage": 0}]
    return {
        "verdict": {"selective": selective, "sentence": "SENTENCE"}, "selective": selective,
        "must_beat": ["random_weights", "no_faces"], "missing_controls": list(missing),
        "images": 300, "faces": 120, "groups": 90, "bootstrap": {"resamples": 1000, "unit": "group", "level": 0.95},
        "scores": {"network": {"splits": 20}},
        "best": {"layer": 1, "kind": "pool", "stage": 0, "neuron": 17, "position": [1, 2, 0], "threshold": 0.25,
                 "polarity": -1, "split": 0, "chosen_layers": [1], "polarities": {"high": 3, "low": 17}},
        "intervals": {"network": score(0.9, 0.86, 0.94)},
        "rows": [{"name": "network", "what": "trained", "test_balanced_acc_mean": 0.9, "test_balanced_acc_std": 0.02,
                  "ci_low": 0.86, "ci_high": 0.94, "beats": None},
                 {"name": "random_weights", "what": "initial", "test_balanced_acc_mean": 0.78,
                  "test_balanced_acc_std": 0.03, "ci_low": 0.7, "ci_high": 0.85, "beats": True}],
        "verdicts": {"random_weights": {**diff(0.12, 0.05, 0.2), "beats": True}},
        "comparisons": comparisons,
        "per_kind": [{"kind": "phase_scrambled", "distractors": 90, "groups": 45,
                      "scores": {"network": score(0.95, 0.9, 0.98), "random_weights": score(0.7, 0.6, 0.8)},
                      "differences": {"random_weights": diff(0.25, 0.15, 0.35)}}],
        "probes": [{"stage": 0, "layer": 2, "features": 400,
                    "scores": {"network": score(0.91, 0.87, 0.95), "random_weights": score(0.81, 0.76, 0.86),
                               "pixels": score(0.7, 0.65, 0.75)},
                    "differences": {"random_weights": diff(0.1, 0.02, 0.2)}}]}


def test_the_report_shows_intervals_polarity_kinds_probes_and_stages(tmp_path):
    r = make()
    r["stages"] = [{"stage": 0, "cosine_to_init": 0.41, "random_cosine_to_init": 1.0, "gabor_fraction": 0.6,
                    "histogram": [1, 2, 3]},
                   {"stage": 1, "cosine_to_init": 0.7, "random_cosine_to_init": 1.0, "silent_fraction": 0.1}]
    _, md_path = rep.write_report(tmp_path, r, {})
    md = md_path.read_text()
    assert re.search(r"^\| random_weights \| initial \| 0\.780 ± 0\.030 \| \[0\.700, 0\.850\] .*\| \*\*\+0\.120 "
                     r"\[0\.050, 0\.200\]\*\* \| \*\*yes\*\* \|$", md, re.M), md
    assert "responding **low** (face iff response < 0.250)" in md and "low in 17" in md
    assert re.search(r"^\| phase_scrambled \| 90 \(45\) \| 0\.950 \[0\.900, 0\.980\] \| 0\.700 \[0\.600, 0\.800\] "
                     r"\| \*\*\+0\.250 \[0\.150, 0\.350\]\*\* \|$", md, re.M), md
    assert re.search(r"^\| 1 \| 2 \| 400 \| 0\.910 \[0\.870, 0\.950\] \| 0\.810 \[0\.760, 0\.860\] "
                     r"\| 0\.700 \[0\.650, 0\.750\] \| \*\*\+0\.100 \[0\.020, 0\.200\]\*\* \|$", md, re.M), md
    # the trainer's stages: one table, a row per stage, the scalar keys as columns
    assert "| stage | cosine_to_init | random_cosine_to_init | gabor_fraction | silent_fraction |" in md
    assert "| 0 | 0.410 | 1.000 | 0.600 | – |" in md and "| 1 | 0.700 | 1.000 | – | 0.100 |" in md
    assert "histogram" not in md.split("## Stages")[1].split("##")[0]
    assert "1000 resamples of the groups" in md and "90 groups" in md
    assert json.loads((tmp_path / "report.json").read_text())["comparisons"] == r["comparisons"]


def test_no_stages_no_stages_table(tmp_path):
    _, md_path = rep.write_report(tmp_path, make(), {})
    assert "## Stages" not in md_path.read_text()


@pytest.mark.parametrize("selective, missing, says", [
    (True, (), "It beats the random-weight network and the network trained without faces (the lower end"),
    (False, (), "It does not beat both the random-weight network and the network trained without faces"),
    (None, ("no_faces",), "Undecided: the network trained without faces was not run as a control (--control-run)")])
def test_the_verdict_sentence(selective, missing, says):
    s = _sentence(make(selective, missing))
    assert says in s
    assert "0.900 (95% interval [0.860, 0.940] over 90 groups)" in s and "low for faces" in s
    assert "random_weights +0.120 [0.050, 0.200]" in s
    assert ("no_faces" in s) == (not missing)


def with_kinds(r, lookalike_beats_matched=False):
    """Two kinds decided against three controls: photo crops beaten by all, LFW non-faces not by 'matched'."""
    r["must_beat"] = ["random_weights", "no_faces", "matched"]
    lo = 0.01 if lookalike_beats_matched else -0.05
    r["per_kind"] = [
        {"kind": "photo_crop", "distractors": 100, "groups": 100,
         "scores": {"network": score(0.95, 0.92, 0.97), "matched": score(0.8, 0.75, 0.85)},
         "differences": {"random_weights": diff(0.3, 0.2, 0.4), "no_faces": diff(0.15, 0.1, 0.2),
                         "matched": diff(0.15, 0.1, 0.2)},
         "beats": {"random_weights": True, "no_faces": True, "matched": True}, "selective": True},
        {"kind": "lfw_nonface", "distractors": 50, "groups": 50,
         "scores": {"network": score(0.86, 0.8, 0.9), "matched": score(0.86, 0.8, 0.9)},
         "differences": {"random_weights": diff(0.13, 0.08, 0.18), "no_faces": diff(0.0, -0.05, 0.05),
                         "matched": diff(0.002 if lookalike_beats_matched else -0.01, lo, 0.04)},
         "beats": {"random_weights": True, "no_faces": False, "matched": lookalike_beats_matched},
         "selective": False}]
    r["weakest_kind"] = {"kind": "lfw_nonface", "control": "no_faces", "difference": 0.0, "ci_low": -0.05,
                         "ci_high": 0.05, "score": 0.86, "beats": False}
    return r


def test_the_per_kind_table_comes_first_after_the_verdict(tmp_path):
    _, md_path = rep.write_report(tmp_path, with_kinds(make()), {})
    md = md_path.read_text()
    assert md.index("## Verdict") < md.index("## Faces against each kind of distractor") < md.index(
        "## The best neuron against the controls")
    assert "Weakest kind: **lfw_nonface** (network − no_faces +0.000 [-0.050, 0.050])" in md
    assert re.search(r"^\| photo_crop \| 100 \(100\) \| \*\*yes\*\* \| 0\.950 \[0\.920, 0\.970\] ", md, re.M), md
    assert re.search(r"^\| lfw_nonface \| 50 \(50\) \| no \| ", md, re.M), md
    assert "random_weights, no_faces, matched is above 0 on that kind" in md


def test_the_verdict_names_the_weakest_kind():
    s = _sentence(with_kinds(make(True)))
    assert ("It beats the random-weight network, the network trained without faces and the matched network "
            "(LFW non-faces in place of the faces)") in s
    assert ("Per kind of distractor, it beats every deciding control on 1 of 2 kinds (not on lfw_nonface); the "
            "weakest kind is lfw_nonface: network 0.860, minus no_faces +0.000 [-0.050, 0.050]: on lfw_nonface it "
            "shows no gain over the network trained without faces.") in s
    assert "It does not beat all of" in _sentence(with_kinds(make(False)))


@pytest.mark.parametrize("values, expect", [
    (["runs/a"], [("no_faces", "runs/a")]),
    (["runs/a", "matched=runs/b"], [("no_faces", "runs/a"), ("matched", "runs/b")]),
    (["matched=runs/b", "runs/a", "other_2=x=y"], [("matched", "runs/b"), ("no_faces", "runs/a"),
                                                    ("other_2", "x=y")]),
])
def test_control_runs_are_named(values, expect):
    assert control_runs(values) == expect


@pytest.mark.parametrize("values, message", [
    (["runs/a", "runs/b"], "only one control run may go unnamed"),
    (["random_weights=runs/a"], "'random_weights' names another measure"),
    (["m=runs/a", "m=runs/b"], "the name 'm' is given twice"),
    (["no_faces=runs/a", "runs/b"], "only one control run may go unnamed"),
])
def test_bad_control_run_names(values, message):
    with pytest.raises(ValueError, match=message):
        control_runs(values)
