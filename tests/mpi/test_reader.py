"""The HDF5 reader on P ranks: each rank reads its own window of the same images; replicas differ."""
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from cotsdl.array import split_replicas
from cotsdl.io.dataset import write_dataset
from cotsdl.io.reader import HDF5Source
from cotsdl.nn import Network, NetworkPlan
from helpers import WORLD, P, agree, grids

NET = {"input": [13, 11, 2], "stages": [
    {"filter": {"size": [3, 4], "stride": [1, 1], "channels": 2}, "pool": {"size": [2, 2], "stride": [1, 1]},
     "lcn": {"size": 3, "sigma": 1.0}}]}
B = 5


@pytest.fixture(scope="module")
def files():
    """The same images as uint8 and float32 (gzip), written by rank 0."""
    comm = WORLD
    folder = comm.bcast(tempfile.mkdtemp(prefix="cotsdl-reader-") if comm.Get_rank() == 0 else None)
    rng = np.random.default_rng(7)
    u8 = rng.integers(0, 256, (37, 13, 11, 2), dtype=np.uint8)
    if comm.Get_rank() == 0:
        write_dataset(Path(folder) / "u8.h5", u8)
        write_dataset(Path(folder) / "f32.h5", (u8 / 255.0).astype(np.float32), compression="gzip")
    comm.Barrier()
    yield Path(folder)
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(folder)


@pytest.mark.parametrize("name", ["u8.h5", "f32.h5"])
@pytest.mark.parametrize("dims", grids())
def test_windows_are_slices_of_what_one_process_reads(comm, files, name, dims):
    layout = split_replicas(comm, 1, dims)
    plan = NetworkPlan(Network.from_description(NET), layout.grid, B)
    whole = HDF5Source(files / name, seed=3, prefetch=False)  # what one process reads
    mine = HDF5Source(files / name, seed=3)
    ok = True
    for step in range(9):  # crosses epochs (37 images)
        first = step * B
        if step:
            mine.prefetch(first, B, plan.input_owned)
        got = mine.read(first, B, plan.input_owned)
        full = whole.read(first, B, plan.input_array().global_box)
        ok = ok and np.array_equal(got, full[plan.input_owned.slices_in(plan.input_array().global_box)])
    whole.close()
    mine.close()
    layout.free()
    assert agree(comm, ok)


@pytest.mark.skipif(P < 2, reason="replicas need 2 or more ranks")
def test_replicas_read_different_images_whose_union_is_the_global_batch(comm, files):
    replicas = 2 if P % 2 == 0 else P
    layout = split_replicas(comm, replicas, None, extent=(13, 11))
    src = HDF5Source(files / "u8.h5", seed=5, prefetch=False)
    ok = True
    for step in range(4):
        pos = step * B * replicas
        idx = src.indices(pos + layout.replica * B, B)  # the trainer's stream positions
        group = layout.grid.comm.allgather(idx.tolist())
        ok = ok and all(g == group[0] for g in group)  # every rank of a model group: the same images
        per_replica = layout.replica_comm.allgather(idx.tolist())
        union = [i for r in per_replica for i in r]
        ok = ok and union == src.indices(pos, B * replicas).tolist()  # what one process would read
        ok = ok and len({tuple(r) for r in per_replica}) == replicas  # replicas differ
    src.close()
    layout.free()
    assert agree(comm, ok)
