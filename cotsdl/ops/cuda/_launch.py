"""What every CUDA wrapper shares: the dtype suffix of kernel names, contiguity, grid-stride grids."""
from __future__ import annotations

from typing import Any

import numpy as np

from ... import backend

_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
THREADS = 256  # elementwise kernels: a multiple of the warp size that fills an SM with a few blocks
MAX_BLOCKS = 4096  # grid-stride kernels: enough blocks to fill a GPU


def suffix(a: Any) -> str:
    """``f32`` or ``f64``: the kernels are instantiated once per float type."""
    return _SUFFIX[np.dtype(a.dtype)]


def contig(a: Any) -> Any:
    """``a`` in C order (the kernels index flat memory)."""
    return backend.array_module(a).ascontiguousarray(a)


#: Elementwise kernels decode a linear index with 32-bit divisions (their ``_i32`` instances) while the
#: index and one grid-stride step past it stay below 2**31; beyond, with 64-bit ones.
MAX_I32_ELEMENTS = 2**31 - 1 - MAX_BLOCKS * THREADS


def indexed(fn: str, total: int) -> str:
    """Kernel name ``fn`` for a grid-stride loop over ``total`` elements: its 32-bit-index instance
    (``fn_i32``; cuda/pool.cu says why) where it fits, else the 64-bit one."""
    return f"{fn}_i32" if total <= MAX_I32_ELEMENTS else fn


def grid_for(total: int) -> tuple[int]:
    """Blocks for a grid-stride loop over ``total`` elements."""
    return (max(1, min(MAX_BLOCKS, -(-total // THREADS))),)


def kernel(file: str, fn: str, like: Any, defines: dict | None = None) -> Any:
    """Kernel ``fn`` of ``cuda/<file>`` for arrays like ``like`` (on a GPU, or emulated)."""
    return backend.kernel(file, f"{fn}_{suffix(like)}", defines, device_array=backend.is_device_array(like))
