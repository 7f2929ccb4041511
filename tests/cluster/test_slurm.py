"""jobs/slurm/train.sbatch on a real one-node Slurm (tests/cluster/slurm-up.sh), as a CPU-only
cluster user submits it: checkpoint on the signal, requeue by itself, resume, bitwise equal to an
uninterrupted run; a bad config ends with 2 and no requeue.

Run by tests/run.sh after slurm-up.sh brought the cluster up; skipped anywhere else (never
against a Slurm this project did not configure).  A requeued job waits until the credentials of
its last start expire before it starts again: two minutes by default, 10 s on the test cluster
(``AuthInfo=cred_expire=10``), so the stage takes about a minute and a half.
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
from testkit import SLURM_CONF, SLURM_MARKER, final_weights, slurm_job, tiny_config, wait_for

ROOT = Path(__file__).resolve().parents[2]
CONF, MARKER = SLURM_CONF, SLURM_MARKER
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def _cluster_problem():
    if not shutil.which("sbatch") or not CONF.exists() or MARKER not in CONF.read_text():
        return "no Slurm brought up by tests/cluster/slurm-up.sh here"
    state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True).stdout.split()
    return None if {"idle", "mixed"} & set(state) else f"the test cluster's node is not idle ({state})"


pytestmark = [pytest.mark.skipif(_cluster_problem() is not None, reason=str(_cluster_problem())),
              pytest.mark.timeout(300)]


job, wait = slurm_job, wait_for


def submit(tmp, cfg, *sbatch_opts, env=None):
    """sbatch jobs/slurm/train.sbatch CFG as written for a CPU-only cluster (from the repository root,
    the environment made once: here, the test run's .venv); returns (job id, output file)."""
    out = tmp / "job-%j.out"
    full = {**os.environ, "COTSDL_BACKEND": "numpy", "COTSDL_MODULES": "", "COTSDL_VENV": sys.prefix,
            "COTSDL_STATE_DIR": str(tmp / "state"), **(env or {})}
    full.pop("COTSDL_SKIP_ENV", None)
    res = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
                          f"--output={out}", *sbatch_opts, "jobs/slurm/train.sbatch", str(cfg)],
                         cwd=ROOT, env=full, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip().split(";")[0]
    return job_id, Path(str(out).replace("%j", job_id))


def finished(job_id):
    state = job(job_id).get("JobState")
    return state if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else None


def requeued(job_id):
    """Wait until the job requeued itself (it then starts again on its own, once Slurm allows)."""
    wait(lambda: int(job(job_id).get("Restarts", 0)) >= 1, f"job {job_id} to requeue itself")


@pytest.fixture(scope="module")
def run_setup(tmp_path_factory):
    """A dataset and a config maker (once for the module)."""
    tmp_path = tmp_path_factory.mktemp("slurm")
    data = tmp_path / "tiny.h5"
    write_dataset(data, np.random.default_rng(0).integers(0, 256, (40, 12, 12), dtype=np.uint8))

    def config(name, steps, every=50):
        path = tmp_path / f"{name}.toml"
        path.write_text(tiny_config(data, tmp_path / name, steps, every, size=12, c0=3, c1=2, keep=100)
                        .replace("log_every = 1\n", "log_every = 500\n"))
        return path

    return tmp_path, config


def reference(tmp, cfg):
    """The same config trained without interruption (mpiexec, beside the job): its run folder."""
    ref = tmp / f"ref-{cfg.stem}.toml"
    ref.write_text(cfg.read_text().replace(str(tmp / cfg.stem), str(tmp / f"ref-{cfg.stem}")))
    return subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-m", "mpi4py", "-m", "cotsdl", "train", str(ref)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "MPIEXEC_TIMEOUT": "280"})


def steps_lasting(tmp, config, seconds):
    """Steps per stage (the config has two) that train for about ``seconds`` alone on 2 ranks here, from
    a short run of the same config, and never fewer than 2500.  A job that must still train when
    Slurm's signal comes cannot be a fixed count: 2500 took about 50 s on a slow day of this VM and
    24.5 s on a fast one, where the job ended before the signal and never requeued."""
    probe = config("probe", 500)
    subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "mpi4py", "-m", "cotsdl", "train", str(probe)],
                   check=True, capture_output=True, timeout=150, env={**os.environ, "MPIEXEC_TIMEOUT": "120"})
    s = json.loads((tmp / "probe" / "summary.json").read_text())
    return max(2500, int(s["session_steps"] / s["session_seconds"] * seconds / 2))


def assert_bitwise(tmp, name, ref):
    assert ref.wait(timeout=290) == 0, ref.stderr.read()
    (na, a), (nb, b) = final_weights(tmp / f"ref-{name}"), final_weights(tmp / name)
    assert na == nb and a.keys() == b.keys() and a
    for k in a:
        assert np.array_equal(a[k], b[k]), f"{k} differs from the uninterrupted run"


def test_scancel_usr1_checkpoints_requeues_itself_and_resumes_bitwise(run_setup):
    tmp, config = run_setup
    cfg = config("usr1", 500)
    ref = reference(tmp, cfg)
    job_id, out = submit(tmp, cfg)
    wait(lambda: (tmp / "usr1" / "checkpoints" / "ckpt-000000100" / "index.json").exists(), "a checkpoint")
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)  # as Slurm's --signal=B:USR1@T
    requeued(job_id)
    assert wait(lambda: finished(job_id), f"job {job_id} to end", 180) == "COMPLETED", out.read_text()[-3000:]
    text = out.read_text()
    stopped = int(text.split("stopped by SIGUSR1 at global step ")[1].split(";")[0])
    for said in (f"checkpoint {tmp / 'usr1' / 'checkpoints' / f'ckpt-{stopped:09d}'}",
                 f"requeued: job {job_id} starts again", "(start 2, requeued 1 times)",
                 f"resumed from {tmp / 'usr1' / 'checkpoints' / f'ckpt-{stopped:09d}'}",
                 "status 0: the run is complete"):
        assert said in text, (said, text[-3000:])
    assert 0 < stopped < 1000
    assert_bitwise(tmp, "usr1", ref)


def test_a_time_limit_signal_checkpoints_and_requeues_itself(run_setup):
    """--time=1 with --signal=B:USR1@50: Slurm signals within the first ~40 s of the start (it checks
    every ~30 s, and may signal up to a minute early), while the ranks train or, rarely, before they
    start.  The job
    requeues itself either way; its second start (given a time limit that leaves room, as a user
    would) resumes and completes, bitwise equal to an uninterrupted run."""
    tmp, config = run_setup
    cfg = config("lead", steps_lasting(tmp, config, 50))  # Slurm checks the signal times every ~30 s
    ref = reference(tmp, cfg)
    job_id, out = submit(tmp, cfg, "--time=1", "--signal=B:USR1@50")
    requeued(job_id)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=10"], check=True)
    assert wait(lambda: finished(job_id), f"job {job_id} to end", 240) == "COMPLETED", out.read_text()[-3000:]
    text = out.read_text()
    first = text.split("(start 2, requeued 1 times)")[0]
    assert f"requeued: job {job_id} starts again" in first, text[-3000:]
    if "stopped by SIGUSR1 at global step" in first:  # the signal came while the ranks trained
        stopped = int(first.split("stopped by SIGUSR1 at global step ")[1].split(";")[0])
        assert f"this start trained global steps 0..{stopped}" in first
        assert f"resumed from {tmp / 'lead' / 'checkpoints' / f'ckpt-{stopped:09d}'}" in text
    else:  # it came before the launch: a start without progress, counted by the requeue guard
        assert "this start made no training step (1 of at most 3 in a row)" in first, first[-3000:]
    assert "status 0: the run is complete" in text
    assert_bitwise(tmp, "lead", ref)


def test_a_bad_config_fails_with_2_and_is_not_requeued(run_setup):
    tmp, config = run_setup
    bad = config("bad", 10)
    bad.write_text(bad.read_text().replace("[train]", "[train]\nbogus = 1"))
    job_id, out = submit(tmp, bad)
    assert wait(lambda: finished(job_id), f"job {job_id} to end") == "FAILED"
    info = job(job_id)
    assert info["ExitCode"].startswith("2:") and int(info.get("Restarts", 0)) == 0
    text = out.read_text()
    assert "unknown key train.bogus" in text and "status 2: bad command line, config or data; not requeued" in text
    assert "scontrol requeue" not in text
