"""The figures of ``cotsdl evaluate``: plain numpy arrays in, one PNG out.

Every function draws with matplotlib's Agg backend (imported lazily, so the
package works without it), writes its PNG atomically (a temporary name in the
same folder, then ``os.replace``), closes the figure and returns the path.
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..io.atomic import write_atomic

DPI = 120


def _figure(**kw):
    """A new figure that draws with Agg (pyplot's global state is left alone)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError:
        raise RuntimeError("figures need matplotlib: pip install 'cotsdl[viz]'") from None
    fig = Figure(layout="constrained", **kw)
    FigureCanvasAgg(fig)
    return fig


def _cmap(name: str, bad: str = "white"):
    import matplotlib  # noqa: PLC0415
    return matplotlib.colormaps[name].with_extremes(bad=bad)


def _save(fig, path: str | os.PathLike) -> Path:
    """Write ``fig`` to ``path`` atomically and let it go."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        image = io.BytesIO()  # rendered first: its size is known before the disk is touched
        fig.savefig(image, format="png", dpi=DPI)
    finally:
        fig.clear()
    return write_atomic(path, image.getvalue())


def _hwc(a: Any) -> np.ndarray:
    """An image as float64 (H, W, C) with C 1 or 3 (other channel counts side by side in gray)."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 2:
        a = a[..., None]
    if a.ndim != 3 or a.shape[2] < 1:
        raise ValueError(f"an image must be (H, W) or (H, W, C); got shape {a.shape}")
    if a.shape[2] not in (1, 3):
        a = np.concatenate(list(np.moveaxis(a, 2, 0)), axis=1)[..., None]
    return a


def _minmax(a: np.ndarray) -> np.ndarray:
    """Scale to [0, 1] by the array's own min/max (a constant array becomes 0.5)."""
    a = np.nan_to_num(a.astype(np.float64))
    lo, hi = float(a.min()), float(a.max())
    return np.full_like(a, 0.5) if hi - lo <= 1e-12 * max(1.0, abs(hi)) else (a - lo) / (hi - lo)


def _symmetric(a: np.ndarray) -> np.ndarray:
    """Scale to [-1, 1] by the largest absolute value (zero stays zero)."""
    a = np.nan_to_num(a.astype(np.float64))
    m = float(np.abs(a).max()) if a.size else 0.0
    return a / m if m > 0 else a


def _show(ax, img: np.ndarray, **kw):
    """imshow an (H, W, C) image already scaled to [0, 1] (gray for C=1)."""
    ax.set_xticks([])
    ax.set_yticks([])
    if img.shape[2] == 1:
        return ax.imshow(img[..., 0], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest", **kw)
    return ax.imshow(np.clip(img, 0.0, 1.0), interpolation="nearest", **kw)


# -- 1. filters ---------------------------------------------------------------------
def _spread_sites(sh: int, sw: int, n: int) -> list[tuple[int, int]]:
    """``n`` distinct sites spread over an sh x sw grid: centre, corners, then evenly."""
    c = ((sh - 1) // 2, (sw - 1) // 2)
    order = [(0, 0), c, (sh - 1, sw - 1), (0, sw - 1), (sh - 1, 0)]
    k = int(np.ceil(np.sqrt(max(n, 1)))) + 1
    order += [(int(i), int(j)) for i in np.linspace(0, sh - 1, k).round() for j in np.linspace(0, sw - 1, k).round()]
    order += [(i, j) for i in range(sh) for j in range(sw)]
    out: list[tuple[int, int]] = []
    for s in order:
        if s not in out:
            out.append(s)
        if len(out) == n:
            break
    return sorted(out)


def _orientation_map(ax, w: np.ndarray) -> None:
    """Per site a line along the stripes of its units' mean orientation, as long as they agree
    (``nn.orientation``); the border sites in red, with the share of units parallel to the nearest
    edge at the border and inside (``orientation.compare``) in the title."""
    from matplotlib.collections import LineCollection  # noqa: PLC0415

    from ..nn.orientation import border_sites, compare, orientations  # noqa: PLC0415
    theta, _ = orientations(w)
    z = np.exp(2j * theta).mean(axis=2)  # per site: the mean doubled angle of its units
    sh, sw = z.shape
    half, ang = 0.45 * np.abs(z), np.angle(z) / 2
    dx, dy = -np.sin(ang) * half, np.cos(ang) * half  # stripes run across the wave vector (cos, sin) = (col, row)
    i, j = np.mgrid[0:sh, 0:sw]
    segs = np.stack([np.stack([j - dx, i - dy], -1), np.stack([j + dx, i + dy], -1)], axis=-2).reshape(-1, 2, 2)
    border = border_sites((sh, sw))
    colors = np.where(border.reshape(-1, 1), (0.8, 0.1, 0.1, 1.0), (0.15, 0.15, 0.15, 1.0))
    ax.add_collection(LineCollection(segs, colors=colors, linewidths=1.2))
    ax.set_xlim(-1, sw)
    ax.set_ylim(sh, -1)
    ax.set_aspect("equal")
    ax.set_xlabel("site column")
    ax.set_ylabel("site row")
    c = compare(theta, border)
    ax.set_title(f"dominant orientation per site\n(line along the stripes; length: how far\nits {w.shape[2]} units "
                 f"agree)\nparallel to the nearest edge:\nborder sites (red) {c['border_edge_parallel']:.0%}, "
                 f"inner {c['interior_edge_parallel']:.0%}\n(orientations spread evenly: 25%)", fontsize=9)


def filters(w: Any, path: str | os.PathLike, sites: int = 4, max_neurons: int = 32,
            title: str = "first-stage filters (one per site and neuron)") -> Path:
    """A grid of first-stage filters: rows are sites (i, j) spread over the image,
    columns the first ``max_neurons`` neurons; beside it a map of every site's dominant
    orientation, border sites marked (:func:`_orientation_map`); ``w`` is (SH, SW, M, rh, rw, C)."""
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 6:
        raise ValueError(f"filters must be (SH, SW, M, rh, rw, C); got shape {w.shape}")
    sh, sw, m, rh, rw, c = w.shape
    if c not in (1, 3):  # channels side by side, in gray
        w = np.concatenate(list(np.moveaxis(w, 5, 0)), axis=4)[..., None]
        rw, c, channels = rw * c, 1, c
    else:
        channels = c
    where = _spread_sites(sh, sw, max(1, min(sites, sh * sw)))
    nm = max(1, min(m, max_neurons))
    pad = 1
    H, W = len(where) * (rh + pad) + pad, nm * (rw + pad) + pad
    if c == 1:
        mosaic = np.full((H, W), np.nan)
    else:
        mosaic = np.ones((H, W, 3))
    for r, (i, j) in enumerate(where):
        for n in range(nm):
            t = _symmetric(w[i, j, n])  # (rh, rw, C) in [-1, 1]
            y0, x0 = pad + r * (rh + pad), pad + n * (rw + pad)
            mosaic[y0:y0 + rh, x0:x0 + rw] = t[..., 0] if c == 1 else 0.5 + 0.5 * t
    width = min(16.0, max(6.0, 0.45 * nm + 2.0))
    height = min(12.0, max(2.5, width * H / W + 1.2))
    fig = _figure(figsize=(width + 4.0, max(height, 4.5)))
    ax, axm = fig.subplots(1, 2, width_ratios=(width, 4.0))
    _orientation_map(axm, w)
    if c == 1:
        cmap = _cmap("RdBu_r")
        im = ax.imshow(np.ma.masked_invalid(mosaic), cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
        fig.colorbar(im, ax=ax, shrink=0.8, label="weight / max|weight| of its tile")
    else:
        ax.imshow(mosaic, interpolation="nearest")
    ax.set_yticks([pad + r * (rh + pad) + (rh - 1) / 2 for r in range(len(where))],
                  [f"site ({i}, {j})" for i, j in where])
    step = max(1, nm // 16)
    ax.set_xticks([pad + n * (rw + pad) + (rw - 1) / 2 for n in range(0, nm, step)], [str(n) for n in range(0, nm, step)])
    ax.tick_params(length=0)
    ax.set_xlabel(f"neuron (first {nm} of {m})")
    for s in ax.spines.values():
        s.set_visible(False)
    note = "; RGB, mid gray = 0" if c == 3 else ("" if channels == 1 else "; channels side by side")
    ax.set_title(f"{title}\n{rh}x{rw // channels if c == 1 else rw}x{channels} filters, {sh}x{sw} sites, each tile scaled by its own max |weight|{note}",
                 fontsize=10)
    return _save(fig, path)


# -- 2. training curves -------------------------------------------------------------
def _by_stage(records: Sequence[dict]) -> dict[Any, list[dict]]:
    out: dict[Any, list[dict]] = {}
    for r in sorted((r for r in records if "step" in r), key=lambda r: r["step"]):
        out.setdefault(r.get("stage", 0), []).append(r)
    return out


def _value(r: dict, key: str) -> tuple[float, bool]:
    """The windowed mean of ``key`` when the record has one, else the value itself."""
    v = r.get(f"{key}_mean")
    if v is not None:
        return float(v), True
    v = r.get(key)
    return (float("nan") if v is None else float(v)), False


def _empty(ax, text: str = "no metrics records") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def training_curves(records: Sequence[dict], path: str | os.PathLike) -> Path:
    """Reconstruction, sparsity (and total loss) against the global step, one panel per stage."""
    stages = _by_stage(records)
    n = max(1, len(stages))
    fig = _figure(figsize=(min(16.0, 3.0 + 4.0 * n), 4.2))
    axes = fig.subplots(1, n, squeeze=False)
    if not stages:
        _empty(axes[0, 0])
        axes[0, 0].set_title("training curves")
    for ax, (stage, recs) in zip(axes[0], stages.items()):
        step = np.array([r["step"] for r in recs], dtype=np.float64)
        positive = []
        for key, style in (("reconstruction", "-"), ("sparsity", "-"), ("loss", ":")):
            vals = [_value(r, key) for r in recs]
            y = np.array([v for v, _ in vals])
            if not np.isfinite(y).any():
                continue
            label = key + (" (mean over the log window)" if any(m for _, m in vals) else "")
            ax.plot(step, y, style, lw=1.2 if style == "-" else 1.0, label=label)
            positive.extend(y[np.isfinite(y) & (y > 0)])
            if (y[np.isfinite(y)] <= 0).any():
                positive.append(-1.0)  # a non-positive value rules out log-y
        if positive and min(positive) > 0 and max(positive) / min(positive) > 100:
            ax.set_yscale("log")
        s = stage + 1 if isinstance(stage, (int, np.integer)) else stage
        ax.set_title(f"stage {s} ({len(recs)} records, steps {int(step[0])}-{int(step[-1])})", fontsize=10)
        ax.set_xlabel("global step")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("objective term")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("training objective by stage (each stage trains its own layers; the ones below are frozen)",
                 fontsize=11)
    return _save(fig, path)


# -- 3. response histograms ---------------------------------------------------------
def response_histograms(faces: Any, distractors: Any, threshold: float, path: str | os.PathLike,
                        title: str = "responses of the best neuron") -> Path:
    """Overlaid density histograms (shared bins) of the responses to faces and to
    distractors, with the decision threshold as a vertical line."""
    f = np.asarray(faces, dtype=np.float64).ravel()
    d = np.asarray(distractors, dtype=np.float64).ravel()
    f, d = f[np.isfinite(f)], d[np.isfinite(d)]
    both = np.concatenate([f, d])
    fig = _figure(figsize=(7.5, 4.5))
    ax = fig.subplots()
    if both.size:
        lo, hi = float(both.min()), float(both.max())
        if hi - lo <= 1e-12 * max(1.0, abs(hi)):
            lo, hi = lo - 0.5, hi + 0.5
        bins = np.linspace(lo, hi, int(np.clip(np.sqrt(both.size) * 2, 10, 60)) + 1)
        if d.size:
            ax.hist(d, bins=bins, density=True, alpha=0.55, color="tab:gray", label=f"other images (n={d.size})")
        if f.size:
            ax.hist(f, bins=bins, density=True, alpha=0.55, color="tab:orange", label=f"faces (n={f.size})")
    else:
        _empty(ax, "no responses")
    if threshold is not None and np.isfinite(threshold):
        ax.axvline(float(threshold), color="k", ls="--", lw=1.2, label=f"threshold {float(threshold):.3g}")
    ax.set_xlabel("response")
    ax.set_ylabel("density")
    ax.set_title(title, fontsize=10)
    if both.size:
        ax.legend(fontsize=9)
    return _save(fig, path)


# -- 4. image grids -----------------------------------------------------------------
def _grid_into(fig, images: Any, labels: Sequence[str] | None, ncols: int) -> None:
    imgs = np.asarray(images)
    n = len(imgs)
    ncols = max(1, min(ncols, n)) if n else 1
    nrows = max(1, int(np.ceil(n / ncols)))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for k, ax in enumerate(axes):
        if k >= n:
            ax.axis("off")
            continue
        _show(ax, _minmax(_hwc(imgs[k])))
        if labels is not None and k < len(labels):
            ax.set_title(str(labels[k]), fontsize=8, pad=2)


def image_grid(images: Any, path: str | os.PathLike, title: str, labels: Sequence[str] | None = None,
               ncols: int = 8) -> Path:
    """Images (n, H, W, C) in a grid, each scaled to its own min/max, with optional captions."""
    n = len(images)
    ncols = max(1, min(ncols, n)) if n else 1
    nrows = max(1, int(np.ceil(n / ncols)))
    fig = _figure(figsize=(max(5.0, 1.4 * ncols), 0.7 + 1.55 * nrows))
    if n:
        _grid_into(fig, images, labels, ncols)
    else:
        _empty(fig.add_subplot(), "no images")
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)


def top_bottom(top: Any, bottom: Any, path: str | os.PathLike, title: str,
               top_labels: Sequence[str] | None = None, bottom_labels: Sequence[str] | None = None,
               ncols: int = 8) -> Path:
    """The images with the strongest and the weakest responses, one grid each, in one figure."""
    rows = [max(1, int(np.ceil(len(x) / max(1, ncols)))) for x in (top, bottom)]
    cols = max(1, min(ncols, max(len(top), len(bottom), 1)))
    fig = _figure(figsize=(max(5.0, 1.4 * cols), 1.2 + 1.6 * sum(rows)))
    subs = fig.subfigures(2, 1, height_ratios=rows)
    for sub, imgs, labels, head in ((subs[0], top, top_labels, "strongest responses"),
                                    (subs[1], bottom, bottom_labels, "weakest responses")):
        if len(imgs):
            _grid_into(sub, imgs, labels, cols)
        else:
            _empty(sub.add_subplot(), "no images")
        sub.suptitle(head, fontsize=10, fontweight="bold")
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)


# -- 5. optimal stimulus ------------------------------------------------------------
def stimulus(image: Any, path: str | os.PathLike, title: str = "optimal stimulus", mean_face: Any = None,
             top: Any = None, note: str = "") -> Path:
    """The optimal stimulus, scaled symmetrically around 0, the same blurred by a Gaussian of 1 pixel
    (its pixel-level detail hides its layout when drawn large), the mean face and the (up to 9) most
    face-like held-out images (``top``, shown as a 3 x 3 mosaic, each scaled to its own range)."""
    img = _symmetric(_hwc(image))
    panels = [p for p in (mean_face, top) if p is not None]
    n = 2 + len(panels)
    fig = _figure(figsize=(4.2 * n + 0.8, 4.6))
    axes = fig.subplots(1, n, squeeze=False)[0]
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    ax = axes[0]
    if img.shape[2] == 1:
        im = ax.imshow(img[..., 0], cmap="gray", vmin=-1, vmax=1, interpolation="nearest")
        fig.colorbar(im, ax=ax, shrink=0.8, label="value / max|value| (0 = mid gray)")
    else:
        ax.imshow(np.clip(0.5 + 0.5 * img, 0, 1), interpolation="nearest")
    ax.set_title("optimal stimulus" + ("" if img.shape[2] == 1 else "\n(RGB, 0 = mid gray)")
                 + (f"\n{note}" if note else ""), fontsize=10)
    from .stimulus import gaussian_blur  # noqa: PLC0415 - the one blur of the stimulus module

    soft = _symmetric(gaussian_blur(_hwc(image), 1.0))
    if soft.shape[2] == 1:
        axes[1].imshow(soft[..., 0], cmap="gray", vmin=-1, vmax=1, interpolation="nearest")
    else:
        axes[1].imshow(np.clip(0.5 + 0.5 * soft, 0, 1), interpolation="nearest")
    axes[1].set_title("the same, blurred by 1 pixel\n(for viewing only)", fontsize=10)
    at = 2
    if mean_face is not None:
        mf = _minmax(_hwc(mean_face))
        im2 = _show(axes[at], mf)
        if mf.shape[2] == 1:
            fig.colorbar(im2, ax=axes[at], shrink=0.8, label="scaled to its own min/max")
        axes[at].set_title("mean face of the evaluation set", fontsize=10)
        at += 1
    if top is not None:
        tiles = [_minmax(_hwc(t)) for t in list(top)[:9]]
        h, w, c = tiles[0].shape
        mosaic = np.ones((3 * h + 2, 3 * w + 2, c))
        for i, t in enumerate(tiles):
            r, q = divmod(i, 3)
            mosaic[r * (h + 1):r * (h + 1) + h, q * (w + 1):q * (w + 1) + w] = t
        _show(axes[at], mosaic)
        axes[at].set_title("its 9 most face-like held-out images", fontsize=10)
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)


# -- 6. throughput ------------------------------------------------------------------
def throughput(records: Sequence[dict], path: str | os.PathLike) -> Path:
    """Images/s against the global step, and per stage the median step time split
    into compute and gradient exchange."""
    stages = _by_stage(records)
    fig = _figure(figsize=(12.0, 4.5))
    a1, a2 = fig.subplots(1, 2, width_ratios=[2, 1])
    names, comp, exch = [], [], []
    for stage, recs in stages.items():
        s = stage + 1 if isinstance(stage, (int, np.integer)) else stage
        pts = [(r["step"], r["images_per_s"]) for r in recs if r.get("images_per_s") is not None]
        if pts:
            x, y = np.array(pts, dtype=np.float64).T
            a1.plot(x, y, ".", ms=3, alpha=0.7, label=f"stage {s}")
        t = [(float(r["seconds"]), float(r.get("exchange_seconds") or 0.0)) for r in recs
             if r.get("seconds") is not None]
        if t:
            sec, ex = np.array(t).T
            names.append(f"stage {s}")
            comp.append(1e3 * float(np.median(np.maximum(sec - ex, 0.0))))
            exch.append(1e3 * float(np.median(ex)))
    if a1.lines:
        a1.set_xlabel("global step")
        a1.xaxis.get_major_locator().set_params(integer=True)
        a1.set_ylabel("images / s")
        a1.set_ylim(bottom=0)
        a1.grid(True, alpha=0.3)
        a1.legend(fontsize=8)
    else:
        _empty(a1, "no throughput records")
    a1.set_title("training throughput per step", fontsize=10)
    if names:
        x = np.arange(len(names))
        a2.bar(x, comp, color="tab:blue", label="compute")
        a2.bar(x, exch, bottom=comp, color="tab:red", label="gradient exchange")
        a2.set_xticks(x, names)
        a2.set_ylabel("median time per step (ms)")
        a2.legend(fontsize=8)
        a2.grid(True, axis="y", alpha=0.3)
    else:
        _empty(a2, "no timing records")
    a2.set_title("where a step's time goes (median)", fontsize=10)
    return _save(fig, path)
