"""The node watch: which rank, on which node, a job lost first, in cotsdl's own words.

When a node dies (its processes killed, its link down), the launcher ends the whole job
at once: Hydra's ``mpiexec`` with status 255 and lines of assertion noise, ``srun`` with
its own.  No rank is left to say what happened, and the ranks' heartbeat files
(``--watchdog``) stop at nearly the same moment.  So the job script runs this small
process beside the launcher, outside it (``jobs/lib/batch.sh``)::

    python -m cotsdl.cli.nodewatch --ready FILE [--host ADDRESS] [--events FILE]

It listens on a TCP port and writes ``ADDRESS:PORT`` to FILE; the job script exports it as
``COTSDL_NODEWATCH``, and every rank of ``cotsdl train`` connects once and says who it is
(:class:`Announcer`).  The kernel then does the watching, with no thread in the rank:
a rank whose process ends closes its connection (seen here at once), and a node that stops
answering fails TCP keepalive (seen within :data:`KEEPALIVE` seconds).  A rank that
finishes says goodbye first.  The first rank lost without a goodbye is printed as it
happens; on SIGTERM (the job script, once the launcher has exited) the watch prints a
summary and writes the events as JSON.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import selectors
import signal
import socket
import sys
import time
from typing import Any

#: (idle, interval, count) of TCP keepalive on the watch's side: a node whose link is down is
#: seen after about idle + interval * count seconds (with TCP_USER_TIMEOUT the same bound).
KEEPALIVE = (2, 1, 3)


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = KEEPALIVE
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count),
                        ("TCP_USER_TIMEOUT", 1000 * (idle + interval * count))):
        if hasattr(socket, name):  # Linux; elsewhere the system's (much longer) defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


class Watch:
    """The listening side: accepts ranks, records how each connection ends."""

    def __init__(self, say=None):
        self.say = say or (lambda m: print(m, file=sys.stderr, flush=True))
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("0.0.0.0", 0))
        self.server.listen(256)
        self.port = self.server.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.server, selectors.EVENT_READ)
        self.ranks: dict[socket.socket, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.first_lost: dict[str, Any] | None = None
        self.failed: dict[str, Any] | None = None  # the first rank that said goodbye with a failure

    def poll(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            if key.fileobj is self.server:
                try:
                    conn, addr = self.server.accept()
                except OSError as e:  # out of descriptors, say: that rank goes unwatched, the rest stay
                    self.say(f"cotsdl: node watch: cannot accept a rank's connection ({e})")
                    continue
                _keepalive(conn)
                self.ranks[conn] = {"address": addr[0], "buffer": b"", "hello": None, "bye": None}
                self.sel.register(conn, selectors.EVENT_READ)
            else:
                self._read(key.fileobj)

    def _read(self, conn: socket.socket) -> None:
        info = self.ranks[conn]
        try:
            data = conn.recv(4096)
            why = None if data else "closed"
        except OSError as e:
            data, why = b"", errno.errorcode.get(e.errno, str(e))
        info["buffer"] += data
        while b"\n" in info["buffer"]:
            line, info["buffer"] = info["buffer"].split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "bye" in msg:
                info["bye"] = msg["bye"]
            else:
                info["hello"] = msg
        if why is not None:
            self._ended(conn, why)

    def _ended(self, conn: socket.socket, why: str) -> None:
        info = self.ranks.pop(conn)
        self.sel.unregister(conn)
        conn.close()
        hello = info["hello"] or {"rank": "?", "host": info["address"], "pid": "?"}
        now = time.time()
        event = {"time": now, "rank": hello.get("rank"), "host": hello.get("host"), "pid": hello.get("pid"),
                 "address": info["address"], "bye": info["bye"], "how": why}
        self.events.append(event)
        if info["bye"]:  # a rank that failed and said so (its own error is in the output): what follows is
            self.failed = self.failed or event  # the launcher ending the job, not a lost node
        if info["bye"] is not None or self.first_lost is not None or self.failed is not None:
            return
        self.first_lost = event
        self.say(f"cotsdl: node watch: {self.describe(event)}")

    @staticmethod
    def describe(event: dict[str, Any]) -> str:
        who = f"rank {event['rank']} on node {event['host']} (pid {event['pid']}, {event['address']})"
        if event["how"] == "closed":
            what = "its process ended without finishing (killed, crashed, or its node went down)"
        else:
            what = f"its node stopped answering over the network ({event['how']}: the node or its link is down)"
        return f"lost {who} at {_clock(event['time'])}: {what}"

    def summary(self) -> list[str]:
        """Lines for the end of the job: the first rank lost, and what followed."""
        if self.first_lost is None:
            return []
        t0 = self.first_lost["time"]
        after = [e for e in self.events if e is not self.first_lost and e["bye"] is None]
        lines = [f"cotsdl: node watch: the first rank lost: {self.describe(self.first_lost)}"]
        if after:
            ranks = ", ".join(f"{e['rank']} ({e['host']})" for e in after[:16]) + (" ..." if len(after) > 16 else "")
            lines.append(f"cotsdl: node watch: then {len(after)} other rank(s) ended within "
                         f"{max(e['time'] - t0 for e in after):.2f} s, as the launcher ends a job that lost a rank: "
                         f"{ranks}")
        open_ = [i["hello"] for i in self.ranks.values() if i["hello"]]
        if open_:
            lines.append("cotsdl: node watch: still connected when the job ended: "
                         + ", ".join(f"rank {h['rank']} ({h['host']})" for h in open_[:16]))
        return lines


class Announcer:
    """The rank's side: connect to ``COTSDL_NODEWATCH`` (``HOST:PORT``) and say who this rank is.

    Nothing runs in the rank afterwards: the open connection is the signal.  :meth:`bye` on a
    normal end (any exit status the program chose), so that the watch does not count it lost."""

    def __init__(self, where: str, rank: int, size: int, run: str = "", timeout: float = 5.0):
        host, _, port = where.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.settimeout(timeout)
        self.sock.sendall((json.dumps({"rank": rank, "size": size, "host": os.uname().nodename,
                                       "pid": os.getpid(), "run": run}) + "\n").encode())

    def bye(self, status: int = 0) -> None:
        try:
            self.sock.sendall((json.dumps({"bye": int(status)}) + "\n").encode())
            self.sock.close()
        except OSError:
            pass  # the watch is gone (the job is ending): nothing to tell


def announce(rank: int, size: int, run: str = "", environ=os.environ) -> Announcer | None:
    """An :class:`Announcer` where the job script runs a node watch (``COTSDL_NODEWATCH``), else None.
    A watch that cannot be reached is a warning, never a failure of the run."""
    where = environ.get("COTSDL_NODEWATCH", "")
    if not where:
        return None
    try:
        return Announcer(where, rank, size, run)
    except (OSError, ValueError) as e:
        print(f"cotsdl: warning: rank {rank}: cannot reach the node watch at COTSDL_NODEWATCH={where} ({e}); "
              "a lost node will not be named", file=sys.stderr, flush=True)
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cotsdl.cli.nodewatch", description=__doc__.split("\n\n")[0])
    p.add_argument("--ready", required=True, help="write HOST:PORT here once listening")
    p.add_argument("--host", default=os.environ.get("COTSDL_NODEWATCH_HOST") or socket.gethostname(),
                   help="the address ranks reach this machine at (default: COTSDL_NODEWATCH_HOST, or the host name)")
    p.add_argument("--events", help="write every connection's end here (JSON) on exit")
    args = p.parse_args(argv)
    try:  # one descriptor per rank: a job of thousands of ranks needs more than the usual soft limit
        import resource  # noqa: PLC0415 - POSIX only

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass
    watch = Watch()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a checkpoint request for the ranks, not for the watch
    tmp = f"{args.ready}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{args.host}:{watch.port}\n")
    os.replace(tmp, args.ready)
    while not stop:
        try:
            watch.poll(0.5)
        except InterruptedError:
            pass
    for line in watch.summary():
        print(line, file=sys.stderr, flush=True)
    if args.events:
        with open(args.events, "w") as f:
            json.dump({"events": watch.events, "first_lost": watch.first_lost}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
