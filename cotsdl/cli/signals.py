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

Python runs a signal handler only between bytecodes of the main thread, and the main thread
may be blocked inside MPI for as long as a peer is (stopped, hung): there the handler would
run only when the peer goes on.  So the second signal is counted by a thread instead: the
interpreter's C-level handler writes every signal's number to a pipe (``signal.set_wakeup_fd``)
even while the main thread is blocked, and a small thread that reads it ends the process
(mpi4py releases the GIL inside MPI calls, as the watchdog thread relies on too).
"""
from __future__ import annotations

import os
import signal
import threading
import time

#: Exit status after a checkpoint written on request: "requeue me" (EX_TEMPFAIL of sysexits.h).
EXIT_REQUEUE = 75
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class PreemptionGuard:
    """Install the handlers (main thread only); ``requested()`` says whether a signal came.

    The main thread's handler only notes the first signal (so that ``requested()`` holds as soon
    as it returns); the thread reading the wakeup pipe counts every signal and ends the process
    on a second one, blocked main thread or not.
    """

    def __init__(self, signals: tuple[int, ...] = SIGNALS, grace: float = 3.0):
        #: called with the exit status just before a second signal ends the process (set by cotsdl train)
        self.on_exit = None
        self.received: int | None = None
        self.grace = float(grace)
        self._signals = frozenset(int(s) for s in signals)
        self._first_at: float | None = None  # when the thread saw the first signal (only it reads this)
        self._old = {s: signal.signal(s, self._note) for s in signals}
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._wfd, False)  # set_wakeup_fd needs it: a signal handler never blocks
        self._old_wakeup = signal.set_wakeup_fd(self._wfd, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="cotsdl-signals", daemon=True)
        self._thread.start()

    def _note(self, signum: int, frame) -> None:
        """The main thread's handler: the first signal is a request (the thread decides the rest).  No
        lock: a handler may run again inside itself, and either thread setting it first is the same."""
        if self.received is None:
            self.received = signum

    def _watch(self) -> None:
        while True:
            try:
                got = os.read(self._rfd, 64)  # one byte per signal, its number
            except OSError:
                return
            if not got or 0 in got:  # restore(): the guard is gone
                return
            for signum in got:
                if signum in self._signals:
                    self._count(signum)

    def _count(self, signum: int) -> None:
        now = time.monotonic()
        if self._first_at is None:
            self._first_at = now
            if self.received is None:
                self.received = signum
            return
        if signum != signal.SIGINT and now - self._first_at < self.grace:
            return  # the same request delivered twice (a scheduler's signal, forwarded again by srun/mpiexec)
        os.write(2, f"cotsdl: second signal {signal.Signals(signum).name}: exiting now; the last complete "
                    "checkpoint is intact\n".encode())
        if self.on_exit is not None:  # e.g. the node watch's goodbye: a chosen end, not a lost rank
            try:
                self.on_exit(128 + signum)
            except Exception:  # noqa: BLE001 - nothing may stop this exit
                pass
        os._exit(128 + signum)

    def requested(self) -> bool:
        return self.received is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""

    def restore(self) -> None:
        signal.set_wakeup_fd(self._old_wakeup)
        for s, h in self._old.items():
            signal.signal(s, h)
        try:
            os.write(self._wfd, b"\0")  # the thread's cue to end
        except BlockingIOError:  # a pipe full of unread signals: the thread is behind, and a daemon
            pass
        self._thread.join(5.0)
        if self._thread.is_alive():
            # Never close a pipe the thread may still read: the numbers would be reused by the next open
            # file, and the thread would take that file's bytes for signals (and could end the process).
            return
        os.close(self._wfd)
        os.close(self._rfd)
