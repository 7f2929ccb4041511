"""The numpy backend of the operations: every op on the CPU, one module per op.

Same interface as :mod:`cotsdl.ops.cuda`: ``filter_forward``, ``filter_backward_data``,
``filter_backward_weights``, ``pool_forward``, ``pool_backward``, ``smooth``,
``smooth_adjoint``.  Chosen by :mod:`cotsdl.ops._dispatch`, never imported by callers.
"""
from .filter import filter_backward_data, filter_backward_weights, filter_forward
from .lcn import smooth, smooth_adjoint
from .pool import pool_backward, pool_forward

__all__ = ["filter_forward", "filter_backward_data", "filter_backward_weights", "pool_forward", "pool_backward",
           "smooth", "smooth_adjoint"]
