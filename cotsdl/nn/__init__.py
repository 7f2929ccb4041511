"""Layers, stages, networks and their distributed execution plans."""
from .layers import LCN, Context, L2Pool, LocalFilter
from .network import Network, Stage, init_weights

__all__ = ["LCN", "Context", "L2Pool", "LocalFilter", "Network", "Stage", "init_weights", "NetworkPlan"]


def __getattr__(name: str):
    if name == "NetworkPlan":  # needs MPI; imported on first use
        from .plan import NetworkPlan

        return NetworkPlan
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
