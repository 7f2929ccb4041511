"""A stage's filters against their initial (random) ones: what the trainer logs and the evaluation reports.

At every log line: the median cosine of each unit's filter to its initial filter and
the filter norms (cheap).  For the evaluation: whether the border sites' filters differ
from the interior ones' (:func:`border_stats`).  At the end of a stage: also how Gabor-like its filters are
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
from .orientation import border_sites, compare, orientations
from .network import init_weights
from .plan import NetworkPlan

#: Units fitted with a Gabor at the end of a stage (about 10-20 ms each).
GABOR_SAMPLE = 96


def initial_weights(plan: NetworkPlan, li: int, seed: int, norm: float | None) -> np.ndarray:
    """This rank's initial weights of filter layer ``li`` (recomputed: they depend on the seed alone)."""
    lp = plan.layers[li]
    return init_weights(lp.layer, lp.in_shape, lp.sites, seed, li, plan.dtype, norm)


def _gathered(comm: Any, *per_unit: np.ndarray) -> list[np.ndarray]:
    """Each array of per-unit numbers from every rank of the group (small next to the weights)."""
    every = comm.allgather([np.ravel(v) for v in per_unit])
    return [np.concatenate([e[i] for e in every]) for i in range(len(per_unit))]


def _median(v: np.ndarray) -> float:
    return float(np.median(v)) if v.size else float("nan")


def median_norm(plan: NetworkPlan, w: Any) -> float:
    """The median over the group's units of their filter norms (collective)."""
    (norms,) = _gathered(plan.grid.comm, unit_norms(backend.to_numpy(w)))
    return _median(norms)


def log_stats(plan: NetworkPlan, w: Any, w0: np.ndarray) -> dict[str, float]:
    """The cheap numbers of a log line: the median cosine of each unit's filter to its initial one, and
    the median norm (collective)."""
    w = backend.to_numpy(w)
    cos, norms = _gathered(plan.grid.comm, cosines(w, w0), unit_norms(w))
    return {"cosine_to_init": _median(cos), "median_norm": _median(norms)}


#: The keys of :func:`stage_stats` (those of the Gabor fit and their twins for the first stage only).
STAGE_KEYS = ("cosine_to_init", "median_norm", "gabor_fraction", "oriented_fraction", "median_gabor_r2",
              "random_gabor_fraction", "random_oriented_fraction", "random_median_gabor_r2")


def _gabor(plan: NetworkPlan, li: int, w: np.ndarray, w0: np.ndarray) -> dict[str, float]:
    """Gabor fits of a sample of units, with the median cosine to init and norm of all of them."""
    lp = plan.layers[li]
    shape, _ = plan.weight_box(li)
    s = stage_filter_stats(plan.grid.comm, w, w0, lp.sites.lo, shape[:2], sample=GABOR_SAMPLE, seed=0)
    return {"cosine_to_init": s["median_cosine_to_init"], "median_norm": s["median_norm"],
            "gabor_fraction": s["gabor_fraction"], "oriented_fraction": s["oriented_fraction"],
            "median_gabor_r2": s["median_r2"]}


def stage_stats(plan: NetworkPlan, li: int, w: Any, w0: np.ndarray) -> dict[str, float]:
    """The end-of-stage numbers (:data:`STAGE_KEYS`), trained and (``random_*``) initial weights side by side.

    Gabor fits only for the first stage (filters on pixels, at least 3x3: what
    "Gabor-like" means).
    """
    w = backend.to_numpy(w)
    lp = plan.layers[li]
    if not (li == plan.network.filter_layers()[0] and min(lp.layer.size) >= 3):
        return log_stats(plan, w, w0)
    out = _gabor(plan, li, w, w0)
    random = _gabor(plan, li, w0, w0)
    out.update({f"random_{k}": random[k] for k in ("gabor_fraction", "oriented_fraction", "median_gabor_r2")})
    return out


def border_stats(plan: NetworkPlan, li: int, w: Any) -> dict[str, Any]:
    """Filter layer ``li``'s border sites against its interior ones (``orientation.compare``, every
    unit's orientation from its power spectrum; collective, the same numbers on any grid split)."""
    lp = plan.layers[li]
    shape, _ = plan.weight_box(li)
    theta, _ = orientations(backend.to_numpy(w))  # this rank's sites, (sh, sw, M)
    every = np.zeros(shape[:3])
    for (r, c), t in plan.grid.comm.allgather((tuple(lp.sites.lo), theta)):
        every[r:r + t.shape[0], c:c + t.shape[1]] = t
    return compare(every, border_sites(shape[:2]))
