"""Bounded fault-injection suite for `cotsdl train`, run from the repository root:

    python -m tests.reliability.run [NAME ...]

Every case is a function run in a fresh temporary folder; every process it starts runs in
its own session with a hard timeout (a hang is a failure, and its whole process group is
killed).  One line per case, then one summary line:

    reliability: N cases, N passed, 0 hangs, worst exit S s, B bytes lost

worst exit: the longest time from a fault (or the start of a job given bad input) to the
moment its last process was gone, over the cases that expect a failure.  bytes lost: bytes
of committed checkpoints (``ckpt-*`` with ``index.json``) or dataset files that existed
before a fault and were damaged or removed by it.  Exit status 0 only when every case
passed with 0 hangs and 0 bytes lost.
"""
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from cotsdl.io.dataset import write_dataset

if not __package__:  # started as a file: the harness and the shared helpers are imported relative to tests/
    sys.exit("run the reliability suite as a module, from the repository root: python -m tests.reliability.run")
from .harness import (  # noqa: E402
    CaseFailed,
    CaseSkipped,
    Ctx,
    HERE,
    Hang,
    Job,
    MPIEXEC,
    PY,
    _REFS,
    _bad_input,
    _h5,
    account,
    assert_bitwise,
    check,
    committed,
    cotsdl_job,
    cotsdl_run,
    expect_error,
    reference,
    snapshot,
    wait_for,
)


def case_config_unknown_key(ctx):
    _bad_input(ctx, "unknown key train.bogus (allowed:", sets=["train.bogus=1"])


def case_config_negative_steps(ctx):
    _bad_input(ctx, "train.steps = -1: must be an integer >= 0", sets=["train.steps=-1"])


def case_config_fractional_channels(ctx):
    _bad_input(ctx, "network.stages[0].filter.channels = 2.5: must be an integer >= 1",
               sets=["network.stages[0].filter.channels=2.5"])


def case_data_missing(ctx):
    _bad_input(ctx, "dataset {tmp}/missing.h5: no such file", data=ctx.tmp / "missing.h5")


def case_data_no_images(ctx):
    _bad_input(ctx, "no 'images' dataset (it holds: pixels)",
               data=_h5(ctx.tmp / "d.h5", pixels=np.zeros((40, 12, 12), np.uint8)))


def case_data_wrong_rank(ctx):
    _bad_input(ctx, "'images' must be (N, H, W) or (N, H, W, C), got shape (40, 144)",
               data=_h5(ctx.tmp / "d.h5", images=np.zeros((40, 144), np.uint8)))


def case_data_complex_dtype(ctx):
    _bad_input(ctx, "'images' must be uint8, float32 or float64, got dtype complex64",
               data=_h5(ctx.tmp / "d.h5", images=np.zeros((40, 12, 12), np.complex64)))


def case_data_wrong_size(ctx):
    path = ctx.tmp / "d.h5"
    write_dataset(path, np.zeros((40, 10, 12), np.uint8))
    _bad_input(ctx, "images are 10x12x1, the network's input is 12x12x1", data=path)


def case_data_truncated(ctx):
    path = ctx.tmp / "d.h5"
    write_dataset(path, np.random.default_rng(0).integers(0, 256, (400, 12, 12), dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:5000])
    _bad_input(ctx, "cannot read it as HDF5 (truncated or corrupt?)", data=path)


def case_data_nan_pixels(ctx):
    x = np.random.default_rng(1).standard_normal((40, 12, 12)).astype(np.float32)
    x[[3, 17, 30], 5, 6] = np.nan
    _bad_input(ctx, "has NaN or Inf pixels", status=None, data=_h5(ctx.tmp / "d.h5", images=x))


def case_data_empty(ctx):
    _bad_input(ctx, "'images' is empty (shape (0, 12, 12))",
               data=_h5(ctx.tmp / "d.h5", images=np.zeros((0, 12, 12), np.float32)))


def case_data_wrong_label_count(ctx):
    _bad_input(ctx, "'labels' must be (40,) integers",
               data=_h5(ctx.tmp / "d.h5", images=np.zeros((40, 12, 12), np.uint8), labels=np.zeros(39, np.int64)))


def case_data_fewer_than_a_batch(ctx):
    path = ctx.tmp / "d.h5"
    write_dataset(path, np.random.default_rng(0).integers(0, 256, (3, 12, 12), dtype=np.uint8))
    _bad_input(ctx, "3 image(s), fewer than one global batch of 4", data=path)


def case_run_folder_foreign_files(ctx):
    def setup(c):
        (c.tmp / "run").mkdir()
        (c.tmp / "run" / "thesis.tex").write_text("precious")
    _bad_input(ctx, "is not empty and holds no config.toml", setup=setup)
    check((ctx.tmp / "run" / "thesis.tex").read_text() == "precious", "the foreign file was changed")


# ---------------------------------------------------------------- cases: checkpoints

def _trained(ctx):
    ctx.data()
    cfg = ctx.config(steps=4, every=2)
    j = cotsdl_run(ctx.tmp, ["train", cfg], name="first")
    check(j.rc == 0, f"the first run failed ({j.rc}): {j.err[-800:]}")
    ckpts = committed(ctx.tmp / "run")
    check(len(ckpts) == 4, f"expected 4 checkpoints, found {[p.name for p in ckpts]}")
    return cfg, ckpts


def _damaged_latest_is_skipped(ctx, damage):
    cfg, ckpts = _trained(ctx)
    before = snapshot(ctx.tmp)
    damage(ckpts[-1])
    j = cotsdl_run(ctx.tmp, ["train", cfg, "--set", "train.steps=[4, 6]"])
    check(j.rc == 0, f"exit status {j.rc}; stderr: {j.err[-800:]}")
    check("skipped" in j.out and f"{ckpts[-1].name} skipped" in j.out, f"no 'skipped' in stdout: {j.out[:800]}")
    check(f"resumed from {ckpts[-2]}" in j.out, f"not resumed from {ckpts[-2].name}: {j.out[:800]}")
    check("Traceback" not in j.err, f"a traceback: {j.err[-800:]}")
    account(ctx, before, skip=[ckpts[-1]])


def case_ckpt_truncated_shard(ctx):
    def damage(c):
        shard = c / "rank00000.h5"
        shard.write_bytes(shard.read_bytes()[:100])
    _damaged_latest_is_skipped(ctx, damage)


def case_ckpt_missing_shard(ctx):
    _damaged_latest_is_skipped(ctx, lambda c: (c / "rank00001.h5").unlink())


def case_ckpt_corrupt_index(ctx):
    def damage(c):
        text = (c / "index.json").read_text()
        (c / "index.json").write_text(text[: len(text) // 2] + "}garbage")
    _damaged_latest_is_skipped(ctx, damage)


def _edit_index(c, edit, checksum=True):
    """Edit a checkpoint's index.json as a person or a bug might; with ``checksum`` its checksum is made
    to match again (so that the check under test is the one that must catch it)."""
    import json

    from cotsdl.io.checkpoint import _index_checksum

    index = json.loads((c / "index.json").read_text())
    edit(index)
    if checksum and "checksum" in index:
        index["checksum"] = _index_checksum(index)
    (c / "index.json").write_text(json.dumps(index))


def case_ckpt_index_edited(ctx):
    _damaged_latest_is_skipped(ctx, lambda c: _edit_index(c, lambda i: i["meta"].update(lam=0.5), checksum=False))


def case_ckpt_index_without_files(ctx):
    def damage(c):
        _edit_index(c, lambda i: (i.pop("files"), i.pop("checksum")))
    _damaged_latest_is_skipped(ctx, damage)


def case_ckpt_piece_outside_the_folder(ctx):
    def damage(c):
        def edit(i):
            i["pieces"][0]["file"] = "../../outside/evil.h5"
            i["files"]["../../outside/evil.h5"] = {"size": 1, "sha256": "0" * 64}
        _edit_index(c, edit)
    _damaged_latest_is_skipped(ctx, damage)


def case_ckpt_index_missing_a_meta_key(ctx):
    cfg, ckpts = _trained(ctx)
    before = snapshot(ctx.tmp)
    _edit_index(ckpts[-1], lambda i: i["meta"].pop("stage"))
    j = cotsdl_run(ctx.tmp, ["train", cfg, "--set", "train.steps=[4, 6]"])
    expect_error(ctx, j, f"{ckpts[-1] / 'index.json'} is damaged: no meta.stage", 2)
    account(ctx, before, skip=[ckpts[-1]])


def case_ckpt_flipped_bytes_in_the_final_shard(ctx):
    """Same size, other bytes: a complete run is not called complete on sizes alone; it resumes from the
    checkpoint before and finishes again."""
    cfg, ckpts = _trained(ctx)
    before = snapshot(ctx.tmp)
    shard = ckpts[-1] / "rank00001.h5"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    j = cotsdl_run(ctx.tmp, ["train", cfg])
    check(j.rc == 0 and "already complete" not in j.out, f"status {j.rc}; stdout: {j.out[:600]}")
    check(f"{ckpts[-1].name} skipped: shard" in j.out and "does not match its checksum" in j.out,
          f"the damaged shard is not named: {j.out[:800]}")
    check(f"resumed from {ckpts[-2]}" in j.out, f"not resumed from {ckpts[-2].name}: {j.out[:800]}")
    account(ctx, before, skip=[ckpts[-1]])
    again = cotsdl_run(ctx.tmp, ["train", cfg], name="again")
    check(again.rc == 0 and "already complete" in again.out, f"not complete after the re-run: {again.out[:600]}")


def case_ckpt_other_network(ctx):
    cfg, ckpts = _trained(ctx)
    before = snapshot(ctx.tmp)
    j = cotsdl_run(ctx.tmp, ["train", cfg, "--set", "network.stages[1].filter.channels=4",
                             "--set", "train.steps=[4, 6]"])
    expect_error(ctx, j, "the config's model differs", 2)
    account(ctx, before)


def case_ckpt_all_damaged(ctx):
    cfg, ckpts = _trained(ctx)
    before = snapshot(ctx.tmp)
    for c in ckpts:
        (c / "rank00001.h5").write_bytes(b"")
    j = cotsdl_run(ctx.tmp, ["train", cfg, "--set", "train.steps=[4, 6]"])
    expect_error(ctx, j, "no checkpoint can be resumed", 2)
    account(ctx, before, skip=ckpts)


# ---------------------------------------------------------------- cases: faults

LONG = dict(steps=400, every=50)


class NotCaught(CaseFailed):
    pass


def _interrupt_and_resume(ctx, ranks, fault, expect_status=None, expect_out=None, cfg_kw=LONG, ready=None,
                          after=None, poll=0.005, extra=()):
    """Start a long run, apply ``fault(job)`` once ``ready(run)`` holds, check the ending, resume, compare."""
    ref = reference(ctx, ranks, **cfg_kw)
    ctx.data(size=cfg_kw.get("size", 12))
    cfg = ctx.config(**cfg_kw)
    run = ctx.tmp / "run"
    job = cotsdl_job(ctx.tmp, ["train", cfg, *extra], ranks, "faulted")
    ready = ready or (lambda job: len(committed(run)) >= 1)
    if not wait_for(lambda: ready(job), job, poll=poll):
        job.kill()
        job.wait()
        raise CaseFailed(f"the run ended (status {job.rc}) or stalled before the fault could be injected")
    before = snapshot(ctx.tmp)
    t_fault = time.monotonic()
    info = fault(job)
    rc = job.wait()
    ctx.note_exit(job.t_end - t_fault)
    if expect_status is not None:
        check(rc == expect_status, f"exit status {rc}, expected {expect_status}; stderr: {job.err[-800:]}")
    else:
        check(rc != 0, f"exit status 0 after the fault: the run finished before it ({job.out[-300:]})")
    if expect_out:
        check(job.out.count(expect_out) == 1, f"{expect_out!r} not once in stdout: {job.out[-600:]}")
    check("Traceback" not in job.err, f"a traceback: {job.err[-800:]}")
    account(ctx, before)
    if after:
        after()
    again = cotsdl_run(ctx.tmp, ["train", cfg], ranks, "resumed")
    check(again.rc == 0, f"the resumed run failed ({again.rc}): {again.err[-800:]}")
    check("resumed from" in again.out, f"the re-run did not resume: {again.out[:600]}")
    check(not list((run / "checkpoints").glob(".ckpt-*.partial")), "a .partial folder is left after the resume")
    assert_bitwise(ref, run)
    return job, info


def _kill_rank(rank, sig=signal.SIGKILL):
    def fault(job):
        pids = job.ranks()
        check(rank in pids, f"rank {rank} not found under mpiexec (found {pids})")
        os.kill(pids[rank], sig)
        return pids
    return fault


def _signal_mpiexec(sig):
    def fault(job):
        job.proc.send_signal(sig)
    return fault


def case_kill9_rank_mid_step(ctx):
    _interrupt_and_resume(ctx, 2, _kill_rank(1))


def case_kill9_rank_mid_step_4_ranks(ctx):
    _interrupt_and_resume(ctx, 4, _kill_rank(2))


BIG = dict(steps=60, every=10, size=16, c0=128, c1=32)


def case_kill9_rank_mid_checkpoint(ctx):
    run = ctx.tmp / "run"

    pids = {}

    def partial(job):
        # rank pids are looked up once a checkpoint is committed, so the kill itself is one syscall
        d = run / "checkpoints"
        try:
            names = os.listdir(d)
        except OSError:
            return False
        if not pids:
            if any(n.startswith("ckpt-") for n in names):
                pids.update(job.ranks())
            return False
        return any(n.endswith(".partial") for n in names)

    def fault(job):
        check(1 in pids, f"rank 1 not found under mpiexec (found {pids})")
        os.kill(pids[1], signal.SIGKILL)

    def left_partial():
        if not list((run / "checkpoints").glob(".ckpt-*.partial")):
            raise NotCaught("the kill came after the checkpoint was committed")

    why = None
    for attempt in range(3):
        pids.clear()
        for p in list(ctx.tmp.iterdir()):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        try:
            _interrupt_and_resume(ctx, 2, fault, cfg_kw=BIG, ready=partial, after=left_partial, poll=0.0002)
            return
        except NotCaught as e:
            why = e
        except CaseFailed as e:
            if "before the fault" not in str(e):
                raise
            why = e
    raise CaseFailed(f"in 3 attempts the kill never landed while a checkpoint was being written: {why}")


def case_sigterm_mpiexec(ctx):
    _interrupt_and_resume(ctx, 2, _signal_mpiexec(signal.SIGTERM), 75, "stopped by SIGTERM")


def case_sigusr1_mpiexec_4_ranks(ctx):
    _interrupt_and_resume(ctx, 4, _signal_mpiexec(signal.SIGUSR1), 75, "stopped by SIGUSR1")


def case_sigterm_one_rank(ctx):
    _interrupt_and_resume(ctx, 2, _kill_rank(1, signal.SIGTERM), 75, "stopped by SIGTERM")


def case_sigterm_while_starting(ctx):
    """SIGTERM while the program starts (imports, config, before train's own handling): one message and
    143, or, once train handles signals, its checkpoint and 75; never a bare -15 or a traceback; the
    run then trains to the end.  Alone and under mpiexec (every rank gets the signal)."""
    ctx.data()
    cfg = ctx.config()
    for ranks, delay in ((1, 0.1), (1, 0.3), (2, 0.3), (2, 0.6)):
        cmd = [PY, "-m", "cotsdl", "train", str(cfg)] if ranks == 1 else \
            [MPIEXEC, "-n", str(ranks), PY, "-m", "mpi4py", "-m", "cotsdl", "train", str(cfg)]
        j = Job(cmd, ctx.tmp, f"start-{ranks}-{delay}")
        time.sleep(delay)
        t = time.monotonic()
        (j.proc.send_signal if ranks == 1 else lambda s: os.killpg(j.pgid, s))(signal.SIGTERM)
        j.wait()
        ctx.note_exit(j.t_end - t)
        where = f"{ranks} rank(s), SIGTERM after {delay} s"
        check(j.rc in (143, 75), f"{where}: exit status {j.rc}, expected 143 or 75; stderr: {j.err[-600:]}")
        said = "cotsdl: stopped by SIGTERM" if j.rc == 143 else "Exit 75"  # (by rank 0, or the rank it reached)
        check((j.err + j.out).count(said) == 1, f"{where}: {said!r} not said once: {j.err[-600:]} {j.out[-300:]}")
        check("Traceback" not in j.err, f"{where}: a traceback: {j.err[-600:]}")
    done = cotsdl_run(ctx.tmp, ["train", cfg], 2, "finish")
    check(done.rc == 0, f"the run did not train to the end afterwards ({done.rc}): {done.err[-600:]}")


def case_second_run_on_the_same_folder(ctx):
    """A second training started on a run folder in use is refused (naming the first) and writes
    nothing; the first is stopped by SIGTERM, resumed, and ends bitwise as an uninterrupted run."""
    seen = {}

    def fault(job):
        second = cotsdl_run(ctx.tmp, ["train", ctx.tmp / "c.toml"], 2, "second")
        seen["second"] = second
        _signal_mpiexec(signal.SIGTERM)(job)

    _interrupt_and_resume(ctx, 2, fault, 75, "stopped by SIGTERM")
    second = seen["second"]
    check(second.rc == 2, f"the second run: exit status {second.rc}, expected 2; stderr: {second.err[-600:]}")
    check(second.err.count("is in use by another cotsdl train: host ") == 1,
          f"the refusal does not name the holder once: {second.err[-600:]}")
    check("Traceback" not in second.err, f"a traceback: {second.err[-600:]}")
    import json

    steps = [json.loads(line)["step"] for line in (ctx.tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    check(steps == sorted(set(steps)), f"metrics.jsonl has interleaved or repeated steps: {steps}")


def case_sigstop_one_rank_watchdog(ctx):
    """A rank stopped by SIGSTOP leaves the others waiting in a collective: the watchdog ends the job within
    its time, naming the stopped rank; the re-run resumes and ends bitwise as an uninterrupted run."""
    def fault(job):
        pids = job.ranks()
        os.kill(pids[1], signal.SIGSTOP)
        return pids[1]

    job, pid = _interrupt_and_resume(ctx, 2, fault, extra=["--watchdog", "4"])
    check(job.t_end - job.t0 < 60, f"the job took {job.t_end - job.t0:.0f} s to end")
    lines = [ln for ln in job.err.splitlines() if "watchdog" in ln]
    check(len(lines) == 1, f"expected one watchdog message, got {len(lines)}: {job.err[-800:]}")
    check(f"rank 1 (host {os.uname().nodename}, pid {pid}" in lines[0], f"the stopped rank is not named: {lines[0]}")


def case_disk_full_during_checkpoint(ctx):
    ctx.data(size=16)
    cfg = ctx.config(steps=3, every=3, size=16, c0=48, c1=24)
    first = cotsdl_run(ctx.tmp, ["train", cfg], name="first")
    check(first.rc == 0, f"the first run failed ({first.rc}): {first.err[-800:]}")
    run = ctx.tmp / "run"
    ckpts = committed(run)
    shard = min(p.stat().st_size for p in ckpts[-1].glob("rank*.h5"))
    logs = max((run / n).stat().st_size for n in ("log.txt", "metrics.jsonl"))
    limit = shard // 2
    check(logs * 4 < limit, f"the logs ({logs} bytes) are too close to the size limit ({limit} bytes)")
    before = snapshot(ctx.tmp)

    # RLIMIT_FSIZE set before MPI_Init makes UCX fail to start ("No resources are available"),
    # so each rank sets it itself right after MPI_Init (fsize_limited.py), then runs cotsdl.
    j = Job([MPIEXEC, "-n", "2", PY, "-m", "mpi4py", str(HERE / "fsize_limited.py"), str(limit), "train", str(cfg),
             "--set", "train.steps=[3, 6]"], ctx.tmp, "full")
    j.wait()
    check(j.rc not in (0, 75), f"exit status {j.rc} with a full disk; stderr: {j.err[-800:]}")
    lines = [ln for ln in j.err.splitlines() if ln.startswith("cotsdl: error:")]
    check(len(lines) == 1, f"expected one error line, got {len(lines)}: {j.err[-800:]}")
    check("checkpoint" in lines[0], f"the error does not name the checkpoint: {lines[0]}")
    check("Traceback" not in j.err, f"a traceback: {j.err[-800:]}")
    ctx.note_exit(j.t_end - j.t0)  # an upper bound: from the start of the job
    check(not list((run / "checkpoints").glob(".ckpt-*.partial")), "a .ckpt-*.partial folder is left")
    check(committed(run)[-1] == ckpts[-1], f"a new checkpoint was committed: {committed(run)[-1].name}")
    account(ctx, before)
    again = cotsdl_run(ctx.tmp, ["train", cfg, "--set", "train.steps=[3, 6]"], name="again")
    check(again.rc == 0 and f"resumed from {ckpts[-1]}" in again.out,
          f"no resume from the intact checkpoint after the disk was freed ({again.rc}): {again.err[-600:]}")


def _nonfinite(ctx, mode):
    ck = ctx.tmp / "ck"
    j = Job([MPIEXEC, "-n", "2", PY, "-m", "mpi4py", str(HERE / "nonfinite_job.py"), mode, str(ck), str(ctx.tmp)],
            ctx.tmp, mode)
    j.wait()
    results = [(ctx.tmp / f"result{r}.txt").read_text() for r in range(2) if (ctx.tmp / f"result{r}.txt").exists()]
    check(j.rc == 0 and len(results) == 2, f"status {j.rc}; stdout: {j.out[-800:]}; stderr: {j.err[-800:]}")
    check("Traceback" not in j.err, f"a traceback: {j.err[-800:]}")
    # every committed checkpoint still matches the digests its index records
    from cotsdl.io import checkpoint
    for c in committed(ck):
        reason = checkpoint.verify(c, None, True)
        if reason is not None:
            n = sum(p.stat().st_size for p in c.iterdir())
            ctx.lost += n
            raise CaseFailed(f"{c.name} no longer verifies: {reason}")
    return j


def case_nonfinite_once_skipped_on_every_rank(ctx):
    _nonfinite(ctx, "once")


def case_nonfinite_repeated_stops_with_checkpoint_intact(ctx):
    j = _nonfinite(ctx, "repeat")
    ctx.note_exit(j.t_end - j.t0)  # an upper bound: from the start of the job
    results = [(ctx.tmp / f"result{r}.txt").read_text() for r in range(2)]
    check(all("ckpt-000000010" in r for r in results), f"results: {results}")


# ---------------------------------------------------------------- driver

from . import disks, inputs, liveness  # noqa: E402 - the cases of rounds two and three, by what they break

CASES = [(name[5:], fn) for space in (globals(), vars(inputs), vars(disks), vars(liveness))
         for name, fn in list(space.items())
         if name.startswith("case_") and callable(fn)]


def main(argv):
    wanted = set(argv)
    cases = [(n, f) for n, f in CASES if not wanted or n in wanted]
    passed = hangs = skipped = 0
    worst = 0.0
    lost = 0
    t_suite = time.monotonic()
    for name, fn in cases:
        tmp = Path(tempfile.mkdtemp(prefix=f"cotsdl-rel-{name}-"))
        ctx = Ctx(tmp)
        t0 = time.monotonic()
        try:
            fn(ctx)
            print(f"PASS {name} {time.monotonic() - t0:.1f} s", flush=True)
            passed += 1
            shutil.rmtree(tmp, ignore_errors=True)
        except CaseSkipped as e:
            skipped += 1
            print(f"SKIP {name}: {e}", flush=True)
            shutil.rmtree(tmp, ignore_errors=True)
        except Hang as e:
            hangs += 1
            print(f"HANG {name}: {e} (files kept in {tmp})", flush=True)
        except CaseFailed as e:
            print(f"FAIL {name}: {e} (files kept in {tmp})", flush=True)
        except Exception as e:  # a bug in the case itself is a failure too
            print(f"FAIL {name}: {type(e).__name__}: {e}\n{traceback.format_exc()} (files kept in {tmp})", flush=True)
        finally:
            for job in list(Job.live):
                job.kill()
                Job.live.remove(job)
        if ctx.exit_time is not None:
            worst = max(worst, ctx.exit_time)
        lost += ctx.lost
    for ref in _REFS.values():
        shutil.rmtree(ref.parent, ignore_errors=True)
    print(f"(suite wall time {time.monotonic() - t_suite:.1f} s)", flush=True)
    print(f"reliability: {len(cases)} cases, {passed} passed, " + (f"{skipped} skipped, " if skipped else "")
          + f"{hangs} hangs, worst exit {worst:.1f} s, {lost} bytes lost", flush=True)
    return 0 if passed + skipped == len(cases) and hangs == 0 and lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
