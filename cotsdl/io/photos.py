"""The raw material of the dataset builders: scikit-image's bundled photographs, the LFW
faces and their one split, crops, resizing and channel handling, and the builders'
argument checks.  scikit-image and Pillow are imported only when a function needs them.
"""
from __future__ import annotations

import functools
import importlib
import itertools
from typing import Any, Iterable, Sequence

import numpy as np

from .. import __version__
from .augment import to_uint8 as _to_uint8
from .dataset import DatasetError

#: Photographs that :func:`natural` crops (all bundled with scikit-image, no download).
TRAIN_PHOTOS = ("astronaut", "camera", "coffee", "chelsea", "rocket", "grass", "gravel", "brick", "moon", "coins",
                "clock", "immunohistochemistry", "retina", "colorwheel")
#: Training photographs that show a face (the astronaut's, the cameraman's): left out by ``no_faces``.
FACE_PHOTOS = ("astronaut", "camera")
#: Photographs only :func:`faces` uses (distractors); never in training data. Not
#: ``cat``: scikit-image's ``cat()`` is the same picture as ``chelsea()``.
HELD_OUT_PHOTOS = ("hubble_deep_field", "text", "page", "microaneurysms", "cell", "stereo_motorcycle")
LFW_FACES = 100  # lfw_subset(): images 0..99 are faces, 100..199 non-faces
MODES = ("crop", "resize")


def _need(module: str, package: str, who: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DatasetError(f"{who} needs {package}: pip install 'cotsdl[data]'") from None


def _skimage(module: str, who: str):
    return _need(module, "scikit-image", who)


# ---------------------------------------------------------------- argument checks

def _check_size(size: Sequence[int]) -> tuple[int, int]:
    if len(size) != 2 or not all(int(v) == v and v >= 1 for v in size):
        raise ValueError(f"size must be two positive integers (H, W), got {tuple(size)}")
    return int(size[0]), int(size[1])


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _check_common(count: int | None, size, channels: int, mode: str | None = None) -> tuple[int, int]:
    if count is not None:
        _check(int(count) == count and count >= 1, f"count must be a positive integer, got {count}")
    _check(channels in (1, 3), f"channels must be 1 (grayscale) or 3 (RGB), got {channels}")
    if mode is not None:
        _check(mode in MODES, f"mode must be 'crop' or 'resize', got {mode!r}")
    return _check_size(size)


def _recipe(builder: str, seed: int | None, params: dict[str, Any], skimage: bool = True,
            **extra: Any) -> dict[str, Any]:
    out = {"builder": builder, "cotsdl_version": __version__, "seed": None if seed is None else int(seed),
           "params": params, **extra}
    if skimage:  # resizing may change between versions: say which one made the file
        out["scikit_image_version"] = _skimage("skimage", builder).__version__
    return out


# ---------------------------------------------------------------- shared pixel helpers

def _as_float(img: np.ndarray) -> np.ndarray:
    """Pixels as float64 in [0, 1]."""
    img = np.asarray(img)
    if img.dtype == np.uint8:
        return img / 255.0
    if img.dtype == np.uint16:
        return img / 65535.0
    return np.clip(img.astype(np.float64), 0.0, 1.0)


def _to_channels(img: np.ndarray, channels: int) -> np.ndarray:
    """(h, w[, 3|4]) float -> (h, w, channels): gray by rgb2gray, RGB from gray by replication."""
    if img.ndim == 3 and img.shape[2] in (2, 4):  # drop alpha
        img = img[..., :-1]
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[..., 0]
    if channels == 1:
        if img.ndim == 3:
            img = _skimage("skimage.color", "converting to grayscale").rgb2gray(img)
        return img[..., None]
    return np.repeat(img[..., None], 3, axis=2) if img.ndim == 2 else img


def _center_box(h: int, w: int, size: tuple[int, int]) -> tuple[int, int]:
    """The largest (height, width) of aspect ratio ``size`` that fits in h x w."""
    bh = min(h, w * size[0] / size[1])
    return max(1, round(bh)), max(1, round(bh * size[1] / size[0]))


def _resize(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(h, w, C) float -> (H, W, C), anti-aliased."""
    transform = _skimage("skimage.transform", "resizing images")
    h, w = img.shape[:2]
    # A big reduction (a 1000-pixel crop to 32) makes the anti-aliasing Gaussian wide
    # and slow: average k x k blocks first (itself an anti-aliasing filter) and leave
    # at least a factor 2 to resize(). The < k trimmed pixels do not matter.
    k = min(h // size[0], w // size[1]) // 2
    if k >= 2:
        h, w = h - h % k, w - w % k
        img = img[:h, :w].reshape(h // k, k, w // k, k, -1).mean(axis=(1, 3))
    return transform.resize(img, size + img.shape[2:], order=1, anti_aliasing=True, mode="reflect")


def _fit(img: np.ndarray, size: tuple[int, int], mode: str) -> np.ndarray:
    """Resize to ``size``; with mode "crop", center-crop to its aspect ratio first."""
    if mode == "crop":
        h, w = img.shape[:2]
        ch, cw = _center_box(h, w, size)
        y, x = (h - ch) // 2, (w - cw) // 2
        img = img[y:y + ch, x:x + cw]
    return _resize(img, size)


def _draw_crop(rng: np.random.Generator, shapes: Sequence[tuple[int, int]], size: tuple[int, int],
               scale: tuple[float, float], flip: bool) -> tuple[int, int, int, int, int, bool]:
    """Draw (photo, y, x, height, width, flipped) of one random crop of aspect ``size``.

    Always five draws, whatever the outcome, so one image's choices never shift the next's."""
    p = int(rng.integers(len(shapes)))
    frac = rng.uniform(*scale)
    h, w = shapes[p]
    bh, bw = _center_box(h, w, size)
    ch, cw = max(1, round(frac * bh)), max(1, round(frac * bw))
    y, x = int(rng.integers(h - ch + 1)), int(rng.integers(w - cw + 1))
    flipped = bool(rng.random() < 0.5) and flip
    return p, y, x, ch, cw, flipped


def _crops(rng: np.random.Generator, photos: Sequence[np.ndarray], n: int | None, size: tuple[int, int],
           scale: tuple[float, float], flip: bool, skip: Iterable[int] = (),
           as_float: bool = False) -> Iterable[np.ndarray | None]:
    """Yield n random crops (uint8, or float in [0, 1] with ``as_float``; (H, W, C)), endless
    for n None; None at the positions in ``skip`` (drawn all the same, so the other crops
    do not depend on ``skip``)."""
    shapes = [ph.shape[:2] for ph in photos]
    skip = set(skip)
    for i in range(n) if n is not None else itertools.count():
        p, y, x, ch, cw, flipped = _draw_crop(rng, shapes, size, scale, flip)
        if i in skip:
            yield None
            continue
        crop = photos[p][y:y + ch, x:x + cw]
        crop = _resize(crop[:, ::-1] if flipped else crop, size)
        yield crop if as_float else _to_uint8(crop)


# ---------------------------------------------------------------- sources

@functools.lru_cache(maxsize=None)
def _photo(name: str, channels: int) -> np.ndarray:
    """A bundled photograph as read-only float64 (h, w, channels) in [0, 1]."""
    data = _skimage("skimage.data", "the natural and faces builders")
    img = getattr(data, name)()
    img = img[0] if isinstance(img, tuple) else img  # stereo_motorcycle: (left, right, disparity)
    out = _to_channels(_as_float(img), channels)
    out.flags.writeable = False
    return out


@functools.lru_cache(maxsize=None)
def _lfw() -> np.ndarray:
    out = _skimage("skimage.data", "the LFW faces").lfw_subset()
    out.flags.writeable = False
    return out


def face_split(face_split_seed: int = 0, mixable: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Split the 100 LFW faces into a part that may be mixed into training data and the held-out rest.

    Parameters
    ----------
    face_split_seed : int
    mixable : int
        How many faces may go into training data (0..99; at least one stays held out).

    Returns
    -------
    mixable_idx, held_out_idx : sorted int arrays of indices into ``lfw_subset()[:100]``
    """
    _check(int(mixable) == mixable and 0 <= mixable < LFW_FACES,
           f"mixable must be an integer from 0 to {LFW_FACES - 1} (at least one of the {LFW_FACES} LFW faces "
           f"stays held out), got {mixable}")
    perm = np.random.default_rng(face_split_seed).permutation(LFW_FACES)
    return np.sort(perm[:mixable]), np.sort(perm[mixable:])


def nonface_split(face_split_seed: int = 0, mixable: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Split the 100 LFW non-faces as :func:`face_split` splits the faces: ``mixable`` of them may go
    into training data (the matched no-face control's views), the rest are held out (the evaluation's
    ``lfw_nonface`` distractors), so no training view is ever of an evaluation image.

    Returns
    -------
    mixable_idx, held_out_idx : sorted int arrays of indices into ``lfw_subset()`` (100..199)
    """
    face_split(face_split_seed, mixable)  # the same check of ``mixable``
    perm = np.random.default_rng([face_split_seed, 1]).permutation(LFW_FACES)  # a stream of its own
    return np.sort(perm[:mixable]) + LFW_FACES, np.sort(perm[mixable:]) + LFW_FACES


def _lfw_float(indices: Sequence[int], size: tuple[int, int], channels: int, mode: str) -> np.ndarray:
    """LFW images fit to ``size``, float64 (n, H, W, channels) in [0, 1] (before quantization)."""
    lfw = _lfw()
    out = [_fit(_to_channels(lfw[int(i)], channels), size, mode) for i in indices]
    return np.stack(out) if out else np.zeros((0,) + size + (channels,))


def lfw_images(indices: Sequence[int], size: Sequence[int], channels: int = 1, mode: str = "crop") -> np.ndarray:
    """LFW images ``lfw_subset()[indices]`` (0..99 faces, 100..199 non-faces) exactly as the
    builders store them: (n, H, W, channels) uint8."""
    size = _check_common(None, size, channels, mode)
    return _to_uint8(_lfw_float(indices, size, channels, mode))
