"""The matched no-face control's training set (``natural --no-faces --nonface-fraction F``): LFW non-face
views made exactly as ``--face-fraction F`` makes face views, from LFW non-faces the evaluation never shows."""
import hashlib
import json

import h5py
import numpy as np
import pytest

from cotsdl.io import builders
from cotsdl.io.augment import NO_AUGMENTATION, Augmentation, views
from cotsdl.io.photos import _lfw_float

SIZE = (16, 16)
COUNT, SEED, FRACTION = 24, 5, 0.5


@pytest.fixture(scope="module")
def skimage():
    return pytest.importorskip("skimage", reason="scikit-image is a test dependency")


def read(path):
    with h5py.File(path, "r") as f:
        return f["images"][()], json.loads(f.attrs["recipe"])


def hashes(images):
    return {hashlib.sha1(np.ascontiguousarray(im).tobytes()).hexdigest() for im in images}


def test_nonface_split():
    mix, held = builders.nonface_split(3, 30)
    assert len(mix) == 30 and len(held) == 70 and sorted(np.r_[mix, held].tolist()) == list(range(100, 200))
    assert np.array_equal(mix, builders.nonface_split(3, 30)[0])
    assert not np.array_equal(mix, builders.nonface_split(4, 30)[0])
    with pytest.raises(ValueError, match="mixable must be an integer from 0 to 99"):
        builders.nonface_split(0, 100)


def test_nonface_views_share_the_face_views_recipe(tmp_path, skimage):
    """The same positions, the same k-th source of an equally long list, the same augmentation draws; the
    other images are the no-face crops."""
    builders.natural(tmp_path / "f.h5", COUNT, SIZE, seed=SEED, face_fraction=FRACTION)
    builders.natural(tmp_path / "m.h5", COUNT, SIZE, seed=SEED, no_faces=True, nonface_fraction=FRACTION)
    builders.natural(tmp_path / "n.h5", COUNT, SIZE, seed=SEED, no_faces=True)
    (faces, frec), (matched, mrec), (plain, _) = (read(tmp_path / n) for n in ("f.h5", "m.h5", "n.h5"))
    k = round(FRACTION * COUNT)
    where = builders._face_positions(SEED, COUNT, k, 50)
    at = np.array(sorted(where))
    others = np.setdiff1d(np.arange(COUNT), at)
    assert np.array_equal(matched[others], plain[others])  # the crops: those of the no-face set
    which = [where[int(p)] for p in at]
    face_src, nonface_src = builders.face_split(0, 50)[0], builders.nonface_split(0, 50)[0]
    expect_faces = views(_lfw_float(face_src, SIZE, 1, "crop"), which, np.random.default_rng([SEED, 2]), Augmentation())
    expect = views(_lfw_float(nonface_src, SIZE, 1, "crop"), which, np.random.default_rng([SEED, 2]), Augmentation())
    assert np.array_equal(faces[at], expect_faces)  # the recipe reproduced for the faces...
    assert np.array_equal(matched[at], expect)  # ...and, with the same draws, for the non-faces
    assert mrec["params"]["augmentation"] == frec["params"]["augmentation"] == Augmentation().as_dict()
    assert mrec["nonface_views"] == frec["face_views"] == k and mrec["face_split"] is None
    assert mrec["nonface_split"]["mixable"] == nonface_src.tolist() and mrec["params"]["no_faces"]
    assert not set(builders.FACE_PHOTOS) & set(mrec["sources"])


def test_no_training_view_is_an_evaluation_image(tmp_path, skimage):
    """Unaugmented views are the LFW non-faces themselves: none is among the evaluation's lfw_nonface images."""
    builders.natural(tmp_path / "m.h5", 120, SIZE, seed=1, no_faces=True, nonface_fraction=0.5,
                     augmentation=NO_AUGMENTATION, face_split_seed=2, mixable=40)
    builders.faces(tmp_path / "e.h5", SIZE, seed=0, face_split_seed=2, mixable=40, views=1, photo_crops=3,
                   phase_scrambled=3, matched_crops=3)
    train, recipe = read(tmp_path / "m.h5")
    with h5py.File(tmp_path / "e.h5") as f:
        kinds, groups, images = f["kinds"][()], f["groups"][()], f["images"][()]
    shown = images[kinds == builders.KIND_NAMES.index("lfw_nonface")]
    mix, held = builders.nonface_split(2, 40)
    lfw_mix = hashes(builders.lfw_images(mix, SIZE))
    used = hashes(train) & lfw_mix
    assert len(used) == 40  # 60 views cycle through all 40 mixable non-faces
    assert not hashes(train) & hashes(shown) and not lfw_mix & hashes(shown)
    assert sorted(groups[kinds == 1].tolist()) == held.tolist()  # all 60 held-out ones, by LFW index
    assert builders.lfw_overlap(recipe, tmp_path / "e.h5") == []
    # an evaluation set of another split shows some of the control's non-faces: found
    builders.faces(tmp_path / "other.h5", SIZE, seed=0, face_split_seed=3, mixable=40, views=1, photo_crops=3,
                   phase_scrambled=3, matched_crops=3)
    seen = builders.lfw_overlap(recipe, tmp_path / "other.h5")
    assert seen and set(seen) <= set(mix.tolist())
    assert builders.lfw_overlap(read(tmp_path / "e.h5")[1], tmp_path / "other.h5") == []  # no views: nothing


@pytest.mark.parametrize("kwargs, message", [
    (dict(nonface_fraction=0.5), "nonface_fraction needs no_faces"),
    (dict(nonface_fraction=0.5, no_faces=True, face_fraction=0.2), "no_faces excludes face_fraction"),
    (dict(nonface_fraction=1.0, no_faces=True), "nonface_fraction must be from 0 to less than 1"),
    (dict(nonface_fraction=0.5, no_faces=True, mixable=0), "nonface_fraction > 0 needs mixable >= 1"),
])
def test_bad_nonface_fractions(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        builders.natural(tmp_path / "x.h5", 10, SIZE, **kwargs)
    assert not (tmp_path / "x.h5").exists()


def test_faces_keeps_to_the_held_out_nonfaces(tmp_path):
    with pytest.raises(ValueError, match=r"lfw_nonfaces must be an integer from 0 to 50 \(the LFW non-faces held "
                                         r"out from training with mixable=50\), got 51"):
        builders.faces(tmp_path / "x.h5", SIZE, lfw_nonfaces=51)


def test_evaluate_refuses_a_run_trained_on_evaluation_nonfaces(tmp_path, skimage):
    """`cotsdl evaluate` checks every run's training set against the labeled set before scoring."""
    from pathlib import Path

    from cotsdl.cli.evaluate import _check_no_overlap

    builders.natural(tmp_path / "m.h5", 20, SIZE, seed=0, no_faces=True, nonface_fraction=0.5)
    builders.faces(tmp_path / "ok.h5", SIZE, views=1, photo_crops=2, phase_scrambled=2, matched_crops=2)
    builders.faces(tmp_path / "bad.h5", SIZE, face_split_seed=9, views=1, photo_crops=2, phase_scrambled=2,
                   matched_crops=2)
    runs = [("runs/demo", {"data": {"file": str(tmp_path / "gone.h5")}}),  # a missing file is not an error here
            ("runs/demo-matched", {"data": {"file": str(tmp_path / "m.h5")}})]
    _check_no_overlap(runs, Path(tmp_path / "ok.h5"))
    with pytest.raises(ValueError, match=r"runs/demo-matched trained on views of \d+ LFW non-face\(s\) that .*bad.h5 "
                                         r"shows as lfw_nonface distractors"):
        _check_no_overlap(runs, Path(tmp_path / "bad.h5"))
