"""The decisions of continuing a run (:meth:`GreedyTrainer.resume` composes them).

Which checkpoint, which layout on the ranks at hand, which optimizer and settings
apply, and what changed.  Every step that can fail is collective over the ranks that
resume; nothing here touches a trainer.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from mpi4py import MPI

from ..array.collective import raise_collectively
from ..io import checkpoint
from . import optim


def optimizer_name(kind: str, hyper: dict[str, Any]) -> str:
    """SGD with momentum is the paper's Momentum: say so rather than "SGD"."""
    if kind == "SGD" and hyper.get("momentum"):
        return "Nesterov" if hyper.get("nesterov") else f"Momentum (SGD with momentum {hyper['momentum']})"
    return kind


def find_checkpoint(path: Path, comm: MPI.Comm) -> tuple[Path, list[str]]:
    """The checkpoint to resume from: ``path`` itself if it is one (it must verify), else the newest
    one in the folder ``path`` that verifies; and the reasons the newer ones were skipped."""
    if (path / "index.json").is_file():
        reason = checkpoint.verify(path, comm)
        raise_collectively(comm, None if reason is None else f"cannot resume from {path}: {reason}")
        return path, []
    found, skipped = checkpoint.latest_verified(path, comm)
    raise_collectively(comm, None if found else f"no completed checkpoint that verifies in {path}"
                       + "".join(f"; {s}" for s in skipped))
    return found, skipped


def choose_decomposition(meta: dict[str, Any], comm: MPI.Comm, batch: int | None, replicas: int | None,
                  grid: Sequence[int] | None) -> tuple[int, int, Sequence[int] | None]:
    """(batch, replicas, grid) on the ranks of ``comm``: the saved layout when the rank count is the
    saved one (a bitwise-identical continuation), else as :meth:`GreedyTrainer.resume` documents."""
    saved_grid = tuple(meta["grid"])
    if grid is None and replicas is None and comm.Get_size() == meta["replicas"] * saved_grid[0] * saved_grid[1]:
        grid, replicas = saved_grid, meta["replicas"]
    if replicas is None:
        if grid is not None:
            replicas = max(1, comm.Get_size() // (int(grid[0]) * int(grid[1])))
        else:
            replicas = meta["replicas"] if comm.Get_size() % meta["replicas"] == 0 else 1
    if batch is None:
        total = meta["batch"] * meta["replicas"]
        raise_collectively(comm, None if total % replicas == 0 else
                           f"the saved global batch {total} does not split over {replicas} replicas: pass batch=")
        batch = total // replicas
    return batch, replicas, grid


def saved_optimizer(meta: dict[str, Any], given: optim.Optimizer | None) -> tuple[optim.Optimizer | None, str | None]:
    """A fresh optimizer with the checkpoint's kind, hyper-parameters and schedule (None if none was
    saved), and why it cannot continue the run when nothing else is ``given`` (a schedule refused
    since it was saved, as a warm-up past its decay's end)."""
    opt = meta.get("optimizer")
    try:
        return (None if opt is None else optim.from_state(opt["kind"], opt["hyper"], opt["schedule"])), None
    except ValueError as e:
        return None, None if given is not None else (f"the checkpoint's optimizer cannot continue: {e}; pass an "
                                                     "optimizer (the CLI: the config's train.schedule)")


def template_error(meta: dict[str, Any], given: optim.Optimizer | None) -> str | None:
    """Why ``given`` cannot continue the checkpoint's optimizer (another kind, or none to continue)."""
    opt = meta.get("optimizer")
    if given is None:
        return None if opt is not None else "the checkpoint holds no optimizer state: pass an optimizer"
    if opt is not None and opt["kind"] != type(given).__name__:
        return (f"the checkpoint was trained with {optimizer_name(opt['kind'], opt['hyper'])}, the optimizer given "
                f"is {optimizer_name(type(given).__name__, given.hyper())}: resume with the same kind")
    return None


def settings_of(optimizer: optim.Optimizer | None, lam: float, filter_norm: list[float | None]) -> dict[str, Any]:
    """The settings a resume may change, keyed by their config names."""
    return {"train.lam": float(lam), "train.filter_norm": list(filter_norm),
            **(optim.settings(optimizer) if optimizer is not None else {})}


def filter_norm_error(saved: list[float | None], given: list[float | None], stage: int) -> str | None:
    """A finished stage's filter norm is part of its trained weights: it cannot change."""
    bad = [k for k in range(min(stage, len(saved))) if saved[k] != given[k]]
    if not bad:
        return None
    return (f"train.filter_norm of the finished stage(s) {bad} differs from the one they were trained at "
            f"({[saved[k] for k in bad]} -> {[given[k] for k in bad]}): undo that change to resume")


def changes(saved: dict[str, Any], given: dict[str, Any], source: str) -> list[str]:
    """One line per setting that differs: ``key: old (checkpoint) -> new (source)``."""
    def show(v: Any) -> str:
        return json.dumps([None if x is None else round(x, 6) for x in v] if isinstance(v, list) else v)

    return [f"{k}: {show(saved.get(k))} (checkpoint) -> {show(given.get(k))} ({source})"
            for k in sorted(set(saved) | set(given)) if saved.get(k) != given.get(k)]
