"""Learning-rate schedules (constant, step, polynomial, cosine) with linear warmup.

A schedule maps the step number t = 0, 1, ... to a learning rate, and describes
itself as plain data (for checkpoints): ``describe()`` / :func:`from_description`.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any

from ..checks import Param


def _positive(name: str, v: float, allow_zero: bool = False) -> float:
    v = float(v)
    if not (v >= 0 if allow_zero else v > 0):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {v!r}")
    return v


@dataclass(frozen=True)
class Constant:
    lr: float

    def __call__(self, t: int) -> float:
        return self.lr


@dataclass(frozen=True)
class StepDecay:
    """lr * gamma ** (t // step_size)."""

    lr: float
    step_size: int
    gamma: float = 0.1

    def __call__(self, t: int) -> float:
        return self.lr * self.gamma ** (t // self.step_size)


@dataclass(frozen=True)
class Polynomial:
    """(lr - end_lr) * (1 - t / total_steps) ** power + end_lr, then end_lr."""

    lr: float
    total_steps: int
    power: float = 1.0
    end_lr: float = 0.0

    def __call__(self, t: int) -> float:
        frac = min(t, self.total_steps) / self.total_steps
        return (self.lr - self.end_lr) * (1.0 - frac) ** self.power + self.end_lr


@dataclass(frozen=True)
class Cosine:
    """min_lr + (lr - min_lr) * (1 + cos(pi * t / total_steps)) / 2, then min_lr."""

    lr: float
    total_steps: int
    min_lr: float = 0.0

    def __call__(self, t: int) -> float:
        frac = min(t, self.total_steps) / self.total_steps
        return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * frac))


@dataclass(frozen=True)
class Warmup:
    """Linear warmup from ``start_factor * after(0)`` to ``after(warmup_steps)`` over ``warmup_steps``, then ``after``."""

    after: Any
    warmup_steps: int
    start_factor: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "after", as_schedule(self.after))

    def __call__(self, t: int) -> float:
        if t >= self.warmup_steps:
            return self.after(t)
        target = self.after(self.warmup_steps)
        return target * (self.start_factor + (1.0 - self.start_factor) * t / self.warmup_steps)


KINDS = {"constant": Constant, "step": StepDecay, "polynomial": Polynomial, "cosine": Cosine, "warmup": Warmup}


def _plain(s: Any) -> None:
    """Fields as plain Python numbers (NumPy scalars would not survive JSON in checkpoints)."""
    for name, value in asdict(s).items() if not isinstance(s, Warmup) else ():
        if isinstance(value, numbers.Integral):
            object.__setattr__(s, name, int(value))
        elif isinstance(value, numbers.Real):
            object.__setattr__(s, name, float(value))


def validate(s: Any) -> Any:
    _plain(s)
    if isinstance(s, Warmup):
        object.__setattr__(s, "warmup_steps", int(s.warmup_steps))
        object.__setattr__(s, "start_factor", float(s.start_factor))
        if int(s.warmup_steps) < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {s.warmup_steps!r}")
        validate(s.after)
        return s
    _positive("learning rate", s.lr)
    for name in ("step_size", "total_steps"):
        if hasattr(s, name) and int(getattr(s, name)) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(s, name)!r}")
    return s


def as_schedule(lr: Any) -> Any:
    """A number becomes a constant schedule; schedules pass through (validated)."""
    if isinstance(lr, numbers.Real):
        return Constant(_positive("learning rate", lr))
    if not callable(lr) or type(lr) not in KINDS.values():
        raise ValueError(f"lr must be a number or a schedule ({', '.join(KINDS)}), got {lr!r}")
    return validate(lr)


def describe(s: Any) -> dict:
    kind = next(k for k, v in KINDS.items() if type(s) is v)
    d = asdict(s) if kind != "warmup" else {"after": describe(s.after), "warmup_steps": s.warmup_steps,
                                           "start_factor": s.start_factor}
    return {"kind": kind, **d}


def from_description(d: dict) -> Any:
    d = dict(d)
    kind = d.pop("kind")
    if kind == "warmup":
        d["after"] = from_description(d["after"])
    return KINDS[kind](**d)


# -- the registry: config names -> schedules and their keys -----------------------------
#: Keys every schedule takes (``kind`` names the entry of :data:`SCHEDULES`).
COMMON = {"warmup_steps": Param(0, "integer", lo=0, doc="linear warmup (0: none)"),
          "start_factor": Param(0.0, lo=0, hi=1, doc="warmup starts at start_factor * lr")}

#: The schedules a config can name: (class, its own keys); the one list.
SCHEDULES: dict[str, tuple[Any, dict[str, Param]]] = {
    "constant": (Constant, {}),
    "step": (StepDecay, {"step_size": Param(kind="integer", lo=1), "gamma": Param(0.1, lo=0, lo_open=True)}),
    "polynomial": (Polynomial, {"total_steps": Param(kind="integer", lo=1), "power": Param(1.0, lo=0, lo_open=True),
                                "end_lr": Param(0.0, lo=0)}),
    "cosine": (Cosine, {"total_steps": Param(kind="integer", lo=1), "min_lr": Param(0.0, lo=0)}),
}


def from_config(lr: float, sched: dict[str, Any]) -> Any:
    """The schedule a resolved config's ``train.schedule`` table names, peaking at ``lr``."""
    kind = sched.get("kind", "constant")
    if kind not in SCHEDULES:
        raise ValueError(f"schedule kind must be one of {', '.join(SCHEDULES)}, got {kind!r}")
    cls, keys = SCHEDULES[kind]
    s = validate(cls(lr, **{k: sched[k] for k in keys if k in sched}))
    if sched.get("warmup_steps"):
        s = validate(Warmup(s, sched["warmup_steps"], sched.get("start_factor", 0.0)))
    return s


def to_config(s: Any) -> tuple[float, dict[str, Any]]:
    """(peak lr, ``train.schedule`` table) of a schedule: the inverse of :func:`from_config`."""
    warm = {"warmup_steps": 0, "start_factor": 0.0}
    if isinstance(s, Warmup):
        warm, s = {"warmup_steps": s.warmup_steps, "start_factor": s.start_factor}, s.after
    d = describe(s)
    kind = d.pop("kind")
    return d.pop("lr"), {"kind": kind, **d, **warm}
