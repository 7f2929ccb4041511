"""`cotsdl study` as a user runs it: bad input refused up front, a tiny grid with its no-face control
trained and evaluated under mpiexec, a re-run that skips finished cells and resumes an interrupted
one from its checkpoint, and the Slurm array commands it prints."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from cotsdl.io.dataset import write_dataset
from testkit import tiny_config


def study(*args, timeout=600):
    env = {**os.environ, "MPIEXEC_TIMEOUT": "300", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "cotsdl", "study", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def labeled(path, size=12):
    """A tiny labeled set (faces: a bright square), with identities and kinds as the evaluator wants."""
    rng = np.random.default_rng(3)
    y = (np.arange(60) % 3 == 0).astype(np.int64)
    imgs = rng.integers(0, 256, (60, size, size), dtype=np.uint8)
    imgs[y == 1, 3:9, 3:9] = 255
    write_dataset(path, imgs, labels=y)
    with h5py.File(path, "a") as f:
        f["groups"] = np.arange(60) // 2
        f.create_dataset("kinds", data=np.where(y == 1, 0, 1 + (np.arange(60) // 2) % 2).astype(np.int8))
        f["kinds"].attrs["kind_names"] = json.dumps(["face", "photo_crop", "phase_scrambled"])
    return path


@pytest.fixture
def tiny(tmp_path):
    write_dataset(tmp_path / "tiny.h5", np.random.default_rng(0).integers(0, 256, (40, 12, 12), dtype=np.uint8))
    cfg = tmp_path / "c.toml"
    cfg.write_text(tiny_config(tmp_path / "tiny.h5", tmp_path / "unused", 6, 4))
    return tmp_path, cfg, labeled(tmp_path / "faces.h5")


FAST = ["--splits", "2", "--bootstrap", "100", "--stimulus-steps", "0", "--no-figures"]


@pytest.mark.parametrize("extra, said", [
    (["--vary", "train.sed=0,1"], "unknown key train.sed; did you mean 'seed'?"),
    (["--vary", "train.seed="], "--vary train.seed: empty value list"),
    (["--vary", "foo.bar=1,2"], "unknown key foo"),
    (["--vary", "data.face_fraction=0,2"], "--vary data.face_fraction: value 2: a face fraction"),
    (["--vary", "train.seed=0,1", "--vary", "train.seed=2"], "--vary train.seed is given twice"),
    (["--vary", "train.seed=0,1", "--control-data", "nowhere.h5"], "--control-data nowhere.h5: no such file"),
    (["--vary", "train.seed=0,1", "--set", "train.lam=-1"], "train.lam"),
    (["--vary", "run.folder=a,b"], "run.folder is the study's to choose"),
    (["--vary", "train.seed=0,1", "--ranks", "0"], "--ranks must be a positive integer"),
    (["--vary", "network.input=[16,16,1]"], "images 12x12x1, the network of cell input-16+16+1 takes 16x16x1"),
])
def test_bad_input_is_refused_before_anything_runs(tiny, extra, said):
    tmp, cfg, faces = tiny
    res = study(cfg, "--dataset", faces, "--out", tmp / "s", *extra)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cotsdl: error: ") and said in lines[0], res.stderr
    assert not (tmp / "s").exists() and res.stdout == ""


def test_a_missing_dataset_is_refused(tiny):
    tmp, cfg, _ = tiny
    res = study(cfg, "--dataset", tmp / "nope.h5", "--out", tmp / "s", "--vary", "train.seed=0,1")
    assert res.returncode == 2 and "--dataset " + str(tmp / "nope.h5") + ": no such file" in res.stderr
    unlabeled = study(cfg, "--dataset", tmp / "tiny.h5", "--out", tmp / "s", "--vary", "train.seed=0,1")
    assert unlabeled.returncode == 2 and "no 'labels'" in unlabeled.stderr
    (tmp / "tiny.h5").unlink()  # the config's data.file, when no recipe key makes one
    res = study(cfg, "--dataset", tmp / "faces.h5", "--out", tmp / "s", "--vary", "train.seed=0,1")
    assert res.returncode == 2 and f"data.file {tmp / 'tiny.h5'}" in res.stderr and "no such file" in res.stderr
    assert not (tmp / "s").exists()


def _checkpoints(run):
    return sorted(p.name for p in (run / "checkpoints").glob("ckpt-*"))


@pytest.mark.timeout(900)
def test_a_tiny_grid_with_its_control_then_a_rerun_resumes(tiny):
    tmp, cfg, faces = tiny
    out = tmp / "study"
    args = [cfg, "--vary", "data.face_fraction=0,0.5", "--control-nofaces", "--data-count", "48", "--dataset", faces,
            "--out", out, "--ranks", "2", *FAST]
    first = study(*args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    said = [line for line in first.stdout.splitlines() if line.startswith("[study]")]
    assert sum(line.endswith(": started") for line in said) == 2 and sum("finished in" in line for line in said) == 2
    # the data sets, built once and named by their recipe: two of the grid and the control's
    assert sorted(p.name for p in (out / "data").iterdir()) == [
        "natural-12x12x1-n48-s0-ff0.5.h5", "natural-12x12x1-n48-s0-ff0.h5", "natural-12x12x1-n48-s0-nofaces.h5"]
    doc = json.loads((out / "study.json").read_text())
    assert doc["varied"] == ["data.face_fraction"] and doc["cells"] == doc["finished"] == 2
    assert [r["settings"] for r in doc["rows"]] == [{"data.face_fraction": 0}, {"data.face_fraction": 0.5}]
    for r in doc["rows"]:
        report = json.loads((out / "runs" / r["cell"] / "report.json").read_text())
        assert r["best_neuron"] == report["intervals"]["network"]["score"]
        assert (r["ci_low"], r["ci_high"]) == (report["intervals"]["network"]["ci_low"],
                                               report["intervals"]["network"]["ci_high"])
        assert {c["control"] for c in r["comparisons"]} >= {"random_weights", "no_faces"}
        assert r["comparisons"] == [c for c in report["comparisons"] if "stage" not in c]
        assert r["control_run"] == str(out / "controls" / "base__natural-12x12x1-n48-s0-nofaces")
        assert report["run"]["control_run"] == r["control_run"]  # one control for both: the same seed
    trained = {c: _checkpoints(out / "runs" / c) for c in ("face_fraction-0", "face_fraction-0.5")}
    assert "| 0.5 |" in (out / "study.md").read_text()

    again = study(*args)  # nothing to do: both cells are skipped, nothing is trained
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("finished before, skipped") == 2 and "cotsdl train" not in again.stdout
    assert {c: _checkpoints(out / "runs" / c) for c in trained} == trained

    # the second cell as a kill during its training leaves it: its last checkpoint is gone, it has no
    # summary, no report and no record
    cell = out / "runs" / "face_fraction-0.5"
    last = _checkpoints(cell)[-1]
    shutil.rmtree(cell / "checkpoints" / last)
    for f in (cell / "summary.json", cell / "report.json", out / "cells" / "face_fraction-0.5.json"):
        f.unlink()
    resumed = study(*args)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert resumed.stdout.count("finished before, skipped") == 1
    assert f"resumed from {cell / 'checkpoints' / _checkpoints(cell)[-2]}" in resumed.stdout
    assert _checkpoints(cell) == trained["face_fraction-0.5"]
    assert json.loads((out / "study.json").read_text())["finished"] == 2

    # another evaluation setting: every cell is evaluated again, none is trained again
    changed = study(*args[:-len(FAST)], "--splits", "3", *FAST[2:])
    assert changed.returncode == 0, changed.stdout[-3000:] + changed.stderr[-3000:]
    assert "finished before" not in changed.stdout and changed.stdout.count("is already complete") == 2
    assert {c: _checkpoints(out / "runs" / c) for c in trained} == trained
    assert json.loads((out / "runs" / "face_fraction-0" / "report.json").read_text())["scores"]["network"]["splits"] == 3


def test_print_array_prints_the_two_arrays(tiny):
    tmp, cfg, faces = tiny
    out = tmp / "s"
    res = study(cfg, "--vary", "train.seed=0,1,2", "--control-data", tmp / "tiny.h5", "--dataset", faces, "--out", out,
                "--ranks", "2", "--job-name", "my-study", "--print-array", "--sbatch-option=--time=00:30:00")
    assert res.returncode == 0, res.stderr
    cd, controls, cells = res.stdout.strip().splitlines()
    assert cd.startswith("cd ") and cd.endswith(str(Path(__file__).resolve().parents[2]))
    assert controls.startswith("CONTROLS=$(sbatch --parsable --job-name=my-study-controls --array=0-2 ")
    assert cells.startswith("sbatch --parsable --job-name=my-study-cells --array=0-2 ")
    assert '"--dependency=afterok:$CONTROLS"' in cells and "--ntasks=2" in cells and "--time=00:30:00" in cells
    assert cells.rstrip().endswith("--array-part cells") and "jobs/slurm/study.sbatch" in cells
    assert not (out / "runs").exists()  # nothing trained


@pytest.mark.timeout(600)
def test_a_signal_checkpoints_the_running_cell_and_a_rerun_resumes_it(tiny):
    tmp, cfg, faces = tiny
    out = tmp / "study"
    args = [cfg, "--vary", "train.seed=0,1", "--set", "train.steps=[150,150]", "--set", "train.checkpoint_every=1000",
            "--dataset", faces, "--out", out, "--ranks", "2", *FAST]
    env = {**os.environ, "MPIEXEC_TIMEOUT": "300", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cotsdl", "study", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    log = out / "runs" / "seed-0" / "log.txt"
    deadline = time.time() + 200
    while time.time() < deadline and not (log.exists() and "stage 0 step 3/" in log.read_text()):
        time.sleep(0.02)
    proc.send_signal(signal.SIGUSR1)  # to the study alone: it passes the request on to the training
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 75, stdout[-2000:] + stderr[-2000:]
    assert "stopped by SIGUSR1 at global step" in stdout and "Abort" not in stderr
    assert "[study] cell seed-0: stopped after a checkpoint; run the same command again to resume" in stdout
    stopped = int(stdout.split("stopped by SIGUSR1 at global step ")[1].split(";")[0])
    assert stopped < 300 and not (out / "cells").exists() and not (out / "runs" / "seed-1").exists()
    again = study(*args)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"resumed from {out / 'runs' / 'seed-0' / 'checkpoints' / f'ckpt-{stopped:09d}'}" in again.stdout
    assert json.loads((out / "study.json").read_text())["finished"] == 2
