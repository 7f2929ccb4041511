"""The study's grid, its checks and its aggregation (cotsdl.evaluate.study): no MPI, no processes."""
import json

import pytest

from cotsdl.evaluate import study


def test_vary_parses_values_as_set_does():
    a = study.parse_vary("train.seed=0,1,2")
    assert a.key == "train.seed" and a.values == (0, 1, 2) and a.texts == ("0", "1", "2")
    b = study.parse_vary("train.steps=[10,10], [20, 20]")  # commas inside brackets do not split
    assert b.values == ([10, 10], [20, 20])
    c = study.parse_vary('train.optimizer.kind=adam,"sgd"')  # a bare word is a string, as --set reads it
    assert c.values == ("adam", "sgd")
    assert study.parse_vary("data.face_fraction=0,0.01,0.5").values == (0, 0.01, 0.5)


@pytest.mark.parametrize("option, said", [
    ("train.seed", "expected KEY=V1,V2"),
    ("=1,2", "no key before '='"),
    ("train.seed=", "empty value list"),
    ("train.seed=1,,2", "empty value"),
    ("train.seed=1,2,1", "the value 1 is given twice"),
    ("data.face_fraction=0,1", "value 1: a face fraction must be a number from 0 to less than 1"),
    ("data.face_fraction=x", "value x: a face fraction"),
    ("data.count=0", "value 0: a data set's image count must be a positive integer"),
])
def test_bad_vary_is_refused_naming_key_and_value(option, said):
    with pytest.raises(study.StudyError, match=said.replace("(", r"\(")):
        study.parse_vary(option)


def test_grid_is_the_product_last_key_fastest():
    cells = study.expand([study.parse_vary("train.seed=0,1"), study.parse_vary("data.face_fraction=0,0.05,0.5")])
    assert [c.index for c in cells] == list(range(6))
    assert [(c.settings["train.seed"], c.settings["data.face_fraction"]) for c in cells] == [
        (0, 0), (0, 0.05), (0, 0.5), (1, 0), (1, 0.05), (1, 0.5)]
    c = cells[4]
    assert c.name == "seed-1__face_fraction-0.05"
    assert c.config_sets() == ["train.seed=1"]  # the recipe key is not a config key
    assert c.recipe_settings() == {"face_fraction": 0.05}
    assert c.model_texts() == {"train.seed": "1"}  # what the no-face control shares with the cell
    assert len({x.name for x in cells}) == 6


def test_a_key_twice_is_refused():
    with pytest.raises(study.StudyError, match="--vary train.seed is given twice"):
        study.expand([study.parse_vary("train.seed=0"), study.parse_vary("train.seed=1")])


def test_names_are_safe_paths_and_recipes_name_their_files():
    assert study.slug({}) == "base"
    assert study.slug({"network.stages[1].filter.channels": "4", "train.steps": "[5,5]"}) == \
        "stages1.filter.channels-4__steps-5+5"
    assert study.recipe_name(4096, (32, 32), 1, 0, 0.01) == "natural-32x32x1-n4096-s0-ff0.01.h5"
    assert study.recipe_name(4096, (32, 32), 1, 0, no_faces=True) == "natural-32x32x1-n4096-s0-nofaces.h5"


def _report(score, rw, nf):
    def iv(s):
        return {"score": s, "ci_low": s - 0.02, "ci_high": s + 0.02}
    comps = [{"measure": "best_neuron", "control": "random_weights", "difference": score - rw, "ci_low": score - rw - 0.03,
              "ci_high": score - rw + 0.03, "score": score, "control_score": rw},
             {"measure": "best_neuron", "control": "no_faces", "difference": score - nf, "ci_low": score - nf - 0.03,
              "ci_high": score - nf + 0.03, "score": score, "control_score": nf},
             {"measure": "best_neuron", "control": "random_weights", "stage": 1, "difference": 0.0, "ci_low": -0.1,
              "ci_high": 0.1}]
    return {"intervals": {"network": iv(score), "random_weights": iv(rw), "no_faces": iv(nf), "mean_face": iv(0.8)},
            "comparisons": comps, "selective": score - max(rw, nf) > 0.03, "best": {"layer": 3}}


def test_rows_table_and_figure(tmp_path):
    cells = study.expand([study.parse_vary("data.face_fraction=0,0.5"), study.parse_vary("train.seed=0,1")])
    rows = []
    for c, s in zip(cells, [0.70, 0.72, 0.90, 0.88]):
        rec = {"run": f"runs/{c.name}", "control_run": "controls/x", "train_seconds": 20.0, "evaluate_seconds": 5.0,
               "wall_seconds": 30.0}
        rows.append(study.row(c, _report(s, 0.68, 0.71), rec))
    r = rows[2]
    assert r["settings"] == {"data.face_fraction": 0.5, "train.seed": 0}
    assert (r["best_neuron"], r["ci_low"], r["ci_high"]) == (0.90, 0.90 - 0.02, 0.90 + 0.02)
    assert [c["control"] for c in r["comparisons"]] == ["random_weights", "no_faces"]  # overall only
    assert set(r["controls"]) == {"random_weights", "no_faces"} and r["selective"] is True
    assert r["seconds"] == {"train_seconds": 20.0, "evaluate_seconds": 5.0, "wall_seconds": 30.0}
    pytest.importorskip("matplotlib")
    paths = study.write(tmp_path, rows, ["data.face_fraction", "train.seed"], 4, {"config": "c.toml"})
    doc = json.loads(paths["json"].read_text())
    assert doc["cells"] == 4 and doc["finished"] == 4 and doc["varied"] == ["data.face_fraction", "train.seed"]
    assert [x["best_neuron"] for x in doc["rows"]] == [0.70, 0.72, 0.90, 0.88]
    md = paths["md"].read_text()
    assert "| 0.5 | 0 | 0.900 [0.880, 0.920] | +0.220 [+0.190, +0.250] | +0.190 [+0.160, +0.220] | yes | 20 | 5 |" in md
    assert "![selectivity against each varied setting](study.png)" in md
    assert paths["figure"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_empty_study_writes_its_table(tmp_path):
    paths = study.write(tmp_path, [], ["train.seed"], 3, {})
    assert json.loads(paths["json"].read_text())["rows"] == [] and "0 of 3 cell(s) finished" in paths["md"].read_text()
    assert "figure" not in paths
