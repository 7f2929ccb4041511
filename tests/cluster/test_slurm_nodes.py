"""jobs/slurm/train.sbatch across two nodes of a real Slurm: the `nodes` partition of
tests/cluster/slurm-up.sh, whose nodes cotsdl-n3 and cotsdl-n4 are network namespaces on a bridge
(tests/cluster/nodes-up.sh), one core and one slurmd each.

- A job on both nodes: its ranks run one per node, the halo traffic crosses the nodes' links (the
  veth byte counters), and signal -> checkpoint -> requeue -> resume ends bitwise equal to an
  uninterrupted run.
- A node that dies (link down, every process in it killed, its slurmd too): Slurm sets it DOWN and
  requeues the job; let go on with the node left, the job resumes on one rank from the newest
  complete checkpoint of the two, which a reference run bears out bit for bit, after the job script
  removed the stale MPICH shared memory of the killed start.  cotsdl-n4 is brought back afterwards,
  whatever happened.
- Two ranks on one node killed with SIGKILL: the start after the requeue finds their shared memory
  under the same name, on which MPI start-up fails or hangs; the job script removes it and the run
  resumes.  This one runs on the `debug` partition (this machine) and needs no namespaces.

The jobs carry MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp: the MPICH wheel's default network module
(UCX) takes the namespaces for one host and moves every byte through shared memory.  Run by
tests/run.sh after slurm-up.sh; skipped where the `nodes` partition is not up (no namespaces here,
or no Slurm of this project).  cotsdl-n1 and cotsdl-n2 belong to the plain-mpiexec tests: never
touched here.  About 2.5 minutes here with other tests keeping the load at ~5 on the two cores; a
node's death is detected in 14-16 s (SlurmdTimeout=5, MessageTimeout=5).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cotsdl.io.dataset import write_dataset
from testkit import SLURM_CONF, SLURM_MARKER, final_weights, slurm_job, tiny_config, wait_for

ROOT = Path(__file__).resolve().parents[2]
CONF, MARKER = SLURM_CONF, SLURM_MARKER
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
NODES = {"cotsdl-n3": 3, "cotsdl-n4": 4}
#: Steps per stage (two stages).  A job must still train when its signal (sent at its first
#: checkpoint, step 50) reaches the ranks, up to ~2 s later, or when its node dies: 2000 steps take 4 s
#: at the fastest (2 ms a step: 2 ranks on one node, no network), and took 25-70 s across the nodes
#: here with the load of other tests at 4-13 on the two cores (the signal came at step 83).
STEPS = 1000


def sh(*cmd, check=True):
    return subprocess.run(cmd, capture_output=True, text=True, check=check).stdout


def _cluster_problem():
    if not shutil.which("sinfo") or not CONF.exists() or MARKER not in CONF.read_text():
        return "no Slurm brought up by tests/cluster/slurm-up.sh here"
    return None


def _nodes_problem():
    if _cluster_problem():
        return _cluster_problem()
    listed = sh("sinfo", "-h", "-N", "-p", "nodes", "-o", "%N %T", check=False)
    states = dict(line.split() for line in listed.splitlines())
    if not states:
        return "no 'nodes' partition: slurm-up.sh could not make simulated nodes here (it said why)"
    if any(states.get(n) not in ("idle", "mixed") for n in NODES):
        return f"the nodes of the 'nodes' partition are not idle: {states}"
    return None


pytestmark = [pytest.mark.skipif(_cluster_problem() is not None, reason=str(_cluster_problem())),
              pytest.mark.timeout(200)]
needs_nodes = pytest.mark.skipif(_nodes_problem() is not None, reason=str(_nodes_problem()))


job = slurm_job


def wait(cond, what, timeout=150):
    return wait_for(cond, what, timeout, every=0.25)


def finished(job_id):
    state = job(job_id).get("JobState")
    return state if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") else None


def link_bytes(node):
    """Bytes through the root end of a node's veth pair (both ways): all its traffic to other nodes."""
    base = Path(f"/sys/class/net/cotsdl-v{NODES[node]}/statistics")
    return int((base / "rx_bytes").read_text()) + int((base / "tx_bytes").read_text())


def complete_checkpoints(run):
    return sorted(p.name for p in (run / "checkpoints").glob("ckpt-*") if (p / "index.json").exists())


def cmdline(pid, what="cmdline"):
    try:
        return Path(f"/proc/{pid}/{what}").read_bytes().decode(errors="replace")
    except OSError:  # gone
        return ""


def fnv1a(text):
    """MPICH's hash of a world's PMI name: its /dev/shm/mpich_shm_<hash>_<node index>."""
    h = 2166136261
    for b in text.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return f"{h:x}"


def assert_same_weights(a_run, b_run, what):
    (na, a), (nb, b) = final_weights(a_run), final_weights(b_run)
    assert na == nb and a.keys() == b.keys() and a, (na, nb, sorted(a), sorted(b))
    for k in a:
        assert np.array_equal(a[k], b[k]), f"{k} of {what} differs"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A dataset, a config maker and submit (once for the module); jobs a failed test left are cancelled."""
    tmp = tmp_path_factory.mktemp("nodes")
    data = tmp / "tiny.h5"
    write_dataset(data, np.random.default_rng(0).integers(0, 256, (40, 12, 12), dtype=np.uint8))

    def config(name, steps=STEPS):
        path = tmp / f"{name}.toml"
        path.write_text(tiny_config(data, tmp / name, steps, 50, size=12, c0=3, c1=2, keep=100)
                        .replace("log_every = 1\n", "log_every = 500\n"))
        return path

    def submit(cfg, *opts, partition="nodes"):
        """sbatch jobs/slurm/train.sbatch CFG on a partition as a CPU-only cluster user submits it (the
        environment made once: the test run's .venv); returns (job id, output file)."""
        out = tmp / "job-%j.out"
        env = {**os.environ, "COTSDL_BACKEND": "numpy", "COTSDL_MODULES": "", "COTSDL_VENV": sys.prefix,
               "COTSDL_STATE_DIR": str(tmp / "state"),
               # MPICH's TCP network module: its default, UCX, would move every byte through shared memory
               "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
        env.pop("COTSDL_SKIP_ENV", None)
        res = subprocess.run(["sbatch", "--parsable", f"--partition={partition}", "--cpus-per-task=1", f"--output={out}",
                              *opts, "jobs/slurm/train.sbatch", str(cfg)],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        job_id = res.stdout.strip().split(";")[0]
        jobs.append(job_id)
        return job_id, Path(str(out).replace("%j", job_id))

    jobs = []
    yield tmp, config, submit
    for job_id in jobs:
        if not finished(job_id):
            subprocess.run(["scancel", job_id], check=False)


def train(cfg, ranks, folder, cores=None):
    """cotsdl train of CFG with its run folder moved to ``folder``, under mpiexec on this machine (MPICH's
    default transport), in the background; ``cores``: pinned to those (taskset -c)."""
    moved = folder.with_suffix(".toml")
    moved.write_text(cfg.read_text().replace(str(cfg.with_suffix("")), str(folder)))
    pin = ["taskset", "-c", cores] if cores else []
    return subprocess.Popen([*pin, MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "cotsdl", "train",
                             str(moved)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "MPIEXEC_TIMEOUT": "170"})


def expected_halo_bytes(cfg, steps):
    """Halo bytes one rank sends per step on grid 2x1 (cotsdl plan: the busiest rank), times the steps."""
    out = cfg.with_suffix(".plan.json")
    subprocess.run([sys.executable, "-m", "cotsdl", "plan", str(cfg), "--ranks", "2", "--grid", "2", "1",
                    "--ranks-per-node", "1", "--json", str(out)], check=True, capture_output=True, timeout=60)
    return sum(p["halo_bytes_per_rank_max"] * steps for p in json.loads(out.read_text())["predictions"])


@needs_nodes
def test_two_nodes_signal_checkpoint_requeue_resume_bitwise(setup):
    tmp, config, submit = setup
    cfg = config("two")
    ref = train(cfg, 2, tmp / "ref-two")  # uninterrupted, beside the job
    before = {n: link_bytes(n) for n in NODES}
    job_id, out = submit(cfg, "--nodes=2", "--ntasks-per-node=1")
    wait(lambda: (tmp / "two" / "checkpoints" / "ckpt-000000050" / "index.json").exists(), "a checkpoint")
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)  # as Slurm's --signal=B:USR1@T
    wait(lambda: int(job(job_id).get("Restarts", 0)) >= 1, f"job {job_id} to requeue itself")
    assert wait(lambda: finished(job_id), f"job {job_id} to end") == "COMPLETED", out.read_text()[-3000:]
    text = out.read_text()
    # both starts ran one rank on each node, the batch script on the first
    assert text.count("nodes: 2 (cotsdl-n[3-4]); ranks: 2 (1 per node") == 2, text[-3000:]
    assert "(start 2, requeued 1 times) on cotsdl-n3" in text
    assert text.count("on 2 node(s), 1 rank(s) per node: cotsdl-n3 (rank 0), cotsdl-n4 (rank 1)") == 2, text[-3000:]
    stopped = int(text.split("stopped by SIGUSR1 at global step ")[1].split(";")[0])
    assert 0 < stopped < 2 * STEPS
    assert f"resumed from {tmp / 'two' / 'checkpoints' / f'ckpt-{stopped:09d}'}" in text
    assert "status 0: the run is complete" in text
    # the halos crossed the links: at least what the ranks send (payload alone), more than 1 MB
    halo = expected_halo_bytes(cfg, STEPS)
    moved = {n: link_bytes(n) - before[n] for n in NODES}
    print(f"\n[nodes] bytes through the links: {moved}; the halos one rank sends: {halo:.0f}")
    for n in NODES:
        assert moved[n] >= max(halo, 1e6), f"{n}: {moved[n]} bytes through its link, the halos alone are {halo:.0f}"
    assert ref.wait(timeout=170) == 0, ref.stderr.read()
    assert_same_weights(tmp / "ref-two", tmp / "two", "the run interrupted and resumed across two nodes")


def kill_node(name):
    """The node dies: its link goes down first (nothing it sends afterwards leaves, as from a node that
    lost power), then every process in its network namespace is killed, its slurmd among them."""
    i = NODES[name]
    subprocess.run(["ip", "link", "set", f"cotsdl-v{i}", "down"], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "eth0", "down"], check=True)
    pids = sh("ip", "netns", "pids", name).split()
    assert any(Path(f"/proc/{p}/comm").read_text().strip() == "slurmd" for p in pids if Path(f"/proc/{p}").exists())
    for p in pids:
        try:
            os.kill(int(p), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def node_to_kill():
    """cotsdl-n4, brought back after the test however it ends: slurm-up.sh brings its link up, starts
    its slurmd in its namespace again and resumes it (scontrol update NodeName=... State=RESUME), then
    waits until every node is idle; its cluster is otherwise left as it is."""
    yield "cotsdl-n4"
    res = subprocess.run(["bash", str(ROOT / "tests/cluster/slurm-up.sh")], capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sh("sinfo", "-h", "-n", "cotsdl-n4", "-o", "%T").strip() == "idle"


@needs_nodes
def test_a_node_dies_the_job_is_requeued_and_resumes_on_the_node_left(setup, node_to_kill):
    tmp, config, submit = setup
    cfg = config("death")
    ref = train(cfg, 2, tmp / "ref-death")  # uninterrupted on 2 ranks: its checkpoints are the job's
    # --nodes=1-2: may run on one node.  --ntasks=2 makes Slurm start it on both (with
    # --ntasks-per-node=1 alone sbatch asks for 1 task, and Slurm gives a job no more nodes than tasks).
    job_id, out = submit(cfg, "--nodes=1-2", "--ntasks=2", "--ntasks-per-node=1", "--requeue")
    run = tmp / "death"
    wait(lambda: (run / "checkpoints" / "ckpt-000000100" / "index.json").exists(), "a checkpoint")
    assert job(job_id)["NodeList"] == "cotsdl-n[3-4]"
    killed = time.monotonic()
    kill_node(node_to_kill)
    newest_at_kill = complete_checkpoints(run)[-1]
    wait(lambda: sh("sinfo", "-h", "-n", node_to_kill, "-o", "%T").startswith("down"), f"{node_to_kill} DOWN", 90)
    down = time.monotonic() - killed
    wait(lambda: int(job(job_id).get("Restarts", 0)) >= 1 and job(job_id).get("JobState") == "PENDING",
         f"Slurm to requeue job {job_id}", 60)
    requeued = time.monotonic() - killed
    print(f"\n[nodes] {node_to_kill} killed: DOWN after {down:.1f} s, job {job_id} requeued after {requeued:.1f} s")
    # Slurm keeps a requeued job's size: this one now waits for a second node.  An operator lets it go
    # on with the node left (a site with a spare node would not need to); it starts once Slurm's
    # requeue delay is over (the credentials' lifetime: 10 s here, 2 minutes by default).
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "NumTasks=1", "NumCPUs=1"], check=True)
    wait(lambda: job(job_id).get("JobState") not in (None, "PENDING"), f"job {job_id} to start again", 60)
    newest = complete_checkpoints(run)[-1]  # the killed start made none after this one
    assert newest >= newest_at_kill
    assert wait(lambda: finished(job_id), f"job {job_id} to end") == "COMPLETED", out.read_text()[-3000:]
    first, second = out.read_text().split("(start 2, requeued 1 times)")
    assert "nodes: 2 (cotsdl-n[3-4])" in first, first[-3000:]
    assert "status 0: the run is complete" not in first and "scontrol requeue" not in first  # Slurm requeued it
    assert second.startswith(" on cotsdl-n3") and "nodes: 1 (cotsdl-n3)" in second, second[:3000]
    assert "this start holds 1 task(s) on 1 node(s) (1), the job was submitted for 2: launching 1 rank(s)" in second
    # The killed start's shared memory was there and is gone (the same job and step ids, so the same
    # name; one rank alone would have started on it, two fail: the next test).  Node 0's file is the
    # one named: on these simulated nodes /dev/shm is shared, and node 1's is removed too.
    assert "removed stale MPI shared memory of this job on cotsdl-n3" in second, second[:3000]
    assert f"mpich_shm_{fnv1a(f'{job_id}.0')}_0" in second.split("removed stale MPI shared memory")[1].split("\n")[0]
    assert "warning: checkpoint" not in second  # nothing newer was damaged: nothing was skipped
    assert f"resumed from {run / 'checkpoints' / newest}" in second, second[-3000:]
    assert "cotsdl train" in second and " 1 rank(s)," in second
    assert "status 0: the run is complete" in second
    # The checkpoint resumed from is intact: it equals the uninterrupted run's at that step.  The
    # reference for the rest: that checkpoint of the reference resumed on one rank, as the job did.
    assert ref.wait(timeout=170) == 0, ref.stderr.read()
    for name, src in (("at-kill-job", run), ("ref-death-1", tmp / "ref-death")):
        (tmp / name / "checkpoints").mkdir(parents=True)
        shutil.copytree(src / "checkpoints" / newest, tmp / name / "checkpoints" / newest)
    assert_same_weights(tmp / "ref-death-1", tmp / "at-kill-job", f"the job's {newest}")
    shutil.copy(tmp / "ref-death" / "config.toml", tmp / "ref-death-1")  # what makes it a run folder
    # On the job's one core: the numpy backend runs a thread per core the rank has
    # (cotsdl/ops/cpu/parallel.py), and another split of the sites changes the last bits (8e-7 here
    # when this reference had both cores).
    resumed = train(cfg, 1, tmp / "ref-death-1", cores=Path("/run/cotsdl-nodes/cotsdl-n3.cpus").read_text().strip())
    assert resumed.wait(timeout=170) == 0, resumed.stderr.read()
    assert_same_weights(tmp / "ref-death-1", run, "the run resumed on one rank after the node died")


def test_a_killed_start_leaves_shared_memory_that_the_next_start_removes(setup):
    """Two ranks on one node (the `debug` partition: this machine; no namespaces needed), killed with
    SIGKILL mid-run as the OOM killer would: the world's MPICH segment stays in /dev/shm.  The script
    does not requeue a run killed without a checkpoint; an operator does (scontrol requeue).  That
    start has the same job and step ids, so the same segment name: without the cleanup its two ranks
    attach to the dead world's segment and MPI start-up fails or hangs (measured here: this test with
    COTSDL_SHM_DIR=/nonexistent hung in MPI_Init until cancelled; a plain srun of mpi4py failed with
    "Message truncated" in MPIR_Allgather_intra_brucks).  The script removes it, and the run resumes
    from its newest checkpoint, bitwise equal in the end to an uninterrupted run."""
    tmp, config, submit = setup
    cfg = config("killed", 300)
    ref = train(cfg, 2, tmp / "ref-killed")
    job_id, out = submit(cfg, "--nodes=1", "--ntasks-per-node=2", "--requeue", partition="debug")
    run = tmp / "killed"
    wait(lambda: (run / "checkpoints" / "ckpt-000000050" / "index.json").exists(), "a checkpoint")
    segment = Path(f"/dev/shm/mpich_shm_{fnv1a(f'{job_id}.0')}_0")
    assert segment.exists()
    ranks = [p.name for p in Path("/proc").iterdir()  # the ranks, not srun (whose arguments are the same)
             if p.name.isdigit() and f"train\0{cfg}\0" in cmdline(p.name) and cmdline(p.name, "comm").startswith("python")]
    assert len(ranks) == 2, ranks
    for p in ranks:
        os.kill(int(p), signal.SIGKILL)
    assert wait(lambda: finished(job_id), f"job {job_id} to end") == "FAILED", out.read_text()[-3000:]
    assert "stopped without a checkpoint of this session" in out.read_text()
    assert segment.exists()  # left behind
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    assert wait(lambda: finished(job_id) if int(job(job_id).get("Restarts", 0)) else None,
                f"job {job_id} to start again and end") == "COMPLETED", out.read_text()[-3000:]
    second = out.read_text().split("(start 2, requeued 1 times)")[1]
    removed = second.split(f"removed stale MPI shared memory of this job on {os.uname().nodename} ")[1]
    assert segment.name in removed.split("\n")[0], second[:3000]
    assert f"resumed from {run / 'checkpoints'}" in second and "status 0: the run is complete" in second
    assert ref.wait(timeout=170) == 0, ref.stderr.read()
    assert_same_weights(tmp / "ref-killed", run, "the run killed and resumed")
