"""A study: a grid of runs that differ in a few settings, and the table and figure of their results.

``cotsdl study`` (``cotsdl.cli.study``) runs it; this module holds what needs no MPI and no
processes.  The grid comes from ``--vary KEY=V1,V2,...`` options: every combination of their
values is a cell, in the order given (the last key varies fastest).  A key is a config key
(``train.seed``, ``network.stages[1].filter.channels``) or a key of the training data's recipe
(:data:`RECIPE_KEYS`, e.g. ``data.face_fraction``): cells with the same recipe share one data set,
built once by ``cotsdl.io.builders.natural`` and named by its recipe (:func:`recipe_name`).
:func:`row` turns a cell's ``report.json`` into a row of ``study.json``; :func:`write` writes
``study.json``, ``study.md`` and ``study.png``.
"""
from __future__ import annotations

import itertools
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..io.atomic import write_atomic

#: Keys of the training data's recipe that a study may vary: key -> the keyword of
#: ``cotsdl.io.builders.natural`` it sets.  Not config keys: a cell's ``data.file`` becomes the
#: data set built from the recipe.
RECIPE_KEYS = {"data.face_fraction": "face_fraction", "data.count": "count"}


class StudyError(ValueError):
    """Bad study input (a ``--vary`` option, a recipe value): the message names the key and value."""


@dataclass(frozen=True)
class Axis:
    """One ``--vary`` option: a key and its values (parsed as TOML, as ``--set`` does; ``texts``: as typed)."""

    key: str
    values: tuple[Any, ...]
    texts: tuple[str, ...]


@dataclass(frozen=True)
class Cell:
    """One combination of the axes' values: ``settings`` key -> value, ``texts`` key -> the value as typed."""

    index: int
    settings: dict[str, Any] = field(hash=False)
    texts: dict[str, str] = field(hash=False)

    @property
    def name(self) -> str:
        """The cell's folder name: its settings, readable and safe as a path."""
        return slug(self.texts)

    def config_sets(self) -> list[str]:
        """``--set`` assignments of the cell's config keys (recipe keys are not config keys)."""
        return [f"{k}={t}" for k, t in self.texts.items() if k not in RECIPE_KEYS]

    def recipe_settings(self) -> dict[str, Any]:
        return {RECIPE_KEYS[k]: v for k, v in self.settings.items() if k in RECIPE_KEYS}

    def model_texts(self) -> dict[str, str]:
        """The settings other than the data's recipe: what the cell's no-face control shares with it."""
        return {k: t for k, t in self.texts.items() if k not in RECIPE_KEYS}


def _split_values(text: str) -> list[str]:
    """``a,[1,2],"x,y"`` -> ``['a', '[1,2]', '"x,y"']``: commas inside brackets or quotes do not split."""
    out, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    out.append(cur.strip())
    return out


def parse_value(text: str) -> Any:
    """A value as ``--set`` reads it: TOML, or else the bare word as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_vary(option: str) -> Axis:
    """``KEY=V1,V2,...`` -> an :class:`Axis`, or :class:`StudyError` naming what is wrong."""
    if "=" not in option:
        raise StudyError(f"--vary {option}: expected KEY=V1,V2,... (e.g. --vary train.seed=0,1,2)")
    key, text = (s.strip() for s in option.split("=", 1))
    key = re.sub(r"\s", "", key)
    if not key:
        raise StudyError(f"--vary {option}: no key before '='")
    texts = _split_values(text)
    if not text.strip() or any(not t for t in texts):
        raise StudyError(f"--vary {key}: empty value list or an empty value in {text!r}; give V1,V2,...")
    values = [parse_value(t) for t in texts]
    seen = [json.dumps(v, sort_keys=True) for v in values]
    dup = next((t for t, s in zip(texts, seen) if seen.count(s) > 1), None)
    if dup is not None:
        raise StudyError(f"--vary {key}: the value {dup} is given twice")
    if key in RECIPE_KEYS:
        for t, v in zip(texts, values):
            problem = check_recipe_value(key, v)
            if problem:
                raise StudyError(f"--vary {key}: value {t}: {problem}")
    return Axis(key, tuple(values), tuple(texts))


def check_recipe_value(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be the recipe key ``key`` (None: it can)."""
    if key == "data.face_fraction":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1
        return None if ok else "a face fraction must be a number from 0 to less than 1"
    if key == "data.count":
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        return None if ok else "a data set's image count must be a positive integer"
    return f"not a recipe key (recipe keys: {', '.join(RECIPE_KEYS)})"


def expand(axes: Sequence[Axis]) -> list[Cell]:
    """Every combination of the axes' values, the last axis varying fastest; StudyError on a key twice."""
    keys = [a.key for a in axes]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice:
        raise StudyError(f"--vary {twice} is given twice; give all its values in one option")
    cells = []
    for i, combo in enumerate(itertools.product(*[range(len(a.values)) for a in axes])):
        cells.append(Cell(i, {a.key: a.values[j] for a, j in zip(axes, combo)},
                          {a.key: a.texts[j] for a, j in zip(axes, combo)}))
    return cells


def slug(texts: dict[str, str]) -> str:
    """``{'data.face_fraction': '0.05', 'train.seed': '1'}`` -> ``face_fraction-0.05__seed-1`` (``base``: none)."""
    if not texts:
        return "base"
    parts = []
    for k, t in texts.items():
        short = re.sub(r"^(data|train|network|run|parallel)\.", "", k)
        parts.append(re.sub(r"[^A-Za-z0-9_.+\-]+", "", short.replace("[", "").replace("]", "")) + "-"
                     + re.sub(r"[^A-Za-z0-9_.+\-]+", "", t.replace(",", "+")))
    return "__".join(parts)


def recipe_name(count: int, size: Sequence[int], channels: int, seed: int, face_fraction: float = 0.0,
                no_faces: bool = False) -> str:
    """The file name of a ``natural`` data set made from this recipe (one name per recipe)."""
    faces = "nofaces" if no_faces else f"ff{float(face_fraction):g}"
    return f"natural-{size[0]}x{size[1]}x{channels}-n{count}-s{seed}-{faces}.h5"


def row(cell: Cell, report: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """A row of ``study.json``: the cell's settings, its best neuron with the 95% interval, the
    overall comparisons of ``report.json`` (best neuron minus each control, paired), the controls'
    scores, the verdict and the cell's wall times (``record``)."""
    net = report["intervals"]["network"]
    return {"cell": cell.name, "settings": dict(cell.settings), "run": record["run"],
            "control_run": record.get("control_run"), "best_neuron": net["score"], "ci_low": net["ci_low"],
            "ci_high": net["ci_high"],
            "comparisons": [c for c in report["comparisons"] if "stage" not in c],
            "controls": {k: v for k, v in report["intervals"].items() if k in ("random_weights", "no_faces")},
            "selective": report.get("selective"), "best": report.get("best"),
            "seconds": {k: record[k] for k in ("train_seconds", "control_seconds", "evaluate_seconds", "wall_seconds")
                        if k in record}}


def _fmt_value(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def _diff(r: dict[str, Any], control: str) -> str:
    c = next((c for c in r["comparisons"] if c["measure"] == "best_neuron" and c["control"] == control), None)
    return "" if c is None else f"{c['difference']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]"


def table(rows: Sequence[dict[str, Any]], keys: Sequence[str], cells: int) -> str:
    """``study.md``: one line per finished cell, the settings first."""
    controls = [c for c in ("random_weights", "no_faces") if any(_diff(r, c) for r in rows)]
    head = ["| " + " | ".join([*keys, "best neuron [95%]", *(f"minus {c} [95%]" for c in controls),
                               "selective", "train s", "evaluate s"]) + " |"]
    head.append("|" + "---|" * (len(keys) + len(controls) + 4))
    for r in rows:
        s = r["seconds"]
        head.append("| " + " | ".join(
            [*(_fmt_value(r["settings"][k]) for k in keys), f"{r['best_neuron']:.3f} [{r['ci_low']:.3f}, "
             f"{r['ci_high']:.3f}]", *(_diff(r, c) for c in controls),
             {True: "yes", False: "no", None: "undecided"}[r["selective"]],
             f"{s.get('train_seconds', float('nan')):.0f}", f"{s.get('evaluate_seconds', float('nan')):.0f}"]) + " |")
    note = (f"{len(rows)} of {cells} cell(s) finished. Best neuron: held-out balanced accuracy of the best unit "
            "(cotsdl evaluate); 'minus X': best neuron minus the control's, paired, 95% interval by resampling "
            "identities; selective: above both controls (the lower ends above 0). Seconds are wall time on the "
            "machine the cell ran on.")
    return "# Study\n\n" + note + "\n\n" + "\n".join(head) + "\n"


def _position_of(values: Sequence[Any]) -> tuple[list[str], dict[str, int]]:
    """The distinct values in order (numbers sorted), and each one's place on the axis."""
    distinct = list(dict.fromkeys(json.dumps(v) for v in values))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        distinct.sort(key=lambda d: json.loads(d))
    return distinct, {d: i for i, d in enumerate(distinct)}


def figure(rows: Sequence[dict[str, Any]], keys: Sequence[str], path: str | Path) -> Path:
    """Selectivity (best neuron, 95% interval) against each varied setting, one panel per key: the
    key's values evenly spaced, the cells that share a value side by side, the controls' best
    neurons beside each, and a line through the trained networks' means."""
    from .figures import _figure, _save  # noqa: PLC0415

    fig = _figure(figsize=(4.2 * max(1, len(keys)), 3.6))
    axes = fig.subplots(1, max(1, len(keys)), squeeze=False)[0]
    styles = {"network": ("o", "C0", "trained network"), "random_weights": ("s", "C7", "random weights"),
              "no_faces": ("^", "C3", "no-face network")}
    for ax, key in zip(axes, keys or ["cell"]):
        values = [r["settings"].get(key, r["cell"]) for r in rows]
        distinct, place = _position_of(values)
        per = {d: sum(json.dumps(v) == d for v in values) for d in distinct}
        seen: dict[str, int] = {}
        for r, v in zip(rows, values):
            d = json.dumps(v)
            j, seen[d] = seen.get(d, 0), seen.get(d, 0) + 1
            x = place[d] + 0.5 * ((j + 0.5) / per[d] - 0.5)
            points = {"network": (r["best_neuron"], r["ci_low"], r["ci_high"])}
            points.update({k: (c["score"], c["ci_low"], c["ci_high"]) for k, c in r["controls"].items()})
            for name, (y, lo, hi) in points.items():
                marker, colour, label = styles[name]
                shift = {"network": 0.0, "random_weights": 0.04, "no_faces": 0.08}[name] / max(1, per[d] ** 0.5)
                ax.errorbar([x + shift], [y], yerr=[[y - lo], [hi - y]], fmt=marker, color=colour, ms=3.5,
                            capsize=2, lw=0.9, label=label if r is rows[0] else None)
        means = [sum(r["best_neuron"] for r, v in zip(rows, values) if json.dumps(v) == d) / per[d] for d in distinct]
        ax.plot(range(len(distinct)), means, color="C0", lw=0.8, alpha=0.6)
        ax.set_xticks(range(len(distinct)), [str(json.loads(d)) for d in distinct])
        ax.set_xlim(-0.5, len(distinct) - 0.5)
        ax.set_xlabel(key)
        ax.set_ylabel("best neuron: held-out balanced accuracy")
        ax.axhline(0.5, color="0.6", lw=0.8, ls=":")
        ax.set_ylim(0.4, 1.0)
    if rows:
        axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Selectivity against each varied setting ({len(rows)} cells; bars: 95% intervals; "
                 "line: mean of the trained networks)", fontsize=9)
    return _save(fig, path)


def write(out: Path, rows: Sequence[dict[str, Any]], keys: Sequence[str], cells: int,
          meta: dict[str, Any], figures: bool = True) -> dict[str, Path]:
    """``study.json`` (``rows`` and the study's ``meta``), ``study.md`` and ``study.png`` (when
    ``figures`` and a row exists), each written atomically."""
    paths = {"json": out / "study.json", "md": out / "study.md"}
    text = table(rows, keys, cells)
    if figures and rows:
        try:
            paths["figure"] = figure(rows, keys, out / "study.png")
            text += "\n![selectivity against each varied setting](study.png)\n"
        except RuntimeError as e:  # no matplotlib: the numbers still count
            text += f"\n(no figure: {e})\n"
    doc = {**meta, "varied": list(keys), "cells": cells, "finished": len(rows), "rows": list(rows)}
    write_atomic(paths["json"], json.dumps(doc, indent=2, default=_jsonable) + "\n")
    write_atomic(paths["md"], text)
    return paths


def _jsonable(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    raise TypeError(f"not JSON: {type(v).__name__}")
