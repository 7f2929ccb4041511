"""The paper's layer trains on this machine's CPUs as `cotsdl plan` predicts: one stage of the paper's
shape (jobs/configs/paper-185m.toml's first) at 100x100x3, a few steps on one rank, against the plan
of a quick calibration of this machine.  Bounds are generous (0.5-2: a shared machine's speed drifts);
the full network's ratios are measured by jobs/paper-185m-cpu.sh (README, "The paper's smallest
network on this machine's CPUs").
"""
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from cotsdl.io.dataset import write_dataset

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8

CONFIG = """\
[data]
file = "{data}"
batch = 32
seed = 0
preprocess = "standardize"

[network]
input = [100, 100, 3]
allow_crop = true

[[network.stages]]            # the paper's first stage (jobs/configs/paper-185m.toml): 110 MB of weights here
filter = {{ size = [18, 18], stride = [2, 2], block = [4, 4], channels = 1 }}
pool = {{ size = [5, 5], stride = [4, 4], eps = 0.01 }}
lcn = {{ size = 5, sigma = 1.0, eps = 0.0001 }}

[train]
steps = [{steps}]
lam = 0.1
filter_norm = "auto"
checkpoint_every = {every}
log_every = 1

[train.optimizer]
kind = "momentum"
lr = 0.01
momentum = 0.9
clip_norm = 10.0

[run]
folder = "{run}"
backend = "numpy"
"""


def run(*args, timeout=120, env=None):
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                         env={**os.environ, **(env or {})})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res


def test_one_paper_stage_trains_as_planned(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (96, 100, 100, 3), dtype=np.uint8)
    write_dataset(tmp_path / "images.h5", images)
    cfg = tmp_path / "paper-stage.toml"
    cfg.write_text(CONFIG.format(data=tmp_path / "images.h5", run=tmp_path / "run", steps=STEPS, every=STEPS // 2))
    machine = tmp_path / "machine.json"
    run("-m", "cotsdl", "bench", "calibrate", "--quick", "--json", str(machine))  # one rank: its quick cases
    assert any(c["case"].startswith("paper") for c in json.loads(machine.read_text())["efficiency_by_size"])
    run("-m", "cotsdl", "plan", str(cfg), "--machine", str(machine), "--json", str(tmp_path / "plan.json"))
    run(str(ROOT / "jobs/lib/peak_rss.py"), "train", str(cfg), env={"COTSDL_PEAK_RSS_DIR": str(tmp_path)})

    plan = json.loads((tmp_path / "plan.json").read_text())["predictions"][0]
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert len(rows) == STEPS and all(np.isfinite(r["loss"]) for r in rows)  # it trains
    assert (tmp_path / "run/summary.json").exists()
    measured = statistics.median(r["seconds"] for r in rows[1:])  # the first step warms up
    peak = int((tmp_path / "peak-rss.0").read_text())
    time_ratio, memory_ratio = plan["seconds"] / measured, plan["memory_bytes"] / peak
    print(f"step: predicted {plan['seconds']:.3f} s, measured {measured:.3f} s: {time_ratio:.2f}; peak memory: "
          f"predicted {plan['memory_bytes'] / 2**20:.0f} MiB, measured {peak / 2**20:.0f} MiB: {memory_ratio:.2f}")
    assert 0.5 <= time_ratio <= 2, (plan["seconds"], measured)
    assert 0.5 <= memory_ratio <= 2, (plan["memory"], peak)
