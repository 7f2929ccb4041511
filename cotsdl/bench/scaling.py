"""Strong scaling of training steps: the same global batch on 1, 2, 4, ... ranks of the world.

Every setting (ranks p, replicas r, model grid, overlap on/off) runs real training
steps of one stage (:class:`~cotsdl.train.GreedyTrainer` on synthetic images) on the
first p ranks; the others wait without spinning.  Reported per setting: the median
step time (each step the slowest rank's), images/s, efficiency T(1) / (p T(p)), where
p ranks get whole cores of this node also the efficiency per core (T(1) of one rank on a
rank's share of the cores while every rank runs such a copy, timed in the same rounds),
time inside exchanges vs the rest, the share of exchange time overlap hides, given a
machine description, the planner's predicted step time beside the measured one, and what
``parallel.overlap = "auto"`` chooses for the setting (with both measured: its step time
vs the other's, paired by round).
"""
from __future__ import annotations

import io
import sys
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .. import ops
from ..array.collective import allreduce, raise_collectively, wait_idle
from ..array.grid import describe_nodes, node_names, placement, rank_nodes
from ..array.partition import choose_grid
from ..nn.network import Network
from ..train import GreedyTrainer, InMemorySource
from .sampling import median_interval, median_order


def rank_counts(world: int) -> list[int]:
    """1, 2, 4, ... up to ``world``, and ``world`` itself."""
    out, p = [], 1
    while p < world:
        out.append(p)
        p *= 2
    return out + [world]


def _steps(sub: MPI.Comm, network: Network, make_optimizer: Callable[[], Any], batch: int, replicas: int,
           dims: tuple[int, int], overlaps: tuple[bool, ...], stage: int, steps: int, warmup: int, rounds: int,
           kw: dict[str, Any], alone: bool = False) -> dict[bool, dict]:
    """Time ``steps`` training steps of ``stage`` on ``sub`` per overlap setting, the settings in
    ``rounds`` (at most ``steps``) interleaved rounds (ABBA...: a burst of load spoils a round of
    each alike); per-step maxima over its ranks, and each round's median step (``round_s``) for
    paired comparisons.

    ``alone``: each round also times the same steps of one rank alone, with the same threads, on every
    rank of ``sub`` at once (each a whole copy: the cores as busy as in the p-rank step):
    ``alone_round_s``, the median over the ranks of their rounds' medians."""
    rng = np.random.default_rng(0)
    images = rng.standard_normal((2 * batch * replicas,) + network.input_shape).astype(np.float32)

    def trainer(comm: MPI.Comm, ov: bool, grid: tuple[int, int]) -> GreedyTrainer:
        return GreedyTrainer(network, InMemorySource(images), make_optimizer(), comm=comm, batch=batch,
                             replicas=replicas, grid=grid, overlap=ov, log_every=0, log=io.StringIO(), **kw)

    trainers = {ov: trainer(sub, ov, dims) for ov in overlaps}
    one = trainer(MPI.COMM_SELF, False, (1, 1)) if alone else None
    return timed_rounds(sub, trainers, stage, steps, warmup, rounds, one)


def timed_rounds(sub: MPI.Comm, trainers: dict[Any, GreedyTrainer], stage: int, steps: int, warmup: int,
                 rounds: int, one: GreedyTrainer | None = None) -> dict[Any, dict]:
    """Time ``steps`` training steps of ``stage`` of every trainer (by setting), in ``rounds`` interleaved
    rounds (ABBA...); per setting the median step (each step the slowest rank's), its exchange time and
    halo messages, each round's median (``round_s``), and with ``one`` (a one-rank trainer on every rank
    of ``sub``) the same rounds' steps of one rank alone (``alone_round_s``)."""
    keys = list(trainers)
    for tr in (*trainers.values(), one):
        if warmup and tr is not None:
            tr.train_stage(stage, warmup)
    sec: dict[Any, list[float]] = {k: [] for k in keys}
    ex: dict[Any, list[float]] = {k: [] for k in keys}
    msgs: dict[Any, list[int]] = {k: [] for k in keys}
    per_round: dict[Any, list[float]] = {k: [] for k in keys}
    single: list[float] = []
    for r in range(rounds):
        n = steps // rounds + (r < steps % rounds)
        for k in (keys if r % 2 == 0 else keys[::-1]):
            recs = trainers[k].train_stage(stage, n)
            t = allreduce(sub, np.array([rec["seconds"] for rec in recs]), MPI.MAX)
            sec[k] += t.tolist()
            ex[k] += [rec["exchange_seconds"] for rec in recs]  # already the slowest rank's
            msgs[k] += [rec["halo_messages"] for rec in recs]
            per_round[k].append(float(np.median(t)))
        if one is not None:
            mine = np.median([rec["seconds"] for rec in one.train_stage(stage, n)])
            single.append(float(np.median(sub.allgather(float(mine)))))
    return {k: {"step_s": float(np.median(sec[k])), "exchange_s": float(np.median(ex[k])),
                "halo_messages": int(np.median(msgs[k])), "steps": len(sec[k]), "round_s": per_round[k],
                "alone_round_s": single or None, "loss": float(trainers[k].history[-1]["loss"])} for k in keys}


def _core_efficiency(m: dict[str, Any]) -> dict[str, Any] | None:
    """T(1 rank, the same threads, every core running one) / (p T(p)), paired by round: what model
    parallelism keeps of the node's throughput against independent copies (exchanges, halos, uneven
    parts, per-rank costs); the median over rounds, a distribution-free interval of it and its
    coverage (None where not measured)."""
    if not m.get("alone_round_s"):
        return None
    ratios = [a / (m["ranks"] * t) for a, t in zip(m["alone_round_s"], m["round_s"])]
    lo, hi, coverage = median_interval(ratios)
    return {"value": float(np.median(ratios)), "interval": [lo, hi], "coverage": coverage}


def settings(p: int, batch: int, replicas: int | None, grid: tuple[int, int] | None,
             extent: tuple[int, int]) -> list[tuple[int, tuple[int, int]]]:
    """(replicas, grid) pairs measured on p ranks: one model group over all p ranks, and the
    requested replicas x grid split when it fits."""
    out = [(1, tuple(grid) if grid and grid[0] * grid[1] == p else choose_grid(p, extent))]
    if replicas and replicas > 1 and p % replicas == 0 and batch % replicas == 0:
        out.append((replicas, choose_grid(p // replicas, extent)))
    return out


def _choices(comm: MPI.Comm, decide: Callable[..., Any] | None, keys: list,
             nodes: list[int]) -> dict[tuple, dict[str, Any]]:
    """What "auto" chooses for every (ranks, replicas, grid), decided on rank 0 and broadcast (collective)."""
    if decide is None:
        return {}
    out, err = None, None
    if comm.Get_rank() == 0:
        try:
            out = {k: {"overlap": c.on, "reason": c.reason} for k in keys
                   for c in [decide(*k, *placement(nodes, k[0], k[1]))]}
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            err = f'overlap "auto": the run planner failed: {type(e).__name__}: {e}'
    raise_collectively(comm, err, RuntimeError)
    return comm.bcast(out, root=0)


def _auto(choice: dict[str, Any] | None, m: dict[str, Any], mine: list[dict[str, Any]]) -> dict[str, Any] | None:
    """"auto"'s choice for the setting of row ``m`` and, with on and off both measured, its step time
    relative to the other's, paired by round: ``vs_other`` the median over rounds of (chosen round's
    median step / the other's) - 1, ``interval`` a distribution-free interval of that median with its
    ``coverage``, ``vs_best`` = max(vs_other, 0) (0: it chose the faster)."""
    if choice is None:
        return None
    same = {o["overlap"]: o["round_s"] for o in mine
            if (o["ranks"], o["replicas"], o["grid"]) == (m["ranks"], m["replicas"], m["grid"])}
    if len(same) != 2:
        return {**choice, "vs_best": None, "vs_other": None, "interval": None, "coverage": None}
    ratios = [a / b for a, b in zip(same[choice["overlap"]], same[not choice["overlap"]])]
    lo, hi, coverage = median_interval(ratios)
    vs = float(np.median(ratios)) - 1
    return {**choice, "vs_best": max(vs, 0.0), "vs_other": vs, "interval": [lo - 1, hi - 1], "coverage": coverage}


def _auto_text(auto: dict[str, Any]) -> str:
    """``off (-4.1% vs on [-9.0%, +1.2%])``, or ``on`` when only one of on and off was measured."""
    what = "on" if auto["overlap"] else "off"
    if auto["vs_other"] is None:
        return what
    lo, hi = auto["interval"]
    return (f"{what} ({100 * auto['vs_other']:+.1f}% vs {'off' if auto['overlap'] else 'on'} "
            f"[{100 * lo:+.1f}%, {100 * hi:+.1f}%])")


def run(comm: MPI.Comm, network: Network, make_optimizer: Callable[[], Any], *, batch: int, stage: int = 0,
        steps: int = 12, warmup: int = 2, rounds: int = 6, replicas: int | None = None,
        grid: tuple[int, int] | None = None,
        overlaps: tuple[bool | str, ...] = (True, False), predict: Callable[..., float] | None = None,
        decide: Callable[..., Any] | None = None, log=sys.stdout, **kw) -> dict[str, Any]:
    """Measure every setting on 1..P ranks of ``comm``; ``batch`` is the global batch.

    ``predict(p, replicas, dims, overlap, ranks_per_node)`` (optional) returns a predicted step time in
    seconds; ``decide(p, replicas, dims, ranks_per_node, group_on_one_node)`` (optional) what
    ``parallel.overlap = "auto"`` chooses there (an :class:`~cotsdl.planner.OverlapChoice`), asked on
    rank 0 only; both are told where the setting's ranks are (:func:`~cotsdl.array.grid.placement`).  ``overlaps`` (True, False) or
    ("auto",): each setting with what ``decide`` chooses.  The ``steps`` of a setting run in ``rounds``
    rounds, its overlap settings interleaved (both are held at once: twice a trainer's memory).
    """
    rank, world = comm.Get_rank(), comm.Get_size()
    rounds = max(1, min(rounds, steps))
    say = (lambda *a: print(*a, file=log, flush=True)) if rank == 0 else (lambda *a: None)
    cores = ops.available_cores()
    results: list[dict[str, Any]] = []
    nodes = rank_nodes(comm)  # (collective) the settings' ranks per node, and whether a model group spans nodes
    layout = node_names(comm)  # (collective) for the header: which ranks share a node
    choices = _choices(comm, decide, [(p, r, dims) for p in rank_counts(world)
                                      for r, dims in settings(p, batch, replicas, grid, network.input_shape[:2])],
                       nodes)
    say(f"cotsdl bench scaling: stage {stage}, global batch {batch}, {steps} steps (+{warmup} warm-up) per setting in "
        f"{rounds} interleaved round(s), "
        f"{world} rank(s) on {describe_nodes(layout)} (rank 0 sees {cores} core(s)); each setting's predictions "
        "and auto decision take its ranks per node")
    say(f"{'ranks':>5} {'repl':>4} {'grid':>5} {'overlap':>7} {'step ms':>9} {'images/s':>9} {'effic.':>6} "
        f"{'eff/core':>8} "
        f"{'compute ms':>10} {'exch ms':>8} {'hidden':>6} {'pred ms':>8} {'pred/meas':>9}"
        + ("  auto (chosen vs other, paired by round)" if choices else ""))
    base: dict[bool, float] = {}
    for p in rank_counts(world):
        sub = comm.Split(0 if rank < p else MPI.UNDEFINED, rank)
        mine: list[dict[str, Any]] = []
        if sub != MPI.COMM_NULL:
            per_node = placement(nodes, p)[0]  # the node's cores shared by its active ranks
            ops.set_num_threads(max(1, cores // min(per_node, cores)))
            for r, dims in settings(p, batch, replicas, grid, network.input_shape[:2]):
                ovs = (choices[(p, r, dims)]["overlap"],) if overlaps == ("auto",) else tuple(overlaps)
                alone = r == 1 and 1 < p and per_node <= cores  # each rank on whole cores
                for ov, m in _steps(sub, network, make_optimizer, batch // r, r, dims, ovs, stage, steps, warmup,
                                    rounds, kw, alone).items():
                    m.update(ranks=p, replicas=r, grid=list(dims), overlap=ov, images_per_s=batch / m["step_s"],
                             compute_s=max(m["step_s"] - m["exchange_s"], 0.0))
                    mine.append(m)
            sub.Free()
            ops.set_num_threads(None)
        wait_idle(comm)
        mine = comm.bcast(mine, root=0)  # rank 0 is in every setting
        for m in mine:
            m["auto"] = _auto(choices.get((m["ranks"], m["replicas"], tuple(m["grid"]))), m, mine)
            if m["ranks"] == 1:
                base[m["overlap"]] = m["step_s"]
            t1 = base.get(m["overlap"], min(base.values(), default=None))  # ("auto" measures one of them)
            m["efficiency"] = t1 / (m["ranks"] * m["step_s"]) if t1 else None
            m["core_efficiency"] = _core_efficiency(m)
            off = next((o for o in mine if not o["overlap"] and o["replicas"] == m["replicas"]), None)
            m["hidden"] = ((off["step_s"] - m["step_s"]) / off["exchange_s"]
                           if m["overlap"] and off and off["exchange_s"] > 0 else None)
            m["predicted_s"] = (predict(m["ranks"], m["replicas"], tuple(m["grid"]), m["overlap"],
                                        placement(nodes, m["ranks"], m["replicas"])[0]) if predict else None)
            m["ratio"] = m["predicted_s"] / m["step_s"] if m["predicted_s"] else None
            say(f"{m['ranks']:>5} {m['replicas']:>4} {'x'.join(map(str, m['grid'])):>5} {'on' if m['overlap'] else 'off':>7} "
                f"{1e3 * m['step_s']:>9.1f} {m['images_per_s']:>9.1f} "
                f"{m['efficiency'] if m['efficiency'] is not None else float('nan'):>6.2f} "
                f"{m['core_efficiency']['value'] if m['core_efficiency'] else float('nan'):>8.2f} "
                f"{1e3 * m['compute_s']:>10.1f} "
                f"{1e3 * m['exchange_s']:>8.1f} {m['hidden'] if m['hidden'] is not None else float('nan'):>6.2f} "
                f"{1e3 * m['predicted_s'] if m['predicted_s'] else float('nan'):>8.1f} "
                f"{m['ratio'] if m['ratio'] else float('nan'):>9.2f}" + (f"  {_auto_text(m['auto'])}"
                                                                          if m["auto"] else ""))
        results += mine
    say("efficiency: T(1 rank) / (ranks x T); eff/core: the same with T(1 rank) on a rank's share of the cores "
        "while every rank runs such a copy (the cores as busy), paired by round (median; JSON: core_efficiency, "
        "its interval); "
        "hidden: (step without overlap - step with) / exchange time without; "
        "exchange: time inside exchange calls (slowest rank)")
    if choices:
        say('auto: what parallel.overlap = "auto" chooses for the setting and, with both measured, the median over '
            "rounds of its round's median step / the other's, minus 1, with a distribution-free interval of that "
            f"median ({100 * median_order(rounds)[1]:.0f}% coverage); why:")
        for (p, r, dims), c in choices.items():
            say(f"  {p} rank(s), {r} replica(s) x grid {dims[0]}x{dims[1]}: {'on' if c['overlap'] else 'off'}: "
                f"{c['reason']}")
    return {"benchmark": "scaling", "stage": stage, "global_batch": batch, "steps": steps, "warmup": warmup,
            "rounds": rounds,
            "cores": cores, "world": world, "results": results}
