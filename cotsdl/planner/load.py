"""The load other processes put on this machine, read from Linux's /proc (no MPI).

``other_busy_cores`` over an interval: how many of the watched cores (the CPUs this process
may run on, or those of a whole job on this host) processes outside the job kept busy, on
average -- the busy time of those CPUs in /proc/stat (user, nice, system, irq, softirq and
steal: steal is time a hypervisor gave the core to another guest) less the CPU time of the
job's own processes (/proc/PID/stat, all their threads), divided by the interval, clamped to
[0, watched cores].  A calibration records it (``cotsdl bench calibrate``); the planner
compares it with the load now (:func:`cotsdl.planner.machine.load_warning`).  Where /proc
cannot be read (not Linux) every reading is None.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Iterable

#: /proc/stat's columns that count as busy: user nice system idle iowait irq softirq steal
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class Snapshot:
    """Counters at one moment: wall clock (s), busy ticks of the watched CPUs, CPU ticks of the job."""

    wall: float
    busy_ticks: int
    job_ticks: int
    cpus: int


def watched_cpus() -> set[int]:
    """The CPUs this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return set(range(os.cpu_count() or 1))


def _busy_ticks(cpus: set[int]) -> int:
    total = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *cols = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                total += sum(int(cols[i]) for i in _BUSY_COLUMNS if i < len(cols))
    return total


def _process_ticks(pid: int) -> int:
    """utime + stime of a process (all its threads); 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        fields = text[text.rindex(")") + 2:].split()  # the name may hold spaces and brackets
        return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5), counted from the state (3)
    except (OSError, ValueError, IndexError):
        return 0


def snapshot(pids: Iterable[int] | None = None, cpus: set[int] | None = None) -> Snapshot | None:
    """The counters now for the job ``pids`` (default: this process) on ``cpus`` (default:
    :func:`watched_cpus`); None where /proc cannot be read."""
    cpus = watched_cpus() if cpus is None else set(cpus)
    pids = [os.getpid()] if pids is None else list(pids)
    try:
        busy = _busy_ticks(cpus)
    except (OSError, ValueError, IndexError):
        return None
    return Snapshot(time.perf_counter(), busy, sum(_process_ticks(p) for p in pids), len(cpus))


def other_busy_cores(before: Snapshot | None, after: Snapshot | None) -> float | None:
    """Cores kept busy by processes outside the job between two snapshots (see the module), or None."""
    if before is None or after is None or after.wall <= before.wall:
        return None
    ticks = (after.busy_ticks - before.busy_ticks) - (after.job_ticks - before.job_ticks)
    cores = ticks / os.sysconf("SC_CLK_TCK") / (after.wall - before.wall)
    return min(max(cores, 0.0), float(after.cpus))


def measure(window: float = 0.5, pids: Iterable[int] | None = None, cpus: set[int] | None = None) -> float | None:
    """:func:`other_busy_cores` over the next ``window`` seconds (this process sleeps meanwhile)."""
    pids = None if pids is None else list(pids)
    before = snapshot(pids, cpus)
    time.sleep(window)
    return other_busy_cores(before, snapshot(pids, cpus))


def loadavg1() -> float | None:
    """The 1-minute load average (runnable tasks, the job's own included), or None."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


def job_on_host(comm) -> tuple[list[int], set[int]]:
    """The process ids of the ranks of ``comm`` on this host and the union of their CPUs (collective)."""
    host = socket.gethostname()
    everyone = comm.allgather((host, os.getpid(), sorted(watched_cpus())))
    pids = [pid for h, pid, _ in everyone if h == host]
    cpus = {c for h, _, cs in everyone if h == host for c in cs}
    return pids, cpus


def record(before: Snapshot | None, after: Snapshot | None) -> dict[str, object]:
    """The ``load`` entry of a machine file for an interval: host, other busy cores, watched cores,
    seconds, 1-minute load average at its end (None where unknown)."""
    seconds = after.wall - before.wall if before and after else None
    busy = other_busy_cores(before, after)
    return {"host": socket.gethostname(), "other_busy_cores": None if busy is None else round(busy, 3),
            "cores_watched": after.cpus if after else None,
            "seconds": None if seconds is None else round(seconds, 2), "loadavg1": loadavg1()}
