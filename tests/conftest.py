import os

import pytest


def pytest_report_header(config):
    try:
        from mpi4py import MPI
    except ImportError:  # pragma: no cover
        return "mpi: mpi4py not importable"
    comm = MPI.COMM_WORLD
    lib = MPI.Get_library_version().splitlines()[0].strip()
    return (f"mpi: rank {comm.Get_rank()} of {comm.Get_size()} ({lib}); "
            f"COTSDL_BACKEND={os.environ.get('COTSDL_BACKEND', 'auto')}")


@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD
