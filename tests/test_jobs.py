"""The cluster batch jobs (jobs/slurm/*.sbatch, jobs/pbs/*.pbs, jobs/lib/batch.sh),
without a scheduler: stub executables on PATH (srun, mpiexec, scontrol, sbatch,
qrerun, qsub, qstat) record their arguments and environment and exit with a status
chosen by the test; a stub launcher can wait for a signal, as the ranks of
`cotsdl train` do, and exit with 75 when it gets one.  Signals are sent to the batch
script as Slurm (--signal=B:USR1) and PBS would send them."""

import hashlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SLURM = "jobs/slurm/train.sbatch"
PBS = "jobs/pbs/train.pbs"
PAPER = "jobs/configs/paper-1b.toml"

LAUNCHER_STUB = r"""#!/bin/bash
# A launcher (srun, mpiexec): record the call and the environment; STUB_WAIT=1:
# wait for a signal (as the ranks do), then exit with STUB_SIGNAL_EXIT (75);
# STUB_STORM=N: N SIGTERMs to the batch script (its parent), around the exit.
name=$(basename "$0")
{ printf '%s' "$name"; printf ' %q' "$@"; echo; } >> "$STUB_DIR/calls"
env > "$STUB_DIR/$name.env"
if [ "${STUB_WAIT:-0}" = 1 ]; then
    got=
    on_signal() { echo "$name got $1" >> "$STUB_DIR/calls"; got=$1; }
    trap 'on_signal USR1' USR1
    trap 'on_signal TERM' TERM
    echo $$ > "$STUB_DIR/ready.tmp" && mv "$STUB_DIR/ready.tmp" "$STUB_DIR/ready"
    end=$((SECONDS + 15))
    while [ -z "$got" ] && [ "$SECONDS" -lt "$end" ]; do sleep 0.05; done
    [ -n "$got" ] || exit 99
    sleep "${STUB_LINGER:-0}"          # further signals are recorded after this
    exit "${STUB_SIGNAL_EXIT:-75}"
fi
if [ -n "${STUB_SESSION:-}" ] && [ -n "${COTSDL_SESSION_FILE:-}" ]; then   # as cotsdl train: "START STOP"
    echo "$STUB_SESSION" > "$COTSDL_SESSION_FILE"
fi
if [ -n "${STUB_STORM:-}" ]; then     # SIGTERMs to the batch script while this exits
    script=$PPID
    ( for ((i = 0; i < STUB_STORM; i++)); do
          kill -TERM "$script" 2>/dev/null || exit 0; sleep 0.00$((RANDOM % 3)); done ) &
    sleep 0.0$((RANDOM % 3 + 1))
fi
exit "${STUB_STATUS:-0}"
"""

COMMAND_STUB = r"""#!/bin/bash
# scontrol, sbatch, qrerun, qsub, qstat: record the call, print $STUB_DIR/NAME.out
# if there is one, exit with STUB_<NAME>_STATUS (0).
name=$(basename "$0")
{ printf '%s' "$name"; printf ' %q' "$@"; echo; } >> "$STUB_DIR/calls"
[ -f "$STUB_DIR/$name.out" ] && cat "$STUB_DIR/$name.out"
var="STUB_$(echo "$name" | tr '[:lower:]' '[:upper:]')_STATUS"
exit "${!var:-0}"
"""


@pytest.fixture
def stubs(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("srun", "mpiexec"):
        (bin_ / name).write_text(LAUNCHER_STUB)
    for name in ("scontrol", "sbatch", "qrerun", "qsub", "qstat"):
        (bin_ / name).write_text(COMMAND_STUB)
    for f in bin_.iterdir():
        f.chmod(0o755)
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("".join(f"gpu{n}\n" for n in (1, 2) for _ in range(4)))
    return tmp_path


def base_env(tmp, **extra):
    """A clean environment (nothing of the caller's scheduler or venv leaks in)."""
    env = {
        "PATH": f"{tmp}/bin:{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp),
        "USER": "tester",
        "TMPDIR": str(tmp),
        "LANG": "C",
        "STUB_DIR": str(tmp),
        "COTSDL_SKIP_ENV": "1",
        "COTSDL_POLL_SECONDS": "0.05",   # how often the script looks at the launcher
        "COTSDL_STATE_DIR": str(tmp / "state"),  # the requeue guard's counts: this test's own
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def slurm_env(tmp, **extra):
    return base_env(tmp, **{**dict(SLURM_SUBMIT_DIR=ROOT, SLURM_JOB_ID=4242, SLURM_JOB_NUM_NODES=2,
                                   SLURM_JOB_NODELIST="gpu[1-2]", SLURM_NTASKS=8, SLURM_NTASKS_PER_NODE=4,
                                   SLURM_CPUS_PER_TASK=4, SLURM_GPUS_ON_NODE=4), **extra})


def pbs_env(tmp, **extra):
    return base_env(tmp, PBS_O_WORKDIR=ROOT, PBS_JOBID="777.server",
                    PBS_NODEFILE=tmp / "nodefile", **extra)


def run_job(tmp, script, env, args=(), signals=()):
    """Run a batch script; `signals`: (delay, signal, target) sent after the stub
    launcher is ready; target "script" (the batch shell) or "launcher"."""
    proc = subprocess.Popen(["bash", str(ROOT / script), *map(str, args)], cwd=tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if signals:
        ready = tmp / "ready"
        deadline = time.monotonic() + 15
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the stub launcher never started"
            time.sleep(0.02)
        launcher = int(ready.read_text())
        for delay, sig, target in signals:
            time.sleep(delay)
            os.kill(proc.pid if target == "script" else launcher, sig)
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out


def calls(tmp):
    f = tmp / "calls"
    return [shlex.split(line) for line in f.read_text().splitlines()] if f.exists() else []


def names(tmp):
    return [c[0] for c in calls(tmp)]


def launcher_env(tmp, name):
    lines = (tmp / f"{name}.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def bash_lib(snippet, env=None):
    """Run `snippet` in bash with jobs/lib/batch.sh sourced; return its stdout lines."""
    r = subprocess.run(["bash", "-c", f"set -euo pipefail; . jobs/lib/batch.sh; {snippet}"],
                       cwd=ROOT, env=env or {"PATH": "/usr/bin:/bin"}, capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


# ---------------------------------------------------------------- all scripts


def job_scripts():
    jobs = ROOT / "jobs"
    return sorted(p for pattern in ("*.sh", "*.sbatch", "*.pbs") for p in jobs.rglob(pattern))


def test_every_job_script_parses():
    scripts = job_scripts()
    assert {"slurm/train.sbatch", "pbs/train.pbs", "bench-exchange.sh", "lib/batch.sh",
            "slurm/bench-exchange.sbatch", "pbs/bench-exchange.pbs"} <= {
        str(p.relative_to(ROOT / "jobs")) for p in scripts}
    for p in scripts:
        r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
        assert r.returncode == 0, f"{p}: {r.stderr}"
        if p.name != "env.sh" and p.parent.name != "lib":      # those two are sourced
            assert p.read_text().startswith("#!"), f"{p} has no #! line"


def test_batch_directives_come_before_any_command():
    """sbatch and qsub read #SBATCH/#PBS lines only up to the first command."""
    for script, prefix in ((SLURM, "#SBATCH"), ("jobs/slurm/bench-exchange.sbatch", "#SBATCH"),
                           ("jobs/slurm/study.sbatch", "#SBATCH"), (PBS, "#PBS"), ("jobs/pbs/bench-exchange.pbs", "#PBS")):
        lines = (ROOT / script).read_text().splitlines()[1:]
        first_cmd = next(i for i, l in enumerate(lines) if l.strip() and not l.startswith("#"))
        assert not any(l.startswith(prefix + " ") for l in lines[first_cmd:]), script
    sbatch = (ROOT / SLURM).read_text()
    for opt in ("--signal=B:USR1@300", "--requeue", "--open-mode=append", "--time=", "--output="):
        assert f"#SBATCH {opt}" in sbatch
    # GPUs only on the command line or as a site line: a CPU-only cluster refuses a GPU request
    assert not any(line.startswith("#SBATCH --gpus") for line in sbatch.splitlines())
    assert "##SBATCH --gpus-per-node=4" in sbatch.splitlines()
    pbs = (ROOT / PBS).read_text()
    for opt in ("-r y", "-j oe", "-l walltime=", "-l select="):
        assert f"#PBS {opt}" in pbs


@pytest.mark.parametrize("script, var", [(SLURM, "SLURM_SUBMIT_DIR"),
                                         ("jobs/slurm/bench-exchange.sbatch", "SLURM_SUBMIT_DIR"),
                                         ("jobs/slurm/study.sbatch", "SLURM_SUBMIT_DIR"),
                                         (PBS, "PBS_O_WORKDIR"),
                                         ("jobs/pbs/bench-exchange.pbs", "PBS_O_WORKDIR")])
def test_submitted_outside_the_repository_root(stubs, script, var):
    code, out = run_job(stubs, script, base_env(stubs, **{var: stubs}))
    assert code == 2, out
    assert "not the cotsdl repository root" in out
    assert calls(stubs) == []


# ---------------------------------------------------------------- Slurm


@pytest.mark.parametrize("status, requeued, code", [(75, True, 0), (0, False, 0),
                                                     (2, False, 2), (1, False, 1)])
def test_slurm_exit_status(stubs, status, requeued, code):
    rc, out = run_job(stubs, SLURM, slurm_env(stubs, STUB_STATUS=status))
    assert rc == code, out
    expected = [["srun", "--mpi=pmi2", "--kill-on-bad-exit=0", "--gpu-bind=none", "--cpus-per-task=4",
                 "bash", "jobs/lib/bind-gpu.sh", "python", "-m", "mpi4py", "-m", "cotsdl", "train", PAPER]]
    if requeued:
        expected.append(["scontrol", "requeue", "4242"])
    assert calls(stubs) == expected, out
    assert f"status {status}" in out


def test_starts_without_progress_stop_requeueing_after_a_count(stubs):
    """A start that checkpoints on the signal before any training step is requeued at most
    COTSDL_MAX_IDLE_STARTS times in a row (a signal lead longer than the time a start gets would loop
    for ever); a start that trains resets the count."""
    env = dict(STUB_STATUS=75, COTSDL_MAX_IDLE_STARTS=2)
    rc, out = run_job(stubs, SLURM, slurm_env(stubs, STUB_SESSION="40 40", **env))  # stopped where it began
    assert rc == 0 and ["scontrol", "requeue", "4242"] in calls(stubs), out
    assert "this start made no training step (1 of at most 2 in a row)" in out
    rc, out = run_job(stubs, SLURM, slurm_env(stubs, STUB_SESSION="40 55", **env))  # trained: count reset
    assert rc == 0 and "this start trained global steps 40..55" in out, out
    for n in (1, 2):  # no session file at all (never reached a step): idle too
        (stubs / "calls").unlink()
        rc, out = run_job(stubs, SLURM, slurm_env(stubs, **env))
    assert rc == 75, out
    assert "not requeued: 2 start(s) in a row stopped on the signal before a training step" in out
    assert ["scontrol", "requeue", "4242"] not in calls(stubs)


def test_a_slurm_job_without_gpus_leaves_the_backend_to_the_config(stubs):
    env = slurm_env(stubs)
    del env["SLURM_GPUS_ON_NODE"]
    rc, out = run_job(stubs, SLURM, env)
    assert rc == 0, out
    assert "COTSDL_BACKEND" not in launcher_env(stubs, "srun")
    assert "no GPUs in this job (sbatch --gpus-per-node=N asks for them)" in out
    assert "jobs/lib/bind-gpu.sh" not in calls(stubs)[0]  # no GPU to bind


@pytest.mark.parametrize("env, visible", [
    ({"SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, "7"),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "5", "CUDA_VISIBLE_DEVICES": "4,5"}, "5"),  # more ranks than GPUs: wrap
    ({"MV2_COMM_WORLD_LOCAL_RANK": "2", "STUB_GPUS": "3"}, "2"),                # nvidia-smi lists them
    ({"PMI_LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "0,1", "COTSDL_BIND_GPU": "0"}, "0,1"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, "0,1"),                                     # no local rank: unchanged
])
def test_bind_gpu_gives_each_rank_its_gpu_before_mpi_starts(tmp_path, env, visible):
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\nseq 0 $((${STUB_GPUS:-0} - 1))\n')
    smi.chmod(0o755)
    res = subprocess.run(["bash", str(ROOT / "jobs/lib/bind-gpu.sh"), "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"],
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin", **env}, capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == visible, res.stderr


def test_slurm_environment_of_the_ranks(stubs):
    rc, out = run_job(stubs, SLURM, slurm_env(stubs), args=[PAPER, "--set", "train.steps=5"])
    assert rc == 0, out
    assert calls(stubs)[0][-4:] == ["train", PAPER, "--set", "train.steps=5"]
    env = launcher_env(stubs, "srun")
    assert env["COTSDL_BACKEND"] == "cuda"
    assert env["MV2_USE_CUDA"] == "1"
    assert env["MV2_ENABLE_AFFINITY"] == "0"
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["COTSDL_KERNEL_CACHE"] == f"{stubs}/cotsdl-kernels-tester"
    assert env["CUPY_CACHE_DIR"] == env["COTSDL_KERNEL_CACHE"]
    assert "CUDA_VISIBLE_DEVICES" not in env
    # the header
    for text in ("Slurm job 4242", "nodes: 2 (gpu[1-2])", "ranks: 8", f"config: {PAPER}",
                 "MPI library: "):
        assert text in out


def test_slurm_usr1_is_forwarded_once_and_the_job_requeued(stubs):
    # --signal=B:USR1@300 signals the batch script; a second USR1 (say, a user's
    # scancel --batch --signal=USR1) must not reach the ranks while they checkpoint.
    rc, out = run_job(stubs, SLURM, slurm_env(stubs, STUB_WAIT=1, STUB_LINGER=0.8),
                      signals=[(0, signal.SIGUSR1, "script"), (0.3, signal.SIGUSR1, "script")])
    assert rc == 0, out
    assert names(stubs) == ["srun", "srun", "scontrol"], calls(stubs)
    assert calls(stubs)[1:] == [["srun", "got", "USR1"], ["scontrol", "requeue", "4242"]]
    assert "forwarded as SIGUSR1 to the launcher" in out
    assert "not forwarded again" in out


def test_slurm_real_status_after_an_interrupted_wait(stubs):
    # The launcher gets the USR1 but exits with 3 a moment later: the status is 3
    # (not the 138 of the wait the signal cut short), and nothing is requeued.
    rc, out = run_job(stubs, SLURM, slurm_env(stubs, STUB_WAIT=1, STUB_LINGER=0.5,
                                               STUB_SIGNAL_EXIT=3),
                      signals=[(0, signal.SIGUSR1, "script")])
    assert rc == 3, out
    assert names(stubs) == ["srun", "srun"]


def test_slurm_real_status_through_a_signal_storm(stubs):
    # Signals arriving while the launcher exits must not change its status (bash
    # loses a child's status after a `wait` cut short by a trap; the script polls).
    for _ in range(6):
        rc, out = run_job(stubs, SLURM, slurm_env(stubs, STUB_STATUS=5, STUB_STORM=40))
        assert rc == 5, out
        assert "the launcher exited with status 5" in out


def test_slurm_term_is_not_forwarded_and_not_requeued(stubs):
    # scancel / time limit / preemption: Slurm sends SIGTERM to the batch script and
    # to every task itself; the script must not add a second signal nor requeue.
    rc, out = run_job(stubs, SLURM, slurm_env(stubs, STUB_WAIT=1, STUB_LINGER=0.5),
                      signals=[(0, signal.SIGTERM, "script"), (0.1, signal.SIGTERM, "launcher")])
    assert rc == 75, out
    assert calls(stubs)[1:] == [["srun", "got", "TERM"]]
    assert "not requeued" in out


def test_slurm_term_forwarded_on_request(stubs):
    rc, out = run_job(stubs, SLURM, slurm_env(stubs, STUB_WAIT=1, COTSDL_FORWARD_TERM=1),
                      signals=[(0, signal.SIGTERM, "script")])
    assert rc == 75, out
    assert calls(stubs)[1:] == [["srun", "got", "USR1"]]


def test_slurm_requeue_failure_resubmits(stubs):
    env = slurm_env(stubs, STUB_STATUS=75, STUB_SCONTROL_STATUS=1)
    rc, out = run_job(stubs, SLURM, env, args=["jobs/configs/demo.toml", "--set", "a=1"])
    assert rc == 0, out
    assert calls(stubs)[1:] == [["scontrol", "requeue", "4242"],
                                ["sbatch", SLURM, "jobs/configs/demo.toml", "--set", "a=1"]]
    (stubs / "calls").unlink()
    rc, out = run_job(stubs, SLURM, dict(env, COTSDL_RESUBMIT="0"))
    assert rc == 75, out
    assert names(stubs) == ["srun", "scontrol"]
    assert "could not requeue" in out


def test_slurm_missing_config(stubs):
    rc, out = run_job(stubs, SLURM, slurm_env(stubs), args=["no/such.toml"])
    assert rc == 2, out
    assert calls(stubs) == []


def test_slurm_warns_about_the_mpich_wheel(stubs):
    venv = Path(sys.executable).parent.parent      # the MPICH wheel lives in the test venv
    rc, out = run_job(stubs, SLURM, slurm_env(stubs, VIRTUAL_ENV=venv))
    assert rc == 0, out
    if f"MPI library: {venv}/" in out:
        assert "WARNING: that is the MPICH wheel" in out
    else:
        pytest.skip("mpi4py here does not use a libmpi inside the virtual environment")


def fake_venv(tmp, extras):
    """A venv that jobs/env.sh accepts as current: bin/python, bin/activate and the
    stamp env.sh writes after installing .[extras] (so it installs nothing)."""
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    (venv / "bin" / "activate").write_text(
        f'export VIRTUAL_ENV="{venv}"\nexport PATH="$VIRTUAL_ENV/bin:$PATH"\n')
    digest = hashlib.sha256((ROOT / "setup.cfg").read_bytes()
                            + (ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (venv / ".cotsdl-installed").write_text(f"{digest} {extras}\n")
    return venv


@pytest.mark.parametrize("module", [True, False])
def test_slurm_environment_setup(stubs, module):
    venv = fake_venv(stubs, "cuda12")
    env = slurm_env(stubs, COTSDL_VENV=venv)
    del env["COTSDL_SKIP_ENV"]
    env["PATH"] = f"{stubs}/bin:/usr/bin:/bin"
    if module:   # Lmod/environment-modules export `module` as a bash function
        env["BASH_FUNC_module%%"] = '() {  echo "module $*" >> "$STUB_DIR/calls"; return 1; }'
    rc, out = run_job(stubs, SLURM, env)
    assert rc == 0, out
    assert "installing" not in out              # the stamp matched: COTSDL_EXTRAS=cuda12
    assert launcher_env(stubs, "srun")["VIRTUAL_ENV"] == str(venv)
    if module:
        assert calls(stubs)[0] == ["module", "load", "mvapich2"]
        assert "'module load mvapich2' failed" in out
    else:
        assert names(stubs) == ["srun"]
        assert "no 'module' command" in out


def test_a_job_installs_nothing_and_says_how_to_make_a_missing_environment(stubs):
    """Compute nodes often have no network: the job only activates (a stale environment is a warning,
    a missing one an error naming the login-node command), never pip installs."""
    env = slurm_env(stubs, COTSDL_VENV=stubs / "nowhere")
    del env["COTSDL_SKIP_ENV"]
    rc, out = run_job(stubs, SLURM, env)
    assert rc == 2, out
    assert "no environment at" in out and "COTSDL_EXTRAS=cuda12 . jobs/env.sh" in out
    assert "installing" not in out and "creating" not in out and calls(stubs) == []
    venv = fake_venv(stubs, "cuda12")
    (venv / ".cotsdl-installed").write_text("0000000000000000 cuda12\n")  # made for another setup.cfg
    env["COTSDL_VENV"] = str(venv)
    rc, out = run_job(stubs, SLURM, env)
    assert rc == 0, out
    assert "warning: setup.cfg changed since" in out and "installing" not in out
    assert launcher_env(stubs, "srun")["VIRTUAL_ENV"] == str(venv)


# ---------------------------------------------------------------- PBS


@pytest.mark.parametrize("status, rerun, code", [(75, True, 0), (0, False, 0), (2, False, 2)])
def test_pbs_exit_status(stubs, status, rerun, code):
    rc, out = run_job(stubs, PBS, pbs_env(stubs, STUB_STATUS=status, STUB_QSTAT_STATUS=1))
    assert rc == code, out
    assert calls(stubs)[0] == ["qstat", "-f", "777.server"]
    assert calls(stubs)[1] == ["mpiexec", "-n", "8", "bash", "jobs/lib/bind-gpu.sh", "python", "-m", "mpi4py",
                               "-m", "cotsdl", "train", PAPER]
    assert calls(stubs)[2:] == ([["qrerun", "777.server"]] if rerun else [])
    assert "walltime unknown" in out
    env = launcher_env(stubs, "mpiexec")
    assert env["COTSDL_BACKEND"] == "cuda" and env["MV2_USE_CUDA"] == "1"
    assert env["MV2_ENABLE_AFFINITY"] == "0" and env["PYTHONUNBUFFERED"] == "1"
    assert env["COTSDL_KERNEL_CACHE"] == env["CUPY_CACHE_DIR"] == f"{stubs}/cotsdl-kernels-tester"
    assert env["OMP_NUM_THREADS"] == str(max(1, os.cpu_count() // 4))
    assert "nodes: 2 (gpu1,gpu2); ranks: 8 (4 per node)" in out


def test_pbs_config_from_qsub_v(stubs):
    rc, out = run_job(stubs, PBS, pbs_env(stubs, CONFIG="jobs/configs/demo.toml",
                                          STUB_QSTAT_STATUS=1))
    assert rc == 0, out
    assert calls(stubs)[1][-2:] == ["train", "jobs/configs/demo.toml"]


def test_pbs_passes_train_options_from_qsub_v(stubs):
    """TRAIN_ARGS (qsub -v, split at spaces) reach cotsdl train after the config, and the log says them."""
    rc, out = run_job(stubs, PBS, pbs_env(stubs, CONFIG="jobs/configs/demo.toml", STUB_QSTAT_STATUS=1,
                                          TRAIN_ARGS="--set run.folder=runs/x --set train.steps=[10,10]"))
    assert rc == 0, out
    assert calls(stubs)[1][-6:] == ["train", "jobs/configs/demo.toml", "--set", "run.folder=runs/x", "--set",
                                    "train.steps=[10,10]"]
    assert "config: jobs/configs/demo.toml --set run.folder=runs/x --set train.steps=[10,10]" in out


def test_pbs_usr1_is_forwarded_and_the_job_rerun(stubs):
    rc, out = run_job(stubs, PBS, pbs_env(stubs, STUB_WAIT=1, STUB_QSTAT_STATUS=1),
                      signals=[(0, signal.SIGUSR1, "script")])
    assert rc == 0, out
    assert calls(stubs)[2:] == [["mpiexec", "got", "USR1"], ["qrerun", "777.server"]]


def test_pbs_lead_time_timer(stubs):
    # walltime 5 s, lead 3 s: the script signals the launcher itself about 2 s in.
    (stubs / "qstat.out").write_text(
        "Job Id: 777.server\n    Job_Name = cotsdl-train\n    Resource_List.ncpus = 64\n"
        "    Resource_List.walltime = 00:00:05\n    resources_used.walltime = 00:00:00\n")
    start = time.monotonic()
    rc, out = run_job(stubs, PBS, pbs_env(stubs, STUB_WAIT=1, COTSDL_SIGNAL_BEFORE=3),
                      signals=[(0, 0, "script")])
    assert rc == 0, out
    assert 0.5 < time.monotonic() - start < 8
    assert "walltime 5 s: checkpoint request (SIGUSR1) in" in out
    assert "lead-time timer: 3 s before the walltime" in out
    assert calls(stubs)[2:] == [["mpiexec", "got", "USR1"], ["qrerun", "777.server"]]


def test_pbs_no_timer_when_the_lead_covers_the_walltime(stubs):
    (stubs / "qstat.out").write_text("    Resource_List.walltime = 00:04:00\n")
    rc, out = run_job(stubs, PBS, pbs_env(stubs, COTSDL_SIGNAL_BEFORE=300))
    assert rc == 0, out
    assert "walltime 240 s, COTSDL_SIGNAL_BEFORE=300: no lead-time timer" in out


def test_pbs_qrerun_failure_resubmits(stubs):
    env = pbs_env(stubs, STUB_STATUS=75, STUB_QRERUN_STATUS=1, STUB_QSTAT_STATUS=1,
                  COTSDL_SIGNAL_BEFORE=600)
    rc, out = run_job(stubs, PBS, env)
    assert rc == 0, out
    assert calls(stubs)[2:] == [["qrerun", "777.server"],
                                ["qsub", "-v", f"CONFIG={PAPER},COTSDL_SIGNAL_BEFORE=600", PBS]]


@pytest.mark.parametrize("walltime, rerun", [("24:00:00", False), (None, True)])
def test_pbs_term(stubs, walltime, rerun):
    # SIGTERM to every process: qdel long before a known walltime -> no rerun; with
    # the walltime unknown it may be the time limit -> rerun.
    if walltime:
        (stubs / "qstat.out").write_text(f"    Resource_List.walltime = {walltime}\n")
    env = pbs_env(stubs, STUB_WAIT=1, **({} if walltime else {"STUB_QSTAT_STATUS": 1}))
    rc, out = run_job(stubs, PBS, env, signals=[(0, signal.SIGTERM, "script"),
                                                (0.1, signal.SIGTERM, "launcher")])
    assert calls(stubs)[2] == ["mpiexec", "got", "TERM"]
    assert calls(stubs)[3:] == ([["qrerun", "777.server"]] if rerun else [])
    assert rc == (0 if rerun else 75), out


# ---------------------------------------------------------------- jobs/lib/batch.sh


def test_duration_seconds():
    cases = {"24:00:00": 86400, "1:02:03:04": 93784, "45:00": 2700, "3600": 3600,
             "01:00:00.5": 3600, " 08:09:10 ": 29350, "00:00:05": 5}
    got = bash_lib(" ".join(f'cotsdl_duration_seconds "{k}";' for k in cases))
    assert got == [str(v) for v in cases.values()]
    for bad in ("", "abc", "1:2:3:4:5", "-5", "1h"):
        assert bash_lib(f'cotsdl_duration_seconds "{bad}" || echo bad') == ["bad"]


def test_pbs_walltime(stubs):
    (stubs / "qstat.out").write_text(
        "Job Id: 9.srv\n    Resource_List.mem = 4gb\n    Resource_List.walltime = 12:30:00\n"
        "    resources_used.walltime = 00:10:00\n")
    env = {"PATH": f"{stubs}/bin:/usr/bin:/bin", "STUB_DIR": str(stubs), "PBS_JOBID": "9.srv"}
    assert bash_lib("cotsdl_pbs_walltime", env) == ["45000"]
    assert calls(stubs) == [["qstat", "-f", "9.srv"]]
    assert bash_lib("cotsdl_pbs_walltime", dict(env, PBS_WALLTIME="600")) == ["600"]  # Torque
    assert bash_lib("cotsdl_pbs_walltime || echo unknown",
                    dict(env, STUB_QSTAT_STATUS="1")) == ["unknown"]
    (stubs / "qstat.out").write_text("Job Id: 9.srv\n    Resource_List.ncpus = 4\n")
    assert bash_lib("cotsdl_pbs_walltime || echo unknown", env) == ["unknown"]
    assert bash_lib("cotsdl_pbs_walltime || echo unknown", {"PATH": "/usr/bin:/bin"}) == ["unknown"]


def test_signal_delay():
    cases = [("86400 300 20", "86080"), ("600 300 400", "0"), ("300 300 0", "none"),
             ("200 300 0", "none"), ("86400 0 0", "none")]
    got = bash_lib(" ".join(f"cotsdl_signal_delay {a} || echo none;" for a, _ in cases))
    assert got == [want for _, want in cases]


WAIT_RACE = r"""
source "$1/jobs/lib/batch.sh"
trap ':' TERM
wrong=0
for i in $(seq 1 60); do
    ( exit 5 ) &
    child=$!
    while kill -0 "$child" 2>/dev/null; do sleep 0.001; done    # exited, as the poll loop sees it
    ( for j in $(seq 1 30); do kill -TERM $$ 2>/dev/null; done ) &  # signals while the status is asked
    storm=$!
    _cotsdl_wait_status "$child"
    wait "$storm" 2>/dev/null
    [ "$COTSDL_STATUS" = 5 ] || wrong=$((wrong + 1))
done
echo "wrong $wrong"
"""


def test_the_launchers_status_is_not_lost_to_a_signal_during_wait(tmp_path):
    """bash returns 143 from a `wait` that a trapped SIGTERM cuts short, even for a child that has
    already exited, before it collects the status (a plain `wait` here got 143 in 263 of 300
    tries); _cotsdl_wait_status asks again and gets the launcher's real status every time."""
    (tmp_path / "race.sh").write_text(WAIT_RACE)
    run = subprocess.run(["bash", str(tmp_path / "race.sh"), str(ROOT)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["wrong", "0"], run.stdout + run.stderr
