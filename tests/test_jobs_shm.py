"""What a Slurm start does about the start it replaces (jobs/lib/batch.sh, jobs/slurm/train.sbatch): the
shared memory a killed start's MPI left in /dev/shm, and an allocation smaller than the submission's
(a job requeued after a node died).  The stubs and runners are tests/test_jobs.py's."""
import os
import subprocess
import sys

import pytest

from test_jobs import ROOT, SLURM, bash_lib, calls, run_job, slurm_env, stubs  # noqa: F401 - stubs: a fixture


def fnv1a(text):
    """MPICH's HASH_FNV (32-bit FNV-1a) of a PMI name: the <H> of its /dev/shm/mpich_shm_<H>_<node>."""
    h = 2166136261
    for b in text.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return f"{h:x}"


SHM_HOLDER = r"""
import mmap, os, sys
held = open(sys.argv[1], "r+b")                  # open (as a rank between shm_open and mmap)
with open(sys.argv[2], "r+b") as f:              # mapped, its descriptor closed (as a running rank)
    mapped = mmap.mmap(f.fileno(), 0)
print("ready", flush=True)
sys.stdin.read()
"""


def test_clean_shm_removes_this_jobs_stale_segments_and_nothing_else(tmp_path):
    """A killed start of Slurm job 4242 left MPICH's segments of its worlds (steps, PMI2 and PMIx
    names): the ones no process has open or mapped are removed and named in the log; a live
    process's (open, or mapped with its descriptor closed) and another job's stay."""
    assert fnv1a("1.0") == "eb421bf2"  # the name real MPICH 5 gave step 0 of Slurm job 1 here
    assert bash_lib("_cotsdl_fnv1a 1.0; _cotsdl_fnv1a 4242.0; _cotsdl_fnv1a slurm.pmix.4242.3") == [
        "eb421bf2", fnv1a("4242.0"), fnv1a("slurm.pmix.4242.3")]
    shm = tmp_path / "shm"
    shm.mkdir()
    h0, h1, pmix, other = (fnv1a(w) for w in ("4242.0", "4242.1", "slurm.pmix.4242.0", "4243.0"))
    stale = [f"mpich_shm_{h0}_0", f"mpich_vci_{h0}_0", f"mpich_shm_{h1}_0", f"mpich_shm_{pmix}_0"]
    live = [f"mpich_shm_{h0}_1", f"mpich_vci_{h1}_1"]
    others = [f"mpich_shm_{other}_0", "unrelated"]
    for name in stale + live + others:
        (shm / name).write_bytes(b"\0" * 4096)
    holder = subprocess.Popen([sys.executable, "-c", SHM_HOLDER, str(shm / live[0]), str(shm / live[1])],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = subprocess.run(["bash", "-c", "set -euo pipefail; . jobs/lib/batch.sh; "
                            "cotsdl_clean_shm $(cotsdl_slurm_worlds)"], cwd=ROOT, capture_output=True, text=True, timeout=30,
                           env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "4242", "COTSDL_SHM_DIR": str(shm)})
    finally:
        holder.communicate("", timeout=10)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in shm.iterdir()) == sorted(live + others), r.stdout
    assert "removed stale MPI shared memory of this job" in r.stdout
    assert all(name in r.stdout for name in stale), r.stdout
    assert f"MPI shared memory of this job left in place on {os.uname().nodename}: " in r.stdout
    assert all(f"{name} (in use by a live process)" in r.stdout for name in live), r.stdout
    # nothing of this job's left: nothing said
    r = subprocess.run(["bash", "-c", ". jobs/lib/batch.sh; cotsdl_clean_shm 4244.0"], cwd=ROOT, text=True,
                       capture_output=True, env={"PATH": "/usr/bin:/bin", "COTSDL_SHM_DIR": str(shm)})
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr


def test_a_slurm_start_removes_its_jobs_stale_shared_memory_before_the_launch(stubs):
    shm = stubs / "shm"
    shm.mkdir()
    (shm / f"mpich_shm_{fnv1a('4242.0')}_0").write_bytes(b"\0")
    (shm / f"mpich_shm_{fnv1a('4241.0')}_0").write_bytes(b"\0")   # another job's
    rc, out = run_job(stubs, SLURM, slurm_env(stubs, COTSDL_SHM_DIR=shm))
    assert rc == 0, out
    assert [p.name for p in shm.iterdir()] == [f"mpich_shm_{fnv1a('4241.0')}_0"]
    assert f"(left by a killed start; no process uses it): mpich_shm_{fnv1a('4242.0')}_0" in out
    assert out.index("removed stale MPI shared memory") < out.index("launch: srun")


def test_count_tasks():
    assert bash_lib('cotsdl_count_tasks "2(x3),1"; cotsdl_count_tasks 4; cotsdl_count_tasks "1(x2)"') == ["7", "4", "2"]
    for bad in ("", "x", "2(x)", "1,,2"):
        assert bash_lib(f'cotsdl_count_tasks "{bad}" || echo bad') == ["bad"]


@pytest.mark.parametrize("tasks, launched", [("4(x2)", None), ("4", 4), ("1", 1)])
def test_a_slurm_start_with_fewer_tasks_than_submitted_launches_what_it_holds(stubs, tasks, launched):
    """A job requeued after a node died and let go on with the nodes left keeps the SLURM_NTASKS of
    its submission (8 here); srun would ask for them all and fail: the start launches the tasks of
    its allocation (SLURM_TASKS_PER_NODE), and a start that holds them all launches as always."""
    nodes = 2 if launched is None else 1
    rc, out = run_job(stubs, SLURM, slurm_env(stubs, SLURM_TASKS_PER_NODE=tasks, SLURM_JOB_NUM_NODES=nodes))
    assert rc == 0, out
    srun = calls(stubs)[0]
    assert srun[:5] == ["srun", "--mpi=pmi2", "--kill-on-bad-exit=0", "--gpu-bind=none", "--cpus-per-task=4"]
    if launched is None:
        assert srun[5] == "bash" and "launching" not in out
    else:
        assert srun[5] == f"--ntasks={launched}", srun
        assert (f"this start holds {launched} task(s) on 1 node(s) ({tasks}), the job was submitted for 8: "
                f"launching {launched} rank(s)") in out
