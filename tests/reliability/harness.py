"""The machinery of the reliability suite: jobs in their own sessions with hard timeouts, fault timing,
snapshots of committed files (bytes lost), bitwise weight comparison, bad-input checks."""
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from cotsdl.io.dataset import write_dataset

from ..testkit import final_weights as _final_weights, tiny_config  # the helpers shared with the pytest suites

HERE = Path(__file__).resolve().parent
PY = sys.executable
MPIEXEC = os.path.join(os.path.dirname(PY), "mpiexec")
if not os.path.exists(MPIEXEC):
    MPIEXEC = shutil.which("mpiexec") or "mpiexec"
JOB_TIMEOUT = 60  # seconds for any one process tree
EXIT_LIMIT = 10.0  # seconds from a fault to the last rank's exit

class CaseFailed(Exception):
    pass


class CaseSkipped(Exception):
    """The machine cannot run this case (said in its line; the summary counts it)."""


class Hang(Exception):
    pass


def check(cond, why):
    if not cond:
        raise CaseFailed(why)


# ---------------------------------------------------------------- processes

class Job:
    """A process tree in its own session, output to files (no pipe can fill up)."""
    live: list["Job"] = []

    def __init__(self, cmd, cwd, name="job", env=None, preexec_fn=None):
        self.out_path, self.err_path = Path(cwd) / f"{name}.out", Path(cwd) / f"{name}.err"
        self._out, self._err = open(self.out_path, "w"), open(self.err_path, "w")
        full_env = {**os.environ, "MPIEXEC_TIMEOUT": str(JOB_TIMEOUT), "OMP_NUM_THREADS": "1", **(env or {})}
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=self._out, stderr=self._err, env=full_env,
                                     start_new_session=True, preexec_fn=preexec_fn)
        self.pgid = self.proc.pid
        self.rc = None
        Job.live.append(self)

    def group_alive(self):
        try:
            os.killpg(self.pgid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def kill(self):
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def wait(self, timeout=JOB_TIMEOUT + 15):
        """Exit status; then waits until every process of the group is gone.  Returns when they are."""
        deadline = self.t0 + timeout
        try:
            self.rc = self.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise Hang(f"{self.proc.args[:2]}... still running after {timeout} s")
        while self.group_alive():
            if time.monotonic() > deadline:
                self.kill()
                raise Hang("processes of the job outlived mpiexec")
            time.sleep(0.01)
        self.t_end = time.monotonic()
        self._out.close()
        self._err.close()
        if self in Job.live:
            Job.live.remove(self)
        return self.rc

    @property
    def out(self):
        return self.out_path.read_text(errors="replace")

    @property
    def err(self):
        return self.err_path.read_text(errors="replace")

    def ranks(self):
        """{rank: pid} of the python processes under mpiexec (PMI_RANK from their environment)."""
        found = {}
        todo = [self.proc.pid]
        seen = set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            try:
                kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
            except OSError:
                kids = []
            for k in map(int, kids):
                todo.append(k)
                try:
                    env = Path(f"/proc/{k}/environ").read_bytes().split(b"\0")
                    cmd = Path(f"/proc/{k}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"python" not in cmd:
                    continue
                for kv in env:
                    if kv.startswith(b"PMI_RANK="):
                        found[int(kv[9:])] = k
        return found


def cotsdl_job(tmp, args, ranks=2, name="job", preexec_fn=None):
    cmd = [MPIEXEC, "-n", str(ranks), PY, "-m", "mpi4py", "-m", "cotsdl", *map(str, args)]
    return Job(cmd, tmp, name, preexec_fn=preexec_fn)


def cotsdl_run(tmp, args, ranks=2, name="job", preexec_fn=None):
    j = cotsdl_job(tmp, args, ranks, name, preexec_fn)
    j.wait()
    return j


# ---------------------------------------------------------------- bookkeeping

class Ctx:
    def __init__(self, tmp):
        self.tmp = Path(tmp)
        self.exit_time = None  # fault -> last exit, for cases that expect a failure
        self.lost = 0

    def note_exit(self, seconds):
        self.exit_time = max(self.exit_time or 0.0, seconds)
        check(seconds <= EXIT_LIMIT, f"the job took {seconds:.1f} s after the fault to end (limit {EXIT_LIMIT} s)")

    def data(self, name="tiny.h5", n=40, size=12):
        path = self.tmp / name
        write_dataset(path, np.random.default_rng(0).integers(0, 256, (n, size, size), dtype=np.uint8))
        return path

    def config(self, name="c.toml", data=None, run="run", steps=6, every=4, size=12, c0=3, c1=2):
        path = self.tmp / name
        path.write_text(tiny_config(data or self.tmp / "tiny.h5", self.tmp / run, steps, every, size=size, c0=c0,
                                    c1=c1, keep=20))  # keep all: pruning is not loss
        return path


def _sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def snapshot(root, skip=()):
    """path -> (size, sha256) of every committed checkpoint file and dataset file under root."""
    root, snap = Path(root), {}
    skip = [Path(s) for s in skip]
    for p in root.rglob("*"):
        if not p.is_file() or any(s == p or s in p.parents for s in skip):
            continue
        committed = p.parent.name.startswith("ckpt-") and (p.parent / "index.json").exists()
        if committed or (p.suffix == ".h5" and p.parent == root):
            snap[p] = (p.stat().st_size, _sha(p))
    return snap


def lost_bytes(before, skip=()):
    skip = [Path(s) for s in skip]
    lost = 0
    for p, (size, digest) in before.items():
        if any(s == p or s in p.parents for s in skip):
            continue
        try:
            if p.stat().st_size != size or _sha(p) != digest:
                lost += size
        except OSError:
            lost += size
    return lost


def account(ctx, before, skip=()):
    n = lost_bytes(before, skip)
    ctx.lost += n
    check(n == 0, f"{n} bytes of committed checkpoints or data were damaged or removed")


def expect_error(ctx, job, message, status=None):
    """A failed job: its status, one message on stderr, no traceback, fast exit."""
    if status is None:
        check(job.rc != 0, f"exit status 0, expected a failure; stderr: {job.err[-800:]}")
    else:
        check(job.rc == status, f"exit status {job.rc}, expected {status}; stderr: {job.err[-800:]}")
    n = job.err.count(message)
    check(n == 1, f"{message!r} appears {n} times in stderr: {job.err[-800:]}")
    check("Traceback" not in job.err, f"a traceback in stderr: {job.err[-800:]}")
    ctx.note_exit(job.t_end - job.t0)


def final_weights(run):
    """{(rank file, name): array} of the w/... datasets of the latest checkpoint, and its name."""
    name, out = _final_weights(run)
    check(name, f"no checkpoint in {run}")
    return name, out


def assert_bitwise(ref_run, run):
    (na, a), (nb, b) = final_weights(ref_run), final_weights(run)
    check(na == nb, f"final checkpoints differ: {na} vs {nb}")
    check(a and a.keys() == b.keys(), f"weight arrays differ: {sorted(a)} vs {sorted(b)}")
    for k in a:
        check(np.array_equal(a[k], b[k]), f"{k} differs from the uninterrupted run")


_REFS = {}


def reference(ctx, ranks, **cfg):
    """The run folder of an uninterrupted run with this config (computed once per suite run)."""
    key = (ranks, tuple(sorted(cfg.items())))
    if key not in _REFS:
        base = Path(tempfile.mkdtemp(prefix="cotsdl-rel-ref-"))
        sub = Ctx(base)
        sub.data(size=cfg.get("size", 12))
        j = cotsdl_run(base, ["train", sub.config(run="ref", **cfg)], ranks, "ref")
        check(j.rc == 0, f"the reference run failed ({j.rc}): {j.err[-800:]}")
        _REFS[key] = base / "ref"
    return _REFS[key]


def wait_for(pred, job, timeout=40, poll=0.005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        if job.proc.poll() is not None:
            return False
        time.sleep(poll)
    return False


def committed(run):
    d = Path(run) / "checkpoints"
    return sorted(p for p in d.glob("ckpt-*") if (p / "index.json").exists()) if d.exists() else []


# ---------------------------------------------------------------- cases: bad input

def _bad_input(ctx, message, status=2, data=None, sets=(), setup=None):
    default = ctx.data()
    if setup:
        setup(ctx)
    cfg = ctx.config(data=data)
    before = snapshot(ctx.tmp)
    args = ["train", cfg, "--set", "data.preprocess=none"]
    for s in sets:
        args += ["--set", s]
    j = cotsdl_run(ctx.tmp, args)
    expect_error(ctx, j, message.format(tmp=ctx.tmp, data=data or default), status)
    account(ctx, before)


def _h5(path, **arrays):
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f[k] = v
    return path
