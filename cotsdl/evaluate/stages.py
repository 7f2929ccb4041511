"""Each stage's health beside the random-weight network's: did its filters move, are they
Gabor-like, are its units alive on the evaluation images, and how well its best neuron does.

The filter numbers come from ``nn.stage_stats`` (as the trainer logs them; the
random-weight control is the trained network's start, so ``cosine_to_init`` is the
cosine to it; for the first stage also its border sites against its interior ones:
``nn.stage_stats.border_stats``); the silent fraction is ``nn.diagnostics.silent_units``
applied to each unit's largest response over the evaluation images.  Collective over the grid: the
same numbers on any number of ranks.  ``recon_rel`` (‖x̂ − x‖² / ‖x‖²) comes from the
training log (:func:`add_training_log`, with ``pooled`` and, untied, ``decoder_median_norm``): the stage's last logged window, and its first
step (taken at the stage's initial weights) for the random twin -- for stages above the
first, random weights on top of the *trained* stages below.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import backend
from ..nn.diagnostics import silent_units
from ..nn.plan import NetworkPlan
from ..nn.stage_stats import border_stats, median_norm, stage_stats
from . import responses

#: A unit is silent when its peak |response| is below this fraction of the median unit's peak.
SILENT_REL = 0.05


def filter_outputs(infos: Sequence[responses.LayerInfo]) -> list[responses.LayerInfo]:
    """The filter layer of every stage, in stage order (its units are the stage's units)."""
    return [info for info in infos if info.kind == "filter"]


def silent_fractions(R: np.ndarray, ids: np.ndarray, infos: Sequence[responses.LayerInfo], comm: Any) -> list[float]:
    """Per stage: the fraction of its filter units that stay silent over the evaluation images (collective)."""
    out = []
    for info in filter_outputs(infos):
        sel = (ids >= info.offset) & (ids < info.offset + info.size)
        peak = np.abs(R[:, sel]).max(axis=0) if R.shape[0] else np.zeros(int(sel.sum()))
        peaks = np.concatenate(comm.allgather(peak.astype(np.float64)))
        # silent_units takes (H, W, K, N): here one "image", every unit's peak, the same rule
        out.append(float(silent_units(peaks.reshape(1, 1, -1, 1), SILENT_REL).mean()) if peaks.size else float("nan"))
    return out


def table(plan: NetworkPlan, trained: Mapping[int, np.ndarray], initial: Mapping[int, np.ndarray],
          silent: Sequence[float], random_silent: Sequence[float], best: Sequence[float],
          random_best: Sequence[float]) -> list[dict[str, Any]]:
    """One row per stage: filter statistics, silent fractions and the held-out balanced accuracy of the
    stage's best neuron (``best[s]``: chosen on each split's selection half), each with its ``random_``
    twin (collective)."""
    rows = []
    for stage, li in enumerate(plan.network.filter_layers()):
        w, w0 = backend.to_numpy(trained[li]), backend.to_numpy(initial[li])  # filter statistics run on the host
        st = stage_stats(plan, li, w, w0)
        row = {"stage": stage, "layer": li, "units": int(np.prod(plan.layers[li].out_shape[:3])),
               "cosine_to_init": st["cosine_to_init"], "median_norm": st["median_norm"]}
        row.update({k: v for k, v in st.items() if k not in row})
        if "gabor_fraction" in st:  # filters on pixels: do the border sites differ from the interior?
            row.update(border_stats(plan, li, w))
        row["random_median_norm"] = median_norm(plan, w0)
        row.update({"silent_fraction": silent[stage], "random_silent_fraction": random_silent[stage],
                    "best_balanced_acc": float(best[stage]), "random_best_balanced_acc": float(random_best[stage])})
        rows.append(row)
    return rows


#: What the training log gives each stage row: (key, a "random_" twin from the stage's first step).
FROM_LOG = (("recon_rel", True), ("pooled", True), ("decoder_median_norm", False))


def add_training_log(rows: Sequence[dict[str, Any]], records: Sequence[Mapping[str, Any]]) -> None:
    """Add from a run's metrics records, for each key of :data:`FROM_LOG` the run logged: its value
    over the stage's last logged window (``recon_rel``: ‖x̂ − x‖²/‖x‖²; ``pooled``: the pooled
    activations summed per image, the sparsity term without lam; ``decoder_median_norm``: untied runs) and, where it
    has one, its ``random_`` twin from the stage's first step (taken at the stage's initial
    weights); NaN when not logged (``recon_rel`` and ``pooled`` are always present)."""
    for row in rows:
        for key, twin in FROM_LOG:
            mine = [r for r in records if r.get("stage") == row["stage"] and key in r and "stage_step" in r]
            if not mine and key not in ("recon_rel", "pooled"):
                continue
            last = max(mine, key=lambda r: r["stage_step"], default=None)
            first = min(mine, key=lambda r: r["stage_step"], default=None)
            row[key] = float(last.get(f"{key}_mean", last[key])) if last else float("nan")
            if twin:
                row[f"random_{key}"] = float(first[key]) if first and first["stage_step"] == 1 else float("nan")
