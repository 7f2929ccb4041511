"""NetworkPlan.step(): a step's windows and results in memory lent by the plan, the same every step.

The results must be the same bits as with fresh arrays, the memory must be reused (so a
script trains without page faults whatever malloc does), bounded to one step's worth,
and arrays made outside a step must never be recycled.
"""
import numpy as np
import pytest
from mpi4py import MPI

from cotsdl import ops
from cotsdl.array import DistArray, ProcessGrid
from cotsdl.nn import Network, NetworkPlan
from cotsdl.train.objective import StageObjective

DESC = {
    "input": [14, 13, 2],
    "stages": [
        {"filter": {"size": [3, 3], "stride": [1, 1], "block": [1, 2], "channels": 2},
         "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01},
         "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
        {"filter": {"size": [2, 3], "stride": [1, 2], "channels": 2},
         "pool": {"size": [2, 1], "stride": [1, 1], "eps": 0.01},
         "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
    ],
}


def _plan():
    net = Network.from_description(DESC)
    plan = NetworkPlan(net, ProcessGrid(MPI.COMM_SELF, (1, 1)), batch=3, dtype=np.float32)
    return net, plan, plan.init_params(seed=1)


def _images(plan, seed):
    data = np.random.default_rng(seed).standard_normal(plan.input_owned.shape).astype(np.float32)
    return plan.input_array(data)


def _taped(seed_x, seed_dy):
    """A plan, its parameters, the tape of a forward pass and a random output gradient."""
    _, plan, params = _plan()
    x = _images(plan, seed_x)
    _, tape = plan.forward(x, params)
    dy = DistArray(x.comm, plan.output_shape, plan.output_owned, plan.output_owned,
                   data=np.random.default_rng(seed_dy).standard_normal(plan.output_owned.shape).astype(np.float32))
    return plan, params, tape, dy


def _everything(plan, params, x, stage):
    """A whole forward and backward of the network, and a stage objective: every array kind the plan lends."""
    y, tape = plan.forward(x, params)
    dy = DistArray(x.comm, plan.output_shape, plan.output_owned, plan.output_owned,
                   data=np.ones(plan.output_owned.shape, np.float32))
    dx, grads = plan.backward(dy, tape, params)
    li = plan.network.layer_index(stage, "filter")
    xs = x if stage == 0 else plan.forward(x, params, upto=li)[0]
    parts, dw = StageObjective(plan, stage, 0.1).value_and_grad(xs, params[li])
    return [y.data.copy(), dx.data.copy(), *(g.copy() for g in grads.values()), np.float64(parts.total), dw.copy()]


def test_lent_memory_gives_the_same_bits_and_is_reused():
    _, fresh_plan, params = _plan()
    _, plan, _ = _plan()
    for step, stage in enumerate([0, 0, 1, 1, 0]):
        x = _images(plan, step)
        want = _everything(fresh_plan, params, x, stage)
        with plan.step():
            got = _everything(plan, params, x, stage)
            y, tape = plan.forward(x, params)
            windows = [a.ctypes.data for a in tape.inputs]
            # On one rank every window is the owned box: the first layer reads the caller's images
            # in place, each later layer the output before it (lent memory); nothing is copied.
            assert tape.inputs[0] is x.data
            assert all(a is b for a, b in zip(tape.inputs[1:], tape.outputs[:-1]))
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        if step == 1:  # the second step of the same stage ran in the first one's memory
            assert windows[1:] == first_windows[1:]
        if step == 0:
            first_windows = windows
    held = []
    for stage in (1, 0, 0):  # after a stage change, the memory held is that of one step
        with plan.step():
            _everything(plan, params, _images(plan, 9), stage)
        held.append(plan.outputs.nbytes)
    assert held[2] == held[1]


def test_outside_a_step_every_array_is_new():
    _, plan, params = _plan()
    x = _images(plan, 0)
    with plan.step():
        inside, _ = plan.forward(x, params)
    y1, t1 = plan.forward(x, params)
    y2, t2 = plan.forward(x, params)
    assert t1.inputs[0] is x.data and t2.inputs[0] is x.data  # the caller's images, read in place
    for a, b in zip(t1.inputs[1:] + t1.outputs + [y1.data], t2.inputs[1:] + t2.outputs + [y2.data]):
        assert not np.shares_memory(a, b)
    with plan.step():  # nor is what was made outside a step lent out later
        y3, t3 = plan.forward(x, params)
    for a in t1.inputs[1:] + t1.outputs + [y1.data]:
        for b in t3.inputs[1:] + t3.outputs + [y3.data]:
            assert not np.shares_memory(a, b)


def test_nested_steps_are_one_step():
    _, plan, params = _plan()
    x = _images(plan, 0)
    with plan.step():
        y1, _ = plan.forward(x, params)
        with plan.step():
            y2, _ = plan.forward(x, params)
        y3, _ = plan.forward(x, params)
    assert not np.shares_memory(y1.data, y2.data) and not np.shares_memory(y2.data, y3.data)


def test_outputs_lend_by_shape_and_let_go_of_what_a_step_did_not_use():
    out = ops.Outputs()
    assert out.empty((2, 3), np.float32).shape == (2, 3) and out.nbytes == 0  # inactive: plain arrays
    out.active = True
    a, b = out.empty((4,), np.float32), out.empty((4,), np.float32)
    c = out.empty((4,), np.float64)
    assert len({id(a), id(b), id(c)}) == 3
    out.recycle()
    a2 = out.empty((4,), np.float32)
    assert a2 is a
    out.release_unused()  # b and c were not asked for in that step: let go
    assert out.nbytes == a2.nbytes


def test_weight_gradients_into_kept_buffers_set_or_add():
    """``grads_into`` receives the weight gradients; ``accumulate=True`` adds them (the tied
    objective's decoder + encoder sum), bit for bit what adding the fresh gradients gives."""
    plan, params, tape, dy = _taped(3, 4)
    _, fresh = plan.backward(dy, tape, params)
    start = {i: np.random.default_rng(i).standard_normal(g.shape).astype(np.float32) for i, g in fresh.items()}
    into = {i: s.copy() for i, s in start.items()}
    _, added = plan.backward(dy, tape, params, grads_into=into, accumulate=True)
    for i in fresh:
        assert added[i] is into[i]
        np.testing.assert_array_equal(into[i], start[i] + fresh[i])
    _, kept = plan.backward(dy, tape, params, grads_into=into)
    for i in fresh:
        np.testing.assert_array_equal(kept[i], fresh[i])
    with pytest.raises(ValueError, match="accumulate=True needs grads_into"):
        plan.backward(dy, tape, params, accumulate=True)


def test_input_gradient_alone_skips_the_weight_gradients(monkeypatch):
    """``weight_grads=False`` (an optimal stimulus): the same input gradient bit for bit, no weight
    gradient computed; it refuses what would need one."""
    plan, params, tape, dy = _taped(5, 6)
    dx, grads = plan.backward(dy, tape, params)
    assert grads
    calls = []
    for cls in {type(lp.layer) for lp in plan.layers if lp.layer.kind == "filter"}:
        real = cls.weight_grad_local
        monkeypatch.setattr(cls, "weight_grad_local", lambda *a, real=real, **k: calls.append(1) or real(*a, **k))
    alone, none = plan.backward(dy, tape, params, weight_grads=False)
    assert none == {} and not calls
    np.testing.assert_array_equal(alone.data, dx.data)
    plan.backward(dy, tape, params)
    assert calls  # the count above is of real calls
    for bad in (dict(input_grad=False), dict(grads_into={i: g.copy() for i, g in grads.items()}),
                dict(also={i: (None, None) for i in grads})):
        with pytest.raises(ValueError, match="weight_grads=False computes the input gradient only"):
            plan.backward(dy, tape, params, weight_grads=False, **bad)
