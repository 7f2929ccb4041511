"""Array backends: which library an array lives in, host/device staging, kernel files.

The only module that touches CuPy, and only lazily, so the package imports on a
machine without it.  The kernel launch interface and backend selection
(``COTSDL_BACKEND``) build on this in the CUDA toolchain.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np


def is_device_array(arr: Any) -> bool:
    """True for arrays in GPU memory (anything exposing ``__cuda_array_interface__``)."""
    return hasattr(arr, "__cuda_array_interface__")


def array_module(arr: Any):
    """``numpy`` or ``cupy``, whichever ``arr`` belongs to."""
    if is_device_array(arr):
        import cupy  # noqa: PLC0415 - only when a device array exists

        return cupy
    return np


def synchronize(arr: Any) -> None:
    """Wait for pending device work on the current stream (no-op for host arrays).

    Must precede handing a device buffer to MPI: MPI does not see CUDA streams.
    """
    if is_device_array(arr):
        import cupy  # noqa: PLC0415

        cupy.cuda.get_current_stream().synchronize()


def empty_host_like(arr: Any) -> np.ndarray:
    """A host buffer for staging ``arr``: page-locked when ``arr`` is on a device."""
    if is_device_array(arr):
        import cupyx  # noqa: PLC0415

        return cupyx.empty_pinned(arr.shape, arr.dtype)
    return np.empty(arr.shape, arr.dtype)


def copy_to_host(src: Any, dst: np.ndarray) -> None:
    """Copy a (device or host) array into host array ``dst`` and wait for it."""
    if is_device_array(src):
        src.get(out=dst)
        synchronize(src)
    else:
        np.copyto(dst, src)


def copy_from_host(src: np.ndarray, dst: Any) -> None:
    """Copy host array ``src`` into (device or host) array ``dst``."""
    if is_device_array(dst):
        dst.set(src)
    else:
        np.copyto(dst, src)


def cuda_dir() -> Path:
    """The folder of the ``.cu``/``.cuh`` kernel sources.

    In an installed wheel it is the package data ``cotsdl/cuda``; in a source
    checkout (or editable install) it is the top-level ``cuda/`` folder.
    """
    try:
        installed = Path(str(resources.files("cotsdl") / "cuda"))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - odd loaders
        installed = Path(__file__).parent / "cuda"
    for candidate in (installed, Path(__file__).resolve().parent.parent / "cuda"):
        if candidate.is_dir() and any(candidate.glob("*.cu")):
            return candidate
    raise FileNotFoundError(
        f"cotsdl kernel sources not found: looked in {installed} and "
        f"{Path(__file__).resolve().parent.parent / 'cuda'}; reinstall the package")
