"""Distributed == serial for the stage objective J and its gradient, P = 1..4, several grids."""
import numpy as np
import pytest

from cotsdl.array import DistArray, ProcessGrid, gather
from cotsdl.nn import NetworkPlan
from cotsdl.train import StageObjective, sparse_ae_loss
from helpers import agree, grids
from netcases import network

BATCH = 3


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("stage", [0, 1])
@pytest.mark.parametrize("dims", grids())
def test_stage_objective_equals_serial(comm, dims, stage, tied):
    net = network()
    grid = ProcessGrid(comm, dims)
    plan = NetworkPlan(net, grid, BATCH, np.float64)
    f = plan.layers[3 * stage]
    rng = np.random.default_rng(stage)
    xg = rng.standard_normal(f.in_shape)
    params = plan.init_params(seed=5)
    w = params[f.index]
    x = DistArray(grid.comm, f.in_shape, f.src_owned, f.src_owned, data=xg[f.src_owned.slices_in(DistArray(
        grid.comm, f.in_shape, f.src_owned).global_box)].copy())
    lam = 0.3
    obj = StageObjective(plan, stage, lam)
    shape, box = plan.weight_box(f.index)
    if tied:
        parts, dw = obj.value_and_grad(x, w)
        grads = [dw]
    else:
        wd = (w * 0.5 + 0.01).copy()
        parts, dw, dwd = obj.value_and_grad(x, w, wd)
        grads = [dw, dwd]
    full = [gather(DistArray(grid.comm, shape, box, box, data=g)) for g in grads]
    wfull = gather(DistArray(grid.comm, shape, box, box, data=w))
    ok = True
    if comm.Get_rank() == 0:
        kw = dict(stride=f.layer.stride, block=f.layer.block, pool_size=plan.layers[3 * stage + 1].layer.size,
                  pool_stride=plan.layers[3 * stage + 1].layer.stride, lam=lam, eps=plan.layers[3 * stage + 1].layer.eps)
        ref = sparse_ae_loss(xg, wfull, **kw) if tied else sparse_ae_loss(xg, wfull, w_dec=wfull * 0.5 + 0.01, **kw)
        ok = abs(parts.total - ref[0]) <= 1e-12 * abs(ref[0])
        ok = ok and abs(parts.reconstruction + parts.sparsity - parts.total) <= 1e-12 * abs(ref[0])
        for got, want in zip(full, ref[1:]):
            ok = ok and np.abs(got - want).max() <= 1e-12 * np.abs(want).max()
    grid.free()
    assert agree(comm, ok)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dims", grids())
def test_objective_overlap_changes_no_bit(comm, dims, tied):
    net = network()
    out = {}
    for overlap in (True, False):
        grid = ProcessGrid(comm, dims)
        plan = NetworkPlan(net, grid, BATCH, np.float32, overlap=overlap)
        f = plan.layers[net.layer_index(1, "filter")]
        xg = np.random.default_rng(3).standard_normal(f.in_shape).astype(np.float32)
        x = DistArray(grid.comm, f.in_shape, f.src_owned, f.src_owned,
                      data=xg[f.src_owned.slices_in(DistArray(grid.comm, f.in_shape, f.src_owned).global_box)].copy())
        w = plan.init_params(seed=2)[f.index]
        res = StageObjective(plan, 1, 0.3).value_and_grad(x, w, None if tied else w * 0.5)
        out[overlap] = (res[0].total, res[0].reconstruction, *[np.asarray(g).copy() for g in res[1:]])
        grid.free()
    ok = out[True][:2] == out[False][:2] and all(np.array_equal(a, b) for a, b in zip(out[True][2:], out[False][2:]))
    assert agree(comm, ok)
