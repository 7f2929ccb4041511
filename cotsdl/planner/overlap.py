"""``parallel.overlap = "auto"``: overlap halo exchange with computation only where the model predicts a gain.

One decision for a run (every stage it trains), from what :func:`~cotsdl.planner.predict_step`
predicts for a step with and without overlap on a machine.  Used by ``cotsdl train`` and
``GreedyTrainer(overlap="auto")``, ``cotsdl plan`` and ``cotsdl bench scaling``, so that they
all choose alike.  No MPI: the callers decide on one rank and broadcast.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

import numpy as np

from ..nn.network import Network
from .machine import THIS_FILE, MachineError, default_machine, load_warning
from .predict import counts_for, predict_step

#: The least predicted gain, as a fraction of the step without overlap, for which "auto" turns
#: overlap on.  The model counts the wire time overlap hides and the border strips' extra calls,
#: not that the split passes run in smaller, less efficient pieces, nor whether MPI moves the
#: messages while the rank computes (on one node it mostly does not): measured there, overlap
#: costs 1-7% of a step where it hides nothing (cotsdl/bench/README.md, "Overlap").  A smaller
#: predicted gain is within the model's error, and off is the safe side of it.
MARGIN = 0.02

#: How to get a machine model when there is none.
CALIBRATE = f"`mpiexec -n 2 python -m mpi4py -m cotsdl bench calibrate --json {THIS_FILE}` writes one"


@dataclass(frozen=True)
class OverlapChoice:
    """The decision and why; the predicted step seconds (every stage's step, summed) when a model decided."""

    on: bool
    reason: str
    seconds_on: float | None = None
    seconds_off: float | None = None

    def describe(self) -> str:
        """``on (auto: <reason>)``, as the logs and ``cotsdl plan`` print it."""
        return f"{'on' if self.on else 'off'} (auto: {self.reason})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_machine() -> tuple[dict[str, Any] | None, str]:
    """The machine "auto" decides with when none is named: this machine's calibration (``./machine.json``,
    as ``cotsdl plan``), else (None, why there is none)."""
    try:
        machine = default_machine()
    except MachineError as e:  # a damaged calibration must not stop a run: the rule decides, and says why
        return None, f"{e}"
    return machine, "" if machine else f"no ./{THIS_FILE}: {CALIBRATE}"


def with_load_warning(choice: OverlapChoice, machine: dict[str, Any] | None, pids=None, cpus=None) -> OverlapChoice:
    """``choice`` with :func:`~cotsdl.planner.machine.load_warning`'s line after its reason when the model
    decided it and the load the machine was calibrated under differs from the load now, or the job's ranks
    on this host share its cores with other processes (``pids``, ``cpus``: the job's processes and cores
    on this host, as there)."""
    if machine is None or choice.seconds_on is None:
        return choice
    warning = load_warning(machine, pids=pids, cpus=cpus, ranks_per_node=len(pids) if pids else None)
    return replace(choice, reason=f"{choice.reason}; {warning}") if warning else choice


def split_layers(network: Network, batch: int, dims: Sequence[int], stages: Sequence[int],
                 itemsize: int = 4) -> int:
    """How many layers of ``stages``' steps receive halos on some rank of a ``dims`` grid and are
    split there (what overlap works on)."""
    last = network.layer_index(max(stages), "pool")
    return sum(bool(np.any(c.strips > 0)) for c in counts_for(network, batch, dims, itemsize)[:last + 1])


def choose_overlap(network: Network, batch: int, ranks: int, dims: Sequence[int] | None, replicas: int,
                   machine: dict[str, Any] | None, *, stages: Sequence[int] | None = None, dtype: str = "float32",
                   optimizer_slots: int = 2, ranks_per_node: int | None = None, tied: bool = True,
                   no_machine: str = "no machine model", margin: float = MARGIN,
                   group_on_one_node: bool | None = None) -> OverlapChoice:
    """Overlap on only where the model predicts a gain of more than ``margin`` of the step.

    Off without halos to hide (one rank per model group, or a grid that splits no layer).
    Without a ``machine`` (``no_machine`` says why) the rule is: off where each model group's
    ranks share one node (``group_on_one_node``; if None, where all ``ranks`` are on one node of
    ``ranks_per_node``), since halos there are memory copies and overlap's split passes only
    cost (measured on this project's 2-core machine: 1-7% in issue 21, 11.7% [6.4%, 25.3%] on
    a 64x64 demo's stage 0); on where they cross nodes; on where halos exist if neither is known.
    The arguments are :func:`~cotsdl.planner.predict_step`'s (``batch`` per replica; ``dims``
    None: the grid training chooses); ``stages``: the stages trained (all by default).
    """
    from ..array.partition import choose_grid  # noqa: PLC0415

    ranks, replicas = int(ranks), int(replicas)
    stages = list(range(len(network.stages))) if stages is None else list(stages)
    group = ranks // replicas
    dims = tuple(int(d) for d in dims) if dims is not None else choose_grid(group, network.input_shape[:2])
    if group == 1:
        return OverlapChoice(False, "1 rank, no halo to hide" if ranks == 1 else
                             f"1 rank per model group ({replicas} replicas), no halo to hide")
    grid = f"{dims[0]}x{dims[1]}"
    n = split_layers(network, batch, dims, stages, np.dtype(dtype).itemsize)
    if not n:
        return OverlapChoice(False, f"no layer of grid {grid} receives halos, nothing to hide")
    if machine is None:
        if group_on_one_node is None and ranks_per_node is not None:
            group_on_one_node = ranks <= int(ranks_per_node)
        if group_on_one_node:
            return OverlapChoice(False, f"{n} layer(s) exchange halos on grid {grid}, but each model group's {group} "
                                        f"ranks share one node; {no_machine}, so the rule without a model: on only "
                                        "where halos cross nodes (within a node they are memory copies, and "
                                        "overlap's split passes cost more than they hide)")
        where = "halos exist" if group_on_one_node is None else "halos cross nodes"
        return OverlapChoice(True, f"{n} layer(s) exchange halos on grid {grid}; {no_machine}, so the rule "
                                   f"without a model: on where {where}")
    kw = dict(dtype=dtype, optimizer_slots=optimizer_slots, ranks_per_node=ranks_per_node, tied=tied)
    on = [predict_step(network, batch, ranks, dims, replicas, machine, stage=k, overlap=True, **kw) for k in stages]
    off = [predict_step(network, batch, ranks, dims, replicas, machine, stage=k, overlap=False, **kw) for k in stages]
    t_on, t_off = sum(p["seconds"] for p in on), sum(p["seconds"] for p in off)
    gain = (t_off - t_on) / t_off
    where = f"halo {sum(p['exchange_s'] for p in off) / t_off:.0%} of the step; machine {machine['name']}"
    if gain > margin:
        why = f"predicted {seconds(t_on)} per step vs {seconds(t_off)} without ({where})"
    elif gain <= 0:
        why = (f"predicted {seconds(t_on)} per step vs {seconds(t_off)} without: the border strips' extra calls cost "
               f"more than the hidden halo time ({where})")
    else:
        why = (f"predicted gain {gain:.1%} is below the {margin:.0%} margin (overlap's smaller passes cost ~1-7% "
               f"measured on one node; {where})")
    return OverlapChoice(gain > margin, why, t_on, t_off)


def seconds(t: float) -> str:
    """``7.56 ms`` or ``1.23 s``."""
    return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"
