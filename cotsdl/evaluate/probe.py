"""Held-out linear probes on the output of each stage, shared out over the processes of the grid.

A single best neuron is a narrow test: information about faces may be spread over
many units.  A probe fits ridge least squares (``scoring.probe_calls``) on all
outputs of a stage's last layer (its LCN) on the selection half of each split
and classifies the test half; trained and random-weight networks are probed
alike, so the difference says what training added to the stage's features.
Every rank gathers a stage's outputs and fits the same probes (one Gram matrix
per stage, :mod:`.ridge`): no reduction whose order depends on the grid.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import responses, scoring


def stage_outputs(infos: Sequence[responses.LayerInfo]) -> list[responses.LayerInfo]:
    """The last layer (the LCN) of every stage, in stage order."""
    last: dict[int, responses.LayerInfo] = {}
    for info in infos:
        last[info.stage] = info  # layers come in order: the last one of a stage wins
    return [last[s] for s in sorted(last)]


def stage_calls(R: np.ndarray, ids: np.ndarray, infos: Sequence[responses.LayerInfo], y: np.ndarray,
                splits: Sequence[tuple[np.ndarray, np.ndarray]], comm: Any, l2: float = 1e-3) -> list[np.ndarray]:
    """The probe's (k, N) calls on each stage's output (collective over the grid)."""
    out = []
    for info in stage_outputs(infos):
        X = responses.gather_features(R, ids, info, comm)
        out.append(scoring.probe_calls(X, y, splits, l2))  # every rank alike: the same numbers on any grid
        del X  # one stage's features at a time
    return out
