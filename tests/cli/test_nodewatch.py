"""The node watch (cotsdl/cli/nodewatch.py) on loopback: who connected, who said goodbye, who was
lost first, and the lines a job's output gets.  Its use across simulated nodes is in tests/nodes."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cotsdl.array.grid import describe_nodes
from cotsdl.cli.nodewatch import Announcer, Watch, announce


def pump(watch, until, timeout=5.0):
    end = time.monotonic() + timeout
    while not until() and time.monotonic() < end:
        watch.poll(0.05)
    assert until(), "the watch never saw it"


def child(port, rank, then):
    """A rank in its own process: announce, then ``bye`` (a goodbye), or ``die`` (SIGKILL itself)."""
    code = ("import os, signal, time\n"
            "from cotsdl.cli.nodewatch import Announcer\n"
            f"a = Announcer('127.0.0.1:{port}', {rank}, 3, '/run')\n"
            f"if {then!r} == 'bye': a.bye(0)\n"
            f"if {then!r} == 'fail': a.bye(1)\n"
            f"if {then!r} == 'die': os.kill(os.getpid(), signal.SIGKILL)\n")
    return subprocess.Popen([sys.executable, "-c", code])


def test_the_first_rank_lost_without_a_goodbye_is_named_once():
    said = []
    watch = Watch(say=said.append)
    done = child(watch.port, 0, "bye")
    pump(watch, lambda: len(watch.events) == 1)
    assert done.wait(5) == 0 and said == [] and watch.events[0]["bye"] == 0
    killed = child(watch.port, 2, "die")
    pump(watch, lambda: len(watch.events) == 2)
    killed.wait(5)
    assert len(said) == 1 and said[0].startswith("cotsdl: node watch: lost rank 2 on node ")
    assert "its process ended without finishing" in said[0] and f"pid {killed.pid}" in said[0]
    again = child(watch.port, 1, "die")  # the launcher ending the rest: not a second "first"
    pump(watch, lambda: len(watch.events) == 3)
    again.wait(5)
    assert len(said) == 1
    lines = watch.summary()
    assert lines[0].startswith("cotsdl: node watch: the first rank lost: lost rank 2 ")
    assert "then 1 other rank(s) ended" in lines[1] and "1 (" in lines[1]


def test_a_rank_that_fails_and_says_so_is_not_a_lost_node():
    said = []
    watch = Watch(say=said.append)
    failed = child(watch.port, 1, "fail")
    pump(watch, lambda: len(watch.events) == 1)
    killed = child(watch.port, 0, "die")  # then the launcher ends the others
    pump(watch, lambda: len(watch.events) == 2)
    failed.wait(5), killed.wait(5)
    assert said == [] and watch.summary() == [] and watch.failed["rank"] == 1


def test_announce_only_where_the_job_runs_a_watch_and_never_fails_the_run(capsys):
    assert announce(0, 1, environ={}) is None
    assert announce(3, 4, environ={"COTSDL_NODEWATCH": "127.0.0.1:1"}) is None  # nothing listens on port 1
    err = capsys.readouterr().err
    assert "warning: rank 3: cannot reach the node watch at COTSDL_NODEWATCH=127.0.0.1:1" in err
    watch = Watch()
    a = announce(0, 1, environ={"COTSDL_NODEWATCH": f"127.0.0.1:{watch.port}"})
    assert isinstance(a, Announcer)
    a.bye(0)
    a.bye(0)  # twice: harmless


def test_the_command_writes_its_address_then_a_summary_and_the_events(tmp_path):
    ready, events = tmp_path / "ready", tmp_path / "events.json"
    p = subprocess.Popen([sys.executable, "-m", "cotsdl.cli.nodewatch", "--ready", str(ready), "--host", "127.0.0.1",
                          "--events", str(events)], stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < end:
            time.sleep(0.05)
        host, port = ready.read_text().strip().split(":")
        assert host == "127.0.0.1"
        child(int(port), 5, "die").wait(5)
        time.sleep(0.5)
        os.kill(p.pid, signal.SIGUSR1)  # a checkpoint request meant for the ranks: ignored
        time.sleep(0.2)
        assert p.poll() is None
        p.send_signal(signal.SIGTERM)
        err = p.communicate(timeout=10)[1]
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0
    assert err.count("lost rank 5 on node ") == 2, err  # as it happened, and in the summary
    assert "the first rank lost: lost rank 5" in err
    assert json.loads(events.read_text())["first_lost"]["rank"] == 5


@pytest.mark.parametrize("layout, want", [
    ([("a", [0, 1]), ("b", [2, 3])], "2 node(s), 2 rank(s) per node: a (ranks 0-1), b (ranks 2-3)"),
    ([("a", [0])], "1 node(s), 1 rank(s) per node: a (rank 0)"),
    ([("a", [0, 2]), ("b", [1])], "2 node(s), 1-2 ranks per node: a (ranks 0,2), b (rank 1)"),
])
def test_describe_nodes(layout, want):
    assert describe_nodes(layout) == want


def test_describe_nodes_names_at_most_a_few():
    text = describe_nodes([(f"n{i}", [i]) for i in range(20)], most=3)
    assert text.endswith("n0 (rank 0), n1 (rank 1), n2 (rank 2), and 17 more") and text.startswith("20 node(s)")


NODES_UP = os.path.join(os.path.dirname(__file__), "..", "cluster", "nodes-up.sh")


@pytest.mark.parametrize("args", [[], ["0"], ["x"], ["300"]])
def test_nodes_up_refuses_a_bad_count_with_2(args):
    res = subprocess.run(["bash", NODES_UP, *args], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and ("usage:" in res.stderr or "N must be 1..250" in res.stderr), res.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the script as another user")
def test_nodes_up_skips_with_77_and_one_line_without_root():
    res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", NODES_UP, "2"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 77 and res.stdout.strip() == "[nodes] skipped: needs root (network namespaces and a bridge)"
