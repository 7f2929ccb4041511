"""``report.json`` and ``report.md`` of ``cotsdl evaluate``.

:func:`write_report` takes the numbers (a JSON-serializable dict) and the PNGs
that could be drawn, and writes both files atomically into the run folder.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..io.atomic import write_atomic

TITLES = {
    "filters": "First-stage filters",
    "curves": "Training curves",
    "histograms": "Responses of the best neuron",
    "top_bottom": "Most and least face-like held-out images",
    "stimulus": "Optimal stimulus",
    "throughput": "Training throughput",
}


def _plain(x: Any) -> Any:
    """``x`` with numpy values made plain Python and NaN/inf made None (JSON has no NaN)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    return x


def _num(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.{digits}f}"
    return str(v)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v)


def _pm(mean: Any, std: Any) -> str:
    return f"{_num(mean)} ± {_num(std)}" if _finite(mean) else "–"


def _cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def _ci(lo: Any, hi: Any) -> str:
    return f"[{_num(lo)}, {_num(hi)}]" if _finite(lo) and _finite(hi) else "–"


def _score(d: Any) -> str:
    """``score [ci_low, ci_high]`` of a summary dict."""
    if not isinstance(d, dict) or not _finite(d.get("score")):
        return "–"
    return f"{_num(d['score'])} {_ci(d.get('ci_low'), d.get('ci_high'))}"


def _diff(d: Any) -> str:
    """``+difference [ci_low, ci_high]``, bold when the interval lies above 0."""
    if not isinstance(d, dict) or not _finite(d.get("difference")):
        return "–"
    text = f"{float(d['difference']):+.3f} {_ci(d.get('ci_low'), d.get('ci_high'))}"
    return f"**{text}**" if _finite(d.get("ci_low")) and d["ci_low"] > 0 else text


def _table(rows: list[dict], verdicts: dict) -> list[str]:
    out = ["| | what | held-out balanced acc. (mean ± std over splits) | 95% interval | held-out acc. "
           "| in-sample balanced acc. | best − it [95% interval] | beaten by the best neuron |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        v = verdicts.get(r.get("name")) or {}
        beats = {True: "**yes**", False: "no", None: "–"}[r.get("beats")]
        name = f"**{r.get('name')}**" if r.get("name") == "network" else str(r.get("name"))
        out.append(f"| {_cell(name)} | {_cell(r.get('what', ''))} "
                   f"| {_pm(r.get('test_balanced_acc_mean'), r.get('test_balanced_acc_std'))} "
                   f"| {_ci(r.get('ci_low'), r.get('ci_high'))} "
                   f"| {_pm(r.get('test_acc_mean'), r.get('test_acc_std'))} "
                   f"| {_num(r.get('in_sample_balanced_acc'))} | {_diff(v)} | {beats} |")
    return out


def _scores_table(heads: list[str], rows: list[tuple[list[Any], dict, dict]]) -> list[str]:
    """A table of leading cells, then every measure's score [interval], then the network's differences.

    ``rows``: (leading cells, {measure: summary}, {control: difference}) per row."""
    measures = list(dict.fromkeys(m for _, scores, _ in rows for m in scores))
    controls = list(dict.fromkeys(c for _, _, diffs in rows for c in diffs))
    out = ["| " + " | ".join(heads + measures + [f"network − {c}" for c in controls]) + " |",
           "|" + "---|" * (len(heads) + len(measures) + len(controls))]
    for lead, scores, diffs in rows:
        cells = [_cell(v) for v in lead] + [_score(scores.get(m)) for m in measures] + [_diff(diffs.get(c))
                                                                                       for c in controls]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _stage_no(stage: Any) -> Any:
    return stage + 1 if isinstance(stage, int) else stage


def _kinds_table(per_kind: list[dict]) -> list[str]:
    """Faces against each distractor kind: a row per kind, every measure and the network's differences
    (and, in reports that decide per kind, whether it beats every deciding control on that kind)."""
    decided = any("selective" in k for k in per_kind)
    verdict = {True: "**yes**", False: "no", None: "–"}
    return _scores_table(["distractor kind", "images (groups)"] + (["beats every deciding control"] if decided else []),
                         [([k.get("kind"), f"{k.get('distractors')} ({k.get('groups')})"]
                           + ([verdict[k.get("selective")]] if decided else []), k.get("scores", {}),
                           k.get("differences", {})) for k in per_kind])


def _probes_table(probes: list[dict]) -> list[str]:
    """The linear probe on each stage's output: a row per stage."""
    return _scores_table(["stage", "layer", "features"],
                         [([_stage_no(p.get("stage")), p.get("layer"), p.get("features")], p.get("scores", {}),
                           p.get("differences", {})) for p in probes])


def _by_stage_table(by_stage: list[dict], comparisons: list[dict]) -> list[str]:
    """A row per stage: each network's best neuron of the stage and the trained one's paired differences."""
    def diffs(st: Any) -> dict:
        return {c.get("control"): c for c in comparisons if c.get("measure") == "best_neuron" and c.get("stage") == st}
    return _scores_table(["stage"], [([_stage_no(b.get("stage"))], b.get("intervals", {}), diffs(b.get("stage")))
                                     for b in by_stage])


def _stimulus_table(st: dict) -> list[str]:
    """The optimal stimuli's correlation with the mean face: a row per unit (network's, random-weight's)."""
    out = ["| network | unit | layer (stage) | polarity | no sign (even) | r of the best start, own polarity "
           "| mean over starts [2.5%, 97.5%] | opposite polarity: best, mean [2.5%, 97.5%] |",
           "|---|---|---|---|---|---|---|---|"]
    for u in st.get("units") or []:
        own, opp = u.get("own") or {}, u.get("opposite") or {}
        stage = u.get("stage")
        out.append(f"| {_cell(u.get('network'))} | {_cell(u.get('which'))} {tuple(u.get('position') or ())} "
                   f"| {u.get('layer')} ({_stage_no(stage)}) | {'high' if u.get('polarity') == 1 else 'low'} "
                   f"| {_num(u.get('even'))} | {_num(own.get('correlation'))} "
                   f"| {_num(own.get('mean'))} {_ci(own.get('ci_low'), own.get('ci_high'))} "
                   f"| {_num(opp.get('correlation'))}, {_num(opp.get('mean'))} "
                   f"{_ci(opp.get('ci_low'), opp.get('ci_high'))} |")
    return out


def _stages_table(stages: list[dict]) -> list[str]:
    """Per-stage diagnostics (written by the trainer's side): a row per stage, every scalar key a column."""
    scalar = (int, float, str, bool, np.integer, np.floating, type(None))
    keys = list(dict.fromkeys(k for st in stages if isinstance(st, dict) for k, v in st.items()
                              if isinstance(v, scalar)))
    out = ["| " + " | ".join(_cell(k) for k in keys) + " |", "|" + "---|" * len(keys)]
    for st in stages:
        if isinstance(st, dict):
            out.append("| " + " | ".join(_cell(_num(st.get(k))) for k in keys) + " |")
    return out


def _where(b: dict) -> str:
    if not b:
        return "the best neuron"
    pos = tuple(b.get("position") or ())
    stage = b.get("stage")
    return (f"unit {pos} of layer {b.get('layer')} ({b.get('kind')}"
            + (f", stage {stage + 1}" if isinstance(stage, int) else "") + ")")


def _captions(report: dict) -> dict[str, str]:
    b = report.get("best") or {}
    where = _where(b)
    thr = b.get("threshold")
    net = next((r for r in report.get("rows", []) if r.get("name") == "network"), {})
    run = report.get("run") or {}
    splits = (report.get("scores", {}).get("network") or {}).get("splits")
    split = f"split {b.get('split', 0) + 1} of {splits}" if splits else "the first split"
    return {
        "filters": "The learned filters of the first stage. The network is locally connected without weight "
                   "sharing, so every site has its own filter bank: each row is one site (its grid position "
                   "(i, j)), each column one neuron. Every tile is scaled by its own largest absolute weight, so "
                   "the figure shows shape, not strength. Edge-, blob- and colour-opponent patterns that look "
                   "alike across rows mean the sites learned similar features; noise-like tiles mean the stage "
                   "has not learned much.",
        "curves": "The training objective of each stage against the global step: the reconstruction error and "
                  "the sparsity penalty (the dotted line is their weighted sum, the loss). Each stage trains only "
                  "its own layers on top of the frozen stages below, so each panel starts afresh. A "
                  "reconstruction that is still falling at the end of a stage means the stage was stopped early"
                  + (f" (checkpoint at step {run.get('step')})." if run.get("step") is not None else "."),
        "histograms": f"The responses of {where} to the held-out test half of {split}: faces against the other "
                      "images, as densities over shared bins. The dashed line is the threshold "
                      + (f"({_num(thr, 3)}) " if thr is not None else "")
                      + "chosen on the selection half only (faces "
                      + ("below" if b.get("polarity") == -1 else "above") + " it); the separation of the two histograms around it is "
                        "what the held-out balanced accuracy"
                      + (f" ({_pm(net.get('test_balanced_acc_mean'), net.get('test_balanced_acc_std'))})"
                         if net else "") + " measures.",
        "top_bottom": f"The 16 held-out images that {where} calls most face-like (top) and least (bottom): "
                      + ("those that drive it least on top, since it signals faces by responding low; "
                         if b.get("polarity") == -1 else "those that drive it most on top; ")
                      + "each scaled to its own range and captioned with the response and its label. A "
                        "face-selective neuron has mostly faces on top and none at the bottom.",
        "stimulus": f"The input of fixed norm that {'minimizes' if b.get('polarity') == -1 else 'maximizes'} the "
                    f"response of {where} (the face-like direction: it signals faces by responding "
                    f"{'low' if b.get('polarity') == -1 else 'high'}), found by projected gradient "
                    "ascent through the network from several small random starts (the best is shown, and "
                    "beside it the same blurred by 1 pixel for viewing; the table “The optimal stimulus against "
                    "random weights” "
                    "gives its correlation with the mean face), shown symmetric around zero (mid gray is 0), "
                    "beside the mean face of the evaluation set and the neuron's 9 most face-like held-out "
                    "images. A face-selective neuron's optimal stimulus tends to show a face-like layout (eyes, "
                    "nose, mouth) where its receptive field lies.",
        "throughput": "Training speed from the run's metrics: images per second at each logged step (left), and "
                      "per stage the median time of a step split into local compute and the exchange of "
                      "gradients and halos between ranks (right)"
                      + (f"; training used a {'x'.join(map(str, run['training_grid']))} grid x "
                         f"{run.get('training_replicas', 1)} replica(s)" if run.get("training_grid") else "") + ".",
    }


def _items(d: Any, indent: str = "") -> list[str]:
    """A dict as a short nested Markdown list."""
    if not isinstance(d, dict):
        return [f"{indent}- {_short(d)}"]
    out = []
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.append(f"{indent}- **{k}**:")
            out += _items(v, indent + "  ")
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, dict) for x in v):
            # e.g. the network's stages: one line each, every key whole (never cut in the middle)
            out.append(f"{indent}- **{k}**:")
            out += [f"{indent}  - {i}: " + ", ".join(f"{name}={_short(x, 80)}" for name, x in _flat(item))
                    for i, item in enumerate(v)]
        else:
            out.append(f"{indent}- **{k}**: {_short(v)}")
    return out


def _flat(d: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of a nested dict's leaves: ``filter.size``, ``pool.eps``."""
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out += _flat(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def _short(v: Any, limit: int = 200) -> str:
    if isinstance(v, float):
        s = _num(v, 4)
    elif isinstance(v, (list, tuple)) and all(isinstance(x, dict) for x in v) and v:
        s = "; ".join(", ".join(f"{k}={_short(x, 40)}" for k, x in item.items()) for item in v)
    else:
        s = json.dumps(_plain(v)) if isinstance(v, (list, tuple, dict)) else str(v)
    return s if len(s) <= limit else s[:limit - 1] + "…"


def _per_layer(layers: list[dict]) -> list[str]:
    out = ["| layer | kind | stage | neurons | best neuron, held-out balanced acc. | in-sample |",
           "|---|---|---|---|---|---|"]
    for r in layers:
        stage = r.get("stage")
        out.append(f"| {r.get('layer')} | {r.get('kind')} | {stage + 1 if isinstance(stage, int) else stage} "
                   f"| {r.get('neurons')} | {_pm(r.get('mean_balanced_acc'), r.get('std_balanced_acc'))} "
                   f"| {_num(r.get('in_sample_balanced_acc'))} |")
    return out


def write_report(folder: str | os.PathLike, report: dict, figures: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.md`` into ``folder``; returns their paths.

    ``figures`` maps a figure key (see ``TITLES``) to a PNG path, or None when
    the figure could not be drawn (``report["figure_errors"][key]`` says why).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / "report.json", folder / "report.md"
    write_atomic(json_path, json.dumps(_plain(report), indent=2, allow_nan=False) + "\n")

    b = report.get("best") or {}
    verdict = (report.get("verdict") or {}).get("sentence") or "No verdict was recorded."
    lines = ["# Face selectivity of a trained network", ""]
    run = report.get("run") or {}
    if run.get("folder"):
        lines += [f"Run `{run['folder']}`" + (f", checkpoint at step {run['step']}." if run.get("step") is not None
                                              else "."), ""]
    lines += ["## Verdict", "", verdict, ""]
    if report.get("per_kind"):  # first after the verdict: a headline over all distractors can hide a weak kind
        weak = report.get("weakest_kind") or {}
        lines += ["## Faces against each kind of distractor", "",
                  "The rules chosen against all distractors, scored on the faces against one kind of distractor "
                  "at a time (balanced accuracy [95% interval]); the last columns are the network's paired "
                  "differences"
                  + (f"; “beats every deciding control” means the lower end of the interval of each of "
                     f"{', '.join(report['must_beat'])} is above 0 on that kind" if report.get("must_beat") else "")
                  + "."
                  + (f" Weakest kind: **{weak['kind']}** (network − {weak['control']} {_diff(weak)})."
                     if weak.get("kind") else ""), ""] + _kinds_table(report["per_kind"]) + [""]
    setup = report.get("setup")
    if isinstance(setup, dict) and setup.get("deviations"):
        lines += ["## Setup: where this run departs from the paper", ""]
        lines += [f"- {_cell(d)}" for d in setup["deviations"]] + [""]

    lines += ["## The best neuron against the controls", ""]
    n_img, n_face = report.get("images"), report.get("faces")
    splits = (report.get("scores", {}).get("network") or {}).get("splits")
    boot = report.get("bootstrap") or {}
    lines += ["Each score is the mean ± standard deviation over "
              + (f"{splits} " if splits else "")
              + "random splits of the evaluation images"
              + (f" ({n_img} images, {n_face} faces" if n_img is not None and n_face is not None else "")
              + (f", {report['groups']} groups" if report.get("groups") is not None else "")
              + (")" if n_img is not None and n_face is not None else "")
              + " into a selection half, where the neuron (or control), its polarity (high or low for faces) "
                "and its threshold are chosen, and a test half, where it is scored; the halves never split a "
                "group (the views of one identity). Balanced accuracy is the mean of the accuracies on faces "
                "and on other images (0.5 is chance). The 95% intervals are percentile intervals over "
              + (f"{boot['resamples']} " if boot.get("resamples") else "")
              + "resamples of the groups (identities, not single views) with each split's chosen rule held "
                "fixed; every measure is scored on the same resamples, so best − control is a paired "
                "difference. “Beaten” means the lower end of its interval is above 0."
              + (f" Selectivity is decided against: {', '.join(report['must_beat'])}."
                 if report.get("must_beat") else ""), ""]
    lines += _table(report.get("rows", []), report.get("verdicts") or {})
    lines.append("")
    if b:
        pol = b.get("polarity")
        signal = {1: f"it signals faces by responding **high** (face iff response ≥ {_num(b.get('threshold'))})",
                  -1: f"it signals faces by responding **low** (face iff response < {_num(b.get('threshold'))})"}
        count = b.get("polarities") or {}
        lines += [f"The neuron shown in the figures is the one chosen on the selection half of split "
                  f"{b.get('split', 0) + 1}: {_where(b)}, global id {b.get('neuron')}"
                  + (f"; {signal[pol]}" if pol in signal else f", threshold {_num(b.get('threshold'))}")
                  + (f"; over all splits the chosen neurons came from layer(s) "
                     f"{', '.join(map(str, b['chosen_layers']))}" if b.get("chosen_layers") else "")
                  + (f" and were high for faces in {count.get('high', 0)} split(s), low in {count.get('low', 0)}"
                     if count else "") + ".", ""]
    st = report.get("stimulus")
    if isinstance(st, dict) and st.get("units"):
        cfg = st.get("settings") or {}
        lines += ["### The optimal stimulus against random weights", "",
                  "Pearson correlation over pixels of each unit's optimal stimulus with the mean face "
                  f"({st.get('mean_face', 'of the evaluation set')}), in the space the network sees (after its "
                  "input preprocessing): the unit's response times its polarity (own) or minus it (opposite) is "
                  f"maximized under ‖x‖ = {_num(cfg.get('norm'), 2)} (the mean norm of a face) by "
                  f"{cfg.get('steps')} steps of projected gradient ascent from {cfg.get('starts')} small random "
                  f"starts ({_num(cfg.get('init'), 2)} of the norm)"
                  + (f", with a Gaussian blur of {_num(cfg.get('blur'), 2)} pixel between steps" if cfg.get("blur")
                     else ", without blur") + "; the best response is kept. Where the response "
                  "to −x equals that to x (measured: squared, pooled filter outputs), the stimulus has no sign and "
                  "|r| is given. The interval is over the random starts.", ""] + _stimulus_table(st) + [""]
    if report.get("by_stage"):
        lines += ["### The best neuron of each stage", "",
                  "The same choice restricted to the neurons of one stage (its filter, pool and LCN outputs), in the "
                  "trained network and in the same architecture untrained by faces: the paper's face neuron sat at "
                  "the top, while the best neuron overall may be a first-stage unit that random filters match as "
                  "well.", ""] + _by_stage_table(report["by_stage"], report.get("comparisons", [])) + [""]
    if report.get("probes"):
        lines += ["### Linear probes on each stage", "",
                  "Ridge least squares on all outputs of a stage (its LCN layer), fitted on the selection half and "
                  "scored on the test half of the same splits, for the trained network and its controls (pixels: "
                  "the same probe on the input, a reference).", ""] + _probes_table(report["probes"]) + [""]
    if report.get("per_layer"):
        lines += ["### The best neuron of each layer", ""] + _per_layer(report["per_layer"]) + [""]
    if isinstance(report.get("stages"), list) and report["stages"]:
        lines += ["## Stages", "", "What training did to each stage, beside the random-weight network it "
                  "started from (random_* columns): the median cosine of each unit's filter to its initial one, "
                  "the median filter norm, for the first stage the fraction of a sample of filters that a Gabor "
                  "fits with R² ≥ 0.5 (oriented: elongated ones), the fraction of units silent on the evaluation "
                  "images (peak response below 5% of the median unit's), and the best held-out balanced accuracy "
                  "of a neuron of the stage.", ""] + _stages_table(report["stages"]) + [""]

    errors = report.get("figure_errors") or {}
    captions = _captions(report)
    shown = []
    for key, title in TITLES.items():
        p = figures.get(key)
        if p is not None and Path(p).is_file():
            shown.append((key, title, Path(p)))
    lines += ["## Figures", ""]
    if not shown and not errors:
        lines += ["No figures were drawn.", ""]
    for key, title in TITLES.items():
        hit = next((s for s in shown if s[0] == key), None)
        if hit is not None:
            rel = Path(os.path.relpath(hit[2].resolve(), folder.resolve())).as_posix()
            lines += [f"### {title}", "", f"![{title}]({rel})", "", captions[key], ""]
        elif errors.get(key):
            why = str(errors[key]).removeprefix("error: ")
            lines += [f"### {title}", "", f"This figure could not be drawn: {why}", ""]
    for key in figures:
        if key not in TITLES and figures[key] is not None and Path(figures[key]).is_file():
            rel = Path(os.path.relpath(Path(figures[key]).resolve(), folder.resolve())).as_posix()
            lines += [f"### {key}", "", f"![{key}]({rel})", ""]

    for head, key in (("Network", "network"), ("Data", "data"), ("Run", "run"), ("Versions", "versions")):
        if report.get(key):
            lines += [f"## {head}", ""] + _items(report[key]) + [""]
    write_atomic(md_path, "\n".join(lines).rstrip() + "\n")
    return json_path, md_path
