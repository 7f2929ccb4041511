"""The links of ``cotsdl bench calibrate``: within a node, and between nodes where the ranks span them.

Rank 0 plays an MPI ping-pong with the first other rank of its own node (``link``) and with
the first rank of another node (``node_link``); each is fitted to ``alpha + beta * bytes``
(:func:`fit_link`).  Between nodes a link may also hold a lower rate over time than one
message sees: a token bucket (a shaped or policed link, ``tc tbf``) lets a burst through at
the line rate and then the sustained rate only.  Two streams of back-to-back messages, each
after an idle pause that refills the bucket, measure it: with ``t = (bytes - burst) / rate``
for a stream longer than the burst, two lengths give ``sustained_bytes_per_s`` and
``burst_bytes``, where the rounds agree on the burst (on a fast unshaped link the streams' jitter
alone would look like one).  The ping-pong of
a shaped link then keeps to messages within half the burst, each after a pause that gives
back what it took, so that it measures the line and not the bucket.  Without a second rank
on rank 0's node the link within a node is an in-process copy, labelled so.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..array.collective import wait_idle
from ..planner.predict import MIN_BURST
from .exchange import pingpong
from .sampling import interleaved_rounds, robust, rounds_for

#: The two streams' lengths, and their messages' size.
STREAMS = (1 << 20, 4 << 20)
STREAM_CHUNK = 64 << 10
#: A burst counts only where it is this many times the spread of its rounds' estimates.
BUCKET_AGREEMENT = 2.0


def fit_link(sizes, times) -> tuple[float, float]:
    """alpha, beta of ``t = alpha + beta * bytes`` (both > 0) whose worst message size is off by the
    smallest factor (model/measured or measured/model).

    Least squares on the relative error first; then the largest log-ratio is minimized from there.
    A transport that switches protocol between sizes (Open MPI's shared memory at 4 KiB) bends the
    line: least squares let that size be off by 2.4x, the minimax fit spreads the error (1.8x).
    """
    b, t = np.asarray(sizes, float), np.asarray(times, float)
    A = np.stack([1.0 / t, b / t], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    if not (alpha > 0 and beta > 0):  # degenerate (noise): the smallest message and the largest's slope
        i, j = int(np.argmin(b)), int(np.argmax(b))
        alpha = max(float(t[i]), 1e-9)
        beta = max((t[j] - alpha) / max(b[j] - b[i], 1.0), 1e-15)
    from scipy.optimize import minimize  # noqa: PLC0415

    def worst(p: np.ndarray) -> float:
        return float(np.max(np.abs(np.log((np.exp(p[0]) + np.exp(p[1]) * b) / t))))

    start = np.log([alpha, beta])
    best = minimize(worst, start, method="Nelder-Mead", options={"xatol": 1e-9, "fatol": 1e-12, "maxiter": 4000})
    if best.fun < worst(start) - 1e-12:
        alpha, beta = np.exp(best.x)
    return float(alpha), float(beta)


def copy_times(sizes, repeats: int) -> list[float]:
    """Time of an in-process copy of each size (the stand-in for a link on one rank): interleaved rounds."""
    fns = {}
    for n in sizes:
        src, dst = np.ones(max(n, 1), np.uint8), np.zeros(max(n, 1), np.uint8)
        fns[n] = lambda src=src, dst=dst: np.copyto(dst, src)
    rounds = rounds_for(repeats)
    t = interleaved_rounds(fns, rounds, calls=-(-max(5, repeats) // rounds))
    return [robust(t[n])["value"] for n in sizes]


def stream_seconds(pair: MPI.Comm, total: int, pause: float) -> float:
    """Seconds for rank 0 of ``pair`` to send ``total`` bytes to rank 1 as back-to-back messages, after an
    idle ``pause`` (until rank 1 has them all: it answers with one byte)."""
    chunks = max(1, total // STREAM_CHUNK)
    buf = np.zeros(STREAM_CHUNK, np.uint8)
    ack = np.zeros(1, np.uint8)
    pair.Barrier()
    time.sleep(pause)
    pair.Barrier()
    t0 = MPI.Wtime()
    if pair.Get_rank() == 0:
        MPI.Request.Waitall([pair.Isend(buf, dest=1, tag=11) for _ in range(chunks)])
        pair.Recv(ack, source=1, tag=12)
    else:
        bufs = [np.empty_like(buf) for _ in range(chunks)]
        MPI.Request.Waitall([pair.Irecv(b, source=0, tag=11) for b in bufs])
        pair.Send(ack, dest=0, tag=12)
    return MPI.Wtime() - t0


def bucket(pair: MPI.Comm, rounds: int) -> tuple[float, float, list[dict[str, float]]]:
    """(sustained bytes/s, burst bytes, the streams' rows) of the link between the two ranks of ``pair``.

    At least ``max(3, rounds)`` rounds; while their bursts disagree (:func:`agreed_burst`), more, up to
    :data:`MAX_BUCKET_ROUNDS` (both ranks take the same decision: rank 0's, sent with every round)."""
    rows = []
    short, long_ = STREAMS
    while True:
        t1 = stream_seconds(pair, short, 0.2)
        # the pause refills the bucket at the rate the short stream showed (at most 2 s)
        t2 = stream_seconds(pair, long_, min(2.0, max(0.2, 2 * t1)))
        r = (long_ - short) / max(t2 - t1, 1e-9)
        rows.append({"short_bytes": short, "short_s": t1, "long_bytes": long_, "long_s": t2,
                     "rate": r, "burst": short - r * t1})
        done = len(rows) >= max(3, rounds) and (agreed_burst([w["burst"] for w in rows]) is not None
                                                 or len(rows) >= MAX_BUCKET_ROUNDS)
        if pair.bcast(done, root=0):
            break
    rate = float(np.median([r["rate"] for r in rows]))
    burst = max(0.0, agreed_burst([r["burst"] for r in rows]) or 0.0)
    return rate, burst, rows


#: Rounds of the streams at most, where the first ones disagree on the burst.
MAX_BUCKET_ROUNDS = 7


def agreed_burst(bursts: list[float]) -> float | None:
    """The rounds' burst, or None where they do not agree on it: their median must be
    :data:`BUCKET_AGREEMENT` times their spread (on a fast unshaped link 1 MiB takes under a
    millisecond, and a tenth of one moves an estimate by 100 KiB).  From 5 rounds on, the lowest and
    the highest are left out: one round hit by a burst of other work is not the link."""
    b = sorted(float(v) for v in bursts)
    if len(b) >= 5:
        b = b[1:-1]
    med = float(np.median(b))
    return med if med >= BUCKET_AGREEMENT * (b[-1] - b[0]) else None


def paced_pingpong(pair: MPI.Comm, nbytes: int, repeats: int, warmup: int, pause: float) -> float:
    """:func:`~cotsdl.bench.exchange.pingpong` with ``pause`` seconds before every round trip (time
    for a token bucket to get back what the last one took); the median one-way time, on rank 0."""
    if pause <= 0:
        return pingpong(pair, nbytes, repeats, warmup)
    rank = pair.Get_rank()
    buf = np.zeros(max(nbytes, 1), np.uint8)[:nbytes]
    times = []
    for i in range(warmup + repeats):
        pair.Barrier()
        time.sleep(pause)
        pair.Barrier()
        t0 = MPI.Wtime()
        if rank == 0:
            pair.Send(buf, dest=1, tag=7)
            pair.Recv(buf, source=1, tag=7)
        else:
            pair.Recv(buf, source=0, tag=7)
            pair.Send(buf, dest=0, tag=7)
        if i >= warmup:
            times.append((MPI.Wtime() - t0) / 2)
    return pair.bcast(float(np.median(times)) if rank == 0 else None, root=0)


def _pair_times(comm: MPI.Comm, peer: int, sizes, reps: int, rounds: int, pause: Callable[[int], float]):
    """Ping-pong times (per size, the median of the rounds' medians) between rank 0 and ``peer``; on
    every rank of ``comm`` (the others wait without spinning)."""
    rank = comm.Get_rank()
    pair = comm.Split(0 if rank in (0, peer) else MPI.UNDEFINED, 0 if rank == 0 else 1)
    times = None
    if pair != MPI.COMM_NULL:
        out = []
        for _ in range(rounds):
            row = []
            for n in sizes:
                row.append(paced_pingpong(pair, n, reps, 3, pause(n)))
            out.append(row)
        times = [robust(ts)["value"] for ts in zip(*out)]
        pair.Free()
        comm.Ibarrier().Wait()
    else:
        wait_idle(comm)
    return comm.bcast(times, root=0)


def _bucket_on(comm: MPI.Comm, peer: int, rounds: int):
    rank = comm.Get_rank()
    pair = comm.Split(0 if rank in (0, peer) else MPI.UNDEFINED, 0 if rank == 0 else 1)
    got = None
    if pair != MPI.COMM_NULL:
        got = bucket(pair, rounds)
        pair.Free()
        comm.Ibarrier().Wait()
    else:
        wait_idle(comm)
    return comm.bcast(got, root=0)


def _table(say, sizes, times, alpha, beta) -> list[dict[str, float]]:
    say(f"{'bytes':>9} {'measured us':>12} {'model us':>10} {'model/meas':>10} {'GB/s':>7}")
    for n, t in zip(sizes, times):
        m = alpha + beta * n
        say(f"{n:9d} {t * 1e6:12.2f} {m * 1e6:10.2f} {m / t:10.2f} {n / t / 1e9:7.3f}")
    say(f"fit: alpha {alpha * 1e6:.2f} us, beta {beta * 1e9:.4f} ns/byte ({1 / beta / 1e9:.2f} GB/s)")
    return [{"bytes": n, "seconds": t, "model_s": alpha + beta * n} for n, t in zip(sizes, times)]


def measure(comm: MPI.Comm, nodes: list[int], sizes, reps: int, repeats: int, say) -> dict[str, Any]:
    """``link`` (and ``node_link`` where the ranks span nodes) of the machine file, with the raw rows:
    ``{"link": {...}, "node_link": {...} | None, "link_measured": str, "node_link_measured": str | None,
    "rows": {...}}`` (the same on every rank; ``nodes`` as :func:`cotsdl.array.grid.rank_nodes`)."""
    size = comm.Get_size()
    same = [r for r in range(1, size) if nodes[r] == nodes[0]]
    other = [r for r in range(1, size) if nodes[r] != nodes[0]]
    rounds = rounds_for(repeats)
    out: dict[str, Any] = {"node_link": None, "node_link_measured": None, "rows": {}}
    if same:
        say(f"[3/4] MPI ping-pong ranks 0 <-> {same[0]} (one node), {len(sizes)} sizes ...")
        times = _pair_times(comm, same[0], sizes, reps, rounds, lambda n: 0.0)
        out["link_measured"] = f"MPI ping-pong ranks 0-{same[0]} (one node)"
    else:
        say("[3/4] no second rank on rank 0's node: the link within a node is fitted to an in-process copy "
            "(labelled in source)")
        times = comm.bcast(copy_times(sizes, reps) if comm.Get_rank() == 0 else None, root=0)
        out["link_measured"] = "NOT MEASURED (no two ranks on one node): alpha/beta are an in-process numpy copy"
    alpha, beta = fit_link(sizes, times)
    out["rows"]["pingpong" if same else "copy"] = _table(say, sizes, times, alpha, beta)
    out["link"] = {"alpha_s": alpha, "beta_s_per_byte": beta}
    if other:
        peer = other[0]
        say(f"[3/4] between nodes: streams of {STREAMS[0] >> 20} and {STREAMS[1] >> 20} MiB ranks 0 -> {peer} "
            "(the rate the link holds, and any burst) ...")
        rate, burst, srows = _bucket_on(comm, peer, max(2, min(rounds, 3)))
        shaped = burst >= MIN_BURST
        say(f"sustained {rate / 1e6:.1f} MB/s, burst {burst / 1024:.0f} KiB"
            + (" (a token bucket: the ping-pong keeps to messages within half of it)" if shaped else " (no bucket)"))
        near = [n for n in sizes if n <= burst / 2] if shaped else list(sizes)
        near = near if len(near) >= 2 else list(sizes[:2])
        say(f"[3/4] MPI ping-pong ranks 0 <-> {peer} (two nodes), {len(near)} sizes ...")
        # on a shaped link each round trip waits until the bucket has back what the last one took
        times = _pair_times(comm, peer, near, reps, rounds, (lambda n: 1.5 * n / rate) if shaped else (lambda n: 0.0))
        a2, b2 = fit_link(near, times)
        out["rows"]["pingpong_nodes"] = _table(say, near, times, a2, b2)
        out["rows"]["streams"] = srows
        out["node_link"] = {"alpha_s": a2, "beta_s_per_byte": b2, "sustained_bytes_per_s": float(rate),
                            "burst_bytes": float(burst)}
        out["node_link_measured"] = f"MPI ping-pong and streams ranks 0-{peer} (two nodes)"
    return out
