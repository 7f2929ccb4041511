"""Argument checks shared by the operations (clear errors naming the parameter and value)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _integral(v: Any) -> bool:
    """An integer, not a bool, a string or a float with a fraction (5.7 must not become 5)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def pair(name: str, value: Any, minimum: int = 1) -> tuple[int, int]:
    """A pair of ints >= ``minimum`` (an int means the same value twice)."""
    items = [value, value] if np.isscalar(value) else (list(value) if isinstance(value, (list, tuple, np.ndarray))
                                                       else [])
    if len(items) != 2 or not all(_integral(v) for v in items) or min(items) < minimum:
        raise ValueError(f"{name} must be a pair of integers >= {minimum}, got {value!r}")
    return int(items[0]), int(items[1])


def real(name: str, value: Any) -> float:
    """A real number (not a string: "0.01" in a description is a mistake to report, not to coerce)."""
    if isinstance(value, (bool, np.bool_, str, bytes)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


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
    v = real(name, value)
    if not v >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return v


def fits(name: str, extent: Sequence[int], window: Sequence[int]) -> None:
    if any(e < w for e, w in zip(extent, window)):
        raise ValueError(f"{name} {tuple(window)} is larger than the input's spatial extent {tuple(extent)}")
