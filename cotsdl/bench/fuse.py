"""One halo exchange per pool and LCN (``parallel.fuse``), and per frozen stage (``parallel.fuse_filter``),
against one per layer, measured in one run.

Three trainers of the same network on the same ranks, one exchanging before each layer, one with
the pool and LCN of every stage below ``stage`` fused (those a step of ``stage`` runs forward), and
one with their filters fused too (one exchange of each frozen stage's input; its weight halo is
fetched at the first step, inside the warm-up), time training steps of ``stage`` in interleaved
rounds (:func:`cotsdl.bench.scaling.timed_rounds`).  Per setting: the median step and its interval,
exchange time, halo messages a rank posts per step (counted at every call), and the planner's
prediction; the paired ratios fused / per layer by round; and the planner's break-even: the latency
per message between nodes (or within one) above which each fused form would win on this machine's
other numbers.
"""
from __future__ import annotations

import copy
import io
import sys
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..array.grid import describe_nodes, node_names
from ..nn.network import Network
from ..train import GreedyTrainer, InMemorySource
from .sampling import median_interval
from .scaling import timed_rounds


def run(comm: MPI.Comm, network: Network, make_optimizer: Callable[[], Any], *, batch: int, stage: int,
        steps: int = 12, warmup: int = 2, rounds: int = 6, overlap: bool = False,
        predict: Callable[[tuple[int, ...], tuple[int, ...]], dict[str, Any]] | None = None, log=sys.stdout,
        **kw: Any) -> dict[str, Any]:
    """Measure per-layer and fused exchange on every rank of ``comm`` (``batch``: per step).

    ``predict(fuse, fuse_filter)`` (optional, rank 0 only) returns the planner's prediction of a step of
    ``stage`` with those stages fused (:func:`~cotsdl.planner.predict_step`'s dict).  ``kw``: more
    :class:`~cotsdl.train.GreedyTrainer` options.
    """
    if not 1 <= stage < len(network.stages):
        raise ValueError(f"stage {stage}: a step fuses the stages below the one it trains, so the stage must be in "
                         f"[1, {len(network.stages)})")
    rank = comm.Get_rank()
    say = (lambda *a: print(*a, file=log, flush=True)) if rank == 0 else (lambda *a: None)
    fused = tuple(range(stage))
    images = np.random.default_rng(0).standard_normal((2 * batch,) + network.input_shape).astype(np.float32)
    settings = {"per layer": ((), ()), "fused": (fused, ()), "fused+filter": (fused, fused)}
    trainers = {name: GreedyTrainer(network, InMemorySource(images), make_optimizer(), comm=comm, batch=batch,
                                    overlap=overlap, fuse=f, fuse_filter=ff, log_every=0, log=io.StringIO(), **kw)
                for name, (f, ff) in settings.items()}
    dims = trainers["per layer"].decomposition.grid.dims
    say(f"cotsdl bench fuse: stage {stage} on grid {dims[0]}x{dims[1]} of {comm.Get_size()} rank(s) on "
        f"{describe_nodes(node_names(comm))}; overlap {'on' if overlap else 'off'}; stage(s) "
        f"{', '.join(map(str, fused))} fused (pool and LCN; and with the filter, frozen) against per layer, "
        f"{steps} steps each in {rounds} interleaved rounds")
    res = timed_rounds(comm, trainers, stage, steps, warmup, max(1, min(rounds, steps)))
    rows = []
    for name, (f, ff) in settings.items():
        m = res[name]
        lo, hi, cov = median_interval(m["round_s"])
        pred = predict(f, ff) if predict is not None and rank == 0 else None
        row = {"setting": name, "fuse": list(f), "fuse_filter": list(ff), "step_s": m["step_s"],
               "round_interval_s": [lo, hi], "coverage": cov, "exchange_s": m["exchange_s"],
               "halo_messages": m["halo_messages"], "predicted_s": None if pred is None else pred["seconds"],
               "predicted_exchange_s": None if pred is None else pred["exchange_s"], "loss": m["loss"]}
        rows.append(row)
    out = {"stage": stage, "grid": list(dims), "ranks": comm.Get_size(), "overlap": overlap, "fused": list(fused),
           "rows": rows, "weight_halo_fetches": trainers["fused+filter"].plan.halo_fetches}
    say(f"{'setting':>12} {'step ms':>9} {'[95% of rounds]':>17} {'exch ms':>8} {'msgs/step':>9} {'pred ms':>8} "
        f"{'pred/meas':>9}")
    for r in rows:
        pm = r["predicted_s"]
        say(f"{r['setting']:>12} {r['step_s'] * 1e3:9.2f} [{r['round_interval_s'][0] * 1e3:6.2f}, "
            f"{r['round_interval_s'][1] * 1e3:6.2f}] {r['exchange_s'] * 1e3:8.2f} {r['halo_messages']:9d} "
            + (f"{pm * 1e3:8.2f} {pm / r['step_s']:9.2f}" if pm else f"{'-':>8} {'-':>9}"))
    for name, key in (("fused", "fused_vs_per_layer"), ("fused+filter", "filter_vs_per_layer")):
        ratios = [a / b for a, b in zip(res[name]["round_s"], res["per layer"]["round_s"])]
        lo, hi, cov = median_interval(ratios)
        out[key] = {"median": float(np.median(ratios)), "interval": [lo, hi], "coverage": cov, "rounds": len(ratios)}
        say(f"{name} / per layer, paired by round: {out[key]['median']:.3f} [{lo:.3f}, {hi:.3f}] ({cov:.0%} interval "
            f"over {len(ratios)} rounds)")
    losses = ", ".join(f"{r['loss']:.6g}" for r in rows)
    say(f"the forward's results are the same bit for bit (losses {losses}); "
        f"the frozen filters' weight halo fetched {out['weight_halo_fetches']} time(s), in the warm-up")
    return out


def break_even(predict: Callable[..., dict[str, Any]], machine: dict[str, Any], fused: tuple[int, ...],
               across: bool, filters: tuple[int, ...] = ()) -> dict[str, Any]:
    """The latency per message (on ``node_link`` with ``across``, else ``link``) at which the planner
    predicts the fused step (``filters``: with those frozen filters fused too) as fast as the per-layer
    one, the machine's other numbers kept; None where fusing saves no message (then no latency makes
    it win).  ``predict(machine, fuse, fuse_filter)`` -> predict_step's dict."""
    key = "node_link" if across and machine.get("node_link") else "link"
    alpha0 = machine[key]["alpha_s"]

    def gap(alpha: float) -> float:  # fused minus per-layer step, predicted with this latency
        m = copy.deepcopy(machine)
        m[key]["alpha_s"] = alpha
        return predict(m, fused, filters)["seconds"] - predict(m, (), ())["seconds"]

    if gap(alpha0) <= 0:
        return {"link": key, "alpha_s": alpha0, "break_even_alpha_s": alpha0, "wins_now": True}
    hi = alpha0 * 2 or 1e-6
    for _ in range(40):  # fused saves messages: the gap falls as the latency grows, if it saves any
        if gap(hi) <= 0:
            break
        hi *= 2
    else:
        return {"link": key, "alpha_s": alpha0, "break_even_alpha_s": None, "wins_now": False}
    lo = alpha0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) > 0 else (lo, mid)
    return {"link": key, "alpha_s": alpha0, "break_even_alpha_s": hi, "wins_now": False}
