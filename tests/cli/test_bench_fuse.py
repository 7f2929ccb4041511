"""`cotsdl bench fuse` as a user runs it: one exchange per pool and LCN against one per layer, in one run."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from testkit import tiny_config

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def bench(*args, ranks=2, timeout=200):
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "cotsdl", "bench", "fuse", *args]
    env = {**os.environ, "MPIEXEC_TIMEOUT": str(timeout)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=env)


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(tiny_config(tmp_path / "unused.h5", tmp_path / "run", steps=2, every=0))
    return path


@pytest.mark.timeout(300)
def test_fuse_bench_counts_messages_and_predicts_both(cfg, tmp_path):
    out = tmp_path / "f.json"
    res = bench(str(cfg), "--steps", "4", "--warmup", "1", "--rounds", "2", "--machine", "gtx680-fdr",
                "--json", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    per, fused, whole = data["rows"]
    assert (per["setting"], fused["setting"], whole["setting"]) == ("per layer", "fused", "fused+filter")
    assert fused["fuse"] == [0] and fused["fuse_filter"] == [] and whole["fuse_filter"] == [0]
    # stage 0's LCN needs a halo on 2 ranks: fused, its messages ride on the pool's exchange; with the
    # filter fused too, the pool's ride on the filter's: one exchange for the frozen stage
    assert whole["halo_messages"] < fused["halo_messages"] < per["halo_messages"], data["rows"]
    assert per["loss"] == fused["loss"] == whole["loss"]  # the same forward, bit for bit
    assert data["weight_halo_fetches"] == 1  # once, in the warm-up: not per step or per round
    for r in data["rows"]:
        assert r["step_s"] > 0 and r["predicted_s"] > 0 and r["round_interval_s"][0] <= r["round_interval_s"][1]
    for key in ("fused_vs_per_layer", "filter_vs_per_layer"):
        f = data[key]
        assert f["rounds"] == 2 and f["interval"][0] <= f["median"] <= f["interval"][1]
    for key in ("break_even", "break_even_filter"):
        be = data[key]
        assert be["link"] == "link" and be["alpha_s"] > 0
        assert be["wins_now"] or be["break_even_alpha_s"] is None or be["break_even_alpha_s"] > be["alpha_s"]
    assert "fused / per layer, paired by round" in res.stdout and "planner on gtx680-fdr" in res.stdout
    assert "fused+filter / per layer, paired by round" in res.stdout and "fusing the filter too" in res.stdout


def test_fuse_bench_refuses_a_stage_with_nothing_below(cfg):
    res = bench(str(cfg), "--stage", "0", timeout=60)
    assert res.returncode == 2 and res.stderr.count("--stage must be in [1, 2)") == 1, res.stderr[-2000:]
