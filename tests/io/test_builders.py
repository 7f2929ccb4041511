"""Dataset builders and ``cotsdl prepare-data``: deterministic, the right contents, no held-out leaks."""
import argparse
import hashlib
import json
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest

from cotsdl.cli import prepare
from cotsdl.io import builders
from cotsdl.io.augment import NO_AUGMENTATION, Augmentation
from cotsdl.io.dataset import DatasetError, image_stats, inspect

SIZE = (16, 16)


@pytest.fixture(scope="module")
def skimage():
    return pytest.importorskip("skimage", reason="scikit-image is a test dependency")


@pytest.fixture(scope="module")
def pil():
    return pytest.importorskip("PIL.Image", reason="Pillow is a test dependency")


def read(path):
    with h5py.File(path, "r") as f:
        labels = f["labels"][()] if "labels" in f else None
        return f["images"][()], labels, json.loads(f.attrs["recipe"]), f["image_mean"][()], f["image_std"][()]


def hashes(images):
    return [hashlib.sha1(np.ascontiguousarray(im).tobytes()).hexdigest() for im in images]


def build_twice(tmp_path, fn, *args, **kwargs):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    fn(a, *args, **kwargs)
    fn(b, *args, **kwargs)
    return read(a), read(b)


def assert_same(x, y):
    assert np.array_equal(x[0], y[0]) and x[0].dtype == y[0].dtype
    assert (x[1] is None and y[1] is None) or np.array_equal(x[1], y[1])
    assert x[2] == y[2]


def test_photo_lists_are_disjoint_and_distinct(skimage):
    assert not set(builders.TRAIN_PHOTOS) & set(builders.HELD_OUT_PHOTOS)
    # by content too: scikit-image has aliases (cat() is chelsea())
    digests = hashes(builders._photo(name, 1) for name in builders.TRAIN_PHOTOS + builders.HELD_OUT_PHOTOS)
    assert len(set(digests)) == len(digests)


def test_face_split():
    mix, held = builders.face_split(3, 30)
    assert len(mix) == 30 and len(held) == 70
    assert sorted(np.r_[mix, held].tolist()) == list(range(100))
    again = builders.face_split(3, 30)
    assert np.array_equal(mix, again[0]) and np.array_equal(held, again[1])
    assert not np.array_equal(mix, builders.face_split(4, 30)[0])
    with pytest.raises(ValueError, match="mixable must be an integer from 0 to 99.*got 100"):
        builders.face_split(0, 100)


@pytest.mark.parametrize("channels", [1, 3])
def test_natural_deterministic(tmp_path, skimage, channels):
    x, y = build_twice(tmp_path, builders.natural, 12, (12, 20), channels=channels, seed=5, mix_faces=3)
    assert_same(x, y)
    images, labels, recipe, mean, std = x
    assert images.shape == (12, 12, 20, channels) and images.dtype == np.uint8 and labels is None
    assert recipe["builder"] == "natural" and recipe["seed"] == 5 and recipe["sources"] == list(builders.TRAIN_PHOTOS)
    assert recipe["params"]["mix_faces"] == 3 and recipe["params"]["size"] == [12, 20] and recipe["cotsdl_version"]
    assert np.allclose(mean, image_stats(images)[0]) and np.allclose(std, image_stats(images)[1])
    assert len(set(hashes(images))) == 12 and images.std() > 10
    builders.natural(tmp_path / "c.h5", 12, (12, 20), channels=channels, seed=6, mix_faces=3)
    assert not np.array_equal(read(tmp_path / "c.h5")[0], images)


def test_mixing_faces_changes_only_their_positions(tmp_path, skimage):
    builders.natural(tmp_path / "plain.h5", 30, SIZE, seed=1)
    builders.natural(tmp_path / "mixed.h5", 30, SIZE, seed=1, mix_faces=4)
    plain, mixed = read(tmp_path / "plain.h5")[0], read(tmp_path / "mixed.h5")[0]
    assert (plain != mixed).reshape(30, -1).any(axis=1).sum() == 4


FACES_SMALL = dict(face_split_seed=1, mixable=40, views=2, photo_crops=7, phase_scrambled=5, matched_crops=6)


def test_faces_deterministic_and_labeled(tmp_path, skimage):
    x, y = build_twice(tmp_path, builders.faces, SIZE, seed=2, **FACES_SMALL)
    assert_same(x, y)
    images, labels, recipe, _, _ = x
    n = 60 * 2 + 60 + 7 + 5 + 6  # 60 held-out faces x 2 views; the 60 held-out LFW non-faces
    assert images.shape == (n,) + SIZE + (1,) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and labels.sum() == 120 and len(labels) == n
    mix, held = builders.face_split(1, 40)
    assert recipe["face_split"] == {"mixable": mix.tolist(), "held_out": held.tolist()}
    assert recipe["builder"] == "faces" and set(builders.HELD_OUT_PHOTOS) <= set(recipe["sources"])
    assert recipe["params"]["views"] == 2 and recipe["params"]["augmentation"] == Augmentation().as_dict()
    assert recipe["kind_counts"] == {"face": 120, "lfw_nonface": 60, "photo_crop": 7, "phase_scrambled": 5,
                                     "matched_crop": 6}
    assert 0 < labels[:120].sum() < 120  # shuffled
    builders.faces(tmp_path / "c.h5", SIZE, seed=3, **FACES_SMALL)
    other, other_labels, *_ = read(tmp_path / "c.h5")
    assert not np.array_equal(other, images)
    # another seed: other views and crops; the same 60 held-out LFW non-faces
    assert len(set(hashes(other)) & set(hashes(images))) == 60
    assert set(hashes(builders.lfw_images(builders.nonface_split(1, 40)[1], SIZE))) <= set(hashes(other))


def test_no_held_out_image_leaks_into_training_data(tmp_path, skimage):
    # unaugmented views: the evaluation faces are exactly the held-out LFW images
    builders.faces(tmp_path / "faces.h5", SIZE, seed=0, face_split_seed=7, mixable=30, views=1, photo_crops=20,
                   augmentation=NO_AUGMENTATION)
    images, labels, *_ = read(tmp_path / "faces.h5")
    held_out = set(hashes(images)) | set(hashes(images[:, :, ::-1]))  # flipped too
    mix, held = builders.face_split(7, 30)
    assert set(hashes(images[labels == 1])) == set(hashes(builders.lfw_images(held, SIZE)))

    builders.natural(tmp_path / "train.h5", 80, SIZE, seed=0, mix_faces=25, face_split_seed=7, mixable=30)
    train = hashes(read(tmp_path / "train.h5")[0])
    assert not set(train) & held_out
    all_faces = set(hashes(builders.lfw_images(range(100), SIZE)))
    mixed = [h for h in train if h in all_faces]
    assert len(mixed) == 25 and len(set(mixed)) == 25  # 25 <= 30 mixable: no repeats
    assert set(mixed) <= set(hashes(builders.lfw_images(mix, SIZE)))


def test_natural_repeats_faces_beyond_the_mixable_part(tmp_path, skimage):
    builders.natural(tmp_path / "n.h5", 12, SIZE, mix_faces=10, mixable=4)
    train = hashes(read(tmp_path / "n.h5")[0])
    mixable = set(hashes(builders.lfw_images(builders.face_split(0, 4)[0], SIZE)))
    assert sum(h in mixable for h in train) == 10 and mixable <= set(train)


@pytest.mark.parametrize("dtype, channels", [("float32", 1), ("uint8", 3)])
def test_synthetic(tmp_path, dtype, channels):
    x, y = build_twice(tmp_path, builders.synthetic, 20, (10, 12), channels=channels, seed=4, dtype=dtype, labels=True)
    assert_same(x, y)
    images, labels, recipe, _, _ = x
    assert images.shape == (20, 10, 12, channels) and images.dtype == np.dtype(dtype)
    assert set(labels.tolist()) == {0, 1} and recipe["params"]["labels"] is True and recipe["seed"] == 4
    builders.synthetic(tmp_path / "c.h5", 20, (10, 12), channels=channels, seed=5, dtype=dtype)
    other, other_labels, *_ = read(tmp_path / "c.h5")
    assert other_labels is None and not np.array_equal(other, images)
    builders.synthetic(tmp_path / "d.h5", 20, (10, 12), channels=channels, seed=4, dtype=dtype)
    assert np.array_equal(read(tmp_path / "d.h5")[0], images)  # labels or not: the same images


def test_core_imports_without_scikit_image_and_pillow():
    code = ("import sys; sys.modules.update({m: None for m in ('skimage', 'PIL')})\n"
            "from cotsdl.io import builders; from cotsdl.cli import prepare\n"
            "import tempfile, os; d = tempfile.mkdtemp(); builders.synthetic(os.path.join(d, 's.h5'), 3, (4, 4))\n"
            "try:\n    builders.natural(os.path.join(d, 'n.h5'), 3, (4, 4))\n"
            "except builders.DatasetError as e:\n    print(e)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "needs scikit-image: pip install 'cotsdl[data]'" in res.stdout


@pytest.fixture
def image_folder(tmp_path, pil):
    src = tmp_path / "src"
    src.mkdir()
    wide = np.zeros((20, 60, 3), np.uint8)
    wide[:, 20:40] = 255  # white center square, black sides
    pil.fromarray(wide).save(src / "b_wide.png")
    pil.fromarray(np.full((30, 30), 128, np.uint8)).save(src / "a_gray.jpg", quality=95)
    (src / "notes.txt").write_text("not an image")
    return src


def test_folder_modes(tmp_path, image_folder, capsys):
    builders.folder(tmp_path / "crop.h5", image_folder, (10, 10), mode="crop")
    assert "notes.txt: not an image" in capsys.readouterr().err
    builders.folder(tmp_path / "resize.h5", image_folder, (10, 10), channels=3, mode="resize")
    crop, labels, recipe, _, _ = read(tmp_path / "crop.h5")
    resize = read(tmp_path / "resize.h5")[0]
    assert crop.shape == (2, 10, 10, 1) and resize.shape == (2, 10, 10, 3) and labels is None
    assert recipe["files"] == ["a_gray.jpg", "b_wide.png"] and recipe["skipped"] == ["notes.txt"]
    assert abs(int(crop[0].mean()) - 128) <= 2  # sorted by name: the gray JPEG first
    assert crop[1].min() >= 250  # the white center square alone
    assert resize[1, :, 0].max() < 20 and resize[1, :, 5].min() >= 250  # black sides, white middle
    builders.folder(tmp_path / "again.h5", image_folder, (10, 10), mode="crop")
    assert np.array_equal(read(tmp_path / "again.h5")[0], crop)


def test_folder_errors(tmp_path, image_folder, pil):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.md").write_text("x")
    with pytest.raises(DatasetError, match=f"{empty}: no images found"):
        builders.folder(tmp_path / "x.h5", empty, SIZE)
    (image_folder / "c_broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not a png")
    with pytest.raises(DatasetError, match="c_broken.png: cannot decode the image"):
        builders.folder(tmp_path / "x.h5", image_folder, SIZE)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "src"]  # no partial file left
    with pytest.raises(DatasetError, match="no such folder"):
        builders.folder(tmp_path / "x.h5", tmp_path / "missing", SIZE)
    with pytest.raises(ValueError, match="mode must be 'crop' or 'resize'"):
        builders.folder(tmp_path / "x.h5", image_folder, SIZE, mode="stretch")


def test_add_stats(tmp_path):
    path = tmp_path / "s.h5"
    builders.synthetic(path, 300, (6, 5), dtype="uint8", seed=1)
    images, _, _, mean, std = read(path)
    with h5py.File(path, "r+") as f:
        del f["image_mean"], f["image_std"]
    assert not inspect(path).has_stats
    assert builders.add_stats(path, chunk=64)
    _, _, _, mean2, std2 = read(path)
    assert np.allclose(mean2, mean) and np.allclose(std2, std)
    assert np.allclose(mean2, (images / 255.0).reshape(300, -1).mean(axis=1))
    assert not builders.add_stats(path)  # has them: nothing to do
    with pytest.raises(DatasetError, match="no such file"):
        builders.add_stats(tmp_path / "missing.h5")


def cli(*argv):
    parser = argparse.ArgumentParser(prog="cotsdl")
    prepare.add_parser(parser.add_subparsers(dest="command", required=True))
    return prepare.run(parser.parse_args(["prepare-data", *map(str, argv)]))


def test_cli_builders(tmp_path, image_folder, capsys):
    size = ["--size", 12, 14]
    assert cli("natural", tmp_path / "n.h5", "--count", 9, *size, "--channels", 3, "--mix-faces", 2, "--seed", 3,
               "--scale", 0.3, 0.6, "--no-flip", "--compression", "gzip") == 0
    assert cli("faces", tmp_path / "f.h5", *size, "--mixable", 60, "--views", 2, "--lfw-nonfaces", 10,
               "--photo-crops", 5, "--phase-scrambled", 3, "--matched-crops", 4, "--face-split-seed", 2,
               "--mode", "resize") == 0
    assert cli("folder", image_folder, tmp_path / "d.h5", *size, "--mode", "resize") == 0
    assert cli("synthetic", tmp_path / "s.h5", "--count", 7, *size, "--dtype", "uint8", "--labels") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"wrote {tmp_path / 'n.h5'}: 9 images 12x14x3 uint8 in ")
    # 59 groups: 40 identities (the scrambled faces' too), 10 non-faces, 9 crops
    assert out[1].startswith(f"wrote {tmp_path / 'f.h5'}: 102 images 12x14x1 uint8, labels 0: 22, 1: 80 (face 80, "
                             "lfw_nonface 10, photo_crop 5, phase_scrambled 3, matched_crop 4), 59 groups in ")
    assert out[2].startswith(f"wrote {tmp_path / 'd.h5'}: 2 images")
    assert "7 images 12x14x1 uint8, labels" in out[3]
    n = inspect(tmp_path / "n.h5")
    assert n.compression == "gzip" and n.recipe["params"]["scale"] == [0.3, 0.6] and not n.recipe["params"]["flip"]
    f = inspect(tmp_path / "f.h5")
    assert f.recipe["params"]["mode"] == "resize" and f.recipe["params"]["views"] == 2
    assert f.recipe["params"]["matched_crops"] == 4 and f.recipe["params"]["lfw_nonfaces"] == 10
    with h5py.File(tmp_path / "s.h5", "r+") as f:
        del f["image_mean"], f["image_std"]
    assert cli("stats", tmp_path / "s.h5") == 0 and inspect(tmp_path / "s.h5").has_stats
    assert capsys.readouterr().out.startswith("added image_mean, image_std to")


@pytest.mark.parametrize("argv, message", [
    (["faces", "OUT", "--size", 8, 8, "--mixable", 100], "mixable must be an integer from 0 to 99"),
    (["natural", "OUT", "--count", 3, "--size", 8, 8, "--mix-faces", 4], "mix_faces must be .* got 4"),
    (["natural", "OUT", "--count", 3, "--size", 8, 8, "--scale", 0, 1], r"scale must be 0 < lo <= hi <= 1"),
    (["folder", "MISSING", "OUT", "--size", 8, 8], "MISSING: no such folder"),
    (["synthetic", "NODIR/x.h5", "--count", 3, "--size", 8, 8], "NODIR is not a folder"),
    (["stats", "MISSING"], "MISSING: no such file"),
])
def test_cli_bad_values(tmp_path, capsys, argv, message):
    names = {"OUT": tmp_path / "o.h5", "MISSING": tmp_path / "missing", "NODIR/x.h5": tmp_path / "nodir" / "x.h5"}
    (tmp_path / "nodir").write_text("a file where a folder should be")
    assert cli(*[names.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err
    message = message.replace("MISSING", str(tmp_path / "missing")).replace("NODIR", str(tmp_path / "nodir"))
    assert err.startswith("cotsdl: error: ") and re.search(message, err)
    assert not (tmp_path / "o.h5").exists()


@pytest.mark.parametrize("argv", [["synthetic", "o.h5", "--count", "0", "--size", "8", "8"],
                                  ["synthetic", "o.h5", "--count", "3", "--size", "8", "8", "--channels", "2"],
                                  ["folder", "src", "o.h5", "--size", "8", "8", "--mode", "stretch"]])
def test_cli_rejects_bad_options(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli(*argv)
    assert e.value.code == 2 and "error: argument" in capsys.readouterr().err


def test_resize_converts_size_and_channels_and_keeps_labels(tmp_path, skimage):
    rng = np.random.default_rng(0)
    u8 = np.full((5, 20, 30, 3), 77, np.uint8)
    u8[:, 5:15, 10:20] = 200  # a bright centre square: a crop keeps it in the middle
    builders.synthetic(tmp_path / "s.h5", 5, (8, 8), labels=True)  # a labeled float file
    with h5py.File(tmp_path / "s.h5", "r") as f:
        labels = f["labels"][()]
    from cotsdl.io.dataset import write_dataset

    write_dataset(tmp_path / "u8.h5", u8, labels=labels)
    builders.resize(tmp_path / "small.h5", tmp_path / "u8.h5", (10, 10), channels=1, mode="crop")
    imgs, lab, recipe, mean, _ = read(tmp_path / "small.h5")
    assert imgs.shape == (5, 10, 10, 1) and imgs.dtype == np.uint8 and np.array_equal(lab, labels)
    assert recipe["builder"] == "resize" and recipe["source_recipe"] == {}
    assert imgs[0, 5, 5, 0] > imgs[0, 0, 0, 0]  # the centre stays bright
    f32 = rng.standard_normal((4, 12, 12)).astype(np.float32) * 3  # values far outside [0, 1] stay
    write_dataset(tmp_path / "f.h5", f32)
    builders.resize(tmp_path / "f6.h5", tmp_path / "f.h5", (12, 12), mode="resize")
    same, _, _, _, _ = read(tmp_path / "f6.h5")
    assert same.dtype == np.float32 and same.shape == (4, 12, 12, 1)
    np.testing.assert_allclose(same[..., 0], f32, atol=1e-5)  # the same size: the same pixels
    with pytest.raises(DatasetError, match="nope.h5: no such file"):
        builders.resize(tmp_path / "x.h5", tmp_path / "nope.h5", (4, 4))
    assert not (tmp_path / "x.h5").exists()


def test_natural_without_faces(tmp_path, skimage):
    builders.natural(tmp_path / "nf.h5", 20, SIZE, seed=3, no_faces=True)
    _, _, recipe, _, _ = read(tmp_path / "nf.h5")
    assert recipe["params"]["no_faces"] and not set(builders.FACE_PHOTOS) & set(recipe["sources"])
    assert set(recipe["sources"]) == set(builders.TRAIN_PHOTOS) - set(builders.FACE_PHOTOS)
    with pytest.raises(ValueError, match="no_faces excludes mix_faces"):
        builders.natural(tmp_path / "x.h5", 20, SIZE, mix_faces=2, no_faces=True)


def test_folder_says_what_it_did_with_colour_and_subfolders(tmp_path, image_folder, pil, capsys):
    """Colour images turned grey and subfolders skipped are said (with --channels 3 and --recursive
    the alternatives); --recursive reads the subfolders, named by relative path."""
    sub = image_folder / "more"
    sub.mkdir()
    pil.fromarray(np.full((12, 12, 3), 200, np.uint8)).save(sub / "c_grey_as_rgb.png")  # grey, stored as RGB
    pil.fromarray(np.dstack([np.full((12, 12), v, np.uint8) for v in (250, 10, 10)])).save(sub / "d_red.png")
    builders.folder(tmp_path / "flat.h5", image_folder, (10, 10))
    err = capsys.readouterr().err
    assert f"1 subfolder(s) of {image_folder} not read (more); --recursive reads them" in err
    assert "converted to grey" not in err  # the black/white image has equal channels
    assert read(tmp_path / "flat.h5")[2]["files"] == ["a_gray.jpg", "b_wide.png"]
    builders.folder(tmp_path / "deep.h5", image_folder, (10, 10), recursive=True)
    err = capsys.readouterr().err
    assert "1 of 4 images were in colour and were converted to grey (--channels 3 keeps the colour)" in err
    assert "subfolder" not in err
    images, _, recipe, _, _ = read(tmp_path / "deep.h5")
    assert recipe["files"] == ["a_gray.jpg", "b_wide.png", "more/c_grey_as_rgb.png", "more/d_red.png"]
    assert images.shape == (4, 10, 10, 1) and recipe["params"]["recursive"] is True
    builders.folder(tmp_path / "rgb.h5", image_folder, (10, 10), channels=3, recursive=True)
    assert "converted" not in capsys.readouterr().err


def test_folder_names_the_entries_it_cannot_read(tmp_path, image_folder, pil, capsys, monkeypatch):
    """Symlink loops, broken links, unreadable files and folders were dropped without a word."""
    import os

    (image_folder / "loop1.png").symlink_to("loop2.png")
    (image_folder / "loop2.png").symlink_to("loop1.png")
    (image_folder / "gone.png").symlink_to("nowhere.png")
    sub = image_folder / "more"
    sub.mkdir()
    pil.fromarray(np.full((12, 12), 90, np.uint8)).save(sub / "c.png")
    (image_folder / "again").symlink_to("more")
    secret, closed = image_folder / "secret.png", image_folder / "closed"
    pil.fromarray(np.full((12, 12), 9, np.uint8)).save(secret)
    closed.mkdir()
    real_access, real_iterdir = os.access, type(closed).iterdir

    def access(path, mode, **kw):  # root reads everything: the refusal a user would get, by hand
        return False if str(path) == str(secret) else real_access(path, mode, **kw)

    def iterdir(self):
        if self == closed:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(type(closed), "iterdir", iterdir)
    builders.folder(tmp_path / "deep.h5", image_folder, (10, 10), recursive=True)
    err = capsys.readouterr().err
    for name, why in (("loop1.png", "symlink loop"), ("loop2.png", "symlink loop"),
                      ("gone.png", "broken link (to nowhere.png)"), ("secret.png", "permission denied"),
                      ("closed", "permission denied"), ("again", "link to a folder (not followed)")):
        assert f"cotsdl: warning: {image_folder / name}: {why}, skipped" in err
    assert (f"cotsdl: warning: 6 entries of {image_folder} could not be read and were skipped (broken link: 1, "
            "link to a folder: 1, permission denied: 2, symlink loop: 2)") in err
    recipe = read(tmp_path / "deep.h5")[2]
    assert recipe["files"] == ["a_gray.jpg", "b_wide.png", "more/c.png"]
    assert recipe["unreadable"][0] == "again: link to a folder (not followed)" and len(recipe["unreadable"]) == 6
    builders.folder(tmp_path / "flat.h5", image_folder, (10, 10))
    err = capsys.readouterr().err
    assert f"4 entries of {image_folder} could not be read" in err and "closed" not in err.split("subfolder")[0]
    monkeypatch.undo()
    for name in ("loop1.png", "loop2.png", "gone.png", "again"):
        (image_folder / name).unlink()
    builders.folder(tmp_path / "clean.h5", image_folder, (10, 10))
    assert "could not be read" not in capsys.readouterr().err and "unreadable" not in read(tmp_path / "clean.h5")[2]
