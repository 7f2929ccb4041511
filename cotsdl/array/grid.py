"""Process grids over a given communicator, and the replicas x grid split.

A model-parallel group is a ``Py x Px`` MPI Cartesian grid over the spatial axes
(H, W) of every activation; replicas of that group run data parallelism
(DESIGN.md section 4).  One rank and a 1 x 1 grid is the serial case.
"""
from __future__ import annotations

import os

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from mpi4py import MPI

from .box import Box
from .collective import raise_collectively
from .partition import block_box, choose_grid


def _agreement_error(comm: MPI.Comm, what: str, value) -> str | None:
    """Whether every rank resolved ``value`` the same way (else a mis-wired grid)."""
    values = comm.allgather(value)
    if any(v != values[0] for v in values):
        return f"ranks disagree on the {what}: " + ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
    return None


def _dims_error(dims: Sequence[int] | None, size: int) -> str | None:
    if dims is None:
        return None
    try:
        d = tuple(int(x) for x in dims)
    except (TypeError, ValueError):
        return f"grid must be two positive integers (Py, Px), got {dims!r}"
    if len(d) != 2 or any(x < 1 for x in d):
        return f"grid must be two positive integers (Py, Px), got {dims!r}"
    if d[0] * d[1] != size:
        return f"grid {d[0]}x{d[1]} needs {d[0] * d[1]} ranks, the communicator has {size}"
    return None


class ProcessGrid:
    """A 2-D Cartesian grid of the ranks of ``comm`` over the axes (H, W).

    Parameters
    ----------
    comm : MPI.Comm
        The model-parallel group (never assumed to be ``COMM_WORLD``).
    dims : (Py, Px), optional
        Forced grid; by default :func:`choose_grid` picks one (using
        ``extent=(H, W)`` when given).
    extent : (H, W), optional
        Spatial extent that guides the automatic choice.
    """

    def __init__(self, comm: MPI.Comm, dims: Sequence[int] | None = None, extent: Sequence[int] | None = None):
        size = comm.Get_size()
        raise_collectively(comm, _dims_error(dims, size))
        self.dims: tuple[int, int] = tuple(int(x) for x in dims) if dims is not None else choose_grid(size, extent)  # type: ignore[assignment]
        raise_collectively(comm, _agreement_error(comm, "grid", self.dims))
        # reorder=False keeps cart rank == comm rank, so row-major block order holds.
        self.comm: MPI.Cartcomm = comm.Create_cart(self.dims, periods=(False, False), reorder=False)
        self.rank: int = self.comm.Get_rank()
        self.size: int = size
        self.coords: tuple[int, int] = tuple(self.comm.Get_coords(self.rank))  # type: ignore[assignment]

    def neighbours(self) -> dict[str, int]:
        """Ranks of the four grid neighbours (``MPI.PROC_NULL`` at the border)."""
        north, south = self.comm.Shift(0, 1)
        west, east = self.comm.Shift(1, 1)
        return {"north": north, "south": south, "west": west, "east": east}

    def coords_of(self, rank: int) -> tuple[int, int]:
        return tuple(self.comm.Get_coords(rank))  # type: ignore[return-value]

    def owned_box(self, shape: Sequence[int], rank: int | None = None) -> Box:
        """The balanced block of an (H, W, ...) array owned by ``rank`` (default: this rank)."""
        coords = self.coords if rank is None else self.coords_of(rank)
        return block_box(shape, self.dims, coords)

    def owned_boxes(self, shape: Sequence[int]) -> list[Box]:
        return [self.owned_box(shape, r) for r in range(self.size)]

    def free(self) -> None:
        self.comm.Free()

    def __repr__(self) -> str:
        return f"ProcessGrid({self.dims[0]}x{self.dims[1]}, rank {self.rank} at {self.coords})"


@dataclass
class Decomposition:
    """This rank's place in ``replicas x grid``.

    Attributes
    ----------
    grid : ProcessGrid
        The model-parallel group of this rank (same minibatch on every member).
    replica_comm : MPI.Comm
        The ranks holding the same grid position in every replica (gradient allreduce).
    replica : int
        Index of this rank's replica.
    replicas : int
        Number of replicas.
    """

    grid: ProcessGrid
    replica_comm: MPI.Comm
    replica: int
    replicas: int

    def free(self) -> None:
        self.grid.free()
        self.replica_comm.Free()


def split_replicas(comm: MPI.Comm, replicas: int = 1, dims: Sequence[int] | None = None,
                   extent: Sequence[int] | None = None) -> Decomposition:
    """Split ``comm`` into ``replicas`` model groups of equal size.

    Consecutive ranks form one group, so that a group sits on as few nodes as
    possible and halo traffic stays local.
    """
    size = comm.Get_size()
    err = None
    if not isinstance(replicas, int) or replicas < 1 or size % replicas:
        err = f"replicas must be a positive divisor of the number of ranks {size}, got {replicas!r}"
    raise_collectively(comm, err)
    raise_collectively(comm, _agreement_error(comm, "number of replicas", replicas))
    group = size // replicas
    raise_collectively(comm, _dims_error(dims, group))
    rank = comm.Get_rank()
    model = comm.Split(color=rank // group, key=rank)
    grid = ProcessGrid(model, dims, extent)
    model.Free()  # the grid holds its own Cartesian communicator
    replica_comm = comm.Split(color=rank % group, key=rank)
    return Decomposition(grid=grid, replica_comm=replica_comm, replica=rank // group, replicas=replicas)


def _node_local(comm: MPI.Comm) -> tuple[int, int]:
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


def node_local_rank(comm: MPI.Comm) -> int:
    """This rank's index among the ranks of ``comm`` on the same node (picks the GPU)."""
    return _node_local(comm)[0]


def node_local_size(comm: MPI.Comm) -> int:
    """How many ranks of ``comm`` share this node (they share its cores)."""
    return _node_local(comm)[1]


def rank_nodes(comm: MPI.Comm) -> list[int]:
    """Every rank's node, in rank order, named by the lowest rank of ``comm`` on it (collective)."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        first = local.allreduce(comm.Get_rank(), op=MPI.MIN)
    finally:
        local.Free()
    return [int(v) for v in comm.allgather(first)]


def node_names(comm: MPI.Comm) -> list[tuple[str, list[int]]]:
    """(node name, its ranks of ``comm``) of every node, in the order of their lowest rank (collective).

    Nodes are told apart as :func:`rank_nodes` does (shared memory); a node's name is its
    lowest rank's host name."""
    nodes = rank_nodes(comm)
    hosts = comm.allgather(os.uname().nodename)
    return [(hosts[first], [r for r, n in enumerate(nodes) if n == first]) for first in sorted(set(nodes))]


def describe_nodes(layout: Sequence[tuple[str, Sequence[int]]], most: int = 8) -> str:
    """One line for a log: ``2 nodes x 2 ranks: n1 (ranks 0-1), n2 (ranks 2-3)`` (``most`` nodes named)."""
    counts = sorted({len(r) for _, r in layout})
    per = (f"{counts[0]} rank(s) per node" if len(counts) == 1
           else f"{counts[0]}-{counts[-1]} ranks per node")

    def span(ranks: Sequence[int]) -> str:
        ranks = list(ranks)
        if ranks == list(range(ranks[0], ranks[-1] + 1)):
            return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
        return "ranks " + ",".join(map(str, ranks))

    named = ", ".join(f"{name} ({span(ranks)})" for name, ranks in layout[:most])
    more = f", and {len(layout) - most} more" if len(layout) > most else ""
    return f"{len(layout)} node(s), {per}: {named}{more}"


def placement(nodes: Sequence[int], ranks: int, replicas: int = 1) -> tuple[int, bool]:
    """(ranks per node, whether every model group sits on one node) of the first ``ranks`` ranks split
    into ``replicas`` groups of consecutive ranks (:func:`split_replicas`), ``nodes`` as
    :func:`rank_nodes` gives them."""
    first = list(nodes[:ranks])
    if len(first) < ranks or ranks < 1 or replicas < 1 or ranks % replicas:
        raise ValueError(f"placement: {ranks} rank(s) in {replicas} group(s) of the {len(nodes)} known")
    group = ranks // replicas
    per_node = max(Counter(first).values())
    return per_node, all(len(set(first[g * group:(g + 1) * group])) == 1 for g in range(replicas))


#: The node-local rank as launchers announce it (srun, MVAPICH2, Open MPI, MPICH/Hydra, Intel MPI).
LOCAL_RANK_VARIABLES = ("SLURM_LOCALID", "MV2_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "PMI_LOCAL_RANK", "MPI_LOCALRANKID")


def launched_local_rank(environ=os.environ) -> int | None:
    """This process's node-local rank from the launcher's environment (known before MPI starts), or None."""
    for key in LOCAL_RANK_VARIABLES:
        value = environ.get(key, "")
        if value.isdigit():
            return int(value)
    return None


def use_node_local_gpu(comm: MPI.Comm) -> int:
    """Make GPU ``node-local rank mod visible GPUs`` current (with the cuda backend); return the index.

    The node-local rank is the launcher's (:data:`LOCAL_RANK_VARIABLES`), the one
    ``jobs/lib/bind-gpu.sh`` used to give each rank its GPU before MPI started (then one
    GPU is visible and it is index 0); without one, the ranks of ``comm`` that share a node.
    """
    from .. import backend  # noqa: PLC0415

    index = launched_local_rank()
    if index is None:
        index = node_local_rank(comm)
    backend.set_device(index)
    return index
