"""The HDF5 dataset format and its reader on one process: windows, order, preprocessing, bad files."""
import json
import re

import h5py
import numpy as np
import pytest

from cotsdl.array.box import Box
from cotsdl.io.dataset import DatasetError, DatasetWriter, check_for_network, inspect, write_dataset
from cotsdl.io.reader import HDF5Source
from testkit import corrupt_chunk


def images(kind, n=23, shape=(9, 7, 2), seed=0):
    rng = np.random.default_rng(seed)
    if kind == "uint8":
        return rng.integers(0, 256, (n,) + shape, dtype=np.uint8)
    return rng.standard_normal((n,) + shape).astype(kind)


def window(lo, hi):
    return Box(tuple(lo) + (0,), tuple(hi) + (1,))


def expected(src_images, idx, lo, hi, preprocess="none", floor=0.01):
    x = src_images.astype(np.float64)
    if x.ndim == 3:
        x = x[..., None]
    if src_images.dtype == np.uint8:
        x = x / 255.0
    mean = x.reshape(len(x), -1).mean(axis=1)
    std = x.reshape(len(x), -1).std(axis=1)
    if preprocess != "none":
        x = x - mean[:, None, None, None]
    if preprocess == "standardize":
        x = x / np.maximum(std, floor)[:, None, None, None]
    sel = x[idx][:, lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]]
    return sel.transpose(1, 2, 3, 0)


def test_writer_format_and_inspect(tmp_path):
    imgs = images("uint8")
    path = write_dataset(tmp_path / "a.h5", imgs, labels=np.arange(23) % 2, recipe={"builder": "test"})
    with h5py.File(path) as f:
        assert f["images"].chunks == (1, 9, 7, 2)  # one image per chunk
        assert f.attrs["cotsdl_format"] == 1
        np.testing.assert_allclose(f["image_mean"][()], (imgs / 255.0).reshape(23, -1).mean(axis=1))
    info = inspect(path)
    assert (info.count, info.image_shape, info.dtype, info.problems) == (23, (9, 7, 2), "uint8", [])
    assert info.labels == {"0": 12, "1": 11} and info.recipe == {"builder": "test"} and info.has_stats
    assert [p.name for p in tmp_path.iterdir()] == ["a.h5"]  # no temporary left


def test_writer_makes_missing_folders_and_removes_them_on_failure(tmp_path):
    write_dataset(tmp_path / "new" / "deep" / "a.h5", images("uint8", n=2))
    assert inspect(tmp_path / "new" / "deep" / "a.h5").count == 2
    with pytest.raises(DatasetError, match="image 0 has NaN"):
        write_dataset(tmp_path / "other" / "deeper" / "b.h5", np.full((2, 3, 3), np.nan, np.float32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]


def test_writer_leaves_nothing_on_failure(tmp_path):
    with pytest.raises(DatasetError, match="image 3 has NaN"):
        bad = images("float32")
        bad[3, 0, 0, 0] = np.nan
        write_dataset(tmp_path / "b.h5", bad)
    with pytest.raises(RuntimeError):
        with DatasetWriter(tmp_path / "c.h5", 4, (3, 3)) as w:
            w.add(np.zeros((2, 3, 3), np.uint8))
            raise RuntimeError("interrupted build")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["uint8", "float32", "float64"])
@pytest.mark.parametrize("layout", ["chunk-per-image", "gzip-rows", "lzf-contiguous-3d"])
def test_windows_equal_slices_of_the_whole_array(tmp_path, kind, layout):
    imgs = images(kind, shape=(9, 7, 2) if layout != "lzf-contiguous-3d" else (9, 7))
    path = tmp_path / "d.h5"
    if layout == "chunk-per-image":
        write_dataset(path, imgs)
    else:  # a user's own file: any chunking and compression, statistics added by hand
        with h5py.File(path, "w") as f:
            chunks = (5, 3) + imgs.shape[2:] if layout == "gzip-rows" else True
            f.create_dataset("images", data=imgs, chunks=chunks,
                             compression="gzip" if layout == "gzip-rows" else "lzf")
            x = imgs.reshape(len(imgs), -1).astype(np.float64) * (1 / 255.0 if kind == "uint8" else 1.0)
            f["image_mean"], f["image_std"] = x.mean(axis=1), x.std(axis=1)
    c = 1 if imgs.ndim == 3 else 2
    for pre in ("none", "center", "standardize"):
        src = HDF5Source(path, seed=4, preprocess=pre, prefetch=False)
        for lo, hi in [((0, 0, 0), (9, 7, c)), ((2, 3, 0), (8, 5, c)), ((4, 0, c - 1), (5, 7, c))]:
            got = src.read(5, 11, window(lo, hi))
            assert got.dtype == np.float32 and got.flags.c_contiguous
            np.testing.assert_allclose(got, expected(imgs, src.indices(5, 11), lo, hi, pre), rtol=2e-6, atol=2e-6)
        src.close()


def test_order_is_a_seeded_permutation_per_epoch(tmp_path):
    write_dataset(tmp_path / "e.h5", images("uint8", n=10))
    a, b = HDF5Source(tmp_path / "e.h5", seed=1), HDF5Source(tmp_path / "e.h5", seed=1)
    other = HDF5Source(tmp_path / "e.h5", seed=2)
    assert np.array_equal(a.indices(0, 30), b.indices(0, 30))
    assert not np.array_equal(a.indices(0, 10), other.indices(0, 10))
    for e in range(3):  # each epoch visits every image once, in a new order
        assert sorted(a.indices(10 * e, 10)) == list(range(10))
    assert not np.array_equal(a.indices(0, 10), a.indices(10, 10))
    # a minibatch across an epoch boundary may hold an image twice: the read still works
    idx = a.indices(5, 10)
    full = window((0, 0, 0), (9, 7, 2))
    want = expected(images("uint8", n=10), idx, (0, 0, 0), (9, 7, 2), "standardize")
    np.testing.assert_allclose(a.read(5, 10, full), want, rtol=2e-6, atol=2e-6)
    for s in (a, b, other):
        s.close()


def test_prefetch_gives_identical_batches(tmp_path):
    write_dataset(tmp_path / "f.h5", images("float32", n=31))
    w = window((1, 1, 0), (8, 6, 2))
    with HDF5Source(tmp_path / "f.h5", seed=3, prefetch=False) as plain, HDF5Source(tmp_path / "f.h5", seed=3) as pre:
        for step in range(12):
            first = step * 8
            pre.prefetch(first + 8 if step % 3 else first + 99, 8, w)  # every third guess is wrong
            assert np.array_equal(plain.read(first + 8, 8, w), pre.read(first + 8, 8, w))


def test_errors_in_the_prefetch_thread_surface_in_read(tmp_path):
    bad = images("float32", n=12)
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:  # NaN pixels written behind the writer's back
        bad[7, 4, 4, 1] = np.inf
        f["images"] = bad
    src = HDF5Source(path, preprocess="none", shuffle=False)
    w = window((0, 0, 0), (9, 7, 2))
    src.prefetch(4, 4, w)
    with pytest.raises(DatasetError, match=r"g\.h5: image 7 has NaN or Inf pixels"):
        src.read(4, 4, w)
    src.read(0, 4, w)  # the other images are fine
    src.close()


def write_raw(path, **datasets):
    with h5py.File(path, "w") as f:
        for k, v in datasets.items():
            f[k] = v


@pytest.mark.parametrize("content, message", [
    ({"pixels": np.zeros((3, 4, 4))}, "no 'images' dataset (it holds: pixels)"),
    ({"images": np.zeros((3, 4))}, "must be (N, H, W) or (N, H, W, C), got shape (3, 4)"),
    ({"images": np.zeros((3, 4, 4), np.complex64)}, "must be uint8, float32 or float64, got dtype complex64"),
    ({"images": np.array([[[b"ab"]]])}, "must be uint8, float32 or float64, got dtype |S2"),
    ({"images": np.zeros((0, 4, 4), np.float32)}, "'images' is empty"),
    ({"images": np.zeros((3, 4, 4), np.uint8), "labels": np.zeros(4, int)}, "'labels' must be (3,) integers"),
])
def test_inspect_names_what_is_wrong(tmp_path, content, message):
    write_raw(tmp_path / "bad.h5", **content)
    info = inspect(tmp_path / "bad.h5")
    assert any(message in p for p in info.problems), info.problems
    with pytest.raises(DatasetError, match="bad.h5"):
        HDF5Source(tmp_path / "bad.h5", preprocess="none")


def test_unreadable_files(tmp_path):
    with pytest.raises(DatasetError, match="nope.h5: no such file"):
        inspect(tmp_path / "nope.h5")
    write_dataset(tmp_path / "t.h5", images("uint8", n=50, shape=(16, 16, 3)))
    data = (tmp_path / "t.h5").read_bytes()
    (tmp_path / "t.h5").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(DatasetError, match=r"t\.h5: cannot read it as HDF5 \(truncated or corrupt\?\)"):
        inspect(tmp_path / "t.h5")
    (tmp_path / "j.h5").write_text("not hdf5")
    with pytest.raises(DatasetError, match="j.h5: cannot read it as HDF5"):
        HDF5Source(tmp_path / "j.h5")


def test_check_for_network(tmp_path):
    write_dataset(tmp_path / "h.h5", images("uint8", n=5))
    info = inspect(tmp_path / "h.h5")
    assert check_for_network(info, (9, 7, 2), 5) == []
    (msg,) = check_for_network(info, (8, 8, 2), 5)
    assert "images are 9x7x2, the network's input is 8x8x2" in msg and "--size" in msg
    (msg,) = check_for_network(info, (9, 7, 2), 6)
    assert msg == "5 image(s), fewer than one global batch of 6"
    write_raw(tmp_path / "nostats.h5", images=images("uint8", n=5))
    (msg,) = check_for_network(inspect(tmp_path / "nostats.h5"), (9, 7, 2), 1, needs_stats=True)
    assert "cotsdl prepare-data stats" in msg


def test_writer_refuses_a_folder_as_output(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(DatasetError, match="out is a folder: give a file name"):
        write_dataset(tmp_path / "out", images("uint8", n=2))
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and not any((tmp_path / "out").iterdir())


def test_corrupt_chunks_are_named(tmp_path):
    write_dataset(tmp_path / "c.h5", images("uint8", n=12), compression="gzip")
    corrupt_chunk(tmp_path / "c.h5", 5)
    src = HDF5Source(tmp_path / "c.h5", shuffle=False, prefetch=False)
    src.read(0, 4, window((0, 0, 0), (9, 7, 2)))  # other images read fine
    with pytest.raises(DatasetError, match=r"c\.h5: cannot read images 4\.\.7 \(truncated or corrupt\?\)"):
        src.read(4, 4, window((0, 0, 0), (9, 7, 2)))
    src.close()


KIND_NAMES = ["face", "lfw_nonface", "photo_crop"]


def labeled_set(path, n=12, **columns):
    kinds = np.arange(n) % 3
    args = dict(labels=(kinds == 0).astype(np.int64), groups=np.arange(n) // 2, kinds=kinds, kind_names=KIND_NAMES)
    return write_dataset(path, images("uint8", n=n), **{**args, **columns})


def test_groups_and_kinds_written_and_read_back(tmp_path):
    labeled_set(tmp_path / "k.h5")
    with h5py.File(tmp_path / "k.h5") as f:
        assert f["kinds"].dtype == np.int8 and f["groups"].dtype == np.int64
        assert json.loads(f["kinds"].attrs["kind_names"]) == KIND_NAMES
    info = inspect(tmp_path / "k.h5")
    assert info.problems == [] and info.groups == 6 and info.kinds == {"face": 4, "lfw_nonface": 4, "photo_crop": 4}
    assert "kinds: face: 4, lfw_nonface: 4, photo_crop: 4" in info.summary() and "groups: 6" in info.summary()
    with HDF5Source(tmp_path / "k.h5", shuffle=False) as src:
        assert src.groups().dtype == np.int64 and np.array_equal(src.groups(), np.arange(12) // 2)
        assert src.kinds().dtype == np.int64 and np.array_equal(src.kinds(), np.arange(12) % 3)
        assert src.kind_names == tuple(KIND_NAMES)


def test_groups_and_kinds_default_when_absent(tmp_path):
    write_dataset(tmp_path / "l.h5", images("uint8", n=5), labels=[1, 0, 0, 1, 0])
    with HDF5Source(tmp_path / "l.h5", shuffle=False) as src:
        assert np.array_equal(src.groups(), np.arange(5)) and src.groups().dtype == np.int64  # each its own group
        assert src.kind_names == ("face", "distractor") and np.array_equal(src.kinds(), [0, 1, 1, 0, 1])
    write_dataset(tmp_path / "u.h5", images("uint8", n=5))
    with HDF5Source(tmp_path / "u.h5", shuffle=False) as src:
        assert src.kinds() is None and src.kind_names is None and np.array_equal(src.groups(), np.arange(5))
    assert inspect(tmp_path / "u.h5").kinds is None and "  kinds:" not in inspect(tmp_path / "u.h5").summary()


@pytest.mark.parametrize("columns, message", [
    ({"kinds": np.full(12, 3)}, r"'kinds' must be codes 0\.\.2 of kind_names .*found 3"),
    ({"kinds": np.full(12, -1)}, r"'kinds' must be codes 0\.\.2 .*found -1"),
    ({"kind_names": ["face", "face", "x"]}, "'kind_names' must be distinct non-empty strings"),
    ({"kind_names": None}, "'kinds' and 'kind_names' go together, got only kinds"),
    ({"groups": np.arange(11)}, r"'groups' must be \(12,\), one per image, got shape \(11,\)"),
    ({"groups": np.linspace(0, 1, 12)}, r"'groups' of a batch of 12 images must be \(12,\) integers.*float64"),
])
def test_writer_rejects_bad_groups_and_kinds(tmp_path, columns, message):
    with pytest.raises(DatasetError, match=message) as e:
        labeled_set(tmp_path / "bad.h5", **columns)
    assert "bad.h5" in str(e.value) and list(tmp_path.iterdir()) == []


def rewrite(path, key, value, attrs=None):
    with h5py.File(path, "r+") as f:
        old = dict(f[key].attrs) if key in f else {}
        if key in f:
            del f[key]
        f[key] = value
        for k, v in (attrs if attrs is not None else old).items():
            f[key].attrs[k] = v


@pytest.mark.parametrize("key, value, attrs, message", [
    ("groups", np.arange(11), None, "'groups' must be (12,) integers, got (11,) int64"),
    ("groups", np.zeros(12, np.float32), None, "'groups' must be (12,) integers, got (12,) float32"),
    ("kinds", np.zeros((12, 1), np.int8), None, "'kinds' must be (12,) integers, got (12, 1) int8"),
    ("kinds", np.full(12, 5, np.int8), None, "'kinds' must be codes 0..2 of kind_names"),
    ("kinds", np.zeros(12, np.int8), {}, "'kind_names' must be a list of 1 to 127 names, got None"),
    ("kinds", np.zeros(12, np.int8), {"kind_names": "not json"}, "'kind_names' must be a list"),
    ("kinds", np.ones(12, np.int8), {"kind_names": json.dumps(KIND_NAMES)},
     "'kinds' and 'labels' disagree on 4 image(s)"),  # the 4 faces are no kind "face"
])
def test_inspect_and_reader_reject_bad_groups_and_kinds(tmp_path, key, value, attrs, message):
    path = labeled_set(tmp_path / "bad.h5")
    rewrite(path, key, value, attrs)
    assert any(message in p for p in inspect(path).problems), inspect(path).problems
    with pytest.raises(DatasetError, match=r"bad\.h5.*" + re.escape(message)):
        HDF5Source(path, preprocess="none")
