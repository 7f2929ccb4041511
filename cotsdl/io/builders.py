"""Deterministic builders of dataset files (format: :mod:`cotsdl.io.dataset`).

- :func:`natural`: unlabeled random crops of scikit-image's bundled photographs
  (:data:`TRAIN_PHOTOS`), optionally with some LFW faces mixed in, as they are or as
  augmented views (the stand-in for the paper's YouTube frames, some of which show faces);
- :func:`faces`: the labeled evaluation set: augmented views of held-out LFW faces
  (label 1, grouped by identity) against LFW non-faces, crops of
  :data:`HELD_OUT_PHOTOS`, phase-scrambled faces and crops matched to a face's mean and
  contrast (label 0, each kind recorded in ``kinds``);
- :func:`folder`: a folder of the user's own PNG/JPEG images;
- :func:`synthetic`: small generated images for tests (numpy only).

Each builder is a pure function of its arguments (and of the scikit-image version,
which is recorded): it writes its full recipe into the file. The 100 LFW faces are
split once by :func:`face_split` (in :mod:`cotsdl.io.photos`, with the other raw material), which both :func:`natural` and :func:`faces` call,
so that no face of the evaluation set can ever be mixed into training data; the 100 LFW
non-faces are split the same way by :func:`nonface_split` (the matched no-face control's
views against the evaluation's ``lfw_nonface`` distractors).

scikit-image and Pillow are imported only inside the builders that need them
(``pip install 'cotsdl[data]'``); this module imports with numpy and h5py alone.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Iterable, Sequence

import h5py
import numpy as np

from .. import stops
from ..progress import Progress
from .atomic import DiskError, ensure_free
from .augment import MATCH_MIN_STD, Augmentation, cycle as _cycle, matched_crops as _matched_crops
from .augment import phase_scrambled_views as _phase_scrambled, to_uint8 as _to_uint8, views as _views
from .dataset import DatasetError, DatasetWriter, image_stats, inspect, write_dataset
from .photos import (FACE_PHOTOS, HELD_OUT_PHOTOS, LFW_FACES, TRAIN_PHOTOS, _as_float, _check, _check_common,  # noqa: F401
                     _crops, _fit, _lfw_float, _need, _photo, _recipe, _to_channels, face_split, lfw_images,
                     nonface_split)

#: The ``kinds`` of :func:`faces` (index = code); only "face" has label 1.
KIND_NAMES = ("face", "lfw_nonface", "photo_crop", "phase_scrambled", "matched_crop")
#: Views per held-out identity in :func:`faces`: 8 x 50 held-out faces = 400 test faces.
DEFAULT_VIEWS = 8
DEFAULT_SCALE = (0.5, 1.0)
BATCH = 256
def _progress(total: int, what: str) -> Progress:
    """Progress of a build on stderr (a bar on a terminal, else a line every 10 s)."""
    return Progress(total, what, "images")


def _stream(w: DatasetWriter, images: Iterable[np.ndarray], progress: Progress) -> None:
    """Add images one by one to the writer in batches (constant memory)."""
    batch: list[np.ndarray] = []
    for img in images:
        batch.append(img)
        if len(batch) == BATCH:
            w.add(np.stack(batch))
            batch.clear()
        progress.update(w.n + len(batch))
    if batch:
        w.add(np.stack(batch))


# ---------------------------------------------------------------- builders

def natural(path: str | os.PathLike, count: int, size: Sequence[int], channels: int = 1, seed: int = 0,
            scale: Sequence[float] = DEFAULT_SCALE, flip: bool = True, mix_faces: int = 0, face_split_seed: int = 0,
            mixable: int = 50, mode: str = "crop", compression: str | None = None, no_faces: bool = False,
            face_fraction: float = 0.0, augmentation: Augmentation | None = None,
            nonface_fraction: float = 0.0) -> Path:
    """Unlabeled random crops of :data:`TRAIN_PHOTOS`, uint8.

    Parameters
    ----------
    path : str or Path
        The file to write.
    count : int
        Number of images.
    size : (H, W)
    channels : 1 or 3
    seed : int
        Seed of the crops (photo, scale, position, flip).
    scale : (lo, hi)
        A crop's side is a uniform random fraction in [lo, hi] of the largest box of
        aspect H:W that fits in the photo (for square sizes: of its shorter side).
    flip : bool
        Flip half of the crops horizontally.
    mix_faces : int
        Put this many LFW faces of the *mixable* part of :func:`face_split` at seeded
        random positions (unflipped; faces repeat if more than ``mixable``). The
        other images are the same as with ``mix_faces=0``.
    face_split_seed, mixable : int
        The face split (give :func:`faces` the same values).
    mode : "crop" or "resize"
        How the square LFW faces are fit to a non-square ``size``.
    compression : None, "gzip" or "lzf"
    no_faces : bool
        Leave out every face: the photographs of :data:`FACE_PHOTOS` (and no faces
        mixed in) -- the training set of the evaluation's no-face control.
    face_fraction : float
        0 <= F < 1: exactly ``round(F * count)`` images (Python's rounding), at seeded
        random positions, are augmented views (:func:`~cotsdl.io.augment.augment`) of
        the mixable faces, each a fresh view; the other images are the same crops as
        with F = 0. Excludes ``mix_faces`` and ``no_faces``.
    augmentation : Augmentation, optional
        The ranges of the views (default: ``Augmentation()``).
    nonface_fraction : float
        With ``no_faces``: the matched no-face control's training set. 0 <= F < 1: the
        ``round(F * count)`` images that ``face_fraction=F`` (same seed) would make face views
        are views of the mixable LFW *non-faces* of :func:`nonface_split` instead, at the same
        positions, with the same augmentation and the same draws (the k-th view of the k-th
        source), fit to ``size`` as the faces are; the evaluation's ``lfw_nonface`` images are
        the held-out rest. Excludes ``face_fraction`` and ``mix_faces``.
    """
    size = _check_common(count, size, channels, mode)
    _check(not (no_faces and mix_faces), f"no_faces excludes mix_faces, got mix_faces={mix_faces}")
    scale = tuple(float(v) for v in scale)
    _check(len(scale) == 2 and 0 < scale[0] <= scale[1] <= 1, f"scale must be 0 < lo <= hi <= 1, got {scale}")
    _check(int(mix_faces) == mix_faces and 0 <= mix_faces <= count,
           f"mix_faces must be an integer from 0 to count ({count}), got {mix_faces}")
    n_views = _check_face_fraction(face_fraction, count, mix_faces, no_faces)
    n_nonface = _check_nonface_fraction(nonface_fraction, count, face_fraction, mix_faces, no_faces)
    mix_idx, held_idx = face_split(face_split_seed, mixable)
    what = "mix_faces" if mix_faces else "face_fraction" if n_views else "nonface_fraction"
    _check((mix_faces == 0 and n_views == 0 and n_nonface == 0) or len(mix_idx) > 0,
           f"{what} > 0 needs mixable >= 1, got mixable={mixable}")
    aug = Augmentation() if augmentation is None else augmentation
    nonface_mix, nonface_held = nonface_split(face_split_seed, mixable)
    sources = nonface_mix if n_nonface else mix_idx  # the same number: the same positions and draws
    face_at = _face_positions(seed, int(count), int(mix_faces) or n_views or n_nonface, len(sources))
    names = [n for n in TRAIN_PHOTOS if not (no_faces and n in FACE_PHOTOS)]
    photos = [_photo(name, channels) for name in names]
    params = {"count": int(count), "size": list(size), "channels": channels, "scale": list(scale), "flip": bool(flip),
              "mix_faces": int(mix_faces), "face_split_seed": int(face_split_seed), "mixable": int(mixable),
              "mode": mode, "no_faces": bool(no_faces), "face_fraction": float(face_fraction),
              "augmentation": aug.as_dict() if n_views or n_nonface else None}
    extra = {}
    if n_nonface:  # (only then: other recipes are as they were)
        params["nonface_fraction"] = float(nonface_fraction)
        extra = {"nonface_views": n_nonface,
                 "nonface_split": {"mixable": nonface_mix.tolist(), "held_out": nonface_held.tolist()}}
    recipe = _recipe("natural", seed, params, sources=names, face_views=n_views,
                     face_split={"mixable": mix_idx.tolist(), "held_out": held_idx.tolist()}
                     if face_at and not n_nonface else None, **extra)
    crops = _crops(np.random.default_rng(seed), photos, int(count), size, scale, flip, skip=face_at)
    if mix_faces:
        face_imgs = lfw_images(mix_idx, size, channels, mode)
        images = (face_imgs[face_at[i]] if img is None else img for i, img in enumerate(crops))
    else:  # views are made as the stream reaches them: constant memory for any fraction
        fitted = _lfw_float(sources, size, channels, mode) if face_at else None
        vrng = np.random.default_rng([seed, 2])
        images = (_views(fitted, [face_at[i]], vrng, aug)[0] if img is None else img for i, img in enumerate(crops))
    with DatasetWriter(path, int(count), size + (channels,), np.uint8, recipe, compression=compression) as w, \
            _progress(int(count), f"natural {path}") as shown:
        _stream(w, images, shown)
    return Path(path)


def _check_face_fraction(face_fraction: float, count: int, mix_faces: int, no_faces: bool) -> int:
    """The number of face views ``face_fraction`` asks for (0 <= F < 1; not with mix_faces or no_faces)."""
    f = float(face_fraction)
    _check(0.0 <= f < 1.0, f"face_fraction must be from 0 to less than 1, got {face_fraction}")
    _check(not (f and mix_faces), f"face_fraction excludes mix_faces (one way of adding faces), got "
                                  f"face_fraction={face_fraction} and mix_faces={mix_faces}")
    _check(not (f and no_faces), f"no_faces excludes face_fraction, got face_fraction={face_fraction}")
    return int(round(f * int(count)))


def _check_nonface_fraction(nonface_fraction: float, count: int, face_fraction: float, mix_faces: int,
                            no_faces: bool) -> int:
    """The number of non-face views ``nonface_fraction`` asks for (0 <= F < 1; only with no_faces)."""
    f = float(nonface_fraction)
    _check(0.0 <= f < 1.0, f"nonface_fraction must be from 0 to less than 1, got {nonface_fraction}")
    _check(not f or no_faces, f"nonface_fraction needs no_faces (the matched control has no face anywhere), got "
                              f"nonface_fraction={nonface_fraction} without no_faces")
    _check(not (f and (face_fraction or mix_faces)), f"nonface_fraction excludes face_fraction and mix_faces, got "
                                                     f"face_fraction={face_fraction} and mix_faces={mix_faces}")
    return int(round(f * int(count)))


def _face_positions(seed: int, count: int, k: int, n_faces: int) -> dict[int, int]:
    """{position: index of a mixable face} for k faces among count images, from a stream of
    its own (seed, 1), so the crops stay the same; faces repeat only past n_faces."""
    if k == 0:
        return {}
    frng = np.random.default_rng([seed, 1])
    positions = frng.choice(count, k, replace=False)
    return {int(p): int(w) for p, w in zip(positions, _cycle(frng, n_faces, k))}


def faces(path: str | os.PathLike, size: Sequence[int], channels: int = 1, seed: int = 0, face_split_seed: int = 0,
          mixable: int = 50, views: int = DEFAULT_VIEWS, lfw_nonfaces: int | None = None, photo_crops: int = 100,
          phase_scrambled: int = 100, matched_crops: int = 100, augmentation: Augmentation | None = None,
          mode: str = "crop", compression: str | None = None) -> Path:
    """The labeled evaluation set, uint8: labels 1 = face, 0 = distractor, with ``groups`` and ``kinds``.

    Faces (kind "face"): ``views`` augmented views of each held-out face of
    :func:`face_split` (never a mixable one, which training may see). lfw_subset() has
    no identity labels: each of its faces counts as one identity (a person shown twice
    would be two), and its group is its LFW index 0..99. Distractors, by kind:
    "lfw_nonface": ``lfw_nonfaces`` of the held-out LFW non-faces of :func:`nonface_split` (never
    one that a matched no-face control trains on; group: LFW index);
    "photo_crop": random crops of :data:`HELD_OUT_PHOTOS`; "phase_scrambled": views of
    held-out faces with random phases (:func:`~cotsdl.io.augment.phase_scramble`), in
    their identity's group; "matched_crop": other crops of the held-out photographs
    given, by an affine change of their pixels, the mean and standard deviation of a
    randomly chosen face view of the set. Crops get groups of their own (200, 201...).
    Each part has its own random stream (changing one count leaves the other parts as
    they were); the order is shuffled by ``seed``.

    Parameters
    ----------
    views : int
        Views per held-out identity (default 8: 400 faces with the default split).
    lfw_nonfaces, photo_crops, phase_scrambled, matched_crops : int
        How many distractors of each kind (LFW non-faces: a seeded choice of the 100 - ``mixable``
        held-out ones; None, the default: all of them).
    augmentation : Augmentation, optional
        The ranges of the views (default: ``Augmentation()``).
    """
    size = _check_common(None, size, channels, mode)
    counts = {"photo_crops": photo_crops, "phase_scrambled": phase_scrambled, "matched_crops": matched_crops}
    for name, v in counts.items():
        _check(int(v) == v and v >= 0, f"{name} must be a non-negative integer, got {v}")
    _check(int(views) == views and views >= 1, f"views must be a positive integer, got {views}")
    mix_idx, held_idx = face_split(face_split_seed, mixable)
    nonface_mix, nonface_held = nonface_split(face_split_seed, mixable)
    lfw_nonfaces = len(nonface_held) if lfw_nonfaces is None else lfw_nonfaces
    _check(int(lfw_nonfaces) == lfw_nonfaces and 0 <= lfw_nonfaces <= len(nonface_held),
           f"lfw_nonfaces must be an integer from 0 to {len(nonface_held)} (the LFW non-faces held out from "
           f"training with mixable={mixable}), got {lfw_nonfaces}")
    aug = Augmentation() if augmentation is None else augmentation
    fitted = _lfw_float(held_idx, size, channels, mode)
    rngs = [np.random.default_rng([seed, k]) for k in range(7)]  # one stream per part
    which = np.repeat(np.arange(len(held_idx)), int(views))
    face_imgs = _views(fitted, which, rngs[0], aug)
    nonface_idx = np.sort(rngs[1].choice(nonface_held, int(lfw_nonfaces), replace=False))
    photos = [_photo(name, channels) for name in HELD_OUT_PHOTOS]
    crops = list(_crops(rngs[2], photos, int(photo_crops), size, DEFAULT_SCALE, True))
    scrambled, scrambled_src = _phase_scrambled(fitted, int(phase_scrambled), rngs[3], aug)
    matched = _matched_crops(face_imgs, _crops(rngs[5], photos, None, size, DEFAULT_SCALE, True, as_float=True),
                             int(matched_crops), rngs[4])
    parts = [(face_imgs, held_idx[which]), (lfw_images(nonface_idx, size, channels, mode), nonface_idx),
             (np.stack(crops) if crops else face_imgs[:0], None), (scrambled, held_idx[scrambled_src]), (matched, None)]
    images, groups, kinds = _assemble(parts)
    labels = (kinds == KIND_NAMES.index("face")).astype(np.int64)
    order = rngs[6].permutation(len(images))
    params = {"size": list(size), "channels": channels, "face_split_seed": int(face_split_seed),
              "mixable": int(mixable), "views": int(views), "lfw_nonfaces": int(lfw_nonfaces),
              **{k: int(v) for k, v in counts.items()}, "distractor_scale": list(DEFAULT_SCALE), "mode": mode,
              "augmentation": aug.as_dict(), "match_min_std": MATCH_MIN_STD}
    recipe = _recipe("faces", seed, params, sources=["lfw_subset"] + list(HELD_OUT_PHOTOS),
                     face_split={"mixable": mix_idx.tolist(), "held_out": held_idx.tolist()},
                     nonface_split={"mixable": nonface_mix.tolist(), "held_out": nonface_held.tolist()},
                     lfw_nonfaces=nonface_idx.tolist(), kind_names=list(KIND_NAMES),
                     kind_counts={n: len(p[0]) for n, p in zip(KIND_NAMES, parts)})
    return write_dataset(path, images[order], labels[order], recipe, compression, groups=groups[order],
                         kinds=kinds[order], kind_names=KIND_NAMES)


def lfw_overlap(training_recipe: dict, evaluation: str | os.PathLike) -> list[int]:
    """The LFW non-faces (``lfw_subset()`` indices) that a training set made views of (a matched
    control's, ``natural(nonface_fraction=...)``) and that the labeled set ``evaluation`` shows as
    ``lfw_nonface`` distractors (their group is the LFW index): empty, or the control has seen
    evaluation images."""
    split = training_recipe.get("nonface_split") if isinstance(training_recipe, dict) else None
    used = set((split or {}).get("mixable", [])) if training_recipe.get("nonface_views") else set()
    if not used:
        return []
    with h5py.File(evaluation, "r") as f:
        if "kinds" not in f or "groups" not in f or "kind_names" not in f["kinds"].attrs:
            return []
        names = json.loads(f["kinds"].attrs["kind_names"])
        if "lfw_nonface" not in names:
            return []
        shown = f["groups"][:][f["kinds"][:] == names.index("lfw_nonface")]
    return sorted(used & {int(v) for v in shown})


def _assemble(parts: Sequence[tuple[np.ndarray, np.ndarray | None]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images, groups and kind codes of the parts (in :data:`KIND_NAMES` order); a part
    without groups gives each image a new group, numbered from 2 * LFW_FACES (past every LFW index)."""
    next_group, groups = 2 * LFW_FACES, []
    for imgs, g in parts:
        if g is None:
            g, next_group = np.arange(next_group, next_group + len(imgs)), next_group + len(imgs)
        groups.append(np.asarray(g, np.int64))
    kinds = np.concatenate([np.full(len(p[0]), code, np.int8) for code, p in enumerate(parts)])
    return np.concatenate([p[0] for p in parts]), np.concatenate(groups), kinds


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")


def _read_image(file: Path, channels: int, Image, ImageOps) -> tuple[np.ndarray, bool]:
    """Decode one file to float64 (h, w, channels) in [0, 1]; and whether it was in colour (channels
    that differ somewhere: a grey image stored as RGB is not)."""
    try:
        with Image.open(file) as im:
            im = ImageOps.exif_transpose(im)  # camera photos: stored sideways, shown upright
            if im.mode.startswith("I;16") or im.mode in ("I", "F"):
                arr = np.asarray(im, np.float64) / (1.0 if im.mode == "F" else 65535.0)
            else:
                arr = np.asarray(im.convert("RGB"))
    except Exception as e:  # Pillow raises many kinds (OSError, SyntaxError, ValueError...)
        raise DatasetError(f"{file}: cannot decode the image ({type(e).__name__}: {e})") from None
    colour = arr.ndim == 3 and bool((arr[..., 1:] != arr[..., :1]).any())
    return _to_channels(_as_float(arr), channels), colour


def _unreadable_reason(e: OSError, f: Path) -> str:
    if e.errno == errno.ELOOP:
        return "symlink loop"
    if e.errno == errno.ENOENT and f.is_symlink():
        return f"broken link (to {os.readlink(f)})"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return e.strerror or str(e)


def _listing(src: Path, recursive: bool) -> tuple[list[Path], list[Path], list[Path], list[tuple[Path, str]]]:
    """(images, other files, subfolders not read, entries that cannot be read and why) of ``src``,
    sorted by path.  Links are followed to files, not to folders."""
    files, skipped, folders, unreadable = [], [], [], []
    todo = [src]
    while todo:
        d = todo.pop()
        try:
            entries = list(d.iterdir())
        except OSError as e:
            if d == src:
                raise
            unreadable.append((d, _unreadable_reason(e, d)))
            continue
        for f in entries:
            try:
                mode = f.stat().st_mode  # through a link: what it points to
            except OSError as e:
                unreadable.append((f, _unreadable_reason(e, f)))
                continue
            if stat.S_ISDIR(mode):
                if not recursive:
                    folders.append(f)
                elif f.is_symlink():
                    unreadable.append((f, "link to a folder (not followed)"))
                else:
                    todo.append(f)
            elif not stat.S_ISREG(mode):
                unreadable.append((f, "not a regular file"))
            elif f.suffix.lower() not in IMAGE_SUFFIXES:
                skipped.append(f)
            elif not os.access(f, os.R_OK):
                unreadable.append((f, "permission denied"))
            else:
                files.append(f)
    return sorted(files), sorted(skipped), sorted(folders), sorted(unreadable)


def _say_unreadable(src: Path, unreadable: list[tuple[Path, str]], shown: int = 20) -> None:
    """Every entry that could not be read, by name and reason (the first ``shown``), and their count."""
    for f, why in unreadable[:shown]:
        print(f"cotsdl: warning: {f}: {why}, skipped", file=sys.stderr)
    if len(unreadable) > shown:
        print(f"cotsdl: warning: … and {len(unreadable) - shown} more", file=sys.stderr)
    reasons: dict[str, int] = {}
    for _, why in unreadable:
        key = why.split(" (")[0]
        reasons[key] = reasons.get(key, 0) + 1
    print(f"cotsdl: warning: {len(unreadable)} entr{'y' if len(unreadable) == 1 else 'ies'} of {src} could not be "
          f"read and {'was' if len(unreadable) == 1 else 'were'} skipped ("
          + ", ".join(f"{why}: {n}" for why, n in sorted(reasons.items())) + ")", file=sys.stderr)


def folder(path: str | os.PathLike, src_folder: str | os.PathLike, size: Sequence[int], channels: int = 1,
           mode: str = "crop", compression: str | None = None, recursive: bool = False) -> Path:
    """The images of a folder (PNG, JPEG, BMP, TIFF, WebP; sorted by path), uint8.

    Parameters
    ----------
    channels : 1 or 3
        1: colour images are converted to grey (said on stderr, with their count); 3: RGB.
    mode : "crop" or "resize"
        "crop": center-crop each image to the aspect ratio of ``size``, then resize;
        "resize": resize (the aspect ratio changes).
    recursive : bool
        Read the subfolders too (else they are skipped, and said so).

    Other files are skipped with a warning, and so are entries that cannot be read (symlink loops,
    broken links, permission denied; each named, with their count); a file that cannot be decoded
    is an error.
    """
    size = _check_common(None, size, channels, mode)
    src = Path(src_folder)
    if not src.is_dir():
        raise DatasetError(f"{src}: no such folder" if not src.exists() else f"{src}: not a folder")
    files, skipped, folders, unreadable = _listing(src, recursive)
    if unreadable:
        _say_unreadable(src, unreadable)
    for f in skipped:
        print(f"cotsdl: warning: {f}: not an image ({', '.join(IMAGE_SUFFIXES)}), skipped", file=sys.stderr)
    if folders:
        shown = ", ".join(f.name for f in folders[:5]) + (", …" if len(folders) > 5 else "")
        print(f"cotsdl: note: {len(folders)} subfolder(s) of {src} not read ({shown}); --recursive reads them",
              file=sys.stderr)
    if not files:
        raise DatasetError(f"{src}: no images found ({', '.join(IMAGE_SUFFIXES)})"
                           + ("; its subfolders are read with --recursive" if folders else "")
                           + (f"; {len(unreadable)} entries could not be read (above)" if unreadable else ""))
    pil = _need("PIL.Image", "Pillow", "the folder builder")
    ops = _need("PIL.ImageOps", "Pillow", "the folder builder")
    names = [str(f.relative_to(src)) for f in files]
    params = {"src_folder": str(src.resolve()), "size": list(size), "channels": channels, "mode": mode,
              "recursive": bool(recursive)}
    listing = {"files_count": len(names), "files_sha256": hashlib.sha256("\n".join(names).encode()).hexdigest(),
               "skipped": [str(f.relative_to(src)) for f in skipped][:100]}
    if unreadable:  # (only then: the recipe of a folder read whole is as it was)
        listing["unreadable"] = [f"{f.relative_to(src)}: {why}" for f, why in unreadable][:100]
    if len(names) <= 10000:  # keep the attribute small for huge folders: the digest identifies them
        listing["files"] = names
    recipe = _recipe("folder", None, params, **listing)
    colour = [0]

    def images():
        for f in files:
            img, was_colour = _read_image(f, channels, pil, ops)
            colour[0] += was_colour
            yield _to_uint8(_fit(img, size, mode))

    with DatasetWriter(path, len(files), size + (channels,), np.uint8, recipe, compression=compression) as w, \
            _progress(len(files), f"folder {src}") as shown:
        _stream(w, images(), shown)
    if channels == 1 and colour[0]:
        print(f"cotsdl: note: {colour[0]} of {len(files)} images were in colour and were converted to grey "
              "(--channels 3 keeps the colour)", file=sys.stderr)
    return Path(path)


def _synthetic_image(rng: np.random.Generator, yy: np.ndarray, xx: np.ndarray, channels: int) -> tuple[np.ndarray, int]:
    """One image (float64 in [0, 1], (H, W, C)): smooth blobs, with probability 1/2 an
    oriented grating under a Gaussian window (label 1), plus noise."""
    has_grating = int(rng.random() < 0.5)
    blobs = rng.uniform([0, 0, 0.08, -1], [1, 1, 0.3, 1], size=(3, 4))  # y, x, sigma, amplitude
    angle, phase, cycles, cy, cx, sigma = rng.uniform([0, 0, 2, 0.25, 0.25, 0.15],
                                                      [np.pi, 2 * np.pi, 6, 0.75, 0.75, 0.35])
    color = rng.uniform(0.5, 1.0, size=(4, channels))  # per component: its weight in each channel
    noise = rng.standard_normal(yy.shape + (channels,))
    parts = [b[3] * np.exp(-((yy - b[0]) ** 2 + (xx - b[1]) ** 2) / (2 * b[2] ** 2)) for b in blobs]
    window = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * sigma ** 2))
    wave = np.cos(2 * np.pi * cycles * (np.cos(angle) * xx + np.sin(angle) * yy) + phase)
    parts.append(has_grating * window * wave)
    img = sum(p[..., None] * c for p, c in zip(parts, color))
    return np.clip(0.5 + 0.3 * img + 0.03 * noise, 0.0, 1.0), has_grating


def synthetic(path: str | os.PathLike, count: int, size: Sequence[int], channels: int = 1, seed: int = 0,
              dtype: str = "float32", labels: bool = False, compression: str | None = None) -> Path:
    """Small generated images for tests (numpy only, fast): smooth blobs, and in half of
    them an oriented grating (label 1 when ``labels``), plus a little noise.

    Parameters
    ----------
    dtype : "float32" (values in [0, 1]) or "uint8"
    labels : bool
        Store labels (1 = has a grating). The images are the same either way.
    """
    size = _check_common(count, size, channels)
    _check(dtype in ("float32", "uint8"), f"dtype must be 'float32' or 'uint8', got {dtype!r}")
    yy, xx = np.meshgrid((np.arange(size[0]) + 0.5) / size[0], (np.arange(size[1]) + 0.5) / size[1], indexing="ij")
    rng = np.random.default_rng(seed)
    params = {"count": int(count), "size": list(size), "channels": channels, "dtype": dtype, "labels": bool(labels)}
    recipe = _recipe("synthetic", seed, params, skimage=False)
    with DatasetWriter(path, int(count), size + (channels,), dtype, recipe, bool(labels), compression) as w, \
            _progress(int(count), f"synthetic {path}") as shown:
        for start in range(0, int(count), BATCH):
            made = [_synthetic_image(rng, yy, xx, channels) for _ in range(min(BATCH, int(count) - start))]
            imgs = np.stack([m[0] for m in made])
            imgs = _to_uint8(imgs) if dtype == "uint8" else imgs.astype(np.float32)
            w.add(imgs, [m[1] for m in made] if labels else None)
            shown.update(w.n)
    return Path(path)


def resize(path: str | os.PathLike, src_path: str | os.PathLike, size: Sequence[int], channels: int | None = None,
           mode: str = "crop", compression: str | None = None) -> Path:
    """Another dataset file at another image size (labels, groups and kinds kept): for a
    network whose input differs from the file's images.

    uint8 files stay uint8; float files become float32 (values are not clipped).
    ``channels`` None keeps them; 1 or 3 converts (gray by rgb2gray, RGB by replication).
    """
    size = _check_common(None, size, 1 if channels is None else channels, mode)
    info = inspect(src_path)
    if info.problems or not info.count:
        raise DatasetError(f"{src_path}: {'; '.join(info.problems) or 'no images'}")
    channels = info.image_shape[2] if channels is None else channels
    dtype = np.uint8 if info.dtype == "uint8" else np.float32
    params = {"src": str(Path(src_path).resolve()), "size": list(size), "channels": channels, "mode": mode}
    recipe = _recipe("resize", None, params, source_recipe=info.recipe)

    def convert(img: np.ndarray) -> np.ndarray:
        x = img / 255.0 if img.dtype == np.uint8 else img.astype(np.float64)
        x = _fit(_to_channels(x, channels), size, mode)
        return _to_uint8(x) if dtype == np.uint8 else x.astype(np.float32)

    keep = [k for k, v in (("labels", info.labels), ("groups", info.groups), ("kinds", info.kinds)) if v is not None]
    with h5py.File(src_path, "r") as f, DatasetWriter(path, info.count, size + (channels,), dtype, recipe,
                                                      "labels" in keep, compression, "groups" in keep,
                                                      info.kind_names) as w, \
            _progress(info.count, f"resize {src_path}") as shown:
        for i in range(0, info.count, BATCH):
            batch = np.stack([convert(img) for img in f["images"][i:i + BATCH]])
            w.add(batch, **{k: f[k][i:i + BATCH] for k in keep})
            shown.update(w.n)
    return Path(path)


def add_stats(path: str | os.PathLike, chunk: int = 256, force: bool = False) -> bool:
    """Add ``image_mean``/``image_std`` to a file that lacks them (or recompute with ``force``).

    Everything is computed (reading ``chunk`` images at a time) before anything is
    written; then a copy of the file beside it gets the statistics and replaces the
    file by a rename.  The file is never modified in place: a full disk, a signal or
    a crash leaves it as it was (free space for the copy is checked first).  Returns
    whether the file was changed.
    """
    path = Path(path)
    info = inspect(path)
    problems = [p for p in info.problems if "image_mean" not in p]
    if problems or not info.count:
        raise DatasetError(f"{path}: {'; '.join(problems) or 'no images'}")
    if info.has_stats and not force:
        return False
    mean, std = np.zeros(info.count), np.zeros(info.count)
    with h5py.File(path, "r") as f, _progress(info.count, f"stats {path}") as shown:
        images = f["images"]
        for i in range(0, info.count, chunk):
            mean[i:i + chunk], std[i:i + chunk] = image_stats(images[i:i + chunk])
            shown.update(min(i + chunk, info.count))
    # a copy of the file gets the statistics: room for all of it beside the file
    ensure_free(path.parent, path.stat().st_size + 2 * mean.nbytes + (1 << 20), f"{path} (adding the statistics)",
                after="the file is unchanged")
    tmp = path.with_name(f".{path.name}.stats-{os.getpid()}.tmp")
    try:
        shutil.copy2(path, tmp)
        with h5py.File(tmp, "r+") as f:
            for name, values in (("image_mean", mean), ("image_std", std)):
                if name in f:
                    del f[name]
                f.create_dataset(name, data=values)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        stops.checkpoint()  # a swallowed stop signal still leaves the file unchanged
        os.replace(tmp, path)
    except OSError as e:
        raise DiskError(f"{path}: cannot add the statistics ({e.strerror or e}); the file is unchanged") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return True
