"""The planner's halo bytes, message counts and overlap strips per rank equal what the real NetworkPlan has.

Run: mpiexec -n P python -m mpi4py tests/mpi_pytest.py tests/mpi -k planner  (P = 1..4)
"""
from pathlib import Path

import numpy as np
import pytest

from cotsdl.array import ProcessGrid
from cotsdl.cli import run
from cotsdl.nn import NetworkPlan
from cotsdl.nn.layout import interior_pieces
from cotsdl.planner.model import layer_counts
from helpers import grids
from netcases import network

DEMO = Path(__file__).resolve().parents[2] / "jobs/configs/demo.toml"


def demo():
    return run.read(DEMO).network


@pytest.mark.parametrize("make", [network, demo], ids=["uneven", "demo"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dims", grids())
def test_planner_counts_equal_the_plan(comm, dims, dtype, make):
    net, batch = make(), 3
    grid = ProcessGrid(comm, dims)
    real = NetworkPlan(net, grid, batch, dtype)
    counts = layer_counts(net, batch, dims, np.dtype(dtype).itemsize)
    r = grid.rank  # Cartesian rank == row-major block order (reorder=False)
    assert tuple(grid.coords) == (r // dims[1], r % dims[1])
    for lp, c in zip(real.layers, counts):
        assert_counts(c, lp, r, dims)
        if lp.layer.kind == "filter":
            assert c.params_rank[r] == real.init_params(0)[lp.index].size
    grid.free()


@pytest.mark.parametrize("make", [network, demo], ids=["uneven", "demo"])
@pytest.mark.parametrize("dims", grids())
def test_planner_counts_of_a_fused_stage_equal_the_plan(comm, dims, make):
    """With every stage's pool and LCN fused: the pool's counts are its fused exchange's and grown boxes',
    the LCN's exchange counts nothing."""
    net, batch = make(), 3
    grid = ProcessGrid(comm, dims)
    fuse = tuple(range(len(net.stages)))
    real = NetworkPlan(net, grid, batch, np.float32, fuse=fuse)
    counts = layer_counts(net, batch, dims, 4, fuse)
    r = grid.rank
    for lp, c in zip(real.layers, counts):
        if lp.layer.kind == "lcn":
            assert (c.sent[r], c.received[r], c.msgs_sent[r], c.msgs_received[r], c.copied[r]) == (0, 0, 0, 0, 0)
            continue
        assert_counts(c, real.fused.get(lp.index, lp), r, dims)
    grid.free()


@pytest.mark.parametrize("make", [network, demo], ids=["uneven", "demo"])
@pytest.mark.parametrize("dims", grids())
def test_planner_counts_of_a_frozen_fused_stage_equal_the_plan(comm, dims, make):
    """With every stage's filter fused too (``fuse_filter``, a frozen stage's forward): the filter's
    counts are its grown exchange's and boxes' (the outputs it computes twice), its own weights stay
    the rank's, its weight halo is the plan's (kept elements, the bytes and messages of its one fetch);
    the pool's and the LCN's exchanges count nothing."""
    net, batch = make(), 3
    grid = ProcessGrid(comm, dims)
    fuse = tuple(range(len(net.stages)))
    real = NetworkPlan(net, grid, batch, np.float32, fuse=fuse, fuse_filter=fuse)
    counts = layer_counts(net, batch, dims, 4, fuse, fuse)
    r = grid.rank
    params = real.init_params(0)
    for lp, c in zip(real.layers, counts):
        if lp.layer.kind != "filter":
            assert (c.sent[r], c.received[r], c.msgs_sent[r], c.msgs_received[r], c.copied[r]) == (0, 0, 0, 0, 0)
            assert c.halo_params[r] == 0
            if lp.layer.kind == "pool":  # computed on its grown boxes, from the filter's grown output
                fp = real.fused[lp.index]
                assert c.window_elems[r] == fp.window.size and c.out_elems[r] == fp.out.size
            continue
        grown, wex = real.frozen[lp.index], real.weight_exchanges[lp.index]
        assert_counts(c, grown, r, dims)
        assert c.params_rank[r] == params[lp.index].size
        assert c.halo_params[r] == real.weight_box(lp.index, grown.sites)[1].size
        assert (c.halo_received[r], c.halo_msgs_received[r]) == (wex.bytes_received, wex.messages_received)
        whole = lp.layer.cost(lp.in_shape)["forward"].flops
        units = np.prod(lp.layer.sites(lp.in_shape))
        assert c.passes["forward"][0][r] == pytest.approx(whole * grown.sites.size / units, rel=1e-12)
    grid.free()


def assert_counts(c, lp, r, dims):
    """Layer counts ``c`` on rank ``r`` are what the real layer plan ``lp`` has."""
    ex = lp.exchange
    got = (c.sent[r], c.received[r], c.msgs_sent[r], c.msgs_received[r], c.local[r])
    want = (ex.bytes_sent, ex.bytes_received, ex.messages_sent, ex.messages_received, ex.bytes_local)
    assert got == want, f"layer {lp.index} ({lp.layer.kind}) on rank {r} of grid {dims}"
    assert c.window_elems[r] == lp.window.size and c.out_elems[r] == lp.out.size
    # where overlap splits the layer: the calls beyond one (border strips, the interior's other pieces)
    assert c.strips[r] == (len(lp.split[1]) + len(interior_pieces(lp.split[0])) - 1 if lp.split else 0)
