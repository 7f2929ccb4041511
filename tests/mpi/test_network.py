"""Distributed == serial: a 3-stage network's output and every gradient on P ranks equal one rank's."""
import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.array import DistArray, ProcessGrid, gather
from cotsdl.nn import NetworkPlan
from helpers import grids
from netcases import network

BATCH = 3


def run(comm, dims, dtype, seed=0, overlap=True, fuse=()):
    """Forward + backward on ``comm``; returns gathered (y, dx, {layer: dw}, {layer: w}) on rank 0."""
    net = network()
    grid = ProcessGrid(comm, dims)
    plan = NetworkPlan(net, grid, BATCH, dtype, overlap=overlap, fuse=fuse)
    rng = np.random.default_rng(seed)  # the same images and output weights on every rank
    images = rng.standard_normal(net.input_shape + (BATCH,)).astype(dtype)
    r = rng.standard_normal(plan.output_shape).astype(dtype)
    params = plan.init_params(seed=11)
    x = plan.input_array(images[plan.input_owned.slices_in(plan.input_array().global_box)].copy())
    y, tape = plan.forward(x, params)
    dy = DistArray(comm, plan.output_shape, plan.output_owned, plan.output_owned,
                   data=r[plan.output_owned.slices_in(y.global_box)].copy())
    dx, grads = plan.backward(dy, tape, params)
    out = {"y": gather(y), "dx": gather(dx)}
    for i, dw in grads.items():
        shape, box = plan.weight_box(i)
        out[f"dw{i}"] = gather(DistArray(comm, shape, box, box, data=dw))
        out[f"w{i}"] = gather(DistArray(comm, shape, box, box, data=params[i]))
    grid.free()
    return out


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize("dims", grids())
def test_distributed_equals_serial(comm, dims, dtype, rtol):
    dist = run(comm, dims, dtype)
    serial = run(MPI.COMM_SELF, (1, 1), dtype)  # one rank, the same code path
    if comm.Get_rank() != 0:
        return
    assert sorted(dist) == sorted(serial)
    for key in sorted(dist):
        a, b = dist[key], serial[key]
        assert a.dtype == dtype and a.shape == b.shape, key
        scale = max(np.abs(b).max(), 1e-30)
        err = np.abs(a - b).max() / scale
        assert err <= rtol, f"{key}: relative difference {err:.2e} on grid {dims}"


def test_weights_identical_on_any_grid(comm):
    for dims in grids():
        dist = run(comm, dims, np.float32)
        if comm.Get_rank() == 0:
            serial = run(MPI.COMM_SELF, (1, 1), np.float32)
            for key in (k for k in dist if k.startswith("w")):
                np.testing.assert_array_equal(dist[key], serial[key])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("dims", grids())
def test_overlap_changes_no_bit(comm, dims, dtype):
    on, off = run(comm, dims, dtype, overlap=True), run(comm, dims, dtype, overlap=False)
    if comm.Get_rank() == 0:
        assert sorted(on) == sorted(off)
        for key in on:
            np.testing.assert_array_equal(on[key], off[key], err_msg=f"{key} on grid {dims}")


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("dims", grids())
def test_one_exchange_for_pool_and_lcn_equals_one_each(comm, dims, overlap):
    """Every stage's pool and LCN fused (one exchange, the pooled border computed where it is read):
    the forward is the same bit for bit (the same per-unit arithmetic), the backward the same within
    float rounding (every rank's partial sums meet in a different order), on every grid."""
    fused = run(comm, dims, np.float64, overlap=overlap, fuse=(0, 1, 2))
    plain = run(comm, dims, np.float64, overlap=overlap)
    if comm.Get_rank() != 0:
        return
    assert sorted(fused) == sorted(plain)
    np.testing.assert_array_equal(fused["y"], plain["y"], err_msg=f"forward on grid {dims}")
    for key in fused:
        np.testing.assert_allclose(fused[key], plain[key], rtol=1e-12, atol=1e-12 * np.abs(plain[key]).max(),
                                   err_msg=f"{key} on grid {dims}")


def test_a_fused_stage_exchanges_once_where_its_pool_and_lcn_took_two(comm):
    """Messages of a fused pool + LCN forward: the LCN receives none; the pool's one exchange carries
    what the two did (on a grid that splits the rows, so that both have halos)."""
    net = network()
    dims = (comm.Get_size(), 1)
    grid = ProcessGrid(comm, dims)
    plain, fused = NetworkPlan(net, grid, BATCH, np.float32), NetworkPlan(net, grid, BATCH, np.float32, fuse=[0])
    p, lcn = net.layer_index(0, "pool"), net.layer_index(0, "lcn")
    assert fused.fused[p].window.contains(plain.layers[p].window) and fused.fused[p].out.contains(plain.layers[p].out)
    assert fused.fused[p].src_owned == plain.layers[p].src_owned
    if comm.Get_size() > 1:  # the LCN's halo came in messages of its own; fused it rides on the pool's
        assert comm.allreduce(plain.layers[lcn].exchange.messages_received) > 0
        got = comm.allreduce(fused.fused[p].exchange.bytes_received)
        assert got >= comm.allreduce(plain.layers[p].exchange.bytes_received)
    x = fused.input_array(np.ones(fused.input_owned.shape, np.float32))
    before = [e.messages for e in fused.exchanges()]
    fused.forward(x, fused.init_params(0))
    calls = {id(e): m1 - m0 for e, m0, m1 in zip(fused.exchanges(), before, [e.messages for e in fused.exchanges()])}
    assert calls[id(fused.layers[lcn].exchange)] == 0  # the fused LCN posted no message
    assert fused.describe().count("fused") == 1
    grid.free()


def test_overlap_splits_where_halos_travel(comm):
    """On more than one rank the filter and pool layers overlap (an interior exists); LCN never does."""
    for dims in grids():
        grid = ProcessGrid(comm, dims)
        plan = NetworkPlan(network(), grid, BATCH, np.float32)
        for lp in plan.layers:
            if lp.split is not None:
                assert lp.layer.kind in ("filter", "pool") and lp.exchange.messages_received
                inner, strips = lp.split
                assert inner.size + sum(s.size for s in strips) == lp.sites.size
        split = MPI.COMM_WORLD.allreduce(sum(lp.split is not None for lp in plan.layers))
        if comm.Get_size() > 1:
            assert split > 0
        grid.free()
