"""Strong scaling of training steps: the same global batch on 1, 2, 4, ... ranks of the world.

Every setting (ranks p, replicas r, model grid, overlap on/off) runs real training
steps of one stage (:class:`~cotsdl.train.GreedyTrainer` on synthetic images) on the
first p ranks; the others wait without spinning.  Reported per setting: the median
step time (each step the slowest rank's), images/s, efficiency T(1) / (p T(p)), time
inside exchanges vs the rest, the share of exchange time overlap hides, given a
machine description, the planner's predicted step time beside the measured one, and what
``parallel.overlap = "auto"`` chooses for the setting (with both measured: its step time
vs the faster of on and off).
"""
from __future__ import annotations

import io
import sys
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .. import ops
from ..array.collective import allreduce, raise_collectively
from ..array.partition import choose_grid
from ..nn.network import Network
from ..train import GreedyTrainer, InMemorySource
from .common import wait_idle


def rank_counts(world: int) -> list[int]:
    """1, 2, 4, ... up to ``world``, and ``world`` itself."""
    out, p = [], 1
    while p < world:
        out.append(p)
        p *= 2
    return out + [world]


def _steps(sub: MPI.Comm, network: Network, make_optimizer: Callable[[], Any], batch: int, replicas: int,
           dims: tuple[int, int], overlap: bool, stage: int, steps: int, warmup: int, kw: dict[str, Any]) -> dict:
    """Time ``steps`` training steps of ``stage`` on ``sub``; per-step maxima over its ranks."""
    rng = np.random.default_rng(0)
    images = rng.standard_normal((2 * batch * replicas,) + network.input_shape).astype(np.float32)
    tr = GreedyTrainer(network, InMemorySource(images), make_optimizer(), comm=sub, batch=batch, replicas=replicas,
                       grid=dims, overlap=overlap, log_every=0, log=io.StringIO(), **kw)
    if warmup:
        tr.train_stage(stage, warmup)
    recs = tr.train_stage(stage, steps)
    sec = allreduce(sub, np.array([r["seconds"] for r in recs]), MPI.MAX)
    ex = np.array([r["exchange_seconds"] for r in recs])  # already the slowest rank's
    return {"step_s": float(np.median(sec)), "exchange_s": float(np.median(ex)),
            "steps": len(recs), "loss": float(recs[-1]["loss"])}


def settings(p: int, batch: int, replicas: int | None, grid: tuple[int, int] | None,
             extent: tuple[int, int]) -> list[tuple[int, tuple[int, int]]]:
    """(replicas, grid) pairs measured on p ranks: one model group over all p ranks, and the
    requested replicas x grid split when it fits."""
    out = [(1, tuple(grid) if grid and grid[0] * grid[1] == p else choose_grid(p, extent))]
    if replicas and replicas > 1 and p % replicas == 0 and batch % replicas == 0:
        out.append((replicas, choose_grid(p // replicas, extent)))
    return out


def _choices(comm: MPI.Comm, decide: Callable[..., Any] | None, keys: list) -> dict[tuple, dict[str, Any]]:
    """What "auto" chooses for every (ranks, replicas, grid), decided on rank 0 and broadcast (collective)."""
    if decide is None:
        return {}
    out, err = None, None
    if comm.Get_rank() == 0:
        try:
            out = {k: {"overlap": c.on, "reason": c.reason} for k in keys for c in [decide(*k)]}
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            err = f'overlap "auto": the run planner failed: {type(e).__name__}: {e}'
    raise_collectively(comm, err, RuntimeError)
    return comm.bcast(out, root=0)


def _auto(choice: dict[str, Any] | None, m: dict[str, Any], mine: list[dict[str, Any]]) -> dict[str, Any] | None:
    """"auto"'s choice for the setting of row ``m``, and with on and off both measured, its step time
    relative to the faster of them (0: it chose the faster)."""
    if choice is None:
        return None
    same = {o["overlap"]: o["step_s"] for o in mine
            if (o["ranks"], o["replicas"], o["grid"]) == (m["ranks"], m["replicas"], m["grid"])}
    vs = same[choice["overlap"]] / min(same.values()) - 1 if len(same) == 2 else None
    return {**choice, "vs_best": vs}


def _auto_text(auto: dict[str, Any]) -> str:
    """``off (best)``, ``on (+3.1% vs best)``, or ``on`` when only one of on and off was measured."""
    what = "on" if auto["overlap"] else "off"
    if auto["vs_best"] is None:
        return what
    return f"{what} (best)" if auto["vs_best"] == 0 else f"{what} (+{100 * auto['vs_best']:.1f}% vs best)"


def run(comm: MPI.Comm, network: Network, make_optimizer: Callable[[], Any], *, batch: int, stage: int = 0,
        steps: int = 12, warmup: int = 2, replicas: int | None = None, grid: tuple[int, int] | None = None,
        overlaps: tuple[bool | str, ...] = (True, False), predict: Callable[..., float] | None = None,
        decide: Callable[..., Any] | None = None, log=sys.stdout, **kw) -> dict[str, Any]:
    """Measure every setting on 1..P ranks of ``comm``; ``batch`` is the global batch.

    ``predict(p, replicas, dims, overlap)`` (optional) returns a predicted step time in seconds;
    ``decide(p, replicas, dims)`` (optional) what ``parallel.overlap = "auto"`` chooses there (an
    :class:`~cotsdl.planner.OverlapChoice`), asked on rank 0 only.  ``overlaps`` (True, False) or
    ("auto",): each setting with what ``decide`` chooses.
    """
    rank, world = comm.Get_rank(), comm.Get_size()
    say = (lambda *a: print(*a, file=log, flush=True)) if rank == 0 else (lambda *a: None)
    cores = ops.available_cores()
    results: list[dict[str, Any]] = []
    choices = _choices(comm, decide, [(p, r, dims) for p in rank_counts(world)
                                      for r, dims in settings(p, batch, replicas, grid, network.input_shape[:2])])
    say(f"cotsdl bench scaling: stage {stage}, global batch {batch}, {steps} steps (+{warmup} warm-up) per setting, "
        f"{world} rank(s) on {cores} core(s) here")
    say(f"{'ranks':>5} {'repl':>4} {'grid':>5} {'overlap':>7} {'step ms':>9} {'images/s':>9} {'effic.':>6} "
        f"{'compute ms':>10} {'exch ms':>8} {'hidden':>6} {'pred ms':>8} {'pred/meas':>9}"
        + (f"  {'auto':<20}" if choices else ""))
    base: dict[bool, float] = {}
    for p in rank_counts(world):
        sub = comm.Split(0 if rank < p else MPI.UNDEFINED, rank)
        mine: list[dict[str, Any]] = []
        if sub != MPI.COMM_NULL:
            ops.set_num_threads(max(1, cores // min(p, cores)))  # the node's cores shared by the active ranks
            for r, dims in settings(p, batch, replicas, grid, network.input_shape[:2]):
                for ov in ((choices[(p, r, dims)]["overlap"],) if overlaps == ("auto",) else overlaps):
                    m = _steps(sub, network, make_optimizer, batch // r, r, dims, ov, stage, steps, warmup, kw)
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
            off = next((o for o in mine if not o["overlap"] and o["replicas"] == m["replicas"]), None)
            m["hidden"] = ((off["step_s"] - m["step_s"]) / off["exchange_s"]
                           if m["overlap"] and off and off["exchange_s"] > 0 else None)
            m["predicted_s"] = predict(m["ranks"], m["replicas"], tuple(m["grid"]), m["overlap"]) if predict else None
            m["ratio"] = m["predicted_s"] / m["step_s"] if m["predicted_s"] else None
            say(f"{m['ranks']:>5} {m['replicas']:>4} {'x'.join(map(str, m['grid'])):>5} {'on' if m['overlap'] else 'off':>7} "
                f"{1e3 * m['step_s']:>9.1f} {m['images_per_s']:>9.1f} "
                f"{m['efficiency'] if m['efficiency'] is not None else float('nan'):>6.2f} {1e3 * m['compute_s']:>10.1f} "
                f"{1e3 * m['exchange_s']:>8.1f} {m['hidden'] if m['hidden'] is not None else float('nan'):>6.2f} "
                f"{1e3 * m['predicted_s'] if m['predicted_s'] else float('nan'):>8.1f} "
                f"{m['ratio'] if m['ratio'] else float('nan'):>9.2f}" + (f"  {_auto_text(m['auto']):<20}"
                                                                          if m["auto"] else ""))
        results += mine
    say("efficiency: T(1 rank) / (ranks x T); hidden: (step without overlap - step with) / exchange time without; "
        "exchange: time inside exchange calls (slowest rank)")
    if choices:
        say('auto: what parallel.overlap = "auto" chooses for the setting and, with both measured, its step time vs '
            "the faster of on and off; why:")
        for (p, r, dims), c in choices.items():
            say(f"  {p} rank(s), {r} replica(s) x grid {dims[0]}x{dims[1]}: {'on' if c['overlap'] else 'off'}: "
                f"{c['reason']}")
    return {"benchmark": "scaling", "stage": stage, "global_batch": batch, "steps": steps, "warmup": warmup,
            "cores": cores, "world": world, "results": results}
