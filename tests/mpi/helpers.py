"""Shared helpers of the multi-rank tests (every rank draws the same random case)."""
from mpi4py import MPI

from cotsdl.array.box import Box, grow

WORLD = MPI.COMM_WORLD
P = WORLD.Get_size()


def grids(p=P):
    """1xP, Px1 and 2x2 (when P == 4) process grids."""
    out = {(p, 1), (1, p)}
    if p == 4:
        out.add((2, 2))
    return sorted(out)


def random_shape(rng, lo=1, hi=14):
    return (int(rng.integers(lo, hi)), int(rng.integers(lo, hi)), int(rng.integers(1, 4)), int(rng.integers(1, 5)))


def random_halo_windows(rng, owned_boxes, shape, r=3):
    """Asymmetric halos of width 0..r per side, clipped at the border, one per rank."""
    gbox = Box.from_shape(shape)
    return [grow(b, rng.integers(0, r + 1, 2), rng.integers(0, r + 1, 2), gbox) for b in owned_boxes]


def random_box(rng, shape):
    """Any box inside the array (possibly empty)."""
    lo = [int(rng.integers(0, s + 1)) for s in shape]
    hi = [int(rng.integers(l, s + 1)) for l, s in zip(lo, shape)]
    return Box(lo, hi)


def all_same(comm, value):
    vals = comm.allgather(value)
    return all(v == vals[0] for v in vals)


def agree(comm, ok, what=""):
    """True on every rank iff ``ok`` holds on every rank (assert it after the collectives)."""
    from mpi4py import MPI

    return bool(comm.allreduce(bool(ok), op=MPI.LAND))
