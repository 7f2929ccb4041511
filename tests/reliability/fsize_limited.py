"""cotsdl under a file-size limit, a full disk as a process sees it:
mpiexec -n P python -m mpi4py fsize_limited.py LIMIT_BYTES cotsdl-args...

The limit is set after MPI_Init (importing mpi4py.MPI initializes MPI): set before, it
makes UCX fail to start.  Python ignores SIGXFSZ, so writes past the limit fail with EFBIG.
"""
import resource
import runpy
import signal
import sys

from mpi4py import MPI  # noqa: F401  (MPI_Init happens here)

limit = int(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.argv = ["cotsdl", *sys.argv[2:]]
runpy.run_module("cotsdl", run_name="__main__", alter_sys=True)
