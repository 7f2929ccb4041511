import pytest
from mpi4py import MPI

from cotsdl.array import ProcessGrid, block_boxes, choose_grid, node_local_rank, split_replicas
from helpers import P, grids


@pytest.mark.parametrize("dims", grids())
def test_cartesian_grid_and_neighbours(comm, dims):
    grid = ProcessGrid(comm, dims)
    assert grid.dims == dims and grid.size == P
    cy, cx = grid.coords
    assert grid.rank == comm.Get_rank() == cy * dims[1] + cx  # row-major, no reordering
    nb = grid.neighbours()
    expect = {
        "north": grid.comm.Get_cart_rank((cy - 1, cx)) if cy > 0 else MPI.PROC_NULL,
        "south": grid.comm.Get_cart_rank((cy + 1, cx)) if cy < dims[0] - 1 else MPI.PROC_NULL,
        "west": grid.comm.Get_cart_rank((cy, cx - 1)) if cx > 0 else MPI.PROC_NULL,
        "east": grid.comm.Get_cart_rank((cy, cx + 1)) if cx < dims[1] - 1 else MPI.PROC_NULL,
    }
    assert nb == expect
    shape = (13, 9, 3, 4)
    assert grid.owned_boxes(shape) == block_boxes(shape, dims)
    grid.free()


def test_default_grid_is_chosen_for_any_count(comm):
    grid = ProcessGrid(comm, extent=(40, 40))
    assert grid.dims == choose_grid(P, (40, 40))
    grid.free()


@pytest.mark.parametrize("replicas", [r for r in range(1, P + 1) if P % r == 0])
def test_replicas_times_grid(comm, replicas):
    lay = split_replicas(comm, replicas)
    group = P // replicas
    rank = comm.Get_rank()
    assert lay.grid.size == group and lay.replicas == replicas
    assert lay.replica == rank // group
    assert lay.grid.rank == rank % group
    assert lay.replica_comm.Get_size() == replicas
    # The replica communicator links the same grid position of every replica.
    members = lay.replica_comm.allgather(rank)
    assert members == [r * group + rank % group for r in range(replicas)]
    # An allreduce over replicas sums one value per replica.
    total = lay.replica_comm.allreduce(lay.replica)
    assert total == sum(range(replicas))
    lay.free()


def test_one_replica_one_rank_grid_is_the_serial_case(comm):
    if P != 1:
        pytest.skip("serial case")
    lay = split_replicas(comm, 1, (1, 1))
    assert lay.grid.dims == (1, 1) and lay.grid.coords == (0, 0)
    lay.free()


def test_node_local_rank(comm):
    local = node_local_rank(comm)
    assert 0 <= local < P
    # all ranks of a test run share this machine
    assert sorted(comm.allgather(local)) == list(range(P))


def test_rank_nodes_name_each_node_by_its_lowest_rank(comm):
    from cotsdl.array.grid import node_local_size, placement, rank_nodes  # noqa: PLC0415

    nodes = rank_nodes(comm)
    assert len(nodes) == comm.Get_size() and nodes[comm.Get_rank()] <= comm.Get_rank()
    assert nodes.count(nodes[comm.Get_rank()]) == node_local_size(comm)
    assert all(nodes[n] == n for n in nodes)  # a node's name is a rank on it
    per_node, together = placement(nodes, comm.Get_size())
    assert per_node == max(comm.allgather(node_local_size(comm)))
    assert together == (len(set(nodes)) == 1)
