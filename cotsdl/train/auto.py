"""A trainer's ``"auto"`` settings, decided by the run planner on rank 0 and broadcast (collective).

``parallel.overlap = "auto"`` (:func:`overlap`) and ``parallel.fuse = "auto"`` (:func:`fuse`): rank 0
reads this machine's calibration (``./machine.json``, as ``cotsdl plan`` does), asks the planner for
the run's grid and where its ranks sit, and every rank takes its answer, so that all compute alike.
A planner that fails is reported on every rank with the setting to give instead.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from ..array.collective import raise_collectively, wait_idle
from ..nn.network import Network


def overlap(world: MPI.Comm, dims: Sequence[int], network: Network, batch: int, replicas: int, dtype: np.dtype,
            tied: bool, slots: int):
    """``overlap="auto"`` on grid ``dims``: an :class:`~cotsdl.planner.overlap.OverlapChoice`.  Where the
    model decides and the load now differs from its calibration's, the reason ends with the warning
    (rank 0 measures 0.5 s)."""
    from ..array.grid import placement, rank_nodes  # noqa: PLC0415
    from ..planner import load  # noqa: PLC0415
    from ..planner.overlap import choose_overlap, model_machine, with_load_warning  # noqa: PLC0415 - "auto" only

    # (collective) ranks sharing a node share its cores (the most crowded node sets the pace); does
    # every model group (consecutive ranks, split_replicas) sit on one node?
    per_node, together = placement(rank_nodes(world), world.Get_size(), replicas)
    pids, cpus = load.job_on_host(world)  # (collective) the load now is of processes outside the run
    choice, err = None, None
    if world.Get_rank() == 0:
        try:
            machine, why = model_machine()
            choice = choose_overlap(network, batch, world.Get_size(), dims, replicas, machine, dtype=dtype.name,
                                    optimizer_slots=slots, ranks_per_node=per_node, tied=bool(tied), no_machine=why,
                                    group_on_one_node=together)
            choice = with_load_warning(choice, machine, pids, cpus)
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            err = (f'overlap = "auto": the run planner failed ({type(e).__name__}: {e}); give overlap=True or '
                   'False (parallel.overlap = true or false)')
    wait_idle(world)  # the others sleep: polling in a blocking call would take the cores rank 0 measures
    raise_collectively(world, err, RuntimeError)
    return world.bcast(choice, root=0)


def fuse(world: MPI.Comm, dims: Sequence[int], network: Network, batch: int, replicas: int, dtype: np.dtype,
         tied: bool, slots: int, overlapped: bool, fused: Any = None, filters: Any = None) -> Any:
    """``fuse="auto"`` or ``fuse_filter="auto"`` on grid ``dims``, with the machine ``overlap="auto"``
    uses, the fixed one of them kept (``fused``, ``filters``: as :func:`~cotsdl.planner.fuse.choose_fuse`
    takes them): a :class:`~cotsdl.planner.fuse.FuseChoice`."""
    from ..array.grid import placement, rank_nodes  # noqa: PLC0415
    from ..planner.fuse import choose_fuse  # noqa: PLC0415
    from ..planner.overlap import model_machine  # noqa: PLC0415

    per_node, _ = placement(rank_nodes(world), world.Get_size(), replicas)  # (collective)
    choice, err = None, None
    if world.Get_rank() == 0:
        try:
            machine, why = model_machine()
            choice = choose_fuse(network, batch, world.Get_size(), dims, replicas, machine, no_machine=why,
                                 dtype=dtype.name, optimizer_slots=slots, ranks_per_node=per_node, tied=bool(tied),
                                 overlap=overlapped, fused=fused, filters=filters)
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            err = (f'fuse = "auto": the run planner failed ({type(e).__name__}: {e}); give the stages '
                   '(parallel.fuse and parallel.fuse_filter = "off", "on" or a list)')
    raise_collectively(world, err, RuntimeError)
    return world.bcast(choice, root=0)
