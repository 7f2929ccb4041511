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

import numpy as np
from mpi4py import MPI

from .. import backend, ops
from ..array.distarray import DistArray
from ..nn.plan import NetworkPlan


def sparse_ae_loss(x, w, *, stride, block=(1, 1), pool_size, pool_stride, lam, eps, w_dec=None):
    """J and dJ/dw for one process (tied weights; with ``w_dec``, untied: returns (J, dw, dw_dec)).

    ``x`` is (H, W, C, N); ``w`` the filter weights (SH, SW, M, rh, rw, C).
    """
    if not float(eps) > 0:
        raise ValueError(f"eps must be > 0 (it keeps the pooled sparsity differentiable), got {eps!r}")
    size = w.shape[3:5]
    N = x.shape[3]
    xp = backend.array_module(x)
    dec = w if w_dec is None else w_dec
    h = ops.local_filter(x, w, stride, block)
    xh = ops.local_filter_backward_data(h, dec, stride, block, input_shape=x.shape)
    r = xh - x
    p = ops.l2_pool(h, pool_size, pool_stride, eps)
    dt = x.dtype.type
    J = (float((r * r).sum()) + float(lam) * float(p.sum())) / N
    dxh = r * dt(2.0 / N)
    dh = ops.local_filter(dxh, dec, stride, block)
    dh += ops.l2_pool_backward(xp.full(p.shape, dt(float(lam) / N), x.dtype), h, p, pool_size, pool_stride)
    dw = ops.local_filter_backward_weights(x, dh, size, stride, block)
    dw_dec = ops.local_filter_backward_weights(dxh, h, size, stride, block)
    if w_dec is None:
        return J, dw + dw_dec
    return J, dw, dw_dec


@dataclass
class LossParts:
    total: float
    reconstruction: float
    sparsity: float


class StageObjective:
    """The objective of stage ``stage`` of a network laid out by ``plan``, over its process grid.

    The input of the stage is this rank's owned block of the stage input (the output of
    the previous stage, or the images).  The decoder output of each rank's sites lands
    in its input window and is summed back to the owners with the adjoint exchange;
    the loss terms are reduced over the grid.
    """

    def __init__(self, plan: NetworkPlan, stage: int, lam: float, tied: bool = True):
        self.plan, self.stage, self.lam, self.tied = plan, stage, float(lam), tied
        self.filt = plan.layers[3 * stage]
        self.pool = plan.layers[3 * stage + 1]
        self.comm = plan.grid.comm
        if not float(self.pool.layer.eps) > 0:
            raise ValueError(f"stage {stage}: the pool eps must be > 0 for training, got {self.pool.layer.eps}")

    def _reduce(self, *values: float) -> np.ndarray:
        a = np.array(values, dtype=np.float64)
        self.comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
        return a

    def value_and_grad(self, x: DistArray, w: np.ndarray, w_dec: np.ndarray | None = None):
        """(LossParts, dJ/dw local[, dJ/dw' local]) on this rank's sites."""
        f, pl = self.filt, self.pool
        layer, dt = f.layer, self.plan.dtype
        xp = backend.array_module(x.data)
        N = self.plan.batch
        dec = w if w_dec is None else w_dec
        ctx = self.plan.context(f, {f.index: w})
        ctx_dec = self.plan.context(f, {f.index: dec})
        xwin = DistArray(x.comm, f.in_shape, f.window, data=xp.empty(f.window.shape, dt))
        f.exchange.exchange(x, xwin, validate=False)
        h, _ = layer.forward_local(xwin.data, ctx)
        empty = f.out.is_empty
        # decoder: adjoint of the filter, summed into the owners of the stage input
        xh_win = (xp.zeros(f.window.shape, dt) if empty else
                  ops.local_filter_backward_data(h, dec, layer.stride, layer.block, input_shape=xwin.data.shape))
        xh = DistArray(x.comm, f.in_shape, f.src_owned, f.src_owned, data=xp.empty(f.src_owned.shape, dt))
        f.exchange.exchange_adjoint(DistArray(x.comm, f.in_shape, f.window, data=xh_win.astype(dt, copy=False)), xh,
                                    validate=False)
        r = xh.data - x.owned_data
        # sparsity: L2 pool of h over the pool's windows
        hwin = DistArray(x.comm, pl.in_shape, pl.window, data=xp.empty(pl.window.shape, dt))
        pl.exchange.exchange(DistArray(x.comm, f.out_shape, f.out, f.out, data=h), hwin, validate=False)
        p, _ = pl.layer.forward_local(hwin.data, self.plan.context(pl, None))
        rec, spa = self._reduce(float((r * r).sum()), float(p.sum()))
        parts = LossParts((rec + self.lam * spa) / N, rec / N, self.lam * spa / N)
        # backward
        dxh = DistArray(x.comm, f.in_shape, f.src_owned, f.src_owned, data=(r * dt.type(2.0 / N)).astype(dt, copy=False))
        dxh_win = DistArray(x.comm, f.in_shape, f.window, data=xp.empty(f.window.shape, dt))
        f.exchange.exchange(dxh, dxh_win, validate=False)
        dh = layer.forward_local(dxh_win.data, ctx_dec)[0]
        dp = xp.full(p.shape, dt.type(self.lam / N), dt)
        dh_win, _ = pl.layer.backward_local(dp, hwin.data, p, None, self.plan.context(pl, None))
        dh_sp = DistArray(x.comm, f.out_shape, f.out, f.out, data=xp.empty(f.out.shape, dt))
        pl.exchange.exchange_adjoint(DistArray(x.comm, pl.in_shape, pl.window, data=dh_win), dh_sp, validate=False)
        dh = dh + dh_sp.data

        def dweights(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            if empty:
                return xp.zeros(w.shape, dt)
            return ops.local_filter_backward_weights(a, b, layer.size, layer.stride, layer.block)

        dw, dw_dec = dweights(xwin.data, dh), dweights(dxh_win.data, h)
        if w_dec is None:
            return parts, dw + dw_dec
        return parts, dw, dw_dec
