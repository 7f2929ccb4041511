"""Collectives: reductions of numbers and buffers, and collective validation.

**Reductions.**  Every sum over ranks in the package goes through :func:`allreduce`
(a buffer, host or device), :func:`sum_values` (a few numbers) or, for the replicas'
gradients across nodes, :class:`cotsdl.array.twolevel.TwoLevel`; all hand MPI memory
through :func:`on_mpi_memory`.  MPI does not see CUDA streams, so a device buffer is
handed over only after the stream is synchronized, and a device pointer reaches MPI
only when the library is CUDA-aware; otherwise the buffer is staged through
page-locked host memory.

**Waiting.**  MPICH's blocking calls busy-poll.  Where a node runs more ranks than it has
cores, the polling rank takes the core from the rank whose message it waits for, so the
waits of exchanges and reductions can instead give the core away between polls
(:func:`yield_waits`, which ``cotsdl train`` turns on for exactly that case).

**Validation.**  A check that fails on one rank only and raises there would leave its
peers waiting in the next collective call forever.  Every rank therefore reports its
own verdict, the verdicts are reduced, and all ranks raise the same exception.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable

import numpy as np
from mpi4py import MPI

from .. import backend
from .cudampi import cuda_aware_mpi


_YIELDING = False


def yield_waits(on: bool) -> None:
    """Make this process's waits for exchanges and reductions (:func:`wait_all`, :func:`allreduce`) give
    its core away between polls (``on``), or busy-poll in MPI's blocking calls (off: the default, the
    fastest wait on a core of its own).  For a node that runs more ranks than it has cores: there a
    busy-polling rank holds the core the rank it waits for needs (4 ranks on 2 one-core simulated nodes,
    the demo at 64x64: 35-37 ms a step polling, 26 ms yielding)."""
    global _YIELDING
    _YIELDING = bool(on)


def waits_yield() -> bool:
    """Whether :func:`yield_waits` is on in this process."""
    return _YIELDING


def wait_all(reqs: list) -> None:
    """Wait for MPI requests: ``Waitall``, or with :func:`yield_waits` on, ``Testall`` polls with the core
    given away between them (``sched_yield``: the other ranks on it run first)."""
    if not _YIELDING:
        MPI.Request.Waitall(reqs)
        return
    while not MPI.Request.Testall(reqs):
        os.sched_yield()


def allreduce(comm: MPI.Comm, buf: Any, op: MPI.Op = MPI.SUM) -> Any:
    """Reduce the contiguous array ``buf`` (NumPy or CuPy) over ``comm`` in place; return it.

    Device buffers: the stream is synchronized first; without CUDA-aware MPI the data
    travels through a page-locked host copy (one copy down, one up).  With
    :func:`yield_waits` on, a nonblocking reduction waited for by :func:`wait_all`.
    """
    if not getattr(getattr(buf, "flags", None), "c_contiguous", False):
        raise ValueError("allreduce needs a C-contiguous buffer (MPI reads flat memory)")
    if comm.Get_size() == 1:
        return buf
    if _YIELDING:
        return on_mpi_memory(buf, lambda mem: wait_all([comm.Iallreduce(MPI.IN_PLACE, mem, op=op)]))
    return on_mpi_memory(buf, lambda mem: comm.Allreduce(MPI.IN_PLACE, mem, op=op))


def on_mpi_memory(buf: Any, fn: Callable[[Any], Any]) -> Any:
    """Call ``fn(mem)`` on memory MPI can take that holds the numbers of ``buf`` (contiguous), and
    return ``buf`` holding what ``fn`` left there: ``mem`` is ``buf`` itself (a host array; a device
    array under CUDA-aware MPI, its stream synchronized first), else a page-locked host copy
    (one copy down, one up, whatever MPI calls ``fn`` makes)."""
    if not backend.is_device_array(buf):
        fn(buf)
        return buf
    backend.synchronize(buf)
    if cuda_aware_mpi():
        fn(buf)
        return buf
    host = backend.empty_host_like(buf)
    backend.copy_to_host(buf, host)
    fn(host)
    backend.copy_from_host(host, buf)
    return buf


def wait_idle(comm: MPI.Comm) -> None:
    """A barrier polled with sleeps, so that ranks with nothing to do take no core from the ranks
    being timed or from what rank 0 measures (a blocking barrier busy-polls under MPICH).  The
    ranks that work call it (or ``comm.Ibarrier().Wait()``) when done."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.005)


def sum_values(comm: MPI.Comm | None, values: Iterable[float]) -> np.ndarray:
    """The sums over the ranks of ``comm`` of a few numbers, in float64, in one allreduce
    (``comm`` None: the numbers themselves)."""
    a = np.array([float(v) for v in values], dtype=np.float64)
    return a if comm is None else allreduce(comm, a)


def raise_collectively(comm: MPI.Comm, error: str | OSError | None, exc_type: type[Exception] = ValueError) -> None:
    """Raise ``exc_type`` on every rank of ``comm`` if any rank passes an ``error``.

    The message is the error of the lowest failing rank, so every rank raises the
    same text.  An ``OSError`` passed as the error (the machine's failure, e.g. a full
    disk, not bad input) is raised as an ``OSError`` whatever ``exc_type`` says.  Costs
    one small allreduce when all is well.
    """
    failed = comm.allreduce(0 if error is None else 1, op=MPI.MAX)
    if not failed:
        return
    errors = comm.allgather(None if error is None else (isinstance(error, OSError), str(error)))
    rank, (machine, msg) = next((r, e) for r, e in enumerate(errors) if e is not None)
    nfail = sum(e is not None for e in errors)
    more = f"; {nfail - 1} more rank(s) failed too" if nfail > 1 else ""
    raise agreed((OSError if machine else exc_type)(f"{msg} [reported by rank {rank} of {comm.Get_size()}{more}]"))


def agreed(exc: Exception) -> Exception:
    """Mark ``exc`` as raised on every rank alike (after an agreement): a program may then
    end MPI cleanly instead of aborting, and report it once."""
    exc.collective = True
    return exc


def agree(comm: MPI.Comm, **values) -> None:
    """Raise the same ``ValueError`` on every rank unless every rank passes equal ``values``.

    A collective entry point whose arguments differ between ranks (another step count,
    path or seed on one rank) would otherwise hang or train inconsistently; one small
    allgather of plain data settles it.  Every rank must pass the same keys.
    """
    everyone = comm.allgather(values)
    for key in values:
        seen = [v[key] for v in everyone]
        if any(s != seen[0] for s in seen):
            shown = ", ".join(f"rank {r}: {_short(s)}" for r, s in enumerate(seen) if r < 8)
            raise agreed(ValueError(f"ranks disagree on {key}: {shown}"))


def differences(comm: MPI.Comm, value: Any, show: Callable[[Any], str] = repr) -> str | None:
    """None when every rank passes an equal ``value`` (one allgather), else the ranks grouped by
    what they passed: ``rank 0: X; ranks 1, 2: Y`` (``show`` renders a value)."""
    everyone = comm.allgather(value)
    if all(v == everyone[0] for v in everyone):
        return None
    groups: list[tuple[Any, list[int]]] = []
    for rank, v in enumerate(everyone):
        same = next((ranks for seen, ranks in groups if seen == v), None)
        if same is None:
            groups.append((v, [rank]))
        else:
            same.append(rank)
    return "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {show(v)}" for v, r in groups)


def _short(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
