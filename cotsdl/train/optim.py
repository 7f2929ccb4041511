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

from typing import Any

import numpy as np
from mpi4py import MPI

from .. import backend
from ..array.collective import sum_values
from . import schedules


class Optimizer:
    """Base class: schedule, weight decay, clipping, step counter, per-parameter slots."""

    slots: tuple[str, ...] = ()

    def __init__(self, lr: Any = 0.01, weight_decay: float = 0.0, clip_norm: float | None = None,
                 comm: MPI.Comm | None = None):
        self.schedule = schedules.as_schedule(lr)
        if not float(weight_decay) >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
        if clip_norm is not None and not float(clip_norm) > 0:
            raise ValueError(f"clip_norm must be > 0, got {clip_norm!r}")
        self.weight_decay = float(weight_decay)
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self.comm = comm
        self.t = 0
        self.state: dict[str, dict[str, np.ndarray]] = {}

    # -- group reductions -------------------------------------------------------
    def _sum(self, values: list[float]) -> np.ndarray:
        return sum_values(self.comm, values)

    def layer_norms(self, arrays: dict[str, np.ndarray]) -> dict[str, float]:
        """The 2-norm of every named array over the whole group (one allreduce)."""
        names = sorted(arrays)
        sq = self._sum([float(np.sum(np.square(arrays[n], dtype=np.float64))) for n in names])
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
            total = float(np.sqrt(self._sum([float(np.sum(np.square(g, dtype=np.float64))) for g in grads.values()]).sum()))
            if total > self.clip_norm:
                scale = self.clip_norm / total
                grads = {n: g * g.dtype.type(scale) for n, g in grads.items()}
        self.t += 1
        self._update(params, grads, lr)

    def _slots(self, name: str, p: np.ndarray) -> dict[str, np.ndarray]:
        if name not in self.state:
            self.state[name] = {s: np.zeros_like(p) for s in self.slots}
        return self.state[name]

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
        if not 0 <= float(momentum) < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        if nesterov and not momentum:
            raise ValueError("nesterov needs momentum > 0")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)
        self.slots = ("v",) if momentum else ()

    def hyper(self):
        return {**super().hyper(), "momentum": self.momentum, "nesterov": self.nesterov}

    def _apply(self, name, p, g, lr, s):
        t = p.dtype.type
        if not self.momentum:
            p -= t(lr) * g
            return
        v = s["v"]
        v *= t(self.momentum)
        v += g
        p -= t(lr) * (g + t(self.momentum) * v if self.nesterov else v)


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
        self.eps = float(eps)

    def hyper(self):
        return {**super().hyper(), "eps": self.eps}

    def _apply(self, name, p, g, lr, s):
        t = p.dtype.type
        s["G"] += g * g
        p -= t(lr) * g / (np.sqrt(s["G"]) + t(self.eps))


class RMSProp(Optimizer):
    """E = rho E + (1 - rho) g^2; p -= lr g / (sqrt(E) + eps)."""

    slots = ("E",)

    def __init__(self, lr: Any = 0.001, rho: float = 0.9, eps: float = 1e-8, **kw):
        super().__init__(lr, **kw)
        self.rho, self.eps = float(rho), float(eps)

    def hyper(self):
        return {**super().hyper(), "rho": self.rho, "eps": self.eps}

    def _apply(self, name, p, g, lr, s):
        t = p.dtype.type
        s["E"] *= t(self.rho)
        s["E"] += t(1 - self.rho) * g * g
        p -= t(lr) * g / (np.sqrt(s["E"]) + t(self.eps))


class Adam(Optimizer):
    """m, v moving moments with bias correction; p -= lr m_hat / (sqrt(v_hat) + eps)."""

    slots = ("m", "v")

    def __init__(self, lr: Any = 0.001, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, **kw):
        super().__init__(lr, **kw)
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)

    def hyper(self):
        return {**super().hyper(), "beta1": self.beta1, "beta2": self.beta2, "eps": self.eps}

    def _moments(self, p, g, s) -> np.ndarray:
        """The bias-corrected ratio m_hat / (sqrt(v_hat) + eps) of this step."""
        t = p.dtype.type
        s["m"] *= t(self.beta1)
        s["m"] += t(1 - self.beta1) * g
        s["v"] *= t(self.beta2)
        s["v"] += t(1 - self.beta2) * g * g
        mh = s["m"] / t(1 - self.beta1 ** self.t)
        vh = s["v"] / t(1 - self.beta2 ** self.t)
        return mh / (np.sqrt(vh) + t(self.eps))

    def _apply(self, name, p, g, lr, s):
        p -= p.dtype.type(lr) * self._moments(p, g, s)


class LARS(Optimizer):
    """Layer-wise adaptive rate scaling (You et al. 2017), with momentum.

    local = eta ||p|| / (||g|| + wd ||p||) per layer (1 if a norm is 0);
    v = mu v + lr local (g + wd p); p -= v.  Norms span the whole layer over ``comm``.
    """

    slots = ("v",)

    def __init__(self, lr: Any = 0.1, momentum: float = 0.9, eta: float = 0.001, **kw):
        super().__init__(lr, **kw)
        self.momentum, self.eta = float(momentum), float(eta)

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
            ratios[name] = self._moments(p, grads[name], self._slots(name, p)) + p.dtype.type(self.weight_decay) * p
        pn, rn = self.layer_norms(params), self.layer_norms(ratios)
        for name in sorted(params):
            trust = pn[name] / rn[name] if pn[name] > 0 and rn[name] > 0 else 1.0
            params[name] -= params[name].dtype.type(lr * trust) * ratios[name]
