"""The CUDA backend of the operations: wrappers that check, allocate and launch the kernels of
``cuda/*.cu``, on a GPU through CuPy or on NumPy arrays through the emulator (``cuda-emu``).

Same interface as :mod:`cotsdl.ops.cpu`: ``filter_forward``, ``filter_backward_data``,
``filter_backward_weights``, ``pool_forward``, ``pool_backward``, ``smooth``,
``smooth_adjoint``.  Chosen by :mod:`cotsdl.ops._dispatch`, never imported by callers.
"""
from .filter import filter_backward_data, filter_backward_weights, filter_forward
from .lcn import smooth, smooth_adjoint
from .pool import pool_backward, pool_forward

__all__ = ["filter_forward", "filter_backward_data", "filter_backward_weights", "pool_forward", "pool_backward",
           "smooth", "smooth_adjoint"]
