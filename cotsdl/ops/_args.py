"""Argument checks shared by the operations (clear errors naming the parameter and value)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def pair(name: str, value: Any, minimum: int = 1) -> tuple[int, int]:
    """A pair of ints >= ``minimum`` (an int means the same value twice)."""
    try:
        t = (int(value), int(value)) if np.isscalar(value) else tuple(int(v) for v in value)
    except (TypeError, ValueError):
        t = ()
    if len(t) != 2 or min(t) < minimum:
        raise ValueError(f"{name} must be a pair of integers >= {minimum}, got {value!r}")
    return t  # type: ignore[return-value]


def activations(name: str, x: Any, ndim: int = 4) -> None:
    """``x`` is a float32/float64 array of rank ``ndim`` ((H, W, C, N) by default)."""
    if getattr(x, "ndim", None) != ndim:
        raise ValueError(f"{name} must be a {ndim}-D array, got shape {getattr(x, 'shape', None)}")
    if np.dtype(x.dtype) not in FLOATS:
        raise ValueError(f"{name} must be float32 or float64, got {x.dtype}")


def same_dtype(**arrays: Any) -> np.dtype:
    """All arrays share one float dtype (no silent float32 -> float64 promotion)."""
    dtypes = {name: np.dtype(a.dtype) for name, a in arrays.items()}
    if len(set(dtypes.values())) != 1:
        raise ValueError("dtypes differ: " + ", ".join(f"{k}={v}" for k, v in dtypes.items()))
    return next(iter(dtypes.values()))


def nonneg(name: str, value: Any) -> float:
    v = float(value)
    if not v >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return v


def fits(name: str, extent: Sequence[int], window: Sequence[int]) -> None:
    if any(e < w for e, w in zip(extent, window)):
        raise ValueError(f"{name} {tuple(window)} is larger than the input's spatial extent {tuple(extent)}")
