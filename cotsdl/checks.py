"""Checks of scalar arguments, shared by every floor (clear errors naming the parameter and value).

The bottom floor beside ``backend``: it imports nothing of the package.  No
coercion: 5.7 does not become 5 and "0.01" does not become 0.01 — a wrong type in
a description or config is a mistake to report.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def integral(v: Any) -> bool:
    """An integer, not a bool, a string or a float with a fraction."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def pair(name: str, value: Any, minimum: int = 1) -> tuple[int, int]:
    """A pair of ints >= ``minimum`` (an int means the same value twice)."""
    items = [value, value] if np.isscalar(value) else (list(value) if isinstance(value, (list, tuple, np.ndarray))
                                                       else [])
    if len(items) != 2 or not all(integral(v) for v in items) or min(items) < minimum:
        raise ValueError(f"{name} must be a pair of integers >= {minimum}, got {value!r}")
    return int(items[0]), int(items[1])


def real(name: str, value: Any) -> float:
    """A real number (not a bool or a string)."""
    if isinstance(value, (bool, np.bool_, str, bytes)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def nonneg(name: str, value: Any) -> float:
    """A real number >= 0."""
    v = real(name, value)
    if not v >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return v


def positive(name: str, value: Any) -> float:
    """A real number > 0."""
    v = real(name, value)
    if not v > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return v


def positive_int(name: str, value: Any) -> int:
    """An integer >= 1."""
    if not integral(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def odd_size(name: str, value: Any) -> int:
    """An odd positive integer (a centred window's width)."""
    if not integral(value) or value < 1 or value % 2 == 0:
        raise ValueError(f"{name} must be an odd positive integer (the window width), got {value!r}")
    return int(value)
