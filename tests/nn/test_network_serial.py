"""Networks on one process: descriptions, shapes, errors, and finite differences through a whole network."""
import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.array import DistArray, ProcessGrid
from cotsdl.nn import LCN, L2Pool, LocalFilter, Network, NetworkPlan, Stage

DESC = {
    "input": [12, 11, 2],
    "stages": [
        {"filter": {"size": [3, 3], "stride": [1, 1], "block": [1, 2], "channels": 2},
         "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01},
         "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
        {"filter": {"size": [2, 3], "stride": [1, 2], "channels": 2},
         "pool": {"size": [2, 1], "stride": [1, 1], "eps": 0.01},
         "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
    ],
}


def test_description_round_trip_and_shapes():
    net = Network.from_description(DESC)
    assert Network.from_description(net.describe()).describe() == net.describe()
    # 12x11 -> filter 10x9 sites, block 1x2 -> 10x18x2 -> pool 5x9 -> lcn 5x9
    assert net.shapes[:4] == [(12, 11, 2), (10, 18, 2), (5, 9, 2), (5, 9, 2)]
    assert net.filter_layers() == [0, 3]


def test_bad_descriptions_name_the_problem():
    with pytest.raises(ValueError, match="bad network description"):
        Network.from_description({"input": [8, 8, 1]})
    with pytest.raises(ValueError, match="does not fit its input"):
        Network([4, 4, 1], [Stage(LocalFilter((5, 5), (1, 1), 2), L2Pool((1, 1), (1, 1)), LCN(1, 1.0))])
    with pytest.raises(ValueError, match="filter stride"):
        LocalFilter((3, 3), (0, 1), 2)
    with pytest.raises(ValueError, match="lcn size"):
        LCN(4, 1.0)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["stages"][0]["filter"].update(chanels=3), r"unknown key stages\[0\].filter.chanels; did you mean"),
    (lambda d: d["stages"][0]["filter"].update(stride=[2.5, 2]), r"stages\[0\].filter: filter stride must be a pair "
                                                                  r"of integers >= 1, got \(2.5, 2\)"),
    (lambda d: d["stages"][0]["filter"].update(channels=5.7), "filter channels must be a positive integer, got 5.7"),
    (lambda d: d["stages"][0]["pool"].update(eps="0.01"), "pool eps must be a number, got '0.01'"),
    (lambda d: d["stages"][0]["lcn"].update(sigma="1"), "lcn sigma must be a number, got '1'"),
    (lambda d: d["stages"][0]["lcn"].pop("sigma"), r"stages\[0\].lcn needs sigma"),
    (lambda d: d.update(inputs=[8, 8, 1]), "unknown key network.inputs; did you mean 'input'"),
    (lambda d: d.update(input=[12, 11.0, 2]), r"input must be \[H, W, C\] integers"),
])
def test_descriptions_are_not_coerced(change, message):
    import copy

    d = copy.deepcopy(DESC)
    change(d)
    with pytest.raises(ValueError, match=message):
        Network.from_description(d)


def test_layer_costs_follow_design():
    f = LocalFilter((8, 8), (4, 4), 16)
    c = f.cost((32, 32, 8, 64))["forward"]
    assert c.flops == 2 * 49 * 16 * (8 * 8 * 8) * 64


def test_whole_network_gradients_by_finite_differences():
    net = Network.from_description(DESC)
    grid = ProcessGrid(MPI.COMM_SELF, (1, 1))
    plan = NetworkPlan(net, grid, 2, np.float64)
    rng = np.random.default_rng(0)
    images = rng.standard_normal(net.input_shape + (2,))
    r = rng.standard_normal(plan.output_shape)
    params = plan.init_params(seed=3)

    def loss(imgs, prm):
        y, _ = plan.forward(plan.input_array(imgs.copy()), prm)
        return float(np.sum(y.data * r))

    y, tape = plan.forward(plan.input_array(images.copy()), params)

    dy = DistArray(grid.comm, plan.output_shape, plan.output_owned, plan.output_owned, data=r.copy())
    dx, grads = plan.backward(dy, tape, params)
    h = 1e-6
    for _ in range(6):  # random coordinates of the input and of every weight tensor
        idx = tuple(int(rng.integers(0, s)) for s in images.shape)
        e = np.zeros_like(images)
        e[idx] = h
        num = (loss(images + e, params) - loss(images - e, params)) / (2 * h)
        assert abs(num - dx.data[idx]) <= 1e-6 * max(1.0, abs(num))
        for li, w in params.items():
            widx = tuple(int(rng.integers(0, s)) for s in w.shape)
            wp = {k: v.copy() for k, v in params.items()}
            wm = {k: v.copy() for k, v in params.items()}
            wp[li][widx] += h
            wm[li][widx] -= h
            num = (loss(images, wp) - loss(images, wm)) / (2 * h)
            assert abs(num - grads[li][widx]) <= 1e-6 * max(1.0, abs(num))
    grid.free()
