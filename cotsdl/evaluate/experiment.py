"""The selectivity experiment: score every neuron of a trained network as a face detector,
with controls scored the same way on the same splits.

Scores are honest (``scoring.honest_scores``): a neuron, its polarity and its
threshold are chosen on a selection half of the labeled images and measured on
the other half, over K seeded splits made of whole groups (identities:
``splits.group_splits``).  Controls: the same network with its initial random
weights, the best single input pixel, a mean-face template, optionally the same
architecture trained without faces (another run).  Linear probes on each stage's
output compare the trained and the random-weight (and no-face) networks' features.
Every measure is reduced to its calls on each split and scored on the same group
resamples (``bootstrap``): intervals, paired differences, faces against each
distractor kind (``comparisons``).  Everything here is collective over the model
grid and gives the same numbers on any number of ranks.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import backend
from ..array.box import Box
from ..array.collective import raise_collectively
from ..array.collect import gather
from ..array.distarray import DistArray
from ..nn.plan import NetworkPlan
from ..ops.cpu.parallel import single_threaded_blas
from ..progress import Progress
from . import bootstrap, comparisons, labeled, probe, responses, scoring, stages, stimulus
from . import splits as splits_mod


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


def template_scores(X: np.ndarray, y: np.ndarray,
                    splits: list[tuple[np.ndarray, np.ndarray]]) -> tuple[dict[str, Any], np.ndarray]:
    """The mean-face control: correlation with the mean face of the selection half, scored like a neuron
    (either polarity); returns its scores and its (k, N) calls."""
    Xc = X - X.mean(axis=1, keepdims=True)
    Xc /= np.maximum(np.linalg.norm(Xc, axis=1, keepdims=True), 1e-12)

    def feature(faces: np.ndarray) -> np.ndarray:
        t = Xc[faces].mean(axis=0)
        t -= t.mean()
        return (Xc @ (t / max(np.linalg.norm(t), 1e-12)))[:, None]

    calls, thresholds, polarities = np.zeros((len(splits), len(y)), bool), [], []
    for s, (sel, test) in enumerate(splits):
        f = feature(sel[y[sel] == 1])
        c = scoring.local_candidate(f, y, sel, test, np.array([0]))
        calls[s] = scoring.rule(f[:, 0], c.threshold, c.polarity)
        thresholds.append(c.threshold)
        polarities.append(c.polarity)
    everything = np.arange(len(y))
    ins = scoring.local_candidate(feature(everything[y == 1]), y, everything, everything, np.array([0]))
    out = {**scoring.split_scores(calls, y, splits), "thresholds": thresholds, "polarities": polarities,
           "in_sample": {"neuron": 0, "threshold": ins.threshold, "polarity": ins.polarity, "acc": ins.test_acc,
                         "balanced_acc": ins.test_balanced_acc}}
    return out, calls


def neuron_calls(scores: dict[str, Any], columns: np.ndarray) -> np.ndarray:
    """(k, N) calls of the rule chosen on each split; ``columns[:, s]``: the responses of split s's neuron."""
    return np.stack([scoring.rule(columns[:, s], t, p)
                     for s, (t, p) in enumerate(zip(scores["thresholds"], scores["polarities"]))])


#: The controls a neuron must beat to be called face-selective (DESIGN of the experiment: issue 10);
#: every other control run given (e.g. ``matched``: LFW non-faces in place of the faces) decides too.
DECIDING = ("random_weights", "no_faces")


def must_beat(controls: list[str]) -> list[str]:
    """The deciding controls: :data:`DECIDING`, then every other network control run (by name)."""
    return list(DECIDING) + [c for c in controls if c not in DECIDING]


@dataclass
class Scored:
    """A network's best-neuron scores and calls, overall and within each stage, its probes' calls per
    stage, each layer's scores and each stage's silent fraction."""

    scores: dict[str, Any]
    calls: np.ndarray
    by_stage: list[dict[str, Any]]
    stage_calls: list[np.ndarray]
    probes: list[np.ndarray]
    layers: list[dict[str, Any]]
    silent: list[float]


def _layer_columns(ids: np.ndarray, info: responses.LayerInfo) -> slice | np.ndarray:
    """This rank's columns of one layer: a slice when the ids are in order (they are: layer by layer)."""
    if np.all(np.diff(ids) > 0):
        return slice(*np.searchsorted(ids, [info.offset, info.offset + info.size]))
    return (ids >= info.offset) & (ids < info.offset + info.size)


def _score(subject: Subject, source: Any, y: np.ndarray, splits: list, combine: Callable,
           infos: list) -> tuple[Scored, np.ndarray, np.ndarray]:
    """Responses of every neuron of ``subject``, its honest scores (of all neurons and of each layer),
    calls and stage probes (collective)."""
    comm = subject.plan.grid.comm
    with Progress(len(y), f"responses of {subject.name}", "images", enabled=comm.Get_rank() == 0) as shown:
        R, ids = responses.collect(subject.plan, subject.params, source, len(y), shown.update)
    R, ids = _finite(comm, subject.name, R, ids)
    per = []
    for info in infos:  # each layer once; the best of all neurons is the best of the layers' bests
        cols = _layer_columns(ids, info)
        per.append(scoring.honest_candidates(R[:, cols], y, splits, ids[cols], combine))
    scores = scoring.summarize(scoring.best_of(*per))
    calls = neuron_calls(scores, responses.columns(R, ids, scores["neurons"], comm))
    by_stage = [scoring.summarize(scoring.best_of(*[p for p, info in zip(per, infos) if info.stage == stage]))
                for stage in sorted({info.stage for info in infos})]
    stage_calls = [neuron_calls(b, responses.columns(R, ids, b["neurons"], comm)) for b in by_stage]
    layers = [{"layer": info.index, "kind": info.kind, "stage": info.stage, "neurons": info.size,
               "mean_balanced_acc": s["mean_balanced_acc"], "std_balanced_acc": s["std_balanced_acc"],
               "in_sample_balanced_acc": s["in_sample"]["balanced_acc"]}
              for info, s in zip(infos, map(scoring.summarize, per))]
    return Scored(scores, calls, by_stage, stage_calls, probe.stage_calls(R, ids, infos, y, splits, comm), layers,
                  stages.silent_fractions(R, ids, infos, comm)), R, ids


def _layout(source: Any, y: np.ndarray, k: int, seed: int, comm) -> tuple:
    """(groups, kinds, kind names, splits) of the labeled set, checked collectively."""
    err, out = None, None
    try:
        groups, kinds, names = labeled.groups_and_kinds(source, y)
        out = (groups, kinds, names, scoring.stratified_splits(y, k, seed, groups, kinds))
        err = splits_mod.split_error(y, out[3])
    except ValueError as e:
        err = str(e)
    raise_collectively(comm, err)  # the same file on every rank: the same verdict
    return out


def run(subject: Subject, controls: list[Subject], source: Any, *, k: int = 20, seed: int = 0,
        stimulus_steps: int = 100, resamples: int = 1000, stimulus_starts: int = stimulus.STARTS,
        say: Callable[[str], None] = lambda m: None) -> tuple[dict, dict]:
    """Score ``subject`` and every control; returns (report numbers, figure data) on every rank
    of the grid (figure data is complete on rank 0 of the grid).

    ``selective`` is True or False only when every control of :data:`DECIDING` was run,
    else None: undecided.  It is True when the lower end of the 95% interval of the
    paired difference (best neuron minus control) is above 0 for each of them and for
    every other network control given (:func:`must_beat`).  The same is decided for each
    kind of distractor alone (``per_kind``, ``selective_every_kind``, ``weakest_kind``).

    BLAS runs one thread per rank throughout: ranks share the node's cores, and the
    many small solves of the probes and the bootstrap are several times slower
    with threads competing for them (the forward passes run on the backend's own
    thread pool as in training)."""
    with single_threaded_blas():
        return _run(subject, controls, source, k, seed, stimulus_steps, resamples, stimulus_starts, say)


def _run(subject, controls, source, k, seed, stimulus_steps, resamples, stimulus_starts, say) -> tuple[dict, dict]:
    comm = subject.plan.grid.comm
    images, y = labeled_images(source)
    raise_collectively(comm, label_error(source.path, y))  # before the costly part; the same file on every rank
    groups, kinds, names, splits = _layout(source, y, k, seed, comm)
    boot = bootstrap.GroupBootstrap(y, splits, groups, resamples, seed)
    n = len(y)
    combine = responses.combine_best(comm)
    infos = responses.layer_infos(subject.plan)
    t0 = time.perf_counter()
    net, R, ids = _score(subject, source, y, splits, combine, infos)
    best = net.scores
    say(f"responses of {sum(i.size for i in infos)} neurons in {len(infos)} layers to {n} images "
        f"({int(y.sum())} faces, {boot.weights.shape[1]} groups), scores and stage probes in "
        f"{time.perf_counter() - t0:.1f} s")
    per_layer = net.layers
    say(f"best neuron: held-out balanced accuracy {best['mean_balanced_acc']:.3f} ± {best['std_balanced_acc']:.3f} "
        f"over {k} splits (in-sample {best['in_sample']['balanced_acc']:.3f})")
    rows = {subject.name: (subject.what, best)}
    calls = {subject.name: net.calls}
    probes = {subject.name: net.probes}
    scored = {subject.name: net}
    for c in controls:
        got, _, _ = _score(c, source, y, splits, combine, infos)  # its responses are dropped here
        rows[c.name], calls[c.name], probes[c.name] = (c.what, got.scores), got.calls, got.probes
        scored[c.name] = got
        say(f"control {c.name}: {got.scores['mean_balanced_acc']:.3f} ± {got.scores['std_balanced_acc']:.3f}")
    X = images.reshape(n, -1).astype(np.float64)
    pixel = scoring.honest_scores(X, y, splits=splits)
    rows["best_pixel"] = ("the best single input pixel", pixel)
    calls["best_pixel"] = neuron_calls(pixel, X[:, pixel["neurons"]])
    template, calls["mean_face"] = template_scores(X, y, splits)
    rows["mean_face"] = ("correlation with the mean face of the selection half", template)
    last = probe.stage_outputs(infos)[-1]
    calls["linear_probe"] = probes[subject.name][-1]
    rows["linear_probe"] = (f"ridge least squares on all {last.size} outputs of the last stage (a reference)",
                            scoring.split_scores(calls["linear_probe"], y, splits))
    for name in ("best_pixel", "mean_face", "linear_probe"):
        say(f"control {name}: {rows[name][1]['mean_balanced_acc']:.3f} ± {rows[name][1]['std_balanced_acc']:.3f}")

    report = _summaries(boot, rows, calls, probes, scoring.probe_calls(X, y, splits), infos, y, groups,
                        kinds, names, seed, must_beat([c.name for c in controls]))
    report.update({"best": _best(best, infos, 0), "per_layer": per_layer, "images": n, "faces": int(y.sum())})
    report["by_stage"] = []
    for stage, chosen in enumerate(net.by_stage):
        intervals, vs = comparisons.stage_best(boot, {name: s.stage_calls[stage] for name, s in scored.items()}, stage)
        report["by_stage"].append({"stage": stage, "intervals": intervals, "best": _best(chosen, infos, 0)})
        report["comparisons"] += vs
    random = next((c for c in controls if c.name == "random_weights"), None)
    if random is not None:  # the trained network's start: filters, activity and best neuron per stage
        r = scored[random.name]
        report["stages"] = stages.table(subject.plan, subject.params, random.params, net.silent, r.silent,
                                        [b["mean_balanced_acc"] for b in net.by_stage],
                                        [b["mean_balanced_acc"] for b in r.by_stage])
    figures = _figure_data(subject, R, ids, y, images, best, infos, splits, comm)
    report["stimulus"], figures["stimulus"], report["best"]["stimulus_trace"] = _stimuli(
        subject, random, scored, y, images, infos, seed, stimulus_steps, stimulus_starts)
    return report, figures


def _summaries(boot, rows, calls, probes, pixels, infos, y, groups, kinds, names, seed,
               deciding) -> dict[str, Any]:
    """Intervals, paired differences, verdicts, per-kind and per-stage-probe numbers of the report."""
    resampled = {name: boot.scores(c) for name, c in calls.items()}
    intervals, best_vs = comparisons.best_neuron({n: v for n, v in resampled.items() if n != "linear_probe"})
    intervals["linear_probe"] = bootstrap.summary(resampled["linear_probe"])
    net = next(iter(rows))
    verdicts = {name: comparisons.verdict(bootstrap.difference(resampled[net], resampled[name]),
                                          scoring.paired_verdict(rows[net][1], s))
                for name, (_, s) in rows.items() if name != net}
    stages = [{"stage": info.stage, "layer": info.index, "features": info.size} for info in probe.stage_outputs(infos)]
    probe_table, probe_vs = comparisons.stage_probes(boot, probes, stages, pixels)
    decided = all(m in verdicts for m in deciding)
    kind_masks = labeled.distractor_kinds(y, kinds, names)
    single = {n: c for n, c in calls.items() if n != "linear_probe"}
    kinds_table = comparisons.per_kind(boot, single, kind_masks, groups, deciding)
    return {"scores": {name: s for name, (_, s) in rows.items()}, "verdicts": verdicts,
            "selective": all(verdicts[m]["beats"] for m in deciding) if decided else None,
            "selective_every_kind": all(k["selective"] for k in kinds_table) if decided and kinds_table else None,
            "weakest_kind": comparisons.weakest_kind(kinds_table, [m for m in deciding if m in verdicts]),
            "must_beat": list(deciding), "missing_controls": [m for m in deciding if m not in verdicts],
            "groups": int(boot.weights.shape[1]),
            "kinds": {name: int(np.sum(kinds == code)) for code, name in enumerate(names)},
            "bootstrap": {"resamples": boot.resamples, "unit": "group", "level": bootstrap.LEVEL, "seed": seed},
            "intervals": intervals, "comparisons": best_vs + probe_vs,
            "per_kind": kinds_table, "probes": probe_table,
            "rows": [_row(name, what, s, intervals[name], verdicts.get(name)) for name, (what, s) in rows.items()]}


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
            "position": list(info.position(neuron)), "threshold": float(scores["thresholds"][split]),
            "polarity": int(scores["polarities"][split]), "split": split,
            "polarities": {"high": scores["polarities"].count(1), "low": scores["polarities"].count(-1)},
            "chosen_layers": sorted({responses.which_layer(infos, int(v)).index for v in scores["neurons"]})}


def _row(name: str, what: str, s: dict, interval: dict, verdict: dict | None) -> dict[str, Any]:
    return {"name": name, "what": what, "test_balanced_acc_mean": s["mean_balanced_acc"],
            "test_balanced_acc_std": s["std_balanced_acc"], "ci_low": interval["ci_low"],
            "ci_high": interval["ci_high"], "test_acc_mean": s["mean_acc"],
            "test_acc_std": s["std_acc"], "in_sample_balanced_acc": s.get("in_sample", {}).get("balanced_acc"),
            "polarity": s.get("in_sample", {}).get("polarity"),
            "difference": None if verdict is None else verdict["difference"],
            "difference_ci": None if verdict is None else [verdict["ci_low"], verdict["ci_high"]],
            "beats": None if verdict is None else bool(verdict["beats"])}


def _figure_data(subject: Subject, R, ids, y, images, scores, infos, splits, comm) -> dict[str, Any]:
    b = _best(scores, infos, 0)
    r = responses.column(R, ids, b["neuron"], comm)
    test = splits[0][1]
    # most face-like first: the highest responses, or the lowest for a neuron that is low for faces
    order = test[np.argsort(-b["polarity"] * r[test], kind="stable")]
    w0 = subject.plan.network.filter_layers()[0]
    shape, box = subject.plan.weight_box(w0)
    host = np.ascontiguousarray(backend.to_numpy(subject.params[w0]))  # the figure is drawn on the host
    filters = gather(DistArray(comm, shape, box, box, data=host))
    return {"filters": filters, "faces": r[test][y[test] == 1], "distractors": r[test][y[test] == 0],
            "threshold": b["threshold"], "polarity": b["polarity"], "top": images[order[:16]],
            "bottom": images[order[::-1][:16]], "top_r": r[order[:16]], "bottom_r": r[order[::-1][:16]],
            "top_y": y[order[:16]], "bottom_y": y[order[::-1][:16]],
            "mean_face": images[y == 1].mean(axis=0)}


def _stimuli(subject: Subject, random: Subject | None, scored: dict, y, images, infos, seed, steps,
             starts) -> tuple[dict[str, Any], np.ndarray | None, list[float]]:
    """The optimal stimuli (:func:`stimulus.best_of_starts`) of the network's best neuron and of the
    random-weight network's (best overall and best of the same stage), each in both polarities, and
    their correlation with the mean face of the evaluation set (identities training never saw):
    ``report["stimulus"]`` (on every rank), the network's best image (for the figure; rank 0) and
    its response at every step."""
    comm = subject.plan.grid.comm
    mean_face = images[y == 1].mean(axis=0)
    norm = stimulus.mean_norm(images[y == 1])
    one = NetworkPlan(subject.plan.network, subject.plan.grid, 1, subject.plan.dtype)
    b = _best(scored[subject.name].scores, infos, 0)
    units = [("network", "best neuron", subject, b)]
    if random is not None:
        r = scored[random.name]
        units.append(("random_weights", "best neuron", random, _best(r.scores, infos, 0)))
        same = _best(r.by_stage[b["stage"]], infos, 0)
        if same["neuron"] != units[-1][3]["neuron"]:
            units.append(("random_weights", f"best neuron of stage {b['stage'] + 1}", random, same))
    out = {"settings": {"starts": int(starts), "steps": int(steps), "lr": 0.1, "init": stimulus.INIT,
                        "blur": stimulus.BLUR, "norm": norm, "seed": int(seed)},
           "mean_face": f"all {int(np.sum(y == 1))} faces of the evaluation set", "units": []}
    image, trace = None, []
    for network, which, subj, u in units:
        row = {"network": network, "which": which, "neuron": u["neuron"], "layer": u["layer"], "stage": u["stage"],
               "position": u["position"], "polarity": u["polarity"]}
        for name, sign in (("own", u["polarity"]), ("opposite", -u["polarity"])):
            got = stimulus.best_of_starts(one, subj.params, u["layer"], tuple(u["position"]), norm, starts, steps,
                                          seed=seed, sign=sign)
            if not len(got["responses"]):
                row[name] = None
                continue
            trace = got["traces"][got["best"]] if (network, name) == ("network", "own") else trace
            if got["images"] is None:  # not rank 0: the numbers come by broadcast below
                continue
            corr = stimulus.face_correlation(got["images"], mean_face, bool(got["even"]))
            row["even"] = got["even"]
            row[name] = {"sign": sign, "correlation": float(corr[got["best"]]), "mean": float(np.mean(corr)),
                         "ci_low": float(np.percentile(corr, 2.5)), "ci_high": float(np.percentile(corr, 97.5)),
                         "correlations": corr.tolist(), "responses": got["responses"]}
            if (network, name) == ("network", "own"):
                image = got["images"][got["best"]]
        out["units"].append(row)
    return comm.bcast(out if comm.Get_rank() == 0 else None), image, trace
