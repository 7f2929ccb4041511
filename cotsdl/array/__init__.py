"""Distributed arrays: index boxes, partitions, receptive-field maps, grids, exchanges.

``box``, ``partition``, ``rfmap`` and ``messages`` are pure index arithmetic (no MPI,
no GPU); the rest runs over MPI communicators that the caller provides.
"""
from .box import Box, grow, hull_of
from .partition import block_box, block_boxes, block_owner, block_range, choose_grid
from .messages import Transfer, transfers
from .rfmap import RFMap

__all__ = ["Box", "grow", "hull_of", "block_box", "block_boxes", "block_owner", "block_range",
           "choose_grid", "Transfer", "transfers", "RFMap", "DistArray", "ExchangePlan", "ProcessGrid",
           "Decomposition", "split_replicas", "node_local_rank", "node_local_size", "rank_nodes", "node_names", "describe_nodes", "placement", "use_node_local_gpu", "gather", "scatter", "redistribute",
           "raise_collectively", "cuda_aware_mpi"]

_MPI_NAMES = {
    "DistArray": "distarray", "ExchangePlan": "exchange", "ProcessGrid": "grid", "Decomposition": "grid",
    "split_replicas": "grid", "node_local_rank": "grid", "node_local_size": "grid", "rank_nodes": "grid", "node_names": "grid", "describe_nodes": "grid", "placement": "grid", "use_node_local_gpu": "grid", "gather": "collect", "scatter": "collect",
    "redistribute": "collect", "raise_collectively": "collective", "cuda_aware_mpi": "cudampi",
}


def __getattr__(name: str):
    # The MPI half is imported on first use so that the pure index algebra can be
    # used (and tested) without initialising MPI.
    if name in _MPI_NAMES:
        from importlib import import_module

        return getattr(import_module(f".{_MPI_NAMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
