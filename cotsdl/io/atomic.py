"""Write a file so that a reader never sees half of it: a temporary file beside it, then a rename."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Callable


class DiskError(OSError):
    """A write that failed for the machine's reasons (a full disk, a quota, a file-size limit, an I/O
    error): commands exit 1 with its message, where bad input exits 2.  Nothing was left half-written."""


def write_atomic(path: str | os.PathLike, content: str | bytes | Callable[[IO[bytes]], None]) -> Path:
    """Write ``content`` (text, bytes, or a function writing to a binary file) to ``path``.

    The file appears complete or not at all; on any failure the temporary file is removed.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())  # the rename must not publish a file whose data is still in flight
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; results are for everyone
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
