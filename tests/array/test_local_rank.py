"""The node-local rank a launcher announces (the GPU of a rank is chosen by it, before MPI starts)."""
from cotsdl.array.grid import LOCAL_RANK_VARIABLES, launched_local_rank


def test_the_first_launcher_variable_that_is_a_number_wins():
    assert launched_local_rank({}) is None
    assert launched_local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}) == 3
    assert launched_local_rank({"SLURM_LOCALID": "1", "PMI_LOCAL_RANK": "5"}) == 1  # srun's first
    assert launched_local_rank({"SLURM_LOCALID": "", "MPI_LOCALRANKID": "2"}) == 2
    assert launched_local_rank({"MV2_COMM_WORLD_LOCAL_RANK": "-1"}) is None
    assert set(LOCAL_RANK_VARIABLES) >= {"SLURM_LOCALID", "MV2_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                         "PMI_LOCAL_RANK"}


def test_placement_of_the_first_ranks_and_their_model_groups():
    from cotsdl.array.grid import placement  # noqa: PLC0415

    two_nodes = [0, 0, 2, 2]  # ranks 0, 1 on one node, 2, 3 on another
    assert placement(two_nodes, 1) == (1, True)
    assert placement(two_nodes, 2) == (2, True)
    assert placement(two_nodes, 3) == (2, False)  # a group of 3 spans both nodes
    assert placement(two_nodes, 4) == (2, False)
    assert placement(two_nodes, 4, replicas=2) == (2, True)  # groups of consecutive ranks: one per node
    assert placement([0, 1, 0, 1], 4, replicas=2) == (2, False)  # round-robin placement: each group spans two
    assert placement([0] * 4, 4, replicas=4) == (4, True)
    for bad in ((5, 1), (4, 3), (0, 1)):
        try:
            placement(two_nodes, *bad)
        except ValueError as e:
            assert "placement" in str(e)
        else:
            raise AssertionError(f"placement{bad} did not refuse")
