"""`cotsdl study --submit` on the real one-node Slurm of the cluster stage (tests/cluster/slurm-up.sh):
a 2-cell grid with a no-face control of each seed, as two job arrays (the controls, then the cells
after them); every element ends with status 0 and study.json holds both rows.

Skipped where slurm-up.sh did not bring up a Slurm.  The jobs carry this test's own name, and only
they are ever cancelled (when the test fails), never another user's.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cotsdl.io.dataset import write_dataset
from testkit import SLURM_CONF, SLURM_MARKER, tiny_config, wait_for

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "cli"))
from test_study_cli import labeled  # noqa: E402


def _cluster_problem():
    if not shutil.which("sbatch") or not SLURM_CONF.exists() or SLURM_MARKER not in SLURM_CONF.read_text():
        return "no Slurm brought up by tests/cluster/slurm-up.sh here"
    state = subprocess.run(["sinfo", "-h", "-p", "debug", "-o", "%T"], capture_output=True, text=True).stdout.split()
    return None if {"idle", "mixed", "allocated"} & set(state) else f"the debug partition's node is not up ({state})"


pytestmark = [pytest.mark.skipif(_cluster_problem() is not None, reason=str(_cluster_problem())),
              pytest.mark.timeout(600)]


def _ours(name):
    """Job ids (array elements included) of this test's jobs that are still queued or running."""
    out = subprocess.run(["squeue", "-h", "-o", "%i", "--name", f"{name}-controls,{name}-cells"],
                         capture_output=True, text=True).stdout
    return out.split()


def test_submit_runs_the_grid_as_job_arrays(tmp_path):
    write_dataset(tmp_path / "tiny.h5", np.random.default_rng(0).integers(0, 256, (40, 12, 12), dtype=np.uint8))
    write_dataset(tmp_path / "other.h5", np.random.default_rng(1).integers(0, 256, (40, 12, 12), dtype=np.uint8))
    cfg = tmp_path / "c.toml"
    cfg.write_text(tiny_config(tmp_path / "tiny.h5", tmp_path / "unused", 6, 4))
    faces = labeled(tmp_path / "faces.h5")
    name = f"cotsdl-study-test-{os.getpid()}"
    env = {**os.environ, "COTSDL_MODULES": "", "COTSDL_VENV": sys.prefix, "COTSDL_STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": str(ROOT)}
    env.pop("COTSDL_SKIP_ENV", None)
    out = tmp_path / "study"
    res = subprocess.run([sys.executable, "-m", "cotsdl", "study", str(cfg), "--vary", "train.seed=0,1",
                          "--control-data", str(tmp_path / "other.h5"), "--dataset", str(faces), "--out", str(out),
                          "--ranks", "2", "--splits", "2", "--bootstrap", "100", "--stimulus-steps", "0",
                          "--no-figures", "--job-name", name, "--sbatch-option=--partition=debug",
                          "--sbatch-option=--cpus-per-task=1", "--sbatch-option=--time=00:10:00", "--submit"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[study] submitted: 2 control(s)" in res.stdout and "and 2 cell(s)" in res.stdout
    try:
        wait_for(lambda: not _ours(name), f"the study's jobs ({name}) to end", timeout=540, every=2)
    finally:
        left = _ours(name)
        if left:  # only this test's own jobs
            subprocess.run(["scancel", "--name", f"{name}-controls,{name}-cells"], check=False)
    logs = sorted((out / "slurm").glob("*.out"))
    text = "\n".join(f"== {p.name}\n{p.read_text()}" for p in logs)
    assert len(logs) == 4, text[-4000:]
    for p in logs:
        assert "status 0: the run is complete" in p.read_text(), text[-4000:]
    doc = json.loads((out / "study.json").read_text())
    assert doc["finished"] == doc["cells"] == 2, text[-4000:]
    assert [r["settings"] for r in doc["rows"]] == [{"train.seed": 0}, {"train.seed": 1}]
    for r in doc["rows"]:
        assert r["control_run"] == str(out / "controls" / f"seed-{r['settings']['train.seed']}__other")
        assert {c["control"] for c in r["comparisons"]} >= {"random_weights", "no_faces"}
        assert r["ci_low"] <= r["best_neuron"] <= r["ci_high"]
        assert json.loads((out / "runs" / r["cell"] / "report.json").read_text())["run"]["ranks"] == 2
