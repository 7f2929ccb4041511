"""``cotsdl bench exchange``: halo exchange bandwidth against an MPI ping-pong of the same messages.

For each halo width, every rank of a Py x Px grid holds its owned block of an
(H, W, C, N) array plus a halo on every side and refreshes it with an
:class:`ExchangePlan`.  In the same run ranks 0 and 1 play ping-pong with each
message size the busiest rank sends.  The ping-pong time of the busiest rank's
messages, sent one after another, is the peer: the fraction printed is
``ping-pong time / exchange time`` (= achieved bandwidth / ping-pong bandwidth).
The exchange includes packing and unpacking; above 1 means the concurrent
messages overlapped better than back-to-back ping-pongs.
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from .. import backend
from ..array import Box, DistArray, ExchangePlan, ProcessGrid, grow, use_node_local_gpu
from ..array.collective import raise_collectively
from .common import metadata, summary, timed


def pingpong(comm: MPI.Comm, nbytes: int, repeats: int, warmup: int) -> float | None:
    """One-way time (s, median) of an ``nbytes`` message between ranks 0 and 1; None on one rank."""
    if comm.Get_size() < 2:
        return None
    rank = comm.Get_rank()
    buf = np.zeros(max(nbytes, 1), np.uint8)[:nbytes]
    times = []
    for i in range(warmup + repeats):
        comm.Barrier()
        t0 = MPI.Wtime()
        if rank == 0:
            comm.Send(buf, dest=1, tag=7)
            comm.Recv(buf, source=1, tag=7)
        elif rank == 1:
            comm.Recv(buf, source=0, tag=7)
            comm.Send(buf, dest=0, tag=7)
        if i >= warmup:
            times.append((MPI.Wtime() - t0) / 2)
    return comm.bcast(float(np.median(times)) if rank == 0 else None, root=0)


def run(comm: MPI.Comm, shape: Sequence[int], halos: Sequence[int], dims: Sequence[int] | None = None,
        dtype: Any = np.float32, repeats: int = 20, warmup: int = 3, log=sys.stdout) -> dict[str, Any]:
    """Measure and return the results (significant on every rank); rank 0 prints progress."""
    shape = tuple(int(s) for s in shape)
    err = None
    if len(shape) != 4 or min(shape) < 1:
        err = f"--shape must be four positive integers H W C N, got {shape}"
    elif not halos or min(halos) < 0:
        err = f"--halos must be non-negative integers, got {list(halos)}"
    elif repeats < 1 or warmup < 0:
        err = f"--repeats must be >= 1 and --warmup >= 0, got {repeats} and {warmup}"
    raise_collectively(comm, err)
    grid = ProcessGrid(comm, dims, extent=shape[:2])
    rank, item = comm.Get_rank(), np.dtype(dtype).itemsize
    if backend.name() == "cuda":  # device buffers, one GPU per rank of a node
        use_node_local_gpu(comm)
    zeros = backend.xp().zeros
    say = (lambda *a: print(*a, file=log, flush=True)) if rank == 0 else (lambda *a: None)
    out: dict[str, Any] = {"benchmark": "exchange", **metadata(comm), "backend": backend.name(),
                           "grid": list(grid.dims), "shape": list(shape),
                           "dtype": np.dtype(dtype).name, "repeats": repeats, "results": []}
    say(f"cotsdl bench exchange: {grid.size} rank(s), {backend.name()} backend, grid {grid.dims[0]}x{grid.dims[1]}, shape {shape} "
        f"{np.dtype(dtype).name}, {repeats} repeats; {out['mpi_library']}")
    say(f"{'halo':>5} {'msgs':>5} {'KiB/msg':>9} {'KiB sent':>9} {'exch ms':>9} {'exch GB/s':>10} "
        f"{'pp ms':>9} {'pp GB/s':>9} {'fraction':>9}")
    gbox = Box.from_shape(shape)
    for h in halos:
        arr = DistArray.on_grid(grid, shape, dtype, window=lambda b: grow(b, (h, h), (h, h), gbox), zeros=zeros)
        arr.data[...] = rank
        plan = ExchangePlan.between(arr, arr)
        t = summary(timed(comm, lambda: plan.exchange(arr, arr, validate=False), repeats, warmup))
        sizes = [t_.box.size * item for t_ in plan.sends if t_.peer != rank]
        per_rank = comm.allgather(sizes)
        busiest = max(per_rank, key=sum)
        pp = {m: pingpong(comm, m, max(5, repeats // 2), 2) for m in sorted(set(b for r in per_rank for b in r))}
        pp_time = sum(pp[m] for m in busiest) if busiest and pp and None not in pp.values() else None
        sent = sum(busiest)
        row = {
            "halo": h, "messages_busiest_rank": len(busiest), "bytes_sent_busiest_rank": sent,
            "bytes_sent_all_ranks": comm.allreduce(plan.bytes_sent),
            "bytes_local_max": comm.allreduce(plan.bytes_local, op=MPI.MAX),
            "exchange": t, "exchange_GBps": sent / t["median_s"] / 1e9 if sent else None,
            "pingpong_one_way_s": {str(m): v for m, v in pp.items()},
            "pingpong_time_s": pp_time, "pingpong_GBps": sent / pp_time / 1e9 if pp_time else None,
            "fraction_of_pingpong": pp_time / t["median_s"] if pp_time else None,
        }
        out["results"].append(row)
        fmt = lambda v, s="{:9.3f}": s.format(v) if v is not None else f"{'-':>9}"  # noqa: E731
        say(f"{h:5d} {len(busiest):5d} {(sent / len(busiest) / 1024 if busiest else 0):9.1f} {sent / 1024:9.1f} "
            f"{t['median_s'] * 1e3:9.3f} {fmt(row['exchange_GBps'], '{:10.3f}'):>10} "
            f"{fmt(pp_time and pp_time * 1e3)} {fmt(row['pingpong_GBps'])} {fmt(row['fraction_of_pingpong'])}")
    if grid.size == 1:
        say("(one rank: the exchange is local copies only, so there is no ping-pong to compare with)")
    grid.free()
    return out
