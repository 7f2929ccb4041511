"""Reliability cases: full disks (a file-size limit, and a real 2 MiB tmpfs where root may mount one)
and prepare-data stopped by a signal.  Collected by ``run.py``."""
import contextlib
import json
import os
import signal
import subprocess
import time

import numpy as np

from cotsdl.io.dataset import write_dataset

from .harness import (CaseFailed, CaseSkipped, HERE, Job, PY, _sha, account, check, committed, cotsdl_run,
                      expect_error, snapshot, wait_for)


@contextlib.contextmanager
def tiny_disk(ctx, size="2m"):
    """A small tmpfs at ``ctx.tmp/disk`` (root only; otherwise the case is skipped), unmounted after."""
    disk = ctx.tmp / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                                           capture_output=True).returncode:
        raise CaseSkipped(f"needs root to mount a {size} tmpfs (the file-size-limit cases cover the rest)")
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
        whole_lines(disk / "run" / "metrics.jsonl", disk / "run" / "log.txt")
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # room again
        again = cotsdl_run(ctx.tmp, ["train", cfg], name="again")
        check(again.rc == 0 and f"resumed from {ckpts[-1]}" in again.out,
              f"no resume once there was room ({again.rc}): {again.err[-600:]}")


def whole_lines(*logs):
    """A log appended to on a full disk holds whole lines only (a failed append is undone)."""
    for log in logs:
        text = log.read_text()
        check(not text or text.endswith("\n"), f"{log.name} ends in the middle of a line: {text[-200:]!r}")
        if log.suffix == ".jsonl":
            for n, line in enumerate(text.splitlines(), 1):
                try:
                    json.loads(line)
                except ValueError:
                    raise CaseFailed(f"{log.name} line {n} is not a whole record: {line[:200]!r}") from None


def fill(disk):
    """Fill the file system of ``disk`` to the last byte (a file that grows until ENOSPC)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        block = b"\0" * (1 << 16)
        for size in (1 << 16, 4096, 1):
            try:
                while True:
                    f.write(block[:size])
            except OSError:
                pass
    return filler


def every_file(root, skip):
    return {p: (p.stat().st_size, _sha(p)) for p in sorted(root.rglob("*")) if p.is_file() and p != skip}


def case_disk_really_full_for_every_writer(ctx):
    """Every command that writes a user's file, run on a disk filled to the last byte (a 64 MiB tmpfs;
    root only): one message naming the disk, exit 1, every earlier file byte for byte as it was, no
    temporary left; with room again, the run resumes."""
    with tiny_disk(ctx, "64m") as disk:
        data = ctx.data(size=12)
        labeled = disk / "faces.h5"
        rng = np.random.default_rng(3)
        y = (np.arange(40) % 2).astype(np.int64)
        faces = rng.integers(0, 256, (40, 12, 12), dtype=np.uint8)
        faces[y == 1, 3:9, 3:9] = 255
        write_dataset(labeled, faces, labels=y)
        cfg = ctx.config(data=data, run="disk/run", steps=4, every=2)
        ev = ["evaluate", str(disk / "run"), "--dataset", str(labeled), "--splits", "2", "--bootstrap", "100",
              "--stimulus-steps", "2"]
        for args in (["train", str(cfg)], ev, ["plan", str(cfg), "--json", str(disk / "plan.json")]):
            j = cotsdl_run(ctx.tmp, args, ranks=1, name="before")
            check(j.rc == 0, f"{args[0]} with room failed ({j.rc}): {j.err[-600:]}")
        filler = fill(disk)
        before = every_file(disk, filler)
        writers = {
            "train (a longer run: config.toml, log, metrics, checkpoints)": ["train", str(cfg), "--set",
                                                                             "train.steps=[4, 6]"],
            "evaluate (report.json, report.md, figures)": ev,
            "plan --json": ["plan", str(cfg), "--json", str(disk / "plan.json")],
            "prepare-data stats": ["prepare-data", "stats", str(labeled), "--force"],
            "prepare-data synthetic": ["prepare-data", "synthetic", str(disk / "new.h5"), "--count", "10", "--size",
                                       "12", "12"],
        }
        for what, args in writers.items():
            j = cotsdl_run(ctx.tmp, args, ranks=1, name=args[0])
            try:
                check(j.rc == 1, f"exit status {j.rc}, expected 1; stderr: {j.err[-600:]}")
                lines = [ln for ln in j.err.splitlines() if ln.startswith("cotsdl: error")]
                check(len(lines) == 1 and "No space left on device" in lines[0],
                      f"not one message that says the disk is full: {j.err[-800:]}")
                check("Traceback" not in j.err and "Segmentation" not in j.err, f"a traceback or crash: {j.err[-800:]}")
            except CaseFailed as e:
                raise CaseFailed(f"{what}: {e}") from None
            now = every_file(disk, filler)
            changed = [str(p.relative_to(disk)) for p in set(before) | set(now) if before.get(p) != now.get(p)]
            check(not changed, f"{what} on a full disk changed or left files: {changed}")
        filler.unlink()
        again = cotsdl_run(ctx.tmp, writers["train (a longer run: config.toml, log, metrics, checkpoints)"], ranks=1,
                           name="again")
        check(again.rc == 0 and "resumed from" in again.out, f"no resume once there was room ({again.rc}): "
                                                             f"{again.err[-600:]}")
        whole_lines(disk / "run" / "metrics.jsonl", disk / "run" / "log.txt")


def case_disk_really_full_for_prepare_data(ctx):
    """A dataset too big for the disk is refused before a byte is written (free space checked first)."""
    with tiny_disk(ctx) as disk:
        j = Job([PY, "-m", "cotsdl", "prepare-data", "synthetic", str(disk / "x.h5"), "--count", "20000", "--size",
                 "32", "32"], ctx.tmp, "prep")
        j.wait()
        expect_error(ctx, j, "No space left on device", 1)
        check("MiB free in" in j.err and "MiB needed" in j.err, f"the message does not say what is free: {j.err[-400:]}")
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
