"""Evaluation is device-clean: run on stand-in device arrays (``tests/devicestub.py``), every array
stays on the "device" and the report's numbers are the numpy backend's.

The stand-in refuses what CuPy refuses (a host array mixed into a device operation)
and what would silently leave the GPU (a kernel given a host array, an operation
sent to the CPU implementation), so a ``np.ascontiguousarray`` on a device array in
the evaluation fails here, without a GPU.  The GPU suite runs ``cotsdl evaluate`` itself.
"""
import numpy as np
import pytest
from mpi4py import MPI

from cotsdl import backend
from cotsdl.array import ProcessGrid
from cotsdl.evaluate import experiment, responses
from cotsdl.io.dataset import write_dataset
from cotsdl.io.reader import HDF5Source
from cotsdl.nn import Network, NetworkPlan
from devicestub import DeviceArray, HostOnlyCall, device_backend

NET = {"input": [8, 8, 1], "stages": [
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 2}, "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 0.01}},
    {"filter": {"size": [2, 2], "stride": [1, 1], "channels": 2}, "pool": {"size": [1, 1], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 1, "sigma": 1.0, "eps": 0.01}}]}


@pytest.fixture(scope="module")
def labeled(tmp_path_factory):
    rng = np.random.default_rng(0)
    y = (np.arange(48) % 3 == 0).astype(np.int64)
    x = rng.standard_normal((48, 8, 8)) + 1.5 * y[:, None, None] * np.outer(np.hanning(8), np.hanning(8))
    path = tmp_path_factory.mktemp("dev") / "faces.h5"
    write_dataset(path, x.astype(np.float32), labels=y, recipe={"builder": "test: planted blob"})
    return path


def _evaluate(path):
    plan = NetworkPlan(Network.from_description(NET), ProcessGrid(MPI.COMM_SELF, (1, 1)), 16, np.float64)
    subject = experiment.Subject("network", "weights of seed 3", plan, responses.to_device(plan.init_params(3)))
    controls = [experiment.Subject("random_weights", "weights of seed 4", plan, responses.to_device(plan.init_params(4)))]
    with HDF5Source(path, shuffle=False, preprocess="none", prefetch=False) as src:
        return experiment.run(subject, controls, src, k=4, seed=0, stimulus_steps=2, resamples=100)


@pytest.mark.timeout(600)
def test_evaluation_keeps_every_array_on_the_device_and_matches_numpy(labeled, monkeypatch):
    with backend.using("numpy"):
        host, host_figs = _evaluate(labeled)
    with device_backend(monkeypatch) as counts:
        dev, dev_figs = _evaluate(labeled)
    assert counts["launches"] > 0  # the network ran through the kernels, on device arrays only
    for name in ("network", "random_weights", "best_pixel", "mean_face"):
        np.testing.assert_allclose(dev["scores"][name]["test_balanced_acc"], host["scores"][name]["test_balanced_acc"],
                                   atol=1e-9, err_msg=name)
    assert dev["best"]["layer"] == host["best"]["layer"] and dev["best"]["position"] == host["best"]["position"]
    # what leaves the evaluation for figures and reports is host data (numbers, NumPy arrays)
    assert not any(isinstance(v, DeviceArray) for v in dev_figs.values())
    np.testing.assert_allclose(dev_figs["stimulus"], host_figs["stimulus"], rtol=1e-6, atol=1e-9)


def test_the_stand_in_catches_a_host_only_call(monkeypatch):
    """The guard itself: the bug of wave 2 (np.ascontiguousarray on a device array, then mixed) is caught."""
    with device_backend(monkeypatch):
        xp = backend.xp()
        a = xp.zeros((4, 4), np.float32)
        assert isinstance(a, DeviceArray) and backend.is_device_array(a)
        with pytest.raises(HostOnlyCall):
            a + np.ascontiguousarray(a)
        from cotsdl import ops

        with pytest.raises(HostOnlyCall):  # a host array sent through an operation under the cuda backend
            ops.l2_pool(np.zeros((4, 4, 1, 1)), (2, 2), (2, 2), 0.01)


@pytest.mark.timeout(600)
def test_training_and_its_checkpoint_stay_on_the_device(tmp_path, monkeypatch):
    """The trainer on stand-in device arrays: the same weights as on numpy, and a resume from its checkpoint."""
    import os

    from cotsdl.train import Adam, GreedyTrainer, InMemorySource

    images = np.random.default_rng(1).standard_normal((16, 8, 8, 1))

    def train(folder):
        tr = GreedyTrainer(Network.from_description(NET), InMemorySource(images), Adam(0.01), comm=MPI.COMM_SELF,
                           batch=4, log_every=1, dtype=np.float64, checkpoint_dir=str(folder), checkpoint_every=0,
                           log=open(os.devnull, "w"))
        tr.train([2, 2])
        again = GreedyTrainer.resume(str(folder), tr.data, comm=MPI.COMM_SELF, log=open(os.devnull, "w"))
        again.train([2, 3])
        return [backend.to_numpy(again.gather_weights(k)) for k in range(2)], again

    with backend.using("numpy"):
        host, _ = train(tmp_path / "host")
    with device_backend(monkeypatch) as counts:
        dev, tr = train(tmp_path / "dev")
        assert all(isinstance(w, DeviceArray) for w in tr.params.values())
        assert all(isinstance(a, DeviceArray) for s in tr.optimizer.state.values() for a in s.values())
    assert counts["launches"] > 0
    for a, b in zip(host, dev):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12)


def test_constants_are_copied_to_the_device_once(monkeypatch):
    """backend.constant: a host array itself beside host arrays; beside device arrays one device copy
    per contents, kept (the filter's index tables, LCN's Gaussian), and never a stand-in's for another."""
    from cotsdl import backend

    host = np.arange(6, dtype=np.int32)
    assert backend.constant(host, np.zeros(1)) is host
    with device_backend(monkeypatch):
        like = backend.cupy_module().zeros(1)
        first = backend.constant(host, like)
        assert isinstance(first, DeviceArray) and np.array_equal(first.get(), host)
        assert backend.constant(host.copy(), like) is first  # the same contents: the kept copy
        assert backend.constant(host[::-1], like) is not first
        assert backend.constant(host.reshape(2, 3), like).shape == (2, 3)
        as_float = backend.constant(host.view(np.float32), like)  # the same bytes, another dtype
        assert as_float is not first and as_float.dtype == np.float32
        keyed = backend.constant(host, like, key=("table", 6))  # kept by the caller's key, bytes unread
        assert keyed is not first and backend.constant(host + 0, like, key=("table", 6)) is keyed
        monkeypatch.setattr(backend, "_CONSTANTS_KEPT", 2)  # the least recently used goes first
        monkeypatch.setattr(backend, "_CONSTANTS", {})
        a, b = (backend.constant(host, like, key=k) for k in ("a", "b"))
        assert backend.constant(host, like, key="a") is a  # a used last: b goes when c comes
        backend.constant(host, like, key="c")
        assert backend.constant(host, like, key="a") is a and backend.constant(host, like, key="b") is not b
    with device_backend(monkeypatch):  # another CuPy module: its own copies
        assert backend.constant(host, backend.cupy_module().zeros(1)) is not first
