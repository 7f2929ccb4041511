"""Learning-rate schedules (constant, step, polynomial, cosine) with linear warmup.

A schedule maps the step number t = 0, 1, ... to a learning rate, and describes
itself as plain data (for checkpoints): ``describe()`` / :func:`from_description`.

No schedule is 0 by accident: a warm-up is positive from its first step, a decaying schedule's
warm-up must end before its ``total_steps`` (:func:`validate`: else it would ramp up to the
schedule's end value, 0 by default), and :func:`zero_error` names the steps of a stage that
would run past a decay to 0 (the trainer refuses them before the first step).
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
    """Linear warmup to ``after(warmup_steps)`` over ``warmup_steps``, then ``after``.

    The ramp runs from ``start_factor`` times the target, one step before the first, to the
    target at step ``warmup_steps``: step t < warmup_steps has the factor
    start_factor + (1 - start_factor) (t + 1) / (warmup_steps + 1), so even the first step
    trains (with the default start_factor 0, at 1 / (warmup_steps + 1) of the target).
    """

    after: Any
    warmup_steps: int
    start_factor: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "after", as_schedule(self.after))

    def __call__(self, t: int) -> float:
        if t >= self.warmup_steps:
            return self.after(t)
        target = self.after(self.warmup_steps)
        return target * (self.start_factor + (1.0 - self.start_factor) * (t + 1) / (self.warmup_steps + 1))


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
        end = getattr(s.after, "total_steps", None)
        if end is not None and s.warmup_steps >= end:
            floor = "end_lr" if isinstance(s.after, Polynomial) else "min_lr"
            raise ValueError(f"warmup_steps = {s.warmup_steps} must be less than total_steps = {end} of the "
                             f"{_kind(s.after)} schedule: the warm-up ramps up to the schedule's rate at step "
                             f"{s.warmup_steps}, past its end, where it is {floor} = {getattr(s.after, floor):.3g} "
                             "(every step of the warm-up and after it would train at that rate)")
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


def _kind(s: Any) -> str:
    return next(k for k, v in KINDS.items() if type(s) is v)


def zero_error(s: Any, first: int, stop: int) -> str | None:
    """Why steps ``first``..``stop - 1`` of a schedule would not all train (a rate of 0 or
    less), naming the first such step and the keys to change; None when every rate is positive.

    Every schedule here rises (warm-up) and then never rises again, so the rates of the
    steps are all positive when those of the first and the last step are.
    """
    if stop <= first or (s(first) > 0 and s(stop - 1) > 0):
        return None
    lo, hi = first, stop - 1  # the first step at rate 0: on the falling part, by bisection
    if s(first) > 0:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if s(mid) > 0 else (lo, mid)
    zero = first if s(first) <= 0 else hi
    base = s.after if isinstance(s, Warmup) else s
    why = f"the {_kind(base)} schedule's rate is {s(zero):.3g} from step {zero + 1} on"
    if isinstance(base, (Polynomial, Cosine)):
        floor = "end_lr" if isinstance(base, Polynomial) else "min_lr"
        return (f"{why}: the stage's {stop} steps run past the schedule's total_steps = {base.total_steps}, where it "
                f"ends at {floor} = 0; give train.schedule.total_steps >= {stop} or {floor} > 0")
    return f"{why} (it underflows); give a larger train.schedule.gamma or step_size"


def describe(s: Any) -> dict:
    kind = _kind(s)
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
