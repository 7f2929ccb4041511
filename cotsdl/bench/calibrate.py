"""``cotsdl bench calibrate``: measure this machine and return the machine file ``cotsdl plan`` reads.

The planner predicts an operation's time as ``max(flops / (rate * eff), bytes /
(memory_bandwidth * eff)) + overhead_s`` (a CPU rank's rate is ``peak_flops`` times its
share of the cores) and a message's as ``alpha_s + bytes * beta_s_per_byte``.  This
module measures every number of that model in one run:

- ``peak_flops``: numpy's float32 2048^3 sgemm on all cores; ``memory_bandwidth``: a large
  copy split over all cores (bytes read + bytes written, as STREAM counts them); both the
  median over rounds of each round's best call; ``cores``: :func:`cotsdl.ops.available_cores`;
  ``memory_bytes``: MemTotal of /proc/meminfo.
- ``overhead_s`` and ``overhead_by_op_s``: the median time of each operation called on
  tiny arrays (the checks, dispatch and thread-pool hand-off every call pays), and the
  least of them.
- ``efficiency``, ``efficiency_by_threads`` and ``efficiency_by_size``: every pass of every stage
  of the demo network (``jobs/configs/demo.toml``) at two sizes and of the paper's first stage on a
  100x200x3 strip (``CASES``) timed with :mod:`cotsdl.ops` on all cores and on 1 core,
  one call of each in stage order a round (each finds in cache what the passes before it
  left, as in a step), the median over the rounds (a step sees typical times, not the best).
  Per op the efficiency is the one that makes the planner's model reproduce the
  measurement: ``max(flops / rate, bytes / bandwidth) / (t - the op's call cost)`` with
  ``rate`` and ``bandwidth`` the share of the threads used (threads / cores of the peak
  and of the memory bandwidth, as :func:`cotsdl.planner.machine.rank_share`), summed over
  the stages first (time-weighted), with FLOPs and minimum bytes from
  :mod:`cotsdl.ops.costs`.  For the filter passes the FLOP term is the larger, so this is
  achieved FLOP/s / peak; for pool, LCN and the elementwise update (one momentum step of
  :class:`cotsdl.train.optim.SGD` on the stage's weights: 10 words per weight, every word its
  numpy operations read and write, as the planner counts an update: ``planner.model.UPDATE_WORDS``)
  it is achieved bytes/s / bandwidth.  Small
  passes scale poorly with threads, so the file keeps one set per thread count
  (``efficiency_by_threads``; the planner takes the one of a rank's thread count, cores /
  ranks per node) and ``efficiency`` = the all-cores set, of the demo; every case is printed and
  kept under ``calibration``.  Large passes run from memory where the demo's run from cache, so
  ``efficiency_by_size`` keeps every case with the bytes of its passes (per op, their geometric
  mean weighted by time) and the planner interpolates an op's efficiency at its own bytes.
  ``efficiency_by_shape`` keeps the same per case and layer shape
  (:meth:`cotsdl.nn.network.Network.pass_shape`: field, stride, block, channels, batch), which the
  planner prefers for a layer of that shape; ``--config`` adds a config's own network at its batch
  per replica as a case (module :mod:`cotsdl.bench.passes`).
- ``process_bytes``: rank 0's resident memory at the start, with what a training rank loads
  (numpy, MPI, HDF5, scipy, the native kernels): the planner's memory model counts it per rank.
- ``link`` and ``node_link`` (:mod:`cotsdl.bench.links`): an MPI ping-pong between rank 0 and
  another rank of its node over message sizes from 8 B to 4 MiB (per size the median of the
  rounds' medians), fitted to ``alpha + beta * bytes`` (least squares on the relative error,
  then the smallest worst-case factor); where the ranks span nodes, the same with the first
  rank of another node, and two streams that measure the rate that link holds over time and
  any burst (a token bucket) into ``node_link``.  Then one real halo exchange
  (:class:`cotsdl.array.ExchangePlan` on the grid of all ranks) is printed against the
  model.  Without two ranks on rank 0's node the link within a node is an in-process copy,
  and the file's ``source`` and ``calibration.link_measured`` say so.
- ``load``: what other processes did meanwhile (:mod:`cotsdl.planner.load`): the cores they
  kept busy on average over the whole calibration (``other_busy_cores``, the job's own ranks
  not counted), the cores watched, the seconds and the 1-minute load average.  The numbers
  hold under that load; :func:`cotsdl.planner.machine.load_warning` says when it differs now.

Sampling: every item is timed in rounds that interleave the items of its phase (the
ceilings; the tiny calls; a case's passes; the ping-pong sizes), by default ``repeats`` = 5
rounds (at least 3), and the number kept is the median over the rounds of each round's
median (of each round's best call for the ceilings).  A burst of load from elsewhere then
spoils a round of every item alike and is outvoted, instead of all the samples of one item
(as a block per item did); the rounds' spread, (q75 - q25) / median, is printed and kept
(``calibration.spread``, each pass's ``spread``).  A load that lasts the whole calibration
is in every round: no statistic removes it, and ``load`` records it.

The top-level ``calibration`` key holds the raw numbers (the planner ignores unknown
top-level keys).

The ceilings and call costs are measured on rank 0 while the other ranks wait without spinning
(an ``Ibarrier`` polled with sleeps), so they take no core from it.  The passes run on the first
rank of every node at once, so that each node is as busy as in training (simulated nodes on one
machine share its caches and memory; separate nodes lose nothing), and rank 0's times are kept.
"""
from __future__ import annotations

import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import __version__, ops
from ..array import Box, DistArray, ExchangePlan, ProcessGrid, grow
from ..array.collective import raise_collectively, wait_idle
from ..nn.network import Network
from ..planner import load
from ..array.grid import rank_nodes
from .links import copy_times, fit_link  # noqa: F401 - tests and older callers reach them here
from .links import measure as measure_links
from .passes import (CASES, CONFIG_LABEL, DEMO_STAGES, OPS, PAPER_STAGES, QUICK_CASES,  # noqa: F401 - reached here
                     _all_core_passes, _one_thread_passes, case_bytes, config_case, demo_network, efficiencies,
                     shape_entries, stage_passes)
from .sampling import interleaved_rounds, robust, rounds_for  # noqa: F401 - tests reach them here too

# The network of jobs/configs/demo.toml (copied: an installed package has no jobs/ folder).

# -- the device ---------------------------------------------------------------------------
def memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


class Copy:
    """A copy of ``nbytes`` split over ``threads`` threads; ``nbytes`` read + written per call (as STREAM)."""

    def __init__(self, nbytes: int, threads: int):
        n = nbytes // 4
        self.src, self.dst = np.ones(n, np.float32), np.zeros(n, np.float32)
        self.nbytes = 2.0 * n * 4
        bounds = np.linspace(0, n, threads + 1).astype(int)
        self.parts = [(self.dst[lo:hi], self.src[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]
        self.pool = ThreadPoolExecutor(threads) if threads > 1 else None

    def __call__(self) -> None:
        if self.pool is None:
            np.copyto(self.dst, self.src)
        else:
            list(self.pool.map(lambda p: np.copyto(*p), self.parts))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def device_ceilings(cores: int, rounds: int, quick: bool) -> dict[str, dict[str, float]]:
    """:func:`robust` statistics of the float32 sgemm's FLOP/s on all cores and of the copy's bytes/s on
    all cores and (not ``quick``) on 1 thread, timed in interleaved rounds, each round's best call."""
    n = 1024 if quick else 2048
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    big = (32 if quick else 256) << 20
    copies = {"memory_bandwidth": Copy(big, cores)}
    if not quick:
        copies["bandwidth_1thread"] = Copy(big, 1)
    try:
        # 2 sgemm calls a round (10 in all by default): the first call after a copy runs a little slow
        t = interleaved_rounds({"peak_flops": lambda: a @ b, **copies}, rounds, 1 if quick else 2, per_round=min)
    finally:
        for c in copies.values():
            c.close()
    work = {"peak_flops": 2.0 * n ** 3, **{k: c.nbytes for k, c in copies.items()}}
    return {k: _rates(work[k], v) for k, v in t.items()}


def _rates(work: float, seconds: list[float]) -> dict[str, float]:
    """:func:`robust` of work / seconds per round (a rate: its quartiles swap with the times')."""
    return robust([work / s for s in seconds])


def tiny_overhead(repeats: int) -> tuple[float, dict[str, float]]:
    """The least time over the op kinds of one call on tiny arrays (what every call costs beyond its work:
    checks and dispatch); the filter's and LCN's larger fixed costs stay in their efficiencies.  Per op
    the median over interleaved rounds of each round's median call."""
    net = Network.from_description({"input": [6, 6, 1], "stages": [
        {"filter": {"size": [2, 2], "stride": [1, 1], "channels": 1},
         "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01}, "lcn": {"size": 3, "sigma": 1.0, "eps": 0.001}}]})
    fns = {name: fn for name, _, fn, _ in stage_passes(net, 1, [0], np.random.default_rng(1))}
    rounds = rounds_for(repeats)
    t = interleaved_rounds(fns, rounds, calls=-(-max(20, 4 * repeats) // rounds))
    per = {name: robust(v)["value"] for name, v in t.items()}
    return float(min(per.values())), per


def process_bytes() -> int | None:
    """This process's resident bytes once it holds what a training rank loads before its first array
    (numpy, MPI, HDF5, scipy, the trainer, the native kernels): the ``runtime`` of the planner's memory
    model (``process_bytes`` of a machine file).  None without /proc."""
    import h5py  # noqa: F401, PLC0415 - loaded for what it costs
    import scipy.sparse  # noqa: F401, PLC0415
    from ..io import reader  # noqa: F401, PLC0415
    from ..train import trainer  # noqa: F401, PLC0415

    ops.local_filter(np.ones((2, 2, 1, 8), np.float32), np.ones((1, 1, 1, 2, 2, 1), np.float32), (1, 1))
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return None


# -- the link -------------------------------------------------------------------------------
def halo_exchange(comm, shape, halo: int, repeats: int) -> dict[str, Any]:
    """Median time of refreshing a ``halo``-wide halo of a float32 ``shape`` array on the grid of all ranks,
    with the busiest rank's message count and bytes."""
    grid = ProcessGrid(comm, None, extent=shape[:2])
    gbox = Box.from_shape(shape)
    arr = DistArray.on_grid(grid, shape, np.float32, window=lambda b: grow(b, (halo, halo), (halo, halo), gbox))
    arr.data[...] = comm.Get_rank()
    plan = ExchangePlan.between(arr, arr)
    rank = comm.Get_rank()
    sizes = [t_.box.size * 4 for t_ in plan.sends if t_.peer != rank]
    busiest = max(comm.allgather(sizes), key=sum)
    from .common import timed  # noqa: PLC0415
    samples = timed(comm, lambda: plan.exchange(arr, arr, validate=False), repeats, 2)
    dims = list(grid.dims)
    grid.free()
    return {"shape": list(shape), "halo": halo, "grid": dims, "messages": len(busiest), "bytes": int(sum(busiest)),
            "seconds": float(np.median(samples))}


# -- the load ------------------------------------------------------------------------------
def _load_seen(before, after, say) -> dict[str, Any]:
    """The machine file's ``load`` for the calibration's interval, printed (on rank 0)."""
    from ..planner.machine import LOAD_MARGIN  # noqa: PLC0415

    seen = load.record(before, after)
    say("")
    say(f"load: {_load_text(seen)}")
    if (seen["other_busy_cores"] or 0.0) >= LOAD_MARGIN:
        say(f"      calibrated under load: the predictions hold for runs under a similar load (cotsdl plan warns "
            f"when the load differs by {LOAD_MARGIN} cores or more); for a quiet machine, calibrate when it is quiet")
    return seen


def _load_text(seen: dict[str, Any] | None) -> str:
    if not seen or seen.get("other_busy_cores") is None:
        return "load of other processes not measured (no /proc)"
    avg = f", 1-min load average {seen['loadavg1']:.2f}" if seen.get("loadavg1") is not None else ""
    return (f"other processes kept {seen['other_busy_cores']:.2f} of {seen['cores_watched']} cores busy over "
            f"{seen['seconds']:.0f} s{avg}")


def _median_spread(rows) -> float:
    return float(np.median([r["spread"] for r in rows])) if rows else 0.0


# -- the run ----------------------------------------------------------------------------------
def _measure_compute(repeats: int, quick: bool, say, cases: list) -> dict[str, Any]:
    cores = ops.available_cores()
    prev = ops.num_threads()
    res: dict[str, Any] = {"cores": cores}
    try:
        ops.set_num_threads(cores)
        rounds = rounds_for(repeats)
        say(f"[1/4] sgemm ceiling and memory bandwidth on {cores} core(s), {rounds} interleaved rounds ...")
        ceil = device_ceilings(cores, rounds, quick)
        res["spread"] = {k: round(v["spread"], 4) for k, v in ceil.items()}
        res["peak_flops"] = ceil["peak_flops"]["value"]
        res["memory_bandwidth"] = ceil["memory_bandwidth"]["value"]
        res["bandwidth_1thread"] = ceil["bandwidth_1thread"]["value"] if "bandwidth_1thread" in ceil else None
        say(f"      sgemm {res['peak_flops'] / 1e9:.1f} GFLOP/s, copy {res['memory_bandwidth'] / 1e9:.2f} GB/s"
            + (f" ({res['bandwidth_1thread'] / 1e9:.2f} GB/s on 1 thread)" if res["bandwidth_1thread"] else "")
            + " (medians of the rounds' best; spread " + ", ".join(f"{k} {v:.1%}" for k, v in res["spread"].items())
            + ")")
        res["overhead_s"], res["tiny"] = tiny_overhead(repeats)
        say(f"      overhead per op call (tiny arrays, least over the ops) {res['overhead_s'] * 1e6:.1f} us: "
            + ", ".join(f"{k} {v * 1e6:.0f}" for k, v in res["tiny"].items()))
        res["thread_counts"] = [cores]
        res["cases"] = [c[0] for c in cases]
    finally:
        ops.set_num_threads(prev if prev != ops.available_cores() else None)
    return res


def run(comm: MPI.Comm, repeats: int = 5, quick: bool = False, log=sys.stdout,
        extra: tuple = ()) -> dict[str, Any]:
    """Measure; rank 0 prints; return the machine dict (the same on every rank).  ``extra``: more cases
    (:func:`config_case`), timed after the built-in ones."""
    raise_collectively(comm, None if int(repeats) >= 1 else f"--repeats must be >= 1, got {repeats}")
    cases = (QUICK_CASES if quick else CASES) + list(extra)
    rank, size = comm.Get_rank(), comm.Get_size()
    say = (lambda *a: print(*a, file=log, flush=True)) if rank == 0 else (lambda *a: None)
    host = socket.gethostname()
    hosts = comm.allgather(host)
    job_pids, job_cpus = load.job_on_host(comm)  # (collective) the load of other processes is watched on rank 0
    before = load.snapshot(job_pids, job_cpus) if rank == 0 else None
    t_start = time.perf_counter()
    own = process_bytes() if rank == 0 else None  # first: before this process holds any array
    say(f"cotsdl bench calibrate: {size} rank(s) on {len(set(hosts))} host(s), {ops.available_cores()} core(s) "
        f"on rank 0, repeats {repeats}{', quick' if quick else ''}; {MPI.Get_library_version().splitlines()[0].strip()}")

    # 1. the ceilings and the call costs, on rank 0 alone (the others wait without spinning); then the passes
    comp, err = None, None
    if rank == 0:
        try:
            comp = _measure_compute(repeats, quick, say, cases)
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            err = f"calibration failed on rank 0: {type(e).__name__}: {e}"
        comm.Ibarrier().Wait()  # matches the others' Ibarrier (a blocking Barrier would not)
    else:
        wait_idle(comm)
    raise_collectively(comm, err, RuntimeError)
    comp = comm.bcast(comp, root=0)
    _all_core_passes(comm, hosts, comp, repeats, quick, say, cases)
    if comp["cores"] > 1 and not quick:
        _one_thread_passes(comm, hosts, comp, repeats, say, cases)
    peak, bw, over, cores = comp["peak_flops"], comp["memory_bandwidth"], comp["overhead_s"], comp["cores"]

    all_rows = comp["rows"]
    eff_by = {}  # (case, threads) -> efficiencies; on 1 thread a rank's rate is peak / cores
    for case in comp["cases"]:
        for th in comp["thread_counts"]:
            rows = [r for r in all_rows if r["case"] == case and r["threads"] == th]
            eff_by[(case, th)] = efficiencies(rows, peak * th / cores, bw * th / cores, comp["tiny"])
    # Written: the case demo.toml trains (the last built-in one), geometric mean over all cores and 1 core: the
    # planner has one efficiency per op, and a rank runs on all cores (1 rank) or on 1 core (a rank per core).
    demo = (QUICK_CASES if quick else CASES)[-1][0]
    by_threads = {str(th): {op: min(round(eff_by[(demo, th)][op], 4), 1.0) for op in OPS}  # (0, 1]: the planner's range
                  for th in comp["thread_counts"]}
    clamped = sorted({op for th in comp["thread_counts"] for op in OPS if eff_by[(demo, th)][op] > 1})
    eff = by_threads[str(cores)]
    # Every case by its size: the planner interpolates an op's efficiency at the op's bytes between them
    by_size = [{"case": case, "bytes": case_bytes([r for r in all_rows if r["case"] == case
                                                    and r["threads"] == comp["thread_counts"][0]]),
                "by_threads": {str(th): {op: round(eff_by[(case, th)][op], 4) for op in OPS}  # above 1 too
                               for th in comp["thread_counts"]}} for case in comp["cases"]]
    by_shape = shape_entries(all_rows, comp["thread_counts"], peak, bw, cores, comp["tiny"])
    if rank == 0:
        say("")
        say(f"per-op times and efficiencies (model: max(flops/rate, bytes/bandwidth)/(t - overhead); rate = "
            f"{peak / 1e9:.1f} GFLOP/s and bandwidth {bw / 1e9:.2f} GB/s, each x threads/{cores})")
        say(f"{'case':22} {'op':24} {'stage':>5} {'thr':>3} {'ms':>9} {'spread':>6} {'GFLOP/s':>8} {'GB/s':>7} "
            f"{'bound':>6} {'eff':>6}")
        for r in all_rows:
            rate, rbw = peak * r["threads"] / cores, bw * r["threads"] / cores
            tf, tb = r["flops"] / rate, r["bytes"] / rbw
            e = max(tf, tb) / max(r["seconds"] - comp["tiny"][r["op"]], 0.05 * r["seconds"])
            say(f"{r['case']:22} {r['op']:24} {r['stage']:5d} {r['threads']:3d} {r['seconds'] * 1e3:9.3f} "
                f"{r['spread']:6.1%} {r['flops'] / r['seconds'] / 1e9:8.2f} {r['bytes'] / r['seconds'] / 1e9:7.2f} "
                f"{'flops' if tf >= tb else 'bytes':>6} {e:6.3f}")
        worst = max(all_rows, key=lambda r: r["spread"])
        say(f"ms: the median over the rounds (one call of each pass a round, in stage order); spread: "
            f"(q75 - q25) / median over the rounds (median {_median_spread(all_rows):.1%}, largest {worst['spread']:.1%}: "
            f"{worst['op']} stage {worst['stage']}, {worst['case']}, {worst['threads']} thread(s))")
        say("")
        cols = [(c, th) for c in comp["cases"] for th in comp["thread_counts"]]
        say(f"{'efficiency (time-weighted over stages)':40} " + " ".join(f"{c + ' ' + str(th) + 't':>20}" for c, th in cols))
        for op in OPS:
            say(f"{op:40} " + " ".join(f"{eff_by[k][op]:20.3f}" for k in cols))
        for c in by_size:
            say(f"bytes per pass of {c['case']} (time-weighted): "
                + ", ".join(f"{op} {c['bytes'][op] / 2**20:.3g} MiB" for op in OPS))
        say(f"written: every case by its size (efficiency_by_size: an op's efficiency is interpolated at its "
            f"bytes); the {demo} column(s) also as efficiency_by_threads (efficiency = all cores)")
        if clamped:
            say(f"(above 1, written as 1: {', '.join(clamped)} -- these passes beat the roofline of their minimum "
                f"bytes, e.g. inputs that stay in cache)")

    # 2. the links: within rank 0's node, and to another node (pairs of ranks alone, the others waiting)
    sizes = [8, 4096, 1 << 18, 1 << 20] if quick else [8, 64, 512, 4096, 1 << 15, 1 << 18, 1 << 20, 1 << 22]
    pp_reps = 10 if quick else max(20, 4 * repeats)
    say("")
    nodes = rank_nodes(comm)  # (collective)
    links = measure_links(comm, nodes, sizes, pp_reps, repeats, say)
    alpha, beta = links["link"]["alpha_s"], links["link"]["beta_s_per_byte"]
    what = links["link_measured"] + (f"; node_link: {links['node_link_measured']}" if links["node_link"] else "")
    node_link = links["node_link"]

    # 3. one real halo exchange against the model
    say("")
    exchanges = []
    if size >= 2:
        say("[4/4] halo exchanges on the grid of all ranks vs alpha * messages + beta * bytes (busiest rank; "
            + ("node_link's, at most its sustained rate: the grid spans nodes)" if node_link else "one node)"))
        if node_link:
            alpha, beta = node_link["alpha_s"], node_link["beta_s_per_byte"]
        say(f"{'shape':>18} {'halo':>4} {'grid':>5} {'msgs':>4} {'KiB':>8} {'measured ms':>11} {'model ms':>9} "
            f"{'meas/model':>10}")
        n = 16 if quick else 96
        for shape, h in [((64, 64, 3, n), 3), ((58, 58, 16, n), 1)]:
            ex = halo_exchange(comm, shape, h, 5 if quick else max(10, 2 * repeats))
            model = ex["messages"] * alpha + ex["bytes"] * beta
            if node_link:  # back-to-back exchanges: a token bucket holds them to its sustained rate
                model = max(model, ex["bytes"] / node_link["sustained_bytes_per_s"])
            exchanges.append({**ex, "model_s": model})
            say(f"{str(tuple(shape)):>18} {h:4d} {ex['grid'][0]}x{ex['grid'][1]:<3} {ex['messages']:4d} "
                f"{ex['bytes'] / 1024:8.1f} {ex['seconds'] * 1e3:11.3f} {model * 1e3:9.3f} "
                f"{ex['seconds'] / model if model else float('nan'):10.2f}")
    else:
        say("[4/4] one rank: no halo exchange to compare (it would be local copies only)")

    seen = _load_seen(before, load.snapshot(job_pids, job_cpus), say) if rank == 0 else None
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    args = f"--repeats {repeats}" + (" --quick" if quick else "")
    labels = ", ".join(comp["cases"])
    source = (f"cotsdl bench calibrate {args} (cotsdl {__version__}) on {size} rank(s), {stamp}, host "
              f"{','.join(sorted(set(hosts)))}; peak_flops = numpy sgemm on {cores} core(s), memory_bandwidth = "
              f"threaded copy (read+write); efficiencies = passes of the demo network and the paper's first stage "
              f"({labels}) on threads "
              f"{comp['thread_counts']} (medians over rounds of the passes in stage order; 1 thread with "
              f"{comp.get('busy_1thread', 1)} of {cores} cores busy), written: {demo} per thread count; link: {what}; "
              f"{_load_text(seen)}")
    machine = {
        "name": f"{host}-{cores}core" + ("-quick" if quick else ""),
        "kind": "cpu",
        "source": source,
        "device": {"peak_flops": float(peak), "memory_bandwidth": float(bw), "memory_bytes": int(memory_bytes()),
                   "cores": int(cores), "devices_per_node": 1},
        "efficiency": {op: round(v, 4) for op, v in eff.items()},
        "overhead_s": float(over),
        "link": links["link"],
        **({"node_link": node_link} if node_link else {}),
        # optional refinements the planner uses when present: a rank running t threads, each op's call cost
        "efficiency_by_threads": by_threads,
        # every case at its size (bytes per pass): the planner takes an op's efficiency at the op's bytes
        "efficiency_by_size": by_size,
        # every layer shape of every case at its size: the planner prefers those of an op's own layer shape
        "efficiency_by_shape": by_shape,
        # a rank's own memory before its first array (the planner's memory model: runtime)
        **({"process_bytes": int(own)} if own else {}),
        "overhead_by_op_s": {op: float(v) for op, v in comp["tiny"].items()},
        # the load the numbers were measured under: the planner warns when the load now differs
        "load": seen,
        # raw data (the planner ignores unknown top-level keys)
        "calibration": {
            "link_measured": what, **links["rows"], "halo_exchanges": exchanges,
            "efficiency_written_from": f"case {demo}, per thread count {comp['thread_counts']}",
            "efficiency_by_case": {f"{c} {th} thread(s)": {op: round(v, 4) for op, v in e.items()}
                                   for (c, th), e in eff_by.items()},
            "bandwidth_1thread": comp["bandwidth_1thread"],
            "passes": comp["rows"],
            "sampling": f"medians over interleaved rounds (at least {rounds_for(repeats)}; passes: one call each "
                        "a round in stage order, 0.1 s per pass in all; ceilings: each round's best); spread = "
                        "(q75 - q25) / median over the rounds",
            "spread": {**comp["spread"], "passes_median": _median_spread(comp["rows"]),
                       "passes_max": max((r["spread"] for r in comp["rows"]), default=0.0)},
        },
    }
    machine = comm.bcast(machine, root=0)
    say("")
    say(f"done in {time.perf_counter() - t_start:.1f} s")
    return machine
