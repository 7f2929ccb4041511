"""``NetworkPlan(fuse_filter=...)``: a frozen stage's filter, pool and LCN on one exchange of its input (the
filter on grown sites with a weight halo fetched once) give the per-layer forward bit for bit.

Run: mpiexec -n P python -m mpi4py tests/mpi_pytest.py tests/mpi/test_fuse_filter.py  (P = 1..4)
"""
import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.array import DistArray, ProcessGrid, gather
from cotsdl.nn import NetworkPlan
from helpers import agree, grids
from netcases import network

BATCH = 3


def _forward(plan, images, params, upto=None, frozen=None):
    x = plan.input_array(images[plan.input_owned.slices_in(plan.input_array().global_box)].copy())
    y, tape = plan.forward(x, params, upto=upto, frozen=frozen)
    return y, tape


def _images(net, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(net.input_shape + (BATCH,)).astype(dtype)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("dims", grids())
def test_a_frozen_fused_forward_is_bitwise_the_per_layer_one(comm, dims, dtype, overlap):
    """Every stage fused with its filter, on every grid, to every stage's output: the same bits as one
    exchange per layer, on P ranks and on one."""
    net = network()
    grid = ProcessGrid(comm, dims)
    plain = NetworkPlan(net, grid, BATCH, dtype, overlap=overlap)
    fused = NetworkPlan(net, grid, BATCH, dtype, overlap=overlap, fuse=(0, 1, 2), fuse_filter=(0, 1, 2))
    images, params = _images(net, dtype), plain.init_params(seed=11)
    one = ProcessGrid(MPI.COMM_SELF, (1, 1))  # on one rank too (P ranks differ from one in the LCN's sums' order)
    serial = NetworkPlan(net, one, BATCH, dtype, fuse=(0, 1, 2), fuse_filter=(0, 1, 2))
    serial_plain = NetworkPlan(net, one, BATCH, dtype)
    for k in range(len(net.stages)):
        upto = net.layer_index(k, "lcn") + 1
        want = gather(_forward(plain, images, params, upto)[0])
        y, tape = _forward(fused, images, params, upto, frozen="w")
        got = gather(y)
        assert tape.frozen == frozenset(net.layer_index(j, "filter") for j in range(k + 1))
        y1 = _forward(serial, images, serial.init_params(seed=11), upto, frozen="w")[0].data
        want1 = _forward(serial_plain, images, serial.init_params(seed=11), upto)[0].data
        np.testing.assert_array_equal(y1, want1, err_msg=f"stages 0..{k} on one rank")
        if comm.Get_rank() == 0:
            np.testing.assert_array_equal(got, want, err_msg=f"stages 0..{k} on grid {dims}")
    # a run that starts at a stage's input, and one that ends inside a stage (its filter then runs per layer)
    f1, l1 = net.layer_index(1, "filter"), net.layer_index(1, "lcn")
    h, _ = _forward(plain, images, params, upto=f1)
    want = gather(plain.forward(h, params, start=f1, upto=l1 + 1)[0])
    got, tape = fused.forward(h, params, start=f1, upto=l1 + 1, frozen="w")
    assert tape.frozen == {f1}
    assert not _forward(fused, images, params, upto=f1 + 2, frozen="w")[1].frozen - {0}
    got = gather(got)
    if comm.Get_rank() == 0:
        np.testing.assert_array_equal(got, want)
    grid.free()


def test_a_frozen_stage_exchanges_its_input_once_and_its_weights_once_per_token(comm):
    """Messages of a frozen fused stage: its filter's one exchange, none for the pool and the LCN; the
    weight halo moves once per frozen token, again for a new token or a new weight array, and then
    the forward uses the new weights."""
    net = network()
    grid = ProcessGrid(comm, (comm.Get_size(), 1))
    plan = NetworkPlan(net, grid, BATCH, np.float64, fuse=[0], fuse_filter=[0])
    plain = NetworkPlan(net, grid, BATCH, np.float64)
    images, params = _images(net, np.float64), plan.init_params(seed=3)
    f, p, l = (net.layer_index(0, k) for k in ("filter", "pool", "lcn"))

    def messages(frozen):
        before = {id(e): e.messages for e in plan.exchanges()}
        y, _ = _forward(plan, images, params, upto=l + 1, frozen=frozen)
        return {id(e): e.messages - before[id(e)] for e in plan.exchanges()}, gather(y)

    first, y1 = messages("a")
    again, y2 = messages("a")
    halo = id(plan.weight_exchanges[f])
    others = [id(plan.layers[i].exchange) for i in (f, p, l)] + [id(plan.fused[p].exchange)]
    assert all(again[i] == 0 for i in others) and all(first[i] == 0 for i in others)
    assert plan.halo_fetches == 1 and again[halo] == 0
    assert first[id(plan.frozen[f].exchange)] == again[id(plan.frozen[f].exchange)]
    if comm.Get_size() > 1:  # one exchange of the stage's input, and the weights once
        assert agree(comm, first[halo] > 0 or plan.weight_exchanges[f].messages_received == 0)
        assert comm.allreduce(again[id(plan.frozen[f].exchange)]) > 0
    params[f] *= 2.0  # changed in place: the same token would keep the old halo; a new one refetches
    _, y3 = messages("b")
    assert plan.halo_fetches == 2
    params[f] = params[f].copy()  # a new array (a resumed run's): refetched under the same token
    messages("b")
    assert plan.halo_fetches == 3
    want = gather(_forward(plain, images, params, upto=l + 1)[0])
    if comm.Get_rank() == 0:
        np.testing.assert_array_equal(y1, y2)
        np.testing.assert_array_equal(y3, want)
        assert not np.array_equal(y1, y3)
    assert plan.describe().count("weight halo") == 1
    grid.free()


def test_a_frozen_tape_has_no_backward_and_fuse_filter_needs_fuse(comm):
    net = network()
    grid = ProcessGrid(comm, (1, comm.Get_size()))
    with pytest.raises(ValueError, match="fuse_filter: stage 1 fuses its filter but not its pool"):
        NetworkPlan(net, grid, BATCH, np.float32, fuse=[0], fuse_filter=[0, 1])
    with pytest.raises(ValueError, match="fuse_filter: stage 5 is not a stage"):
        NetworkPlan(net, grid, BATCH, np.float32, fuse=[0], fuse_filter=[5])
    plan = NetworkPlan(net, grid, BATCH, np.float32, fuse=[0], fuse_filter=[0])
    params = plan.init_params(0)
    _, tape = _forward(plan, _images(net, np.float32), params, upto=3)  # without frozen: pool and LCN fused only
    assert tape.frozen == frozenset() and tape.fused == {1} and plan.halo_fetches == 0
    y, tape = _forward(plan, _images(net, np.float32), params, upto=3, frozen=0)
    assert tape.frozen == {0} and plan.halo_fetches == 1
    with pytest.raises(ValueError, match="frozen forward"):
        plan.backward(y, tape, params)
    grid.free()


@pytest.mark.parametrize("dims", grids())
def test_every_ranks_weight_box_is_the_shape_of_its_weights(comm, dims):
    """A rank's own weight box has the shape of the weights it holds, also where it owns no sites (the
    demo's top stage on 2 ranks: checkpoints, stage statistics and the evaluation read by it), and the box
    of no sites (a weight halo with nothing to fetch) is empty."""
    from cotsdl.array import Box
    from cotsdl.nn import Network

    net = Network.from_description({"input": [16, 16, 1], "stages": [
        {"filter": {"size": [5, 5], "stride": [1, 1], "channels": 2}, "pool": {"size": [2, 2], "stride": [2, 2],
                                                                             "eps": 0.01},
         "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
        {"filter": {"size": [6, 6], "stride": [1, 1], "channels": 3}, "pool": {"size": [1, 1], "stride": [1, 1],
                                                                             "eps": 0.01},
         "lcn": {"size": 1, "sigma": 1.0, "eps": 1e-3}}]})
    plan = NetworkPlan(net, ProcessGrid(comm, dims), BATCH, np.float32)
    params = plan.init_params(seed=1)
    for li, w in params.items():
        assert plan.weight_box(li)[1].shape == w.shape, (li, plan.weight_box(li)[1], w.shape)
    assert plan.weight_box(0, Box.empty(2))[1].is_empty
