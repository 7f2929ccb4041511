"""Training that stopped being training stops the trainer (issue 38): filters the update broke, a silent
stage, a frozen loss; never a checkpoint of the dead state.  And no schedule trains at rate 0."""
import io
import os

import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.io import checkpoint
from cotsdl.nn import Network
from cotsdl.nn.network import filter_norms, project_norm
from cotsdl.train import SGD, Adam, GreedyTrainer, InMemorySource, Momentum, schedules, vitals

NET = {"input": [12, 12, 1], "stages": [
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 3}, "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
    {"filter": {"size": [2, 2], "stride": [1, 1], "channels": 2}, "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}}]}


def images(n=20, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 12, 12, 1))


def trainer(tmp_path=None, opt=None, data=None, **kw):
    kw.setdefault("filter_norm", "auto")
    return GreedyTrainer(Network.from_description(NET), data or InMemorySource(images()), opt or Adam(0.01),
                         comm=MPI.COMM_SELF, batch=4, log_every=0, log=kw.pop("log", open(os.devnull, "w")),
                         checkpoint_dir=None if tmp_path is None else str(tmp_path), **kw)


# ------------------------------------------------------------------ the pieces

def test_active_units_vary_over_the_batch_or_with_one_image_are_non_zero():
    h = np.zeros((5, 4, 3, 6), np.float32)
    assert not vitals.active(h)
    h[...] = 2.5  # the same for every image: silent too
    assert not vitals.active(h)
    h[4, 3, 2, 5] = 1.0  # the last unit, one image: found after the first units
    assert vitals.active(h)
    assert vitals.active(h[1:, 1:])  # a window's owned part: not contiguous
    assert not vitals.active(h[:4])
    one = np.zeros((2, 2, 3, 1))
    assert not vitals.active(one)
    one[1, 1, 2, 0] = -1e-30
    assert vitals.active(one)
    assert not vitals.active(np.zeros((0, 3, 2, 4)))


def test_norms_do_not_overflow_or_underflow_and_the_projection_keeps_such_filters():
    w = np.random.default_rng(0).standard_normal((2, 2, 3, 3, 3, 1)).astype(np.float32)
    plain = np.sqrt((w.astype(np.float64) ** 2).sum(axis=(-3, -2, -1), keepdims=True))
    w[0, 0, 0] *= 1e30  # squares overflow float32
    w[1, 1, 2] *= 1e-25  # squares underflow to 0
    w[0, 1, 1] = 0
    n = filter_norms(w)
    assert n.dtype == np.float32 and n.shape == (2, 2, 3, 1, 1, 1)
    assert n[0, 0, 0] == pytest.approx(1e30 * plain[0, 0, 0], rel=1e-5)
    assert n[1, 1, 2] == pytest.approx(1e-25 * plain[1, 1, 2], rel=1e-5) and n[0, 1, 1] == 0
    project_norm(w, 0.4, n)
    after = np.sqrt((w.astype(np.float64) ** 2).sum(axis=(-3, -2, -1)))
    assert np.allclose(np.delete(after.ravel(), 4), 0.4, rtol=1e-5) and after[0, 1, 1] == 0  # (it used to be 0)
    w[0, 0, 0, 0, 0, 0] = np.inf
    assert not np.isfinite(filter_norms(w)[0, 0, 0])


def test_bad_norms_are_not_finite_zero_or_beyond_the_dtype_rounding_of_the_fixed_norm():
    n = np.array([0.5, 0.0, np.inf, np.nan, 0.4 / np.finfo(np.float32).eps * 1.01, 1e6], np.float32)
    assert vitals.bad_norms(n, 0.4, np.float32) == 4
    assert vitals.bad_norms(n[[0, 4, 5]], 0.4, np.float64) == 0  # float64 keeps a much larger update


def test_vitals_streaks():
    v = vitals.Vitals(np.float32)
    v.begin(0)

    def step(active, loss, lr=0.01, last=False):
        return v.observe(v.signs(True, active, loss), lr, last)

    assert [step(False, float(i)) for i in range(vitals.DEAD_STEPS - 1)] == [None] * (vitals.DEAD_STEPS - 1)
    assert v.suspect.startswith("every unit was silent")
    why, likely = step(False, 99.0)
    assert f"silent (zero, or the same for every image of the batch) for the last {vitals.DEAD_STEPS} steps" in why
    assert "data.preprocess" in likely
    v.begin(1)  # another stage: no evidence
    assert v.suspect is None
    assert step(False, 1.0) is None and step(False, 2.0) is None
    why, likely = step(False, 3.0, last=True)  # a stage that ends sooner: its last 3 steps suffice
    assert "for the last 3 steps" in why and "the stages below give stage 1 a constant input" in likely
    v.reset()
    assert step(True, 5.0) is None
    for _ in range(4):
        assert step(True, 5.0 * (1 + 1e-8)) is None  # within float32's rounding: the same loss
    assert step(True, 5.0, lr=0.0) is None and v.same == 0  # at rate 0 a frozen loss is no evidence
    for _ in range(vitals.DEAD_STEPS - 2):  # (the step at rate 0 is the first of the run of one loss)
        assert step(True, 5.0) is None
    why, likely = step(True, 5.0, lr=3e-31)
    assert f"the loss stayed at 5 (to the weights' precision) for the last {vitals.DEAD_STEPS} steps" in why
    assert "train.optimizer.lr; this step's rate 3e-31" in likely
    v.reset()
    assert step(True, 5.0) is None and step(True, 5.001) is None and v.suspect is None  # it moves: training


# ------------------------------------------------------------------ the trainer stops

def _latest_verified(tmp_path):
    found, skipped = checkpoint.latest_verified(str(tmp_path))
    return found.name if found else None, skipped


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_a_learning_rate_of_1e30_stops_at_once_and_the_last_checkpoint_stays(tmp_path):
    """lr 1e30 used to leave every filter at norm 0 after one step (the projection divided by an overflowed
    norm) and train on to exit 0."""
    tr = trainer(tmp_path)
    tr.train_stage(0, 2)
    tr.save()
    tr.optimizer.schedule = schedules.as_schedule(1e30)
    with pytest.raises(RuntimeError) as e:
        tr.train_stage(0, 5)
    msg = str(e.value)
    assert msg.startswith("training stopped at step 3 of stage 0 (global step 3): the update left 300 filter(s)")
    assert "the learning rate is far too large (train.optimizer.lr; this step's rate 1e+30)" in msg
    assert "No checkpoint was written of this state; the last checkpoint" in msg and "ckpt-000000002, is intact" in msg
    assert getattr(e.value, "collective", False)
    assert _latest_verified(tmp_path) == ("ckpt-000000002", [])
    # unconstrained, the update itself overflows: the non-finite check says so, as before
    free = trainer(opt=SGD(1e40), filter_norm=None)
    with pytest.raises(RuntimeError, match="made the weights non-finite"):
        free.train_stage(0, 2)


def test_a_silent_stage_stops_and_no_checkpoint_is_written_of_it(tmp_path):
    log = io.StringIO()
    tr = trainer(tmp_path, checkpoint_every=1, log=log)
    tr.train_stage(0, 2)
    tr.data = InMemorySource(np.full((20, 12, 12, 1), 0.0))  # every image black: every unit silent
    with pytest.raises(RuntimeError) as e:
        tr.train_stage(0, 30)
    msg = str(e.value)
    assert msg.startswith(f"training stopped at step {2 + vitals.DEAD_STEPS} of stage 0")
    assert "every unit of the stage was silent" in msg and "the images are constant or all alike" in msg
    assert "ckpt-000000002, is intact" in msg and _latest_verified(tmp_path) == ("ckpt-000000002", [])
    assert "checkpoint at step 3 skipped: every unit was silent for the last 1 step(s)" in log.getvalue()
    # a stage shorter than the window: judged on its last steps
    short = trainer(data=InMemorySource(np.zeros((20, 12, 12, 1))))
    with pytest.raises(RuntimeError, match="training stopped at step 4 of stage 0 .* for the last 4 steps"):
        short.train_stage(0, 4)


def test_a_frozen_loss_at_a_positive_rate_stops():
    """One batch over and over (4 images, batch 4) at a rate whose updates are lost in rounding."""
    data = InMemorySource(images(4), shuffle=False)
    tr = trainer(opt=Adam(1e-30), data=data, filter_norm=None)
    with pytest.raises(RuntimeError, match=f"training stopped at step {vitals.DEAD_STEPS} of stage 0 .* the loss "
                       f"stayed at .* for the last {vitals.DEAD_STEPS} steps .*train.optimizer.lr; this step's "
                       "rate 1e-30"):
        tr.train_stage(0, 20)
    # at a fixed norm the projection rounds the weights anew each step: the loss moves in its last bits
    constrained = trainer(opt=Adam(1e-30), data=InMemorySource(images(4), shuffle=False))
    with pytest.raises(RuntimeError, match="the loss stayed at"):
        constrained.train_stage(0, 20)
    healthy = trainer(opt=Adam(0.01), data=InMemorySource(images(4), shuffle=False))
    healthy.train_stage(0, 20)


# ------------------------------------------------------------------ no schedule trains at rate 0

def test_a_stage_past_its_decay_to_zero_is_refused_before_any_step(tmp_path):
    tr = trainer(tmp_path, opt=Momentum(schedules.Cosine(0.01, total_steps=5)))
    with pytest.raises(ValueError) as e:
        tr.train([8, 3])
    assert str(e.value) == ("stage 0 would train at learning rate 0: the cosine schedule's rate is 0 from step 6 on: "
                            "the stage's 8 steps run past the schedule's total_steps = 5, where it ends at min_lr = 0; "
                            "give train.schedule.total_steps >= 8 or min_lr > 0")
    assert tr.step == 0 and not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="stage 1 would train at learning rate 0"):  # checked before stage 0 trains
        tr.train([5, 6])
    assert tr.step == 0
    tr.train([5, 5])
    assert min(r["lr"] for r in tr.history) > 0


def test_a_resume_that_shortens_a_stage_gives_the_next_stage_a_positive_rate_at_every_step(tmp_path):
    def opt(total, warmup):
        return Adam(schedules.Warmup(schedules.Cosine(0.01, total_steps=total), warmup_steps=warmup))

    tr = trainer(tmp_path, opt=opt(8, 3))
    tr.train_stage(0, 8)
    tr.save()
    with pytest.raises(ValueError, match="warmup_steps = 50 must be less than total_steps = 5 of the cosine schedule"):
        GreedyTrainer.resume(str(tmp_path), tr.data, Adam(schedules.Warmup(schedules.Cosine(0.01, 5), 50)),
                             comm=MPI.COMM_SELF)
    log = io.StringIO()
    again = GreedyTrainer.resume(str(tmp_path), tr.data, opt(5, 2), comm=MPI.COMM_SELF, log=log)
    again.train([5, 5])
    assert "stage 0 has trained 8 steps, more than the 5 asked" in log.getvalue()
    rates = [r["lr"] for r in again.history if r["stage"] == 1]
    assert len(rates) == 5 and min(rates) > 0 and rates[0] == pytest.approx(0.01 * schedules.Cosine(1.0, 5)(2) / 3)


def test_the_checks_stay_on_the_device(monkeypatch):
    """Norms (their rare overflow path too), the silence check and the count, on stand-in device arrays."""
    from devicestub import DeviceArray, device_backend

    from cotsdl import backend

    w = np.random.default_rng(0).standard_normal((2, 2, 3, 3, 3, 1)).astype(np.float32)
    w[0, 0, 0] *= 1e30
    with device_backend(monkeypatch):
        xp = backend.xp()
        d = xp.asarray(w)
        n = filter_norms(d)
        assert isinstance(n, DeviceArray) and vitals.bad_norms(n, 0.4, np.float32) == 1
        project_norm(d, 0.4, n)
        assert np.allclose(backend.to_numpy(filter_norms(d)), 0.4, rtol=1e-5)
        h = xp.zeros((3, 3, 2, 4), dtype=np.float32)
        assert not vitals.active(h) and not vitals.active(h[1:])
        h[2, 2, 1, 3] = 1.0
        assert vitals.active(h) and vitals.active(h[1:, 1:])


def test_a_checkpoint_whose_saved_schedule_is_refused_now_needs_a_given_one():
    """Saved before the warm-up rule: resuming with the saved optimizer is refused by name; a given one applies."""
    from cotsdl.train import resume

    bad = schedules.Warmup(schedules.Cosine(0.01, 5), 50)  # (built directly: never validated)
    meta = {"optimizer": {"kind": "Adam", "hyper": Adam(0.01).hyper(), "schedule": schedules.describe(bad)}}
    opt, err = resume.saved_optimizer(meta, None)
    assert opt is None and err.startswith("the checkpoint's optimizer cannot continue: warmup_steps = 50 must be less")
    assert resume.saved_optimizer(meta, Adam(0.01)) == (None, None)
    meta["optimizer"]["schedule"] = schedules.describe(schedules.Cosine(0.01, 5))
    opt, err = resume.saved_optimizer(meta, None)
    assert err is None and opt.schedule == schedules.Cosine(0.01, 5)
