"""Averaging gradients across data-parallel replicas with few, large allreduces.

As Horovod's tensor fusion does, the arrays are packed into buckets of at most
``bucket_bytes`` and each bucket is reduced with one allreduce: many small arrays
cost one latency, not one each.  The buckets live where the arrays live (host or
device); :func:`cotsdl.array.collective.allreduce` hands them to MPI safely.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import backend
from ..array.collective import allreduce

BUCKET_BYTES = 64 << 20


def average(comm: MPI.Comm, arrays: dict[str, np.ndarray], bucket_bytes: int = BUCKET_BYTES) -> dict[str, np.ndarray]:
    """The mean of every named array over the ranks of ``comm`` (new arrays; same dtypes)."""
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
            allreduce(comm, buf)
            buf /= dtype.type(size)
            off = 0
            for b in bucket:
                k = arrays[b].size
                out[b] = buf[off:off + k].reshape(arrays[b].shape)
                off += k
            if n is not None:
                bucket, nbytes = [n], arrays[n].nbytes
    return out
