"""A stage's filters against their initial (random) ones: what the trainer logs and the evaluation reports.

At every log line: the median cosine of each unit's filter to its initial filter and
the filter norms (cheap).  At the end of a stage: also how Gabor-like its filters are
(a seeded sample of units fitted, ``nn.diagnostics``), with the same numbers for the
initial (random) weights beside them.  (Silent units need held-out images: the
evaluation counts them: ``evaluate.stages``.)  Collective over the model group; every replica holds the
same weights and computes the same numbers.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import backend
from .diagnostics import cosines, stage_filter_stats, unit_norms
from .network import init_weights
from .plan import NetworkPlan

#: Units fitted with a Gabor at the end of a stage (about 10-20 ms each).
GABOR_SAMPLE = 96


def initial_weights(plan: NetworkPlan, li: int, seed: int, norm: float | None) -> np.ndarray:
    """This rank's initial weights of filter layer ``li`` (recomputed: they depend on the seed alone)."""
    lp = plan.layers[li]
    return init_weights(lp.layer, lp.in_shape, lp.sites, seed, li, plan.dtype, norm)


def _medians(plan: NetworkPlan, w: Any, w0: np.ndarray) -> dict[str, float]:
    """Median cosine of each unit's filter to its initial one, and the median norm, over the group."""
    comm = plan.grid.comm
    w = backend.to_numpy(w)
    cos, norms = cosines(w, w0).reshape(-1), unit_norms(w).reshape(-1)
    every = comm.allgather((cos, norms))  # a few numbers per unit: small next to the weights
    cos, norms = (np.concatenate([e[i] for e in every]) for i in (0, 1))
    return {"cosine_to_init": float(np.median(cos)) if cos.size else float("nan"),
            "median_norm": float(np.median(norms)) if norms.size else float("nan")}


def log_stats(plan: NetworkPlan, li: int, w: Any, w0: np.ndarray) -> dict[str, float]:
    """The cheap numbers of a log line: cosine to init and norms."""
    return _medians(plan, w, w0)


def _gabor(plan: NetworkPlan, li: int, w: Any, w0: np.ndarray) -> dict[str, float]:
    lp = plan.layers[li]
    shape, _ = plan.weight_box(li)
    s = stage_filter_stats(plan.grid.comm, backend.to_numpy(w), w0, lp.sites.lo, shape[:2], sample=GABOR_SAMPLE,
                           seed=0)
    return {"gabor_fraction": s["gabor_fraction"], "oriented_fraction": s["oriented_fraction"],
            "median_gabor_r2": s["median_r2"]}


def stage_stats(plan: NetworkPlan, li: int, w: Any, w0: np.ndarray) -> dict[str, float]:
    """The end-of-stage numbers, trained and (``random_*``) initial weights side by side.

    Gabor fits only for the first stage (filters on pixels, at least 3x3: what
    "Gabor-like" means).
    """
    out: dict[str, float] = dict(_medians(plan, w, w0))
    lp = plan.layers[li]
    if li == plan.network.filter_layers()[0] and min(lp.layer.size) >= 3:
        out.update(_gabor(plan, li, w, w0))
        out.update({f"random_{k}": v for k, v in _gabor(plan, li, w0, w0).items()})
    return out
