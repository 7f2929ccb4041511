"""jobs/slurm/train.sbatch on a real one-node Slurm (tests/cluster/slurm-up.sh), as a CPU-only
cluster user submits it: checkpoint on the signal, requeue by itself, resume, bitwise equal to an
uninterrupted run; a bad config ends with 2 and no requeue.

Run by tests/run.sh after slurm-up.sh brought the cluster up; skipped anywhere else (never
against a Slurm this project did not configure).  Requeued jobs wait about two minutes before
they may start again (Slurm's begin time); the tests move that start to now with ``scontrol
update StartTime=now`` once the job has requeued itself, so the stage takes about a minute.
"""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cotsdl.io.dataset import write_dataset
from testkit import final_weights, tiny_config

ROOT = Path(__file__).resolve().parents[2]
CONF = Path("/etc/slurm/slurm.conf")
MARKER = "# written by cotsdl tests/cluster/slurm-up.sh"
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def _cluster_problem():
    if not shutil.which("sbatch") or not CONF.exists() or MARKER not in CONF.read_text():
        return "no Slurm brought up by tests/cluster/slurm-up.sh here"
    state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True).stdout.split()
    return None if {"idle", "mixed"} & set(state) else f"the test cluster's node is not idle ({state})"


pytestmark = [pytest.mark.skipif(_cluster_problem() is not None, reason=str(_cluster_problem())),
              pytest.mark.timeout(300)]


def job(job_id):
    """scontrol's fields of a job (JobState, Restarts, ExitCode, ...)."""
    out = subprocess.run(["scontrol", "show", "job", str(job_id)], capture_output=True, text=True).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def wait(cond, what, timeout=120):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


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
    """Once the job requeued itself: start it now instead of after Slurm's two-minute begin time."""
    wait(lambda: int(job(job_id).get("Restarts", 0)) >= 1 and job(job_id).get("JobState") == "PENDING",
         f"job {job_id} to requeue itself")
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now", "TimeLimit=10"], check=True)


@pytest.fixture
def run_setup(tmp_path):
    data = tmp_path / "tiny.h5"
    write_dataset(data, np.random.default_rng(0).integers(0, 256, (40, 12, 12), dtype=np.uint8))

    def config(name, steps=400, every=20):
        path = tmp_path / f"{name}.toml"
        path.write_text(tiny_config(data, tmp_path / name, steps, every, size=12, c0=3, c1=2, keep=50)
                        .replace("log_every = 1\n", "log_every = 100\n"))
        return path

    ref = config("ref")
    res = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "mpi4py", "-m", "cotsdl", "train", str(ref)],
                         capture_output=True, text=True, timeout=240, env={**os.environ, "MPIEXEC_TIMEOUT": "200"})
    assert res.returncode == 0, res.stderr
    return tmp_path, config


def assert_bitwise(tmp, name):
    (na, a), (nb, b) = final_weights(tmp / "ref"), final_weights(tmp / name)
    assert na == nb and a.keys() == b.keys() and a
    for k in a:
        assert np.array_equal(a[k], b[k]), f"{k} differs from the uninterrupted run"


def test_scancel_usr1_checkpoints_requeues_itself_and_resumes_bitwise(run_setup):
    tmp, config = run_setup
    job_id, out = submit(tmp, config("usr1"))
    wait(lambda: (tmp / "usr1" / "checkpoints" / "ckpt-000000040" / "index.json").exists(), "a checkpoint")
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
    assert 0 < stopped < 800
    assert_bitwise(tmp, "usr1")


def test_a_signal_lead_longer_than_the_start_requeues_and_the_guard_ends_the_loop(run_setup):
    """--time=1 with --signal=B:USR1@50: Slurm signals at once (its signal may come up to a minute
    early).  With COTSDL_MAX_IDLE_STARTS=2 the job requeues itself while it makes progress and stops
    after two starts in a row without a training step; submitted again with a time limit that leaves
    room, the run completes, bitwise equal to an uninterrupted one."""
    tmp, config = run_setup
    cfg = config("lead")
    job_id, out = submit(tmp, cfg, "--time=1", "--signal=B:USR1@50", env={"COTSDL_MAX_IDLE_STARTS": "2"})
    starts = 0
    while True:
        wait(lambda: finished(job_id) or (int(job(job_id).get("Restarts", 0)) > starts
                                          and job(job_id).get("JobState") == "PENDING"), "a start to end", 120)
        if finished(job_id):
            break
        starts += 1
        assert starts <= 6, out.read_text()[-3000:]
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
    text = out.read_text()
    assert "requeued: job" in text or "this start made no training step" in text, text[-3000:]
    if "status 0: the run is complete" not in text:  # the guard ended the loop: one message, no requeue after it
        assert "not requeued: 2 start(s) in a row stopped on the signal before a training step" in text, text[-3000:]
        assert finished(job_id) == "FAILED" and job(job_id).get("ExitCode", "").startswith("75")
        job_id, out = submit(tmp, cfg, "--time=10")
        assert wait(lambda: finished(job_id), "the job submitted again", 180) == "COMPLETED", out.read_text()[-3000:]
    assert_bitwise(tmp, "lead")


def test_a_bad_config_fails_with_2_and_is_not_requeued(run_setup):
    tmp, config = run_setup
    bad = config("bad")
    bad.write_text(bad.read_text().replace("[train]", "[train]\nbogus = 1"))
    job_id, out = submit(tmp, bad)
    assert wait(lambda: finished(job_id), f"job {job_id} to end") == "FAILED"
    info = job(job_id)
    assert info["ExitCode"].startswith("2:") and int(info.get("Restarts", 0)) == 0
    text = out.read_text()
    assert "unknown key train.bogus" in text and "status 2: bad command line, config or data; not requeued" in text
    assert "scontrol requeue" not in text
