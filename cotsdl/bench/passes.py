"""The passes a calibration times: every pass of a case's stages, called as a training step calls it,
timed in interleaved rounds, and the efficiencies they give (per case, and per case and layer shape).

Used by :mod:`cotsdl.bench.calibrate` (``cotsdl bench calibrate``), whose docstring says what the
cases are and how the planner uses what they give.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .. import ops
from ..array.collective import raise_collectively, wait_idle
from ..nn.network import Network
from ..ops import costs
from ..planner.machine import OPS_OF_KIND
from ..planner.model import UPDATE_WORDS
from .common import as_step
from .sampling import interleaved_rounds, robust, rounds_for

DEMO_STAGES = [
    {"filter": {"size": [7, 7], "stride": [1, 1], "channels": 16},
     "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01}, "lcn": {"size": 9, "sigma": 2.0, "eps": 0.001}},
    {"filter": {"size": [13, 13], "stride": [1, 1], "channels": 16},
     "pool": {"size": [1, 1], "stride": [1, 1], "eps": 0.01}, "lcn": {"size": 1, "sigma": 1.0, "eps": 0.001}},
]
# The first stage of the paper's networks (jobs/configs/paper-*.toml; the sizes of the study differ in their
# maps, not in this layer): 18x18 fields at stride 2, blocks of 4x4 units.
PAPER_STAGES = [
    {"filter": {"size": [18, 18], "stride": [2, 2], "block": [4, 4], "channels": 1},
     "pool": {"size": [5, 5], "stride": [4, 4], "eps": 0.01}, "lcn": {"size": 5, "sigma": 1.0, "eps": 0.0001}},
]
# (label, stages, input (H, W, C), batch N): the demo network on colour 64x64 crops with N = 96; the paper's
# first stage on a 100x200 strip of its 200x200x3 images, N = 96 (one of 2 ranks' share: 264 MB of weights,
# far beyond any cache, where the demo's passes run from cache: the 185M-parameter network's steps took 1.3-2x
# what the demo's efficiencies predicted); and the demo as demo.toml trains it (grey 32x32, N = 32; `bench
# scaling jobs/configs/demo.toml` times this one).  All are printed and written by size
# (``efficiency_by_size``: the planner takes an op's efficiency at its bytes); ``efficiency`` and
# ``efficiency_by_threads`` come from the last case (see ``run``).
CASES = [("64x64x3 N=96", DEMO_STAGES, (64, 64, 3), 96), ("paper 100x200x3 N=96", PAPER_STAGES, (100, 200, 3), 96),
         ("32x32x1 N=32 (demo)", DEMO_STAGES, (32, 32, 1), 32)]
QUICK_CASES = [("paper 64x64x3 N=32 (quick)", PAPER_STAGES, (64, 64, 3), 32),
               ("64x64x3 N=16 (quick)", DEMO_STAGES, (64, 64, 3), 16)]

#: The label of a config's own case begins so (``--config``)
CONFIG_LABEL = "config "

OPS = ["filter_forward", "filter_backward_data", "filter_backward_weights", "pool_forward", "pool_backward",
       "lcn_forward", "lcn_backward", "elementwise"]
#: The elementwise item: a momentum step (the paper's optimizer: one slot) of the stage's weights, counted
#: as the planner counts an update, every word its numpy operations read and write
MOMENTUM_WORDS = UPDATE_WORDS[1]


def demo_network(input_shape) -> Network:
    return Network.from_description({"input": list(input_shape), "stages": DEMO_STAGES})

# -- the passes of a stage ----------------------------------------------------------------
def in_step(fn: Callable[[Any], Any]) -> Callable[[], Any]:
    """``fn(workspace)`` called as a training step calls its pass: scratch in a workspace kept from
    call to call, results in memory lent for the call and taken back at the next (its own, as the
    passes are timed in turn)."""
    lent = ops.Outputs()
    ws = ops.Workspace(lent)
    return as_step(lent, lambda: fn(ws))


def stage_passes(net: Network, N: int, stages, rng) -> list[tuple[str, int, Callable[[], Any], costs.Cost]]:
    """(op, stage, callable, cost) of every timed pass of ``stages`` of ``net`` at batch ``N``, float32,
    each called as a training step calls it (:func:`in_step`)."""
    from ..train.optim import Momentum  # noqa: PLC0415

    out = []
    f32 = np.float32
    for k in stages:
        st = net.stages[k]
        fl, pl, ll = st.filter, st.pool, st.lcn
        xs = net.shapes[net.layer_index(k, "filter")] + (N,)
        x = rng.standard_normal(xs, dtype=f32)
        w = rng.standard_normal(fl.weight_shape(xs), dtype=f32) * f32(0.1)
        y = ops.local_filter(x, w, fl.stride, fl.block)
        dy = rng.standard_normal(y.shape, dtype=f32)
        fc = fl.cost(xs, 4)
        p = ops.l2_pool(y, pl.size, pl.stride, pl.eps)
        dp = np.ones_like(p)
        pc = costs.l2_pool(*y.shape, pl.size, pl.stride, 4)
        z = rng.standard_normal(p.shape, dtype=f32)
        dz = rng.standard_normal(p.shape, dtype=f32)
        lc = costs.lcn(*p.shape, ll.size, 4)
        # the update runs on w and the gradient backward-weights writes (zeros until it does): no more
        # weight-sized arrays than a step has (the paper case's are 264 MB)
        mom, dw = Momentum(lr=1e-6), np.zeros_like(w)
        out += [
            ("filter_forward", k, in_step(lambda ws, x=x, w=w, fl=fl: ops.local_filter(
                x, w, fl.stride, fl.block, workspace=ws)), fc["forward"]),
            ("filter_backward_data", k, in_step(lambda ws, dy=dy, w=w, fl=fl, xs=xs: ops.local_filter_backward_data(
                dy, w, fl.stride, fl.block, input_shape=xs, workspace=ws)), fc["backward_data"]),
            ("filter_backward_weights", k, in_step(
                lambda ws, x=x, dy=dy, fl=fl, dw=dw: ops.local_filter_backward_weights(
                    x, dy, fl.size, fl.stride, fl.block, workspace=ws, out=dw)), fc["backward_weights"]),
            ("pool_forward", k, in_step(
                lambda ws, y=y, pl=pl: ops.l2_pool(y, pl.size, pl.stride, pl.eps, workspace=ws)), pc["forward"]),
            ("pool_backward", k, in_step(lambda ws, dp=dp, y=y, p=p, pl=pl: ops.l2_pool_backward(
                dp, y, p, pl.size, pl.stride, workspace=ws)), pc["backward"]),
            ("lcn_forward", k, in_step(lambda ws, z=z, ll=ll: ops.lcn(z, ll.size, ll.sigma, ll.eps, workspace=ws)),
             lc["forward"]),
            ("lcn_backward", k, in_step(lambda ws, dz=dz, z=z, ll=ll: ops.lcn_backward(
                dz, z, ll.size, ll.sigma, ll.eps, workspace=ws)), lc["backward"]),
            ("elementwise", k, lambda mom=mom, w=w, dw=dw: mom.step({"w": w}, {"w": dw}),
             costs.Cost(4.0 * w.size, 4.0 * MOMENTUM_WORDS * w.size)),
        ]
    return out


def case_bytes(rows) -> dict[str, float]:
    """Per op: the bytes of its passes in ``rows`` (a case's), their geometric mean weighted by time: the
    size at which the case's efficiency of that op holds (``efficiency_by_size``)."""
    out = {}
    for op in OPS:
        mine = [r for r in rows if r["op"] == op and r["bytes"] > 0]
        if not mine:
            continue
        t = sum(r["seconds"] for r in mine)
        out[op] = float(math.exp(sum(r["seconds"] * math.log(r["bytes"]) for r in mine) / t))
    return out


def efficiencies(rows, peak: float, bw: float, overhead: dict[str, float]) -> dict[str, float]:
    """Per op: sum over rows of the model's floor / sum of (time - the op's call cost) (time-weighted)."""
    out = {}
    for op in OPS:
        mine = [r for r in rows if r["op"] == op]
        if not mine:  # a layer shape's rows hold its kind's ops only
            continue
        floor = sum(max(r["flops"] / peak, r["bytes"] / bw) for r in mine)
        spent = sum(max(r["seconds"] - overhead[op], 0.05 * r["seconds"]) for r in mine)
        out[op] = floor / spent
    return out


def shape_entries(rows, thread_counts, peak: float, bw: float, cores: int, overhead: dict[str, float]) -> list:
    """``efficiency_by_shape``: per case and layer shape (``Network.pass_shape``, kept in each row) the
    bytes of its passes and its efficiencies per thread count, of its kind's ops only."""
    out = []
    keys = dict.fromkeys((r["case"], r["shape"]) for r in rows if r.get("shape"))
    for case, shape in keys:
        mine = [r for r in rows if r["case"] == case and r.get("shape") == shape]
        out.append({"shape": shape, "case": case,
                    "bytes": case_bytes([r for r in mine if r["threads"] == thread_counts[0]]),
                    "by_threads": {str(th): {op: round(v, 4) for op, v in efficiencies(
                        [r for r in mine if r["threads"] == th], peak * th / cores, bw * th / cores, overhead).items()}
                                   for th in thread_counts}})
    return out


def _measure_passes(threads: int, repeats: int, quick: bool, say, cases: list,
                    comm: MPI.Comm | None = None, sync: bool = True) -> list[dict[str, Any]]:
    """Times of every pass of the ``cases``' stages on ``threads`` threads: per case, rounds that call
    each pass once in stage order; per pass the median over the rounds, with the spread.  With ``comm``
    (collective): every rank of it runs the same rounds, and (``sync``) a barrier ends every call (timed)."""
    prev = ops.num_threads()
    rows = []
    try:
        ops.set_num_threads(threads)
        for ci, (label, desc, inp, N) in enumerate(cases):
            net = Network.from_description({"input": list(inp), "stages": desc})
            stages = [0] if quick and not label.startswith(CONFIG_LABEL) else range(len(net.stages))
            passes = stage_passes(net, N, stages, np.random.default_rng(ci))
            fns = {i: fn for i, (_, _, fn, _) in enumerate(passes)}
            # One call per pass a round: each pass finds in cache what the passes before it left there, as
            # in a training step (a small network's step stays in the caches, a large one's does not).
            # Timing a pass after a flush of the caches made the demo's passes 1.36x slower than that here.
            # Rounds: 0.1 s per pass in all, as many as that takes (up to 200), at least rounds_for(repeats).
            rounds = rounds_for(repeats) if quick else _rounds_within(fns, 0.1 * len(fns), rounds_for(repeats))
            if comm is not None:
                rounds = comm.allreduce(rounds, op=MPI.MAX)
            say(f"[2/4] case {label}: {len(passes)} passes on {threads} thread(s), {rounds} interleaved rounds ...")
            t = interleaved_rounds(fns, rounds, sync=comm.Barrier if comm is not None and sync else None)
            for i, (op, k, _, cost) in enumerate(passes):
                st = robust(t[i])
                kind = op.split("_", 1)[0]
                shape = net.pass_shape(net.layer_index(k, kind), N) if kind in OPS_OF_KIND else None
                rows.append({"case": label, "threads": threads, "op": op, "stage": k, "seconds": st["value"],
                             "spread": round(st["spread"], 4), "flops": cost.flops, "bytes": cost.bytes,
                             "shape": shape})
    finally:
        ops.set_num_threads(prev if prev != ops.available_cores() else None)
    return rows


def _rounds_within(fns: dict[Any, Callable[[], Any]], seconds: float, least: int, most: int = 200) -> int:
    """How many rounds of calling every function once take about ``seconds`` (between ``least`` and
    ``most``), from one round timed now (it also warms them up)."""
    t0 = time.perf_counter()
    for fn in fns.values():
        fn()
    return int(min(max(least, math.ceil(seconds / max(time.perf_counter() - t0, 1e-9))), most))


def _passes_on(comm: MPI.Comm, ranks: list[int], threads: int | None, repeats: int, quick: bool, say, cases: list,
               sync: bool) -> list[dict[str, Any]]:
    """(collective) :func:`_measure_passes` run at once on ``ranks`` of ``comm`` (``threads`` None: each its
    own node's cores), the others waiting without spinning; rank 0's rows, on every rank.  A failure on
    any of them is raised on every rank."""
    rank = comm.Get_rank()
    sub = comm.Split(0 if rank in ranks else MPI.UNDEFINED, rank)
    rows, err = None, None
    if sub != MPI.COMM_NULL:
        sub.Barrier()
        try:
            rows = _measure_passes(ops.available_cores() if threads is None else threads, repeats, quick,
                                   say if rank == 0 else (lambda *a: None), cases, sub, sync=sync)
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            err = f"calibration failed on rank {rank}: {type(e).__name__}: {e}"
        sub.Free()
        comm.Ibarrier().Wait()
    else:
        wait_idle(comm)
    raise_collectively(comm, err, RuntimeError)
    return comm.bcast(rows if rank == 0 else None, root=0)


def _all_core_passes(comm: MPI.Comm, hosts: list[str], comp: dict[str, Any], repeats: int, quick: bool, say,
                     cases: list) -> None:
    """The passes on all the cores of a node, run at once by the first rank of every node (a node of a
    training job is as busy as every other: simulated nodes on one machine share its caches and memory,
    which costs each 5-10% here; separate nodes share nothing and lose nothing), the rounds started
    together and not synchronized further; rank 0's times are kept (collective)."""
    leaders = sorted({hosts.index(h) for h in hosts})
    if len(leaders) > 1:
        say(f"      (the passes on the first rank of each of the {len(leaders)} nodes at once)")
    comp["rows"] = _passes_on(comm, leaders, None, repeats, quick, say, cases, sync=False)


def _one_thread_passes(comm: MPI.Comm, hosts: list[str], comp: dict[str, Any], repeats: int, say,
                       cases: list) -> None:
    """The passes on 1 thread, run at once on up to ``cores`` ranks of rank 0's host (a rank per core
    shares caches and memory bandwidth with the others, as in training), each pass ended by a barrier
    (a step's ranks meet at every exchange: a rank that another process delays holds up the others);
    rank 0's times are kept."""
    cores = comp["cores"]
    busy = [r for r in range(comm.Get_size()) if hosts[r] == hosts[0]][:cores]
    say(f"      ({len(busy)} of {cores} cores busy: the same passes on every busy rank at once)")
    comp["rows"] += _passes_on(comm, busy, 1, repeats, False, say, cases, sync=True)
    comp["thread_counts"].append(1)
    comp["busy_1thread"] = len(busy)


def config_case(name: str, network: Network, batch: int) -> tuple[str, list, tuple[int, int, int], int]:
    """The case of a config's own network at its batch per replica (``bench calibrate --config``): its
    passes' shapes are the ones its steps run (``efficiency_by_shape``)."""
    return (f"{CONFIG_LABEL}{name} N={int(batch)}", network.describe()["stages"], tuple(network.input_shape),
            int(batch))
