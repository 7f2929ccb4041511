"""Face views, phase scrambling and statistics matching (cotsdl.io.augment), as functions."""
import numpy as np
import pytest

from cotsdl.io.augment import (NO_AUGMENTATION, Augmentation, augment, cycle, match_stats, matched_crops,
                               phase_scramble)


@pytest.fixture(scope="module")
def skimage():
    return pytest.importorskip("skimage", reason="scikit-image is a test dependency")


def smooth_image(shape, seed=0):
    """A face-like test image: smooth blobs in [0.1, 0.9]."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.linspace(0, 1, shape[0]), np.linspace(0, 1, shape[1]), indexing="ij")
    img = sum(rng.uniform(-1, 1) * np.exp(-((yy - rng.random()) ** 2 + (xx - rng.random()) ** 2) / 0.05)
              for _ in range(4))
    img = (img - img.min()) / (img.max() - img.min())
    return (0.1 + 0.8 * img)[..., None] * np.ones(shape[2:] or (1,))


def test_augmentation_ranges_are_checked():
    assert Augmentation().as_dict() == {"flip": True, "shift": 0.08, "scale": [0.9, 1.1], "rotate": 5.0,
                                        "contrast": [0.7, 1.3], "brightness": 0.1}
    with pytest.raises(ValueError, match=r"augmentation scale must be \(lo, hi\).*got \(1.2, 1.1\)"):
        Augmentation(scale=(1.2, 1.1))
    with pytest.raises(ValueError, match="augmentation shift must be from 0 to 0.5, got -0.1"):
        Augmentation(shift=-0.1)


def test_augment_identity_and_views_differ(skimage):
    face = smooth_image((20, 16, 1))
    assert np.allclose(augment(face, np.random.default_rng(0), NO_AUGMENTATION), face)
    rng = np.random.default_rng(1)
    views = [augment(face, rng, Augmentation()) for _ in range(6)]
    for i, v in enumerate(views):
        assert v.shape == face.shape and v.dtype == np.float64 and 0 <= v.min() and v.max() <= 1
        assert np.abs(v - face).max() > 0.05  # a real change, not rounding
        assert all(np.abs(v - w).max() > 0.05 for w in views[i + 1:])
    again = np.random.default_rng(1)
    assert all(np.array_equal(v, augment(face, again, Augmentation())) for v in views)  # deterministic


def test_augment_flip_and_photometric(skimage):
    face = smooth_image((16, 16, 1))
    flip_only = Augmentation(shift=0, scale=(1, 1), rotate=0, contrast=(1, 1), brightness=0)
    outs = [augment(face, np.random.default_rng(s), flip_only) for s in range(8)]
    assert all(np.allclose(o, face) or np.allclose(o, face[:, ::-1]) for o in outs)
    assert any(np.allclose(o, face[:, ::-1]) for o in outs) and any(np.allclose(o, face) for o in outs)
    contrast = Augmentation(flip=False, shift=0, scale=(1, 1), rotate=0, contrast=(0.5, 0.5), brightness=0)
    out = augment(face, np.random.default_rng(0), contrast)
    assert out.mean() == pytest.approx(face.mean()) and out.std() == pytest.approx(0.5 * face.std())


@pytest.mark.parametrize("shape", [(16, 16), (15, 22, 1), (12, 10, 3)])
def test_phase_scramble_keeps_the_amplitude_spectrum(shape):
    image = smooth_image(shape if len(shape) == 3 else shape + (1,), seed=2)
    image = image[..., 0] if len(shape) == 2 else image
    out = phase_scramble(image, np.random.default_rng(3))
    assert out.shape == image.shape and out.dtype == np.float64
    amp = np.abs(np.fft.fft2(image, axes=(0, 1)))
    np.testing.assert_allclose(np.abs(np.fft.fft2(out, axes=(0, 1))), amp, rtol=1e-9, atol=1e-9 * amp.max())
    assert out.mean() == pytest.approx(image.mean()) and out.std() == pytest.approx(image.std())
    assert np.corrcoef(out.ravel(), image.ravel())[0, 1] < 0.5  # the shape is gone
    assert not np.allclose(out, phase_scramble(image, np.random.default_rng(4)))


def test_match_stats():
    rng = np.random.default_rng(5)
    crop = np.clip(rng.gamma(2.0, 0.1, (16, 16, 1)), 0, 1)  # skewed: clipping matters
    for mean, std in [(0.45, 0.18), (0.3, 0.25), (0.7, 0.1)]:
        z = match_stats(crop, mean, std)
        assert z is not None and 0 <= z.min() and z.max() <= 1
        assert abs(z.mean() - mean) <= 1e-4 and abs(z.std() - std) <= 1e-4
        # an affine change of the pixels (then clipping): the order of the pixels is kept
        inside = (z > 0) & (z < 1)
        np.testing.assert_allclose(np.corrcoef(z[inside], crop[inside])[0, 1], 1.0)
    assert match_stats(np.full((4, 4), 0.5), 0.5, 0.1) is None  # flat: no contrast to scale
    speck = np.zeros((16, 16))
    speck[0, 0] = 1.0
    assert match_stats(speck, 0.5, 0.3) is None  # one pixel cannot carry that contrast in [0, 1]


def test_matched_crops_skip_flat_crops():
    rng = np.random.default_rng(0)
    targets = rng.integers(40, 200, (5, 8, 8, 1), dtype=np.uint8)
    flat = np.full((8, 8, 1), 0.5)
    textured = [np.clip(0.5 + 0.2 * rng.standard_normal((8, 8, 1)), 0, 1) for _ in range(3)]
    crops = iter([flat, textured[0], flat, textured[1], textured[2]])
    out = matched_crops(targets, crops, 3, np.random.default_rng(1))
    assert out.shape == (3, 8, 8, 1) and out.dtype == np.uint8
    assert next(crops, None) is None  # the two flat crops were drawn and skipped
    chosen = np.random.default_rng(1).integers(5, size=3)  # the targets, drawn first
    for img, t in zip(out / 255.0, targets[chosen] / 255.0):
        assert abs(img.mean() - t.mean()) <= 1 / 255 and abs(img.std() - t.std()) <= 1 / 255


def test_cycle_spreads_indices():
    idx = cycle(np.random.default_rng(0), 4, 10)
    assert idx.dtype == np.int64 and sorted(np.bincount(idx).tolist()) == [2, 2, 3, 3]
    assert sorted(idx[:4].tolist()) == sorted(idx[4:8].tolist()) == [0, 1, 2, 3]  # whole permutations
    assert cycle(np.random.default_rng(0), 4, 0).shape == (0,)
