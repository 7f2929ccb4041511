"""One stage's training step on one rank, eager and through a CUDA graph, beside the run planner.

The trainer's own step (:class:`~cotsdl.train.GreedyTrainer` on synthetic images, no data file
read) is timed with its device work launched eagerly and, on the ``cuda`` backend, as one captured
CUDA graph (``GreedyTrainer(graph=True)``, :mod:`cotsdl.train.graph`).  Reported per setting: the
median step time over interleaved rounds with a distribution-free interval, images/s, the peak
memory the step holds (the CuPy pools' bytes on a GPU, the process's peak resident memory on a
host), and the planner's predicted step time and memory per rank on a machine beside the measured
ones.  Before the timing, both settings train the same steps from the same start on the same
images, and their weights are compared (the graph must compute what the eager step computes).
Where the graph cannot be used (a host backend, a failed capture) the row says why; nothing fails.
"""
from __future__ import annotations

import gc
import io
import resource
import sys
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .. import backend, ops
from ..array.collective import raise_collectively
from ..nn.network import Network
from ..train import GreedyTrainer, InMemorySource
from ..train.graph import WARMUP
from .sampling import median_interval, median_order
from .scaling import timed_rounds

#: The ``--graph`` settings and the trainer settings they measure.
GRAPH_SETTINGS = {"off": (False,), "on": (True,), "both": (False, True)}


def _memory(xp: Any) -> dict[str, Any]:
    """What the process holds now: the CuPy default pool's reserved and used bytes on a GPU (it never
    gives memory back unasked: its reserved bytes are the high-water mark since it was last emptied),
    else the process's peak resident memory."""
    if xp is not np:
        pool = xp.get_default_memory_pool()
        free, total = xp.cuda.runtime.memGetInfo()  # the whole device: every pool, the context, other processes
        return {"kind": "cupy-pool", "reserved_bytes": int(pool.total_bytes()), "used_bytes": int(pool.used_bytes()),
                "device_used_bytes": int(total - free)}
    return {"kind": "peak-rss", "reserved_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,
            "used_bytes": None}


def _fresh_pool(xp: Any) -> int:
    """Free the default pool's cached blocks; the bytes still reserved (arrays alive)."""
    gc.collect()
    if xp is np:
        return 0
    pool = xp.get_default_memory_pool()
    pool.free_all_blocks()
    return int(pool.total_bytes())


def _weights(tr: GreedyTrainer, stage: int) -> np.ndarray:
    return np.array(backend.to_numpy(tr.params[tr.filter_layers[stage]]))  # a copy: training goes on in place


def run(comm: MPI.Comm, network: Network, make_optimizer: Callable[[], Any], *, batch: int, stage: int = 0,
        steps: int = 42, warmup: int = 3, rounds: int = 7, check_steps: int = 5, graph: str = "both",
        predict: Callable[[], dict[str, Any]] | None = None, machine: str | None = None, log=sys.stdout,
        **kw) -> dict[str, Any]:
    """Time ``steps`` training steps of ``stage`` (after ``warmup``) per graph setting in ``rounds``
    interleaved rounds, on the one rank of ``comm``.

    ``graph``: "off", "on" or "both" (:data:`GRAPH_SETTINGS`).  ``check_steps``: steps both settings
    train from the same start before the timing, their weights then compared.  ``predict()``
    (optional): the planner's prediction for the step (``planner.predict_step``'s dict) on ``machine``.
    ``kw``: further :class:`GreedyTrainer` settings (lam, tied, seed, dtype, filter_norm).
    """
    err = None
    if comm.Get_size() != 1:
        err = (f"bench step times one rank's step; run it on 1 rank, not {comm.Get_size()} (the step of several "
               "ranks: cotsdl bench scaling)")
    elif graph not in GRAPH_SETTINGS:
        err = f"graph must be one of {', '.join(GRAPH_SETTINGS)}, got {graph!r}"
    elif not 0 <= stage < len(network.stages):
        err = f"stage must be in [0, {len(network.stages)}), got {stage}"
    elif not (steps >= 1 and rounds >= 1 and warmup >= 0 and check_steps >= 1):
        err = f"need steps >= 1, rounds >= 1, warmup >= 0, check_steps >= 1; got {steps}, {rounds}, {warmup}, {check_steps}"
    raise_collectively(comm, err)
    say = lambda *a: print(*a, file=log, flush=True)  # noqa: E731
    rounds = max(1, min(rounds, steps))
    warmup = max(warmup, WARMUP + 1)  # the graph is captured within the warm-up, never in a timed step
    xp = backend.xp()
    rng = np.random.default_rng(0)
    images = rng.standard_normal((2 * batch,) + network.input_shape).astype(np.float32)
    name = backend.name()
    say(f"cotsdl bench step: stage {stage} of {len(network.stages)}, batch {batch}, backend {name}, "
        f"{steps} steps (+{warmup} warm-up) per setting in {rounds} interleaved round(s); graph {graph}")

    # Memory and agreement: each setting alone from a freshly emptied pool, the same steps from the same start.
    trainers: dict[bool, GreedyTrainer] = {}
    rows: dict[bool, dict[str, Any]] = {}
    weights: dict[bool, np.ndarray] = {}
    replays: dict[bool, int] = {}
    for g in GRAPH_SETTINGS[graph]:
        base = _fresh_pool(xp)
        tr = GreedyTrainer(network, InMemorySource(images), make_optimizer(), comm=comm, batch=batch, grid=(1, 1),
                           overlap=False, log_every=0, log=io.StringIO(), graph=g, **kw)
        row: dict[str, Any] = {"graph": g, "available": True, "reason": None}
        if g and not tr.graph.active:
            row.update(available=False, reason=tr.graph.reason)
            say(f"graph on: {tr.graph.reason}")
            rows[g] = row
            continue
        try:
            tr.train_stage(stage, check_steps)
        except Exception as e:  # noqa: BLE001 - reported, the other setting goes on
            row.update(available=False, reason=f"training failed: {type(e).__name__}: {e}")
            say(f"graph {'on' if g else 'off'}: {row['reason']}")
            rows[g] = row
            continue
        if g and not tr.graph.active:  # capture failed: the trainer went on eagerly
            row.update(available=False, reason=tr.graph.reason)
            say(f"graph on: {tr.graph.reason}")
        mem = _memory(xp)
        mem["step_bytes"] = mem["reserved_bytes"] - base + tr.graph.pool_bytes() if xp is not np else None
        mem["graph_pool_bytes"] = tr.graph.pool_bytes()
        row["memory"] = mem
        row["launch"] = tr.graph.describe()
        rows[g] = row
        if row["available"]:  # (a failed capture's steps were eager: nothing to compare)
            weights[g], replays[g] = _weights(tr, stage), tr.graph.replays
            trainers[g] = tr
    check = None
    if len(weights) == 2:
        a, b = weights[False], weights[True]
        diff = float(np.max(np.abs(a - b))) if a.size else 0.0
        check = {"steps": check_steps, "graph_replays": replays[True], "allclose": bool(np.allclose(a, b, rtol=1e-5, atol=1e-6)),
                 "identical": bool(np.array_equal(a, b)), "max_abs_diff": diff,
                 "max_abs_weight": float(np.max(np.abs(a))) if a.size else 0.0}
        say(f"check: {check_steps} steps ({replays[True]} of them graph replays) vs {check_steps} eager steps from the "
            "same start: weights "
            f"{'identical' if check['identical'] else 'allclose' if check['allclose'] else 'DIFFER'} "
            f"(max |diff| {diff:.3g}, max |w| {check['max_abs_weight']:.3g})")

    # Timing: the settings that run, interleaved by round (ABBA...).
    timing, timing_error = {}, None
    while trainers:
        try:
            timing = timed_rounds(comm, trainers, stage, steps, warmup, rounds)
            break
        except Exception as e:  # noqa: BLE001 - reported; the eager step is timed alone, if it still can be
            timing_error = f"timing failed with {'the graph' if True in trainers else 'the eager step'}: " \
                           f"{type(e).__name__}: {e}"
            say(timing_error)
            if True not in trainers:
                break
            rows[True].update(available=False, reason=timing_error)
            trainers.pop(True)
    pred = None
    if predict is not None:
        try:
            p = predict()
            pred = {"machine": machine, "seconds": float(p["seconds"]), "memory_bytes": float(p["memory_bytes"]),
                    "device_memory_bytes": float(p["device_memory_bytes"]), "fits": bool(p["fits"])}
        except Exception as e:  # noqa: BLE001 - the measurement stands without it
            pred = {"machine": machine, "error": f"{type(e).__name__}: {e}"}
    say(f"{'graph':>5} {'step ms':>9} {'interval ms':>17} {'images/s':>9} {'peak MiB':>9} {'pred ms':>8} "
        f"{'pred/meas':>9} {'pred MiB':>9} {'pred/meas':>9}  launch")
    results = []
    for g, row in rows.items():
        m = timing.get(g)
        if m is not None:
            lo, hi, cov = median_interval(m["round_s"])
            row.update(step_s=m["step_s"], interval_s=[lo, hi], coverage=cov, round_s=m["round_s"],
                       images_per_s=batch / m["step_s"], steps=m["steps"], loss=m["loss"],
                       launch=trainers[g].graph.describe(), graph_captures=trainers[g].graph.captures,
                       graph_replays=trainers[g].graph.replays)
        mem = (row.get("memory") or {})
        measured_mem = mem.get("step_bytes") if mem.get("kind") == "cupy-pool" else mem.get("reserved_bytes")
        row["predicted"] = pred
        ok = pred is not None and "seconds" in pred
        row["time_ratio"] = pred["seconds"] / row["step_s"] if ok and row.get("step_s") else None
        row["memory_ratio"] = pred["memory_bytes"] / measured_mem if ok and measured_mem else None
        nan = float("nan")
        if "step_s" in row:
            say(f"{'on' if g else 'off':>5} {1e3 * row['step_s']:>9.2f} "
                f"{f'[{1e3 * lo:.2f}, {1e3 * hi:.2f}]':>17} {row['images_per_s']:>9.0f} "
                f"{(measured_mem or nan) / 2**20:>9.1f} {1e3 * pred['seconds'] if ok else nan:>8.2f} "
                f"{row['time_ratio'] or nan:>9.2f} {pred['memory_bytes'] / 2**20 if ok else nan:>9.1f} "
                f"{row['memory_ratio'] or nan:>9.2f}  {row['launch']}")
        else:
            say(f"{'on' if g else 'off':>5} {'-':>9} {'-':>17} {'-':>9} {'-':>9} {'-':>8} {'-':>9} {'-':>9} {'-':>9}  "
                f"not measured: {row['reason']}")
        results.append(row)
    speedup = None
    if len(timing) == 2:
        ratios = [e / c for e, c in zip(timing[False]["round_s"], timing[True]["round_s"])]
        lo, hi, cov = median_interval(ratios)
        speedup = {"value": float(np.median(ratios)), "interval": [lo, hi], "coverage": cov}
        say(f"graph speed-up (eager step / graph step, paired by round): {speedup['value']:.2f} "
            f"[{lo:.2f}, {hi:.2f}] ({100 * cov:.0f}% coverage)")
    if pred is not None and "error" in pred:
        say(f"planner on {machine}: {pred['error']}")
    elif pred is not None:
        say(f"planner on {machine}: step {1e3 * pred['seconds']:.2f} ms, {pred['memory_bytes'] / 2**20:.1f} MiB per rank "
            f"({'fits' if pred['fits'] else 'does NOT fit'} in {pred['device_memory_bytes'] / 2**30:.0f} GiB)")
    say(f"interval: distribution-free for the median over the rounds' medians "
        f"({100 * median_order(rounds)[1]:.0f}% coverage with {rounds} rounds); peak MiB: "
        + ("the CuPy pools' bytes the setting reserved (its high-water mark), graph pool included"
           if xp is not np else "the process's peak resident memory so far (both settings, the process itself)"))
    return {"benchmark": "step", "backend": name, "stage": stage, "batch": batch, "steps": steps, "warmup": warmup,
            "rounds": rounds, "graph": graph, "check": check, "timing_error": timing_error, "speedup": speedup,
            "predicted": pred, "threads": ops.num_threads() if xp is np else None,
            "results": results}
