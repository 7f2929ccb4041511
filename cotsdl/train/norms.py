"""The filter norm of every stage: ``filter_norm`` (a number, "auto", None, or one per stage) resolved."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..nn.network import Network, unit_gain_norm

#: ``filter_norm = "auto"``: this fraction of the unit-gain norm, a reconstruction gain of
#: 0.16.  Measured on 7x7 first-stage filters of the bundled photographs (cotsdl/README.md,
#: "Training that learns"): at gain 0.16 the filters became localized edges and bars (Gabor fits
#: explaining >= 50% of the variance for nearly all), at gain ~1 they stayed noisy.
AUTO_NORM_FRACTION = 0.4


def stage_norms(filter_norm: Any, network: Network) -> tuple[list[float | None], str | None]:
    """``filter_norm`` as one entry per stage (None: unconstrained; "auto" resolved), or the error."""
    stages = len(network.stages)
    if filter_norm is None:
        return [None] * stages, None
    many = isinstance(filter_norm, (list, tuple))
    norms = list(filter_norm) if many else [filter_norm] * stages
    if len(norms) != stages:
        return [None] * stages, f"filter_norm needs one entry per stage ({stages}), got {len(norms)}"
    for k, v in enumerate(norms):
        if v == "auto":
            li = network.filter_layers()[k]
            norms[k] = AUTO_NORM_FRACTION * unit_gain_norm(network.layers[li], network.shapes[li][2])
    for v in norms:
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer))
                              or not 0 < float(v) < float("inf")):
            return [None] * stages, (f"filter_norm must be a positive number, \"auto\" or None per stage, "
                                     f"got {filter_norm!r}")
    return [None if v is None else float(v) for v in norms], None
