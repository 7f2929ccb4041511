"""The initialization's reconstruction gain and the filter-norm constraint (issue 18)."""
import numpy as np
import pytest
from mpi4py import MPI

from cotsdl.array.box import Box
from cotsdl.nn import Network
from cotsdl.nn.layers import LocalFilter
from cotsdl.nn.network import init_weights, project_norm, unit_gain_norm, unit_gain_std
from cotsdl.train import Adam, GreedyTrainer, InMemorySource
from cotsdl.train.objective import sparse_ae_loss


def gain(layer: LocalFilter, C: int, H: int = 40, seed: int = 0, norm=None) -> tuple[float, float]:
    """<x, F^T F x> / <x, x> (the gain along x) and ||F^T F x|| / ||x|| of a tied stage at its initial
    weights, on the pixels that every site covering them covers fully."""
    sites = layer.rf.sites((H, H))
    w = init_weights(layer, (H, H, C), Box((0, 0), sites), seed, 0, np.float64, norm)
    x = np.random.default_rng(1).standard_normal((H, H, C, 4))
    # lam 0, eps irrelevant: J = ||x_hat - x||^2 / N, and x_hat = F^T F x
    from cotsdl import ops
    h = ops.local_filter(x, w, layer.stride, layer.block)
    xh = ops.local_filter_backward_data(h, w, layer.stride, layer.block, input_shape=x.shape)
    m = max(layer.size)  # away from the borders, where fewer units cover a pixel
    inner = (slice(m, -m), slice(m, -m))
    a, b = xh[inner], x[inner]
    return float((a * b).sum() / (b * b).sum()), float(np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("size,stride,channels,block,C", [
    ((7, 7), (1, 1), 16, (1, 1), 1),     # the old demo's first stage: gain 16 with N(0, 1/R)
    ((4, 4), (1, 1), 16, (1, 1), 16),    # a second stage on 16 maps
    ((5, 5), (2, 2), 8, (1, 1), 3),      # strided, colour
    ((6, 4), (2, 1), 4, (2, 2), 2),      # blocks of units sharing a field
    ((3, 3), (3, 3), 2, (1, 1), 5),      # non-overlapping
])
def test_initial_reconstruction_gain_is_about_one(size, stride, channels, block, C):
    layer = LocalFilter(size, stride, channels, block)
    for norm in (None, unit_gain_norm(layer, C)):  # fan-scaled, and projected to the unit-gain norm
        along, ratio = gain(layer, C, norm=norm)
        assert 0.8 < along < 1.25, along  # E[F^T F] = I by construction
        units_per_pixel = channels * block[0] * block[1] * size[0] * size[1] / (stride[0] * stride[1])
        if units_per_pixel >= 4 * C:  # overcomplete: F^T F concentrates around I, so the norm follows
            assert 0.8 < ratio < 2.0, ratio  # (the old N(0, 1/R) gave 16 on the first case)
    assert unit_gain_std(layer) * np.sqrt(np.prod(size) * C) == pytest.approx(unit_gain_norm(layer, C))


def test_first_loss_of_the_demo_first_stage_is_within_10x_of_the_signal():
    """The demo's first stage at its initial weights: J within 10x of ||x||^2 (was 180x)."""
    layer = LocalFilter((7, 7), (1, 1), 16)
    x = np.random.default_rng(0).standard_normal((32, 32, 1, 8)).astype(np.float32)
    w = init_weights(layer, (32, 32, 1), Box((0, 0), layer.rf.sites((32, 32))), 0, 0, np.float32)
    J, _ = sparse_ae_loss(x, w, stride=1, pool_size=2, pool_stride=2, lam=0.1, eps=0.01)
    signal = float((x.astype(np.float64) ** 2).sum() / x.shape[-1])
    assert J < 10 * signal, (J, signal)


def test_project_norm_sets_every_unit_and_keeps_zero_filters():
    w = np.random.default_rng(0).standard_normal((3, 2, 5, 4, 4, 2))
    w[1, 1, 2] = 0
    project_norm(w, 0.3)
    n = np.sqrt((w ** 2).sum(axis=(-3, -2, -1)))
    assert np.allclose(np.delete(n.reshape(-1), 1 * 2 * 5 + 1 * 5 + 2), 0.3)
    assert n[1, 1, 2] == 0
    w32 = np.ones((1, 1, 1, 2, 2, 1), np.float32)
    assert project_norm(w32, 2.0).dtype == np.float32


def test_filter_norms_in_pieces_are_the_whole_arrays_norms(monkeypatch):
    """The squares are made a few units at a time (no weight-sized array each step): each unit's norm
    is bit for bit the one of the whole array at once, on contiguous and strided weights."""
    from cotsdl.nn import network
    from cotsdl.nn.network import filter_norms

    rng = np.random.default_rng(3)
    for shape in [(5, 7, 16, 18, 18, 3), (2, 3, 40, 16, 16, 1), (4, 5, 3, 7, 7, 1), (0, 3, 2, 3, 3, 1)]:
        w = (rng.standard_normal(shape) * 1e-3).astype(np.float32)
        for v in (w, w[:, ::2]):
            whole = np.sqrt((v * v).sum(axis=(-3, -2, -1), keepdims=True))
            monkeypatch.setattr(network, "SQUARES_BYTES", 1000)  # pieces of one unit and less
            np.testing.assert_array_equal(filter_norms(v), whole)
            monkeypatch.undo()
            np.testing.assert_array_equal(filter_norms(v), whole)


NET = {"input": [16, 16, 1], "stages": [
    {"filter": {"size": [5, 5], "stride": [1, 1], "channels": 4}, "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 4}, "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}}]}


@pytest.mark.parametrize("tied", [True, False])
def test_trainer_keeps_every_filter_at_its_norm(tied):
    imgs = np.random.default_rng(0).standard_normal((64, 16, 16, 1))
    tr = GreedyTrainer(Network.from_description(NET), InMemorySource(imgs), Adam(0.05), comm=MPI.COMM_SELF, batch=8,
                       lam=0.1, tied=tied, log_every=0, filter_norm=[0.2, None])
    w0 = {k: v.copy() for k, v in tr.params.items()}
    f0, f1 = tr.filter_layers
    assert np.allclose(np.sqrt((w0[f0] ** 2).sum(axis=(-3, -2, -1))), 0.2, rtol=1e-5)
    tr.train([20, 5])
    for arrs in [tr.params] + ([] if tied else [tr.decoders]):
        n0 = np.sqrt((arrs[f0].astype(np.float64) ** 2).sum(axis=(-3, -2, -1)))
        assert np.allclose(n0, 0.2, rtol=1e-5)
    assert not np.allclose(tr.params[f0], w0[f0])  # it moved, on the sphere
    # stage 2 is unconstrained: its norms are free to change
    n1 = np.sqrt((tr.params[f1].astype(np.float64) ** 2).sum(axis=(-3, -2, -1)))
    assert not np.allclose(n1, np.sqrt((w0[f1].astype(np.float64) ** 2).sum(axis=(-3, -2, -1))))
    rec = tr.history[-1]
    assert 0 < rec["recon_rel"] < 10 and rec["pooled"] > 0


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), [0.1], [0.1, 0.2, 0.3], "x", True])
def test_bad_filter_norm_is_refused(bad):
    imgs = np.zeros((8, 16, 16, 1))
    with pytest.raises(ValueError, match="filter_norm"):
        GreedyTrainer(Network.from_description(NET), InMemorySource(imgs), Adam(0.01), comm=MPI.COMM_SELF, batch=4,
                      filter_norm=bad)


def test_auto_norm_is_a_fixed_fraction_of_the_unit_gain_norm_per_stage():
    from cotsdl.train.norms import AUTO_NORM_FRACTION
    net = Network.from_description(NET)
    imgs = np.random.default_rng(0).standard_normal((16, 16, 16, 1))
    tr = GreedyTrainer(net, InMemorySource(imgs), Adam(0.01), comm=MPI.COMM_SELF, batch=4, log_every=0,
                       filter_norm="auto")
    want = [AUTO_NORM_FRACTION * unit_gain_norm(net.layers[li], net.shapes[li][2]) for li in net.filter_layers()]
    assert tr.filter_norms == pytest.approx(want)
    assert want[0] != pytest.approx(want[1])  # resolved per stage, not one number
    f0 = tr.filter_layers[0]
    assert np.allclose(np.sqrt((tr.params[f0].astype(np.float64) ** 2).sum(axis=(-3, -2, -1))), want[0], rtol=1e-5)
    mixed = GreedyTrainer(net, InMemorySource(imgs), Adam(0.01), comm=MPI.COMM_SELF, batch=4, log_every=0,
                          filter_norm=["auto", None])
    assert mixed.filter_norms == [pytest.approx(want[0]), None]


def test_stage_end_reports_filter_diagnostics_beside_random_weights():
    imgs = np.random.default_rng(0).standard_normal((32, 16, 16, 1))
    tr = GreedyTrainer(Network.from_description(NET), InMemorySource(imgs), Adam(0.05), comm=MPI.COMM_SELF, batch=8,
                       lam=0.1, log_every=5, filter_norm="auto")
    tr.train([10, 5])
    first, second = tr.stage_stats[0], tr.stage_stats[1]
    assert {"cosine_to_init", "median_norm", "gabor_fraction", "oriented_fraction", "median_gabor_r2",
            "random_gabor_fraction"} <= set(first)
    assert "gabor_fraction" not in second  # Gabor fits mean something on pixels only
    assert -1 <= first["cosine_to_init"] < 0.999  # it trained
    assert first["median_norm"] == pytest.approx(tr.filter_norms[0], rel=1e-5)
    logged = [r for r in tr.history if "cosine_to_init" in r]
    assert logged and all(np.isfinite(r["cosine_to_init"]) for r in logged)
    assert any("gabor_fraction" in r for r in tr.history)  # the stage's last log line carries them


@pytest.mark.parametrize("tied", [True, False])
def test_log_lines_carry_the_decoder_norm_when_untied(tied):
    imgs = np.random.default_rng(0).standard_normal((32, 16, 16, 1))
    tr = GreedyTrainer(Network.from_description(NET), InMemorySource(imgs), Adam(0.05), comm=MPI.COMM_SELF, batch=8,
                       lam=0.1, tied=tied, log_every=2, filter_norm=[0.2, None])
    tr.train([4, 2])
    logged = [r for r in tr.history if "median_norm" in r]
    assert logged and all(("decoder_median_norm" in r) == (not tied) for r in logged)
    if not tied:
        first = next(r for r in logged if r["stage"] == 0)
        assert first["decoder_median_norm"] == pytest.approx(0.2, rel=1e-5)  # projected as the encoder is


def test_stage_diagnostics_are_kept_without_logging():
    imgs = np.random.default_rng(0).standard_normal((32, 16, 16, 1))
    tr = GreedyTrainer(Network.from_description(NET), InMemorySource(imgs), Adam(0.05), comm=MPI.COMM_SELF, batch=8,
                       lam=0.1, log_every=0, filter_norm="auto")
    tr.train([3, 2])
    assert sorted(tr.stage_stats) == [0, 1] and "gabor_fraction" in tr.stage_stats[0]
