"""Reliability cases: full disks (a file-size limit, and a real 2 MiB tmpfs where root may mount one)
and prepare-data stopped by a signal.  Collected by ``run.py``."""
import contextlib
import os
import signal
import subprocess
import time

import numpy as np

from cotsdl.io.dataset import write_dataset

from .harness import (CaseFailed, CaseSkipped, HERE, Job, PY, account, check, committed, cotsdl_run, expect_error,
                      snapshot, wait_for)


@contextlib.contextmanager
def tiny_disk(ctx):
    """A 2 MiB tmpfs at ``ctx.tmp/disk`` (root only; otherwise the case is skipped), unmounted after."""
    disk = ctx.tmp / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
                                           capture_output=True).returncode:
        raise CaseSkipped("needs root to mount a 2 MiB tmpfs (the file-size-limit cases cover the rest)")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def case_disk_full_during_stats(ctx):
    """prepare-data stats on a full disk: one message, exit 1, the dataset byte for byte as it was."""
    data = ctx.tmp / "big.h5"
    write_dataset(data, np.random.default_rng(0).integers(0, 256, (300, 32, 32), dtype=np.uint8))
    before = snapshot(ctx.tmp)
    limit = data.stat().st_size // 2  # the copy the statistics are written into cannot be completed
    j = Job([PY, str(HERE / "fsize_limited.py"), str(limit), "prepare-data", "stats", str(data), "--force"],
            ctx.tmp, "stats")
    j.wait()
    expect_error(ctx, j, "the file is unchanged", status=1)
    check(not [p.name for p in ctx.tmp.iterdir() if p.name.startswith(".big.h5")], "a temporary copy is left")
    account(ctx, before)
    ok = cotsdl_run(ctx.tmp, ["inspect", str(data)], ranks=1, name="inspect")
    check(ok.rc == 0, f"the dataset no longer inspects clean ({ok.rc}): {ok.out[-400:]} {ok.err[-400:]}")


def case_disk_really_full_during_checkpoint(ctx):
    """A real full disk (ENOSPC from a 2 MiB tmpfs; root only): one message, exit 1, no traceback or
    signal, every committed checkpoint still verifies, and the run resumes once there is room."""
    from cotsdl.io import checkpoint

    with tiny_disk(ctx) as disk:
        ctx.data(size=16)
        cfg = ctx.config(run="disk/run", steps=40, every=2, size=16, c0=16, c1=8)
        j = cotsdl_run(ctx.tmp, ["train", cfg], name="full")
        check(j.rc == 1, f"exit status {j.rc} on a full disk, expected 1; stderr: {j.err[-600:]}")
        lines = [ln for ln in j.err.splitlines() if ln.startswith("cotsdl: error")]
        check(len(lines) == 1 and "No space left on device" in lines[0], f"not one clear message: {j.err[-800:]}")
        check("Traceback" not in j.err and "Segmentation" not in j.err, f"a traceback or crash: {j.err[-800:]}")
        ckpts = committed(disk / "run")
        check(ckpts, "no checkpoint was committed before the disk filled")
        bad = [f"{c.name}: {r}" for c in ckpts if (r := checkpoint.verify(c)) is not None]
        check(not bad, f"committed checkpoints damaged: {bad}")
        check(not list((disk / "run" / "checkpoints").glob(".ckpt-*.partial")), "a .partial folder is left")
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # room again
        again = cotsdl_run(ctx.tmp, ["train", cfg], name="again")
        check(again.rc == 0 and f"resumed from {ckpts[-1]}" in again.out,
              f"no resume once there was room ({again.rc}): {again.err[-600:]}")


def case_disk_really_full_for_prepare_data(ctx):
    """A dataset too big for the disk is refused before a byte is written (free space checked first)."""
    with tiny_disk(ctx) as disk:
        j = Job([PY, "-m", "cotsdl", "prepare-data", "synthetic", str(disk / "x.h5"), "--count", "20000", "--size",
                 "32", "32"], ctx.tmp, "prep")
        j.wait()
        expect_error(ctx, j, "only", 1)
        check("MiB are free in" in j.err, f"the message does not say what is free: {j.err[-400:]}")
        check(not list(disk.iterdir()), f"left behind: {[p.name for p in disk.iterdir()]}")


def case_prepare_data_sigterm(ctx):
    """prepare-data stopped by SIGTERM while writing: one message, 143, no partial file left behind."""
    out = ctx.tmp / "big.h5"
    j = Job([PY, "-m", "cotsdl", "prepare-data", "synthetic", str(out), "--count", "400000", "--size", "32", "32"],
            ctx.tmp, "prep")
    if not wait_for(lambda: any(p.name.endswith(".partial") for p in ctx.tmp.iterdir()), j, timeout=60):
        j.kill()
        j.wait()
        raise CaseFailed(f"no partial file appeared (status {j.rc}): {j.err[-400:]}")
    time.sleep(0.3)
    t = time.monotonic()
    j.proc.send_signal(signal.SIGTERM)
    j.wait()
    ctx.note_exit(j.t_end - t)
    expect_error(ctx, j, "stopped by SIGTERM: nothing was written", 128 + signal.SIGTERM)
    left = [p.name for p in ctx.tmp.iterdir() if p.name.endswith(".partial") or p.name == "big.h5"]
    check(not left, f"left behind: {left}")
