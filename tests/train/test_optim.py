"""Every update rule against its formula, written out directly; schedules; saving state."""
import math

import numpy as np
import pytest

from cotsdl.train import optim, schedules as sch

rng = np.random.default_rng(0)
P0 = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
GS = [{"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)} for _ in range(3)]


def run(opt):
    p = {k: v.copy() for k, v in P0.items()}
    for g in GS:
        opt.step(p, {k: v.copy() for k, v in g.items()})
    return p


def direct(update, slots=()):
    """Apply ``update(p, g, state, t)`` per array, t = 1, 2, 3."""
    out = {}
    for k in P0:
        p = P0[k].copy()
        st = {s: np.zeros_like(p) for s in slots}
        for t, g in enumerate(GS, start=1):
            p = update(p, g[k], st, t)
        out[k] = p
    return out


def close(a, b):
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-14)


def test_sgd():
    close(run(optim.SGD(0.1)), direct(lambda p, g, s, t: p - 0.1 * g))


def test_sgd_weight_decay():
    close(run(optim.SGD(0.1, weight_decay=0.01)), direct(lambda p, g, s, t: p - 0.1 * (g + 0.01 * p)))


def test_momentum():
    def up(p, g, s, t):
        s["v"] = 0.9 * s["v"] + g
        return p - 0.1 * s["v"]
    close(run(optim.Momentum(0.1, 0.9)), direct(up, ("v",)))


def test_nesterov():
    def up(p, g, s, t):
        s["v"] = 0.9 * s["v"] + g
        return p - 0.1 * (g + 0.9 * s["v"])
    close(run(optim.Nesterov(0.1, 0.9)), direct(up, ("v",)))


def test_adagrad():
    def up(p, g, s, t):
        s["G"] = s["G"] + g * g
        return p - 0.1 * g / (np.sqrt(s["G"]) + 1e-10)
    close(run(optim.AdaGrad(0.1)), direct(up, ("G",)))


def test_rmsprop():
    def up(p, g, s, t):
        s["E"] = 0.9 * s["E"] + 0.1 * g * g
        return p - 0.01 * g / (np.sqrt(s["E"]) + 1e-8)
    close(run(optim.RMSProp(0.01, rho=0.9)), direct(up, ("E",)))


def test_adam():
    def up(p, g, s, t):
        s["m"] = 0.9 * s["m"] + 0.1 * g
        s["v"] = 0.999 * s["v"] + 0.001 * g * g
        return p - 0.01 * (s["m"] / (1 - 0.9 ** t)) / (np.sqrt(s["v"] / (1 - 0.999 ** t)) + 1e-8)
    close(run(optim.Adam(0.01)), direct(up, ("m", "v")))


def test_lars():
    def up(p, g, s, t):
        local = 0.02 * np.linalg.norm(p) / (np.linalg.norm(g) + 1e-3 * np.linalg.norm(p))
        s["v"] = 0.9 * s["v"] + 0.5 * local * (g + 1e-3 * p)
        return p - s["v"]
    close(run(optim.LARS(0.5, momentum=0.9, eta=0.02, weight_decay=1e-3)), direct(up, ("v",)))


def test_lamb():
    def up(p, g, s, t):
        s["m"] = 0.9 * s["m"] + 0.1 * g
        s["v"] = 0.999 * s["v"] + 0.001 * g * g
        r = (s["m"] / (1 - 0.9 ** t)) / (np.sqrt(s["v"] / (1 - 0.999 ** t)) + 1e-6) + 0.01 * p
        return p - 0.05 * np.linalg.norm(p) / np.linalg.norm(r) * r
    close(run(optim.LAMB(0.05, eps=1e-6, weight_decay=0.01)), direct(up, ("m", "v")))


def test_clipping_by_global_norm():
    opt = optim.SGD(1.0, clip_norm=0.5)
    p = {k: v.copy() for k, v in P0.items()}
    g = GS[0]
    total = math.sqrt(sum(np.sum(v * v) for v in g.values()))
    assert total > 0.5
    opt.step(p, {k: v.copy() for k, v in g.items()})
    close(p, {k: P0[k] - g[k] * 0.5 / total for k in P0})


@pytest.mark.parametrize("make", [lambda: optim.Momentum(0.1, clip_norm=0.5), lambda: optim.Adam(0.1, clip_norm=0.5)])
def test_a_clipped_gradient_goes_into_a_kept_work_array(make, monkeypatch):
    """The clipped gradient is written into a work array kept from step to step (a new weight-sized array
    each step was page-faulted afresh), the caller's gradient is left as it was, and the squares of its
    norm are summed a piece at a time: the update is the one of the gradient scaled by hand."""
    monkeypatch.setattr(optim, "SQUARES_CHUNK", 3)  # pieces end inside every array
    g = GS[0]
    total = math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in g.values()))
    assert optim.sum_squares(g["a"]) == pytest.approx(float(np.sum(g["a"].astype(np.float64) ** 2)), rel=1e-12)
    opt, ref = make(), make()
    ref.clip_norm = None
    p, q = ({k: v.copy() for k, v in P0.items()} for _ in range(2))
    kept = None
    for _ in range(2):
        grads = {k: v.copy() for k, v in g.items()}
        opt.step(p, grads)
        ref.step(q, {k: v * v.dtype.type(0.5 / total) for k, v in g.items()})
        close(p, q)
        for k in g:
            np.testing.assert_array_equal(grads[k], g[k])  # not scaled in place
        work = {key: id(a) for key, a in opt._work.items() if key[1] == optim.CLIPPED}
        assert len(work) == len(g) and (kept is None or work == kept)  # the same arrays every step
        kept = work

def test_schedules():
    assert sch.Constant(0.1)(100) == 0.1
    assert sch.StepDecay(1.0, 10, 0.5)(25) == 0.25
    assert sch.Polynomial(1.0, 10, 2.0, 0.1)(5) == pytest.approx(0.9 * 0.25 + 0.1)
    assert sch.Polynomial(1.0, 10)(50) == 0.0
    assert sch.Cosine(1.0, 10, 0.0)(5) == pytest.approx(0.5)
    w = sch.Warmup(sch.Cosine(1.0, 100), warmup_steps=10)
    peak = sch.Cosine(1.0, 100)(10)  # a ramp to the schedule's rate at step 10 that trains from its first step
    assert w(0) == pytest.approx(peak / 11) and w(5) == pytest.approx(6 / 11 * peak) and w(50) == sch.Cosine(1.0, 100)(50)
    assert sch.Warmup(sch.Constant(1.0), 3, start_factor=0.5)(0) == pytest.approx(0.5 + 0.5 / 4)
    for s in (sch.Constant(0.1), sch.StepDecay(1.0, 10), w):
        assert sch.from_description(sch.describe(s)) == s


def test_no_schedule_is_zero_by_accident():
    """A decaying schedule's warm-up must end before it does (it would ramp to its end value, 0); steps
    past a decay to 0 are named (the trainer refuses them)."""
    for after, floor in ((sch.Cosine(0.01, 5), "min_lr = 0"), (sch.Polynomial(0.01, 5, end_lr=1e-4), "end_lr = 0.0001")):
        with pytest.raises(ValueError) as e:
            optim.SGD(sch.Warmup(after, warmup_steps=5))
        assert str(e.value).startswith("warmup_steps = 5 must be less than total_steps = 5") and floor in str(e.value)
    with pytest.raises(ValueError, match="warmup_steps = 50 must be less than total_steps = 5"):
        sch.from_config(0.01, {"kind": "cosine", "total_steps": 5, "warmup_steps": 50})
    assert sch.from_config(0.01, {"kind": "cosine", "total_steps": 5, "warmup_steps": 4})(0) > 0
    assert sch.from_config(0.01, {"kind": "step", "step_size": 2, "warmup_steps": 50})(0) > 0  # no end to pass
    cos = sch.Warmup(sch.Cosine(1.0, 100), 10)
    assert sch.zero_error(cos, 0, 100) is None and sch.zero_error(cos, 100, 100) is None
    assert "rate is 0 from step 101 on" in sch.zero_error(cos, 30, 150)
    assert "rate is 0 from step 101 on" in sch.zero_error(sch.Polynomial(1.0, 100, power=3.0), 0, 101)
    assert "underflows" in sch.zero_error(sch.StepDecay(1.0, 1, 0.01), 0, 400)


def test_schedule_drives_the_step():
    opt = optim.SGD(sch.StepDecay(1.0, 2, 0.5))
    p = {"a": np.zeros(1)}
    for _ in range(4):
        opt.step(p, {"a": np.ones(1)})
    assert p["a"][0] == -(1 + 1 + 0.5 + 0.5)


@pytest.mark.parametrize("make", [lambda: optim.Adam(0.01), lambda: optim.LARS(0.1), lambda: optim.Nesterov(0.1),
                                  lambda: optim.AdaGrad(0.1, weight_decay=0.1)])
def test_state_round_trip_continues_identically(make):
    a = make()
    pa = {k: v.copy() for k, v in P0.items()}
    a.step(pa, GS[0])
    b = make()
    b.load_state_dict(a.state_dict())
    pb = {k: v.copy() for k, v in pa.items()}
    a.step(pa, GS[1])
    b.step(pb, GS[1])
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k])


def test_float32_updates_stay_float32():
    p = {"a": np.ones(4, np.float32)}
    for opt in (optim.Adam(0.01), optim.LAMB(0.01), optim.LARS(0.1), optim.RMSProp(0.01)):
        opt.step(p, {"a": np.full(4, 0.5, np.float32)})
        assert p["a"].dtype == np.float32


def test_bad_hyper_parameters_are_named():
    with pytest.raises(ValueError, match="learning rate must be > 0"):
        optim.SGD(-1)
    with pytest.raises(ValueError, match="momentum"):
        optim.SGD(0.1, momentum=1.5)
    with pytest.raises(ValueError, match="clip_norm"):
        optim.Adam(0.1, clip_norm=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        optim.SGD(sch.Warmup(sch.Constant(0.1), 0))
