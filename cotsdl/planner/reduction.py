"""``parallel.reduction``: how the replicas sum their gradients, and what "auto" chooses.

The names live here, one list for the config, the trainer (:class:`cotsdl.train.allreduce.Reduction`),
``cotsdl bench reduction`` and the planner's prediction; no MPI.  "auto" is two-level where it can
help: where the replicas' group spans nodes and some node holds more than one of its ranks (the
sum then crosses the links once per node instead of once per rank), else flat.  Measured on 2
simulated nodes x 2 ranks (cotsdl/bench/README.md, "`cotsdl bench reduction`"): as fast as
MPICH's own flat allreduce, which already sums within a node first, and 32-77% faster than a
flat ring.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

REDUCTIONS = {
    "auto": "two-level where the replicas' group spans nodes and some node holds more than one of its "
            "ranks, else flat",
    "flat": "one MPI allreduce over the replicas' group",
    "two-level": "reduce to each node's lowest rank, allreduce among those across the nodes, broadcast within "
                 "each node",
}


def setting_error(setting: Any) -> str | None:
    """Why ``setting`` is no reduction (None: it is one)."""
    if isinstance(setting, str) and setting in REDUCTIONS:
        return None
    return f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}, got {setting!r}"


def choose(setting: str, nodes: Sequence[int]) -> tuple[str, str]:
    """("flat" or "two-level", why) for a group whose ranks sit on ``nodes`` (one label per rank)."""
    err = setting_error(setting)
    if err:
        raise ValueError(err)
    per_node = Counter(nodes)
    shape = f"{len(nodes)} rank(s) on {len(per_node)} node(s), at most {max(per_node.values())} on one"
    if setting != "auto":
        return setting, f"set ({shape})"
    if len(per_node) > 1 and max(per_node.values()) > 1:
        return "two-level", f"auto: {shape}"
    why = "one node" if len(per_node) == 1 else "one rank per node"
    return "flat", f"auto: {why} ({shape})"
