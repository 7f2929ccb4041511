"""Run a ``cotsdl`` command line and write this rank's peak resident memory at its exit.

    COTSDL_PEAK_RSS_DIR=DIR mpiexec -n P python -m mpi4py jobs/lib/peak_rss.py train CONFIG ...

Each rank writes DIR/peak-rss.RANK: the bytes of its VmHWM (Linux /proc/self/status), the
number ``cotsdl plan``'s memory per rank predicts (jobs/paper-185m-cpu.sh compares them).
"""
import os
import sys

from cotsdl.cli import main, stop_on_signals


def peak_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


if __name__ == "__main__":
    stop_on_signals()
    status = main(sys.argv[1:])
    where = os.environ.get("COTSDL_PEAK_RSS_DIR")
    if where:
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank() if MPI.Is_initialized() and not MPI.Is_finalized() else int(
            os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
        with open(os.path.join(where, f"peak-rss.{rank}"), "w") as f:
            f.write(f"{peak_bytes()}\n")
    raise SystemExit(status)
