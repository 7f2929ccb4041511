"""`cotsdl bench reader` and `bench reduction` as a user runs them, on a tiny dataset and 2 ranks."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cotsdl.io.dataset import write_dataset
from testkit import tiny_config

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def bench(which, *args, ranks=2, timeout=200):
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "cotsdl", "bench", which, *args]
    env = {**os.environ, "MPIEXEC_TIMEOUT": str(timeout)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=env)


@pytest.fixture
def cfg(tmp_path):
    data = tmp_path / "tiny.h5"
    write_dataset(data, np.random.default_rng(0).integers(0, 256, (40, 12, 12), dtype=np.uint8))
    path = tmp_path / "c.toml"
    path.write_text(tiny_config(data, tmp_path / "run", steps=2, every=0))
    return path


@pytest.mark.timeout(240)
def test_reader_alone_and_the_steps_waiting_for_it(cfg, tmp_path):
    out = tmp_path / "r.json"
    res = bench("reader", str(cfg), "--batches", "3", "--steps", "2", "--rounds", "2", "--stages", "1",
                "--json", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["benchmark"] == "reader" and data["batch"] == 4 and data["grid"] == [2, 1]
    assert [r["rank"] for r in data["alone"]] == [0, 1]
    for r in data["alone"]:
        assert r["window"] == [6, 12, 1] and r["seconds_per_batch"] > 0
        assert r["images_per_s"] == pytest.approx(4 / r["seconds_per_batch"])
    (row,) = data["steps"]
    assert row["stage"] == 1
    for name in ("prefetch", "no prefetch"):
        m = row[name]
        assert m["steps"] == 2 and m["step_s"] > 0 and 0 <= m["read_wait_s"] <= m["read_wait_max_s"] < m["step_s"]
    assert "images/s" in res.stdout and "read wait ms" in res.stdout
    # one process reads rank 0's window of a 2-rank grid; no steps
    res = bench("reader", str(cfg), "--grid-ranks", "2", "--batches", "2", ranks=1)
    assert res.returncode == 0 and "6x12x1" in res.stdout and "read wait" not in res.stdout, res.stderr[-2000:]
    res = bench("reader", str(cfg), "--stages", "5", "--steps", "1", "--rounds", "1", ranks=1)
    assert res.returncode != 0 and "--stages must be in [0, 2)" in res.stderr


@pytest.mark.timeout(120)
def test_reduction_bench_on_one_node(cfg, tmp_path):
    out = tmp_path / "d.json"
    res = bench("reduction", "--mb", "0.004", "--config", str(cfg), "--stages", "0", "--rounds", "3", "--calls", "1",
                "--json", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert [(r["replicas"], r["size"]) for r in rows] == [(2, "0.004 MB"), (2, "c stage 0")]
    # one node: auto sums flat; the stage's gradient is the whole 10x10 sites x 3 x 3x3 filter (one rank per group)
    assert all(r["auto"] == "flat" and r["group_nodes"] == 1 and r["bitwise_equal"] for r in rows)
    assert rows[1]["bytes_per_rank_max"] == 10 * 10 * 3 * 9 * 4
    assert len(rows[0]["flat_round_s"]) == len(rows[0]["two_level_round_s"]) == 3
