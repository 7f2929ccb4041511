"""`cotsdl plan` as a user runs it: tables, JSON, the memory refusal, and one clear error for bad input."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "tests/planner/three_stage.toml")  # three stages (not the demo: it may change)


def plan(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "cotsdl", "plan", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def one_error(res):
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cotsdl: error: "), res.stderr
    return lines[0]


def test_plan_prints_layers_stages_and_a_suggestion(tmp_path):
    out = tmp_path / "plan.json"
    res = plan(DEMO, "--ranks", "4", "--grid", "2", "2", "--machine", "h100-ndr", "--json", str(out))
    assert res.returncode == 0, res.stderr
    for text in ("grid 2x2", "filter0", "training step of stage 2", "suggested:", "MEASURED on one H100", "halo MiB"):
        assert text in res.stdout
    data = json.loads(out.read_text())
    assert [p["stage"] for p in data["predictions"]] == [0, 1, 2]
    assert data["predictions"][0]["grid"] == [2, 2] and data["error"] is None
    assert data["suggestions"][0]["images_per_s"] == max(s["images_per_s"] for s in data["suggestions"])


def test_plan_says_which_overlap_and_why(tmp_path):
    out = tmp_path / "plan.json"
    one = plan(DEMO, "--json", str(out))  # the config's "auto" on 1 rank
    assert one.returncode == 0, one.stderr
    assert "  overlap off (auto: 1 rank, no halo to hide)\n" in one.stdout
    ov = json.loads(out.read_text())["overlap"]
    assert ov == {"setting": "auto", "source": "the config", "on": False, "reason": "1 rank, no halo to hide",
                  "seconds_on": None, "seconds_off": None}
    four = plan(DEMO, "--ranks", "4", "--grid", "2", "2", "--machine", "gtx680-fdr", "--json", str(out))
    assert four.returncode == 0, four.stderr
    data = json.loads(out.read_text())
    ov = data["overlap"]
    assert ov["seconds_on"] > 0 and ov["seconds_off"] > 0 and "machine gtx680-fdr" in ov["reason"]
    assert f"  overlap {'on' if ov['on'] else 'off'} (auto: {ov['reason']})\n" in four.stdout
    assert all(p["overlap"] == ov["on"] for p in data["predictions"])  # the predictions use the choice
    given = plan(DEMO, "--ranks", "4", "--overlap", "on")
    assert given.returncode == 0 and "  overlap on (--overlap on)\n" in given.stdout
    config = plan(DEMO, "--ranks", "4", "--set", "parallel.overlap=false")
    assert config.returncode == 0 and "  overlap off (set in the config)\n" in config.stdout
    table = plan("--table", DEMO, "--ranks", "1", "4", "--machine", "gtx680-fdr", "--json", str(out))
    assert table.returncode == 0, table.stderr
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["overlap"]["on"] is False and rows[0]["overlap"]["reason"] == "1 rank, no halo to hide"
    assert rows[1]["overlap"]["setting"] == "auto" and rows[1]["overlap"]["seconds_on"] > 0


def test_memory_refusal_names_the_layer_and_the_bytes(tmp_path):
    out = tmp_path / "plan.json"
    res = plan(str(ROOT / "jobs/configs/paper-11.2b.toml"), "--ranks", "4", "--stage", "0",
               "--machine", "gtx680-fdr", "--json", str(out))
    line = one_error(res)
    assert "does not fit" in line and "layer 0 (filter of stage 0)" in line
    assert "the device has 4.00 GiB (gtx680-fdr)" in line and "GiB on rank" in line
    assert json.loads(out.read_text())["error"]  # the plan is still written, for a look
    # and how many ranks it takes: the suggested count fits, one count fewer of the list does not
    fits_on = json.loads(out.read_text())["fits_on"]
    n = fits_on["ranks"]
    assert n > 4 and f"it fits on {n} ranks" in line and f"--ranks {n}" in line
    from cotsdl.planner.predict import RANK_COUNTS

    ok = plan(str(ROOT / "jobs/configs/paper-11.2b.toml"), "--ranks", str(n), "--stage", "0", "--machine", "gtx680-fdr")
    assert ok.returncode == 0, ok.stderr
    fewer = max(c for c in RANK_COUNTS if c < n)
    if fewer > 4:
        assert plan(str(ROOT / "jobs/configs/paper-11.2b.toml"), "--ranks", str(fewer), "--stage", "0",
                    "--machine", "gtx680-fdr").returncode == 2


def test_table(tmp_path):
    out = tmp_path / "t.json"
    res = plan("--table", DEMO, str(ROOT / "jobs/configs/paper-185m.toml"), "--ranks", "1", "4",
               "--machine", "gtx680-fdr", "h100-ndr", "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert "paper-185m" in res.stdout and "GiB/GPU" in res.stdout and "The paper" in res.stdout
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 2 * 2 and {r["machine"] for r in rows} == {"gtx680-fdr", "h100-ndr"}
    assert rows[0]["config"] == DEMO  # smallest network first


@pytest.mark.parametrize("args, match", [
    (["--ranks", "0"], "--ranks must be >= 1, got 0"),
    (["--ranks", "4", "--replicas", "3"], "--ranks 4 is not a multiple of the replicas 3"),
    (["--ranks", "4", "--grid", "3", "1"], "grid 3x1 x 1 replica(s) is 3 ranks, not --ranks 4"),
    (["--machine", "k80"], "machine k80: no preset or file named 'k80'"),
    (["--ranks", "2", "4"], "need --table"),
    (["--stage", "5"], "--stage 5: the network has 3 stage(s)"),
    (["--set", "network.stages[0].filter.size=[99, 99]"], "does not fit its input"),
])
def test_bad_arguments_give_one_clear_error(args, match):
    assert match in one_error(plan(DEMO, *args))


def test_bad_machine_file_and_json_destination(tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"name": "x", "kind": "tpu"}))
    assert f"machine {f}: missing key source" in one_error(plan(DEMO, "--machine", str(f)))
    assert "is a folder" in one_error(plan(DEMO, "--json", str(tmp_path)))
    assert "no such file" in one_error(plan(str(tmp_path / "nope.toml")))


def test_plan_says_which_frozen_stages_fuse_their_filter_and_their_weight_halo(tmp_path):
    """--fuse on --fuse-filter on: the choice line, the weight halo of the frozen stages (kept, fetched once),
    and the JSON's counts; a fuse_filter outside fuse is one clear error naming both keys."""
    out = tmp_path / "plan.json"
    res = plan(DEMO, "--ranks", "4", "--grid", "2", "2", "--machine", "gtx680-fdr", "--fuse", "on",
               "--fuse-filter", "on", "--stage", "2", "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert "with the filter too while frozen (one exchange of the stage's input) in stage(s) 0, 1, 2" in res.stdout
    assert "(--fuse on, --fuse-filter on)" in res.stdout
    assert "frozen stage(s) 0, 1 with the filter fused: weight halo" in res.stdout and "not per step" in res.stdout
    data = json.loads(out.read_text())
    pred = data["predictions"][0]
    assert pred["fuse_filter"] == [0, 1] and pred["weight_halo"]["bytes_kept"] > 0
    assert data["fuse"]["filters"] == [0, 1, 2]
    auto = plan(DEMO, "--ranks", "4", "--grid", "2", "2", "--machine", "gtx680-fdr", "--fuse-filter", "auto")
    assert auto.returncode == 0 and "auto: stage 0 " in auto.stdout and "filter+pool+LCN" in auto.stdout
    bad = plan(DEMO, "--ranks", "4", "--set", "parallel.fuse=[0]", "--set", "parallel.fuse_filter=[1]")
    assert "parallel.fuse_filter: stage 1's filter joins its pool and LCN only where they are fused" in one_error(bad)
