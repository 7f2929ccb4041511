"""The network against its controls: held-out scores with intervals, paired differences, per kind.

Every measure is given by its calls: for each split, which images its rule
(chosen on the selection half) calls faces.  All of them are scored on the same
group resamples (:class:`.bootstrap.GroupBootstrap`), so every difference is paired.
This module turns them into the machine-readable parts of ``report.json``
(``comparisons``, ``intervals``, ``per_kind``, ``probes``); see cotsdl/evaluate/README.md.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .bootstrap import GroupBootstrap, difference, summary

#: The controls of the best neuron, in report order.
CONTROLS = ("random_weights", "no_faces", "best_pixel", "mean_face")
#: The controls of the stage probes: the same architecture without (face) training.
PROBE_CONTROLS = ("random_weights", "no_faces")


def controls_of(names: Sequence[str]) -> list[str]:
    """The controls among ``names`` in report order: random weights and the no-face network, other
    named control runs (e.g. ``matched``) as given, then the pixel and mean-face controls."""
    named = [n for n in names if n not in CONTROLS and n not in ("network", "linear_probe")]
    return ([c for c in PROBE_CONTROLS if c in names] + named
            + [c for c in CONTROLS if c not in PROBE_CONTROLS and c in names])


def best_neuron(scores: Mapping[str, np.ndarray]) -> tuple[dict, list[dict]]:
    """(intervals, comparisons) of the network's best neuron and its controls from their resampled
    scores (``GroupBootstrap.scores``; ``scores["network"]`` is the network's)."""
    intervals = {name: summary(v) for name, v in scores.items()}
    out = [{"measure": "best_neuron", "control": control, **difference(scores["network"], scores[control]),
            "score": intervals["network"]["score"], "control_score": intervals[control]["score"]}
           for control in controls_of(list(scores))]
    return intervals, out


def stage_probes(boot: GroupBootstrap, probes: Mapping[str, Sequence[np.ndarray]],
                 stages: Sequence[Mapping[str, Any]], pixels: np.ndarray | None = None) -> tuple[list[dict], list[dict]]:
    """(per-stage table, comparisons) of the linear probes.

    ``probes[name][s]``: the calls of the probe on stage s of network ``name``
    (``network`` and the controls run); ``stages[s]``: what to say about the
    stage (``stage``, ``layer``, ``features``); ``pixels``: the probe on the
    input pixels, a reference.  The comparisons hold one entry per stage and
    control (with ``stage``), then one per control without ``stage``: the last
    stage (the representation the network hands on; ``last_stage`` names it).
    """
    scores = {name: [boot.scores(c) for c in per_stage] for name, per_stage in probes.items()}
    ref = None if pixels is None else boot.scores(pixels)
    table, out = [], []
    for s, about in enumerate(stages):
        row = {**about, "scores": {name: summary(v[s]) for name, v in scores.items()}, "differences": {}}
        if ref is not None:
            row["scores"]["pixels"] = summary(ref)
        for control in controls_of(list(scores)):  # every network control (probes are of networks only)
            d = difference(scores["network"][s], scores[control][s])
            row["differences"][control] = d
            out.append({"measure": "linear_probe", "control": control, **d, "stage": about["stage"],
                        "score": row["scores"]["network"]["score"],
                        "control_score": row["scores"][control]["score"]})
        table.append(row)
    last = table[-1]
    for control in controls_of(list(scores)):
        if control in last["differences"]:
            out.append({"measure": "linear_probe", "control": control, **last["differences"][control],
                        "last_stage": last["stage"], "score": last["scores"]["network"]["score"],
                        "control_score": last["scores"][control]["score"]})
    return table, out


def stage_best(boot: GroupBootstrap, calls: Mapping[str, np.ndarray], stage: int) -> tuple[dict, list[dict]]:
    """(intervals, comparisons) of the best neuron among one stage's neurons (``calls[name]``: its
    (k, N) calls in network ``name``), against the same architecture untrained by faces.

    The entries are ``best_neuron`` comparisons with a ``stage``: the paper's face
    neuron sat at the top of the network, while the best neuron overall may be a
    first-stage unit that random filters match as well.
    """
    scores = {name: boot.scores(c) for name, c in calls.items()}
    intervals = {name: summary(v) for name, v in scores.items()}
    out = [{"measure": "best_neuron", "control": c, "stage": stage, **difference(scores["network"], scores[c]),
            "score": intervals["network"]["score"], "control_score": intervals[c]["score"]}
           for c in controls_of(list(scores))]
    return intervals, out


def per_kind(boot: GroupBootstrap, calls: Mapping[str, np.ndarray], kinds: Mapping[str, np.ndarray],
             groups: np.ndarray, must_beat: Sequence[str] = ()) -> list[dict]:
    """Faces against each distractor kind alone: every measure's score and the network's paired differences.

    The rules are those chosen against all distractors; only the scoring is per kind.
    Each kind also gets its verdict against the deciding controls ``must_beat``:
    ``beats`` (control -> the lower end of the interval of the difference is above 0)
    and ``selective`` (all of them; None when one was not run).
    """
    out = []
    for kind, mask in kinds.items():
        scores = {name: boot.scores(c, mask) for name, c in calls.items()}
        diffs = {c: difference(scores["network"], scores[c]) for c in controls_of(list(scores))}
        beats = {c: _above(diffs[c]) for c in must_beat if c in diffs}
        out.append({"kind": kind, "distractors": int(mask.sum()), "groups": int(len(np.unique(groups[mask]))),
                    "scores": {name: summary(v) for name, v in scores.items()}, "differences": diffs,
                    "beats": beats, "selective": all(beats.values()) if len(beats) == len(must_beat) else None})
    return out


def weakest_kind(per_kind_rows: Sequence[Mapping[str, Any]], must_beat: Sequence[str]) -> dict[str, Any] | None:
    """The distractor kind on which the network's smallest gain over a deciding control is lowest:
    ``{"kind", "control", "difference", "ci_low", "ci_high", "score", "beats"}`` (None without kinds
    or deciding controls)."""
    best = None
    for row in per_kind_rows:
        for c in must_beat:
            d = row["differences"].get(c)
            if d is None or not np.isfinite(d["difference"]):
                continue
            if best is None or d["difference"] < best[2]["difference"]:
                best = (row, c, d)
    if best is None:
        return None
    row, c, d = best
    return {"kind": row["kind"], "control": c, "difference": d["difference"], "ci_low": d["ci_low"],
            "ci_high": d["ci_high"], "score": row["scores"]["network"]["score"], "beats": _above(d)}


def _above(d: Mapping[str, float]) -> bool:
    low = d["ci_low"]
    return bool(np.isfinite(low) and low > 0)


def verdict(diff: Mapping[str, float], per_split: Mapping[str, float]) -> dict[str, Any]:
    """The network beats a control when the lower end of the paired difference's interval is above 0."""
    return {**diff, "beats": _above(diff), "mean_diff": per_split["mean_diff"],
            "std_diff": per_split["std_diff"]}
