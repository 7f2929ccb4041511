"""Responses of every neuron of a frozen network to a labeled dataset, over the process grid.

Every rank pushes its window of each minibatch through the network (the plan's
forward) and keeps the outputs of every layer it owns: filter, pool and LCN
neurons alike.  A neuron's global id is its flat index (i, j, c) in its layer's
output, offset by the sizes of the layers before it, so ids do not depend on the
grid; scores are combined across ranks by id (``combine_best``), which makes the
result the same on any number of ranks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import backend
from ..io import checkpoint
from ..nn.plan import NetworkPlan
from . import scoring


@dataclass
class LayerInfo:
    index: int
    kind: str
    stage: int
    shape: tuple[int, int, int]  # (H, W, C) of the layer's output
    offset: int  # global id of its first neuron

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def position(self, neuron: int) -> tuple[int, int, int]:
        return tuple(int(v) for v in np.unravel_index(neuron - self.offset, self.shape))


def layer_infos(plan: NetworkPlan) -> list[LayerInfo]:
    out, offset = [], 0
    for lp in plan.layers:
        shape = tuple(lp.out_shape[:3])
        out.append(LayerInfo(lp.index, lp.layer.kind, plan.network.stage_of(lp.index), shape, offset))
        offset += int(np.prod(shape))
    return out


def which_layer(infos: list[LayerInfo], neuron: int) -> LayerInfo:
    return next(li for li in infos if li.offset <= neuron < li.offset + li.size)


def load_params(plan: NetworkPlan, ckpt: str, comm: MPI.Comm) -> dict[int, np.ndarray]:
    """This rank's weights of every filter layer from a checkpoint (any grid it was saved on)."""
    wanted = {f"w/{lp.index}": plan.weight_box(lp.index)[1] for lp in plan.layers if lp.layer.kind == "filter"}
    arrays = checkpoint.load(ckpt, comm, wanted, dtype=plan.dtype)
    return to_device({int(k.split("/")[1]): v for k, v in arrays.items()})


def to_device(params: dict[int, Any]) -> dict[int, Any]:
    """Weights on the backend's device (CuPy arrays on a GPU; unchanged on the host backends)."""
    xp = backend.xp()
    return {k: xp.ascontiguousarray(xp.asarray(v)) for k, v in params.items()}


def _ids(lp, info: LayerInfo) -> np.ndarray:
    """Global ids of the neurons in this rank's owned output box of a layer (row-major (i, j, c))."""
    b = lp.out
    if b.is_empty:
        return np.zeros(0, np.int64)
    i, j, c = np.meshgrid(np.arange(b.lo[0], b.hi[0]), np.arange(b.lo[1], b.hi[1]), np.arange(b.lo[2], b.hi[2]),
                          indexing="ij")
    return info.offset + np.ravel_multi_index((i.ravel(), j.ravel(), c.ravel()), info.shape)


def collect(plan: NetworkPlan, params: dict[int, np.ndarray], source: Any, count: int,
            progress=None) -> tuple[np.ndarray, np.ndarray]:
    """(R, ids): this rank's neurons' responses (count x m, float32) to images 0..count-1 of
    ``source`` (read in file order: the source must not shuffle), and their global ids."""
    infos = layer_infos(plan)
    ids = np.concatenate([_ids(lp, info) for lp, info in zip(plan.layers, infos)])
    R = np.empty((count, len(ids)), np.float32)
    B = plan.batch
    for first in range(0, count, B):
        xb = source.read(first, B, plan.input_owned)  # past the end: the stream wraps; rows dropped below
        xp = backend.xp()  # the images go to the backend's device, as in training
        x = plan.input_array(xp.ascontiguousarray(xp.asarray(xb, dtype=plan.dtype)))
        _, tape = plan.forward(x, params)
        n = min(B, count - first)
        cols = [backend.to_numpy(y).reshape(-1, B)[:, :n].T for y in tape.outputs]  # (i, j, c) row-major
        R[first:first + n] = np.concatenate(cols, axis=1)
        if progress:
            progress(first + n)
    return R, ids


def combine_best(comm: MPI.Comm):
    """The ``combine`` of :func:`scoring.honest_scores` over ``comm``: every rank gets the global best."""
    def combine(cand):
        best = None
        for c in comm.allgather(cand):
            if c is not None and (best is None or scoring.better(c, best)):
                best = c
        return best
    return combine


def column(R: np.ndarray, ids: np.ndarray, neuron: int, comm: MPI.Comm) -> np.ndarray:
    """The responses of one neuron on every rank (its owner broadcasts them)."""
    hit = np.flatnonzero(ids == neuron)
    owner = comm.allreduce(comm.Get_rank() if len(hit) else comm.Get_size(), op=MPI.MIN)
    return comm.bcast(R[:, hit[0]].copy() if comm.Get_rank() == owner else None, root=owner)


def columns(R: np.ndarray, ids: np.ndarray, neurons, comm: MPI.Comm) -> np.ndarray:
    """The responses (count x len(neurons)) of some neurons on every rank, in the order given
    (repeats allowed): one allgather of the few columns each rank owns."""
    want = np.asarray(neurons, np.int64)
    hit = np.isin(ids, want)
    table = {}
    for got, block in comm.allgather((ids[hit], R[:, hit])):
        for j, neuron in enumerate(got):
            table.setdefault(int(neuron), block[:, j])
    missing = sorted(set(want.tolist()) - set(table))
    if missing:
        raise ValueError(f"no rank holds neuron(s) {missing[:5]}")
    return np.stack([table[int(v)] for v in want], axis=1) if len(want) else np.zeros((R.shape[0], 0), R.dtype)


def gather_features(R: np.ndarray, ids: np.ndarray, info: LayerInfo, comm: MPI.Comm) -> np.ndarray:
    """The whole (count x neurons) response matrix of one layer on every rank, in id order."""
    sel = (ids >= info.offset) & (ids < info.offset + info.size)
    parts = comm.allgather((ids[sel] - info.offset, R[:, sel]))
    X = np.empty((R.shape[0], info.size), np.float32)
    for idx, block in parts:
        X[:, idx] = block
    return X
