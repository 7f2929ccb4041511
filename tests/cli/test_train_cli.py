"""`cotsdl train` and `cotsdl inspect` as a user runs them: under mpiexec, with good and bad input, and signals."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

from cotsdl.io.dataset import write_dataset
from testkit import corrupt_chunk, tiny_config

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
SUBCOMMANDS = ["prepare-data", "inspect", "train", "evaluate", "study", "plan", "bench", "check-kernels", "info"]

def cotsdl(*args, ranks=2, timeout=120, cwd=None):
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "cotsdl", *args]
    env = {**os.environ, "MPIEXEC_TIMEOUT": str(timeout)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=env, cwd=cwd)


@pytest.fixture
def setup(tmp_path):
    """A tiny dataset and a config writer."""
    imgs = np.random.default_rng(0).integers(0, 256, (40, 12, 12), dtype=np.uint8)
    write_dataset(tmp_path / "tiny.h5", imgs)

    def make(name="c.toml", data=tmp_path / "tiny.h5", run=tmp_path / "run", steps=6, every=4):
        path = tmp_path / name
        path.write_text(tiny_config(data, run, steps, every))
        return path
    return tmp_path, make


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_every_subcommand_has_help(sub):
    res = subprocess.run([sys.executable, "-m", "cotsdl", sub, "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and f"usage: cotsdl {sub}" in res.stdout, res.stderr


def test_version():
    res = subprocess.run([sys.executable, "-m", "cotsdl", "--version"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.startswith("cotsdl ")


def weights(run, step):
    """Every weight array of the checkpoint of ``step``, by rank file."""
    out = {}
    for f in sorted((run / "checkpoints" / f"ckpt-{step:09d}").glob("rank*.h5")):
        with h5py.File(f) as h:
            h.visit(lambda name: out.__setitem__((f.name, name), h[name][()])
                    if isinstance(h[name], h5py.Dataset) and name.startswith("w/") else None)
    return out


@pytest.mark.timeout(300)
def test_train_resume_complete(setup):
    tmp, make = setup
    cfg = make(steps=5, every=4)
    res = cotsdl("train", str(cfg), cwd=tmp)  # (no machine.json there: "auto" decides by its rule)
    assert res.returncode == 0, res.stderr
    run = tmp / "run"
    assert {p.name for p in run.iterdir()} >= {"config.toml", "checkpoints", "metrics.jsonl", "log.txt", "summary.json"}
    assert res.stdout.count("done: 2 stage(s)") == 1  # rank 0 reports, once
    log = (run / "log.txt").read_text()
    assert "stage 1: loss" in log
    said = next(line for line in log.splitlines() if line.startswith("grid 2x1 x 1 replica(s); overlap "))
    assert said.startswith("grid 2x1 x 1 replica(s); overlap off (auto: 4 layer(s) exchange halos on grid 2x1, "
                           "but each model group's 2 ranks share one node; no ./machine.json") and "on only where halos cross nodes" \
        in said, said
    again = cotsdl("train", str(cfg))
    assert again.returncode == 0 and "is already complete" in again.stdout
    longer = cotsdl("train", str(cfg), "--set", "train.steps=[5, 8]", "--set", "parallel.overlap=false")
    assert longer.returncode == 0, longer.stderr
    assert "resumed from" in longer.stdout and longer.stdout.count("train.steps: [5, 5] -> [5, 8]") == 1
    assert longer.stdout.count('parallel.overlap: "auto" -> false') == 1
    assert longer.stdout.count("overlap off (set in the config)") == 1
    changed = cotsdl("train", str(cfg), "--set", "network.stages[1].filter.channels=4", "--set", "train.steps=[5, 9]")
    assert changed.returncode == 2
    assert changed.stderr.count("the config's model differs") == 1
    assert "network.stages[1].filter.channels: 2 -> 4" in changed.stderr


def saved_meta(run):
    import json

    latest = max((run / "checkpoints").glob("ckpt-*"))
    return json.loads((latest / "index.json").read_text())["meta"]


@pytest.mark.timeout(300)
def test_resume_applies_new_settings_and_refuses_a_new_model(setup):
    tmp, make = setup
    cfg = make(steps=3, every=100)
    assert cotsdl("train", str(cfg)).returncode == 0
    tied = cotsdl("train", str(cfg), "--set", "train.tied=false", "--set", "train.steps=[3, 5]")
    assert tied.returncode == 2 and tied.stderr.count("train.tied: true -> false") == 1
    more = cotsdl("train", str(cfg), "--set", "train.steps=[3, 5]", "--set", "train.lam=0.3",
                  "--set", "train.optimizer.lr=0.0005")
    assert more.returncode == 0, more.stderr
    for line in ("train.lam: 0.1 (checkpoint) -> 0.3 (config)", "train.optimizer.lr: 0.002 (checkpoint) -> 0.0005 (config)",
                 "train.steps: [3, 3] -> [3, 5]"):
        assert more.stdout.count(line) == 1, (line, more.stdout)
    assert "restored" not in more.stdout  # one statement of what applies, no contradiction
    meta = saved_meta(tmp / "run")
    assert meta["lam"] == 0.3 and meta["optimizer"]["schedule"] == {"kind": "constant", "lr": 0.0005}


@pytest.mark.timeout(300)
def test_epochs_count_the_batch_the_run_started_with(setup):
    tmp, make = setup
    text = make().read_text().replace("steps = [6, 6]", "epochs = [0.5, 0.5]")
    (tmp / "ep.toml").write_text(text)
    first = cotsdl("train", str(tmp / "ep.toml"))
    assert first.returncode == 0 and saved_meta(tmp / "run")["step"] == 10  # 20 of 40 images, batch 4
    again = cotsdl("train", str(tmp / "ep.toml"), "--set", "data.batch=2")
    assert again.returncode == 0 and "is already complete" in again.stdout


def test_run_folder_problems_on_rank_0_alone(setup):
    tmp, make = setup
    (tmp / "run").mkdir()
    (tmp / "run" / "config.toml").write_text("")
    (tmp / "run" / "log.txt").mkdir()  # rank 0 cannot open its log
    res = cotsdl("train", str(make()))
    assert res.returncode == 2 and res.stderr.count("cannot write") == 1 and "Traceback" not in res.stderr


@pytest.mark.timeout(300)
def test_sigusr1_checkpoints_exits_75_and_resumes_bitwise(setup):
    tmp, make = setup
    ref = cotsdl("train", str(make("ref.toml", run=tmp / "ref", steps=150, every=1000)))
    assert ref.returncode == 0, ref.stderr
    cfg = make("int.toml", run=tmp / "int", steps=150, every=1000)
    session_file = tmp / "session.json"
    env = {**os.environ, "MPIEXEC_TIMEOUT": "200", "COTSDL_SESSION_FILE": str(session_file)}
    proc = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-m", "mpi4py", "-m", "cotsdl", "train", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    log = tmp / "int" / "log.txt"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and "stage 0 step 3/" in log.read_text()):
        time.sleep(0.02)
    proc.send_signal(signal.SIGUSR1)  # what Slurm sends before the time limit (mpiexec forwards it)
    out, err = proc.communicate(timeout=200)
    assert proc.returncode == 75, err
    assert out.count("stopped by SIGUSR1") == 1 and "Abort" not in err
    stopped = int(out.split("stopped by SIGUSR1 at global step ")[1].split(";")[0])
    assert stopped < 300, "the signal came after the run had finished"
    assert (tmp / "int" / "checkpoints" / f"ckpt-{stopped:09d}" / "index.json").exists()
    start, stop = map(int, session_file.read_text().split())  # "START STOP", for the job scripts' requeue guard
    assert stop == stopped and start == 0
    resumed = cotsdl("train", str(cfg))
    assert resumed.returncode == 0, resumed.stderr
    assert f"global step {stopped}" in resumed.stdout
    a, b = weights(tmp / "ref", 300), weights(tmp / "int", 300)
    assert a.keys() == b.keys() and len(a) == 4  # 2 rank files x 2 stages
    for k in a:
        assert np.array_equal(a[k], b[k]), f"{k} differs after the interruption"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks_signalled", ["0", "0 1"])
def test_a_sigusr1_while_the_ranks_start_is_a_checkpoint_request(setup, ranks_signalled):
    """Slurm's time-limit warning can land while the ranks still import: it must stop every rank at the
    first step with 75 (requeue), not end the signalled rank with 138 and MPI_Abort (a job not requeued).
    Each rank listed gets the signal held and pending from before its interpreter starts, so it is
    delivered at the first moment cotsdl lets a signal in."""
    tmp, make = setup
    cfg = make("early.toml", run=tmp / "early", steps=20, every=1000)
    wrapper = textwrap.dedent(f"""
        import os, signal, sys
        if os.environ.get("PMI_RANK", "0") in {ranks_signalled.split()!r}:
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
            os.kill(os.getpid(), signal.SIGUSR1)  # pending, and kept so across exec
        os.execv(sys.executable, [sys.executable, "-m", "mpi4py", "-m", "cotsdl", "train", {str(cfg)!r}])
    """)
    env = {**os.environ, "MPIEXEC_TIMEOUT": "200"}
    res = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", wrapper], capture_output=True, text=True,
                         timeout=230, env=env)
    assert res.returncode == 75, res.stdout[-2000:] + res.stderr[-3000:]
    assert "stopped by SIGUSR1 at global step " in res.stdout and "Abort" not in res.stderr, res.stderr[-3000:]
    stopped = int(res.stdout.split("stopped by SIGUSR1 at global step ")[1].split(";")[0])
    assert stopped <= 1 and (tmp / "early" / "checkpoints" / f"ckpt-{stopped:09d}" / "index.json").exists()
    resumed = cotsdl("train", str(cfg))
    assert resumed.returncode == 0, resumed.stderr


def test_a_second_signal_exits_at_once():
    code = textwrap.dedent("""
        import os, signal, time
        from cotsdl.cli.signals import PreemptionGuard
        g = PreemptionGuard(grace=0.5)
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # within the grace time: the same request (srun + scheduler)
        assert g.requested() and g.name == "SIGUSR1"
        time.sleep(0.6)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    """)
    t0 = time.time()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 128 + signal.SIGTERM and time.time() - t0 < 20
    assert "second signal SIGTERM: exiting now" in res.stderr


def test_a_second_ctrl_c_exits_at_once_even_within_the_grace_time():
    code = textwrap.dedent("""
        import os, signal, time
        from cotsdl.cli.signals import PreemptionGuard
        g = PreemptionGuard(grace=30)
        os.kill(os.getpid(), signal.SIGINT)
        assert g.requested()
        os.kill(os.getpid(), signal.SIGINT)  # a person pressed Ctrl-C twice: no grace
        time.sleep(30)
    """)
    t0 = time.time()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 128 + signal.SIGINT and time.time() - t0 < 20
    assert "second signal SIGINT: exiting now" in res.stderr


def _nan_file(path):
    x = np.random.default_rng(1).standard_normal((40, 12, 12)).astype(np.float32)
    x[np.random.default_rng(1).permutation(40)[:3], 5, 6] = np.nan
    with h5py.File(path, "w") as f:  # behind the writer's back, as a user's own file may be
        f["images"] = x
    return path


def _labels_file(path):
    with h5py.File(path, "w") as f:
        f["images"] = np.zeros((40, 12, 12), np.uint8)
        f["labels"] = np.zeros(39, np.int64)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case, message", [
    ("missing", "dataset {tmp}/missing.h5: no such file"),
    ("shape", "images are 10x12x1, the network's input is 12x12x1"),
    ("few", "3 image(s), fewer than one global batch of 4"),
    ("truncated", "cannot read it as HDF5 (truncated or corrupt?)"),
    ("labels", "'labels' must be (40,) integers"),
    ("nan", "has NaN or Inf pixels"),
    ("folder", "is not empty and holds no config.toml"),
    ("noimages", "no 'images' dataset (it holds: pixels)"),
    ("rank", "'images' must be (N, H, W) or (N, H, W, C), got shape (40, 144)"),
    ("dtype", "'images' must be uint8, float32 or float64, got dtype complex64"),
    ("empty", "'images' is empty (shape (0, 12, 12))"),
])
def test_bad_data_fails_once_on_rank_0_on_every_rank(setup, case, message):
    tmp, make = setup
    rng = np.random.default_rng(0)
    data, extra = tmp / f"{case}.h5", ["--set", "data.preprocess=none"]
    if case == "shape":
        write_dataset(data, rng.integers(0, 256, (40, 10, 12), dtype=np.uint8))
    elif case == "few":
        write_dataset(data, rng.integers(0, 256, (3, 12, 12), dtype=np.uint8))
    elif case == "truncated":
        write_dataset(data, rng.integers(0, 256, (400, 12, 12), dtype=np.uint8))
        data.write_bytes(data.read_bytes()[:5000])
    elif case == "labels":
        _labels_file(data)
    elif case == "nan":
        _nan_file(data)
    elif case in ("noimages", "rank", "dtype", "empty"):
        arrays = {"noimages": ("pixels", np.zeros((40, 12, 12), np.uint8)),
                  "rank": ("images", np.zeros((40, 144), np.uint8)),
                  "dtype": ("images", np.zeros((40, 12, 12), np.complex64)),
                  "empty": ("images", np.zeros((0, 12, 12), np.float32))}
        with h5py.File(data, "w") as f:
            f[arrays[case][0]] = arrays[case][1]
    elif case == "folder":
        data = tmp / "tiny.h5"
        (tmp / "run").mkdir()
        (tmp / "run" / "thesis.tex").write_text("precious")
    t0 = time.time()
    res = cotsdl("train", str(make(data=data)), *extra)
    assert res.returncode != 0 and time.time() - t0 < 60
    assert res.stderr.count(message.format(tmp=tmp)) == 1, res.stderr
    assert "Traceback" not in res.stderr
    if case == "folder":
        assert (tmp / "run" / "thesis.tex").read_text() == "precious"
    elif case != "nan":
        assert not (tmp / "run").exists()  # nothing written before the data was checked


def test_inspect(setup):
    tmp, make = setup
    res = subprocess.run([sys.executable, "-m", "cotsdl", "inspect", str(tmp / "tiny.h5"), "--config", str(make()),
                          "--scan"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "images: 40 x 12x12x1 uint8" in res.stdout and "pixel values: 0 .. 255" in res.stdout
    assert res.stdout.rstrip().endswith("valid for " + str(tmp / "c.toml"))
    bad = subprocess.run([sys.executable, "-m", "cotsdl", "inspect", str(tmp / "tiny.h5"), "--config", str(make()),
                          "--set", "network.input=[12, 12, 3]"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "NOT VALID" in bad.stdout and "the network's input is 12x12x3" in bad.stdout
    nan = subprocess.run([sys.executable, "-m", "cotsdl", "inspect", str(_nan_file(tmp / "n.h5")), "--scan"],
                         capture_output=True, text=True, timeout=60)
    assert nan.returncode == 2 and "3 image(s) with NaN or Inf values" in nan.stdout
    write_dataset(tmp / "gz.h5", np.zeros((300, 12, 12), np.uint8), compression="gzip")
    corrupt_chunk(tmp / "gz.h5", 260)
    bad = subprocess.run([sys.executable, "-m", "cotsdl", "inspect", str(tmp / "gz.h5"), "--scan"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "gz.h5: cannot read images 256..299" in bad.stderr and "Traceback" not in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "cotsdl", "inspect", str(tmp / "zz.h5")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 2 and "zz.h5: no such file" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.timeout(300)
def test_damaged_checkpoints_are_skipped_or_refused(setup):
    tmp, make = setup
    cfg = make(steps=4, every=2)
    assert cotsdl("train", str(cfg)).returncode == 0
    ckpts = sorted((tmp / "run" / "checkpoints").glob("ckpt-*"))
    shard = ckpts[-1] / "rank00000.h5"
    shard.write_bytes(shard.read_bytes()[:100])
    res = cotsdl("train", str(cfg), "--set", "train.steps=[4, 5]")
    assert res.returncode == 0, res.stderr
    assert f"{ckpts[-1].name} skipped: shard" in res.stdout and f"resumed from {ckpts[-2]}" in res.stdout
    for c in (tmp / "run" / "checkpoints").glob("ckpt-*"):
        (c / "rank00001.h5").write_bytes(b"")
    res = cotsdl("train", str(cfg), "--set", "train.steps=[4, 6]")
    assert res.returncode == 2 and res.stderr.count("no checkpoint can be resumed") == 1


@pytest.mark.timeout(300)
def test_input_lcn_is_the_same_on_one_and_two_ranks(setup):
    tmp, make = setup
    losses = []
    for ranks in (1, 2):
        cfg = make(name=f"lcn{ranks}.toml", run=tmp / f"lcn{ranks}", steps=3, every=0)
        res = cotsdl("train", str(cfg), "--set", "data.input_lcn.size=5", "--set", "data.input_lcn.sigma=1.5",
                     ranks=ranks)
        assert res.returncode == 0, res.stderr
        saved = (tmp / f"lcn{ranks}" / "config.toml").read_text()
        assert "[data.input_lcn]" in saved and "size = 5" in saved
        recs = [json.loads(line) for line in (tmp / f"lcn{ranks}" / "metrics.jsonl").read_text().splitlines()]
        losses.append([r["loss"] for r in recs if "loss" in r])
    assert np.allclose(losses[0], losses[1], rtol=1e-4)  # each rank's window of the whole-image LCN
    plain = cotsdl("train", str(make(name="plain.toml", run=tmp / "plain", steps=3, every=0)), ranks=1)
    assert plain.returncode == 0
    assert "overlap off (auto: 1 rank, no halo to hide)" in (tmp / "plain" / "log.txt").read_text()
    recs = [json.loads(line) for line in (tmp / "plain" / "metrics.jsonl").read_text().splitlines()]
    assert not np.isclose(recs[0]["loss"], losses[0][0], rtol=1e-3)  # it did change what the network sees


@pytest.mark.timeout(300)
def test_input_lcn_cannot_change_within_a_run_and_diagnostics_survive_a_resume(setup):
    tmp, make = setup
    cfg = make(name="r.toml", run=tmp / "r", steps=3, every=3)
    assert cotsdl("train", str(cfg), "--set", "train.steps=[3, 0]", ranks=1).returncode == 0
    changed = cotsdl("train", str(cfg), "--set", "data.input_lcn.size=3", ranks=1)
    assert changed.returncode == 2 and "data.input_lcn" in changed.stderr, changed.stderr
    again = cotsdl("train", str(cfg), ranks=1)  # stage 2 in a second session
    assert again.returncode == 0, again.stderr
    summary = json.loads((tmp / "r" / "summary.json").read_text())
    assert [d["stage"] for d in summary["filter_diagnostics"]] == [0, 1]  # stage 0 from the first session's log
    assert "gabor_fraction" in summary["filter_diagnostics"][0]


@pytest.mark.timeout(300)
def test_a_run_folder_in_use_is_refused_naming_its_holder(setup):
    """Two trainings on one run folder would interleave their metrics and checkpoints: the second is refused."""
    from cotsdl.io.runlock import RunLock

    tmp, make = setup
    cfg = make(steps=2)
    assert cotsdl("train", str(cfg)).returncode == 0
    metrics = (tmp / "run" / "metrics.jsonl").read_bytes()
    held = RunLock(tmp / "run")  # stands in for a training that is running there
    assert held.acquire() is None
    try:
        res = cotsdl("train", str(cfg), "--set", "train.steps=[4, 4]")
        assert res.returncode == 2, res.stderr
        assert res.stderr.count(f"is in use by another cotsdl train: host {os.uname().nodename}, pid {os.getpid()}") == 1
        assert "Traceback" not in res.stderr
        assert (tmp / "run" / "metrics.jsonl").read_bytes() == metrics  # nothing was written
    finally:
        held.release()
    again = cotsdl("train", str(cfg), "--set", "train.steps=[4, 4]")
    assert again.returncode == 0 and "resumed from" in again.stdout, again.stderr


def test_a_stale_lock_record_does_not_block(tmp_path, monkeypatch):
    """A lock file left by a run that died is free (flock dies with its process); where the filesystem has
    no locks, a record of a dead process on this host is stale, a live one is refused."""
    import errno
    import fcntl
    import socket

    from cotsdl.io import runlock

    (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": 2 ** 22 + 7, "started": 0}))
    lock = runlock.RunLock(tmp_path)
    assert lock.acquire() is None and json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    lock.release()

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": 2 ** 22 + 7, "started": 0}))
    assert runlock.RunLock(tmp_path).acquire() is None  # a dead holder: stale
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": live.pid, "started": 0}))
        err = runlock.RunLock(tmp_path).acquire()
        assert f"pid {live.pid}" in err and "no file locks" in err and "remove" in err
    finally:
        live.kill()
        live.wait()


def test_the_watchdog_names_silent_ranks_and_a_deadlock(tmp_path):
    """Unit check of the two verdicts (the reliability suite stops a real rank with SIGSTOP)."""
    import threading

    from cotsdl.cli.watchdog import Watchdog

    for alive in (False, True):
        folder = tmp_path / f"dog{alive}"
        said, aborted = [], threading.Event()
        dog = Watchdog(folder, 0, 2, timeout=0.6, abort=lambda code: aborted.set(), period=0.1, say=said.append)
        dog.start()
        dog.progress(7)
        keep = threading.Event()

        def other_rank():  # rank 1's watchdog thread: beats while it "lives", atomically as Watchdog does
            while not keep.is_set():  # (a plain write_text could be read half-written: "never seen")
                tmp = folder / "rank-00001.tmp"
                tmp.write_text(json.dumps({"step": 7, "time": time.time(), "host": "h", "pid": 1}))
                os.replace(tmp, folder / "rank-00001")
                time.sleep(0.05)
        t = threading.Thread(target=other_rank) if alive else None
        if t:
            t.start()
        assert aborted.wait(10), said
        keep.set()
        if t:
            t.join()
        dog.stop()
        (msg,) = said
        assert "no training step completed in 1 s (after global step 7)" in msg
        if alive:
            assert "every rank is alive but none completes a step" in msg and "rank 1 7" in msg
        else:
            assert "rank 1 (never seen)" in msg


def test_run_graph_is_reported_where_the_backend_has_no_graphs(setup):
    """``run.graph = true`` on the numpy backend: the run trains eagerly, and the log says why."""
    tmp, make = setup
    cfg = make(steps=2, every=0)
    res = cotsdl("train", str(cfg), "--set", "run.graph=true", "--set", "run.backend=numpy", ranks=1, cwd=tmp)
    assert res.returncode == 0, res.stderr
    log = (tmp / "run" / "log.txt").read_text()
    assert "steps launched: eager (not available on backend numpy" in log, log
    bad = cotsdl("train", str(cfg), "--set", "run.graph=3", ranks=1, cwd=tmp)
    assert bad.returncode != 0 and "run.graph" in bad.stderr
