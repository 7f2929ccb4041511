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
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator

_threads: int | None = None
_pool: ThreadPoolExecutor | None = None
_controller = None
CHUNK_BYTES = 1 << 20  # gathered operand per chunk: about an L2 cache
#: Element-wise passes (pooling, LCN) over fewer bytes than this run as one band on the calling
#: thread: below it the hand-offs cost more than a second thread gains (2 cores here: LCN of
#: 1 MiB took 2.0 ms on two threads, 1.0 ms on one; 26 MiB 35 vs 40 ms).
PARALLEL_BYTES = 4 << 20


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
    """BLAS limited to one thread inside the block (our threads do the parallel work).

    The BLAS libraries are found once (threadpoolctl); entering then costs a get and, when
    BLAS has more than one thread, a set and a restore per library: microseconds, where a
    ``ThreadpoolController.limit`` per call cost about 0.1 ms (more than a small pooling call).
    """
    global _controller
    if _controller is None:
        try:
            from threadpoolctl import ThreadpoolController  # noqa: PLC0415
        except ImportError:  # pragma: no cover - a dependency, but stay usable without it
            _controller = []
        else:
            _controller = list(ThreadpoolController().select(user_api="blas").lib_controllers)
    saved = [(lib, lib.num_threads) for lib in _controller]
    changed = [(lib, n) for lib, n in saved if n != 1]
    for lib, _ in changed:
        lib.set_num_threads(1)
    try:
        yield
    finally:
        for lib, n in changed:
            lib.set_num_threads(n)


def chunk_bounds(n: int, bytes_per_item: int, threads: int | None = None) -> list[tuple[int, int]]:
    """Cache-sized ``(lo, hi)`` chunks of ``[0, n)``: at least one item, at most about
    ``CHUNK_BYTES`` of gathered operand, and at least as many chunks as threads."""
    if n <= 0:
        return []
    threads = min(num_threads() if threads is None else threads, n)
    per = max(1, min(CHUNK_BYTES // max(1, bytes_per_item), -(-n // threads)))
    return [(lo, min(n, lo + per)) for lo in range(0, n, per)]


def row_bands(n: int, bytes_per_row: int) -> list[tuple[int, int]]:
    """Bands of ``n`` rows for an element-wise pass: one band under :data:`PARALLEL_BYTES`, else
    cache-sized ones (:func:`chunk_bounds`)."""
    if n <= 0:
        return []
    return [(0, n)] if n * bytes_per_row < PARALLEL_BYTES else chunk_bounds(n, bytes_per_row)


def run_ranges(bounds: list[tuple[int, int]], work: Callable[[int, int], Any]) -> list[Any]:
    """``work(lo, hi)`` for every range on the thread pool (BLAS single-threaded meanwhile); results in order."""
    with single_threaded_blas():
        return _on_pool(bounds, work)


def run_bands(n: int, bytes_per_row: int, work: Callable[[int, int], None], one_pass: bool = False) -> None:
    """``work(lo, hi)`` over :func:`row_bands` of ``n`` rows: an element-wise pass, which calls no
    BLAS, so BLAS's threads are left as they are (entering :func:`single_threaded_blas` costs
    microseconds per call, a tenth of a small LCN).

    ``one_pass``: ``work`` reads and writes its rows once (a fused native kernel), so bands need
    not fit in cache: two per thread, which saves the hand-offs (P-paper's pooling: 27 cache-sized
    bands 3.1-3.6 ms, 4 bands 2.5-2.7 ms on 2 threads here).
    """
    bands = row_bands(n, bytes_per_row)
    if one_pass and len(bands) > 1:
        count = min(n, 2 * num_threads())
        bands = [(n * k // count, n * (k + 1) // count) for k in range(count)]
    _on_pool(bands, work)


def run_split(n: int, work: Callable[[int, int], None]) -> None:
    """``work(lo, hi)`` over ``[0, n)`` cut into one near-equal range per thread: for native kernels
    that compute (the filter's products), where equal shares balance and cache-sized bands
    would only add hand-offs."""
    count = min(n, num_threads())
    _on_pool([(n * k // count, n * (k + 1) // count) for k in range(count)], work)


def _on_pool(bounds: list[tuple[int, int]], work: Callable[[int, int], Any]) -> list[Any]:
    """``work(lo, hi)`` for every range, results in order.

    The calling thread works too, beside ``threads - 1`` pool threads, each taking the next
    range as it is free: one hand-off fewer per call (shape A's one-process training step,
    12 interleaved rounds: best 9.4 -> 8.5 ms, medians within this VM's noise).  After an
    error no new range starts; the first error is raised once every thread has stopped.
    """
    global _pool
    if len(bounds) <= 1:  # one band: on this thread, without asking how many threads there are
        return [work(lo, hi) for lo, hi in bounds]
    threads = min(num_threads(), len(bounds))
    if threads <= 1:
        return [work(lo, hi) for lo, hi in bounds]
    if _pool is None or _pool._max_workers != threads - 1:  # noqa: SLF001 - resize on demand
        if _pool is not None:
            _pool.shutdown()
        _pool = ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="cotsdl")
    results: list[Any] = [None] * len(bounds)
    todo = iter(range(len(bounds)))
    lock = threading.Lock()
    failed: list[BaseException] = []

    def drain() -> None:
        while True:
            with lock:
                i = None if failed else next(todo, None)
            if i is None:
                return
            try:
                results[i] = work(*bounds[i])
            except BaseException as e:
                with lock:
                    failed.append(e)
                raise

    helpers = [_pool.submit(drain) for _ in range(threads - 1)]
    try:
        drain()
    finally:
        errors = [f.exception() for f in helpers]  # every helper finished before anything returns
    for e in errors:
        if e is not None:
            raise e
    return results


def chunked(n: int, work: Callable[[int, int], Any], bytes_per_item: int) -> list[Any]:
    """Run ``work(lo, hi)`` over ``[0, n)`` in cache-sized chunks (:func:`chunk_bounds`) on the thread pool.

    Returns the chunks' results in order.
    """
    return run_ranges(chunk_bounds(n, bytes_per_item), work)


def colored_blocks(n: int, min_size: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """``[0, n)`` cut into blocks of at least ``min_size`` items, as (even blocks, odd blocks).

    Two blocks of one colour are separated by a block of the other, so work whose writes
    reach ``min_size`` items beyond its own block can run a colour at a time without locks.
    The count is a multiple of twice the threads where the sizes allow (balanced phases);
    when even two blocks are too many, the one block ``[0, n)`` comes back as the even colour.
    """
    if n <= 0:
        return [], []
    threads = num_threads()
    if threads == 1:
        return [(0, n)], []
    count = 2 * threads
    while count > 2 and n // count < max(1, min_size):
        count -= 2
    if count < 2 or n // count < max(1, min_size):
        return [(0, n)], []
    edges = [n * k // count for k in range(count + 1)]
    blocks = list(zip(edges[:-1], edges[1:]))
    return blocks[0::2], blocks[1::2]
