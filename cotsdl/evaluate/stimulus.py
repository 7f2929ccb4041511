"""The optimal stimulus of a neuron: gradient ascent on the input image under an L2-norm constraint.

As Le et al. (2012) show for their face neuron: starting from a small random image,
follow the gradient of the neuron's response with respect to the input (the
network plan's backward pass, over the process grid) and project back onto the
sphere ||x|| = norm after every step.  The image is distributed like any input:
each rank holds its block, norms are reduced over the grid.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import backend
from ..array.collect import gather
from ..array.collective import sum_values
from ..array.distarray import DistArray
from ..nn.plan import NetworkPlan


def _norm(comm: MPI.Comm, a: np.ndarray) -> float:
    return float(np.sqrt(sum_values(comm, [np.sum(np.square(a, dtype=np.float64))])[0]))


def response_and_gradient(plan: NetworkPlan, params: dict[int, np.ndarray], x: np.ndarray, layer: int,
                          position: tuple[int, int, int]) -> tuple[float, np.ndarray]:
    """The neuron's response to the image whose block (this rank's owned input box, batch 1) is ``x``,
    and its gradient with respect to that block (collective over the grid)."""
    if plan.batch != 1:
        raise ValueError(f"the stimulus plan takes one image at a time, got batch {plan.batch}")
    comm = plan.grid.comm
    xp = backend.xp()  # x stays on the host; the network runs on the backend's device
    xin = plan.input_array(xp.ascontiguousarray(xp.asarray(x, dtype=plan.dtype)))
    y, tape = plan.forward(xin, params, upto=layer + 1)
    out = plan.layers[layer].out
    at = tuple(position) + (0,)
    mine = out.contains_point(at)
    local = xp.zeros(out.shape, plan.dtype)
    value = 0.0
    if mine:
        rel = tuple(p - lo for p, lo in zip(at, out.lo))
        local[rel] = 1
        value = float(y.data[rel])
    value = float(sum_values(comm, [value])[0])
    dy = DistArray(comm, plan.layers[layer].out_shape, out, out, data=local)
    dx, _ = plan.backward(dy, tape, params, weight_grads=False)  # the input gradient only
    return value, backend.to_numpy(dx.data)


def optimal_stimulus(plan: NetworkPlan, params: dict[int, np.ndarray], layer: int, position: tuple[int, int, int],
                     norm: float, steps: int = 100, lr: float = 0.1, seed: int = 0,
                     sign: int = 1) -> tuple[np.ndarray | None, list[float]]:
    """Projected gradient ascent: the whole image (H, W, C) on rank 0 of the grid (None elsewhere)
    and the neuron's response at every step (it should increase; with ``sign`` -1 the response is
    minimized instead, for a neuron that signals faces by being low, and it should decrease)."""
    comm = plan.grid.comm
    box = plan.input_owned
    full = np.random.default_rng([seed, 0x5717]).standard_normal(plan.network.input_shape + (1,))  # its own stream
    x = full[box.slices_in(plan.input_array().global_box)]  # every rank draws the whole image: grid-independent
    x *= norm / _norm(comm, x)
    trace = []
    for _ in range(int(steps)):
        value, g = response_and_gradient(plan, params, x, layer, position)
        trace.append(value)
        gn = _norm(comm, g)
        if gn == 0:
            break
        x = x + (sign * lr * norm / gn) * g  # a step of lr * norm along the unit gradient
        x *= norm / _norm(comm, x)
    trace.append(response_and_gradient(plan, params, x, layer, position)[0])
    img = gather(DistArray(comm, plan.network.input_shape + (1,), box, box, data=np.ascontiguousarray(x)))
    return (img[..., 0] if img is not None else None), trace


def mean_norm(images: np.ndarray) -> float:
    """The mean L2 norm of (n, H, W, C) images: the stimulus gets the norm of a typical input."""
    return float(np.mean(np.sqrt(np.sum(np.square(images.reshape(len(images), -1), dtype=np.float64), axis=1))))

