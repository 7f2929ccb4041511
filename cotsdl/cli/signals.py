"""The preemption protocol of ``cotsdl train``: SIGTERM, SIGUSR1 or SIGINT means "checkpoint and stop".

Slurm (``--signal``) and PBS (before ``kill_delay`` runs out) warn a job before its
time limit; Ctrl-C at a terminal sends SIGINT.  The first signal only sets a flag; the trainer asks every rank at the
next step boundary (one allreduce), all ranks write a checkpoint and the program
exits with :data:`EXIT_REQUEUE` so that the job script can requeue it.  A second
signal ends the process at once (status 128 + signal number): checkpoints are
committed by a rename, so the last complete one is never damaged.  A SIGTERM or SIGUSR1
within ``grace`` seconds (3) of the first counts as the same request: at a time limit a
rank often gets SIGTERM twice (from the scheduler, and forwarded by srun or mpiexec).
A second Ctrl-C (SIGINT) always ends at once: a person pressed it twice.
"""
from __future__ import annotations

import os
import signal
import time

#: Exit status after a checkpoint written on request: "requeue me" (EX_TEMPFAIL of sysexits.h).
EXIT_REQUEUE = 75
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class PreemptionGuard:
    """Install the handlers (main thread only); ``requested()`` says whether a signal came."""

    def __init__(self, signals: tuple[int, ...] = SIGNALS, grace: float = 3.0):
        self.received: int | None = None
        self.grace = float(grace)
        self._at = 0.0
        self._old = {s: signal.signal(s, self._handle) for s in signals}

    def _handle(self, signum: int, frame) -> None:
        if (self.received is not None and signum != signal.SIGINT
                and time.monotonic() - self._at < self.grace):
            return  # the same request delivered twice (a scheduler's signal, forwarded again by srun/mpiexec)
        if self.received is not None:
            os.write(2, f"cotsdl: second signal {signal.Signals(signum).name}: exiting now; the last complete "
                        "checkpoint is intact\n".encode())
            os._exit(128 + signum)
        self.received, self._at = signum, time.monotonic()

    def requested(self) -> bool:
        return self.received is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
