"""``cotsdl train --watchdog SECONDS``: a job whose ranks stop making progress ends, saying which ranks.

A rank stopped (SIGSTOP, a hung node, a dead NIC) leaves the others waiting inside an
MPI collective forever, where no signal handler runs.  Every rank therefore runs a
thread that (1) writes ``RUN/.watchdog/rank-NNNNN`` every ``period`` seconds with its
last completed step and the time, and (2) when its own rank has completed no step for
``timeout`` seconds, reads every rank's file: ranks whose file stopped changing are the
ones that did not arrive.  The lowest rank that is still responding prints one message
naming them and aborts the job (``MPI_Abort``: mpiexec or srun ends every process, stopped
ones included); the last complete checkpoint is intact, and re-running resumes from it.
The files live in the run folder because it is shared by every node already (each rank
writes its checkpoint shard there).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

#: Default ``--watchdog``: generous, so that a slow first step or a big checkpoint never trips it.
DEFAULT_TIMEOUT = 600.0
#: Seconds a firing watchdog gives MPI_Abort before the rank ends itself.
ABORT_WAIT = 5.0


class Watchdog:
    """Start with :meth:`start`; call :meth:`progress` after every completed step; :meth:`stop` at the end."""

    def __init__(self, folder: str | os.PathLike, rank: int, size: int, timeout: float,
                 abort: Callable[[int], Any], period: float | None = None, say: Callable[[str], Any] | None = None):
        self.folder, self.rank, self.size, self.timeout = Path(folder), rank, size, float(timeout)
        self.period = float(period if period is not None else max(0.5, min(10.0, self.timeout / 10)))
        self._abort, self._say = abort, say or (lambda m: print(m, file=sys.stderr, flush=True))
        self.step, self._last = 0, time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cotsdl-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self.folder.mkdir(parents=True, exist_ok=True)
        self._beat()
        self._thread.start()
        return self

    def progress(self, step: int | None = None) -> None:
        """A step completed (``step``: its global number; None: one more than before)."""
        self.step, self._last = (self.step + 1 if step is None else int(step)), time.monotonic()

    def stop(self) -> None:
        self._done.set()

    def _file(self, rank: int) -> Path:
        return self.folder / f"rank-{rank:05d}"

    def _beat(self) -> None:
        tmp = self._file(self.rank).with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"step": self.step, "time": time.time(), "host": os.uname().nodename,
                                       "pid": os.getpid()}))
            os.replace(tmp, self._file(self.rank))
        except OSError:
            pass  # a full disk must not end the job through its watchdog

    def _run(self) -> None:
        while not self._done.wait(self.period):
            self._beat()
            if time.monotonic() - self._last > self.timeout:
                self._fire()
                return

    def _fire(self) -> None:
        now, stale, seen = time.time(), [], {}
        for r in range(self.size):
            try:
                seen[r] = json.loads(self._file(r).read_text())
            except (OSError, ValueError):
                seen[r] = None
            if seen[r] is None or now - seen[r]["time"] > 3 * self.period:
                stale.append(r)
        alive = [r for r in range(self.size) if r not in stale]
        if alive and self.rank != alive[0]:  # one message: the lowest responding rank speaks and aborts
            time.sleep(5 * self.period)  # unless it is stuck too
        if stale:
            who = "; ".join(f"rank {r}" + (f" (host {seen[r]['host']}, pid {seen[r]['pid']}, last step {seen[r]['step']},"
                                           f" silent for {now - seen[r]['time']:.0f} s)" if seen[r] else " (never seen)")
                            for r in stale)
            what = f"rank(s) that stopped responding: {who}"
        else:
            what = ("every rank is alive but none completes a step: a deadlock or a hung network (steps: "
                    + ", ".join(f"rank {r} {seen[r]['step']} on {seen[r]['host']}" for r in range(self.size) if seen[r])
                    + ")")
        self._say(f"cotsdl: error: watchdog: no training step completed in {self.timeout:.0f} s (after global step "
                  f"{self.step}); {what}. Ending the job; the last complete checkpoint is intact (re-run to resume)")
        # MPI_Abort asks the launcher to end every rank; on a node cut off from the launcher that request
        # never arrives and the call does not return: this rank then ends itself.
        ender = threading.Timer(ABORT_WAIT, os._exit, (1,))
        ender.daemon = True
        ender.start()
        try:
            self._abort(1)
        finally:  # an abort that returns (a caller's own, a test's) leaves the process to it
            ender.cancel()
