"""The selectivity experiment: score every neuron of a trained network as a face detector,
with controls scored the same way on the same splits.

Scores are honest (``scoring.honest_scores``): a neuron and its threshold are
chosen on a selection half of the labeled images and measured on the other half,
over K seeded splits.  Controls: the same network with its initial random weights,
the best single input pixel, a mean-face template, optionally the same architecture
trained without faces (another run), and a linear probe on the last stage's outputs
as an upper reference.  Everything here is collective over the model grid and gives
the same numbers on any number of ranks.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..array.box import Box
from ..array.collective import raise_collectively
from ..array.collect import gather
from ..array.distarray import DistArray
from ..nn.plan import NetworkPlan
from . import responses, scoring, stimulus


@dataclass
class Subject:
    """A network to score: its plan on the grid and this rank's weights."""

    name: str
    what: str
    plan: NetworkPlan
    params: dict[int, np.ndarray]


def labeled_images(source: Any) -> tuple[np.ndarray, np.ndarray]:
    """All images of a (non-shuffling) source as the network sees them, (n, H, W, C), and labels 1/0."""
    if source.info.labels is None:
        raise ValueError(f"dataset {source.path} has no 'labels' (1 = face, 0 = distractor): evaluation needs "
                         "a labeled set, e.g. cotsdl prepare-data faces OUT --size H W")
    n = len(source)
    whole = Box((0, 0, 0, 0), source.image_shape + (n,))
    images = source.read(0, n, whole).transpose(3, 0, 1, 2)
    return np.ascontiguousarray(images), source.labels()


def label_error(path: Any, y: np.ndarray) -> str | None:
    """Why labels cannot be scored: only 1 (face) and 0 (distractor), at least 2 of each (a half needs one)."""
    other = sorted(set(np.unique(y).tolist()) - {0, 1})
    if other:
        return f"dataset {path}: labels must be 1 (face) or 0 (distractor), found {other[:5]}"
    faces, rest = int(np.sum(y == 1)), int(np.sum(y == 0))
    if faces < 2 or rest < 2:
        return (f"dataset {path}: scoring needs at least 2 faces and 2 distractors (each half of a split needs "
                f"one), got {faces} face(s) and {rest} distractor(s)")
    return None


def template_scores(X: np.ndarray, y: np.ndarray, k: int, seed: int) -> dict[str, Any]:
    """The mean-face control: correlation with the mean face of the selection half, scored like a neuron."""
    Xc = X - X.mean(axis=1, keepdims=True)
    Xc /= np.maximum(np.linalg.norm(Xc, axis=1, keepdims=True), 1e-12)

    def feature(faces: np.ndarray) -> np.ndarray:
        t = Xc[faces].mean(axis=0)
        t -= t.mean()
        return (Xc @ (t / max(np.linalg.norm(t), 1e-12)))[:, None]

    acc, bal = [], []
    for sel, test in scoring.stratified_splits(y, k, seed):
        c = scoring.local_candidate(feature(sel[y[sel] == 1]), y, sel, test, np.array([0]))
        acc.append(c.test_acc)
        bal.append(c.test_balanced_acc)
    everything = np.arange(len(y))
    ins = scoring.local_candidate(feature(everything[y == 1]), y, everything, everything, np.array([0]))
    return {"splits": k, "test_acc": acc, "test_balanced_acc": bal, "mean_acc": float(np.mean(acc)),
            "std_acc": float(np.std(acc)), "mean_balanced_acc": float(np.mean(bal)),
            "std_balanced_acc": float(np.std(bal)),
            "in_sample": {"neuron": 0, "threshold": ins.threshold, "acc": ins.test_acc,
                          "balanced_acc": ins.test_balanced_acc}}


#: The controls a neuron must beat to be called face-selective (DESIGN of the experiment: issue 10).
DECIDING = ("random_weights", "no_faces")
#: Fewer splits give no spread to compare with.
MIN_SPLITS_FOR_VERDICT = 5


def run(subject: Subject, controls: list[Subject], source: Any, *, k: int = 20, seed: int = 0,
        stimulus_steps: int = 100, say: Callable[[str], None] = lambda m: None) -> tuple[dict, dict]:
    """Score ``subject`` and every control; returns (report numbers, figure data) on every rank
    of the grid (figure data is complete on rank 0 of the grid).

    ``selective`` is True or False only when every control of :data:`DECIDING` was run
    (and there are enough splits), else None: undecided."""
    comm = subject.plan.grid.comm
    images, y = labeled_images(source)
    raise_collectively(comm, label_error(source.path, y))  # before the costly part; the same file on every rank
    n = len(y)
    combine = responses.combine_best(comm)
    infos = responses.layer_infos(subject.plan)
    t0 = time.perf_counter()
    R, ids = _finite(comm, subject.name, *responses.collect(subject.plan, subject.params, source, n))
    say(f"responses of {sum(i.size for i in infos)} neurons in {len(infos)} layers to {n} images "
        f"({int(y.sum())} faces) in {time.perf_counter() - t0:.1f} s")
    best = scoring.honest_scores(R, y, k, seed, ids=ids, combine=combine)
    per_layer = []
    for info in infos:
        sel = (ids >= info.offset) & (ids < info.offset + info.size)
        s = scoring.honest_scores(R[:, sel], y, k, seed, ids=ids[sel], combine=combine)
        per_layer.append({"layer": info.index, "kind": info.kind, "stage": info.stage, "neurons": info.size,
                          "mean_balanced_acc": s["mean_balanced_acc"], "std_balanced_acc": s["std_balanced_acc"],
                          "in_sample_balanced_acc": s["in_sample"]["balanced_acc"]})
    say(f"best neuron: held-out balanced accuracy {best['mean_balanced_acc']:.3f} ± {best['std_balanced_acc']:.3f} "
        f"over {k} splits (in-sample {best['in_sample']['balanced_acc']:.3f})")
    rows = {subject.name: (subject.what, best)}
    for c in controls:
        Rc, idc = _finite(comm, c.name, *responses.collect(c.plan, c.params, source, n))
        rows[c.name] = (c.what, scoring.honest_scores(Rc, y, k, seed, ids=idc, combine=combine))
        say(f"control {c.name}: {rows[c.name][1]['mean_balanced_acc']:.3f} ± {rows[c.name][1]['std_balanced_acc']:.3f}")
    X = images.reshape(n, -1).astype(np.float64)
    rows["pixel"] = ("the best single input pixel", scoring.honest_scores(X, y, k, seed))
    rows["mean_face"] = ("correlation with the mean face of the selection half", template_scores(X, y, k, seed))
    last = infos[-1]
    rows["linear_probe"] = (f"upper reference: ridge least squares on all {last.size} outputs of the last stage",
                            scoring.linear_probe(responses.gather_features(R, ids, last, comm), y, k, seed))
    for name in ("pixel", "mean_face", "linear_probe"):
        say(f"control {name}: {rows[name][1]['mean_balanced_acc']:.3f} ± {rows[name][1]['std_balanced_acc']:.3f}")

    verdicts = {name: scoring.paired_verdict(best, rows[name][1]) for name in rows if name != subject.name}
    must_beat = list(DECIDING)
    decided = all(m in verdicts for m in must_beat) and k >= MIN_SPLITS_FOR_VERDICT
    selective = all(verdicts[m]["beats"] for m in must_beat) if decided else None
    report = {"best": _best(best, infos, 0), "scores": {name: s for name, (_, s) in rows.items()},
              "per_layer": per_layer, "verdicts": verdicts, "selective": selective, "must_beat": must_beat,
              "missing_controls": [m for m in must_beat if m not in verdicts],
              "images": n, "faces": int(y.sum()),
              "rows": [_row(name, what, s, verdicts.get(name)) for name, (what, s) in rows.items()]}
    figures = _figure_data(subject, R, ids, y, images, best, infos, k, seed, stimulus_steps, comm)
    report["best"]["stimulus_trace"] = figures.pop("trace")
    return report, figures


def _finite(comm, name: str, R: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Non-finite responses (a diverged network) stop every rank with one message, not one rank alone."""
    bad = ~np.isfinite(R).all(axis=0)
    err = (f"{name}: {int(bad.sum())} neuron(s) give non-finite responses (e.g. neuron {int(ids[bad][0])}); "
           "is the checkpoint from a diverged run?") if bad.any() else None
    raise_collectively(comm, err)
    return R, ids


def _best(scores: dict, infos: list, split: int) -> dict[str, Any]:
    """The neuron chosen on the selection half of ``split`` (the one the figures show)."""
    neuron = int(scores["neurons"][split])
    info = responses.which_layer(infos, neuron)
    return {"neuron": neuron, "layer": info.index, "kind": info.kind, "stage": info.stage,
            "position": list(info.position(neuron)), "threshold": float(scores["thresholds"][split]), "split": split,
            "chosen_layers": sorted({responses.which_layer(infos, int(v)).index for v in scores["neurons"]})}


def _row(name: str, what: str, s: dict, verdict: dict | None) -> dict[str, Any]:
    return {"name": name, "what": what, "test_balanced_acc_mean": s["mean_balanced_acc"],
            "test_balanced_acc_std": s["std_balanced_acc"], "test_acc_mean": s["mean_acc"],
            "test_acc_std": s["std_acc"], "in_sample_balanced_acc": s.get("in_sample", {}).get("balanced_acc"),
            "beats": None if verdict is None else bool(verdict["beats"])}


def _figure_data(subject: Subject, R, ids, y, images, scores, infos, k, seed, steps, comm) -> dict[str, Any]:
    b = _best(scores, infos, 0)
    r = responses.column(R, ids, b["neuron"], comm)
    sel, test = scoring.stratified_splits(y, k, seed)[0]
    order = test[np.argsort(-r[test], kind="stable")]
    w0 = subject.plan.network.filter_layers()[0]
    shape, box = subject.plan.weight_box(w0)
    filters = gather(DistArray(comm, shape, box, box, data=np.ascontiguousarray(subject.params[w0])))
    one = NetworkPlan(subject.plan.network, subject.plan.grid, 1, subject.plan.dtype)
    img, trace = stimulus.optimal_stimulus(one, subject.params, b["layer"], tuple(b["position"]),
                                           stimulus.mean_norm(images[y == 1]), steps=steps, seed=seed)
    return {"filters": filters, "faces": r[test][y[test] == 1], "distractors": r[test][y[test] == 0],
            "threshold": b["threshold"], "top": images[order[:16]], "bottom": images[order[::-1][:16]],
            "top_r": r[order[:16]], "bottom_r": r[order[::-1][:16]], "top_y": y[order[:16]],
            "bottom_y": y[order[::-1][:16]], "stimulus": img, "mean_face": images[sel][y[sel] == 1].mean(axis=0),
            "trace": trace}
