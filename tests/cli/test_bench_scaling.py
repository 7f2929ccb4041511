"""`cotsdl bench scaling` as a user runs it: real training steps on 1..P ranks, overlap on and off."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cotsdl.ops import available_cores
from testkit import tiny_config

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def bench(*args, ranks=2, timeout=200, cwd=None):
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "cotsdl", "bench", "scaling", *args]
    env = {**os.environ, "MPIEXEC_TIMEOUT": str(timeout)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=env, cwd=cwd)


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(tiny_config(tmp_path / "unused.h5", tmp_path / "run", steps=2, every=0))
    return path


def test_scaling_measures_every_rank_count_and_both_overlaps(cfg, tmp_path):
    out = tmp_path / "s.json"
    res = bench(str(cfg), "--steps", "3", "--warmup", "1", "--rounds", "2", "--stage", "1", "--replicas", "2",
                "--json", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    got = {(m["ranks"], m["replicas"], m["overlap"]) for m in data["results"]}
    assert got == {(1, 1, True), (1, 1, False), (2, 1, True), (2, 1, False), (2, 2, True), (2, 2, False)}
    assert data["rounds"] == 2
    for m in data["results"]:
        assert m["step_s"] > 0 and m["images_per_s"] > 0 and 0 <= m["exchange_s"] <= m["step_s"] * 1.5
        assert m["efficiency"] > 0 and m["compute_s"] >= 0
        assert m["steps"] == 3 and len(m["round_s"]) == 2 and all(t > 0 for t in m["round_s"])
        # what "auto" chooses for the setting, and its step vs the other's, paired by round
        auto = m["auto"]
        assert isinstance(auto["overlap"], bool) and auto["reason"] and auto["vs_best"] >= 0
        same = {o["overlap"]: o["round_s"] for o in data["results"] if o["grid"] == m["grid"]
                and (o["ranks"], o["replicas"]) == (m["ranks"], m["replicas"])}
        ratios = [a / b for a, b in zip(same[auto["overlap"]], same[not auto["overlap"]])]
        assert auto["vs_other"] == pytest.approx(np.median(ratios) - 1)
        assert auto["vs_best"] == pytest.approx(max(auto["vs_other"], 0))
        assert auto["interval"] == pytest.approx([min(ratios) - 1, max(ratios) - 1]) and auto["coverage"] == 0.5
        # per core: against one rank on a rank's share of the cores, paired by round (p ranks on whole cores)
        eff = m["core_efficiency"]
        if m["ranks"] == 2 and m["replicas"] == 1 and available_cores() >= 2:
            assert len(m["alone_round_s"]) == 2 and all(t > 0 for t in m["alone_round_s"])
            per = [a / (2 * t) for a, t in zip(m["alone_round_s"], m["round_s"])]
            assert eff["value"] == pytest.approx(np.median(per)) and eff["interval"] == pytest.approx(sorted(per))
        else:
            assert eff is None and m["alone_round_s"] is None
        if m["ranks"] // m["replicas"] == 1:
            assert auto["overlap"] is False and "no halo to hide" in auto["reason"]
    assert "images/s" in res.stdout and "eff/core" in res.stdout and res.stdout.count("\n") >= 6
    assert "  1 rank(s), 1 replica(s) x grid 1x1: off: 1 rank, no halo to hide" in res.stdout


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "need --steps >= 1"),
    (["--rounds", "0"], "--rounds >= 1"),
    (["--stage", "5"], "--stage must be in [0, 2)"),
    (["--json", "/nonexistent/dir/s.json"], "/nonexistent/dir"),
])
def test_bad_arguments_are_one_clear_error(cfg, args, message):
    res = bench(str(cfg), *args)
    assert res.returncode == 2, res.stderr[-2000:]
    assert message in res.stderr and res.stderr.count("cotsdl: error") == 1


def test_a_missing_config_is_named(tmp_path):
    res = bench(str(tmp_path / "nope.toml"))
    assert res.returncode == 2 and "nope.toml" in res.stderr


def test_the_planner_prediction_is_printed_beside_the_measurement(cfg, tmp_path):
    out = tmp_path / "s.json"
    res = bench(str(cfg), "--steps", "2", "--warmup", "0", "--overlap", "on", "--machine", "gtx680-fdr",
                "--json", str(out), ranks=1)
    assert res.returncode == 0, res.stderr[-3000:]
    (m,) = json.loads(out.read_text())["results"]
    assert m["predicted_s"] > 0 and m["ratio"] == pytest.approx(m["predicted_s"] / m["step_s"])
    auto = bench(str(cfg), "--steps", "1", "--warmup", "0", "--overlap", "auto", "--json", str(out), ranks=1)
    assert auto.returncode == 0, auto.stderr[-3000:]
    (m,) = json.loads(out.read_text())["results"]  # only what auto chooses is measured
    assert m["overlap"] is False and m["auto"] == {"overlap": False, "reason": "1 rank, no halo to hide",
                                                   "vs_best": None, "vs_other": None, "interval": None,
                                                   "coverage": None}
    bad = bench(str(cfg), "--machine", "k80", ranks=2)
    assert bad.returncode == 2 and "k80" in bad.stderr and bad.stderr.count("cotsdl: error") == 1


def test_auto_is_decided_where_the_settings_ranks_are():
    """Every setting asks "auto" with its own ranks per node and whether each model group sits on one
    node (rank 0 decides; on two nodes of two ranks, 4 ranks in one group span both, in two do not)."""
    from types import SimpleNamespace  # noqa: PLC0415

    from mpi4py import MPI  # noqa: PLC0415

    from cotsdl.bench.scaling import _choices  # noqa: PLC0415

    asked = []

    def decide(p, replicas, dims, ranks_per_node, group_on_one_node):
        asked.append((p, replicas, ranks_per_node, group_on_one_node))
        return SimpleNamespace(on=not group_on_one_node, reason="test")

    keys = [(1, 1, (1, 1)), (2, 1, (2, 1)), (4, 1, (2, 2)), (4, 2, (2, 1))]
    out = _choices(MPI.COMM_SELF, decide, keys, [0, 0, 2, 2])
    assert asked == [(1, 1, 1, True), (2, 1, 2, True), (4, 1, 2, False), (4, 2, 2, True)]
    assert [out[k]["overlap"] for k in keys] == [False, False, True, False]
