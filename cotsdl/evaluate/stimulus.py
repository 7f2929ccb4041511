"""The optimal stimulus of a neuron: gradient ascent on the input image under an L2-norm constraint.

As Le et al. (2012) show for their face neuron: follow the gradient of the neuron's
(signed) response with respect to the input (the network plan's backward pass, over
the process grid) and project back onto the sphere ||x|| = norm after every step.
The image is distributed like any input: each rank holds its block, norms are
reduced over the grid.

Why it looked like noise (cotsdl/evaluate/README.md, "The optimal stimulus"): the
start, a random image of the full norm, is mostly pixel-level noise that the
network hardly sees, so the ascent never removes it, and the gradient itself has
pixel-level detail; drawn large with nearest-neighbour pixels that detail hides
the face-like layout underneath.  So the ascent starts from a small random image
(``init``: a share of the norm), from several random starts, keeping the one with
the best response; the figure shows it also blurred, for viewing.  A blur between
steps (``blur``, a Gaussian of that many pixels) is available but off: on the
tuning set it raised the random-weight network's correlation with the mean face as
much as the trained one's, and it keeps the ascent from reaching a known optimum
(a planted unit's own filter).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import backend
from ..array.collect import gather
from ..array.collective import allreduce, sum_values
from ..array.distarray import DistArray
from ..nn.plan import NetworkPlan

#: The settings of the report's stimulus, chosen on a tuning set (views of the training identities
#: against crops of the training photographs, never the evaluation's faces): README, "The optimal stimulus".
STARTS, INIT, BLUR = 8, 0.01, 0.0


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


def gaussian_blur(image: np.ndarray, sigma: float) -> np.ndarray:
    """``image`` (H, W, ...) smoothed along its first two axes by a Gaussian of ``sigma`` pixels
    (separable, truncated at 4 sigma, borders mirrored; sigma 0: unchanged)."""
    if sigma <= 0:
        return image
    r = int(np.ceil(4 * sigma))
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    k /= k.sum()
    out = np.asarray(image, np.float64)
    for axis in (0, 1):
        pad = [(0, 0)] * out.ndim
        pad[axis] = (r, r)
        p = np.pad(out, pad, mode="symmetric")
        out = sum(w * np.take(p, np.arange(i, i + out.shape[axis]), axis=axis) for i, w in enumerate(k))
    return out


def _blur_block(plan: NetworkPlan, x: np.ndarray, sigma: float) -> np.ndarray:
    """This rank's block of the whole image blurred (the whole image is put together on every rank:
    a blur needs the neighbours' pixels; inputs are small)."""
    if sigma <= 0:
        return x
    whole = plan.input_array().global_box
    at = plan.input_owned.slices_in(whole)
    full = np.zeros(whole.shape, np.float64)
    full[at] = x
    full = allreduce(plan.grid.comm, full)
    return np.ascontiguousarray(gaussian_blur(full, sigma)[at])


def optimal_stimulus(plan: NetworkPlan, params: dict[int, np.ndarray], layer: int, position: tuple[int, int, int],
                     norm: float, steps: int = 100, lr: float = 0.1, seed: int = 0, sign: int = 1,
                     blur: float = 0.0, init: float = 1.0) -> tuple[np.ndarray | None, list[float]]:
    """Projected gradient ascent: the whole image (H, W, C) on rank 0 of the grid (None elsewhere)
    and the neuron's response at every step (it should increase; with ``sign`` -1 the response is
    minimized instead, for a neuron that signals faces by being low, and it should decrease).

    The start is a random image of norm ``init * norm`` (seeded, the same on any grid); every step
    moves ``lr * norm`` along the unit gradient, blurs by ``blur`` pixels and projects onto the
    sphere of radius ``norm``."""
    comm = plan.grid.comm
    box = plan.input_owned
    full = np.random.default_rng([seed, 0x5717]).standard_normal(plan.network.input_shape + (1,))  # its own stream
    x = full[box.slices_in(plan.input_array().global_box)]  # every rank draws the whole image: grid-independent
    x *= init * norm / _norm(comm, x)
    trace = []
    for _ in range(int(steps)):
        value, g = response_and_gradient(plan, params, x, layer, position)
        trace.append(value)
        gn = _norm(comm, g)
        if gn == 0:
            break
        x = _blur_block(plan, x + (sign * lr * norm / gn) * g, blur)  # a step of lr * norm along the unit gradient
        x *= norm / _norm(comm, x)
    trace.append(response_and_gradient(plan, params, x, layer, position)[0])
    img = gather(DistArray(comm, plan.network.input_shape + (1,), box, box, data=np.ascontiguousarray(x)))
    return (img[..., 0] if img is not None else None), trace


def best_of_starts(plan: NetworkPlan, params: dict[int, np.ndarray], layer: int, position: tuple[int, int, int],
                   norm: float, starts: int = STARTS, steps: int = 100, lr: float = 0.1, seed: int = 0,
                   sign: int = 1, blur: float = BLUR, init: float = INIT) -> dict:
    """:func:`optimal_stimulus` from ``starts`` random starts (seeds ``seed``, ``seed + 1``...).

    Returns (complete on rank 0 of the grid) ``images`` (starts, H, W, C), each start's final
    ``responses`` and ``traces``, ``best`` (the start with the highest ``sign * response``) and
    ``even``: whether the response to the best image equals that to its negative (to 1e-5,
    measured: a network that pools squared filter outputs cannot tell x from -x, so its
    stimulus has no sign)."""
    images, responses, traces = [], [], []
    for s in range(int(starts)):
        img, trace = optimal_stimulus(plan, params, layer, position, norm, steps, lr, seed + s, sign, blur, init)
        images.append(img)
        responses.append(trace[-1])
        traces.append(trace)
    best = int(np.argmax(sign * np.asarray(responses)))
    even = None
    if images:
        whole = plan.input_array().global_box
        x = plan.grid.comm.bcast(images[best] if plan.grid.comm.Get_rank() == 0 else None)
        mine = x[..., None][plan.input_owned.slices_in(whole)]
        r_neg = response_and_gradient(plan, params, -mine, layer, position)[0]
        even = bool(abs(r_neg - responses[best]) <= 1e-5 * max(1.0, abs(responses[best])))
    return {"images": None if images and images[0] is None else np.stack(images) if images else None,
            "responses": responses, "traces": traces, "best": best, "even": even}


def face_correlation(images: np.ndarray, mean_face: np.ndarray, even: bool) -> np.ndarray:
    """Pearson correlation over pixels of each image (n, H, W[, C]) with ``mean_face``; its absolute
    value when the neuron's response is even in the input (``even``: the stimulus has no sign)."""
    a = np.asarray(images, np.float64).reshape(len(images), -1)
    b = np.asarray(mean_face, np.float64).ravel()
    a = a - a.mean(axis=1, keepdims=True)
    b = b - b.mean()
    r = (a @ b) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b), 1e-300)
    return np.abs(r) if even else r


def mean_norm(images: np.ndarray) -> float:
    """The mean L2 norm of (n, H, W, C) images: the stimulus gets the norm of a typical input."""
    return float(np.mean(np.sqrt(np.sum(np.square(images.reshape(len(images), -1), dtype=np.float64), axis=1))))
