"""The optimal stimulus: the input gradient of one neuron equals finite differences; the ascent climbs
under the norm constraint."""
import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.array import ProcessGrid
from cotsdl.evaluate import stimulus
from cotsdl.nn import Network, NetworkPlan

NET = {"input": [9, 8, 2], "stages": [
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 3}, "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.1},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 0.01}},
    {"filter": {"size": [2, 2], "stride": [1, 1], "channels": 2}, "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.1},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 0.01}}]}


@pytest.fixture(scope="module")
def plan():
    net = Network.from_description(NET)
    return NetworkPlan(net, ProcessGrid(MPI.COMM_SELF, (1, 1)), 1, np.float64)


@pytest.mark.parametrize("layer, position", [(0, (2, 3, 1)), (2, (1, 1, 2)), (5, (1, 0, 1)), (3, (0, 2, 0))])
def test_input_gradient_equals_finite_differences(plan, layer, position):
    params = plan.init_params(3)
    x = np.random.default_rng(0).standard_normal((9, 8, 2, 1))
    value, g = stimulus.response_and_gradient(plan, params, x, layer, position)
    rng = np.random.default_rng(1)
    for _ in range(6):
        d = rng.standard_normal(x.shape)
        h = 1e-6
        plus = stimulus.response_and_gradient(plan, params, x + h * d, layer, position)[0]
        minus = stimulus.response_and_gradient(plan, params, x - h * d, layer, position)[0]
        assert (plus - minus) / (2 * h) == pytest.approx(float(np.sum(g * d)), rel=1e-5, abs=1e-8)
    assert value == pytest.approx(stimulus.response_and_gradient(plan, params, x, layer, position)[0])


def test_ascent_climbs_and_keeps_the_norm(plan):
    params = plan.init_params(3)
    img, trace = stimulus.optimal_stimulus(plan, params, 5, (1, 0, 1), norm=4.0, steps=40, lr=0.05)
    assert img.shape == (9, 8, 2)
    assert np.linalg.norm(img) == pytest.approx(4.0, rel=1e-9)
    assert trace[-1] > trace[0] and trace[-1] >= max(trace[:5])
    again, trace2 = stimulus.optimal_stimulus(plan, params, 5, (1, 0, 1), norm=4.0, steps=40, lr=0.05)
    assert np.array_equal(img, again) and trace == trace2  # deterministic given the seed


def test_descent_for_a_neuron_low_for_faces(plan):
    """sign -1 minimizes: a filter unit (linear in the input) goes to minus its filter's direction."""
    params = plan.init_params(3)
    img, trace = stimulus.optimal_stimulus(plan, params, 0, (2, 3, 1), norm=4.0, steps=40, lr=0.05, sign=-1)
    assert np.linalg.norm(img) == pytest.approx(4.0, rel=1e-9)
    assert trace[-1] < trace[0] and trace[-1] <= min(trace[:5])
    up, _ = stimulus.optimal_stimulus(plan, params, 0, (2, 3, 1), norm=4.0, steps=40, lr=0.05)
    field = (slice(2, 5), slice(3, 6))  # its receptive field; outside, both keep the same random start
    assert np.corrcoef(img[field].ravel(), up[field].ravel())[0, 1] < -0.9
