"""``cotsdl bench reduction``: the replicas' gradient sum, flat against two-level, in one run.

For each number of replicas R (the world split as training splits it, :func:`split_replicas`:
R model groups of consecutive ranks) and each gradient size (bytes per rank, as given or a
config's stages on that split), every rank sums a buffer of that size over its replicas' group
(``decomposition.replica_comm``, all groups at once, as in a step) with a flat MPI allreduce and
with :class:`~cotsdl.array.twolevel.TwoLevel`, the two in alternating rounds (flat, two-level,
two-level, flat, ...; each call timed as the slowest rank's).  Reported: each one's median time
per call and its spread, the paired ratio two-level / flat - 1 (median over rounds, with a
distribution-free interval), what ``parallel.reduction = "auto"`` picks for the group, and
whether the two sums agree bit for bit (else their largest difference).
"""
from __future__ import annotations

import math
import sys
import time
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from ..array.collective import raise_collectively
from ..array.grid import describe_nodes, node_names, rank_nodes, split_replicas
from ..array.partition import choose_grid
from ..nn.layout import layout
from ..nn.network import Network
from ..train import allreduce as fused
from .common import metadata
from .sampling import median_interval, robust


def gradient_bytes(network: Network, stage: int, group: int, index: int, itemsize: int, tied: bool = True) -> int:
    """The bytes of the weight gradient of ``stage`` (encoder, and decoder when untied) on rank ``index``
    of a model group of ``group`` ranks, on the grid training chooses for it: what the replicas average
    after a step of that stage."""
    dims = choose_grid(group, network.input_shape[:2])
    _, boxes = layout(network, dims, (index // dims[1], index % dims[1]), 1)  # row-major, as ProcessGrid
    lb = boxes[network.filter_layers()[stage]]
    return int(lb.sites.size * math.prod(lb.layer.weight_shape(lb.in_shape)[2:]) * itemsize * (1 if tied else 2))


def _timed(comm: MPI.Comm, fn, calls: int) -> float:
    """Seconds per call of ``fn`` (``calls`` in a row), the slowest rank's."""
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return float(comm.allreduce((time.perf_counter() - t0) / calls, op=MPI.MAX))


def run(comm: MPI.Comm, replicas: Sequence[int], sizes: Sequence[tuple[str, Any]], rounds: int = 8,
        calls: int = 3, dtype: Any = np.float32, log=sys.stdout) -> dict[str, Any]:
    """Measure and return the results (the same on every rank); rank 0 prints.

    ``sizes``: (label, bytes per rank) pairs, or (label, callable) where the callable maps (model group
    size, this rank's index in it) to its bytes (:func:`gradient_bytes` of a config's stage)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    err = None
    bad = [r for r in replicas if not (isinstance(r, int) and r >= 1 and size % r == 0)]
    if bad:
        err = f"--replicas must divide the {size} rank(s), got {bad}"
    elif rounds < 1 or calls < 1:
        err = f"need --rounds >= 1 and --calls >= 1, got {rounds} and {calls}"
    raise_collectively(comm, err)
    dtype = np.dtype(dtype)
    say = (lambda *a: print(*a, file=log, flush=True)) if rank == 0 else (lambda *a: None)
    layout_ = node_names(comm)
    out: dict[str, Any] = {"benchmark": "reduction", **metadata(comm), "nodes": [[h, r] for h, r in layout_],
                           "dtype": dtype.name, "rounds": rounds, "calls": calls, "results": []}
    say(f"cotsdl bench reduction: {size} rank(s) on {describe_nodes(layout_)}; {dtype.name}, {rounds} rounds of "
        f"{calls} call(s), flat and two-level alternating; {out['mpi_library']}")
    say(f"{'replicas':>8} {'group':>14} {'auto':>9} {'size':>22} {'MB/rank':>8} {'flat ms':>9} {'2-level ms':>10} "
        f"{'2-level vs flat':>26} {'equal':>10}")
    for R in replicas:
        dec = split_replicas(comm, R)
        group = dec.replica_comm
        nodes = rank_nodes(group)
        auto = fused.choose("auto", nodes)
        flat, two = fused.Reduction(group, "flat", nodes), fused.Reduction(group, "two-level", nodes)
        for label, nbytes in sizes:
            mine = int(nbytes(dec.grid.size, dec.grid.rank) if callable(nbytes) else nbytes)
            n = max(1, mine // dtype.itemsize)
            x = np.random.default_rng(rank).standard_normal(n).astype(dtype)
            a, b = flat(x.copy()), two(x.copy())
            diff = float(comm.allreduce(float(np.max(np.abs(a.astype(np.float64) - b))), op=MPI.MAX))
            buf = np.zeros(n, dtype)  # sums of zeros stay zeros: every call does the same work
            fns = {"flat": lambda: flat(buf), "two-level": lambda: two(buf)}
            per: dict[str, list[float]] = {k: [] for k in fns}
            for k in fns:  # one untimed call each
                fns[k]()
            for i in range(rounds):
                for name in (("flat", "two-level") if i % 2 == 0 else ("two-level", "flat")):
                    per[name].append(_timed(comm, fns[name], calls))
            ratios = [t / f - 1 for t, f in zip(per["two-level"], per["flat"])]
            lo, hi, coverage = median_interval(ratios)
            row = {"replicas": R, "group_size": group.Get_size(), "group_nodes": len(set(nodes)),
                   "group_most_on_a_node": max(nodes.count(v) for v in set(nodes)), "size": label,
                   "bytes_per_rank_max": int(comm.allreduce(n * dtype.itemsize, op=MPI.MAX)),
                   "auto": auto[0], "auto_reason": auto[1],
                   "flat": robust(per["flat"]), "two_level": robust(per["two-level"]),
                   "flat_round_s": per["flat"], "two_level_round_s": per["two-level"],
                   "two_level_vs_flat": float(np.median(ratios)), "interval": [lo, hi], "coverage": coverage,
                   "bitwise_equal": diff == 0.0, "max_abs_difference": diff}
            out["results"].append(row)
            shape = f"{row['group_size']} on {row['group_nodes']} node(s)"
            same = "bitwise" if diff == 0 else f"{diff:.1e}"
            vs = f"{row['two_level_vs_flat']:+.1%} [{lo:+.1%}, {hi:+.1%}]"
            say(f"{R:8d} {shape:>14} {auto[0]:>9} {label[-22:]:>22} {row['bytes_per_rank_max'] / 1e6:8.2f} "
                f"{row['flat']['value'] * 1e3:9.2f} {row['two_level']['value'] * 1e3:10.2f} {vs:>26} {same:>10}")
        flat.free()
        two.free()
        dec.free()
    say(f"(each row: the median over {rounds} rounds; the interval is the median's, "
        f"{out['results'][0]['coverage']:.0%} coverage)" if out["results"] else "(nothing measured)")
    return out
