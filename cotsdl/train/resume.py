"""The steps of continuing a run from a checkpoint (:meth:`GreedyTrainer.resume` composes them).

Find the checkpoint that verifies, choose the layout on the ranks at hand, say which
boxes of which arrays this rank needs, then restore weights, stream position and
optimizer state.  Every step is collective over the ranks that resume.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from mpi4py import MPI

from ..array.box import Box
from ..array.collective import raise_collectively
from ..io import checkpoint
from .schedules import describe as schedules_describe

if TYPE_CHECKING:  # pragma: no cover
    from .trainer import GreedyTrainer


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


def choose_layout(meta: dict[str, Any], comm: MPI.Comm, batch: int | None, replicas: int | None,
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


def wanted_boxes(tr: "GreedyTrainer", meta: dict[str, Any]) -> dict[str, Box]:
    """The box of every saved array this rank holds in the new layout."""
    wanted = {}
    for li in tr.filter_layers:
        wanted[f"w/{li}"] = tr.plan.weight_box(li)[1]
        if not tr.tied:
            wanted[f"w_dec/{li}"] = tr.plan.weight_box(li)[1]
    opt = meta["optimizer"]
    if opt is not None:
        stage_box = tr.plan.weight_box(tr.filter_layers[meta["stage"]])[1]
        for pname, slots in opt["slot_names"].items():
            for slot in slots:
                wanted[f"opt/{pname}/{slot}"] = stage_box
    return wanted


def restore_weights_and_position(tr: "GreedyTrainer", meta: dict[str, Any], arrays: dict[str, Any]) -> None:
    """Weights, stage, steps and the data stream's position as saved."""
    for li in tr.filter_layers:
        tr.params[li] = tr.xp.asarray(arrays[f"w/{li}"])
        if not tr.tied:
            tr.decoders[li] = tr.xp.asarray(arrays[f"w_dec/{li}"])
    tr.stage, tr.stage_step = meta["stage"], meta["stage_step"]
    tr.position, tr.step, tr.skipped = meta["position"], meta["step"], meta["skipped"]
    tr.bad_in_row, tr._saved_step = meta.get("bad_in_row", 0), meta["step"]
    saved_seed = meta.get("data", {}).get("seed")
    if saved_seed is not None and getattr(tr.data, "seed", saved_seed) != saved_seed:
        tr._say(f"note: the data source's seed {getattr(tr.data, 'seed')} differs from the saved {saved_seed}: "
                "the image stream will not continue as before")


def restore_optimizer(tr: "GreedyTrainer", opt: dict[str, Any], arrays: dict[str, Any], comm: MPI.Comm) -> None:
    """The current stage's optimizer with its saved slots, schedule and hyper-parameters; a different
    kind of optimizer is refused."""
    tr._begin_stage(tr.stage)
    err = None if opt["kind"] == type(tr.optimizer).__name__ else (
        f"the checkpoint was trained with {optimizer_name(opt['kind'], opt['hyper'])}, the optimizer given "
        f"is {optimizer_name(type(tr.optimizer).__name__, tr.optimizer.hyper())}: resume with the same kind")
    raise_collectively(comm, err)
    state = {k: v for k, v in opt.items() if k != "slot_names"}
    state["slots"] = {n: {s: tr.xp.asarray(arrays[f"opt/{n}/{s}"]) for s in slots}
                      for n, slots in opt["slot_names"].items()}
    given = (schedules_describe(tr.optimizer.schedule), tr.optimizer.hyper())
    tr.optimizer.load_state_dict(state)
    if given != (state["schedule"], state["hyper"]):
        tr._say("note: the saved optimizer schedule and hyper-parameters are restored "
                f"({state['schedule']}, {state['hyper']}), not the ones of the optimizer given")
