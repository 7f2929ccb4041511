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
