"""``parallel.fuse = "auto"``: which stages' pool and LCN share one halo exchange.

Fused (``NetworkPlan(fuse=...)``), a stage receives its pool's input once, on the window its LCN's
halo needs as well, and pools that border itself instead of receiving it: one exchange (one round
of messages) instead of two, at the price of the pooled border's bytes in the pool's input and its
computation done twice.  A training step runs a stage's pool and LCN together only in the forward
of the frozen stages below the one it trains; so a stage is fused where the model predicts that
forward faster, and the top stage (in no step's forward) is left as it is.  One decision per run
from :func:`~cotsdl.planner.predict_step` with and without the stage fused.  No MPI: the callers
decide on one rank and broadcast.

``parallel.fuse_filter`` adds a third form for a frozen stage: its filter joins the pool and LCN
(``NetworkPlan(fuse_filter=...)``), so the stage's forward exchanges only its input, at the price of
the filter outputs of the grown sites computed twice and a halo of the neighbours' weights kept
while the stage is frozen.  "auto" chooses per stage among the forms both settings allow: a form
that does more work must beat the simpler one by more than :data:`MARGIN` of the step.
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

#: What ``parallel.fuse`` and ``parallel.fuse_filter`` take besides a list of stage indices.
SETTINGS = ("auto", "on", "off")


#: A stage's forms, simplest first: one exchange per layer, pool and LCN on one, the whole frozen stage on one.
FORMS = ("per layer", "pool+LCN", "filter+pool+LCN")


@dataclass(frozen=True)
class FuseChoice:
    """The fused stages (pool and LCN on one exchange), those whose filter joins them too (``filters``,
    a subset), and per stage why (``reasons[k]``); predicted seconds per step of the stage above each
    decided stage, per layer and pool+LCN fused (None where no model decided both), and of every
    form predicted (``predicted[k]``: form -> seconds)."""

    stages: tuple[int, ...]
    reasons: tuple[str, ...]
    filters: tuple[int, ...] = ()
    predicted: tuple[dict[str, float], ...] = ()

    @property
    def seconds(self) -> tuple[tuple[float, float] | None, ...]:
        """Per stage, the predicted step of the stage above per layer and pool+LCN fused (None where
        the model did not predict both)."""
        return tuple((p[FORMS[0]], p[FORMS[1]]) if FORMS[0] in p and FORMS[1] in p else None
                     for p in self.predicted)

    def describe(self) -> str:
        """One line: ``stage 0 fused with its filter (…); stage 1 per layer (…)``."""
        def form(k: int) -> str:
            return "per layer" if k not in self.stages else "fused with its filter" if k in self.filters else "fused"

        return "; ".join(f"stage {k} {form(k)} ({why})" for k, why in enumerate(self.reasons))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": [list(t) if t else None for t in self.seconds]}


def resolve(setting: Any, stages: int, name: str = "parallel.fuse") -> tuple[int, ...] | None:
    """The stages of a fixed ``parallel.fuse`` (or ``name``) setting ("on": all, "off": none, or a list
    of stage indices), or None for "auto".  A ValueError names a bad setting."""
    if setting == "auto":
        return None
    if setting == "on" or setting is True:
        return tuple(range(stages))
    if setting == "off" or setting is False:
        return ()
    if not isinstance(setting, (list, tuple)):
        raise ValueError(f'{name} must be "auto", "on", "off" or a list of stage indices, got {setting!r}')
    return check_fuse(setting, stages, name)


def resolve_filter(setting: Any, stages: int, fused: tuple[int, ...] | None) -> tuple[int, ...] | str | None:
    """A ``parallel.fuse_filter`` setting: None for "auto", "on" (the filter of every fused stage) while
    ``parallel.fuse`` is "auto" (``fused`` None), else the stages, which must be fused ones."""
    if setting == "on" or setting is True:
        return "on" if fused is None else fused
    out = resolve(setting, stages, "parallel.fuse_filter")
    if out and fused is not None and not set(out) <= set(fused):
        k = sorted(set(out) - set(fused))[0]
        raise ValueError(f"parallel.fuse_filter: stage {k}'s filter joins its pool and LCN only where they are fused; "
                         f"parallel.fuse fuses {list(fused) or 'none'} (add {k} there, or set parallel.fuse = \"auto\")")
    return out


def undecided(fused: tuple[int, ...] | None, filters: tuple[int, ...] | str | None) -> bool:
    """Whether the settings (:func:`resolve`'s and :func:`resolve_filter`'s) leave :func:`choose_fuse`
    something to choose: either is "auto", or the filter is "on" over an automatic ``parallel.fuse``."""
    return fused is None or filters is None or isinstance(filters, str)


def _forms(k: int, fused: tuple[int, ...] | None, filters: tuple[int, ...] | str | None) -> list[str]:
    """The forms of stage ``k`` the fixed settings leave to choose from, simplest first."""
    forms = list(FORMS)
    if fused is not None:
        forms = forms[1:] if k in fused else forms[:1]
    if filters == "on":
        forms = [f for f in forms if f != FORMS[1]]
    elif filters is not None:
        forms = [f for f in forms if f == FORMS[2]] if k in filters else [f for f in forms if f != FORMS[2]]
    return forms or [FORMS[0]]


def choose_fuse(network: Network, batch: int, ranks: int, dims: Sequence[int] | None, replicas: int,
                machine: dict[str, Any] | None, *, no_machine: str = "no machine model", margin: float = MARGIN,
                fused: tuple[int, ...] | None = None, filters: tuple[int, ...] | str | None = None,
                **kw: Any) -> FuseChoice:
    """Per stage below the top, the form (:data:`FORMS`) the fixed settings allow (``fused``: the
    ``parallel.fuse`` stages, ``filters``: :func:`resolve_filter`'s; None: "auto") whose predicted step of
    the stage above is the fastest, a form with more work winning only by more than ``margin`` of
    the step, and only where it fits in memory if the simpler one does.  ``kw``: :func:`predict_step`'s options (dtype, optimizer_slots, ranks_per_node, tied,
    overlap)."""
    n = len(network.stages)
    group = int(ranks) // int(replicas)
    chosen, reasons, preds = [], [], []
    for k in range(n):
        forms = _forms(k, fused, filters)
        why = None
        if len(forms) == 1:
            why = "given"
        elif k == n - 1:
            why = "the top stage's pool and LCN run in no training step"
        elif group == 1:
            why = "one rank per model group: no halo"
        elif machine is None:
            why = f"{no_machine}; without a model each layer exchanges its own halo"
        if why is not None:
            chosen.append(forms[0])
            reasons.append(why)
            preds.append({})
            continue
        pred, fits = {}, {}
        for form in forms:
            fuse, ff = ((), ()) if form == FORMS[0] else ((k,), () if form == FORMS[1] else (k,))
            got = predict_step(network, batch, ranks, dims, replicas, machine, stage=k + 1, fuse=fuse,
                               fuse_filter=ff, **kw)
            pred[form], fits[form] = got["seconds"], got["fits"]
        best, notes = forms[0], []
        for form in forms[1:]:
            saved = (pred[best] - pred[form]) / pred[best]
            if fits[best] and not fits[form]:  # (the weight halo a frozen filter keeps)
                notes.append(f"{form} does not fit in the device's memory")
            elif saved > margin:
                notes.append(f"{form} {saved:.1%} saved on {best}")
                best = form
            else:
                notes.append(f"{form} {saved:+.1%} on {best}, not above the {margin:.1%} margin")
        listed = ", ".join(f"{f} {pred[f] * 1e3:.3g} ms" for f in forms)
        chosen.append(best)
        reasons.append(f"stage {k + 1}'s step predicted {listed}: {'; '.join(notes)}")
        preds.append(pred)
    return FuseChoice(tuple(k for k, f in enumerate(chosen) if f != FORMS[0]), tuple(reasons),
                      tuple(k for k, f in enumerate(chosen) if f == FORMS[2]), tuple(preds))
