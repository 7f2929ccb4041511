"""One training per run folder: an advisory lock on ``RUN/.lock``, held by rank 0 for the run's life.

The lock is ``flock`` on the open file: the kernel drops it when the process ends in
any way (exit, crash, ``kill -9``), so a dead run never blocks the next one.  The
file records the holder (host, pid, start time) for the message a second run gets.

Shared filesystems: on NFS (v4, or v3 with NLM) Linux maps ``flock`` onto byte-range
locks that every client sees; a client that dies holding one loses it when its lease
expires (NFSv4: about 90 s).  Lustre honours ``flock`` only when mounted with
``-o flock``; without it (and on any filesystem without locks) locking fails with
ENOLCK/ENOSYS/EINVAL, and the holder file is used instead: a live holder on this
host, or any holder on another host, is refused with its details (a holder whose
process is gone on this host is stale and taken over).
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

NAME = ".lock"
_NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP)


def _holder(path: Path) -> dict:
    try:
        data = json.loads(path.read_text() or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _describe(h: dict) -> str:
    if not h:
        return "another process (it did not record itself)"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h["started"])) if "started" in h else "?"
    return f"host {h.get('host', '?')}, pid {h.get('pid', '?')}, started {started}"


def _alive_here(h: dict) -> bool:
    if h.get("host") != socket.gethostname() or not isinstance(h.get("pid"), int):
        return h != {}  # another host: it cannot be checked from here, so it counts as alive
    try:
        os.kill(h["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """``acquire()`` returns None (held until :meth:`release` or the process ends) or the refusal."""

    def __init__(self, folder: str | os.PathLike):
        self.path = Path(folder) / NAME
        self._fd: int | None = None

    def acquire(self) -> str | None:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                return self._refusal(_holder(self.path))
            if e.errno not in _NO_LOCKS:
                os.close(fd)
                raise
            h = _holder(self.path)  # no locks on this filesystem: trust a live holder's record
            if h and h.get("pid") != os.getpid() and _alive_here(h):
                os.close(fd)
                return self._refusal(h, locks=False)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        self._fd = fd
        return None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _refusal(self, h: dict, locks: bool = True) -> str:
        how = "" if locks else (" (this filesystem has no file locks, so its record was trusted: if that run "
                                f"is over, remove {self.path})")
        return (f"run.folder {self.path.parent} is in use by another cotsdl train: {_describe(h)}{how}. Wait for it "
                "to finish or stop it (it checkpoints on SIGTERM), or choose another run.folder")

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:
                pass
            os.close(self._fd)  # closing drops the flock
            self._fd = None
