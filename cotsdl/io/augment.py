"""Face views and the distractors made to look like faces (for :mod:`cotsdl.io.builders`).

- :class:`Augmentation` and :func:`augment`: a random view of one face (flip, shift,
  scale, rotation, contrast, brightness), so that faces can be a large share of the
  training data without repeating the same pixels, and the evaluation set can hold
  several views of each held-out identity;
- :func:`phase_scramble`: an image with the Fourier amplitude spectrum of a face and
  random phases (the low-level statistics of a face, none of its shape);
- :func:`match_stats`: an affine change of pixel values to a given mean and standard
  deviation (natural crops with a face's brightness and contrast);
- :func:`views`, :func:`phase_scrambled_views`, :func:`matched_crops`: those, many at
  a time, as the builders store them (uint8).

Pure functions of their arguments and of the generator passed in: every random draw
comes from it, in a fixed number per image, so one image's outcome never shifts the
next image's draws. Pixels are float64 in [0, 1], (H, W, C).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from .dataset import DatasetError, image_stats

#: A crop flatter than this (std, [0, 1] units) is not given a face's contrast: it would be amplified noise.
MATCH_MIN_STD = 0.03
MATCH_TRIES = 100  # crops drawn at most per matched crop before giving up


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _range(name: str, value: Any, lo: float, hi: float) -> tuple[float, float]:
    pair = tuple(float(v) for v in value)
    _check(len(pair) == 2 and lo <= pair[0] <= pair[1] <= hi,
           f"augmentation {name} must be (lo, hi) with {lo} <= lo <= hi <= {hi}, got {tuple(value)}")
    return pair


@dataclass(frozen=True)
class Augmentation:
    """Ranges of the random changes of a face view (each drawn uniformly).

    Attributes
    ----------
    flip : bool
        Flip horizontally with probability 1/2.
    shift : float
        Largest shift along each axis, as a fraction of that side.
    scale : (lo, hi)
        Zoom factor about the centre (> 1: the face larger).
    rotate : float
        Largest rotation, degrees.
    contrast : (lo, hi)
        Factor applied to the deviations from the image's mean.
    brightness : float
        Largest offset added to every pixel (pixel units: [0, 1]).
    """

    flip: bool = True
    shift: float = 0.08
    scale: tuple[float, float] = (0.9, 1.1)
    rotate: float = 5.0
    contrast: tuple[float, float] = (0.7, 1.3)
    brightness: float = 0.1

    def __post_init__(self) -> None:
        # frozen: validated values are set through object.__setattr__
        object.__setattr__(self, "flip", bool(self.flip))
        object.__setattr__(self, "scale", _range("scale", self.scale, 0.25, 4.0))
        object.__setattr__(self, "contrast", _range("contrast", self.contrast, 0.0, 10.0))
        for name, hi in (("shift", 0.5), ("rotate", 180.0), ("brightness", 1.0)):
            v = float(getattr(self, name))
            _check(0.0 <= v <= hi, f"augmentation {name} must be from 0 to {hi}, got {getattr(self, name)}")
            object.__setattr__(self, name, v)

    def as_dict(self) -> dict[str, Any]:
        """The ranges as JSON-ready values (for a recipe)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


NO_AUGMENTATION = Augmentation(flip=False, shift=0.0, scale=(1.0, 1.0), rotate=0.0, contrast=(1.0, 1.0),
                               brightness=0.0)


def _inverse_affine(shape: tuple[int, int], shift: tuple[float, float], zoom: float, degrees: float) -> np.ndarray:
    """3x3 matrix from output (x, y) to input (x, y) of: zoom and rotate about the centre, then shift."""
    h, w = shape
    c = np.array([(w - 1) / 2.0, (h - 1) / 2.0])
    t = np.array([shift[1] * w, shift[0] * h])  # (x, y) in pixels
    a = np.deg2rad(degrees)
    rot_back = np.array([[np.cos(a), np.sin(a)], [-np.sin(a), np.cos(a)]])  # R(-a)
    m = np.eye(3)
    m[:2, :2] = rot_back / zoom
    m[:2, 2] = c - m[:2, :2] @ (c + t)
    return m


def augment(face: np.ndarray, rng: np.random.Generator, aug: Augmentation = Augmentation()) -> np.ndarray:
    """A random view of ``face`` (float (H, W, C) in [0, 1], already at the output size).

    Seven draws from ``rng`` per call, whatever the ranges. Borders uncovered by a
    shift or a zoom-out are filled by reflection, so the face fills the image as the
    LFW crop does. Returns float64 (H, W, C), clipped to [0, 1].
    """
    from skimage.transform import warp  # noqa: PLC0415 - scikit-image only where views are made

    face = np.asarray(face, np.float64)
    flip, dy, dx, zoom, degrees, gain, offset = rng.uniform(
        [0, -aug.shift, -aug.shift, aug.scale[0], -aug.rotate, aug.contrast[0], -aug.brightness],
        [1, aug.shift, aug.shift, aug.scale[1], aug.rotate, aug.contrast[1], aug.brightness])
    if aug.flip and flip < 0.5:
        face = face[:, ::-1]
    m = _inverse_affine(face.shape[:2], (dy, dx), zoom, degrees)
    out = warp(face, m, order=1, mode="reflect", preserve_range=True)
    mean = out.mean()
    return np.clip(mean + gain * (out - mean) + offset, 0.0, 1.0)


def phase_scramble(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``image`` (float (H, W[, C])) with its Fourier amplitude spectrum and random phases.

    The phases are those of the FFT of a real white-noise image (one for all
    channels), so the inverse FFT is real up to rounding; the constant term keeps
    phase 0, so the mean keeps its sign. By Parseval the mean and standard deviation
    are then those of ``image`` already; :func:`match_stats` (no clipping) removes
    the rounding. The result is not clipped: values may leave [0, 1].
    """
    x = np.asarray(image, np.float64)
    amplitude = np.abs(np.fft.fft2(x, axes=(0, 1)))
    phase = np.angle(np.fft.fft2(rng.standard_normal(x.shape[:2])))
    phase[0, 0] = 0.0  # the noise's DC term is real: its phase is 0 or pi, and pi would negate the mean
    if x.ndim == 3:
        phase = phase[..., None]
    out = np.fft.ifft2(amplitude * np.exp(1j * phase), axes=(0, 1)).real
    matched = match_stats(out, float(x.mean()), float(x.std()), clip=False)
    return out if matched is None else matched


def match_stats(image: np.ndarray, mean: float, std: float, clip: bool = True, tol: float = 1e-4,
                steps: int = 50) -> np.ndarray | None:
    """``a * image + b`` with the given mean and standard deviation, clipped to [0, 1] with ``clip``.

    Clipping moves the statistics, so ``a`` and ``b`` are refined (up to ``steps``
    times) until both are within ``tol`` of the target. Returns None where that
    cannot be reached: a flat image, or one whose pixels clipping saturates.
    """
    x = np.asarray(image, np.float64)
    mx, sx = float(x.mean()), float(x.std())
    if not sx > 0:
        return None
    gain, level = std / sx, mean
    for _ in range(steps):
        z = gain * (x - mx) + level
        z = np.clip(z, 0.0, 1.0) if clip else z
        dm, sz = mean - float(z.mean()), float(z.std())
        if abs(dm) <= tol and abs(sz - std) <= tol:
            return z
        if not sz > 0:
            return None
        gain *= std / sz  # the deviations scale with the gain; the level moves the mean
        level += dm
    return None


# ---------------------------------------------------------------- many at a time, as stored

def to_uint8(img: np.ndarray) -> np.ndarray:
    """Pixels in [0, 1] (clipped) to uint8."""
    return np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)


def _stack(images: Sequence[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    return np.stack(images) if len(images) else np.zeros((0,) + tuple(shape), np.uint8)


def cycle(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """k indices into range(n): whole permutations one after another, so each repeats as rarely as possible."""
    reps = -(-k // n) if n else 0
    return np.concatenate([rng.permutation(n) for _ in range(reps)] + [np.zeros(0, np.int64)])[:k].astype(np.int64)


def views(faces: np.ndarray, which: Sequence[int], rng: np.random.Generator, aug: Augmentation) -> np.ndarray:
    """Augmented views of ``faces[which]`` (float (n, H, W, C)) as uint8 (len(which), H, W, C)."""
    return _stack([to_uint8(augment(faces[int(k)], rng, aug)) for k in which], faces.shape[1:])


def phase_scrambled_views(faces: np.ndarray, n: int, rng: np.random.Generator,
                          aug: Augmentation) -> tuple[np.ndarray, np.ndarray]:
    """n phase-scrambled fresh views of ``faces`` (float (m, H, W, C), cycling through
    them), uint8 (clipped), and the index of each one's source face."""
    src = cycle(rng, len(faces), n)
    out = [to_uint8(phase_scramble(augment(faces[k], rng, aug), rng)) for k in src]
    return _stack(out, faces.shape[1:]), src


def matched_crops(targets: np.ndarray, crops: Iterable[np.ndarray], n: int, rng: np.random.Generator) -> np.ndarray:
    """n crops (float in [0, 1], taken from the endless iterable ``crops``), each given the
    mean and standard deviation of a random image of ``targets`` (uint8) by
    :func:`match_stats`; uint8. Crops flatter than :data:`MATCH_MIN_STD`, or that
    clipping keeps from matching, are skipped."""
    out, crops = [], iter(crops)
    for t in rng.integers(len(targets), size=n):
        mean, std = (float(v[0]) for v in image_stats(targets[t:t + 1]))
        for _ in range(MATCH_TRIES):
            crop = next(crops)
            z = match_stats(crop, mean, std) if crop.std() >= MATCH_MIN_STD else None
            if z is not None:
                out.append(to_uint8(z))
                break
        else:
            raise DatasetError(f"matched_crops: no crop of the held-out photographs could be given mean {mean:.3f} "
                               f"and std {std:.3f} in {MATCH_TRIES} tries")
    return _stack(out, targets.shape[1:])
