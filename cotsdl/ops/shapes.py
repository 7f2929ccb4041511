"""Shapes and argument checks of the operations, shared by both backends.

Every backend validates here, so a mistake gets the same message on the CPU and
on the GPU, and the kernels can trust their arguments.  Output extents come from
the one formula, :func:`cotsdl.array.rfmap.sites`.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..array.rfmap import sites
from ..checks import nonneg, odd_size, positive

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def activations(name: str, x: Any, ndim: int = 4) -> None:
    """``x`` is a float32/float64 array of rank ``ndim`` ((H, W, C, N) by default)."""
    if getattr(x, "ndim", None) != ndim:
        raise ValueError(f"{name} must be a {ndim}-D array, got shape {getattr(x, 'shape', None)}")
    if np.dtype(x.dtype) not in FLOATS:
        raise ValueError(f"{name} must be float32 or float64, got {x.dtype}")


def same_dtype(**arrays: Any) -> np.dtype:
    """All arrays share one float dtype (no silent float32 -> float64 promotion)."""
    dtypes = {name: np.dtype(a.dtype) for name, a in arrays.items()}
    if len(set(dtypes.values())) != 1:
        raise ValueError("dtypes differ: " + ", ".join(f"{k}={v}" for k, v in dtypes.items()))
    return next(iter(dtypes.values()))


def out_array(out: Any, shape: Sequence[int], dtype: Any) -> None:
    """``out`` (when given) is a C-contiguous array of ``shape`` and ``dtype`` to write a result into."""
    if out is None:
        return
    if tuple(getattr(out, "shape", ())) != tuple(shape) or np.dtype(getattr(out, "dtype", None)) != np.dtype(dtype) \
            or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous {np.dtype(dtype)} array of shape {tuple(shape)}, got "
                         f"{getattr(out, 'dtype', None)} {tuple(getattr(out, 'shape', ()))}")


def fits(name: str, extent: Sequence[int], window: Sequence[int]) -> None:
    """``window`` fits inside the spatial ``extent``."""
    if any(e < w for e, w in zip(extent, window)):
        raise ValueError(f"{name} {tuple(window)} is larger than the input's spatial extent {tuple(extent)}")


def window_sites(hw: Sequence[int], size: Sequence[int], stride: Sequence[int]) -> tuple[int, int]:
    """Sites (SH, SW) of a window ``size`` moved by ``stride`` over an ``hw`` input (no padding)."""
    return sites(hw[0], size[0], stride[0]), sites(hw[1], size[1], stride[1])


# -- the filter ------------------------------------------------------------------
def check_weights(x_shape: Sequence[int], w: Any, stride: tuple[int, int], block: tuple[int, int]) -> tuple[int, ...]:
    """Validate ``w`` against an input of ``x_shape``; return (SH, SW, M, rh, rw, C, K)."""
    if getattr(w, "ndim", None) != 6:
        raise ValueError(f"w must be a 6-D array (SH, SW, M, rh, rw, C), got shape {getattr(w, 'shape', None)}")
    sh_, sw_, m, rh, rw, c = w.shape
    H, W, C = x_shape[:3]
    if c != C:
        raise ValueError(f"w has {c} input channels, x has {C}")
    fits("receptive field", (H, W), (rh, rw))
    SH, SW = window_sites((H, W), (rh, rw), stride)
    if (sh_, sw_) != (SH, SW):
        raise ValueError(f"w has {sh_}x{sw_} sites; an input of {H}x{W} with receptive field {rh}x{rw} and "
                         f"stride {stride} has {SH}x{SW}")
    if m % (block[0] * block[1]):
        raise ValueError(f"w has M={m} neurons per site, not a multiple of the block {block[0]}x{block[1]}")
    return SH, SW, m, rh, rw, c, m // (block[0] * block[1])


def check_backward_data(dy_shape: Sequence[int], w: Any, stride, block, input_shape) -> tuple[int, ...]:
    """Validate backward-data's arguments; return (SH, SW, M, rh, rw, C, K)."""
    H, W = int(input_shape[0]), int(input_shape[1])
    SH, SW, M, rh, rw, C, K = check_weights((H, W, w.shape[5]), w, stride, block)
    if tuple(dy_shape[:3]) != (SH * block[0], SW * block[1], K):
        raise ValueError(f"dy has shape {tuple(dy_shape[:3])} (+N), expected {(SH * block[0], SW * block[1], K)} "
                         "for these weights")
    return SH, SW, M, rh, rw, C, K


def check_backward_weights(x_shape: Sequence[int], dy_shape: Sequence[int], size, stride, block) -> tuple[int, int, int]:
    """Validate backward-weights' arguments; return (SH, SW, K)."""
    H, W, C, N = x_shape
    fits("receptive field", (H, W), size)
    SH, SW = window_sites((H, W), size, stride)
    if dy_shape[0] != SH * block[0] or dy_shape[1] != SW * block[1] or dy_shape[3] != N:
        raise ValueError(f"dy has shape {tuple(dy_shape)}, expected ({SH * block[0]}, {SW * block[1]}, K, {N}) for x "
                         f"{tuple(x_shape)}, size {tuple(size)}, stride {tuple(stride)}, block {tuple(block)}")
    return SH, SW, int(dy_shape[2])


# -- L2 pooling --------------------------------------------------------------------
def check_pool_backward(dy, x, y, size, stride) -> None:
    """y and dy must be the pooled shape of x (the kernel trusts it)."""
    H, W, C, N = x.shape
    PH, PW = window_sites((H, W), size, stride)
    if tuple(y.shape) != (PH, PW, C, N) or tuple(dy.shape) != tuple(y.shape):
        raise ValueError(f"l2_pool_backward: y {tuple(y.shape)} and dy {tuple(dy.shape)} must both be "
                         f"{(PH, PW, C, N)} for x {tuple(x.shape)}, size {tuple(size)}, stride {tuple(stride)}")


# -- LCN ---------------------------------------------------------------------------
def lcn_params(size: Any, sigma: Any, eps: Any, prefix: str = "") -> tuple[int, float, float]:
    """LCN's hyper-parameters checked: odd window ``size``, ``sigma`` > 0, ``eps`` >= 0."""
    return odd_size(prefix + "size", size), positive(prefix + "sigma", sigma), nonneg(prefix + "eps", eps)
