"""A stop signal's exception that is never lost.

A signal handler that raises runs wherever the main thread happens to be.  Inside a weakref
callback, a ``__del__`` or a finalizer, Python prints "Exception ignored" and carries on, so the
stop is dropped and the command runs to its end (seen: ``prepare-data`` wrote for 45 s after a
SIGTERM).  :func:`raise_stop` remembers the exception before raising it; :func:`checkpoint`, called
at every progress update and before a file is committed, raises it again if it was swallowed; and
the swallowed one is kept off stderr (it is not lost, only late).
"""
from __future__ import annotations

import sys
from typing import NoReturn

_pending: BaseException | None = None
_next_hook = None


def _quiet_if_pending(unraisable) -> None:
    """sys.unraisablehook: a pending stop swallowed by a callback is re-raised at the next
    checkpoint, so it is not reported; anything else goes to the hook that was there."""
    if _pending is not None and unraisable.exc_value is _pending:
        return
    (_next_hook or sys.__unraisablehook__)(unraisable)


def raise_stop(exc: BaseException) -> NoReturn:
    """Raise ``exc`` from a signal handler, remembered until :func:`clear`."""
    global _pending, _next_hook
    _pending = exc
    if sys.unraisablehook is not _quiet_if_pending:
        _next_hook, sys.unraisablehook = sys.unraisablehook, _quiet_if_pending
    raise exc


def checkpoint() -> None:
    """Raise the pending stop again (a no-op when there is none): a place where stopping is safe."""
    if _pending is not None:
        raise _pending


def pending() -> BaseException | None:
    """The stop raised and not yet cleared, or None."""
    return _pending


def clear() -> None:
    """The stop was handled (or a new command starts): nothing is pending."""
    global _pending
    _pending = None
