"""An allreduce in two levels: within each node, across the nodes, within each node again.

Where several ranks of a communicator share a node, the sum can cross the nodes' links once
per node instead of once per rank: the ranks of a node reduce their buffers to the node's
lowest rank (its leader), the leaders allreduce the node sums across the nodes, and each
leader broadcasts the result to its node.  Every node then sends about 2 (N-1)/N of the buffer
over its link (N nodes), whatever its ranks.  (A reduce-scatter / allgather variant, each of a
node's ranks carrying a slice across, measured slower on the simulated nodes, one core each:
cotsdl/bench/README.md, "`cotsdl bench reduction`".)

Summation order: each node's ranks in MPI's order, then the nodes' sums in MPI's order; it
equals a flat allreduce's bit for bit where the flat one pairs the same operands (one rank per
node; two nodes of two consecutive ranks: (a + b) + (c + d) either way), else within a float
sum's rounding.
"""
from __future__ import annotations

from typing import Any, Sequence

from mpi4py import MPI

from .collective import differences, on_mpi_memory, raise_collectively
from .grid import rank_nodes


class TwoLevel:
    """Two-level sums over the ranks of ``comm`` (collective; built once, used every step).

    Parameters
    ----------
    comm : MPI.Comm
        The ranks that sum (the replicas' group of one grid position).
    nodes : sequence of int, optional
        Every rank's node, in rank order (any labels); default :func:`rank_nodes` (shared
        memory tells the nodes apart).  Tests give labels to make nodes within one machine.
    """

    def __init__(self, comm: MPI.Comm, nodes: Sequence[int] | None = None):
        size, rank = comm.Get_size(), comm.Get_rank()
        nodes = rank_nodes(comm) if nodes is None else [int(v) for v in nodes]
        err = None if len(nodes) == size else f"nodes must name the node of each of the {size} rank(s), got {nodes}"
        raise_collectively(comm, err)
        err = differences(comm, nodes)
        raise_collectively(comm, None if err is None else f"ranks disagree on the nodes: {err}")
        self.comm, self.size = comm, size
        labels = sorted(set(nodes))
        #: how many nodes the ranks sit on
        self.nodes = len(labels)
        self.local = comm.Split(color=labels.index(nodes[rank]), key=rank)
        # the leaders (each node's lowest rank) sum the nodes' sums; the others are in no cross group
        self.leaders = comm.Split(color=0 if self.local.Get_rank() == 0 else MPI.UNDEFINED, key=rank)

    def allreduce(self, buf: Any, op: MPI.Op = MPI.SUM) -> Any:
        """Reduce the contiguous ``buf`` (NumPy or CuPy) over ``comm`` in place; return it (device
        buffers as :func:`~cotsdl.array.collective.allreduce` hands them to MPI: one staging for the
        three steps)."""
        if not getattr(getattr(buf, "flags", None), "c_contiguous", False):
            raise ValueError("allreduce needs a C-contiguous buffer (MPI reads flat memory)")
        if self.size == 1:
            return buf
        return on_mpi_memory(buf, lambda mem: self._levels(mem, op))

    def _levels(self, mem: Any, op: MPI.Op) -> None:
        alone = self.local.Get_size() == 1
        leader = self.leaders != MPI.COMM_NULL
        if not alone:
            self.local.Reduce(MPI.IN_PLACE if leader else mem, mem if leader else None, op=op, root=0)
        if leader and self.leaders.Get_size() > 1:
            self.leaders.Allreduce(MPI.IN_PLACE, mem, op=op)
        if not alone:
            self.local.Bcast(mem, root=0)

    def free(self) -> None:
        self.local.Free()
        if self.leaders != MPI.COMM_NULL:
            self.leaders.Free()
