"""The training state: what a checkpoint holds to continue a run, and how it is written and read.

:class:`TrainState` owns the parameters, the current stage's optimizer (its slots
and step count), the position in the stage and in the data stream, and the count of
skipped steps.  The data stream's order follows from the data seed and the position,
and the weights' initialization from ``seed``: there is no other random state.  The
run's settings (network, lam, filter norms, layout...) are the trainer's; they ride
along in the checkpoint's metadata as ``settings``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpi4py import MPI

from ..array.box import Box
from ..io import checkpoint
from ..nn.plan import NetworkPlan
from .optim import Optimizer

#: The metadata keys of the position in training (the rest of a checkpoint's meta are settings).
POSITION_KEYS = ("stage", "stage_step", "step", "position", "skipped", "bad_in_row")
#: What a checkpoint's meta must hold to be resumed (``skipped``, ``bad_in_row``: 0 when absent).
META_KEYS = ("network", "seed", "lam", "tied", "batch", "replicas", "grid", "dtype", "optimizer",
             "stage", "stage_step", "step", "position")


@dataclass
class TrainState:
    """Everything that changes as training goes on.

    ``params``/``decoders`` map a filter layer's index to this rank's block of its
    encoder/untied decoder weights; ``optimizer`` is the current stage's (None before
    a stage began); ``position`` counts the images all replicas consumed so far.
    """

    params: dict[int, Any]
    decoders: dict[int, Any] = field(default_factory=dict)
    optimizer: Optimizer | None = None
    stage: int = 0
    stage_step: int = 0
    step: int = 0
    position: int = 0
    skipped: int = 0
    bad_in_row: int = 0

    def arrays(self, plan: NetworkPlan) -> dict[str, tuple]:
        """Name -> (global shape, this rank's box, block) of every array a checkpoint holds."""
        out = {}
        for li in plan.network.filter_layers():
            shape, box = plan.weight_box(li)
            out[f"w/{li}"] = (shape, box, self.params[li])
            if li in self.decoders:
                out[f"w_dec/{li}"] = (shape, box, self.decoders[li])
        if self.optimizer is not None:
            shape, box = plan.weight_box(plan.network.filter_layers()[self.stage])
            for pname, slots in self.optimizer.state.items():
                for slot, arr in slots.items():
                    out[f"opt/{pname}/{slot}"] = (shape, box, arr)
        return out

    def meta(self) -> dict[str, Any]:
        """The position and the optimizer's plain state (its arrays are in :meth:`arrays`)."""
        opt = None
        if self.optimizer is not None:
            opt = {k: v for k, v in self.optimizer.state_dict().items() if k != "slots"}
            opt["slot_names"] = {n: sorted(s) for n, s in self.optimizer.state.items()}
        return {**{k: getattr(self, k) for k in POSITION_KEYS}, "optimizer": opt}

    def to_checkpoint(self, directory: str | Path, comm: MPI.Comm, plan: NetworkPlan, settings: dict[str, Any],
                      *, writer: bool = True, keep: int = 3) -> Path:
        """Write a checkpoint of this state and the run's ``settings`` (collective over ``comm``)."""
        return checkpoint.save(directory, self.step, comm, self.arrays(plan), {**settings, **self.meta()},
                               writer=writer, keep=keep)

    @classmethod
    def from_checkpoint(cls, path: Path, meta: dict[str, Any], comm: MPI.Comm, plan: NetworkPlan, xp: Any,
                        template: Optimizer, tied: bool) -> "TrainState":
        """This rank's part of a saved state, in ``plan``'s layout (collective over ``comm``).

        The current stage's optimizer is a copy of ``template`` (its kind must be the
        saved one: the caller checks) with the saved step count and slots; its settings
        are the template's, so that what a resume changes is decided in one place.
        """
        layers = plan.network.filter_layers()
        wanted: dict[str, Box] = {}
        for li in layers:
            wanted[f"w/{li}"] = plan.weight_box(li)[1]
            if not tied:
                wanted[f"w_dec/{li}"] = plan.weight_box(li)[1]
        opt = meta["optimizer"]
        if opt is not None:
            box = plan.weight_box(layers[meta["stage"]])[1]
            wanted.update({f"opt/{n}/{s}": box for n, slots in opt["slot_names"].items() for s in slots})
        arrays = checkpoint.load(path, comm, wanted, dtype=plan.dtype)
        optimizer = None
        if opt is not None:
            optimizer = copy.deepcopy(template)
            optimizer.t = int(opt["t"])
            optimizer.state = {n: {s: xp.array(arrays[f"opt/{n}/{s}"], copy=True) for s in slots}
                               for n, slots in opt["slot_names"].items()}
        return cls(params={li: xp.asarray(arrays[f"w/{li}"]) for li in layers},
                   decoders={} if tied else {li: xp.asarray(arrays[f"w_dec/{li}"]) for li in layers},
                   optimizer=optimizer, **{k: int(meta.get(k, 0)) for k in POSITION_KEYS})
