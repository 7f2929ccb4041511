"""``parallel.fuse = "auto"``: which stages' pool and LCN share one halo exchange.

Fused (``NetworkPlan(fuse=...)``), a stage receives its pool's input once, on the window its LCN's
halo needs as well, and pools that border itself instead of receiving it: one exchange (one round
of messages) instead of two, at the price of the pooled border's bytes in the pool's input and its
computation done twice.  A training step runs a stage's pool and LCN together only in the forward
of the frozen stages below the one it trains; so a stage is fused where the model predicts that
forward faster, and the top stage (in no step's forward) is left as it is.  One decision per run
from :func:`~cotsdl.planner.predict_step` with and without the stage fused.  No MPI: the callers
decide on one rank and broadcast.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from ..nn.network import Network
from ..nn.plan import check_fuse
from .predict import predict_step

#: The least predicted saving, as a fraction of the step, for which "auto" fuses a stage: below it the
#: difference is within the model's error, and per-layer exchange (the default) is the safe side.
MARGIN = 0.005

#: What ``parallel.fuse`` takes besides a list of stage indices.
SETTINGS = ("auto", "on", "off")


@dataclass(frozen=True)
class FuseChoice:
    """The fused stages, and per stage why (``reasons[k]``); predicted seconds per step of the stage above
    each decided stage, unfused and fused (None where no model decided)."""

    stages: tuple[int, ...]
    reasons: tuple[str, ...]
    seconds: tuple[tuple[float, float] | None, ...] = ()

    def describe(self) -> str:
        """One line: ``fused stages 0 (…); stage 1 not fused (…)``."""
        return "; ".join(f"stage {k} {'fused' if k in self.stages else 'per layer'} ({why})"
                         for k, why in enumerate(self.reasons))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve(setting: Any, stages: int) -> tuple[int, ...] | None:
    """The fused stages of a fixed ``parallel.fuse`` setting ("on": all, "off": none, or a list of stage
    indices), or None for "auto".  A ValueError names a bad setting."""
    if setting == "auto":
        return None
    if setting == "on" or setting is True:
        return tuple(range(stages))
    if setting == "off" or setting is False:
        return ()
    if not isinstance(setting, (list, tuple)):
        raise ValueError(f'parallel.fuse must be "auto", "on", "off" or a list of stage indices, got {setting!r}')
    return check_fuse(setting, stages, "parallel.fuse")


def choose_fuse(network: Network, batch: int, ranks: int, dims: Sequence[int] | None, replicas: int,
                machine: dict[str, Any] | None, *, no_machine: str = "no machine model", margin: float = MARGIN,
                **kw: Any) -> FuseChoice:
    """The stages to fuse: those below the top whose fused forward the model predicts faster by more
    than ``margin`` of the step that trains the stage above.  ``kw``: :func:`predict_step`'s options
    (dtype, optimizer_slots, ranks_per_node, tied, overlap)."""
    n = len(network.stages)
    group = int(ranks) // int(replicas)
    fused, reasons, secs = [], [], []
    for k in range(n):
        if k == n - 1:
            reasons.append("the top stage's pool and LCN run in no training step")
            secs.append(None)
        elif group == 1:
            reasons.append("one rank per model group: no halo")
            secs.append(None)
        elif machine is None:
            reasons.append(f"{no_machine}; without a model each layer exchanges its own halo")
            secs.append(None)
        else:
            off = predict_step(network, batch, ranks, dims, replicas, machine, stage=k + 1, **kw)
            on = predict_step(network, batch, ranks, dims, replicas, machine, stage=k + 1, fuse=(k,), **kw)
            saved = (off["seconds"] - on["seconds"]) / off["seconds"]
            where = f"stage {k + 1}'s step predicted {on['seconds'] * 1e3:.3g} ms fused vs {off['seconds'] * 1e3:.3g} ms"
            if saved > margin:
                fused.append(k)
                reasons.append(f"{where}: {saved:.1%} saved")
            else:
                reasons.append(f"{where}: {saved:+.1%}, not above the {margin:.1%} margin")
            secs.append((off["seconds"], on["seconds"]))
    return FuseChoice(tuple(fused), tuple(reasons), tuple(secs))
