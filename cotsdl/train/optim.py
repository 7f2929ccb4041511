"""Optimizers: SGD (plain, momentum, Nesterov), AdaGrad, RMSProp, Adam, LARS, LAMB.

Each is a small class with ``step(params, grads)`` that updates ``params`` (a dict
name -> array, this rank's block of each layer) in place, and a state that can be
saved (``state_dict`` / ``load_state_dict``: arrays and numbers, no pickles).
Weight decay, gradient clipping by global norm and learning-rate schedules are
common to all.  Norms over a whole layer (LARS, LAMB) or the whole model (clipping)
are reduced over ``comm``, the model-parallel group, so updates do not depend on how
the layers are split over ranks.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import backend
from ..checks import Param
from . import schedules

if TYPE_CHECKING:  # pragma: no cover - MPI is initialised only by the code that reduces
    from mpi4py import MPI

# Every hyper-parameter's range, written once: the constructors check with these and
# config files derive their keys from :data:`OPTIMIZERS`.
LR = Param(0.01, lo=0, lo_open=True, doc="learning rate (the schedule's peak)")
WEIGHT_DECAY = Param(0.0, lo=0)
CLIP_NORM = Param(None, lo=0, lo_open=True, doc="clip the gradient's global norm")
MOMENTUM = Param(0.9, lo=0, hi=1, hi_open=True)
NESTEROV = Param(False, kind="bool")
BETA = Param(0.9, lo=0, hi=1, hi_open=True)
EPS = Param(1e-8, lo=0, lo_open=True)
ETA = Param(0.001, lo=0, lo_open=True, doc="LARS trust coefficient")


#: The work array (``Optimizer._scratch``) a clipped gradient is written into: after the updates' own (0, 1).
CLIPPED = 2
#: Elements of a host array squared in float64 at a time by :func:`sum_squares`.
SQUARES_CHUNK = 1 << 16


def sum_squares(a: np.ndarray) -> float:
    """The sum of the squares of ``a`` in float64.  On the host a cache-sized piece at a time: the
    float64 squares of a whole weight-sized gradient were twice its size, mapped and page-faulted at
    every clipped step (528 MB per rank, +0.5 GiB of peak memory, for the 185M-parameter paper network
    on 2 ranks)."""
    xp = backend.array_module(a)
    if xp is not np:
        return float(xp.sum(xp.square(a, dtype=xp.float64)))
    flat = a.reshape(-1)
    # numpy's own sum, not BLAS's dot: a thousand small threaded calls were 10x slower next to other ranks
    return float(sum(np.square(flat[i:i + SQUARES_CHUNK], dtype=np.float64).sum()
                     for i in range(0, flat.size, SQUARES_CHUNK)))


class Optimizer:
    """Base class: schedule, weight decay, clipping, step counter, per-parameter slots."""

    slots: tuple[str, ...] = ()

    def __init__(self, lr: Any = 0.01, weight_decay: float = 0.0, clip_norm: float | None = None,
                 comm: "MPI.Comm | None" = None):
        self.schedule = schedules.as_schedule(lr)
        self.weight_decay = WEIGHT_DECAY.check("weight_decay", weight_decay)
        self.clip_norm = None if clip_norm is None else CLIP_NORM.check("clip_norm", clip_norm)
        self.comm = comm
        self.t = 0
        self.state: dict[str, dict[str, np.ndarray]] = {}
        self._work: dict[tuple[str, int], np.ndarray] = {}

    # -- group reductions -------------------------------------------------------
    def _sum(self, values: list[float]) -> np.ndarray:
        from ..array.collective import sum_values  # noqa: PLC0415 - MPI on first reduction only

        return sum_values(self.comm, values)

    def layer_norms(self, arrays: dict[str, np.ndarray]) -> dict[str, float]:
        """The 2-norm of every named array over the whole group (one allreduce)."""
        names = sorted(arrays)
        sq = self._sum([sum_squares(arrays[n]) for n in names])
        return dict(zip(names, np.sqrt(sq)))

    # -- the step -------------------------------------------------------------
    @property
    def lr(self) -> float:
        """The learning rate of the next step."""
        return self.schedule(self.t)

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        if sorted(params) != sorted(grads):
            raise ValueError(f"params and grads name different arrays: {sorted(params)} vs {sorted(grads)}")
        lr = self.schedule(self.t)
        if self.clip_norm is not None:
            total = float(np.sqrt(self._sum([sum_squares(g) for g in grads.values()]).sum()))
            if total > self.clip_norm:
                scale = self.clip_norm / total
                # into a kept work array (the caller's gradient stays as it was): a new weight-sized array
                # each step cost the 185M-parameter paper network's stage-0 step 0.3 s of page faults
                grads = {n: backend.array_module(g).multiply(g, g.dtype.type(scale),
                                                              out=self._scratch(n, g, CLIPPED))
                         for n, g in grads.items()}
        self.t += 1
        self._update(params, grads, lr)

    def _slots(self, name: str, p: np.ndarray) -> dict[str, np.ndarray]:
        if name not in self.state:
            self.state[name] = {s: np.zeros_like(p) for s in self.slots}
        return self.state[name]

    @property
    def work_arrays(self) -> int:
        """Work arrays held for the update (weight-sized, per parameter; not part of the state)."""
        return len(self._work)

    def _scratch(self, name: str, p: np.ndarray, k: int = 0) -> np.ndarray:
        """Work array ``k`` shaped as parameter ``name``, kept from step to step (never saved):
        the update runs in place, with no page faults for weight-sized temporaries each step."""
        a = self._work.get((name, k))
        if a is None or a.shape != p.shape or a.dtype != p.dtype or type(a) is not type(p):
            a = self._work[(name, k)] = backend.array_module(p).empty_like(p)
        return a

    def _update(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray], lr: float) -> None:
        for name in sorted(params):
            p, g = params[name], grads[name]
            if self.weight_decay:
                g = g + p.dtype.type(self.weight_decay) * p
            self._apply(name, p, g, lr, self._slots(name, p))

    def _apply(self, name: str, p: np.ndarray, g: np.ndarray, lr: float, s: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    # -- saving ---------------------------------------------------------------
    def hyper(self) -> dict[str, Any]:
        return {"weight_decay": self.weight_decay, "clip_norm": self.clip_norm}

    def state_dict(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, "t": self.t, "schedule": schedules.describe(self.schedule),
                "hyper": self.hyper(), "slots": {n: dict(s) for n, s in self.state.items()}}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if d["kind"] != type(self).__name__:
            raise ValueError(f"state of a {d['kind']} optimizer cannot be loaded into a {type(self).__name__}")
        self.t = int(d["t"])
        self.schedule = schedules.from_description(d["schedule"])
        for k, v in d["hyper"].items():
            setattr(self, k, v)
        # a copy in the array's own library: CuPy state stays on the device
        self.state = {n: {k: backend.array_module(a).array(a, copy=True) for k, a in s.items()}
                      for n, s in d["slots"].items()}


class SGD(Optimizer):
    """p -= lr * g; with momentum: v = mu v + g, p -= lr v; Nesterov: p -= lr (g + mu v)."""

    def __init__(self, lr: Any = 0.01, momentum: float = 0.0, nesterov: bool = False, **kw):
        super().__init__(lr, **kw)
        self.momentum, self.nesterov = MOMENTUM.check("momentum", momentum), NESTEROV.check("nesterov", nesterov)
        if self.nesterov and not self.momentum:
            raise ValueError("nesterov needs momentum > 0")
        self.slots = ("v",) if momentum else ()

    def hyper(self):
        return {**super().hyper(), "momentum": self.momentum, "nesterov": self.nesterov}

    def _apply(self, name, p, g, lr, s):
        t, a = p.dtype.type, self._scratch(name, p)
        if self.momentum:
            v = s["v"]
            v *= t(self.momentum)
            v += g
            if self.nesterov:  # lr (g + mu v)
                np.multiply(v, t(self.momentum), out=a)
                np.add(g, a, out=a)
                g = a
            else:
                g = v
        np.multiply(g, t(lr), out=a)
        p -= a


def Momentum(lr: Any = 0.01, momentum: float = 0.9, **kw) -> SGD:
    """SGD with momentum, the optimizer of the paper."""
    return SGD(lr, momentum=momentum, **kw)


def Nesterov(lr: Any = 0.01, momentum: float = 0.9, **kw) -> SGD:
    return SGD(lr, momentum=momentum, nesterov=True, **kw)


class AdaGrad(Optimizer):
    """G += g^2; p -= lr g / (sqrt(G) + eps)."""

    slots = ("G",)

    def __init__(self, lr: Any = 0.01, eps: float = 1e-10, **kw):
        super().__init__(lr, **kw)
        self.eps = EPS.check("eps", eps)

    def hyper(self):
        return {**super().hyper(), "eps": self.eps}

    def _apply(self, name, p, g, lr, s):
        a = self._scratch(name, p)
        np.multiply(g, g, out=a)
        s["G"] += a
        _scaled_step(p, g, s["G"], lr, self.eps, a, self._scratch(name, p, 1))


class RMSProp(Optimizer):
    """E = rho E + (1 - rho) g^2; p -= lr g / (sqrt(E) + eps)."""

    slots = ("E",)

    def __init__(self, lr: Any = 0.001, rho: float = 0.9, eps: float = 1e-8, **kw):
        super().__init__(lr, **kw)
        self.rho, self.eps = BETA.check("rho", rho), EPS.check("eps", eps)

    def hyper(self):
        return {**super().hyper(), "rho": self.rho, "eps": self.eps}

    def _apply(self, name, p, g, lr, s):
        t, a = p.dtype.type, self._scratch(name, p)
        s["E"] *= t(self.rho)
        np.multiply(g, t(1 - self.rho), out=a)
        a *= g
        s["E"] += a
        _scaled_step(p, g, s["E"], lr, self.eps, a, self._scratch(name, p, 1))


class Adam(Optimizer):
    """m, v moving moments with bias correction; p -= lr m_hat / (sqrt(v_hat) + eps)."""

    slots = ("m", "v")

    def __init__(self, lr: Any = 0.001, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, **kw):
        super().__init__(lr, **kw)
        self.beta1, self.beta2, self.eps = BETA.check("beta1", beta1), BETA.check("beta2", beta2), EPS.check("eps", eps)

    def hyper(self):
        return {**super().hyper(), "beta1": self.beta1, "beta2": self.beta2, "eps": self.eps}

    def _moments(self, name, p, g, s) -> np.ndarray:
        """The bias-corrected ratio m_hat / (sqrt(v_hat) + eps) of this step (in a work array)."""
        t, a, b = p.dtype.type, self._scratch(name, p), self._scratch(name, p, 1)
        s["m"] *= t(self.beta1)
        np.multiply(g, t(1 - self.beta1), out=a)
        s["m"] += a
        s["v"] *= t(self.beta2)
        np.multiply(g, t(1 - self.beta2), out=a)
        a *= g
        s["v"] += a
        np.divide(s["m"], t(1 - self.beta1 ** self.t), out=a)  # m_hat
        np.divide(s["v"], t(1 - self.beta2 ** self.t), out=b)  # v_hat
        np.sqrt(b, out=b)
        b += t(self.eps)
        return np.divide(a, b, out=a)

    def _apply(self, name, p, g, lr, s):
        step = self._moments(name, p, g, s)
        step *= p.dtype.type(lr)
        p -= step


class LARS(Optimizer):
    """Layer-wise adaptive rate scaling (You et al. 2017), with momentum.

    local = eta ||p|| / (||g|| + wd ||p||) per layer (1 if a norm is 0);
    v = mu v + lr local (g + wd p); p -= v.  Norms span the whole layer over ``comm``.
    """

    slots = ("v",)

    def __init__(self, lr: Any = 0.1, momentum: float = 0.9, eta: float = 0.001, **kw):
        super().__init__(lr, **kw)
        self.momentum, self.eta = MOMENTUM.check("momentum", momentum), ETA.check("eta", eta)

    def hyper(self):
        return {**super().hyper(), "momentum": self.momentum, "eta": self.eta}

    def _update(self, params, grads, lr):
        pn, gn = self.layer_norms(params), self.layer_norms(grads)
        wd = self.weight_decay
        for name in sorted(params):
            p, g, s = params[name], grads[name], self._slots(name, params[name])
            t = p.dtype.type
            denom = gn[name] + wd * pn[name]
            local = self.eta * pn[name] / denom if pn[name] > 0 and denom > 0 else 1.0
            s["v"] *= t(self.momentum)
            s["v"] += t(lr * local) * (g + t(wd) * p)
            p -= s["v"]


class LAMB(Adam):
    """Layer-wise adaptive moments (You et al. 2019): r = Adam ratio + wd p;
    p -= lr (||p|| / ||r||) r, with norms over the whole layer (1 if a norm is 0)."""

    def _update(self, params, grads, lr):
        ratios = {}
        for name in sorted(params):
            p = params[name]
            moments = self._moments(name, p, grads[name], self._slots(name, p))
            ratios[name] = moments + p.dtype.type(self.weight_decay) * p
        pn, rn = self.layer_norms(params), self.layer_norms(ratios)
        for name in sorted(params):
            trust = pn[name] / rn[name] if pn[name] > 0 and rn[name] > 0 else 1.0
            params[name] -= params[name].dtype.type(lr * trust) * ratios[name]


# -- the registry: config names -> constructors and their keys -------------------------
#: Keys every optimizer takes (``kind`` names the entry of :data:`OPTIMIZERS`).
COMMON = {"lr": LR, "weight_decay": WEIGHT_DECAY, "clip_norm": CLIP_NORM}

#: The optimizers a config can name: (constructor, its own keys).  The one list: config
#: keys, errors, ``--help`` and the run planner's slot counts all come from here.
OPTIMIZERS: dict[str, tuple[Any, dict[str, Param]]] = {
    "sgd": (SGD, {"momentum": MOMENTUM.with_(default=0.0), "nesterov": NESTEROV}),
    "momentum": (Momentum, {"momentum": MOMENTUM}),
    "nesterov": (Nesterov, {"momentum": MOMENTUM.with_(lo_open=True)}),
    "adagrad": (AdaGrad, {"eps": EPS.with_(default=1e-10)}),
    "rmsprop": (RMSProp, {"rho": BETA, "eps": EPS}),
    "adam": (Adam, {"beta1": BETA, "beta2": BETA.with_(default=0.999), "eps": EPS}),
    "lars": (LARS, {"momentum": MOMENTUM, "eta": ETA}),
    "lamb": (LAMB, {"beta1": BETA, "beta2": BETA.with_(default=0.999), "eps": EPS.with_(default=1e-6)}),
}

#: Saved optimizer states name their class: the classes a checkpoint may hold.
CLASSES = {c.__name__: c for c in (SGD, AdaGrad, RMSProp, Adam, LARS, LAMB)}


def from_config(opt: dict[str, Any], sched: dict[str, Any]) -> Optimizer:
    """The optimizer (with its schedule) that a resolved config's ``train.optimizer`` and
    ``train.schedule`` tables name."""
    if opt.get("kind") not in OPTIMIZERS:
        raise ValueError(f"optimizer kind must be one of {', '.join(OPTIMIZERS)}, got {opt.get('kind')!r}")
    make, _ = OPTIMIZERS[opt["kind"]]
    kw = {k: v for k, v in opt.items() if k not in ("kind", "lr")}
    return make(schedules.from_config(opt["lr"], sched), **kw)


def from_state(kind: str, hyper: dict[str, Any], schedule: dict[str, Any]) -> Optimizer:
    """A fresh optimizer (step 0, no slots) of a saved state's class, hyper-parameters and schedule."""
    if kind not in CLASSES:
        raise ValueError(f"a saved optimizer of unknown kind {kind!r} (known: {', '.join(CLASSES)})")
    return CLASSES[kind](schedules.from_description(schedule), **hyper)


def settings(opt: Optimizer) -> dict[str, Any]:
    """What a config sets of an optimizer, keyed as the config names it (``train.optimizer.lr``,
    ``train.schedule.total_steps``): the values a resume compares and reports."""
    lr, sched = schedules.to_config(opt.schedule)
    return {"train.optimizer.lr": lr, **{f"train.optimizer.{k}": v for k, v in opt.hyper().items()},
            **{f"train.schedule.{k}": v for k, v in sched.items()}}


def slot_count(opt: dict[str, Any]) -> int:
    """Arrays of state per parameter (momentum 1, Adam 2) of a config's ``train.optimizer``."""
    make, keys = OPTIMIZERS[opt["kind"]]
    kw = {k: opt.get(k, p.default) for k, p in keys.items()}
    return len(make(opt.get("lr", LR.default), **kw).slots)


def _scaled_step(p: np.ndarray, g: np.ndarray, acc: np.ndarray, lr: float, eps: float, a: np.ndarray,
                 b: np.ndarray) -> None:
    """p -= lr g / (sqrt(acc) + eps), in the work arrays ``a`` and ``b`` (AdaGrad, RMSProp)."""
    t = p.dtype.type
    np.multiply(g, t(lr), out=a)
    np.sqrt(acc, out=b)
    b += t(eps)
    np.divide(a, b, out=a)
    p -= a
