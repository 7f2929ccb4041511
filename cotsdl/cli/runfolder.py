"""A run folder as ``cotsdl train`` keeps it: what it holds, its lock, its log, its summary.

``config.toml`` (the resolved config), ``checkpoints/``, ``metrics.jsonl``, ``log.txt``,
``summary.json`` once every stage is trained, ``.lock`` (io/runlock.py) and
``.watchdog/`` (cli/watchdog.py).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..io.atomic import Appender, DiskError, as_error, write_atomic
from . import config as cfgmod
from .run import RunSpec


class Tee:
    """Rank 0's log: the terminal and ``log.txt`` (progress-bar updates only on the terminal)."""

    def __init__(self, path: Path):
        self.file: Appender | None = Appender(path)
        self.pending = ""  # print() writes a line and its newline separately: the log gets whole lines

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        if self.file is not None and not text.startswith("\r"):
            self.pending += text
            cut = self.pending.rfind("\n") + 1
            if not cut:
                return
            line, self.pending = self.pending[:cut], self.pending[cut:]
            try:
                self.file.append(line)
            except OSError as e:  # rank 0 alone: the log is a copy of the terminal; keep training
                self.file = None
                print(f"warning: {e}; the log is no longer written", file=sys.stderr, flush=True)

    def flush(self) -> None:
        sys.stdout.flush()

    def isatty(self) -> bool:
        return sys.stdout.isatty()

    def close(self) -> None:
        if self.file is not None:
            try:
                if self.pending:  # a last line without its newline
                    self.file.append(self.pending + "\n")
            except OSError:
                pass  # the appender left the log as it was; the terminal has the line
            self.file.close()


def inspect_run(spec: RunSpec) -> tuple[str | None, dict | None]:
    """(error, saved checkpoint meta) of an existing run folder; rank 0 only."""
    from ..io import checkpoint  # noqa: PLC0415

    folder = spec.folder
    if folder.exists() and not folder.is_dir():
        return f"run.folder {folder} exists and is not a folder", None
    if not folder.exists():
        return None, None
    names = {p.name for p in folder.iterdir()} - {".lock", ".watchdog"}  # an earlier run's lock, watchdog files
    if names and "config.toml" not in names:
        return (f"run.folder {folder} is not empty and holds no config.toml, so it is not a cotsdl run folder "
                f"(it holds: {', '.join(sorted(names)[:5])}); choose another run.folder"), None
    latest, skipped = checkpoint.latest_verified(folder / "checkpoints", deep=False)  # the trainer checks sums
    if latest is None:
        if skipped:  # never start over silently on top of a run's damaged checkpoints
            return (f"run.folder {folder}: no checkpoint can be resumed: " + "; ".join(skipped)
                    + ". Move them away to start the run again"), None
        return None, None
    from ..train.state import META_KEYS  # noqa: PLC0415

    try:
        meta = checkpoint.read_index(latest, META_KEYS)["meta"]
    except ValueError as e:
        return f"run.folder {folder}: {e}", None
    if meta["stage"] == len(spec.network.stages) - 1:  # the run may be complete: trust sums, not sizes
        deep, _ = checkpoint.latest_verified(folder / "checkpoints", deep=True)
        if deep is None:
            return f"run.folder {folder}: no checkpoint verifies against its checksums", None
        if deep != latest:  # the trainer skips the damaged ones the same way, and says so
            latest = deep
            try:
                meta = checkpoint.read_index(latest, META_KEYS)["meta"]
            except ValueError as e:
                return f"run.folder {folder}: {e}", None
    # what defines the model cannot change within a run (lam, the optimizer's settings, steps can)
    saved = {"network": meta["network"], "train": {"tied": meta["tied"], "dtype": meta["dtype"]},
             "data": {"input_lcn": (meta.get("data") or {}).get("input_lcn")}}
    given = {"network": spec.network.describe(), "train": {"tied": spec.train.tied, "dtype": spec.train.dtype.name},
             "data": {"input_lcn": spec.data.input_lcn}}
    diff = cfgmod.diff(saved, given)
    if diff:
        return (f"the config's model differs from the one trained in {folder} (checkpoint {latest.name}):\n  "
                + "\n  ".join(diff) + "\nuse a new run.folder, or undo the change to resume"), None
    meta["_path"] = str(latest)
    return None, meta


def run_summary(folder: Path, nstages: int, wall: float, history: list[dict]) -> dict[str, Any]:
    """Per-stage loss first -> last (from metrics.jsonl: the whole run, every session) and speed."""
    recs = []
    try:
        with open(folder / "metrics.jsonl") as f:
            recs = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        recs = []
    recs = recs or history  # train.log_every = 0 logs nothing
    stages = []
    for k in range(nstages):  # first: the stage's first step; last: the mean over the last logged window
        rs = [r for r in recs if r.get("stage") == k]
        first, last = (rs[0], rs[-1]) if rs else ({}, {})
        stages.append({"stage": k, "steps": last.get("stage_step", 0),
                       "first_loss": first.get("loss"), "last_loss": last.get("loss_mean", last.get("loss")),
                       "first_reconstruction": first.get("reconstruction"),
                       "last_reconstruction": last.get("reconstruction_mean", last.get("reconstruction")),
                       "last_mean_over_steps": last.get("mean_over", 1 if rs else 0)})
    speeds = sorted(r["images_per_s"] for r in history)
    return {"stages": stages, "session_seconds": wall, "session_steps": len(history),
            "images_per_s_median": speeds[len(speeds) // 2] if speeds else None}


def filter_diagnostics(folder: Path, this_session: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each finished stage's end-of-stage filter diagnostics: from metrics.jsonl (every session of the
    run: the stage's last record that has them), this session's where the log has none."""
    found: dict[int, dict[str, Any]] = {}
    try:
        with open(folder / "metrics.jsonl") as f:
            for line in f:
                r = json.loads(line) if line.strip() else {}
                if r.get("filter_stats"):  # the trainer's end-of-stage record
                    found[r["stage"]] = r
    except (OSError, ValueError):
        pass
    from ..nn.stage_stats import STAGE_KEYS  # noqa: PLC0415

    out = {k: {key: r[key] for key in STAGE_KEYS if key in r} for k, r in found.items()}
    out.update(this_session)
    return [{"stage": k, **v} for k, v in sorted(out.items())]


def trim_metrics(path: Path, step: int) -> None:
    """Drop the records of steps after the checkpoint a run restarts from (they are trained again)."""
    if not path.exists():
        return
    with open(path) as f:
        lines = f.readlines()
    keep = []
    for line in lines:
        try:
            if json.loads(line)["step"] <= step:
                keep.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a kill
    if len(keep) != len(lines):
        write_atomic(path, "".join(keep))


def acquire_lock(lock) -> str | DiskError | None:
    """None (held), the refusal or a bad folder (a message: exit 2), or the machine's failure (a DiskError)."""
    try:
        return lock.acquire()
    except OSError as e:
        return as_error(e, f"run.folder {lock.path.parent}: cannot lock {lock.path.name}: {e.strerror or e}")


def report(folder: Path, network, tr, backend_name: str, ranks: int, wall: float, say) -> None:
    """summary.json and the closing lines (rank 0; a failed write is a warning, training is done)."""
    summary = run_summary(folder, len(network.stages), wall, tr.history)
    summary["filter_diagnostics"] = filter_diagnostics(folder, tr.stage_stats)
    summary.update({"run": str(folder), "config": str(folder / "config.toml"), "step": tr.step,
                    "checkpoint": str(tr.latest_checkpoint()), "ranks": ranks,
                    "grid": list(tr.decomposition.grid.dims), "replicas": tr.replicas, "backend": backend_name})
    try:
        write_atomic(folder / "summary.json", json.dumps(summary, indent=2) + "\n")
    except OSError as e:
        say(f"warning: cannot write {folder / 'summary.json'}: {e.strerror or e}")
    say(f"done: {len(network.stages)} stage(s) in {wall:.1f} s this session, global step {tr.step}")
    for line in stage_lines(summary):
        say(line)
    say(f"  run folder {folder}: config.toml, checkpoints/, metrics.jsonl, log.txt, summary.json")


def stage_lines(summary: dict[str, Any]) -> list[str]:
    out = [f"  stage {s['stage']}: loss {s['first_loss']:.4g} -> {s['last_loss']:.4g} (reconstruction "
           f"{s['first_reconstruction']:.4g} -> {s['last_reconstruction']:.4g}), {s['steps']} steps (first logged "
           f"step -> mean of the last {s['last_mean_over_steps']})" for s in summary["stages"] if s["first_loss"] is not None]
    if summary.get("images_per_s_median"):
        out.append(f"  {summary['images_per_s_median']:.1f} images/s (median step of the last session)")
    return out
