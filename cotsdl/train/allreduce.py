"""Averaging gradients across data-parallel replicas with few, large allreduces.

As Horovod's tensor fusion does, the arrays are packed into buckets of at most
``bucket_bytes`` and each bucket is reduced with one allreduce: many small arrays
cost one latency, not one each.  The buckets live where the arrays live (host or
device); :func:`cotsdl.array.collective.allreduce` hands them to MPI safely.

Each bucket is reduced flat (one MPI allreduce over the replicas) or, where the replicas'
group spans nodes and some node holds more than one of its ranks, in two levels (within each
node, across the nodes, within each node: :class:`cotsdl.array.twolevel.TwoLevel`), as
``parallel.reduction`` says (:class:`Reduction`; the names and "auto"'s rule:
:mod:`cotsdl.planner.reduction`).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from mpi4py import MPI

from .. import backend
from ..array.collective import allreduce, raise_collectively
from ..array.grid import rank_nodes
from ..array.twolevel import TwoLevel
from ..planner.reduction import REDUCTIONS, choose, setting_error

__all__ = ["BUCKET_BYTES", "REDUCTIONS", "Reduction", "average", "choose", "setting_error"]

BUCKET_BYTES = 64 << 20


class Reduction:
    """The sum over ``comm`` that ``setting`` chooses for it (collective; built once, kept).

    ``kind`` is "flat" or "two-level" and ``reason`` says why; calling it reduces a contiguous
    buffer in place.  ``nodes``: every rank's node label (default :func:`rank_nodes`)."""

    def __init__(self, comm: MPI.Comm, setting: str = "auto", nodes: Sequence[int] | None = None):
        raise_collectively(comm, setting_error(setting))
        nodes = rank_nodes(comm) if nodes is None else list(nodes)
        self.comm = comm
        self.kind, self.reason = choose(setting, nodes)
        self._two = TwoLevel(comm, nodes) if self.kind == "two-level" and comm.Get_size() > 1 else None

    def __call__(self, buf: Any) -> Any:
        return allreduce(self.comm, buf) if self._two is None else self._two.allreduce(buf)

    def free(self) -> None:
        if self._two is not None:
            self._two.free()


def average(comm: MPI.Comm, arrays: dict[str, np.ndarray], bucket_bytes: int = BUCKET_BYTES,
            reduce: Callable[[Any], Any] | None = None) -> dict[str, np.ndarray]:
    """The mean of every named array over the ranks of ``comm`` (new arrays; same dtypes); each bucket
    summed by ``reduce`` (a :class:`Reduction` of ``comm``; default a flat allreduce)."""
    reduce = reduce or (lambda buf: allreduce(comm, buf))
    size = comm.Get_size()
    if size == 1:
        return {k: v.copy() for k, v in arrays.items()}
    out: dict[str, np.ndarray] = {}
    names = sorted(arrays)  # the same order on every rank
    by_dtype: dict[np.dtype, list[str]] = {}
    for n in names:
        by_dtype.setdefault(np.dtype(arrays[n].dtype), []).append(n)
    for dtype, group in sorted(by_dtype.items(), key=lambda kv: kv[0].str):
        bucket: list[str] = []
        nbytes = 0
        for n in group + [None]:  # None flushes the last bucket
            if n is not None and (not bucket or nbytes + arrays[n].nbytes <= bucket_bytes):
                bucket.append(n)
                nbytes += arrays[n].nbytes
                continue
            xp = backend.array_module(arrays[bucket[0]]) if bucket else np
            buf = xp.concatenate([arrays[b].ravel() for b in bucket]) if bucket else np.zeros(0, dtype)
            reduce(buf)
            buf /= dtype.type(size)
            off = 0
            for b in bucket:
                k = arrays[b].size
                out[b] = buf[off:off + k].reshape(arrays[b].shape)
                off += k
            if n is not None:
                bucket, nbytes = [n], arrays[n].nbytes
    return out
