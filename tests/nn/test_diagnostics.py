"""Filter diagnostics: the Gabor fitter finds planted Gabors and not noise; cosines, norms, silent units."""
import numpy as np
import pytest

from cotsdl.nn.diagnostics import (GaborFit, cosines, gabor_fit, gabor_fraction, gabor_model, sample_units,
                                   silent_units, stage_filter_stats, unit_norms)

YX = np.mgrid[0:7, 0:7].astype(np.float64)


def planted(rng, n, noise=0.05):
    """n random one-cycle-ish 7x7 Gabors with noise of ``noise`` times their std: (filters, truths)."""
    out, truth = [], []
    for _ in range(n):
        s = rng.uniform(1.2, 2.0)
        g = GaborFit(1.0, rng.uniform(0.5, 2.0), rng.uniform(2.5, 3.5), rng.uniform(2.5, 3.5), rng.uniform(0, np.pi),
                     s, s * rng.uniform(0.8, 1.5), rng.uniform(2.5, 6.0), rng.uniform(-np.pi, np.pi),
                     rng.uniform(-0.2, 0.2))
        f = gabor_model((7, 7), g)
        out.append(f + noise * f.std() * rng.standard_normal(f.shape))
        truth.append(g)
    return out, truth


def angle_mod_pi(a, b):
    return abs(np.angle(np.exp(2j * (a - b)))) / 2


def test_planted_gabors_are_recovered():
    rng = np.random.default_rng(1)
    for f, g in zip(*planted(rng, 12)):
        fit = gabor_fit(f)
        assert fit.r2 >= 0.9
        assert angle_mod_pi(fit.theta, g.theta) < 0.1
        assert abs(fit.wavelength / g.wavelength - 1) < 0.1
        assert fit.oriented
        assert 0 <= fit.theta < np.pi and -np.pi <= fit.phase <= np.pi and fit.amplitude >= 0


def test_fit_reports_the_variance_its_model_explains():
    rng = np.random.default_rng(2)
    f = planted(rng, 1, noise=0.3)[0][0]
    fit = gabor_fit(f)
    sse = ((gabor_model(f.shape, fit) - f) ** 2).sum()
    assert fit.r2 == pytest.approx(1 - sse / ((f - f.mean()) ** 2).sum(), abs=1e-9)


def test_noise_is_not_gabor_like():
    rng = np.random.default_rng(3)
    r2 = np.array([gabor_fit(f).r2 for f in rng.standard_normal((48, 7, 7))])
    assert np.median(r2) < 0.4  # measured 0.30 (seeded); a 9-parameter fit of 49 pixels explains some noise
    w = rng.standard_normal((4, 4, 3, 7, 7, 1))
    s = gabor_fraction(w, sample=32)
    assert s["fitted"] == 32 and s["fraction"] <= 0.05 and s["median_r2"] < 0.4


def test_blobs_fit_but_are_not_oriented_and_edges_are():
    y, x = YX
    for sigma in (0.8, 1.3, 2.0):
        blob = np.exp(-((x - 3.2) ** 2 + (y - 2.8) ** 2 / 1.5) / (2 * sigma ** 2))
        fit = gabor_fit(blob)
        assert fit.r2 > 0.95 and not fit.oriented
        xr = (x - 3) * np.cos(0.7) + (y - 3) * np.sin(0.7)
        edge = xr * np.exp(-((x - 3) ** 2 + (y - 3) ** 2) / (2 * sigma ** 2))  # derivative of a Gaussian
        fit = gabor_fit(edge)
        assert fit.r2 > 0.85 and fit.oriented and angle_mod_pi(fit.theta, 0.7) < 0.1
    w = np.stack([blob, edge], axis=-1).transpose(2, 0, 1)[None, None, :, :, :, None]  # (1, 1, 2, 7, 7, 1)
    s = gabor_fraction(w)
    assert s == {"fraction": 1.0, "oriented": 0.5, "median_r2": s["median_r2"], "fitted": 2}


def test_checkerboard_is_not_a_gabor():
    y, x = YX
    assert gabor_fit((-1.0) ** (x + y)).r2 < 0.5  # finer than the shortest wavelength allowed (2 pixels)


def test_constant_filter_explains_nothing_and_channels_are_summed():
    assert gabor_fit(np.full((5, 6), 3.0)).r2 == 0.0
    f = planted(np.random.default_rng(4), 1)[0][0]
    parts = np.stack([0.5 * f, 0.2 * f, 0.3 * f], axis=-1)
    assert gabor_fit(parts) == gabor_fit(parts.sum(axis=-1))
    assert gabor_fit(f.astype(np.float32)).r2 == pytest.approx(gabor_fit(f).r2, abs=1e-4)


def test_gabor_fraction_of_planted_weights_and_sampling():
    rng = np.random.default_rng(5)
    fs, _ = planted(rng, 6)
    w = np.array(fs).reshape(2, 1, 3, 7, 7, 1)
    s = gabor_fraction(w)
    assert s["fraction"] == 1.0 and s["oriented"] == 1.0 and s["median_r2"] > 0.95 and s["fitted"] == 6
    idx = sample_units((20, 30), 4, 50, 7)
    assert len(idx) == 50 and np.all(np.diff(idx) > 0) and idx.max() < 2400
    assert np.array_equal(idx, sample_units((20, 30), 4, 50, 7))
    assert not np.array_equal(idx, sample_units((20, 30), 4, 50, 8))
    assert np.array_equal(sample_units((2, 3), 4, 50, 7), np.arange(24))


def test_cosines_and_norms():
    rng = np.random.default_rng(6)
    w = rng.standard_normal((3, 2, 4, 5, 5, 2)).astype(np.float32)
    np.testing.assert_allclose(cosines(w, w), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(cosines(w, -w), -1.0, rtol=0, atol=1e-12)
    w0 = w.copy()
    w0[1, 1, 2] = 0
    c = cosines(w, w0)
    assert c.shape == (3, 2, 4) and c.dtype == np.float64 and c[1, 1, 2] == 0.0
    n = unit_norms(w)
    np.testing.assert_allclose(n, np.linalg.norm(w.reshape(3, 2, 4, -1).astype(np.float64), axis=-1), rtol=1e-12)
    assert unit_norms(w0)[1, 1, 2] == 0.0



def test_cosines_and_norms_in_pieces_are_the_whole_arrays_numbers(monkeypatch):
    """Converted to float64 a few units at a time (no weight-sized copies), bit for bit the numbers of
    the whole array at once, on a contiguous and a strided w."""
    from cotsdl.nn import diagnostics

    rng = np.random.default_rng(7)
    big = rng.standard_normal((4, 6, 3, 3, 3, 2)).astype(np.float32)
    for w in (big, big[:, ::2]):
        w0 = rng.standard_normal(w.shape).astype(np.float32)
        a = w.reshape(w.shape[:3] + (-1,)).astype(np.float64)
        b = w0.reshape(w.shape[:3] + (-1,)).astype(np.float64)
        den = np.sqrt((a * a).sum(-1)) * np.sqrt((b * b).sum(-1))
        whole = np.clip(np.divide((a * b).sum(-1), den, out=np.zeros(den.shape), where=den > 0), -1, 1)
        monkeypatch.setattr(diagnostics, "PIECE_BYTES", 5 * 18 * 8)  # 5 units a piece: pieces end mid-site
        np.testing.assert_array_equal(cosines(w, w0), whole)
        np.testing.assert_array_equal(unit_norms(w), np.sqrt((a * a).sum(-1)))
        monkeypatch.undo()

def test_silent_units_are_found_relative_to_the_median():
    rng = np.random.default_rng(7)
    h = rng.standard_normal((4, 5, 3, 16)) * 1e-3  # the scale does not matter
    h[1, 2, 0] = 0
    h[3, 4, 2] = 1e-3 * 1e-3 * rng.standard_normal(16)  # active, but 1000x weaker than a typical unit
    s = silent_units(h)
    assert s.shape == (4, 5, 3) and s.dtype == bool
    assert set(zip(*np.nonzero(s))) == {(1, 2, 0), (3, 4, 2)}
    assert silent_units(h * 1e6).tolist() == s.tolist()
    mostly = np.zeros((2, 2, 2, 3))
    mostly[0, 0, 0] = 1
    assert silent_units(mostly).sum() == 7  # a median of 0 still reports the zero units
    assert silent_units(h, rel=0.0).sum() == 1  # only exact zeros


class SelfComm:
    """A one-rank stand-in for an mpi4py communicator (the lowercase collectives only)."""

    def allgather(self, x):
        return [x]

    def allreduce(self, x):
        return x


def test_stage_filter_stats_on_one_rank_is_the_serial_numbers():
    rng = np.random.default_rng(8)
    w = rng.standard_normal((3, 4, 2, 7, 7, 1))
    w[0, 1] = np.array(planted(rng, 2)[0])[..., None]
    w0 = w + 0.5 * rng.standard_normal(w.shape)
    got = stage_filter_stats(SelfComm(), w, w0, (0, 0), (3, 4), sample=10, seed=3)
    ref = gabor_fraction(w, sample=10, seed=3)
    assert got["gabor_fraction"] == ref["fraction"] and got["oriented_fraction"] == ref["oriented"]
    assert got["median_r2"] == ref["median_r2"] and got["fitted"] == 10
    assert got["median_cosine_to_init"] == float(np.median(cosines(w, w0)))
    assert got["median_norm"] == float(np.median(unit_norms(w)))
    assert got["mean_norm"] == pytest.approx(float(unit_norms(w).mean()), rel=1e-14)
    assert all(type(v) in (float, int) for v in got.values())


@pytest.mark.parametrize("call, match", [
    (lambda: gabor_fit(np.zeros((2, 7))), "rh, rw >= 3"),
    (lambda: gabor_fit(np.zeros((7, 7), np.int64)), "float"),
    (lambda: gabor_fit(np.zeros((7, 7, 1, 1))), "shape"),
    (lambda: gabor_fit(np.full((7, 7), np.nan)), "non-finite"),
    (lambda: gabor_fraction(np.zeros((2, 2, 7, 7, 1))), r"\(SH, SW, M, rh, rw, C\)"),
    (lambda: gabor_fraction(np.zeros((1, 1, 1, 7, 7, 1)), threshold=1.5), "threshold"),
    (lambda: gabor_fraction(np.zeros((1, 1, 1, 7, 7, 1)), sample=0), "sample"),
    (lambda: gabor_fraction(np.zeros((1, 1, 1, 7, 7, 1)), seed=-1), "seed"),
    (lambda: gabor_fraction(np.zeros((0, 1, 1, 7, 7, 1))), "no units"),
    (lambda: cosines(np.zeros((1, 1, 1, 3, 3, 1)), np.zeros((1, 1, 2, 3, 3, 1))), "w0"),
    (lambda: unit_norms(np.zeros((1, 1, 1, 3, 3, 1), np.int32)), "float"),
    (lambda: silent_units(np.zeros((2, 2, 2))), r"\(H, W, K, N\)"),
    (lambda: silent_units(np.zeros((2, 2, 2, 0))), "N >= 1"),
    (lambda: silent_units(np.zeros((2, 2, 2, 3)), rel=1.0), "rel"),
    (lambda: silent_units(np.full((2, 2, 2, 3), np.inf)), "non-finite"),
    (lambda: stage_filter_stats(SelfComm(), np.zeros((2, 2, 1, 3, 3, 1)), np.zeros((2, 2, 1, 3, 3, 1)),
                                (1, 0), (2, 2)), "leave sites_shape"),
    (lambda: stage_filter_stats(SelfComm(), np.zeros((1, 2, 1, 3, 3, 1)), np.zeros((1, 2, 1, 3, 3, 1)),
                                (0, 0), (2, 2)), "site boxes hold 2 sites"),
    (lambda: stage_filter_stats(SelfComm(), np.zeros((1, 1, 1, 3, 3, 1)), np.zeros((1, 1, 1, 3, 3, 1)),
                                (-1, 0), (1, 1)), "sites_lo"),
])
def test_bad_arguments_are_rejected(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def fit_timing(n=200):  # pragma: no cover - run by hand: python tests/nn/test_diagnostics.py
    import time

    rng = np.random.default_rng(0)
    for name, fs in [("noise", list(rng.standard_normal((n, 7, 7)))), ("planted", planted(rng, n, noise=0.1)[0])]:
        t = time.process_time()
        r2 = [gabor_fit(f).r2 for f in fs]
        ms = (time.process_time() - t) / n * 1e3
        print(f"{name}: {ms:.1f} ms CPU per 7x7 fit, median r2 {np.median(r2):.3f}")


if __name__ == "__main__":  # pragma: no cover
    fit_timing()
