"""A stage's filter diagnostics over P ranks equal one rank's, bit for bit, for any split of the sites."""
import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.array.partition import block_box
from cotsdl.nn.diagnostics import GaborFit, gabor_fraction, gabor_model, stage_filter_stats
from helpers import P, agree, grids

SHAPE = (3, 5)  # 3 site rows: a 4x1 grid leaves one rank without sites


def weights():
    """The same seeded global (w, w0) on every rank: noise, with planted Gabors at some units."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal(SHAPE + (2, 7, 7, 1))
    for i, j, m in [(0, 0, 0), (1, 2, 1), (2, 4, 0), (2, 1, 1)]:
        g = GaborFit(1.0, 1.0, 3.0, 3.2, rng.uniform(0, np.pi), 1.5, 2.0, rng.uniform(3, 6), rng.uniform(-3, 3), 0.0)
        w[i, j, m, :, :, 0] = gabor_model((7, 7), g)
    return w, w + rng.standard_normal(w.shape)


def uneven(dims, rank):
    """A split with unequal blocks: cut points drawn from a seed shared by every rank."""
    rng = np.random.default_rng(4)
    cuts = [np.sort(np.r_[0, rng.integers(0, n + 1, d - 1), n]) for n, d in zip(SHAPE, dims)]
    c = np.unravel_index(rank, dims)
    return [(int(cuts[a][c[a]]), int(cuts[a][c[a] + 1])) for a in range(2)]


def run(comm, ranges, **kw):
    w, w0 = weights()
    (a0, a1), (b0, b1) = ranges
    return stage_filter_stats(comm, w[a0:a1, b0:b1], w0[a0:a1, b0:b1], (a0, b0), SHAPE, **kw)


@pytest.mark.parametrize("split", ["block", "uneven"])
@pytest.mark.parametrize("dims", grids())
def test_stats_equal_the_one_rank_result(comm, dims, split):
    rank = comm.Get_rank()
    if split == "block":
        box = block_box(SHAPE, dims, np.unravel_index(rank, dims))
        ranges = list(zip(box.lo, box.hi))
    else:
        ranges = uneven(dims, rank)
    kw = {"sample": 12, "seed": 5}
    got = run(comm, ranges, **kw)
    ref = run(MPI.COMM_SELF, [(0, SHAPE[0]), (0, SHAPE[1])], **kw)
    serial = gabor_fraction(weights()[0], sample=12, seed=5)
    ok = got == ref and got["fitted"] == 12 and ref["gabor_fraction"] == serial["fraction"] > 0
    assert agree(comm, ok), (got, ref)
    assert agree(comm, len({tuple(sorted(g.items())) for g in comm.allgather(got)}) == 1)


def test_bad_boxes_raise_on_every_rank(comm):
    # Every rank claims all sites: for P > 1 the boxes overlap; nobody may hang in a collective.
    if P == 1:
        pytest.skip("one rank's full box is a valid split")
    with pytest.raises(ValueError, match="site boxes hold"):
        run(comm, [(0, SHAPE[0]), (0, SHAPE[1])], sample=4)
    # The right number of sites, but two ranks hold the same row.
    rows = {2: [(1, 2), (1, 3)], 3: [(1, 2), (1, 2), (2, 3)], 4: [(0, 0), (1, 2), (1, 2), (2, 3)]}[P]
    with pytest.raises(ValueError, match="overlap or leave gaps"):
        run(comm, [rows[comm.Get_rank()], (0, SHAPE[1])], sample=4)
    # One rank passes a bad argument: the others raise too.
    with pytest.raises(ValueError, match="threshold"):
        run(comm, [(0, 0), (0, 0)] if comm.Get_rank() else [(0, SHAPE[0]), (0, SHAPE[1])],
            threshold=2.0 if comm.Get_rank() == P - 1 else 0.5)


def test_a_bad_filter_on_one_rank_raises_on_every_rank(comm):
    rank = comm.Get_rank()
    box = block_box(SHAPE, (P, 1), (rank, 0))
    w, w0 = weights()
    w = w[box.lo[0]:box.hi[0]].copy()
    if rank == P - 1:
        w[...] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        stage_filter_stats(comm, w, w0[box.lo[0]:box.hi[0]], box.lo, SHAPE, sample=4)
