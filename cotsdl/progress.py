"""Progress of long work, as people expect it where they watch it.

On a terminal: a tqdm bar (done/total, rate, ETA), cleared when the work ends.  Elsewhere (a batch
log, a pipe, a rank under ``mpiexec``): a plain line every ``every`` seconds and, if one was said, at
the end: ``what: done/total unit (p%), rate unit/s, ETA 3m05s``.  Only one process should make one (rank 0).
"""
from __future__ import annotations

import sys
import time
from typing import IO, Any

from . import stops


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: short, for ETAs and elapsed times."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


class Progress:
    """Progress of ``total`` units of work called ``what``.

    Parameters
    ----------
    total : int
        Units to do (steps, images, batches).
    what : str
        What is being done (the bar's label, the start of every plain line).
    unit : str
        The unit's name, plural.
    stream : file, optional
        Where it goes (default stderr: stdout stays the command's result).
    every : float
        Seconds between plain lines (not on a terminal).
    enabled : bool
        False: say nothing (ranks other than 0; work too small to report).
    start : int
        Units done before (a resumed stage): counted, not part of the rate.
    """

    def __init__(self, total: int, what: str, unit: str = "images", stream: IO[str] | None = None,
                 every: float = 10.0, enabled: bool = True, start: int = 0):
        self.total, self.what, self.unit, self.every = int(total), what, unit, float(every)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = bool(enabled) and self.total > int(start)
        self.start = self.done = int(start)  # done before (a resumed stage): not part of the rate
        self._said = False
        self.t0 = self._last = time.monotonic()
        self.bar = None
        if self.enabled and is_terminal(self.stream):
            from tqdm import tqdm  # noqa: PLC0415 - only where a terminal shows it

            self.bar = tqdm(total=self.total, initial=self.start, desc=what, unit=" " + unit, file=self.stream,
                            leave=False, dynamic_ncols=True, smoothing=0.1, mininterval=0.5)

    def update(self, done: int, **postfix: Any) -> None:
        """``done`` units are done (an absolute count); ``postfix`` shown beside the bar (e.g. loss).

        A stop signal swallowed since the last update is raised here (:mod:`cotsdl.stops`)."""
        stops.checkpoint()
        if not self.enabled:
            return
        step, self.done = done - self.done, done
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(step)
            return
        now = time.monotonic()
        # the end is said only after a line was (work shorter than ``every`` says nothing)
        if now - self._last >= self.every or (done >= self.total and self._said):
            self._last, self._said = now, True
            print(self.line(now), file=self.stream, flush=True)

    def eta(self, now: float | None = None) -> str:
        """``ETA 3m05s`` at the pace since the start (``done in 42s`` at the end), for lines of their own."""
        elapsed = (time.monotonic() if now is None else now) - self.t0
        if self.done >= self.total:
            return f"done in {duration(elapsed)}"
        if self.done <= self.start:
            return "ETA unknown"
        return f"ETA {duration((self.total - self.done) * elapsed / (self.done - self.start))}"

    def line(self, now: float | None = None) -> str:
        """The plain line: done/total, percent, rate, ETA (or the elapsed time at the end)."""
        now = time.monotonic() if now is None else now
        rate = (self.done - self.start) / max(now - self.t0, 1e-9)
        return (f"{self.what}: {self.done}/{self.total} {self.unit} ({100 * self.done / self.total:.0f}%), "
                + (f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}") + f" {self.unit}/s, {self.eta(now)}")

    def write(self, text: str) -> None:
        """Print a line without breaking the bar (it is cleared, the line printed, the bar redrawn)."""
        if self.bar is not None:
            self.bar.clear()
            print(text, file=self.stream, flush=True)
            self.bar.refresh()
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.enabled = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
