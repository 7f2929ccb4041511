"""The figures and the report of ``cotsdl evaluate``: every figure writes a valid PNG of a
sensible size and leaves no temporary file; the report is valid JSON (NaN -> null) and its
Markdown links only to files that exist."""
import json
import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from cotsdl.evaluate import report as rep

PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == PNG
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", data[16:24])


def check_png(path, folder, lo=300, hi=2400):
    path = Path(path)
    assert path.is_file() and path.parent == Path(folder)
    w, h = png_size(path)
    assert lo <= w <= hi and 150 <= h <= 2400, (w, h)
    assert [p.name for p in Path(folder).iterdir() if p.suffix != ".png"] == []


def records():
    out, step = [], 0
    for stage, n in ((0, 30), (1, 20)):
        for s in range(n):
            step += 1
            rec = {"step": step, "stage": stage, "stage_step": s + 1, "loss": 10.0 / (s + 1) + 0.1,
                   "reconstruction": 10.0 / (s + 1), "sparsity": 0.1 + 0.001 * s, "images_per_s": 500.0 + s,
                   "seconds": 0.2 + 0.01 * stage, "exchange_seconds": 0.05}
            if stage == 1:
                rec.update(loss_mean=rec["loss"], reconstruction_mean=rec["reconstruction"],
                           sparsity_mean=rec["sparsity"])
            out.append(rec)
    return out


@pytest.fixture
def figures():
    pytest.importorskip("matplotlib")
    from cotsdl.evaluate import figures
    return figures


@pytest.mark.parametrize("c", [1, 3, 2])
def test_filters(figures, tmp_path, c):
    w = np.random.default_rng(c).standard_normal((5, 6, 40, 7, 7, c))
    w[0, 0, 0] = 0.0  # an all-zero filter is drawn, not divided by zero
    check_png(figures.filters(w, tmp_path / "filters.png"), tmp_path)


def test_filters_small_grid(figures, tmp_path):
    w = np.random.default_rng(0).standard_normal((1, 2, 3, 4, 4, 1)).astype(np.float32)
    check_png(figures.filters(w, tmp_path / "f.png", sites=4, max_neurons=32), tmp_path)


def test_training_curves(figures, tmp_path):
    check_png(figures.training_curves(records(), tmp_path / "curves.png"), tmp_path)
    check_png(figures.training_curves([], tmp_path / "empty.png"), tmp_path)


def test_response_histograms(figures, tmp_path):
    rng = np.random.default_rng(0)
    p = figures.response_histograms(rng.normal(1, 1, 50), rng.normal(0, 1, 200), 0.5, tmp_path / "h.png", "best")
    check_png(p, tmp_path)
    check_png(figures.response_histograms(np.ones(5), np.ones(7), 1.0, tmp_path / "c.png", "constant"), tmp_path)


@pytest.mark.parametrize("c", [1, 3])
def test_image_grids(figures, tmp_path, c):
    rng = np.random.default_rng(c)
    imgs = rng.integers(0, 255, (16, 20, 18, c)).astype(np.uint8)
    imgs[3] = 7  # a constant image
    labels = [f"{v:.2f} {'face' if v > 0 else 'other'}" for v in rng.standard_normal(16)]
    check_png(figures.image_grid(imgs, tmp_path / "g.png", "grid", labels=labels), tmp_path)
    check_png(figures.image_grid(imgs[:5].astype(float), tmp_path / "g5.png", "five"), tmp_path)
    p = figures.top_bottom(imgs.astype(np.float32), imgs[::-1], tmp_path / "tb.png", "top and bottom",
                           top_labels=labels, bottom_labels=labels[::-1])
    check_png(p, tmp_path)


@pytest.mark.parametrize("c", [1, 3])
def test_stimulus(figures, tmp_path, c):
    rng = np.random.default_rng(c)
    img = rng.standard_normal((24, 20, c)) * 1e-3
    check_png(figures.stimulus(img, tmp_path / "s.png", "stimulus", rng.random((24, 20, c))), tmp_path)
    check_png(figures.stimulus(np.zeros((24, 20, c)), tmp_path / "z.png", "zero"), tmp_path)


def test_throughput(figures, tmp_path):
    check_png(figures.throughput(records(), tmp_path / "t.png"), tmp_path)
    check_png(figures.throughput([{"step": 1, "stage": 0}], tmp_path / "t0.png"), tmp_path)


def test_no_temp_file_after_failure(figures, tmp_path):
    with pytest.raises(ValueError):
        figures.filters(np.zeros((2, 2, 2)), tmp_path / "bad.png")
    assert list(tmp_path.iterdir()) == []


ROWS = [
    {"name": "network", "what": "the trained network", "test_balanced_acc_mean": 0.8123,
     "test_balanced_acc_std": 0.031, "test_acc_mean": 0.85, "test_acc_std": 0.02, "in_sample_balanced_acc": 0.84,
     "beats": None},
    {"name": "random_weights", "what": "initial random weights", "test_balanced_acc_mean": 0.61,
     "test_balanced_acc_std": 0.04, "test_acc_mean": 0.6, "test_acc_std": 0.05, "in_sample_balanced_acc": 0.65,
     "beats": True},
    {"name": "pixel", "what": "the best | pixel", "test_balanced_acc_mean": float("nan"),
     "test_balanced_acc_std": 0.0, "test_acc_mean": 0.5, "test_acc_std": 0.0, "in_sample_balanced_acc": None,
     "beats": False},
]


def make_report():
    return {"verdict": {"selective": True, "sentence": "The best neuron is face-selective (test sentence)."},
            "rows": ROWS, "best": {"layer": 2, "kind": "pool", "stage": 0, "neuron": 17, "position": [1, 2, 0],
                                   "threshold": 0.25, "split": 0, "chosen_layers": [2], "stimulus_trace": [1.0, 2.0]},
            "verdicts": {"random_weights": {"mean_diff": 0.2, "std_diff": 0.05, "beats": True},
                         "pixel": {"mean_diff": float("nan"), "std_diff": 0.1, "beats": False}},
            "scores": {"network": {"splits": 5, "test_balanced_acc": [0.8, float("nan"), np.float32(0.7)]}},
            "per_layer": [{"layer": 0, "kind": "filter", "stage": 0, "neurons": 100, "mean_balanced_acc": 0.7,
                           "std_balanced_acc": 0.02, "in_sample_balanced_acc": 0.72}],
            "must_beat": ["random_weights"], "images": 200, "faces": 50, "selective": True,
            "network": {"input": [32, 32, 1], "stages": [{"filter": {"size": [5, 5]}}]},
            "data": {"training": {"file": "train.h5", "recipe": {"kind": "synthetic"}}},
            "run": {"folder": "runs/x", "step": 1000, "ranks": 4, "grid": [2, 2], "seconds": float("inf")},
            "versions": {"cotsdl": "0.1", "numpy": np.__version__},
            "figure_errors": {"stimulus": "error: RuntimeError: boom"}}


def test_write_report(tmp_path):
    run = tmp_path / "run"
    figs = run / "figures"
    figs.mkdir(parents=True)
    for name in ("filters", "curves", "histograms", "top_bottom"):
        (figs / f"{name}.png").write_bytes(PNG)
    files = {"filters": figs / "filters.png", "curves": str(figs / "curves.png"), "histograms": figs / "histograms.png",
             "top_bottom": figs / "top_bottom.png", "stimulus": None, "throughput": None}
    json_path, md_path = rep.write_report(run, make_report(), files)
    assert Path(json_path) == run / "report.json" and Path(md_path) == run / "report.md"
    text = Path(json_path).read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data["rows"][2]["test_balanced_acc_mean"] is None
    assert data["scores"]["network"]["test_balanced_acc"][1] is None
    assert math.isclose(data["scores"]["network"]["test_balanced_acc"][2], 0.7, rel_tol=1e-6)
    assert data["run"]["seconds"] is None

    md = Path(md_path).read_text()
    assert "The best neuron is face-selective (test sentence)." in md
    assert "0.812 ± 0.031" in md
    for r in ROWS:
        assert re.search(rf"^\| \**{r['name']}\**\s*\|", md, re.M), r["name"]
    links = re.findall(r"\]\(([^)]+)\)", md)
    assert sorted(links) == sorted(f"figures/{n}.png" for n in ("filters", "curves", "histograms", "top_bottom"))
    for link in links:
        assert not Path(link).is_absolute() and (run / link).is_file()
    assert "throughput.png" not in md and "stimulus.png" not in md
    assert "boom" in md  # the reason a figure is missing
    for head in ("## Network", "## Data", "## Run", "## Versions"):
        assert head in md
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []


def test_write_report_without_figures(tmp_path):
    rep.write_report(tmp_path, make_report() | {"figure_errors": {}}, {"filters": tmp_path / "missing.png"})
    md = (tmp_path / "report.md").read_text()
    assert "](" not in md and "No figures were drawn." in md


def test_report_with_figures_elsewhere(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "f.png").write_bytes(PNG)
    rep.write_report(tmp_path / "run", make_report(), {"filters": tmp_path / "elsewhere" / "f.png"})
    links = re.findall(r"\]\(([^)]+)\)", (tmp_path / "run" / "report.md").read_text())
    assert links == ["../elsewhere/f.png"] and (tmp_path / "run" / links[0]).is_file()


def _pixels(path):
    import matplotlib.image

    return matplotlib.image.imread(str(path))[..., :3].astype(np.float64)


def test_a_planted_filter_appears_in_its_tile_with_its_sign(figures, tmp_path):
    """Content, not just a PNG: the one filter planted (red left half, blue right half: positive and
    negative weights) shows up alone, in the tile of its site and neuron, with its polarity."""
    sh, sw, m, rh, rw = 3, 3, 6, 8, 8
    full = np.ones((sh, sw, m, rh, rw, 1))
    bbox_src = _pixels(figures.filters(full, tmp_path / "full.png", sites=4))  # every tile red: the mosaic's extent
    blank = _pixels(figures.filters(np.zeros_like(full), tmp_path / "blank.png", sites=4))
    ys, xs = np.nonzero(np.abs(bbox_src - blank).sum(axis=2) > 0.1)  # the tiles (the colour bar is the same)
    top, left, height, width = ys.min(), xs.min(), ys.max() + 1 - ys.min(), xs.max() + 1 - xs.min()
    w = np.zeros_like(full)
    w[sh - 1, sw - 1, 4, :, : rw // 2] = 1.0  # site (2, 2) is the last of the rows shown; neuron 4 of 6
    w[sh - 1, sw - 1, 4, :, rw // 2:] = -1.0
    img = _pixels(figures.filters(w, tmp_path / "planted.png", sites=4))
    changed = np.abs(img - blank).sum(axis=2) > 0.1
    cy, cx = np.nonzero(changed)
    # in the mosaic, in the last row of sites (4 rows shown) and the tile of neuron 4 of 6
    assert top <= cy.min() and cy.max() < top + height and left <= cx.min() and cx.max() < left + width
    rows, cols = 4, m
    assert int((cy.mean() - top) / (height / rows)) == rows - 1
    assert int((cx.mean() - left) / (width / cols)) == 4
    tile_w = width / cols
    assert cx.max() - cx.min() < tile_w and cy.max() - cy.min() < height / rows  # one tile, nothing else
    mid = (cx.min() + cx.max()) / 2
    region = img[cy.min():cy.max() + 1, cx.min():cx.max() + 1]
    xs_r = np.arange(cx.min(), cx.max() + 1)
    left_half, right_half = region[:, xs_r < mid - 1], region[:, xs_r > mid + 1]
    assert left_half[..., 0].mean() > left_half[..., 2].mean() + 0.2  # positive weights: red
    assert right_half[..., 2].mean() > right_half[..., 0].mean() + 0.2  # negative weights: blue


def test_the_stimulus_figure_shows_the_stimulus(figures, tmp_path):
    """A bright square on a dark ground comes out bright where the square is (in the left panel: the
    stimulus; the right one, the same blurred for viewing, shows it too)."""
    img = -np.ones((20, 20))
    img[5:10, 12:17] = 1.0
    gray = _pixels(figures.stimulus(img, tmp_path / "s.png")).mean(axis=2)
    dark = _pixels(figures.stimulus(-np.ones((20, 20)) + 1e-9 * np.eye(20), tmp_path / "d.png")).mean(axis=2)
    half = gray.shape[1] // 2
    assert (np.abs(gray - dark)[:, half:] > 0.3).any()  # the blurred panel
    gray, dark = gray[:, :half], dark[:, :half]
    ys, xs = np.nonzero(np.abs(gray - dark) > 0.5)
    # the square's bounding box, relative to the image's (the only place where the two differ)
    assert len(ys) > 0
    h, w = ys.max() + 1 - ys.min(), xs.max() + 1 - xs.min()
    assert abs(h / w - 1.0) < 0.15  # a square stays a square
    assert gray[ys, xs].mean() > 0.9  # and is drawn white


def test_the_network_of_report_md_is_never_cut_in_a_key():
    """Each stage on a line of its own with every key whole (it was one line cut at 200 characters)."""
    from cotsdl.cli import config
    from cotsdl.evaluate.report import _items
    from cotsdl.nn import Network

    cfg = config.load(Path(__file__).resolve().parents[2] / "jobs" / "configs" / "paper-1b.toml")
    desc = {k: v for k, v in cfg["network"].items() if k != "allow_crop"}
    lines = _items({"network": Network.from_description(desc).describe()})
    stages = [ln for ln in lines if ln.lstrip().startswith(("- 0:", "- 1:", "- 2:"))]
    assert len(stages) == 3 and not any("…" in ln for ln in lines), lines
    for ln in stages:
        for key in ("filter.size=", "filter.channels=", "pool.stride=", "lcn.eps="):
            assert key in ln, ln
