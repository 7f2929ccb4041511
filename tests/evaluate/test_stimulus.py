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


FULL = {"input": [12, 12, 1], "stages": [
    {"filter": {"size": [12, 12], "stride": [1, 1], "channels": 4},
     "pool": {"size": [1, 1], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 1, "sigma": 1.0, "eps": 0.01}}]}


def face_template():
    """A smooth face-like layout: two dark eyes, a dark mouth on a bright oval."""
    yy, xx = np.mgrid[0:12, 0:12] / 11.0
    blob = lambda y, x, s: np.exp(-((yy - y) ** 2 + (xx - x) ** 2) / (2 * s ** 2))  # noqa: E731
    t = blob(0.5, 0.5, 0.3) - blob(0.38, 0.3, 0.08) - blob(0.38, 0.7, 0.08) - 0.8 * blob(0.72, 0.5, 0.08)
    return t - t.mean()


def test_a_planted_face_unit_gives_its_template_and_a_random_unit_does_not():
    """The stimulus measure: a unit whose filter is a face template gives a stimulus correlated with it
    (sign-free through the square pooling too), far above a random unit of the same layer."""
    net = Network.from_description(FULL)
    plan = NetworkPlan(net, ProcessGrid(MPI.COMM_SELF, (1, 1)), 1, np.float64)
    params = plan.init_params(5)
    t = face_template()
    params[0][0, 0, 1] = t[:, :, None]  # unit 1 of the only site
    kw = dict(norm=5.0, starts=3, steps=60, seed=2)
    planted = stimulus.best_of_starts(plan, params, 0, (0, 0, 1), **kw)
    random = stimulus.best_of_starts(plan, params, 0, (0, 0, 3), **kw)
    assert planted["even"] is False and random["even"] is False  # a filter output is linear: -x gives -r
    r_planted = stimulus.face_correlation(planted["images"], t, planted["even"])
    r_random = stimulus.face_correlation(random["images"], t, random["even"])
    assert r_planted.min() > 0.95 and np.abs(r_random).max() < 0.4, (r_planted, r_random)
    assert planted["best"] == int(np.argmax(planted["responses"]))
    # after the square pooling the sign is gone: measured as even, and |r| is taken
    pooled = stimulus.best_of_starts(plan, params, 1, (0, 0, 1), **kw)
    assert pooled["even"] is True
    assert stimulus.face_correlation(pooled["images"], t, pooled["even"]).min() > 0.95
    low = stimulus.best_of_starts(plan, params, 0, (0, 0, 1), sign=-1, **kw)  # the opposite polarity
    assert stimulus.face_correlation(low["images"], t, False).max() < -0.95


def test_a_small_start_leaves_no_noise_outside_the_field(plan):
    """The noise of the start stays where the gradient never reaches: a small start leaves little of it."""
    params = plan.init_params(3)
    big, _ = stimulus.optimal_stimulus(plan, params, 0, (2, 3, 1), norm=4.0, steps=40, lr=0.05)
    small, _ = stimulus.optimal_stimulus(plan, params, 0, (2, 3, 1), norm=4.0, steps=40, lr=0.05, init=0.01)
    field = np.zeros(big.shape, bool)
    field[2:5, 3:6] = True
    share = lambda img: np.sum(img[~field] ** 2) / np.sum(img ** 2)  # noqa: E731
    assert share(small) < 0.01 < share(big)


def test_gaussian_blur():
    x = np.zeros((9, 9, 1))
    x[4, 4] = 1.0
    y = stimulus.gaussian_blur(x, 1.0)
    assert y.sum() == pytest.approx(1.0) and y[4, 4] == y.max() and np.allclose(y, y[::-1, ::-1])
    assert y[4, 5] / y[4, 4] == pytest.approx(np.exp(-0.5), rel=1e-9)
    assert stimulus.gaussian_blur(x, 0.0) is x
