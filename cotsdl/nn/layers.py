"""Layer objects: hyper-parameters, shapes, receptive-field maps, costs, local compute.

A layer maps an (H, W, C, N) input to an (H', W', K, N) output.  Its output is
partitioned over the process grid in *sites* (filter receptive fields, pooling windows,
pixels), each site writing a ``block`` of output pixels; its receptive-field map
gives the input window an output box needs.  ``forward_local``/``backward_local``
compute on a rank's input window and owned output box with :mod:`cotsdl.ops`;
they know nothing of MPI except the ``allreduce`` callable they are handed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .. import backend, ops
from ..array.box import Box
from ..array.rfmap import RFMap
from ..checks import nonneg, pair, positive_int
from ..ops import costs
from ..ops.shapes import lcn_params

Reduce = Callable[[np.ndarray], np.ndarray]


def _zeros(like: Any, shape) -> Any:
    """Zeros of ``shape`` in the array library and dtype of ``like`` (NumPy or CuPy)."""
    return backend.array_module(like).zeros(tuple(shape), like.dtype)


@dataclass
class Context:
    """What a layer needs besides its input: boxes in global coordinates and the group reduction."""

    in_shape: tuple[int, int, int, int]
    window: Box  # the input window (4-D)
    out: Box  # the owned output box (4-D)
    allreduce: Reduce | None = None
    params: Any = None  # the local weights of a filter
    workspace: Any = None  # the layer's scratch arrays (ops.Workspace), held by the plan


@dataclass(frozen=True)
class LocalFilter:
    """Block locally-connected filter: ``size`` receptive field, ``stride``, ``block`` (bh, bw), ``channels`` K."""

    size: tuple[int, int]
    stride: tuple[int, int]
    channels: int
    block: tuple[int, int] = (1, 1)
    kind: str = field(default="filter", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", pair("filter size", self.size))
        object.__setattr__(self, "stride", pair("filter stride", self.stride))
        object.__setattr__(self, "block", pair("filter block", self.block))
        positive_int("filter channels", self.channels)

    @property
    def rf(self) -> RFMap:
        return RFMap(self.size, self.stride, self.block)

    @property
    def unit_block(self) -> tuple[int, int]:
        return self.block

    def sites(self, in_shape) -> tuple[int, int]:
        return self.rf.sites(in_shape[:2])

    def out_shape(self, in_shape) -> tuple[int, ...]:
        sh, sw = self.sites(in_shape)
        return (sh * self.block[0], sw * self.block[1], self.channels) + tuple(in_shape[3:])

    def weight_shape(self, in_shape) -> tuple[int, ...]:
        sh, sw = self.sites(in_shape)
        return (sh, sw, self.block[0] * self.block[1] * self.channels, self.size[0], self.size[1], in_shape[2])

    def cost(self, in_shape, itemsize: int = 4) -> dict[str, costs.Cost]:
        H, W, C, N = in_shape
        return costs.local_filter(H, W, C, N, self.size, self.stride, self.block, self.channels, itemsize)

    def forward_local(self, x: np.ndarray, ctx: Context):
        if ctx.out.is_empty:
            return _zeros(x, ctx.out.shape), None
        return ops.local_filter(x, ctx.params, self.stride, self.block, workspace=ctx.workspace), None

    def adjoint_local(self, h: np.ndarray, ctx: Context):
        """The filter's adjoint (backward-data) on this rank's sites: h on the owned output box ->
        contributions on the input window (to be summed into the owners)."""
        if ctx.out.is_empty:
            return _zeros(h, ctx.window.shape)
        return ops.local_filter_backward_data(h, ctx.params, self.stride, self.block, input_shape=ctx.window.shape,
                                              workspace=ctx.workspace)

    def weight_grad_local(self, x: np.ndarray, dy: np.ndarray, ctx: Context, out: Any = None,
                          accumulate: bool = False, also: tuple[Any, Any] | None = None):
        """dW on this rank's sites from its input window ``x`` and ``dy`` on its owned output (into
        ``out``; ``accumulate``: added to it; ``also``: a second (window, dy) pair's added, in the
        same pass)."""
        if ctx.out.is_empty:
            if out is None:
                return _zeros(dy, ctx.params.shape)
            if not accumulate:
                out[...] = 0
            return out
        return ops.local_filter_backward_weights(x, dy, self.size, self.stride, self.block, workspace=ctx.workspace,
                                                 out=out, accumulate=accumulate, also=also)

    def backward_local(self, dy: np.ndarray, x: np.ndarray, y: np.ndarray, cache, ctx: Context,
                       input_grad: bool = True):
        dx = self.adjoint_local(dy, ctx) if input_grad else None
        return dx, self.weight_grad_local(x, dy, ctx)


@dataclass(frozen=True)
class L2Pool:
    """L2 pooling over ``size`` windows with ``stride``, ``eps`` inside the square root."""

    size: tuple[int, int]
    stride: tuple[int, int]
    eps: float = 0.0
    kind: str = field(default="pool", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", pair("pool size", self.size))
        object.__setattr__(self, "stride", pair("pool stride", self.stride))
        nonneg("pool eps", self.eps)

    @property
    def rf(self) -> RFMap:
        return RFMap(self.size, self.stride, mixes_channels=False)

    unit_block = (1, 1)

    def sites(self, in_shape) -> tuple[int, int]:
        return self.rf.sites(in_shape[:2])

    def out_shape(self, in_shape) -> tuple[int, ...]:
        return tuple(self.sites(in_shape)) + tuple(in_shape[2:])

    def cost(self, in_shape, itemsize: int = 4) -> dict[str, costs.Cost]:
        H, W, C, N = in_shape
        return costs.l2_pool(H, W, C, N, self.size, self.stride, itemsize)

    def forward_local(self, x: np.ndarray, ctx: Context):
        if ctx.out.is_empty:
            return _zeros(x, ctx.out.shape), None
        return ops.l2_pool(x, self.size, self.stride, self.eps, workspace=ctx.workspace), None

    def backward_local(self, dy, x, y, cache, ctx: Context, input_grad: bool = True):
        if not input_grad:  # no weights: nothing else to compute
            return None, None
        if ctx.out.is_empty:
            return _zeros(dy, ctx.window.shape), None
        return ops.l2_pool_backward(dy, x, y, self.size, self.stride, workspace=ctx.workspace), None


@dataclass(frozen=True)
class LCN:
    """Local contrast normalization: odd window ``size``, Gaussian ``sigma``, floor ``eps``."""

    size: int
    sigma: float
    eps: float = 1e-4
    kind: str = field(default="lcn", init=False)

    def __post_init__(self) -> None:
        lcn_params(self.size, self.sigma, self.eps, prefix="lcn ")

    @property
    def rf(self) -> RFMap:
        # y on a box needs v on the box + rho, hence x on the box + 2*rho.
        r = self.size // 2
        return RFMap((4 * r + 1,) * 2, (1, 1), (1, 1), (2 * r, 2 * r))

    unit_block = (1, 1)

    def sites(self, in_shape) -> tuple[int, int]:
        return tuple(in_shape[:2])  # type: ignore[return-value]

    def out_shape(self, in_shape) -> tuple[int, ...]:
        return tuple(in_shape)

    def cost(self, in_shape, itemsize: int = 4) -> dict[str, costs.Cost]:
        H, W, C, N = in_shape
        return costs.lcn(H, W, C, N, self.size, itemsize)

    def _boxes(self, ctx: Context) -> tuple[Box, Box]:
        sp = lambda b: Box(b.lo[:2], b.hi[:2]) if not b.is_empty else Box.empty(2)  # noqa: E731
        return sp(ctx.window), sp(ctx.out)

    def forward_local(self, x: np.ndarray, ctx: Context):
        win, out = self._boxes(ctx)
        if ctx.out.is_empty:  # no pixels, but the group reduction must still be joined
            x = _zeros(x, (0, 0) + tuple(ctx.in_shape[2:]))
        y, cache = ops.lcn_window(x, win, out, ctx.in_shape[:2], self.size, self.sigma, self.eps, ctx.allreduce,
                                  workspace=ctx.workspace)
        return y if not ctx.out.is_empty else _zeros(x, ctx.out.shape), cache

    def backward_local(self, dy, x, y, cache, ctx: Context, input_grad: bool = True):
        # computed even without input_grad: the group reduction inside must be joined by every rank
        if ctx.out.is_empty:
            dy = _zeros(dy, (0, 0) + tuple(ctx.in_shape[2:]))
        dx = ops.lcn_window_backward(dy, cache, ctx.allreduce)
        return (dx if not ctx.out.is_empty else _zeros(dy, ctx.window.shape)), None
