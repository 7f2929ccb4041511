"""Deliberately deadlocks (run only by tests/test_harness.py, never collected by itself)."""
from mpi4py import MPI


def test_waits_forever():
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 0:
        comm.recv(source=MPI.ANY_SOURCE, tag=99)  # nobody sends
    comm.Barrier()
