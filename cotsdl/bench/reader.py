"""``cotsdl bench reader``: the dataset reader's images/s per rank against the training step.

Two measurements of a config's data on its network:

- **the reader alone**: every rank r < Q of the world reads, without prefetch, the input window
  of rank r of a Q-rank model grid (the config's grid where it fits, else the one training
  chooses) for ``batches`` minibatches at the stream positions training reads, all ranks at once;
  per rank the median seconds per minibatch, images/s and MB/s of the window;
- **the step** (``steps`` > 0): real training steps of each stage on the world's ranks reading
  the dataset, in rounds that alternate a source with prefetch (the next minibatch read in a
  background thread while the step computes, as training reads) and one without, after two
  untimed steps of the stage; per stage and
  setting the median step and the time the step was blocked getting its minibatch
  (``read_wait_seconds``, the slowest rank's).  The first step of each round is left out (a
  switched source has nothing read ahead).  Reading stalls a step where the wait with prefetch
  is not ~0.
"""
from __future__ import annotations

import io
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np
from mpi4py import MPI

from ..array.collective import raise_collectively, wait_idle
from ..array.partition import choose_grid
from ..nn.layout import layout
from ..nn.network import Network
from ..train import GreedyTrainer
from .common import metadata


def reader_alone(comm: MPI.Comm, source: Any, network: Network, batch: int, dims: Sequence[int],
                 batches: int) -> list[dict[str, Any]]:
    """Read ``batches`` minibatches of this rank's window of a ``dims`` grid (ranks beyond the grid
    sleep); per rank (gathered on every rank) seconds per minibatch and rates (collective)."""
    rank, q = comm.Get_rank(), int(dims[0]) * int(dims[1])
    mine = None
    if rank < q:
        window, _ = layout(network, dims, (rank // dims[1], rank % dims[1]), batch)
        source.read(0, batch, window)  # opens the chunks' caches, as a first step would
        times = []
        for i in range(1, batches + 1):
            t0 = time.perf_counter()
            source.read(i * batch, batch, window)
            times.append(time.perf_counter() - t0)
        sec = float(np.median(times))
        shape = [hi - lo for lo, hi in zip(window.lo[:3], window.hi[:3])]
        mb = batch * int(np.prod(shape)) * np.dtype(source.info.dtype).itemsize / 1e6  # as stored
        mine = {"rank": rank, "window": shape, "seconds_per_batch": sec, "min_s": float(min(times)),
                "max_s": float(max(times)), "images_per_s": batch / sec, "MB_per_s": mb / sec}
        comm.Ibarrier().Wait()
    else:
        wait_idle(comm)
    return [r for r in comm.allgather(mine) if r is not None]


def steps_with_reader(comm: MPI.Comm, network: Network, sources: dict[str, Any], make_optimizer: Callable[[], Any],
                      batch: int, replicas: int, grid: Sequence[int] | None, stages: Sequence[int], steps: int,
                      rounds: int, kw: dict[str, Any], warmup: int = 2) -> list[dict[str, Any]]:
    """Per stage: ``warmup`` untimed steps, then ``steps`` timed steps per source (``sources``: name ->
    data source over the same file), in ``rounds`` alternating rounds on one trainer."""
    names = list(sources)
    tr = GreedyTrainer(network, sources[names[0]], make_optimizer(), comm=comm, batch=batch, replicas=replicas,
                       grid=grid, log_every=0, log=io.StringIO(), **kw)
    out = []
    for stage in stages:
        tr.train_stage(stage, warmup)  # untimed: the stage's first steps fill its memory and caches
        recs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for k in range(rounds):
            n_steps = steps // rounds + (k < steps % rounds)
            for name in (names if k % 2 == 0 else names[::-1]):
                tr.data = sources[name]  # the same images at the same positions, read another way
                recs[name] += tr.train_stage(stage, n_steps + 1)[1:]
        row: dict[str, Any] = {"stage": stage}
        for name in names:
            r = recs[name]
            row[name] = {"step_s": float(np.median([x["seconds"] for x in r])),
                         "read_wait_s": float(np.median([x["read_wait_seconds"] for x in r])),
                         "read_wait_max_s": float(max(x["read_wait_seconds"] for x in r)),
                         "steps": len(r), "step_s_all": [x["seconds"] for x in r],
                         "read_wait_s_all": [x["read_wait_seconds"] for x in r]}
        out.append(row)
    tr.decomposition.free()
    return out


def run(comm: MPI.Comm, network: Network, make_source: Callable[[bool], Any], batch: int, *, grid_ranks: int,
        dims: Sequence[int] | None, batches: int = 6, steps: int = 0, rounds: int = 2,
        stages: Sequence[int] | None = None, make_optimizer: Callable[[], Any] | None = None,
        replicas: int = 1, grid: Sequence[int] | None = None, kw: dict[str, Any] | None = None,
        log=sys.stdout) -> dict[str, Any]:
    """Measure and return the results (the same on every rank); rank 0 prints.

    ``make_source(prefetch)`` opens the dataset (every rank); ``dims``: the Q-rank grid whose windows
    the reader alone reads (None: chosen for the image, as training does); ``replicas``, ``grid``:
    the split of the world the steps run on."""
    rank = comm.Get_rank()
    stages = list(range(len(network.stages))) if stages is None else list(stages)
    err = None
    if not (batches >= 1 and steps >= 0 and rounds >= 1 and grid_ranks >= 1):
        err = f"need --batches >= 1, --steps >= 0, --rounds >= 1, --grid-ranks >= 1; got {batches}, {steps}, {rounds}, {grid_ranks}"
    elif dims is not None and int(dims[0]) * int(dims[1]) != grid_ranks:
        err = f"grid {list(dims)} does not have {grid_ranks} rank(s)"
    elif any(not 0 <= k < len(network.stages) for k in stages):
        err = f"--stages must be in [0, {len(network.stages)}), got {stages}"
    elif steps and rounds > steps:
        err = f"--rounds {rounds} is more than --steps {steps}"
    raise_collectively(comm, err)
    dims = tuple(dims) if dims is not None else choose_grid(grid_ranks, network.input_shape[:2])
    say = (lambda *a: print(*a, file=log, flush=True)) if rank == 0 else (lambda *a: None)
    alone_src = make_source(False)
    res: dict[str, Any] = {"benchmark": "reader", **metadata(comm), "batch": batch, "grid": list(dims),
                           "image_shape": list(network.input_shape), "dataset": str(getattr(alone_src, "path", "")),
                           "compression": getattr(getattr(alone_src, "info", None), "compression", None)}
    say(f"cotsdl bench reader: {res['dataset']} ({len(alone_src)} images "
        f"{'x'.join(map(str, network.input_shape))}), batch {batch}; the reader alone: the windows of a "
        f"{dims[0]}x{dims[1]} grid, {min(comm.Get_size(), grid_ranks)} rank(s) reading at once, {batches} minibatches")
    res["alone"] = reader_alone(comm, alone_src, network, batch, dims, batches)
    alone_src.close()
    say(f"{'rank':>5} {'window':>14} {'s/batch':>9} {'images/s':>9} {'MB/s':>8}")
    for r in res["alone"]:
        say(f"{r['rank']:5d} {'x'.join(map(str, r['window'])):>14} {r['seconds_per_batch']:9.3f} "
            f"{r['images_per_s']:9.1f} {r['MB_per_s']:8.1f}")
    res["steps"] = []
    if steps:
        sources = {"prefetch": make_source(True), "no prefetch": make_source(False)}
        say(f"training steps on {comm.Get_size()} rank(s), {steps} per stage and setting in {rounds} alternating "
            "rounds (read wait: the slowest rank's time blocked getting its minibatch)")
        res["steps"] = steps_with_reader(comm, network, sources, make_optimizer, batch, replicas, grid, stages,
                                         steps, rounds, kw or {})
        for s in sources.values():
            s.close()
        say(f"{'stage':>5} {'reader':>12} {'step s':>8} {'read wait ms':>13} {'max ms':>8} {'read alone s':>13}")
        alone = max(r["seconds_per_batch"] for r in res["alone"])
        for row in res["steps"]:
            for name in sources:
                m = row[name]
                say(f"{row['stage']:5d} {name:>12} {m['step_s']:8.3f} {m['read_wait_s'] * 1e3:13.1f} "
                    f"{m['read_wait_max_s'] * 1e3:8.1f} {alone:13.3f}")
    return res
