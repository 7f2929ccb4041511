"""The one place that chooses which backend runs an operation.

Device (CuPy) arrays run on :mod:`cotsdl.ops.cuda`; host (NumPy) arrays on
:mod:`cotsdl.ops.cpu`, except under the ``cuda-emu`` backend, where they run through
the same CUDA wrappers and ``.cu`` kernels on the CPU emulator.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

from .. import backend
from . import cpu, cuda


def implementation(*arrays: Any) -> ModuleType:
    """:mod:`cotsdl.ops.cuda` or :mod:`cotsdl.ops.cpu`, for arguments ``arrays`` (all host or all device)."""
    dev = [backend.is_device_array(a) for a in arrays]
    if any(dev) and not all(dev):
        raise ValueError("arrays must all be host (NumPy) or all device (CuPy) arrays")
    return cuda if backend.uses_kernels(arrays[0]) else cpu
