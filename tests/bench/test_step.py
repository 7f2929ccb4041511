"""`cotsdl bench step` and the trainer's CUDA-graph step, without a GPU.

The bench runs on the numpy and cuda-emu backends (the graph reported not available there); the
graph path itself runs on the stand-in device (tests/devicestub.py) with a stand-in stream capture
that refuses every host read and synchronization while capturing or replaying, and whose replay
re-runs the captured work and writes its results where the captured ones live (as a graph writes
to the captured addresses).
"""
import contextlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.train import GreedyTrainer, InMemorySource
from cotsdl.train.graph import WARMUP, DeviceGraph
from cotsdl.train.objective import PendingLoss
from cotsdl.train.optim import Adam
import devicestub
from devicestub import DeviceArray, HostOnlyCall, device_backend
from testkit import tiny_config

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def bench(*args, ranks=None, timeout=300, cwd=None):
    pre = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py"] if ranks else [sys.executable]
    env = {**os.environ, "MPIEXEC_TIMEOUT": str(timeout)}
    return subprocess.run([*pre, "-m", "cotsdl", "bench", "step", *args], capture_output=True, text=True,
                          timeout=timeout + 30, env=env, cwd=cwd)


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "c.toml"  # its data file does not exist: the bench uses synthetic images
    path.write_text(tiny_config(tmp_path / "unused.h5", tmp_path / "run", steps=2, every=0))
    return path


@pytest.mark.parametrize("backend_name, stage", [("numpy", 1), ("cuda-emu", 0)])
def test_bench_times_the_eager_step_and_reports_the_graph_not_available(cfg, tmp_path, backend_name, stage):
    out = tmp_path / "s.json"
    res = bench(str(cfg), "--backend", backend_name, "--stage", str(stage), "--steps", "3", "--rounds", "3",
                "--check-steps", "1", "--machine", "h200-ndr", "--json", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"not available on backend {backend_name}" in res.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "step" and data["backend"] == backend_name and data["stage"] == stage
    assert data["check"] is None and data["speedup"] is None  # one setting measured: nothing to compare
    eager, graph = (next(r for r in data["results"] if r["graph"] is g) for g in (False, True))
    assert eager["available"] and eager["step_s"] > 0 and eager["steps"] == 3 and len(eager["round_s"]) == 3
    lo, hi = eager["interval_s"]
    assert lo <= eager["step_s"] <= hi and eager["coverage"] == pytest.approx(0.75)
    assert eager["images_per_s"] == pytest.approx(data["batch"] / eager["step_s"])
    assert eager["memory"]["kind"] == "peak-rss" and eager["memory"]["reserved_bytes"] > 0
    pred = data["predicted"]
    assert pred["machine"] == "h200-ndr" and pred["seconds"] > 0 and pred["memory_bytes"] > 0
    assert eager["time_ratio"] == pytest.approx(pred["seconds"] / eager["step_s"])
    assert not graph["available"] and "not available on backend" in graph["reason"] and "step_s" not in graph


def test_bench_refuses_bad_input(cfg, tmp_path):
    res = bench(str(tmp_path / "missing.toml"))
    assert res.returncode != 0 and "missing.toml" in res.stderr
    res = bench(str(cfg), "--stage", "2")
    assert res.returncode != 0 and "--stage must be in [0, 2)" in res.stderr
    res = bench(str(cfg), "--steps", "0")
    assert res.returncode != 0 and "--steps >= 1" in res.stderr
    res = bench(str(cfg), "--machine", "no-such-machine")
    assert res.returncode != 0 and "no-such-machine" in res.stderr
    res = bench(str(cfg), "--json", str(tmp_path / "no" / "s.json"))
    assert res.returncode != 0 and "does not exist" in res.stderr


def test_bench_runs_on_one_rank_only(cfg):
    res = bench(str(cfg), ranks=2)
    assert res.returncode != 0 and "1 rank" in res.stderr


# -- the graph path on a stand-in device ----------------------------------------------------------

class _Capture:
    on = False  # capturing or replaying: the device work may not read the host or wait for it


@contextlib.contextmanager
def _capturing():
    _Capture.on = True
    try:
        yield
    finally:
        _Capture.on = False


def _refuse_in_capture(what):
    if _Capture.on:
        raise HostOnlyCall(f"{what} inside a captured CUDA graph (a host read or synchronization)")


class _Replay:
    """A stand-in graph: its first launch is the captured call (already done); later launches re-run
    the work and copy its results into the captured ones' memory."""

    def __init__(self, fn, out):
        self.fn, self.out, self.first = fn, out, True

    def launch(self, stream=None):
        if self.first:
            self.first = False
            return
        with _capturing():
            _copy_into(self.out, self.fn())


def _copy_into(kept, new):
    if isinstance(kept, DeviceArray):
        if kept is not new:
            np.copyto(kept.view(np.ndarray), np.asarray(new.view(np.ndarray)))
    elif isinstance(kept, PendingLoss):
        _copy_into(kept.sums, new.sums)
        _copy_into(kept.active, new.active)
    elif isinstance(kept, dict):
        for k in kept:
            _copy_into(kept[k], new[k])
    elif isinstance(kept, (tuple, list)):
        for a, b in zip(kept, new):
            _copy_into(a, b)


@contextlib.contextmanager
def capture_stub(monkeypatch):
    """The stand-in device with CuPy's stream capture, memory pools and allocator switch."""
    real_dev = devicestub._dev
    # as CuPy's, a reduction is a 0-d device array (a graph writes it where it lives), not a host scalar
    monkeypatch.setattr(devicestub, "_dev", lambda x: real_dev(np.asarray(x) if isinstance(x, np.generic) else x))
    with device_backend(monkeypatch) as counts:
        cp = sys.modules["cupy"]

        class Stream:
            def __init__(self, non_blocking=False):
                self.capturing = False

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def synchronize(self):
                _refuse_in_capture("stream synchronize")

            def begin_capture(self, mode=None):
                self.capturing = True
                _Capture.on = True

            def end_capture(self):
                self.capturing = False
                _Capture.on = False
                return object()

        class Pool:
            def malloc(self, n):
                return None

            def total_bytes(self):
                return 0

            def used_bytes(self):
                return 0

            def free_all_blocks(self):
                pass

        stream = Stream()
        for name in ("asarray", "array"):  # an upload from pageable host memory cannot be captured
            real_up = getattr(cp, name)

            def upload(a, *args, _real=real_up, _name=name, **kw):
                if isinstance(a, np.ndarray) and not isinstance(a, DeviceArray) or np.isscalar(a) or isinstance(a, (list, tuple)):
                    _refuse_in_capture(f"cupy.{_name} of host data (an upload)")
                return _real(a, *args, **kw)
            setattr(cp, name, upload)
        cp.cuda.Stream, cp.cuda.MemoryPool = Stream, Pool
        cp.cuda.get_current_stream = lambda: stream
        cp.cuda.using_allocator = lambda fn=None: contextlib.nullcontext()
        cp.cuda.runtime.streamCaptureModeRelaxed = 0
        cp.get_default_memory_pool = Pool
        cp.cuda.runtime.memGetInfo = lambda: (1 << 30, 2 << 30)
        for name, what in (("__float__", "float()"), ("__bool__", "bool()"), ("__int__", "int()"),
                           ("get", "a copy to the host"), ("item", "item()")):
            real = getattr(DeviceArray, name)

            def guarded(self, *a, _real=real, _what=what, **k):
                _refuse_in_capture(_what)
                return _real(self, *a, **k)
            monkeypatch.setattr(DeviceArray, name, guarded)
        real_capture = DeviceGraph._capture

        def capture(self, cp_, fn):
            real_capture(self, cp_, fn)
            self._graph = _Replay(fn, self._out)
        monkeypatch.setattr(DeviceGraph, "_capture", capture)
        yield counts


def _network():
    from cotsdl.nn.layers import LCN, L2Pool, LocalFilter
    from cotsdl.nn.network import Network, Stage

    return Network((10, 10, 1), [Stage(LocalFilter((3, 3), (1, 1), 3), L2Pool((2, 2), (2, 2), 0.01), LCN(3, 1.0)),
                                 Stage(LocalFilter((2, 2), (1, 1), 2), L2Pool((2, 2), (1, 1), 0.01), LCN(3, 1.0))])


def _trainer(graph, tied=True):
    images = np.random.default_rng(1).standard_normal((8, 10, 10, 1)).astype(np.float32)
    return GreedyTrainer(_network(), InMemorySource(images), Adam(lr=0.01), comm=MPI.COMM_SELF, batch=4, grid=(1, 1),
                         overlap=False, log_every=0, log=io.StringIO(), graph=graph, tied=tied, filter_norm="auto")


def test_bench_on_the_stand_in_device_checks_times_and_compares_both_settings(monkeypatch):
    from cotsdl.bench import step

    pred = {"seconds": 1e-3, "memory_bytes": 2.0 ** 20, "device_memory_bytes": 2.0 ** 30, "fits": True}
    log = io.StringIO()
    with capture_stub(monkeypatch):
        res = step.run(MPI.COMM_SELF, _network(), lambda: Adam(lr=0.01), batch=4, stage=1, steps=4, rounds=2,
                       check_steps=WARMUP + 2, predict=lambda: pred, machine="h200-ndr", log=log, filter_norm="auto")
    check = res["check"]
    assert check["graph_replays"] == 2 and check["allclose"], check
    rows = {r["graph"]: r for r in res["results"]}
    for g, r in rows.items():
        assert r["available"] and r["step_s"] > 0 and len(r["round_s"]) == 2 and r["steps"] == 4
        assert r["memory"]["kind"] == "cupy-pool" and r["memory"]["device_used_bytes"] == 1 << 30
        assert r["time_ratio"] == pytest.approx(1e-3 / r["step_s"])
    assert rows[True]["graph_captures"] == 1 and rows[True]["graph_replays"] == 2 + 3 + 4  # check, warm-up, timed
    assert "CUDA graph" in rows[True]["launch"] and rows[False]["launch"] == "eager"
    ratios = [e / g for e, g in zip(rows[False]["round_s"], rows[True]["round_s"])]
    assert res["speedup"]["value"] == pytest.approx(np.median(ratios))
    assert "graph speed-up" in log.getvalue() and "planner on h200-ndr" in log.getvalue()


@pytest.mark.parametrize("tied", [True, False])
def test_graph_step_captures_device_work_only_and_trains_as_eagerly(monkeypatch, tied):
    steps = WARMUP + 4
    with capture_stub(monkeypatch) as counts:
        eager, graphed = _trainer(False, tied), _trainer(True, tied)
        for stage in (0, 1):  # stage 1: the frozen stage's forward is part of the captured work
            e = eager.train_stage(stage, steps)
            g = graphed.train_stage(stage, steps)
            assert graphed.graph.reason is None, graphed.graph.reason
            li = graphed.filter_layers[stage]
            np.testing.assert_allclose(graphed.params[li].get(), eager.params[li].get(), rtol=1e-6, atol=1e-7)
            if not tied:
                np.testing.assert_allclose(graphed.decoders[li].get(), eager.decoders[li].get(), rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose([r["loss"] for r in g], [r["loss"] for r in e], rtol=1e-6)
        assert counts["launches"] > 0
    # one capture per stage (a new stage is a new key), every later step a replay
    assert graphed.graph.captures == 2 and graphed.graph.replays == 2 * (steps - WARMUP)
    assert "CUDA graph" in graphed.graph.describe() and eager.graph.describe() == "eager"


def test_a_failed_capture_is_reported_and_the_step_runs_eagerly(monkeypatch):
    with capture_stub(monkeypatch):
        tr = _trainer(True)
        real = tr._device_step

        def reads_the_host(*a):  # a device step that reads a loss back: capture must fail, not the run
            out = real(*a)
            if isinstance(out[0], PendingLoss):  # (after the failure the step is eager: LossParts)
                float(out[0].sums[0])
            return out
        monkeypatch.setattr(tr, "_device_step", reads_the_host)
        recs = tr.train_stage(0, WARMUP + 2)
    assert len(recs) == WARMUP + 2 and all(np.isfinite(r["loss"]) for r in recs)
    assert tr.graph.reason.startswith("capture failed: HostOnlyCall") and not tr.graph.active
    assert tr.graph.describe().startswith("eager (capture failed")


def test_a_failed_warm_up_is_reported_and_the_step_runs_eagerly(monkeypatch):
    with capture_stub(monkeypatch):
        def no_allocator(fn=None):
            raise RuntimeError("no such allocator")
        monkeypatch.setattr(sys.modules["cupy"].cuda, "using_allocator", no_allocator)
        tr = _trainer(True)
        recs = tr.train_stage(0, WARMUP + 1)
    assert len(recs) == WARMUP + 1 and all(np.isfinite(r["loss"]) for r in recs)
    assert tr.graph.reason == "warm-up on the capture stream failed: RuntimeError: no such allocator"


def test_graph_is_not_available_on_host_backends():
    g = DeviceGraph(True)
    assert not g.active and "not available on backend" in g.reason
    assert g.run("k", lambda: 7) == 7 and g.pool_bytes() == 0


def test_graph_is_refused_on_a_model_group_of_several_ranks(monkeypatch):
    """Halo exchanges post MPI messages inside the step: a graph serves one rank per model group."""
    with capture_stub(monkeypatch):
        g = DeviceGraph(True, model_ranks=2)
        assert not g.active and "model group of 2 ranks" in g.reason
        assert DeviceGraph(True, model_ranks=1).active


def test_a_capture_holds_the_device_constants_it_reads(monkeypatch):
    """The kernels' tables (backend.constant, a bounded cache) stay referenced while the graph lives."""
    from cotsdl import backend

    with capture_stub(monkeypatch):
        tr = _trainer(True)
        tr.train_stage(0, WARMUP + 2)
        assert tr.graph.captures == 1
        held = {id(a) for a in tr.graph._constants}
        assert held and held >= {id(a) for a in backend.kept_constants()}
