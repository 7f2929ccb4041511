"""Timing by interleaved rounds, shared by the benchmarks: a burst of load from other processes
spoils a round of every contestant alike instead of all the samples of one."""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np


def rounds_for(repeats: int) -> int:
    """Rounds of interleaved samples: ``repeats``, at least 3 (a median that can outvote one bad round)."""
    return max(3, int(repeats))


def interleaved_rounds(fns: dict[Any, Callable[[], Any]], rounds: int, calls: int = 1, seconds: float = 0.0,
                       per_round: Callable[[list[float]], float] = np.median,
                       sync: Callable[[], Any] | None = None) -> dict[Any, list[float]]:
    """Per function, one value per round: ``per_round`` of its wall times in that round (the median for
    typical times, ``min`` for a ceiling).

    Every round calls each function in turn (after one warm-up call each), at least ``calls`` times and
    for ``seconds``, so that a burst of load from other processes spoils a round of every item alike
    instead of all the samples of one item (as timing each item in one block did).  :func:`robust` turns
    the rounds into one number.  ``sync`` ends every call, inside the timing (a device synchronization,
    or a barrier: then every rank must make the same calls, so give ``calls``, not ``seconds``).
    """
    sync = sync or (lambda: None)
    for fn in fns.values():
        fn()
        sync()
    out: dict[Any, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times: list[float] = []
            while len(times) < calls or sum(times) < seconds:
                t0 = time.perf_counter()
                fn()
                sync()
                times.append(time.perf_counter() - t0)
            out[name].append(float(per_round(times)))
    return out


def robust(values) -> dict[str, float]:
    """The median of per-round values (bursts of load that spoil fewer than half the rounds do not move
    it), its quartiles and ``spread`` = (q75 - q25) / median, the rounds' disagreement."""
    a = np.asarray(values, float)
    if a.size == 0 or not np.all(np.isfinite(a)):
        raise ValueError(f"robust(): need finite samples, got {values!r}")
    q25, med, q75 = (float(v) for v in np.percentile(a, [25, 50, 75]))
    return {"value": med, "q25": q25, "q75": q75, "spread": (q75 - q25) / med if med > 0 else 0.0,
            "rounds": int(a.size)}


def median_order(n: int, level: float = 0.95) -> tuple[int, float]:
    """(j, coverage) of the distribution-free interval (x_(j), x_(n+1-j)) for the median of n values:
    the largest j whose coverage 1 - 2 P(Binomial(n, 1/2) < j) is at least ``level``, else 1 (the
    range, with its smaller coverage)."""
    def coverage(j: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(j)) / 2.0 ** n

    j = 1
    while j + 1 <= (n + 1) // 2 and coverage(j + 1) >= level:
        j += 1
    return j, coverage(j)


def median_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free interval for the median of ``values``: (x_(j), x_(n+1-j), coverage), j as
    :func:`median_order` chooses it."""
    a = sorted(float(v) for v in values)
    n = len(a)
    if n == 0 or not all(math.isfinite(v) for v in a):
        raise ValueError(f"median_interval(): need finite samples, got {values!r}")
    j, coverage = median_order(n, level)
    return a[j - 1], a[n - j], coverage


def interleaved_best(fns: dict[str, Callable[[], Any]], repeats: int, min_time: float = 0.0,
                     sync: Callable[[], Any] | None = None) -> dict[str, float]:
    """Minimum wall time of each function over :func:`interleaved_rounds` (after a warm-up call each):
    ``repeats`` rounds, at least ``min_time`` seconds of calls per function in all."""
    rounds = max(1, int(repeats))
    per = interleaved_rounds(fns, rounds, seconds=min_time / rounds, per_round=min, sync=sync)
    return {name: min(v) for name, v in per.items()}
