"""A config and its ``--set`` overrides become the run's typed objects, once.

``cotsdl train``, ``bench scaling``, ``plan``, ``inspect`` and ``evaluate`` all take a
:class:`RunSpec`: the resolved config (``config.toml`` of a run folder) and, built
from it, the network, the data, training and parallel settings, the optimizer
factory, the run folder and the backend.  Everything a config alone decides is
checked here; :func:`read_agreed` reads the file on rank 0 only and every rank
builds the same objects from the broadcast result, or raises the same error.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..nn.network import Network
from ..train import optim
from . import config as cfgmod


@dataclass(frozen=True)
class DataSpec:
    """``[data]``: the dataset and how its images are read and preprocessed."""

    file: str
    batch: int
    seed: int
    shuffle: bool
    preprocess: str
    std_floor: float
    prefetch: bool
    input_lcn: dict[str, Any] | None  # {size, sigma, eps}, or None: off


@dataclass(frozen=True)
class ParallelSpec:
    """``[parallel]``: replicas x model grid (None: chosen for the image), overlap (True, False or
    "auto": decided by the run planner, :func:`cotsdl.planner.overlap.choose_overlap`) and the
    replicas' gradient reduction (:data:`cotsdl.train.allreduce.REDUCTIONS`)."""

    replicas: int
    grid: tuple[int, int] | None
    overlap: bool | str
    reduction: str = "auto"
    #: ``parallel.fuse``: "auto", "on", "off" or stage indices (:mod:`cotsdl.planner.fuse`)
    fuse: Any = "auto"
    #: ``parallel.fuse_filter``: "auto", "on", "off" or stage indices (fused ones; :mod:`cotsdl.planner.fuse`)
    fuse_filter: Any = "auto"

    def error(self, ranks: int, source: str) -> str | None:
        """Why this layout does not fit ``ranks`` ranks (None: it does)."""
        if ranks % self.replicas:
            return f"{source}: parallel.replicas = {self.replicas} does not divide the {ranks} rank(s) of this run"
        if self.grid is not None and self.grid[0] * self.grid[1] * self.replicas != ranks:
            return (f"{source}: parallel.grid = {list(self.grid)} with parallel.replicas = {self.replicas} needs "
                    f"{self.grid[0] * self.grid[1] * self.replicas} rank(s), this run has {ranks}")
        return None


@dataclass(frozen=True)
class TrainSpec:
    """``[train]``: steps or epochs per stage, the objective's and the trainer's settings."""

    steps: list[int] | None
    epochs: list[float] | None
    lam: float
    tied: bool
    filter_norm: list[Any]  # per stage: a number, "auto" or None (unconstrained)
    seed: int
    dtype: np.dtype
    checkpoint_every: int
    keep: int
    log_every: int
    max_bad_steps: int
    optimizer: dict[str, Any]
    schedule: dict[str, Any]

    def make_optimizer(self) -> optim.Optimizer:
        """A fresh optimizer (with its schedule) of these settings."""
        return optim.from_config(self.optimizer, self.schedule)

    @property
    def optimizer_slots(self) -> int:
        return optim.slot_count(self.optimizer)


@dataclass(frozen=True)
class RunSpec:
    """Everything a config file decides, checked."""

    source: str
    config: dict[str, Any]
    network: Network
    data: DataSpec
    train: TrainSpec
    parallel: ParallelSpec
    folder: Path
    backend: str
    threads: int
    graph: bool = False

    @property
    def global_batch(self) -> int:
        return self.data.batch * self.parallel.replicas


def input_lcn(dc: dict[str, Any]) -> dict[str, Any] | None:
    """A resolved ``[data]`` table's ``input_lcn`` as recorded in checkpoints ({size, sigma, eps}; None: off)."""
    lcn = dc.get("input_lcn") or {}
    return {"size": int(lcn["size"]), "sigma": float(lcn["sigma"]), "eps": float(lcn["eps"])} if lcn.get("size") else None


def from_config(cfg: dict[str, Any], source: str) -> RunSpec:
    """The typed objects of a resolved config (``config.validate``), or :class:`config.ConfigError`."""
    try:
        network = Network.from_description({k: v for k, v in cfg["network"].items() if k != "allow_crop"})
    except ValueError as e:
        raise cfgmod.ConfigError(f"{source}: network: {e}") from None
    cropped = network.unused_input()
    if cropped and not cfg["network"].get("allow_crop"):
        li, rows, cols = cropped[0]
        stage, kind = network.roles[li]
        h, w = network.shapes[li][:2]
        raise cfgmod.ConfigError(
            f"{source}: network.stages[{stage}].{kind}: its {'x'.join(map(str, network.layers[li].rf.window))} windows "
            f"at stride {'x'.join(map(str, network.layers[li].rf.stride))} over a {h}x{w} input leave {rows} row(s) "
            f"and {cols} column(s) unread; choose a size and stride that tile the input, or set "
            "network.allow_crop = true to drop them")
    dc, tc, pc, rc = cfg["data"], cfg["train"], cfg["parallel"], cfg["run"]
    data = DataSpec(dc["file"], dc["batch"], dc["seed"], dc["shuffle"], dc["preprocess"], float(dc["std_floor"]),
                    dc["prefetch"], input_lcn(dc))
    train = TrainSpec(tc["steps"], tc["epochs"], float(tc["lam"]), tc["tied"],
                      [None if v == "none" else v if v == "auto" else float(v) for v in tc["filter_norm"]],
                      tc["seed"], np.dtype(tc["dtype"]), tc["checkpoint_every"], tc["keep"], tc["log_every"],
                      tc["max_bad_steps"], tc["optimizer"], tc["schedule"])
    try:
        train.make_optimizer()
    except ValueError as e:
        raise cfgmod.ConfigError(f"{source}: train.optimizer / train.schedule: {e}") from None
    parallel = ParallelSpec(pc["replicas"], None if pc["grid"] == "auto" else tuple(pc["grid"]), pc["overlap"],
                            pc["reduction"], pc["fuse"], pc["fuse_filter"])
    try:  # the stages of both, and fuse_filter's within fuse's, checked now (the trainer resolves them again)
        from ..planner.fuse import resolve, resolve_filter  # noqa: PLC0415

        resolve_filter(pc["fuse_filter"], len(network.stages), resolve(pc["fuse"], len(network.stages)))
    except ValueError as e:
        raise cfgmod.ConfigError(f"{source}: {e}") from None
    return RunSpec(str(source), cfg, network, data, train, parallel, Path(rc["folder"]), rc["backend"], rc["threads"],
                   rc["graph"])


def read(path: str | Path, overrides: list[str] = ()) -> RunSpec:
    """Read, override, validate and build a config file on this process."""
    return from_config(cfgmod.load(path, overrides), str(path))


def read_agreed(comm: Any, path: str | Path, overrides: list[str] = ()) -> RunSpec:
    """:func:`read` on every rank, then one agreement: every rank gets the same objects or raises
    the same :class:`ValueError` (collective over ``comm``).

    Each rank reads its own file and ``--set`` (an MPMD launch may give ranks different
    ones); the resolved configs must be equal, else the error names the ranks and the
    first keys that differ.
    """
    import hashlib  # noqa: PLC0415
    import json  # noqa: PLC0415

    from ..array.collective import agreed  # noqa: PLC0415 - MPI only for commands that use it

    cfg, err = None, None
    try:
        cfg = read(path, overrides).config
    except cfgmod.ConfigError as e:
        err = str(e)
    digest = None if cfg is None else hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()
    verdicts = comm.allgather((err, digest))
    first = next((e for e, _ in verdicts if e), None)
    if first:
        raise agreed(ValueError(first))
    if len({d for _, d in verdicts}) > 1:
        odd = next(r for r, (_, d) in enumerate(verdicts) if d != verdicts[0][1])
        theirs = comm.bcast(cfg if comm.Get_rank() == odd else None, root=odd)
        others = [r for r, (_, d) in enumerate(verdicts) if d != verdicts[0][1]]
        changes = cfgmod.diff(comm.bcast(cfg, root=0), theirs)
        raise agreed(ValueError(
            f"the ranks were given different configs (after --set): rank(s) {', '.join(map(str, others))} differ from "
            f"rank 0 (rank 0 -> rank {odd}: " + "; ".join(changes[:5]) + ("; ..." if len(changes) > 5 else "")
            + "). Start every rank with the same config file and --set options"))
    return from_config(cfg, str(path))
