"""Faces in training data (natural --face-fraction) and the evaluation set (faces): counts,
identities never shared, distractor kinds, groups, determinism, the command line."""
import argparse
import hashlib
import json
import re

import h5py
import numpy as np
import pytest

from cotsdl.cli import inspect_cmd, prepare
from cotsdl.io import builders
from cotsdl.io.augment import NO_AUGMENTATION, Augmentation
from cotsdl.io.reader import HDF5Source

SIZE = (16, 16)
KIND = {name: code for code, name in enumerate(builders.KIND_NAMES)}

pytestmark = pytest.mark.usefixtures("skimage")


@pytest.fixture(scope="module")
def skimage():
    return pytest.importorskip("skimage", reason="scikit-image is a test dependency")


def hashes(images):
    return [hashlib.sha1(np.ascontiguousarray(im).tobytes()).hexdigest() for im in images]


def load(path):
    """images, labels, groups, kinds, recipe (labels... None where absent)."""
    with h5py.File(path, "r") as f:
        get = {k: f[k][()] if k in f else None for k in ("images", "labels", "groups", "kinds")}
        return (*get.values(), json.loads(f.attrs["recipe"]))


@pytest.fixture(scope="module")
def default_set(tmp_path_factory, skimage):
    """The evaluation set with every default but the image size."""
    path = tmp_path_factory.mktemp("faces") / "faces.h5"
    builders.faces(path, SIZE)
    return path


# ---------------------------------------------------------------- natural --face-fraction

def face_positions(plain, with_faces):
    return np.flatnonzero((plain != with_faces).reshape(len(plain), -1).any(axis=1))


@pytest.mark.parametrize("count, fraction", [(30, 0.5), (25, 0.1), (10, 0.25)])
def test_face_fraction_exact_count_and_the_same_crops(tmp_path, count, fraction):
    builders.natural(tmp_path / "plain.h5", count, SIZE, seed=4)
    builders.natural(tmp_path / "faces.h5", count, SIZE, seed=4, face_fraction=fraction)
    plain, with_faces = load(tmp_path / "plain.h5")[0], load(tmp_path / "faces.h5")[0]
    at = face_positions(plain, with_faces)  # everywhere else: the very same crops
    assert len(at) == round(fraction * count)  # Python's rounding: 2.5 -> 2
    recipe = load(tmp_path / "faces.h5")[-1]
    assert recipe["params"]["face_fraction"] == fraction and recipe["face_views"] == len(at)
    assert recipe["params"]["augmentation"] == Augmentation().as_dict()
    assert recipe["face_split"]["mixable"] == builders.face_split(0, 50)[0].tolist()


def test_face_views_differ_from_each_other_and_from_lfw(tmp_path):
    builders.natural(tmp_path / "plain.h5", 40, SIZE, seed=1)
    builders.natural(tmp_path / "n.h5", 40, SIZE, seed=1, face_fraction=0.75, mixable=10)  # 30 views of 10 faces
    plain, images = load(tmp_path / "plain.h5")[0], load(tmp_path / "n.h5")[0]
    views = images[face_positions(plain, images)].astype(np.float64)
    assert len(views) == 30
    lfw = builders.lfw_images(range(200), SIZE).astype(np.float64)
    lfw = np.concatenate([lfw, lfw[:, :, ::-1]])  # flipped too
    # mean absolute difference in gray levels: every view is new pixels
    to_lfw = np.abs(views[:, None] - lfw[None]).mean(axis=(2, 3, 4))
    between = np.abs(views[:, None] - views[None]).mean(axis=(2, 3, 4))
    assert to_lfw.min() > 2 and between[~np.eye(30, dtype=bool)].min() > 2


def test_face_fraction_deterministic(tmp_path):
    for name in ("a", "b"):
        builders.natural(tmp_path / f"{name}.h5", 20, SIZE, channels=3, seed=2, face_fraction=0.4)
    a, b = load(tmp_path / "a.h5"), load(tmp_path / "b.h5")
    assert a[0].tobytes() == b[0].tobytes() and a[-1] == b[-1]
    builders.natural(tmp_path / "c.h5", 20, SIZE, channels=3, seed=3, face_fraction=0.4)
    assert load(tmp_path / "c.h5")[0].tobytes() != a[0].tobytes()


def test_mix_faces_unchanged_by_face_fraction_support(tmp_path):
    """mix_faces still puts the raw mixable LFW faces, as before (its positions and faces are the same draws)."""
    builders.natural(tmp_path / "m.h5", 30, SIZE, seed=1, mix_faces=6, mixable=4)
    images, *_, recipe = load(tmp_path / "m.h5")
    mixable = set(hashes(builders.lfw_images(builders.face_split(0, 4)[0], SIZE)))
    assert sum(h in mixable for h in hashes(images)) == 6 and recipe["params"]["augmentation"] is None


# ---------------------------------------------------------------- identities

def test_evaluation_identities_never_in_training_faces(tmp_path):
    split = dict(face_split_seed=7, mixable=30)
    mix, held = builders.face_split(**split)
    # unaugmented views show which LFW faces natural uses: mixable ones only
    builders.natural(tmp_path / "n.h5", 60, SIZE, face_fraction=0.9, augmentation=NO_AUGMENTATION, **split)
    train = set(hashes(load(tmp_path / "n.h5")[0]))
    lfw = dict(zip(hashes(builders.lfw_images(range(100), SIZE)), range(100)))
    used = {lfw[h] for h in train if h in lfw}
    assert used == set(mix.tolist())  # 54 views of 30 faces: every mixable face, nothing else
    builders.faces(tmp_path / "f.h5", SIZE, views=2, **split)
    _, labels, groups, kinds, recipe = load(tmp_path / "f.h5")
    from_faces = set(groups[(kinds == KIND["face"]) | (kinds == KIND["phase_scrambled"])].tolist())
    assert from_faces == set(held.tolist()) and not from_faces & used
    assert recipe["face_split"] == load(tmp_path / "n.h5")[-1]["face_split"]


# ---------------------------------------------------------------- the evaluation set

def test_default_evaluation_set(default_set):
    _, labels, groups, kinds, recipe = load(default_set)
    assert labels.dtype == np.int64 and groups.dtype == np.int64 and kinds.dtype == np.int8
    assert labels.sum() >= 300 and np.array_equal(labels == 1, kinds == KIND["face"])
    assert np.bincount(kinds).tolist() == [400, 50, 100, 100, 100]  # the 50 LFW non-faces held out from training
    held = builders.face_split(0, 50)[1]
    face_groups = groups[kinds == KIND["face"]]
    assert sorted(set(face_groups.tolist())) == held.tolist() and set(np.bincount(face_groups)[held]) == {8}
    nonface_held = builders.nonface_split(0, 50)[1]  # the LFW index, never one a matched control trains on
    assert sorted(groups[kinds == KIND["lfw_nonface"]].tolist()) == nonface_held.tolist()
    assert recipe["lfw_nonfaces"] == nonface_held.tolist()
    own = groups[(kinds == KIND["photo_crop"]) | (kinds == KIND["matched_crop"])]
    assert len(set(own.tolist())) == 200 and own.min() >= 200  # each its own group
    assert recipe["kind_names"] == list(builders.KIND_NAMES) and recipe["params"]["views"] == 8
    assert 0 < kinds[:400].tolist().count(0) < 400  # shuffled


def test_default_evaluation_set_reads_back(default_set):
    _, labels, groups, kinds, _ = load(default_set)
    with HDF5Source(default_set, shuffle=False) as src:
        assert src.kind_names == builders.KIND_NAMES
        assert np.array_equal(src.kinds(), kinds) and np.array_equal(src.groups(), groups)
        assert np.array_equal(src.labels(), labels)


def test_face_views_in_the_set_are_new_pixels(default_set):
    images, _, _, kinds, _ = load(default_set)
    faces = images[kinds == KIND["face"]]
    assert len(set(hashes(faces))) == len(faces)
    lfw = builders.lfw_images(range(100), SIZE)
    assert not set(hashes(faces)) & set(hashes(lfw) + hashes(lfw[:, :, ::-1]))  # flipped too


def test_phase_scrambled_keep_their_identity_spectrum(tmp_path):
    # unaugmented: each scrambled image's source is its identity's LFW face itself
    builders.faces(tmp_path / "f.h5", SIZE, views=1, phase_scrambled=30, augmentation=NO_AUGMENTATION)
    images, labels, groups, kinds, _ = load(tmp_path / "f.h5")
    scrambled = kinds == KIND["phase_scrambled"]
    assert labels[scrambled].sum() == 0 and scrambled.sum() == 30
    held = builders.face_split(0, 50)[1]
    amp = np.abs(np.fft.fft2(builders.lfw_images(held, SIZE)[..., 0] / 255.0))
    for img, g in zip(images[scrambled][..., 0] / 255.0, groups[scrambled]):
        a = np.abs(np.fft.fft2(img))
        dist = np.linalg.norm(amp - a, axis=(1, 2)) / np.linalg.norm(a)
        assert held[np.argmin(dist)] == g and dist.min() < 0.1  # within clipping and quantization


def test_matched_crops_take_a_face_views_mean_and_contrast(default_set):
    images, _, _, kinds, _ = load(default_set)
    flat = images.reshape(len(images), -1) / 255.0
    stats = np.stack([flat.mean(axis=1), flat.std(axis=1)], axis=1)
    faces, matched = stats[kinds == KIND["face"]], stats[kinds == KIND["matched_crop"]]
    gap = np.abs(matched[:, None] - faces[None]).max(axis=2).min(axis=1)  # to the nearest face view
    assert gap.max() <= 1 / 255
    assert np.all(flat[kinds == KIND["matched_crop"]].std(axis=1) > 0)
    photo = stats[kinds == KIND["photo_crop"]]  # unmatched crops: far from the faces' statistics
    assert np.abs(photo[:, None] - faces[None]).max(axis=2).min(axis=1).max() > 10 / 255


def test_changing_one_count_leaves_the_other_kinds(tmp_path, default_set):
    builders.faces(tmp_path / "f.h5", SIZE, matched_crops=3, photo_crops=50)
    images, _, _, kinds, _ = load(tmp_path / "f.h5")
    ref, _, _, ref_kinds, _ = load(default_set)
    for kind in ("face", "lfw_nonface", "phase_scrambled"):
        assert sorted(hashes(images[kinds == KIND[kind]])) == sorted(hashes(ref[ref_kinds == KIND[kind]]))
    assert set(hashes(images[kinds == KIND["photo_crop"]])) < set(hashes(ref[ref_kinds == KIND["photo_crop"]]))


def test_evaluation_set_deterministic(tmp_path, default_set):
    builders.faces(tmp_path / "again.h5", SIZE)
    a, b = load(default_set), load(tmp_path / "again.h5")
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a[:4], b[:4])) and a[4] == b[4]


def test_resize_keeps_groups_and_kinds(tmp_path, default_set):
    builders.resize(tmp_path / "r.h5", default_set, (12, 12))
    a, b = load(default_set), load(tmp_path / "r.h5")
    assert b[0].shape[1:3] == (12, 12) and all(np.array_equal(x, y) for x, y in zip(a[1:4], b[1:4]))
    with h5py.File(tmp_path / "r.h5") as f:
        assert json.loads(f["kinds"].attrs["kind_names"]) == list(builders.KIND_NAMES)


# ---------------------------------------------------------------- command line

def cli(module, *argv):
    parser = argparse.ArgumentParser(prog="cotsdl")
    module.add_parser(parser.add_subparsers(dest="command", required=True))
    return module.run(parser.parse_args([str(a) for a in argv]))


def test_cli_face_fraction(tmp_path, capsys):
    assert cli(prepare, "prepare-data", "natural", tmp_path / "n.h5", "--count", 8, "--size", 8, 8,
               "--face-fraction", 0.25) == 0
    recipe = load(tmp_path / "n.h5")[-1]
    assert recipe["params"]["face_fraction"] == 0.25 and recipe["face_views"] == 2
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'n.h5'}: 8 images 8x8x1 uint8 in ")


@pytest.mark.parametrize("argv, message", [
    (["--face-fraction", 1], "face_fraction must be from 0 to less than 1, got 1.0"),
    (["--face-fraction", -0.1], "face_fraction must be from 0 to less than 1, got -0.1"),
    (["--face-fraction", "nan"], "face_fraction must be from 0 to less than 1, got nan"),
    (["--face-fraction", 0.2, "--mix-faces", 2], "face_fraction excludes mix_faces .*got face_fraction=0.2 and "
                                                 "mix_faces=2"),
    (["--face-fraction", 0.2, "--no-faces"], "no_faces excludes face_fraction, got face_fraction=0.2"),
    (["--face-fraction", 0.2, "--mixable", 0], "face_fraction > 0 needs mixable >= 1, got mixable=0"),
])
def test_cli_rejects_bad_face_fractions(tmp_path, capsys, argv, message):
    out = tmp_path / "o.h5"
    assert cli(prepare, "prepare-data", "natural", out, "--count", 10, "--size", 8, 8, *argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("cotsdl: error: ") and re.search(message, err), err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, message", [
    (["--lfw-nonfaces", 51], "lfw_nonfaces must be an integer from 0 to 50 (the LFW non-faces held out from "
                             "training with mixable=50), got 51"),
    (["--mixable", 99, "--views", 1, "--photo-crops", 0], None),  # the smallest set: 1 face
])
def test_cli_faces_options(tmp_path, capsys, argv, message):
    out = tmp_path / "o.h5"
    status = cli(prepare, "prepare-data", "faces", out, "--size", 8, 8, *argv)
    if message is None:
        assert status == 0 and load(out)[1].sum() == 1
    else:
        assert status == 2 and message in capsys.readouterr().err and not out.exists()


def test_inspect_shows_kinds_and_groups(default_set, capsys):
    assert cli(inspect_cmd, "inspect", default_set) == 0
    out = capsys.readouterr().out
    assert "  kinds: face: 400, lfw_nonface: 50, photo_crop: 100, phase_scrambled: 100, matched_crop: 100" in out
    assert "  groups: 300 (the unit of bootstrap resampling)" in out and out.rstrip().endswith("valid")
