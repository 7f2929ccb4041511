"""The sparse-autoencoder objective of one stage (DESIGN.md section 3) and its gradient.

    h = F_w(x),   x_hat = F_{w'}^T(h),   p = P(h)   (L2 pool with eps > 0)
    J = (1/N) sum_n [ ||x_hat_n - x_n||^2 + lam * sum_u p_{u,n} ]

F is the stage's block locally-connected filter, F^T its adjoint (backward-data);
tied weights w' = w by default.  The gradient by the chain rule, with r = x_hat - x:

    dx_hat = 2 r / N
    dh     = F_{w'}(dx_hat) + P^T(lam / N)               (decoder + sparsity)
    dJ/dw  = dW_F(x, dh) [+ dW_F(dx_hat, h) if tied]     (encoder [+ decoder])
    dJ/dw' = dW_F(dx_hat, h)                              (untied)

where dW_F(a, b) is the filter's backward-weights with input a and output gradient b.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import backend
from ..array.collective import sum_values
from ..array.distarray import DistArray
from ..array.grid import ProcessGrid
from ..checks import pair
from ..nn.layers import LCN, L2Pool, LocalFilter
from ..nn.network import Network, Stage
from ..nn.plan import NetworkPlan
from ..ops.residual import residual
from . import vitals


@dataclass
class LossParts:
    """The loss terms per image, and what they are measured against."""

    total: float
    reconstruction: float
    sparsity: float
    #: ||x||^2 per image: reconstruction / signal is the relative reconstruction error
    signal: float = float("nan")
    #: the mean pooled activation per image (sparsity without lam)
    pooled: float = float("nan")
    #: some unit of this rank varies over the batch (or, with one image, is non-zero): not silent
    active: bool = True


@dataclass
class PendingLoss:
    """This rank's loss sums (reconstruction, pooled, signal) and its :func:`vitals.active` verdict,
    not read back yet: 0-d arrays of the step's library (device work queued, e.g. in a CUDA graph).
    :meth:`StageObjective.loss` reads them and sums them over the grid."""

    sums: tuple[Any, Any, Any]
    active: Any


class StageObjective:
    """The objective of stage ``stage`` of a network laid out by ``plan``, over its process grid.

    Written with the plan's distributed operations only (the encoder sub-plan, the
    filter's adjoint, the pool): the plan does every exchange.  The input of the stage
    is this rank's owned block of the stage input (the output of the previous stage,
    or the images); the loss terms are summed over the grid.
    """

    def __init__(self, plan: NetworkPlan, stage: int, lam: float, tied: bool = True):
        self.plan, self.stage, self.lam, self.tied = plan, stage, float(lam), tied
        self.f = plan.network.layer_index(stage, "filter")
        self.p = plan.network.layer_index(stage, "pool")
        if self.p != self.f + 1:
            raise ValueError(f"stage {stage}: the objective needs the pool right after the filter")
        eps = plan.layers[self.p].layer.eps
        if not float(eps) > 0:
            raise ValueError(f"stage {stage}: the pool eps must be > 0 for training, got {eps}")

    def value_and_grad(self, x: DistArray, w: Any, w_dec: Any | None = None, *, pending: bool = False):
        """(LossParts, dJ/dw local[, dJ/dw' local]) on this rank's sites.

        The gradients are the plan's buffers (:meth:`~cotsdl.nn.plan.NetworkPlan.buffer`): valid
        until the next call on the same plan; copy them to keep them longer.  ``pending``: a
        :class:`PendingLoss` in place of the LossParts, nothing read back to the host and no message
        sent (device work only; :meth:`loss` then makes the LossParts).
        """
        plan, f, p, dt = self.plan, self.f, self.p, self.plan.dtype
        xp = backend.array_module(x.data)
        N = plan.batch
        dec = w if w_dec is None else w_dec
        h, enc = plan.forward(x, {f: w}, start=f, upto=p)  # h = F_w(x)
        pool: dict[str, Any] = {}

        def pool_forward() -> None:  # p = P(h), while the decoder's sums travel
            pool["p"], pool["tape"] = plan.forward(h, {}, start=p, upto=p + 1)

        xh = plan.adjoint(f, h, dec, meanwhile=pool_forward)  # x_hat = F_{w'}^T(h)
        pooled, pool_tape = pool["p"], pool["tape"]
        xo = x.owned_data
        lend = plan.outputs.empty  # the step's arrays in the plan's lent memory (plan.step())
        dxh_data = lend(xo.shape, dt, xp)
        rec, sig = residual(xh.data, xo, 2.0 / N, dxh_data, read=not pending)  # dx_hat = 2 r / N, the sums
        parts: LossParts | PendingLoss = PendingLoss(
            (rec, pooled.data.sum(), sig), vitals.active_array(h.owned_data) if pending else vitals.active(h.owned_data))
        if not pending:
            parts = self.loss(parts)
        # backward
        dxh = DistArray(x.comm, xh.shape, xh.window, xh.owned, data=dxh_data)
        dh, dec_tape = plan.forward(dxh, {f: dec}, start=f, upto=p)  # F_{w'}(dx_hat), the decoder's transpose
        ones = lend(pooled.data.shape, dt, xp)
        ones.fill(dt.type(self.lam / N))
        dp = DistArray(x.comm, pooled.shape, pooled.window, pooled.owned, data=ones)

        # The gradients go into the plan's buffers (the same memory every step): the caller uses them
        # before the next call.  Fresh ones cost the paper's layer 0.8 GB of page faults each.
        into_enc = {f: plan.buffer(("objective", f, "dw"), w)}
        dec_grads: dict[int, Any] = {}
        decoder_grad = also = None
        if w_dec is None:
            # Tied: the decoder's weight gradient, dW_F(dx_hat, h), is summed with the encoder's in its
            # pass (one reduction over both pairs' images, the gradient written once): P-paper's step
            # wrote and re-read its 0.8 GB gradient in a second pass before.
            also = {f: (dec_tape.inputs[f - dec_tape.first], h.data)}
        else:
            into_dec = {f: plan.buffer(("objective", f, "dw_dec"), dec)}

            def decoder_grad() -> None:  # dW_F(dx_hat, h), while the sparsity gradient travels
                dec_grads.update(plan.backward(h, dec_tape, {f: dec}, input_grad=False, grads_into=into_dec)[1])

        dh_sparsity, _ = plan.backward(dp, pool_tape, {}, meanwhile=decoder_grad)  # P^T(lam / N)
        dh.data += dh_sparsity.data
        _, enc_grads = plan.backward(dh, enc, {f: w}, input_grad=False, grads_into=into_enc,
                                     also=also)  # dW_F(x, dh) [+ the decoder's, tied]
        return (parts, enc_grads[f]) if w_dec is None else (parts, enc_grads[f], dec_grads[f])

    def loss(self, parts: "LossParts | PendingLoss") -> LossParts:
        """The loss terms per image of :meth:`value_and_grad`'s ``parts``: pending sums read and summed
        over the grid (one allreduce); LossParts as they are."""
        if isinstance(parts, LossParts):
            return parts
        N = self.plan.batch
        rec, spa, sig = sum_values(self.plan.grid.comm, parts.sums)
        return LossParts((rec + self.lam * spa) / N, rec / N, self.lam * spa / N, sig / N, spa / N,
                         bool(parts.active))


@lru_cache(maxsize=16)
def _one_process_plan(in_shape: tuple[int, ...], size: tuple[int, int], stride: tuple[int, int],
                      block: tuple[int, int], channels: int, pool_size: tuple[int, int],
                      pool_stride: tuple[int, int], eps: float, dtype: str) -> NetworkPlan:
    # The stage's LCN is never evaluated by the objective: a 1-pixel window stands in for it.
    stage = Stage(LocalFilter(size, stride, channels, block), L2Pool(pool_size, pool_stride, eps), LCN(1, 1.0))
    grid = ProcessGrid(MPI.COMM_SELF, (1, 1))
    return NetworkPlan(Network(in_shape[:3], [stage]), grid, in_shape[3], np.dtype(dtype))


def sparse_ae_loss(x, w, *, stride, block=(1, 1), pool_size, pool_stride, lam, eps, w_dec=None, copy=True):
    """J and dJ/dw for one process (tied weights; with ``w_dec``, untied: returns (J, dw, dw_dec)).

    ``x`` is (H, W, C, N); ``w`` the filter weights (SH, SW, M, rh, rw, C).  It is the
    1x1-grid case of :class:`StageObjective`: the same code on a one-rank plan (cached per
    shape).  ``copy=False`` returns that plan's gradient buffers instead of copies: no
    allocation per call, but the next call with the same shapes overwrites them.
    """
    if not float(eps) > 0:
        raise ValueError(f"eps must be > 0 (it keeps the pooled sparsity differentiable), got {eps!r}")
    block = pair("block", block)
    plan = _one_process_plan(tuple(x.shape), tuple(w.shape[3:5]), pair("stride", stride), block,
                             w.shape[2] // (block[0] * block[1]), pair("pool_size", pool_size),
                             pair("pool_stride", pool_stride), float(eps), np.dtype(x.dtype).name)
    xin = plan.input_array(backend.array_module(x).ascontiguousarray(x))
    with plan.step():  # activations in memory the plan lends from call to call
        out = StageObjective(plan, 0, lam).value_and_grad(xin, w, w_dec)
    return (out[0].total,) + tuple(g.copy() if copy else g for g in out[1:])
