"""Filter orientations, border sites and the border-against-interior comparison (cotsdl.nn.orientation)."""
import numpy as np
import pytest

from cotsdl.nn.diagnostics import GaborFit, gabor_model
from cotsdl.nn.orientation import border_sites, compare, histogram, orientations, parallel_bins


def grating(theta: float, size: int = 7, wavelength: float = 3.5) -> np.ndarray:
    """A Gabor with wave vector at ``theta`` (GaborFit's convention), (size, size, 1)."""
    g = GaborFit(1.0, 1.0, (size - 1) / 2, (size - 1) / 2, theta, 2.0, 2.0, wavelength, 0.3, 0.0)
    return gabor_model((size, size), g)[..., None]


@pytest.mark.parametrize("deg", [0, 30, 45, 90, 135, 170])
def test_orientation_of_a_planted_grating(deg):
    theta, strength = orientations(grating(np.radians(deg))[None])
    err = abs((np.degrees(theta[0]) - deg + 90) % 180 - 90)
    assert err < 6 and strength[0] > 0.5, (deg, np.degrees(theta[0]), strength[0])


def test_vertical_stripes_are_theta_zero_and_channels_are_summed():
    x = np.arange(7)
    f = np.cos(2 * np.pi * x / 3.5)[None, :].repeat(7, axis=0)  # varies along the columns: vertical stripes
    w = np.stack([f, f, f], axis=-1)[None, None, None]  # (1, 1, 1, 7, 7, 3)
    theta, strength = orientations(w)
    assert theta.shape == (1, 1, 1) and abs((np.degrees(theta[0, 0, 0]) + 90) % 180 - 90) < 1
    assert strength[0, 0, 0] > 0.7  # < 1: the 7x7 window spreads the power over nearby angles


def test_a_constant_filter_has_no_orientation():
    theta, strength = orientations(np.full((2, 7, 7, 1), 0.5))
    assert np.all(strength == 0) and np.all(np.isfinite(theta))


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="float array"):
        orientations(np.zeros((7, 7), int))


def test_border_ring_and_nearest_edge():
    b = border_sites((4, 5))
    assert b.sum() == 4 * 5 - 2 * 3 and not b[1:3, 1:4].any()
    want = parallel_bins((5, 5))
    assert want[2, 0] == want[2, 4] == want[2, 1] == 0  # nearer the left or right edge: vertical
    assert want[0, 2] == want[4, 2] == want[1, 2] == 2  # nearer the top or bottom: horizontal
    assert want[0, 0] == want[1, 1] == want[2, 2] == -1  # diagonal: no one edge


def test_histogram_bins():
    h = histogram(np.radians([0, 10, 170, 44, 46, 90, 100, 135]))
    assert h == [3 / 8, 2 / 8, 2 / 8, 1 / 8]
    assert np.isnan(histogram(np.zeros(0))).all()


def planted(edge_parallel: bool, seed: int = 0, shape=(12, 12), units=8) -> np.ndarray:
    """theta (SH, SW, M): spread evenly, except (with ``edge_parallel``) the border sites' units,
    gratings parallel to their nearest edge."""
    rng = np.random.default_rng(seed)
    theta = rng.uniform(0, np.pi, shape + (units,))
    if edge_parallel:
        want = parallel_bins(shape)
        ring = border_sites(shape) & (want >= 0)
        theta[ring] = np.radians(45 * want[ring])[:, None] + rng.normal(0, 0.1, (ring.sum(), units))
    return theta


def test_compare_finds_edge_parallel_border_filters():
    c = compare(planted(True), border_sites((12, 12)))
    assert c["border_edge_parallel"] > 0.95 and abs(c["interior_edge_parallel"] - 0.25) < 0.06
    assert c["edge_parallel_diff_ci_low"] > 0.5
    assert len(c["border_orientations"]) == len(c["interior_orientations"]) == 4
    assert abs(sum(c["border_orientations"]) - 1) < 1e-12


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compare_finds_nothing_where_nothing_differs(seed):
    c = compare(planted(False, seed), border_sites((12, 12)))
    assert c["edge_parallel_diff_ci_low"] < 0 < c["edge_parallel_diff_ci_high"], c


def test_compare_without_interior_sites():
    c = compare(planted(False, shape=(2, 3)), border_sites((2, 3)))
    assert np.isnan(c["interior_edge_parallel"]) and np.isnan(c["edge_parallel_diff_ci_low"])
