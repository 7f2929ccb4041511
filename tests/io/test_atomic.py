"""Writers of a user's file on a full disk: the earlier file is left as it was, one DiskError names it."""
import errno
import subprocess
import sys
import textwrap
from collections import namedtuple

import pytest

from cotsdl.io import atomic
from cotsdl.io.atomic import Appender, DiskError, append_text, write_atomic

Usage = namedtuple("Usage", "total used free")


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_write_atomic_checks_free_space_first(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    target.write_text("earlier\n")
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda p: Usage(1 << 30, 1 << 30, 1000))
    with pytest.raises(DiskError, match=r"report\.json: No space left on device .* nothing was written"):
        write_atomic(target, "x" * 5000)
    assert target.read_text() == "earlier\n" and not leftovers(tmp_path)


def test_write_atomic_failing_mid_write_keeps_the_earlier_file(tmp_path):
    target = tmp_path / "figure.png"
    target.write_bytes(b"earlier")

    def full(f):
        f.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskError, match=r"figure\.png: cannot write \(No space left on device .*\); "
                                        "the earlier file is unchanged"):
        write_atomic(target, full)
    assert target.read_bytes() == b"earlier" and not leftovers(tmp_path)


def test_appender_appends_whole_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append_text(path, "a\n")
    a = Appender(path)
    a.append("b\n")
    a.append("c\n")
    a.close()
    assert path.read_text() == "a\nb\nc\n"


def test_appender_past_a_file_size_limit_leaves_the_file_as_it_was(tmp_path):
    """RLIMIT_FSIZE makes the append partly succeed (a short write) and then fail with EFBIG: the
    partial line must not stay in the file."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("x" * 99 + "\n")
    script = textwrap.dedent(f"""
        import resource, signal
        from cotsdl.io.atomic import Appender, DiskError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (150, 150))
        a = Appender({str(path)!r})
        a.append("y" * 20 + "\\n")
        try:
            a.append("z" * 99 + "\\n")
        except DiskError as e:
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "metrics.jsonl: cannot append (File too large" in out.stdout and "as it was before" in out.stdout
    assert path.read_text() == "x" * 99 + "\n" + "y" * 20 + "\n"
