"""Write a file so that a reader never sees half of it: a temporary file beside it, then a rename;
append to a log so that a failed append leaves it as it was; check free space before writing."""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Callable

from .. import stops

#: Room kept free beyond what a write needs (metadata, the file system's own blocks).
MARGIN = 64 << 10

#: The errors that are the machine's, not the input's: full disk, quota, file-size limit, I/O.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


class DiskError(OSError):
    """A write that failed for the machine's reasons (a full disk, a quota, a file-size limit, an I/O
    error): commands exit 1 with its message, where bad input exits 2.  Nothing was left half-written."""


def is_machine_error(e: BaseException) -> bool:
    """Whether ``e`` is the machine's failure (a full disk, a quota, a file-size limit, an I/O error:
    exit 1) rather than the input's (a path that is a folder, no permission: exit 2)."""
    return isinstance(e, DiskError) or (isinstance(e, OSError) and e.errno in DISK_ERRNOS)


def as_error(e: OSError, message: str) -> str | DiskError:
    """What a failed ``e`` becomes where errors are agreed on: a DiskError for the machine's failure
    (exit 1), else the message (bad input, exit 2)."""
    return DiskError(message) if is_machine_error(e) else message


def _failed(e: OSError, message: str) -> OSError:
    """``message`` as a DiskError for the machine's failures, else as a plain OSError."""
    return (DiskError if is_machine_error(e) else OSError)(message)


def _why(e: OSError) -> str:
    if e.errno in DISK_ERRNOS:
        return f"{os.strerror(e.errno)} (the disk is full, a quota or a file-size limit was reached)" \
            if e.errno != errno.EIO else os.strerror(e.errno)
    return e.strerror or str(e)


def ensure_free(path: str | os.PathLike, need: int, what: str, after: str = "nothing was written") -> None:
    """Raise DiskError unless the file system of ``path`` (a folder, or a file's folder) has ``need``
    bytes free beyond a margin; ``what`` names the file about to be written, ``after`` what is left."""
    folder = Path(path)
    if not folder.is_dir():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if free < need + MARGIN:
        raise DiskError(f"{what}: {os.strerror(errno.ENOSPC)} ({free / 2**20:.2f} MiB free in {folder}, "
                        f"{(need + MARGIN) / 2**20:.2f} MiB needed); {after}")


def write_atomic(path: str | os.PathLike, content: str | bytes | Callable[[IO[bytes]], None]) -> Path:
    """Write ``content`` (text, bytes, or a function writing to a binary file) to ``path``.

    The file appears complete or not at all; on any failure the temporary file is removed and
    an earlier file of that name is left as it was.  Free space is checked first where the size
    is known; a failed write is an OSError naming ``path`` (a DiskError for a full disk).
    """
    path = Path(path)
    if not callable(content):
        content = content.encode() if isinstance(content, str) else content
        ensure_free(path.parent, len(content), str(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _failed(e, f"{path}: cannot write ({_why(e)}); nothing was written") from None
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content)
            f.flush()
            os.fsync(f.fileno())  # the rename must not publish a file whose data is still in flight
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; results are for everyone
        stops.checkpoint()  # a stop signal that a callback swallowed still keeps the file from being published
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and not isinstance(e, DiskError):
            raise _failed(e, f"{path}: cannot write ({_why(e)}); "
                             f"{'the earlier file is unchanged' if path.exists() else 'nothing was written'}") from None
        raise
    return path


class Appender:
    """An append-only text file (a log, ``metrics.jsonl``) whose every append is whole or undone.

    A failed append (a full disk) truncates the file back to its last complete line and raises
    DiskError (OSError for other causes); the file then holds exactly what it held before.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self.file = open(self.path, "ab", buffering=0)  # unbuffered: each append is one write call
        except OSError as e:
            raise _failed(e, f"{self.path}: cannot open for appending ({_why(e)})") from None
        self.size = self.file.seek(0, os.SEEK_END)

    def append(self, text: str) -> None:
        data = text.encode()
        try:
            view = memoryview(data)
            while view:  # a short write (a file-size limit) is retried and then fails with its errno
                view = view[self.file.write(view):]
        except OSError as e:
            try:
                os.truncate(self.path, self.size)
            except OSError:
                pass
            raise _failed(e, f"{self.path}: cannot append ({_why(e)}); the file is as it was before") from None
        self.size += len(data)

    def close(self) -> None:
        self.file.close()


def append_text(path: str | os.PathLike, text: str) -> None:
    """Append ``text`` to ``path`` whole or not at all (see Appender)."""
    a = Appender(path)
    try:
        a.append(text)
    finally:
        a.close()
