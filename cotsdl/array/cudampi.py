"""Is the loaded MPI library CUDA-aware?  Detect, don't assume (DESIGN.md section 4).

``COTSDL_CUDA_AWARE_MPI=0|1`` wins.  Otherwise ``MPIX_Query_cuda_support`` is
queried from the MPI library that mpi4py loaded (MPICH >= 4, MVAPICH2-GDR and
Open MPI export it).  Unknown means no: device buffers are then staged through
page-locked host memory, which is always correct.
"""
from __future__ import annotations

import ctypes
import os
from functools import lru_cache

ENV = "COTSDL_CUDA_AWARE_MPI"


def _loaded_mpi_libraries() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libmpi" in line and "/" in line}
    except OSError:  # not Linux
        return []
    return sorted(paths)


@lru_cache(maxsize=None)
def _query_library() -> bool | None:
    from mpi4py import MPI  # noqa: F401,PLC0415 - make sure the library is loaded

    for path in _loaded_mpi_libraries():
        try:
            fn = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support")
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        return bool(fn())
    return None


def cuda_aware_mpi() -> bool | None:
    """True/False when known (setting or library query), None when unknown."""
    value = os.environ.get(ENV)
    if value is not None and value.strip() != "":
        if value.strip() not in ("0", "1"):
            raise ValueError(f"{ENV} must be 0 or 1, got {value!r}")
        return value.strip() == "1"
    return _query_library()
