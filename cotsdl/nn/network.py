"""Stages and networks, built from a plain description; weight initialization by global site.

A stage is filter -> L2 pool -> LCN (the paper's building block); a network is a
stack of stages on an (H, W, C) input.  ``Network.from_description`` takes plain
Python data (the same data a config file will hold)::

    Network.from_description({
        "input": [200, 200, 3],
        "stages": [
            {"filter": {"size": [18, 18], "stride": [2, 2], "block": [4, 4], "channels": 8},
             "pool": {"size": [5, 5], "stride": [1, 1], "eps": 0.01},
             "lcn": {"size": 5, "sigma": 1.0, "eps": 1e-4}},
        ],
    })
"""
from __future__ import annotations

import difflib
from dataclasses import MISSING, asdict, dataclass
from dataclasses import fields as dataclass_fields
from typing import Any, Sequence

import numpy as np

from .. import backend
from ..array.box import Box
from .layers import L2Pool, LCN, LocalFilter


@dataclass(frozen=True)
class Stage:
    filter: LocalFilter
    pool: L2Pool
    lcn: LCN

    @property
    def layers(self) -> tuple[Any, Any, Any]:
        return (self.filter, self.pool, self.lcn)


class Network:
    """A stack of stages on inputs of spatial shape and channels ``input_shape = (H, W, C)``."""

    def __init__(self, input_shape: Sequence[int], stages: Sequence[Stage]):
        shape = tuple(int(v) for v in input_shape)
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(f"network input must be (H, W, C) positive integers, got {tuple(input_shape)}")
        if not stages:
            raise ValueError("a network needs at least one stage")
        self.input_shape = shape
        self.stages = list(stages)
        #: (stage, kind) of every layer, in ``layers`` order: the one stage-to-layer map.
        self.roles: list[tuple[int, str]] = [(k, layer.kind) for k, st in enumerate(self.stages) for layer in st.layers]
        # Shapes (without N) of every layer's input, checked now so errors name the layer.
        self.shapes: list[tuple[int, int, int]] = [shape]
        for li, layer in enumerate(self.layers):
            s = self.shapes[-1]
            units = layer.sites(s + (1,))
            if min(units) < 1:
                raise ValueError(f"layer {li} ({layer.kind} of stage {self.roles[li][0]}) does not fit its input "
                                 f"{s[0]}x{s[1]}x{s[2]}: {layer}")
            self.shapes.append(tuple(layer.out_shape(s + (1,))[:3]))

    def unused_input(self) -> list[tuple[int, int, int]]:
        """(layer, rows, columns) of every layer whose windows leave the bottom rows or right
        columns of its input unread (the stride does not tile the input): those pixels are dropped."""
        out = []
        for li, layer in enumerate(self.layers):
            rf = layer.rf
            if rf.pad != (0, 0):  # a padded ("same") window reads everything
                continue
            n = rf.sites(self.shapes[li][:2])
            left = [L - ((k - 1) * s + r) for L, k, s, r in zip(self.shapes[li][:2], n, rf.stride, rf.window)]
            if any(left):
                out.append((li, left[0], left[1]))
        return out

    @property
    def layers(self) -> list[Any]:
        return [layer for st in self.stages for layer in st.layers]

    def layer_index(self, stage: int, kind: str = "filter") -> int:
        """Index into ``layers`` of the ``kind`` layer (``filter``, ``pool``, ``lcn``) of ``stage``."""
        try:
            return self.roles.index((stage, kind))
        except ValueError:
            raise ValueError(f"the network has no {kind} layer in stage {stage!r} "
                             f"({len(self.stages)} stage(s))") from None

    def pass_shape(self, index: int, batch: int) -> str:
        """What the passes of layer ``index`` at ``batch`` images look like apart from the size of their
        maps: the per-site product's sizes and the windows' strides, on which a pass's speed depends
        besides its bytes (a backward-weights pass reduces over the batch).  The key under which a
        calibration keeps its efficiencies (``efficiency_by_shape`` of a machine file)."""
        layer, C = self.layers[index], self.shapes[index][2]
        if layer.kind == "filter":
            (rh, rw), (sh, sw), (bh, bw) = layer.size, layer.stride, layer.block
            head = f"filter {rh}x{rw} stride {sh}x{sw} block {bh}x{bw} K={layer.channels}"
        elif layer.kind == "pool":
            head = f"pool {layer.size[0]}x{layer.size[1]} stride {layer.stride[0]}x{layer.stride[1]}"
        else:
            head = f"lcn {layer.size}"
        return f"{head} C={C} N={int(batch)}"

    def stage_of(self, index: int) -> int:
        """The stage layer ``index`` belongs to."""
        return self.roles[index][0]

    def output_shape(self) -> tuple[int, int, int]:
        return self.shapes[-1]

    @classmethod
    def from_description(cls, desc: dict[str, Any]) -> "Network":
        """A network from plain data; every key is checked (unknown or missing keys and wrong
        types are errors naming the key path, e.g. ``stages[1].filter.stride``)."""
        shape = "expected {'input': [H, W, C], 'stages': [{'filter': {...}, 'pool': {...}, 'lcn': {...}}, ...]}"
        _keys("network", desc, {"input", "stages"}, {"input", "stages"}, shape)
        if not isinstance(desc["stages"], (list, tuple)):
            raise ValueError(f"bad network description: stages must be a list, got {desc['stages']!r}")
        inp = desc["input"]
        if not isinstance(inp, (list, tuple)) or len(inp) != 3 or not all(
                isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in inp):
            raise ValueError(f"bad network description: input must be [H, W, C] integers, got {inp!r}")
        stages = []
        for i, s in enumerate(desc["stages"]):
            _keys(f"stages[{i}]", s, {"filter", "pool", "lcn"}, {"filter", "pool", "lcn"}, shape)
            layers = []
            for kind, cls_ in (("filter", LocalFilter), ("pool", L2Pool), ("lcn", LCN)):
                fields = {f.name for f in dataclass_fields(cls_) if f.init}
                required = {f.name for f in dataclass_fields(cls_) if f.init and f.default is MISSING}
                _keys(f"stages[{i}].{kind}", s[kind], fields, required, f"{kind} keys: {', '.join(sorted(fields))}")
                try:
                    layers.append(cls_(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in s[kind].items()}))
                except ValueError as e:
                    raise ValueError(f"bad network description: stages[{i}].{kind}: {e}") from None
            stages.append(Stage(*layers))
        return cls(inp, stages)

    def describe(self) -> dict[str, Any]:
        def clean(layer):
            d = asdict(layer)
            d.pop("kind")
            return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}
        return {"input": list(self.input_shape),
                "stages": [{"filter": clean(s.filter), "pool": clean(s.pool), "lcn": clean(s.lcn)}
                           for s in self.stages]}

    def filter_layers(self) -> list[int]:
        """Indices (into ``layers``) of the layers that hold weights."""
        return [i for i, layer in enumerate(self.layers) if layer.kind == "filter"]

    def __repr__(self) -> str:
        return f"Network(input={self.input_shape}, {len(self.stages)} stage(s), output={self.output_shape()})"


def _keys(path: str, d: Any, allowed: set[str], required: set[str], hint: str) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"bad network description: {path} must be a dict, got {d!r}; {hint}")
    unknown, missing = sorted(set(d) - allowed), sorted(required - set(d))
    if unknown:
        near = difflib.get_close_matches(unknown[0], sorted(allowed), n=1)
        raise ValueError(f"bad network description: unknown key {path}.{unknown[0]}"
                         + (f"; did you mean '{near[0]}'?" if near else f"; {hint}"))
    if missing:
        raise ValueError(f"bad network description: {path} needs {', '.join(missing)}; {hint}")


def unit_gain_std(layer: LocalFilter) -> float:
    """The weight std that gives a tied stage a reconstruction gain of about 1.

    A pixel is covered by ``M * rh * rw / (sh * sw)`` units (M units per site), so
    with i.i.d. weights of variance s^2 the expected decoder-of-encoder
    ``F^T F x`` is about ``s^2 * M * rh * rw / (sh * sw) * x``; the gain is 1 at
    ``s^2 = sh * sw / (M * rh * rw)``.  (The old N(0, 1/R) gave the demo's first stage
    a gain of 16 and a first loss 180 times ||x||^2.)
    """
    (rh, rw), (sh, sw) = layer.size, layer.stride
    units = layer.block[0] * layer.block[1] * layer.channels
    return float(np.sqrt(sh * sw / (units * rh * rw)))


def unit_gain_norm(layer: LocalFilter, channels_in: int) -> float:
    """The filter norm at which a tied stage has a reconstruction gain of about 1
    (``unit_gain_std`` times the square root of the fan-in R = rh*rw*C)."""
    return unit_gain_std(layer) * float(np.sqrt(layer.size[0] * layer.size[1] * channels_in))


#: Bytes of the squares :func:`filter_norms` makes at a time on the host: all at once they were a new
#: weight-sized array every step (264 MB per rank for the 185M-parameter paper network on 2 ranks,
#: page-faulted afresh each time).
SQUARES_BYTES = 4 << 20


def _unit_squares(w: Any) -> Any:
    """Every unit's sum of squares of ``w`` (..., rh, rw, C), shape (..., 1, 1, 1): on the host a few MB
    of units at a time (each unit's sum the same reduction as of the whole array: the same bits)."""
    xp = backend.array_module(w)
    axes = (-3, -2, -1)
    if xp is not np or w.size == 0:
        return (w * w).sum(axis=axes, keepdims=True)
    units = w.reshape((-1,) + w.shape[-3:])
    out = np.empty((units.shape[0], 1, 1, 1), w.dtype)
    step = max(1, SQUARES_BYTES // max(1, units[0].nbytes))
    for i in range(0, units.shape[0], step):
        part = units[i:i + step]
        np.sum(part * part, axis=axes, keepdims=True, out=out[i:i + step])
    return out.reshape(w.shape[:-3] + (1, 1, 1))


def filter_norms(w: Any) -> Any:
    """Every unit's filter norm of ``w`` (..., rh, rw, C), shape (..., 1, 1, 1), in ``w``'s dtype.

    Overflow-safe: where the plain sum of squares overflows (float32 filters beyond about 1e19)
    or underflows to 0 (below about 1e-19), the unit is scaled by its largest entry before
    squaring.  Only those units pay for the second pass.
    """
    xp = backend.array_module(w)
    axes = (-3, -2, -1)
    with np.errstate(over="ignore", under="ignore"):
        n = xp.sqrt(_unit_squares(w))
    redo = ~xp.isfinite(n) | (n == 0)
    if bool(redo.any()):
        units = xp.nonzero(redo.reshape(redo.shape[:-3]))
        part = w[units]  # (units, rh, rw, C): a copy of the few units concerned
        with np.errstate(invalid="ignore", over="ignore"):
            m = xp.abs(part).max(axis=axes, keepdims=True)
            safe = xp.where(m > 0, m, w.dtype.type(1))
            fixed = m * xp.sqrt(((part / safe) ** 2).sum(axis=axes, keepdims=True))
        n[units] = fixed  # still inf where an entry is inf, NaN where one is NaN, 0 for a zero filter
    return n


def project_norm(w: Any, norm: float, norms: Any = None) -> Any:
    """Every unit's filter of ``w`` (..., rh, rw, C) scaled to L2 norm ``norm``, in place.

    Per unit, so it needs no communication: a rank holds whole sites, and the
    result is the same on any grid split or replica.  A zero filter stays zero.
    ``norms``: the units' norms before, if the caller has them (:func:`filter_norms`, which
    keeps a filter whose squares overflow from being scaled to zero).
    """
    xp = backend.array_module(w)
    n = filter_norms(w) if norms is None else norms
    w *= (w.dtype.type(norm) / xp.maximum(n, w.dtype.type(1e-30))).astype(w.dtype, copy=False)
    return w


def init_weights(layer: LocalFilter, in_shape: Sequence[int], sites: Box, seed: int, layer_index: int,
                 dtype: Any = np.float32, norm: float | None = None) -> np.ndarray:
    """Weights of the sites in ``sites`` (a 2-D box of site indices), keyed by global site.

    Each site draws from its own generator seeded by (seed, layer, i, j), so the
    weights of a network are the same whatever the number of ranks and grid.
    Entries are N(0, s^2) with ``s = unit_gain_std(layer)`` (fan-scaled: a stage's
    untrained reconstruction has a gain of about 1 for any filter size, stride,
    channel count and stage); with ``norm``, every unit's filter is then scaled to
    that L2 norm (the norm the trainer's constraint keeps).
    """
    full = layer.weight_shape(tuple(in_shape[:3]) + (1,))
    per_site = full[2:]
    w = np.empty(sites.shape + per_site, dtype)
    scale = unit_gain_std(layer)
    for a, i in enumerate(range(sites.lo[0], sites.hi[0])):
        for b, j in enumerate(range(sites.lo[1], sites.hi[1])):
            rng = np.random.default_rng([seed, layer_index, i, j])
            w[a, b] = rng.standard_normal(per_site) * scale
    if norm is not None:
        project_norm(w, norm)
    return w
