"""Thread-level parallelism of the numpy backend.

The per-site products are small; one BLAS call each, multithreaded inside BLAS,
would leave cores idle.  Instead the sites are cut into chunks that fit in cache,
the chunks run on a small thread pool (numpy releases the GIL in copies and
matmul), and BLAS itself runs single-threaded meanwhile.  With several MPI ranks
per node, the caller sets the thread count to the node's cores per rank
(:func:`set_num_threads`) so ranks do not oversubscribe the cores.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator

_threads: int | None = None
_pool: ThreadPoolExecutor | None = None
_controller = None
CHUNK_BYTES = 1 << 20  # gathered operand per chunk: about an L2 cache


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def num_threads() -> int:
    """Threads used by the numpy backend: ``set_num_threads``, else ``COTSDL_NUM_THREADS``, else the cores."""
    if _threads is not None:
        return _threads
    env = os.environ.get("COTSDL_NUM_THREADS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"COTSDL_NUM_THREADS must be a positive integer, got {env!r}")
        return int(env)
    return available_cores()


def set_num_threads(n: int | None) -> None:
    """Set the numpy backend's thread count (None: back to the default)."""
    global _threads, _pool
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"number of threads must be a positive integer, got {n!r}")
    _threads = n
    if _pool is not None:
        _pool.shutdown()
        _pool = None


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """BLAS limited to one thread inside the block (our threads do the parallel work)."""
    global _controller
    try:
        from threadpoolctl import ThreadpoolController  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a dependency, but stay usable without it
        yield
        return
    if _controller is None:
        _controller = ThreadpoolController()
    with _controller.limit(limits=1, user_api="blas"):
        yield


def chunked(n: int, work: Callable[[int, int], Any], bytes_per_item: int) -> list[Any]:
    """Run ``work(lo, hi)`` over ``[0, n)`` in cache-sized chunks on the thread pool.

    Returns the chunks' results in order.  Chunks hold at least one item, at most
    about ``CHUNK_BYTES`` of gathered operand, and there are at least as many
    chunks as threads.
    """
    global _pool
    if n <= 0:
        return []
    threads = min(num_threads(), n)
    per = max(1, min(CHUNK_BYTES // max(1, bytes_per_item), -(-n // threads)))
    bounds = [(lo, min(n, lo + per)) for lo in range(0, n, per)]
    with single_threaded_blas():
        if threads == 1:
            return [work(lo, hi) for lo, hi in bounds]
        if _pool is None or _pool._max_workers != threads:  # noqa: SLF001 - resize on demand
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="cotsdl")
        return [f.result() for f in [_pool.submit(work, lo, hi) for lo, hi in bounds]]
