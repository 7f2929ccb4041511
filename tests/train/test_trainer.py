"""The trainer as a user drives it: real images, resume after a kill, the numerical guard, bad input."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from cotsdl import backend
from cotsdl.nn import Network
from cotsdl.train import Adam, GreedyTrainer, InMemorySource, Momentum

HERE = Path(__file__).resolve().parent
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")

NET3 = {"input": [24, 24, 1], "stages": [
    {"filter": {"size": [5, 5], "stride": [1, 1], "channels": 4}, "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 4}, "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 4}, "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}}]}


def photo_crops(n=256, size=24, seed=0):
    """Standardized grayscale crops of the photographs bundled with scikit-image."""
    skdata = pytest.importorskip("skimage.data", reason="scikit-image is a test dependency")
    from skimage.color import rgb2gray

    photos = [skdata.camera(), rgb2gray(skdata.astronaut()), rgb2gray(skdata.coffee()), rgb2gray(skdata.chelsea()),
              rgb2gray(skdata.rocket()), skdata.brick(), skdata.grass()]
    rng = np.random.default_rng(seed)
    crops = []
    for i in range(n):
        ph = np.asarray(photos[i % len(photos)], dtype=np.float64)
        r, c = rng.integers(0, ph.shape[0] - size), rng.integers(0, ph.shape[1] - size)
        x = ph[r:r + size, c:c + size]
        crops.append((x - x.mean()) / (x.std() + 1e-8))
    return np.stack(crops)[..., None].astype(np.float32)


@pytest.mark.timeout(300)
def test_every_stage_learns_on_real_images():
    net = Network.from_description(NET3)
    tr = GreedyTrainer(net, InMemorySource(photo_crops()), Adam(0.005), comm=MPI.COMM_SELF, batch=16, lam=0.05,
                       log_every=0)
    steps = 150
    tr.train([steps] * 3)
    for k in range(3):
        losses = [r["loss"] for r in tr.history if r["stage"] == k]
        first, last = np.mean(losses[:10]), np.mean(losses[-10:])
        assert last < 0.7 * first, f"stage {k}: loss {first:.3g} -> {last:.3g}"


@pytest.mark.timeout(600)
def test_resume_after_a_kill_is_bitwise_identical(tmp_path):
    def job(*args):
        env = {**os.environ, "MPIEXEC_TIMEOUT": "300"}
        return subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "mpi4py", str(HERE / "resume_job.py"), *args],
                              capture_output=True, text=True, env=env, timeout=400)

    ref = job("fresh", "-", str(tmp_path / "ref.npz"))
    assert ref.returncode == 0, ref.stderr[-3000:]
    ck = tmp_path / "ck"
    killed = job("fresh", str(ck), str(tmp_path / "never.npz"), "7")  # dies at step 7; checkpoints at 3 and 6
    assert killed.returncode != 0 and not (tmp_path / "never.npz").exists()
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("ckpt-")) == ["ckpt-000000003", "ckpt-000000006"]
    resumed = job("resume", str(ck), str(tmp_path / "resumed.npz"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "resumed.npz")
    for k in a.files:
        assert np.array_equal(a[k], b[k]), f"stage weights {k} differ after resuming"


class NaNSource(InMemorySource):
    def __init__(self, images, bad):
        super().__init__(images)
        self.bad = bad

    def read(self, first, count, window):
        x = super().read(first, count, window)
        if first // count in self.bad:
            x[...] = np.nan
        return x


def test_non_finite_steps_are_skipped_then_stop(tmp_path):
    imgs = np.random.default_rng(0).standard_normal((20, 24, 24, 1))
    net = Network.from_description(NET3)
    tr = GreedyTrainer(net, NaNSource(imgs, bad={2}), Momentum(0.01), comm=MPI.COMM_SELF, batch=4, log_every=0,
                       checkpoint_dir=str(tmp_path), max_bad_steps=3, log=open(os.devnull, "w"))
    tr.train_stage(0, 4)
    assert tr.skipped == 1 and all(np.all(np.isfinite(w)) for w in tr.params.values())
    tr.save()
    tr.data = NaNSource(imgs, bad=set(range(4, 100)))
    with pytest.raises(RuntimeError, match="3 consecutive steps with a non-finite loss") as e:
        tr.train_stage(0, 10)
    assert (tmp_path / "ckpt-000000004" / "index.json").is_file()
    assert "Check the input" in str(e.value) and "ckpt-000000004, is intact" in str(e.value)
    fresh = GreedyTrainer(net, NaNSource(imgs, bad=set(range(100))), Momentum(0.01), comm=MPI.COMM_SELF, batch=4,
                          log_every=0, max_bad_steps=2, log=open(os.devnull, "w"))
    with pytest.raises(RuntimeError, match="no checkpoint had been written yet"):
        fresh.train_stage(0, 5)


def test_a_new_run_does_not_prune_another_runs_checkpoints(tmp_path):
    tr = small_trainer(tmp_path)
    tr.train_stage(0, 1)
    tr.save()
    with pytest.raises(ValueError, match=r"already holds checkpoints \(latest ckpt-000000001\)"):
        small_trainer(tmp_path)
    assert (tmp_path / "ckpt-000000001" / "index.json").is_file()
    again = small_trainer(tmp_path, overwrite=True, keep=1)  # asked for: the old run's checkpoints go
    again.train_stage(0, 2)
    again.save()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000002"]


def test_metrics_and_log_lines(tmp_path):
    import io

    imgs = np.random.default_rng(0).standard_normal((20, 24, 24, 1))
    buf = io.StringIO()
    tr = GreedyTrainer(Network.from_description(NET3), InMemorySource(imgs), Adam(0.01), comm=MPI.COMM_SELF, batch=4,
                       log_every=2, metrics_file=str(tmp_path / "m.jsonl"), log=buf)
    tr.train_stage(0, 4)
    assert buf.getvalue().count("stage 0 step") == 3 and "images/s" in buf.getvalue()  # steps 1 (the first), 2, 4
    import json

    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["stage_step"] for r in rows] == [1, 2, 4] and all("reconstruction" in r for r in rows)
    # each logged step also carries the mean over the steps since the previous one
    assert [r["mean_over"] for r in rows] == [1, 1, 2]
    assert rows[2]["loss_mean"] == pytest.approx(np.mean([h["loss"] for h in tr.history[2:4]]))


def test_bad_input_is_named():
    net = Network.from_description(NET3)
    with pytest.raises(ValueError, match=r"the data's images are \(8, 8, 1\), the network takes \(24, 24, 1\)"):
        GreedyTrainer(net, InMemorySource(np.zeros((4, 8, 8, 1))), Adam(0.01), comm=MPI.COMM_SELF, batch=2)
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        GreedyTrainer(net, InMemorySource(np.zeros((4, 24, 24, 1))), Adam(0.01), comm=MPI.COMM_SELF, batch=0)
    with pytest.raises(ValueError, match="images must be"):
        InMemorySource(np.zeros((4, 24)))
    tr = GreedyTrainer(net, InMemorySource(np.zeros((4, 24, 24, 1))), Adam(0.01), comm=MPI.COMM_SELF, batch=2)
    with pytest.raises(ValueError, match="stage must be in"):
        tr.train_stage(3, 1)
    with pytest.raises(ValueError, match="no completed checkpoint"):
        GreedyTrainer.resume("/nonexistent", tr.data, Adam(0.01), comm=MPI.COMM_SELF)


def small_trainer(tmp_path=None, batch=4, opt=None, data=None, **kw):
    imgs = np.random.default_rng(0).standard_normal((20, 24, 24, 1))
    return GreedyTrainer(Network.from_description(NET3), data or InMemorySource(imgs), opt or Momentum(0.01),
                         comm=MPI.COMM_SELF, batch=batch, log_every=0,
                         checkpoint_dir=None if tmp_path is None else str(tmp_path), log=open(os.devnull, "w"), **kw)


def test_overlap_true_false_or_auto():
    auto = small_trainer(overlap="auto")
    assert auto.plan.overlap is False and auto.overlap_reason == "1 rank, no halo to hide"
    for given in (True, False):
        tr = small_trainer(overlap=given)
        assert tr.plan.overlap is given and tr.overlap_reason is None
    with pytest.raises(ValueError, match='overlap must be True, False or "auto", got \'sometimes\''):
        small_trainer(overlap="sometimes")


def test_resuming_an_older_checkpoint_makes_its_successors_the_latest(tmp_path):
    from cotsdl.io import checkpoint

    tr = small_trainer(tmp_path, keep=5)
    for _ in range(3):
        tr.train_stage(0, 2)
        tr.save()  # steps 2, 4, 6
    old = GreedyTrainer.resume(str(tmp_path / "ckpt-000000002"), tr.data, Momentum(0.01), comm=MPI.COMM_SELF,
                               log=open(os.devnull, "w"), keep=5)
    old.train_stage(0, 1)
    old.save()  # step 3, written after step 6
    assert checkpoint.latest(tmp_path).name == "ckpt-000000003"
    old.save()  # the same step again: replaced, never lost
    assert checkpoint.latest(tmp_path).name == "ckpt-000000003"
    assert GreedyTrainer.resume(str(tmp_path), tr.data, Momentum(0.01), comm=MPI.COMM_SELF,
                                log=open(os.devnull, "w")).step == 3


def test_the_data_stream_continues_when_the_batch_changes(tmp_path):
    tr = small_trainer(tmp_path, batch=8)
    tr.train_stage(0, 5)
    tr.save()
    seen = []

    class Spy(InMemorySource):
        def read(self, first, count, window):
            seen.append((first, count))
            return super().read(first, count, window)

    again = GreedyTrainer.resume(str(tmp_path), Spy(tr.data.images), Momentum(0.01), comm=MPI.COMM_SELF, batch=4,
                                 log=open(os.devnull, "w"))
    again.train_stage(0, 2)
    assert seen == [(40, 4), (44, 4)]


def test_epochs_and_a_swapped_optimizer(tmp_path):
    tr = small_trainer(batch=4)
    tr.train_stage(0, epochs=1)  # 20 images / 4 per step
    assert tr.stage_step == 5
    from cotsdl.train import LARS

    tr.optimizer = LARS(0.1)
    tr.train_stage(0, 1)
    assert tr.optimizer.comm is tr.decomposition.grid.comm  # norms span the model group
    with pytest.raises(ValueError, match="exactly one of steps= and epochs="):
        tr.train_stage(0)


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_an_update_that_breaks_the_weights_stops_training():
    tr = small_trainer(opt=optim_sgd_huge())
    with pytest.raises(RuntimeError, match="made the weights non-finite"):
        tr.train_stage(0, 20)


def optim_sgd_huge():
    from cotsdl.train import SGD

    return SGD(1e40)  # overflows float32: the update itself makes the weights infinite


def test_unwritable_metrics_file_is_named():
    with pytest.raises(ValueError, match="metrics_file /nonexistent/m.jsonl"):
        small_trainer(metrics_file="/nonexistent/m.jsonl")


def test_training_on_the_emulated_cuda_kernels_matches_numpy():
    desc = {"input": [16, 15, 1], "stages": NET3["stages"][:2]}
    imgs = np.random.default_rng(0).standard_normal((16, 16, 15, 1))

    def weights(name):
        with backend.using(name):
            tr = GreedyTrainer(Network.from_description(desc), InMemorySource(imgs), Adam(0.01), comm=MPI.COMM_SELF,
                               batch=4, log_every=0)
            tr.train([2, 2])
            return [tr.gather_weights(k) for k in range(2)], [r["loss"] for r in tr.history]

    (w_np, l_np), (w_emu, l_emu) = weights("numpy"), weights("cuda-emu")
    np.testing.assert_allclose(l_emu, l_np, rtol=1e-4)
    for a, b in zip(w_np, w_emu):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_numpy_scalars_in_hyper_parameters_survive_checkpoints(tmp_path):
    from cotsdl.train import schedules

    opt = Adam(schedules.Cosine(np.float32(0.01), total_steps=np.int64(100)))
    tr = small_trainer(tmp_path, opt=opt, seed=np.int64(7))
    tr.train_stage(0, 1)
    tr.save()
    again = GreedyTrainer.resume(str(tmp_path), tr.data, comm=MPI.COMM_SELF, log=open(os.devnull, "w"))
    assert again.seed == 7 and again.optimizer.schedule == schedules.Cosine(np.float32(0.01), 100)
    assert again.optimizer.t == 1 and again.template.schedule == again.optimizer.schedule


def test_resume_applies_the_given_settings_and_logs_each_change_once(tmp_path):
    """Saved: weights, position, optimizer step count and slots.  Given: what applies from here on."""
    import io

    from cotsdl.train import schedules

    tr = small_trainer(tmp_path, opt=Adam(0.01))
    tr.train_stage(0, 2)
    tr.save()
    slots = {n: {k: v.copy() for k, v in s.items()} for n, s in tr.optimizer.state.items()}
    log = io.StringIO()
    given = Adam(schedules.Cosine(0.005, total_steps=50), beta2=0.99)
    again = GreedyTrainer.resume(str(tmp_path), tr.data, given, comm=MPI.COMM_SELF, lam=0.3, log=log)
    lines = log.getvalue().splitlines()
    for expected in ("train.optimizer.lr: 0.01 (checkpoint) -> 0.005 (given)",
                     'train.schedule.kind: "constant" (checkpoint) -> "cosine" (given)',
                     "train.schedule.total_steps: null (checkpoint) -> 50 (given)",
                     "train.optimizer.beta2: 0.999 (checkpoint) -> 0.99 (given)",
                     "train.lam: 0.1 (checkpoint) -> 0.3 (given)"):
        assert sum(expected in line for line in lines) == 1, (expected, lines)
    assert not any("beta1" in line or "optimizer.eps" in line for line in lines)  # unchanged settings are not listed
    opt = again.optimizer
    assert (opt.t, opt.beta2, opt.schedule, again.lam) == (2, 0.99, schedules.Cosine(0.005, 50), 0.3)
    assert all(np.array_equal(opt.state[n][k], v) for n, s in slots.items() for k, v in s.items())
    assert (again.stage, again.stage_step, again.step, again.position) == (0, 2, 2, tr.position)


def test_resume_with_fewer_steps_starts_the_next_stage_schedule_anew(tmp_path):
    """Stage 0 already did more steps than asked: stage 1 trains at its schedule's first rates, never at 0."""
    import io

    from cotsdl.train import schedules

    def cosine(total):
        return Momentum(schedules.Cosine(0.01, total_steps=total))

    tr = small_trainer(tmp_path, opt=cosine(5))
    tr.train_stage(0, 5)
    tr.save()
    log = io.StringIO()  # the config now asks 3 steps a stage, on a schedule of 3: stage 0's rate would be 0 on
    again = GreedyTrainer.resume(str(tmp_path), tr.data, cosine(3), comm=MPI.COMM_SELF, log=log)
    again.train([3, 2, 0])
    first = next(r for r in again.history if r["stage"] == 1)
    assert first["stage_step"] == 1 and first["lr"] == pytest.approx(0.01)
    assert [r["stage"] for r in again.history] == [1, 1]
    assert "stage 0 has trained 5 steps, more than the 3 asked" in log.getvalue()


def test_a_short_batch_is_reported_clearly():
    class Short(InMemorySource):
        def read(self, first, count, window):
            return super().read(first, count, window)[..., :count - 1]

    tr = small_trainer(data=Short(np.random.default_rng(0).standard_normal((20, 24, 24, 1))))
    with pytest.raises(RuntimeError, match="the source returned shape"):
        tr.train_stage(0, 1)


def test_checkpoint_destinations_are_checked_before_training(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("")
    with pytest.raises(OSError, match="checkpoint folder .*afile/ck cannot be written"):
        small_trainer(tmp_path / "afile" / "ck")
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, 1 << 30, 1000))
    with pytest.raises(OSError, match=r"a checkpoint needs about [0-9.]+ [KM]iB, only 1000 bytes are free"):
        small_trainer(tmp_path / "ck")


@pytest.mark.parametrize("damage, reason", [
    ("truncate", r"rank00000.h5 has \d+ bytes, \d+ were written"),
    ("flip", "rank00000.h5 does not match its checksum"),
    ("delete", "rank00000.h5 is missing"),
    ("index", r"index.json is damaged \(not JSON"),
])
def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(tmp_path, damage, reason):
    import io
    import re

    tr = small_trainer(tmp_path)
    for _ in range(2):
        tr.train_stage(0, 1)
        tr.save()  # steps 1 and 2
    latest = tmp_path / "ckpt-000000002"
    shard = latest / "rank00000.h5"
    data = shard.read_bytes()
    if damage == "truncate":
        shard.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        shard.write_bytes(data[:-64] + bytes(b ^ 0xFF for b in data[-64:]))
    elif damage == "delete":
        shard.unlink()
    else:
        (latest / "index.json").write_text('{"step": 2, "meta": ')
    log = io.StringIO()
    again = GreedyTrainer.resume(str(tmp_path), tr.data, Momentum(0.01), comm=MPI.COMM_SELF, log=log)
    assert again.step == 1  # the newest checkpoint that verifies
    assert re.search("ckpt-000000002 skipped: .*" + reason, log.getvalue()), log.getvalue()
    if damage != "index":
        with pytest.raises(ValueError, match="cannot resume from .*ckpt-000000002: .*" + reason):
            GreedyTrainer.resume(str(latest), tr.data, Momentum(0.01), comm=MPI.COMM_SELF, log=log)
    again.train_stage(0, 1)
    again.save()  # step 2 again: the damaged one is replaced
    assert checkpoint_ok(tmp_path / "ckpt-000000002")


def checkpoint_ok(path):
    from cotsdl.io import checkpoint

    return checkpoint.verify(path) is None


@pytest.mark.parametrize("kw, message", [({"checkpoint_every": -1}, "checkpoint_every must be an integer >= 0"),
                                         ({"keep": 0}, "keep must be an integer >= 1"),
                                         ({"max_bad_steps": 2.5}, "max_bad_steps must be an integer >= 1")])
def test_trainer_settings_are_not_coerced(kw, message):
    with pytest.raises(ValueError, match=message):
        small_trainer(**kw)
    tr = small_trainer()
    for steps in (-1, 2.5, "3"):
        with pytest.raises(ValueError, match="steps must be an integer >= 0"):
            tr.train_stage(0, steps)


def test_resume_with_another_optimizer_kind_names_both(tmp_path):
    tr = small_trainer(tmp_path, opt=Momentum(0.01, 0.9))
    tr.train_stage(0, 1)
    tr.save()
    with pytest.raises(ValueError, match=r"trained with Momentum \(SGD with momentum 0.9\), the optimizer given is Adam"):
        GreedyTrainer.resume(str(tmp_path), tr.data, Adam(0.01), comm=MPI.COMM_SELF, log=open(os.devnull, "w"))
