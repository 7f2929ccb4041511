"""Functional operations on (H, W, C, N) arrays: filter, L2 pool, LCN, forward and backward.

Array in, array out, float32 or float64; the math is DESIGN.md section 3.  This module
is the public face and the one dispatcher: arguments are checked here and in
:mod:`~cotsdl.ops.shapes` (shared by both backends), then each op runs on

=====================  ===========================  ==============================
op                     numpy backend (CPU)          CUDA backend (GPU or emulator)
=====================  ===========================  ==============================
filter (3 passes)      ``ops/cpu/filter.py``        ``ops/cuda/filter.py`` + ``cuda/filter.cu``
L2 pool (2 passes)     ``ops/cpu/pool.py``          ``ops/cuda/pool.py`` + ``cuda/pool.cu``
LCN smoothing passes   ``ops/cpu/lcn.py``           ``ops/cuda/lcn.py`` + ``cuda/lcn.cu``
LCN algebra            ``ops/lcn.py`` (either array library)
autoencoder residual   ``ops/residual.py`` (either array library; a native pass on the CPU)
=====================  ===========================  ==============================

chosen by :func:`cotsdl.ops._dispatch.implementation` from the arrays (CuPy arrays: the
CUDA backend; NumPy arrays: numpy, or the CUDA wrappers on the emulator when the
process runs the ``cuda-emu`` backend).  ``ops`` knows nothing of MPI: distribution is
orchestrated by :mod:`cotsdl.nn.plan`; LCN's per-image sums go through the
``allreduce`` callable it is handed.

Forward (public, stable signatures)::

    local_filter(x, w, stride, block=(1, 1), *, workspace=None)
    l2_pool(x, size, stride, eps)
    lcn(x, size, sigma, eps)

Backward::

    local_filter_backward_data(dy, w, stride, block=(1, 1), *, input_shape)  -> dx
    local_filter_backward_weights(x, dy, size, stride, block=(1, 1), *, out=None, accumulate=False,
                                  also=None)                                 -> dw
    l2_pool_backward(dy, x, y, size, stride)                                  -> dx
    lcn_backward(dy, x, size, sigma, eps)                                     -> dx

LCN of a window of a larger, distributed image::

    lcn_window(x, x_box, out, image_hw, size, sigma, eps, allreduce=None)   -> y, cache
    lcn_window_backward(dy, cache, allreduce=None)                            -> dx

``local_filter_backward_data`` is also the adjoint (transpose) of the filter, the
decoder of a tied-weight autoencoder.
"""
from __future__ import annotations

from typing import Sequence

from ..array.box import Box
from ..checks import nonneg, pair
from . import lcn as _lcn
from . import shapes
from ._dispatch import implementation
from .costs import Cost
from .cpu.parallel import available_cores, num_threads, set_num_threads
from .cpu.workspace import Outputs, Workspace

__all__ = ["local_filter", "local_filter_backward_data", "local_filter_backward_weights", "l2_pool",
           "l2_pool_backward", "lcn", "lcn_backward", "lcn_window", "lcn_window_backward", "Cost", "Workspace",
           "Outputs",
           "available_cores", "num_threads", "set_num_threads"]


def local_filter(x, w, stride, block=(1, 1), *, workspace=None):
    """Block locally-connected filter: y (SH*bh, SW*bw, K, N) from x (H, W, C, N), w (SH, SW, M, rh, rw, C).

    ``workspace``: a :class:`Workspace` whose scratch arrays are reused from call to call
    (the numpy backend's gathers and products; the CUDA backend has CuPy's pool and ignores it).
    """
    shapes.activations("x", x)
    shapes.same_dtype(x=x, w=w)
    return implementation(x, w).filter_forward(x, w, pair("stride", stride), pair("block", block), workspace)


def local_filter_backward_data(dy, w, stride, block=(1, 1), *, input_shape: Sequence[int], workspace=None):
    """Gradient w.r.t. x (shape ``input_shape[:2] + (C, N)``), i.e. the filter's adjoint applied to dy."""
    shapes.activations("dy", dy)
    shapes.same_dtype(dy=dy, w=w)
    return implementation(dy, w).filter_backward_data(dy, w, pair("stride", stride), pair("block", block),
                                                      input_shape, workspace)


def local_filter_backward_weights(x, dy, size, stride, block=(1, 1), *, workspace=None, out=None,
                                  accumulate=False, also=None):
    """Gradient w.r.t. the weights, (SH, SW, M, rh, rw, C); written into ``out`` when given (a
    buffer the caller keeps from step to step: the paper's layer has 0.8 GB of weights), else a
    result array like the other passes' (lent by ``workspace``'s outputs during a step).

    ``accumulate``: add the gradient to ``out`` instead.  ``also=(x2, dy2)``: a second pair of
    the same shapes, whose gradient is added in the same pass (a tied autoencoder's encoder
    and decoder: the native kernel runs one reduction twice as long and writes the weights'
    size once, instead of a second pass reading and writing it again).
    """
    shapes.activations("x", x)
    shapes.activations("dy", dy)
    shapes.same_dtype(x=x, dy=dy)
    if also is not None:
        if not (isinstance(also, tuple) and len(also) == 2):
            raise ValueError(f"also must be a pair (x2, dy2), got {type(also).__name__}")
        x2, dy2 = also
        shapes.activations("also x2", x2)
        shapes.activations("also dy2", dy2)
        shapes.same_dtype(x=x, x2=x2, dy2=dy2)
        if tuple(x2.shape) != tuple(x.shape) or tuple(dy2.shape) != tuple(dy.shape):
            raise ValueError(f"also: x2 {tuple(x2.shape)} and dy2 {tuple(dy2.shape)} must have the shapes of "
                             f"x {tuple(x.shape)} and dy {tuple(dy.shape)}")
    size, stride, block = pair("size", size), pair("stride", stride), pair("block", block)
    if accumulate and out is None:
        raise ValueError("accumulate=True needs out= (the gradient to add to)")
    if out is not None:
        SH, SW, K = shapes.check_backward_weights(x.shape, dy.shape, size, stride, block)
        shapes.out_array(out, (SH, SW, block[0] * block[1] * K) + size + (x.shape[2],), x.dtype)
    return implementation(x, dy).filter_backward_weights(x, dy, size, stride, block, workspace, out, bool(accumulate),
                                                          also)


def l2_pool(x, size, stride, eps, *, workspace=None):
    """L2 pooling: y (PH, PW, C, N) = sqrt(eps + window sums of x^2)."""
    shapes.activations("x", x)
    size = pair("size", size)
    shapes.fits("pooling size", x.shape[:2], size)
    return implementation(x).pool_forward(x, size, pair("stride", stride), nonneg("eps", eps), workspace)


def l2_pool_backward(dy, x, y, size, stride, *, workspace=None):
    """Gradient w.r.t. x given dy, the input x and the output y of :func:`l2_pool`."""
    shapes.activations("x", x)
    shapes.same_dtype(dy=dy, x=x, y=y)
    size, stride = pair("size", size), pair("stride", stride)
    shapes.check_pool_backward(dy, x, y, size, stride)
    return implementation(dy, x, y).pool_backward(dy, x, y, size, stride, workspace)


def lcn_window(x, x_box: Box, out: Box, image_hw, size, sigma, eps, allreduce=None, *, workspace=None):
    """LCN of the image (``image_hw`` spatial) restricted to the 2-D box ``out``; ``x`` (h, w, C, N)
    covers ``x_box``, which must contain ``out`` grown by 2*(size//2) (clipped to the image).
    Returns y on ``out`` and the cache for :func:`lcn_window_backward`."""
    shapes.activations("x", x)
    size, sigma, eps = shapes.lcn_params(size, sigma, eps)
    return _lcn.forward_local(x, x_box, out, tuple(image_hw), size, sigma, eps, allreduce, workspace)


def lcn_window_backward(dy, cache, allreduce=None):
    """dx on the cache's input window, given dy on its output box."""
    shapes.activations("dy", dy)
    return _lcn.backward_local(dy, cache, allreduce)


def lcn(x, size, sigma, eps, *, workspace=None):
    """Local contrast normalization of whole images (output has x's shape)."""
    shapes.activations("x", x)
    whole = Box((0, 0), x.shape[:2])
    return lcn_window(x, whole, whole, x.shape[:2], size, sigma, eps, workspace=workspace)[0]


def lcn_backward(dy, x, size, sigma, eps, *, workspace=None):
    """Gradient w.r.t. x of :func:`lcn` (recomputes the forward pass)."""
    shapes.activations("x", x)
    shapes.same_dtype(dy=dy, x=x)
    whole = Box((0, 0), x.shape[:2])
    _, cache = lcn_window(x, whole, whole, x.shape[:2], size, sigma, eps, workspace=workspace)
    return lcn_window_backward(dy, cache)
