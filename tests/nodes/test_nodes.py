"""Ranks on separate simulated nodes (tests/cluster/nodes-up.sh): network namespaces on a bridge,
each with its own host name, IPC and cores, so that MPICH sees one node per namespace and every
halo crosses a veth link over TCP.

Run by tests/run.sh after ``nodes-up.sh 2`` brought the nodes up; skipped anywhere else.  What
is checked: training on 2 nodes x 1 and x 2 ranks equals the same run on one node, bit for bit;
the log says which ranks share a node and why overlap went on; the exchange tests (forward and
adjoint) pass with the grid split across nodes; and a node that dies mid-run (its processes
killed, its link cut, or a link that carries almost nothing) ends every rank within a bound,
named in cotsdl's words, with the newest checkpoint intact and the run resumable on fewer ranks.
"""
import json
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cotsdl.io.dataset import write_dataset
from cotsdl.planner.predict import MIN_BURST
from testkit import final_weights, tiny_config

ROOT = Path(__file__).resolve().parents[2]
NODES_UP = ROOT / "tests" / "cluster" / "nodes-up.sh"
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
NET = os.environ.get("COTSDL_NODES_NET", "10.213.77")
HOSTS = Path("/run/cotsdl-nodes/hosts")
#: --watchdog of the runs that lose a node, and the bound on how long any rank outlives the loss:
#: the watchdog's timeout, its period (1 s) and its wait for the lowest live rank (5 periods), the
#: cut-off ranks' own wait for MPI_Abort (watchdog.ABORT_WAIT, 5 s), and 4 s of slack.
WATCHDOG = 8
BOUND = WATCHDOG + 1 + 5 + 5 + 4


def _nodes_problem():
    if os.geteuid() != 0 or not HOSTS.exists():
        return "no simulated nodes here (bash tests/cluster/nodes-up.sh 2, as root)"
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    missing = [n for n in ("cotsdl-n1", "cotsdl-n2") if n not in names]
    return f"simulated node(s) {missing} are not up" if missing else None


pytestmark = [pytest.mark.skipif(_nodes_problem() is not None, reason=str(_nodes_problem()))]


def nodes_env(**extra):
    """The environment of a launch across the nodes: MPICH's TCP network module (its default, UCX,
    would take the namespaces for one host and move every byte through shared memory)."""
    return {**os.environ, "HYDRA_LAUNCHER_AUTOFORK": "0", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp",
            "MPIEXEC_TIMEOUT": "200", **extra}


def on_nodes(ranks, per_node):
    """mpiexec's options that put ``per_node`` consecutive ranks on each of the nodes."""
    return ["-launcher", "rsh", "-launcher-exec", str(ROOT / "tests" / "cluster" / "node-exec"),
            "-f", str(HOSTS), "-localhost", f"{NET}.254", "-n", str(ranks), "-ppn", str(per_node)]


def job(cfg, ranks, per_node, *train_args, timeout=240):
    """jobs/mpirun.sh across the nodes (with its node watch, reached at the bridge's address)."""
    env = nodes_env(COTSDL_SKIP_ENV="1", COTSDL_NODEWATCH_HOST=f"{NET}.254")
    return subprocess.Popen(["bash", str(ROOT / "jobs" / "mpirun.sh"), *on_nodes(ranks, per_node), "--", str(cfg),
                             *train_args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def one_node(cfg, ranks, *train_args):
    """The same training on this machine alone (shared memory between ranks)."""
    return subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "cotsdl", "train",
                           str(cfg), *train_args], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "MPIEXEC_TIMEOUT": "200"})


def run_checks_on_nodes(code):
    """Run ``code`` (Python that prints "checked" on rank 0 once its asserts passed) on 2 nodes x 2 ranks."""
    res = subprocess.run([MPIEXEC, *on_nodes(4, 2), sys.executable, "-m", "mpi4py", "-c", code], cwd=ROOT,
                         env=nodes_env(), capture_output=True, text=True, timeout=100)
    assert res.returncode == 0 and "checked" in res.stdout, res.stderr[-3000:]


def link_bytes():
    """Bytes through the nodes' links so far (their veth ends on the bridge, both ways)."""
    total = 0
    for i in (1, 2):
        for way in ("rx_bytes", "tx_bytes"):
            total += int(Path(f"/sys/class/net/cotsdl-v{i}/statistics/{way}").read_text())
    return total


def node_pids(i):
    return [int(p) for p in subprocess.run(["ip", "netns", "pids", f"cotsdl-n{i}"], capture_output=True,
                                           text=True).stdout.split()]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nodes")
    data = tmp / "tiny.h5"
    write_dataset(data, np.random.default_rng(0).integers(0, 256, (80, 24, 24), dtype=np.uint8))

    def config(name, steps, every=10, keep=3):
        path = tmp / f"{name}.toml"
        path.write_text(tiny_config(data, tmp / name, steps, every, size=24, c0=3, c1=2, keep=keep)
                        .replace("log_every = 1\n", "log_every = 20\n"))
        return path

    return tmp, config


def assert_same_weights(run_a, run_b, exact=True):
    (na, a), (nb, b) = final_weights(run_a), final_weights(run_b)
    assert na == nb and a.keys() == b.keys() and a, (na, nb)
    for k in a:
        if exact:
            assert np.array_equal(a[k], b[k]), f"{k} differs"
        else:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=str(k))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("per_node", [1, 2])
def test_two_nodes_train_bitwise_like_one(setup, per_node):
    """2 nodes x 1 and x 2 ranks against the same ranks on one node: the same reduction order (the
    allreduce of the gradients goes by rank, whatever the transport), so the same bits."""
    tmp, config = setup
    ranks = 2 * per_node
    ref = config(f"one-{ranks}", 30)
    cfg = config(f"two-{ranks}", 30)
    done = one_node(ref, ranks)
    assert done.returncode == 0, done.stderr[-3000:]
    before = link_bytes()
    p = job(cfg, ranks, per_node)
    out, _ = p.communicate(timeout=280)
    assert p.returncode == 0, out[-4000:]
    crossed = link_bytes() - before
    assert_same_weights(tmp / f"one-{ranks}", tmp / f"two-{ranks}")
    assert f"on 2 node(s), {per_node} rank(s) per node: cotsdl-n1 (" in out, out[-3000:]
    assert "overlap on (auto:" in out and "on where halos cross nodes" in out, out[-3000:]
    one = (tmp / f"one-{ranks}" / "log.txt").read_text()
    assert f"on 1 node(s), {ranks} rank(s) per node" in one
    # 60 steps of halos (and the gradient allreduce) went over the links, not through shared memory
    assert crossed > 200_000, f"only {crossed} bytes crossed the nodes' links"


@pytest.mark.timeout(400)
def test_the_exchange_tests_pass_with_the_grid_split_across_nodes():
    """tests/mpi/test_exchange.py (forward, adjoint, split-phase, replica groups), and one exchange for a
    stage's pool and LCN against one each (tests/mpi/test_network.py, test_fuse_train.py: equal results,
    fused training bit for bit), one for a frozen stage's filter, pool and LCN (test_fuse_filter.py), and
    waits that give the core away (tests/mpi/test_yield_waits.py: on 2 nodes x 2, two ranks on each one-core
    node), on 2 nodes x 1 and x 2."""
    for ranks, per_node in ((2, 1), (4, 2)):
        res = subprocess.run([MPIEXEC, *on_nodes(ranks, per_node), sys.executable, "-m", "mpi4py",
                              str(ROOT / "tests" / "mpi_pytest.py"), str(ROOT / "tests" / "mpi" / "test_exchange.py"),
                              str(ROOT / "tests" / "mpi" / "test_network.py"),
                              str(ROOT / "tests" / "mpi" / "test_fuse_train.py"),
                              str(ROOT / "tests" / "mpi" / "test_fuse_filter.py"),
                              str(ROOT / "tests" / "mpi" / "test_yield_waits.py"),
                              "-k", "not test_network or one_exchange or fused_stage or fused_training",
                              "-q", "-p", "no:cacheprovider"],
                             cwd=ROOT, env=nodes_env(), capture_output=True, text=True, timeout=380)
        assert res.returncode == 0, (ranks, res.stdout[-3000:], res.stderr[-3000:])
        assert " passed" in res.stdout and " failed" not in res.stdout, res.stdout[-2000:]


@pytest.mark.timeout(120)
def test_rank_nodes_and_placement_see_two_nodes():
    code = ("from mpi4py import MPI\n"
            "from cotsdl.array.grid import rank_nodes, node_local_size, node_names, placement\n"
            "c = MPI.COMM_WORLD\n"
            "nodes, layout = rank_nodes(c), node_names(c)\n"
            "assert nodes == [0, 0, 2, 2], nodes\n"
            "assert node_local_size(c) == 2\n"
            "assert layout == [('cotsdl-n1', [0, 1]), ('cotsdl-n2', [2, 3])], layout\n"
            "assert placement(nodes, 4) == (2, False) and placement(nodes, 4, replicas=2) == (2, True)\n"
            "if c.rank == 0: print('checked', flush=True)\n")
    run_checks_on_nodes(code)


@pytest.mark.timeout(120)
def test_two_level_reduction_across_the_nodes(tmp_path):
    """2 nodes x 2 ranks: the two-level sum equals the flat allreduce bit for bit ((a + b) + (c + d) either
    way), "auto" picks it for 4 replicas and not for 2 (one rank per node); bench reduction says so."""
    code = ("import numpy as np\n"
            "from mpi4py import MPI\n"
            "from cotsdl.array.grid import split_replicas\n"
            "from cotsdl.train.allreduce import Reduction\n"
            "c = MPI.COMM_WORLD\n"
            "two = Reduction(c, 'auto')\n"
            "assert two.kind == 'two-level' and two._two.nodes == 2, two.reason\n"
            "for n in (1, 1000, 300001):\n"
            "    x = np.random.default_rng(c.rank * 7 + n).standard_normal(n).astype(np.float32)\n"
            "    flat = x.copy()\n"
            "    c.Allreduce(MPI.IN_PLACE, flat)\n"
            "    assert np.array_equal(two(x.copy()), flat), n\n"
            "dec = split_replicas(c, 2)\n"
            "assert Reduction(dec.replica_comm, 'auto').kind == 'flat'\n"
            "if c.rank == 0: print('checked', flush=True)\n")
    run_checks_on_nodes(code)
    out = tmp_path / "reduction.json"
    res = subprocess.run([MPIEXEC, *on_nodes(4, 2), sys.executable, "-m", "mpi4py", "-m", "cotsdl", "bench",
                          "reduction", "--mb", "0.01", "--rounds", "3", "--calls", "1", "--json", str(out)], cwd=ROOT,
                         env=nodes_env(), capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r["replicas"]: r for r in json.loads(out.read_text())["results"]}
    assert rows[4]["auto"] == "two-level" and rows[4]["group_nodes"] == 2 and rows[4]["bitwise_equal"], rows[4]
    assert rows[2]["auto"] == "flat" and rows[2]["group_most_on_a_node"] == 1, rows[2]
    assert "2 on 2 node(s)" in res.stdout and "two-level" in res.stdout, res.stdout


#: Steps of the two stages of the runs that lose a node: long enough that the loss comes in stage 0.
LOSS_STEPS = (800, 30)


def _loss_config(config, name):
    cfg = config(name, LOSS_STEPS[0], every=20, keep=1000)
    cfg.write_text(cfg.read_text().replace(f"steps = [{LOSS_STEPS[0]}, {LOSS_STEPS[0]}]", f"steps = {list(LOSS_STEPS)}"))
    return cfg


def _in_use(path):
    """Whether any process has ``path`` open or mapped."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if str(path) in (proc / "maps").read_text():
                return True
            if any(os.readlink(fd) == str(path) for fd in (proc / "fd").iterdir()):
                return True
        except OSError:
            continue
    return False


def _remove_dead_segments(before):
    """MPICH's shared-memory segments that the killed run left in /dev/shm (none of ours in use)."""
    for seg in set(Path("/dev/shm").glob("mpich_shm_*")) - before:
        if not _in_use(seg):
            seg.unlink(missing_ok=True)


def _lose_node_midway(setup, name, lose, restore):
    """Start a 2-node run, call ``lose()`` once it has a checkpoint, and return (output, seconds from
    the loss to the end of the launcher, the run folder); ``restore()`` always runs after."""
    segments = set(Path("/dev/shm").glob("mpich_shm_*"))
    try:
        return _lose_node(setup, name, lose, restore)
    finally:
        _remove_dead_segments(segments)


def _lose_node(setup, name, lose, restore):
    tmp, config = setup
    cfg = _loss_config(config, name)
    run = tmp / name
    p = job(cfg, 2, 1, "--watchdog", str(WATCHDOG))
    try:
        end = time.monotonic() + 120
        while not any(run.glob("checkpoints/ckpt-*/index.json")):
            assert p.poll() is None and time.monotonic() < end, "the run ended before its first checkpoint"
            time.sleep(0.1)
        time.sleep(0.5)
        lost_at = time.monotonic()
        lose()
        out, _ = p.communicate(timeout=BOUND + 30)
        took = time.monotonic() - lost_at
    finally:
        if p.poll() is None:
            p.kill()
        restore()
    # no rank of the run outlives the bound, on either node
    deadline = lost_at + BOUND
    while any(node_pids(i) for i in (1, 2)) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = {i: node_pids(i) for i in (1, 2)}
    for pids in left.values():
        for pid in pids:
            os.kill(pid, 9)
    assert not any(left.values()), f"processes left on the nodes {BOUND} s after the loss: {left}"
    return out, took, run


def _resume_equals_reference(setup, name, run, ranks_after=1):
    """The newest complete checkpoint of ``run`` is intact and equal to an undisturbed 2-rank run's at the
    same step; resumed on fewer ranks it completes, equal to that reference resumed the same way."""
    tmp, config = setup
    ckpts = sorted(p.parent for p in run.glob("checkpoints/ckpt-*/index.json"))
    assert ckpts, "no complete checkpoint"
    newest = ckpts[-1]
    step = int(newest.name.split("-")[1])
    assert step < LOSS_STEPS[0], "the loss came after stage 0: make stage 0 longer"
    # the reference: the same config, undisturbed on one node (2 ranks), every checkpoint kept; then a
    # copy of its folder cut back to the same checkpoint, as if it had been stopped there
    refcfg = _loss_config(config, f"{name}-ref")
    done = one_node(refcfg, 2)
    assert done.returncode == 0, done.stderr[-3000:]
    got = final_weights_of(newest)
    want = final_weights_of(tmp / f"{name}-ref" / "checkpoints" / newest.name)
    assert got.keys() == want.keys() and got
    for k in got:
        assert np.array_equal(got[k], want[k]), f"{k} of {newest.name} differs from the undisturbed run's"
    cut = tmp / f"{name}-ref-cut"
    shutil.copytree(tmp / f"{name}-ref", cut)
    for later in cut.glob("checkpoints/ckpt-*"):
        if later.name > newest.name:
            shutil.rmtree(later)
    (cut / "summary.json").unlink(missing_ok=True)
    cutcfg = refcfg.with_name(f"{name}-ref-cut.toml")
    cutcfg.write_text(refcfg.read_text().replace(str(tmp / f"{name}-ref"), str(cut)))
    # both resume on fewer ranks (resharding the 2-rank checkpoint) and complete
    for folder, c in ((run, tmp / f"{name}.toml"), (cut, cutcfg)):
        res = one_node(c, ranks_after)
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"resumed from {folder / 'checkpoints' / newest.name}" in res.stdout + res.stderr, res.stdout[-2000:]
    assert_same_weights(run, cut)


def final_weights_of(ckpt):
    import h5py  # noqa: PLC0415

    out = {}
    for f in sorted(Path(ckpt).glob("rank*.h5")):
        with h5py.File(f, "r") as h:
            h.visititems(lambda n, o: out.__setitem__((f.name, n), o[()])
                         if isinstance(o, h5py.Dataset) and n.startswith("w/") else None)
    return out


@pytest.mark.timeout(400)
def test_a_node_whose_processes_die(setup):
    """Every process of node 2 killed (as when a node crashes): Hydra ends the job at once (255); the
    node watch names the rank and node; the newest checkpoint is intact; the run resumes on 1 rank."""
    def lose():
        for pid in node_pids(2):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

    out, took, run = _lose_node_midway(setup, "killed", lose, lambda: None)
    assert "cotsdl: node watch: lost rank 1 on node cotsdl-n2" in out, out[-3000:]
    assert "its process ended without finishing" in out
    assert "status 255: the launcher ended the job" in out, out[-2000:]
    assert took < 10, f"the job outlived its lost node by {took:.1f} s"
    _resume_equals_reference(setup, "killed", run)


@pytest.mark.timeout(400)
def test_a_node_whose_link_goes_down(setup):
    """Node 2's link taken down: the node watch names it (TCP keepalive, ~5 s), the watchdog ends the
    ranks on node 1 and the cut-off rank ends itself, all within BOUND; the checkpoint is intact."""
    up = lambda: subprocess.run(["ip", "-n", "cotsdl-n2", "link", "set", "eth0", "up"], check=True)  # noqa: E731
    down = lambda: subprocess.run(["ip", "-n", "cotsdl-n2", "link", "set", "eth0", "down"], check=True)  # noqa: E731
    out, took, run = _lose_node_midway(setup, "cut", down, up)
    assert "cotsdl: node watch: lost rank 1 on node cotsdl-n2" in out, out[-3000:]
    assert "its node stopped answering over the network" in out
    assert f"watchdog: no training step completed in {WATCHDOG} s" in out, out[-3000:]
    assert took < BOUND, f"the launcher ended {took:.1f} s after the link went down (bound {BOUND} s)"
    _resume_equals_reference(setup, "cut", run)


@pytest.mark.timeout(300)
def test_a_link_that_carries_almost_nothing(setup):
    """A link that stays up but passes 1 kbit/s (tc tbf): detected like a dead one, no rank hangs."""
    shape = lambda rate: subprocess.run(["bash", str(NODES_UP), "shape", "2", rate], check=True,  # noqa: E731
                                        capture_output=True)
    out, took, run = _lose_node_midway(setup, "slow", lambda: shape("1kbit"), lambda: shape("off"))
    assert f"watchdog: no training step completed in {WATCHDOG} s" in out, out[-3000:]
    assert took < BOUND, f"the launcher ended {took:.1f} s after the link slowed (bound {BOUND} s)"
    assert any(run.glob("checkpoints/ckpt-*/index.json"))
    shutil.rmtree(run)


@pytest.mark.timeout(300)
def test_calibrate_measures_the_link_between_nodes_apart(tmp_path):
    """`bench calibrate` over 2 nodes x 2 ranks: ``link`` from ranks of one node, ``node_link`` across;
    with node 1's link shaped to 100 Mbit/s (tbf, a 128 KB bucket) the streams find the sustained rate
    and a burst, and the planner then bounds a step by them."""
    def calibrate(name):
        res = subprocess.run([MPIEXEC, *on_nodes(4, 2), sys.executable, "-m", "mpi4py", "-m", "cotsdl", "bench",
                              "calibrate", "--quick", "--json", str(tmp_path / name)], cwd=ROOT, env=nodes_env(),
                             capture_output=True, text=True, timeout=250)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        return json.loads((tmp_path / name).read_text()), res.stdout

    plain, out = calibrate("plain.json")
    assert "ping-pong ranks 0 <-> 1 (one node)" in out and "ping-pong ranks 0 <-> 2 (two nodes)" in out, out
    node = plain["node_link"]
    assert node["burst_bytes"] < MIN_BURST, node  # an unshaped veth: no bucket
    subprocess.run(["bash", str(NODES_UP), "shape", "1", "100mbit"], check=True, capture_output=True)
    try:
        shaped, out = calibrate("shaped.json")
    finally:
        subprocess.run(["bash", str(NODES_UP), "shape", "1", "off"], check=True, capture_output=True)
    node = shaped["node_link"]
    assert 0.7 <= node["sustained_bytes_per_s"] / 12.5e6 <= 1.3, node
    assert MIN_BURST <= node["burst_bytes"] <= 4 * 128e3, node
    assert "a token bucket" in out
    assert shaped["link"]["beta_s_per_byte"] < node["beta_s_per_byte"] * 10  # within a node: memory, not TCP
