"""Reliability cases of issue 38: runs that stopped being training end with exit 1, a message naming the
step, the stage and the likely setting, and their committed checkpoints intact (none written of the dead
state); a schedule that would train at rate 0 is refused, also on resume; a second SIGTERM ends a rank
blocked in MPI by a stopped peer at once.  Collected by ``run.py``."""
import os
import signal
import time

import numpy as np

from cotsdl.io.dataset import write_dataset

from .harness import CaseFailed, account, check, committed, cotsdl_run, expect_error, snapshot


def _first_run(ctx, size=12):
    """A healthy run of 3 + 3 steps, a checkpoint after each (the ones the faults must leave intact)."""
    ctx.data(size=size)
    cfg = ctx.config(steps=3, every=1, size=size)
    j = cotsdl_run(ctx.tmp, ["train", cfg], name="first")
    check(j.rc == 0, f"the first run failed ({j.rc}): {j.err[-800:]}")
    ckpts = committed(ctx.tmp / "run")
    check(len(ckpts) == 6, f"expected 6 checkpoints, found {[p.name for p in ckpts]}")
    return cfg, ckpts


def _dead(ctx, sets, message, likely):
    """Continue the healthy run with ``sets``: exit 1, one message, the checkpoints as they were."""
    cfg, ckpts = _first_run(ctx)
    before = snapshot(ctx.tmp)
    args = ["train", cfg]
    for s in sets:
        args += ["--set", s]
    j = cotsdl_run(ctx.tmp, args, name="dead")
    expect_error(ctx, j, message, 1)
    line = next(ln for ln in j.err.splitlines() if message in ln)
    check(likely in line, f"the message does not name {likely!r}: {line}")
    check(f"the last checkpoint, {ckpts[-1]}, is intact" in line, f"the intact checkpoint is not named: {line}")
    check(committed(ctx.tmp / "run") == ckpts, f"a checkpoint was written of the dead state: "
          f"{[p.name for p in committed(ctx.tmp / 'run')]}")
    account(ctx, before)


def case_learning_rate_1e30_stops_at_once(ctx):
    """It used to train to the end with exit 0: the projection divided by an overflowed norm, every filter
    at norm 0 after one step, a constant loss."""
    _dead(ctx, ["train.steps=[3, 6]", "train.optimizer.lr=1e30"],
          "cotsdl: error: training stopped at step 4 of stage 1 (global step 7): the update left",
          "train.optimizer.lr; this step's rate 1e+30")


def case_silent_stage_stops(ctx):
    """Constant images (0 once standardized): every unit of the stage is silent."""
    write_dataset(ctx.tmp / "flat.h5", np.full((40, 12, 12), 77, np.uint8))
    _dead(ctx, ["train.steps=[3, 30]", f"data.file={ctx.tmp / 'flat.h5'}"],
          "cotsdl: error: training stopped at step 13 of stage 1 (global step 16): every unit of the stage was silent",
          "the stages below give stage 1 a constant input")


def case_frozen_loss_stops(ctx):
    """One batch over and over at a rate whose updates are lost in the weights' rounding."""
    write_dataset(ctx.tmp / "four.h5", np.random.default_rng(3).integers(0, 256, (4, 12, 12), dtype=np.uint8))
    _dead(ctx, ["train.steps=[3, 30]", f"data.file={ctx.tmp / 'four.h5'}", "data.shuffle=false",
                "train.optimizer.lr=1e-30", "train.checkpoint_every=5"],
          "cotsdl: error: training stopped at step 13 of stage 1 (global step 16): the loss stayed at",
          "train.optimizer.lr; this step's rate 1e-30")


def case_schedule_at_rate_0_refused_on_resume(ctx):
    """A resume that shortens the schedule: a warm-up past the decay's end is refused when the config is
    read, steps past a decay to 0 before the first step; a valid one trains every step at a rate > 0."""
    import json

    cfg, ckpts = _first_run(ctx)
    before = snapshot(ctx.tmp)
    cosine = ["train.schedule.kind=cosine", "train.schedule.total_steps=5"]
    j = cotsdl_run(ctx.tmp, ["train", cfg, "--set", "train.steps=[3, 6]", *sum((["--set", s] for s in cosine), []),
                             "--set", "train.schedule.warmup_steps=50"], name="warmup")
    expect_error(ctx, j, "train.optimizer / train.schedule: warmup_steps = 50 must be less than total_steps = 5", 2)
    j = cotsdl_run(ctx.tmp, ["train", cfg, "--set", "train.steps=[3, 6]", *sum((["--set", s] for s in cosine), []),
                             "--set", "train.schedule.warmup_steps=2"], name="past")
    expect_error(ctx, j, "stage 1 would train at learning rate 0: the cosine schedule's rate is 0 from step 6 on", 2)
    check(committed(ctx.tmp / "run") == ckpts, "a refused resume wrote a checkpoint")
    account(ctx, before)
    j = cotsdl_run(ctx.tmp, ["train", cfg, "--set", "train.steps=[2, 6]", "--set", "train.schedule.kind=cosine",
                             "--set", "train.schedule.total_steps=6", "--set", "train.schedule.warmup_steps=2"],
                   name="valid")
    check(j.rc == 0, f"the valid resume failed ({j.rc}): {j.err[-800:]}")
    rates = [r["lr"] for r in map(json.loads, (ctx.tmp / "run" / "metrics.jsonl").read_text().splitlines())
             if r["step"] > 6]
    check(len(rates) == 3 and min(rates) > 0, f"the resumed steps' rates: {rates}")


def _gone(pid):
    """The process ended (a zombie until its parent reaps it counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def case_second_sigterm_while_a_peer_is_stopped(ctx):
    """Rank 1 stopped (SIGSTOP): rank 0 waits inside MPI, where Python runs no signal handler.  SIGTERM, then
    SIGTERM again past the 3 s grace: rank 0 ends at once (143), the launcher ends the stopped rank, every
    committed checkpoint is intact and the re-run resumes from the last one."""
    ctx.data()
    cfg = ctx.config(steps=400, every=50)
    run = ctx.tmp / "run"
    from .harness import cotsdl_job, wait_for

    job = cotsdl_job(ctx.tmp, ["train", cfg], 2, "faulted")
    if not wait_for(lambda: len(committed(run)) >= 1, job):
        job.kill()
        job.wait()
        raise CaseFailed(f"the run ended (status {job.rc}) or stalled before the fault could be injected")
    pids = job.ranks()
    check(set(pids) == {0, 1}, f"ranks not found under mpiexec (found {pids})")
    before = snapshot(ctx.tmp)
    try:
        os.kill(pids[1], signal.SIGSTOP)
        time.sleep(0.5)  # rank 0 reaches the step's next exchange with rank 1 and waits there
        os.kill(pids[0], signal.SIGTERM)
        time.sleep(3.5)  # past the grace: the next one is a second signal, not the same one forwarded twice
        check(not _gone(pids[0]), "rank 0 ended on the first SIGTERM (it should wait for the step to finish)")
        t = time.monotonic()
        os.kill(pids[0], signal.SIGTERM)
        while not _gone(pids[0]) and time.monotonic() - t < 5:
            time.sleep(0.01)
        took = time.monotonic() - t
        check(took < 2.0, f"rank 0 took {took:.1f} s to end after the second SIGTERM")
        rc = job.wait()
    finally:
        for pid in pids.values():  # whatever happened, nothing stays stopped
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    ctx.note_exit(job.t_end - t)
    check(rc == 143, f"exit status {rc}, expected 143; stderr: {job.err[-800:]}")
    check(job.err.count("cotsdl: second signal SIGTERM: exiting now; the last complete checkpoint is intact") == 1,
          f"no single second-signal message: {job.err[-800:]}")
    check("Traceback" not in job.err, f"a traceback: {job.err[-800:]}")
    account(ctx, before)
    last = committed(run)[-1]
    again = cotsdl_run(ctx.tmp, ["train", cfg, "--set", f"train.steps=[{int(last.name[5:]) + 2}, 0]"], 2, "resumed")
    check(again.rc == 0 and f"resumed from {last}" in again.out,
          f"the re-run did not resume from {last.name} ({again.rc}): {again.err[-600:]}")
