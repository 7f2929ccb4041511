"""Helpers shared by the benchmarks: timing across ranks, metadata, atomic JSON output."""
from __future__ import annotations

import json
import os
import platform
import socket
import time
from typing import Any, Callable

import numpy as np


def timed(comm, fn: Callable[[], Any], repeats: int, warmup: int) -> list[float]:
    """Wall times of ``fn`` (seconds), each the slowest rank's, after a barrier.

    The slowest rank defines a collective step, so each sample is reduced with MAX.
    """
    from mpi4py import MPI  # noqa: PLC0415

    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        samples.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return samples


def as_step(lent: Any, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` as one training step: its results in memory ``lent`` (an ``ops.Outputs``) lends for the
    step and takes back at the next, as ``NetworkPlan.step`` does."""
    def step() -> Any:
        with lent.step():
            return fn()
    return step


def summary(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples)
    return {"median_s": float(np.median(a)), "min_s": float(a.min()), "max_s": float(a.max()), "samples": len(a)}


def metadata(comm) -> dict[str, Any]:
    from mpi4py import MPI  # noqa: PLC0415

    from .. import __version__  # noqa: PLC0415

    return {
        "cotsdl": __version__,
        "ranks": comm.Get_size(),
        "hosts": sorted(set(comm.allgather(socket.gethostname()))),
        "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def check_output_path(path: str | None) -> str | None:
    """Why ``path`` cannot be written (checked before a long run); else None."""
    if path is None:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"--json {path} is a folder: give a file name (e.g. {os.path.join(path, 'results.json')})"
    if not os.path.isdir(folder):
        return f"--json {path}: folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"--json {path}: folder {folder} is not writable"
    return None


def write_json(path: str, data: Any) -> None:
    """Write ``data`` to ``path`` atomically: a reader never sees half a file."""
    from ..io.atomic import write_atomic  # noqa: PLC0415

    write_atomic(path, json.dumps(data, indent=2) + "\n")
