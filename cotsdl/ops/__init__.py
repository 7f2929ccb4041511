"""Functional operations on (H, W, C, N) arrays: filter, L2 pool, LCN, forward and backward.

Array in, array out, float32 or float64; the math is DESIGN.md section 3.  They
dispatch on the array type: NumPy arrays run on the numpy backend, CuPy arrays on the
CUDA kernels (``cuda/``); with ``COTSDL_BACKEND=cuda-emu`` NumPy arrays run through the
CUDA kernels on the CPU emulator.
``ops`` knows nothing of MPI: distribution is orchestrated by ``cotsdl.nn``.  It
uses only the pure index algebra of ``cotsdl.array.box``.

Forward (public, stable signatures)::

    local_filter(x, w, stride, block=(1, 1))
    l2_pool(x, size, stride, eps)
    lcn(x, size, sigma, eps)

Backward::

    local_filter_backward_data(dy, w, stride, block=(1, 1), *, input_shape)  -> dx
    local_filter_backward_weights(x, dy, size, stride, block=(1, 1))        -> dw
    l2_pool_backward(dy, x, y, size, stride)                                  -> dx
    lcn_backward(dy, x, size, sigma, eps)                                     -> dx

``local_filter_backward_data`` is also the adjoint (transpose) of the filter, the
decoder of a tied-weight autoencoder.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import backend
from ..array.box import Box
from . import _args, cudakernels as _cuda, filtering as _filter, normalization as _lcn, pooling as _pool
from .costs import Cost
from .parallel import num_threads, set_num_threads

__all__ = ["local_filter", "local_filter_backward_data", "local_filter_backward_weights", "l2_pool",
           "l2_pool_backward", "lcn", "lcn_backward", "Cost", "num_threads", "set_num_threads"]


def _kernels(*arrays: Any) -> bool:
    """Run on the CUDA kernels (CuPy arrays, or COTSDL_BACKEND=cuda-emu)?"""
    dev = [backend.is_device_array(a) for a in arrays]
    if any(dev) and not all(dev):
        raise ValueError("arrays must all be host (NumPy) or all device (CuPy) arrays")
    return backend.uses_kernels(arrays[0])


def local_filter(x, w, stride, block=(1, 1)):
    """Block locally-connected filter: y (SH*bh, SW*bw, K, N) from x (H, W, C, N), w (SH, SW, M, rh, rw, C)."""
    _args.activations("x", x)
    _args.same_dtype(x=x, w=w)
    impl = _cuda.filter_forward if _kernels(x, w) else _filter.forward
    return impl(x, w, _args.pair("stride", stride), _args.pair("block", block))


def local_filter_backward_data(dy, w, stride, block=(1, 1), *, input_shape: Sequence[int]):
    """Gradient w.r.t. x (shape ``input_shape[:2] + (C, N)``), i.e. the filter's adjoint applied to dy."""
    _args.activations("dy", dy)
    _args.same_dtype(dy=dy, w=w)
    impl = _cuda.filter_backward_data if _kernels(dy, w) else _filter.backward_data
    return impl(dy, w, _args.pair("stride", stride), _args.pair("block", block), input_shape)


def local_filter_backward_weights(x, dy, size, stride, block=(1, 1)):
    """Gradient w.r.t. the weights, (SH, SW, M, rh, rw, C)."""
    _args.activations("x", x)
    _args.activations("dy", dy)
    _args.same_dtype(x=x, dy=dy)
    impl = _cuda.filter_backward_weights if _kernels(x, dy) else _filter.backward_weights
    return impl(x, dy, _args.pair("size", size), _args.pair("stride", stride), _args.pair("block", block))


def l2_pool(x, size, stride, eps):
    """L2 pooling: y (PH, PW, C, N) = sqrt(eps + window sums of x^2)."""
    _args.activations("x", x)
    size = _args.pair("size", size)
    _args.fits("pooling size", x.shape[:2], size)
    impl = _cuda.pool_forward if _kernels(x) else _pool.forward
    return impl(x, size, _args.pair("stride", stride), _args.nonneg("eps", eps))


def l2_pool_backward(dy, x, y, size, stride):
    """Gradient w.r.t. x given dy, the input x and the output y of :func:`l2_pool`."""
    _args.activations("x", x)
    _args.same_dtype(dy=dy, x=x, y=y)
    size, stride = _args.pair("size", size), _args.pair("stride", stride)
    _pool.check_backward(dy, x, y, size, stride)
    impl = _cuda.pool_backward if _kernels(dy, x, y) else _pool.backward
    return impl(dy, x, y, size, stride)


def _lcn_args(x, size, sigma, eps) -> tuple[int, float, float]:
    _args.activations("x", x)
    if not isinstance(size, (int, np.integer)) or size < 1 or size % 2 == 0:
        raise ValueError(f"size must be an odd positive integer (the window width), got {size!r}")
    if not float(sigma) > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    return int(size), float(sigma), _args.nonneg("eps", eps)


def lcn(x, size, sigma, eps):
    """Local contrast normalization of whole images (output has x's shape)."""
    size, sigma, eps = _lcn_args(x, size, sigma, eps)
    whole = Box((0, 0), x.shape[:2])
    return _lcn.forward_local(x, whole, whole, x.shape[:2], size, sigma, eps)[0]


def lcn_backward(dy, x, size, sigma, eps):
    """Gradient w.r.t. x of :func:`lcn` (recomputes the forward pass)."""
    size, sigma, eps = _lcn_args(x, size, sigma, eps)
    _args.same_dtype(dy=dy, x=x)
    whole = Box((0, 0), x.shape[:2])
    _, cache = _lcn.forward_local(x, whole, whole, x.shape[:2], size, sigma, eps)
    return _lcn.backward_local(dy, cache)
