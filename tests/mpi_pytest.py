"""Run pytest on every rank of COMM_WORLD:  mpiexec -n P python -m mpi4py tests/mpi_pytest.py ARGS.

Rank 0 reports to the terminal; the other ranks write to per-rank logs, which
are printed when that rank fails, so P copies of the same report do not
interleave.  The exit status is the worst of all ranks.
"""
import os
import sys
import tempfile

import pytest
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
logdir = comm.bcast(tempfile.mkdtemp(prefix="cotsdl-mpi-") if rank == 0 else None)
log = os.path.join(logdir, f"rank{rank}.log")
if rank != 0:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    args = ["-q", "--no-header"] + sys.argv[1:]
else:
    args = sys.argv[1:]
# A rank blocked inside an MPI call never runs a Python signal handler, so the signal
# method (the serial suite's) could not end a deadlock: the thread method ends the
# rank, MPIEXEC_TIMEOUT the rest, and tests/run.sh goes on with the next rank count.
rc = int(pytest.main(["-o", "timeout_method=thread"] + args))
codes = comm.gather(rc, root=0)
if rank == 0:
    for r, c in enumerate(codes):
        if r and c:
            print(f"\n===== rank {r} of {size} exited {c}; its log:", flush=True)
            with open(os.path.join(logdir, f"rank{r}.log")) as f:
                print(f.read(), flush=True)
    print(f"mpi: {size} rank(s), exit codes {codes}", flush=True)
worst = comm.bcast(max(codes) if rank == 0 else None)
sys.exit(worst)
