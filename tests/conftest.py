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


@pytest.fixture(autouse=True)
def _backend_restored():
    """A test that chooses a backend (the CLI's --backend, backend.use) leaves the next test's choice alone."""
    from cotsdl import backend

    with backend.using(None):
        yield


@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD
