"""Checks of scalar arguments, shared by every floor (clear errors naming the parameter and value).

The bottom floor beside ``backend``: it imports nothing of the package.  No
coercion: 5.7 does not become 5 and "0.01" does not become 0.01 — a wrong type in
a description or config is a mistake to report.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
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


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a parameter that has none: it must be given.
REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Param:
    """One hyper-parameter's type and range, written once: constructors check their
    arguments with it and config files derive their keys from it.

    ``kind`` is "number", "integer" or "bool"; ``lo``/``hi`` bound it (open with
    ``lo_open``/``hi_open``); ``default`` may be :data:`REQUIRED` (or None: "not set").
    """

    default: Any = REQUIRED
    kind: str = "number"
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    doc: str = ""

    def problem(self, v: Any) -> str | None:
        """None if ``v`` is allowed, else what is ("must be a number > 0 and < 1")."""
        if self.kind == "bool":
            return None if isinstance(v, (bool, np.bool_)) else "must be true or false"
        ok = integral(v) if self.kind == "integer" else (
            not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, float, np.integer, np.floating))
            and bool(np.isfinite(v)))
        if ok and self.lo is not None:
            ok = v > self.lo if self.lo_open else v >= self.lo
        if ok and self.hi is not None:
            ok = v < self.hi if self.hi_open else v <= self.hi
        if ok:
            return None
        bounds = ([f"{'>' if self.lo_open else '>='} {self.lo:g}"] if self.lo is not None else []) + (
            [f"{'<' if self.hi_open else '<='} {self.hi:g}"] if self.hi is not None else [])
        return f"must be {'an integer' if self.kind == 'integer' else 'a number'}" + (
            " " + " and ".join(bounds) if bounds else "")

    def check(self, name: str, v: Any) -> Any:
        """``v`` as a plain Python value, or ValueError naming ``name`` and the value."""
        err = self.problem(v)
        if err:
            raise ValueError(f"{name} {err}, got {v!r}")
        return bool(v) if self.kind == "bool" else int(v) if self.kind == "integer" else float(v)

    def with_(self, **kw: Any) -> "Param":
        """The same parameter with other fields (another default, a tighter bound)."""
        return replace(self, **kw)
