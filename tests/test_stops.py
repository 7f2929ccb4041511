"""A stop signal's exception is never lost: swallowed by a callback, it comes back at the next checkpoint."""
import io
import signal
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

from cotsdl import stops
from cotsdl.progress import Progress


class Stop(Exception):
    pass


class Thing:
    pass


def raised_inside_a_weakref_callback(exc):
    """``stops.raise_stop(exc)`` where Python swallows it: in a weakref callback (as a signal
    handler that runs during garbage collection does)."""
    thing = Thing()
    ref = weakref.ref(thing, lambda r: stops.raise_stop(exc))
    del thing  # the callback raises; Python reports it as unraisable and goes on
    return ref


@pytest.fixture(autouse=True)
def nothing_pending():
    stops.clear()
    yield
    stops.clear()


def test_a_swallowed_stop_is_raised_again_at_the_next_progress_update():
    exc = Stop("sigterm")
    raised_inside_a_weakref_callback(exc)
    assert stops.pending() is exc
    p = Progress(10, "x", stream=io.StringIO(), enabled=False)  # every rank checks, speaking or not
    with pytest.raises(Stop) as got:
        p.update(3)
    assert got.value is exc
    stops.clear()
    p.update(4)  # handled: nothing to raise


SCRIPT = """
import sys, weakref
sys.path.insert(0, {root!r})
from cotsdl import stops
from tests.test_stops import Stop, Thing, raised_inside_a_weakref_callback
raised_inside_a_weakref_callback(Stop("sigterm"))
print("went on", flush=True)
thing = Thing()
ref = weakref.ref(thing, lambda r: 1 / 0)
del thing
try:
    stops.checkpoint()
except Stop:
    print("raised again", flush=True)
"""


def test_the_swallowed_stop_is_not_reported_and_other_unraisable_errors_still_are():
    """Outside pytest (whose own hook turns unraisable errors into warnings): the interpreter's report."""
    root = str(Path(__file__).resolve().parents[1])
    run = subprocess.run([sys.executable, "-c", SCRIPT.format(root=root)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["went on", "raised again"]
    assert run.stderr.count("Exception ignored") == 1 and "ZeroDivisionError" in run.stderr
    assert "Stop" not in run.stderr


def test_checkpoint_without_a_stop_does_nothing():
    stops.checkpoint()
    assert stops.pending() is None


def test_prepare_data_stops_even_when_the_signal_lands_in_a_callback(tmp_path, capsys, monkeypatch):
    """SIGTERM delivered while a weakref callback runs (its handler's exception is swallowed there):
    prepare-data still stops at the next batch, exit 143, one message, no file."""
    from cotsdl.io import builders
    from tests.io.test_builders import cli

    made = [0]
    real = builders._synthetic_image

    def image(*args):
        made[0] += 1
        if made[0] == 300:  # in the second batch
            thing = Thing()
            ref = weakref.ref(thing, lambda r: signal.raise_signal(signal.SIGTERM))
            del thing  # the handler runs inside the callback
            assert ref() is None
        return real(*args)

    monkeypatch.setattr(builders, "_synthetic_image", image)
    assert cli("synthetic", tmp_path / "big.h5", "--count", 5000, "--size", 8, 8) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert made[0] <= 2 * builders.BATCH + 1, "did not stop at the next batch"
    assert err.count("cotsdl: stopped by SIGTERM: nothing was written") == 1 and "Exception ignored" not in err
    assert not list(tmp_path.iterdir())
    assert stops.pending() is None


def test_a_stop_swallowed_while_hdf5_closes_the_file_still_keeps_it_unpublished(tmp_path, monkeypatch):
    """The check before the rename comes after HDF5's own work, where callbacks run."""
    from cotsdl.io.dataset import DatasetWriter

    exc = Stop("sigterm")
    w = DatasetWriter(tmp_path / "d.h5", 2, (4, 4), np.float32)
    w.add(np.zeros((2, 4, 4), np.float32))
    real_close = w._file.close

    def close_and_swallow():
        raised_inside_a_weakref_callback(exc)
        real_close()

    monkeypatch.setattr(w._file, "close", close_and_swallow)
    with pytest.raises(Stop):
        with w:
            pass
    assert not list(tmp_path.iterdir())
