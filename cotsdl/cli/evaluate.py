"""``cotsdl evaluate RUN``: the face-selectivity experiment on a trained run, with controls,
figures and a report in the run folder."""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any



def add_parser(sub) -> None:
    p = sub.add_parser(
        "evaluate", help="score every neuron of a trained run as a face detector, with controls, figures and a report",
        description="Push every labeled image through the trained network (distributed; run under mpiexec on any "
                    "number of ranks, or on 1), score every neuron of every layer as a face-vs-distractor threshold "
                    "classifier (high or low for faces) chosen on a selection half and measured on a held-out half "
                    "over K splits that never split a group (identity), score the controls and a linear probe on "
                    "each stage the same way, give 95%% intervals and paired differences by resampling groups, and "
                    "write report.json, report.md and figures into the run folder.")
    p.add_argument("run", metavar="RUN", help="a run folder written by cotsdl train")
    p.add_argument("--dataset", help="labeled HDF5 set (default: faces.h5 beside the run's data.file)")
    p.add_argument("--control-run", metavar="[NAME=]RUN2", action="append", default=[],
                   help="the same architecture trained on other data: a control that decides the verdict; the "
                        "first unnamed one is 'no_faces' (trained without faces); name others, e.g. "
                        "matched=runs/demo-matched (LFW non-faces in place of the faces). Repeatable")
    p.add_argument("--splits", type=int, default=20, help="random selection/test splits (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the splits, the resamples and the stimulus (default 0)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="B",
                   help="resamples of the groups for the 95%% intervals (default 1000, at least 100)")
    p.add_argument("--stimulus-steps", type=int, default=100, help="gradient-ascent steps (default 100)")
    p.add_argument("--stimulus-starts", type=int, default=8, metavar="N",
                   help="random starts of each optimal stimulus; the best response is kept (default 8)")
    p.add_argument("--figures", metavar="DIR", help="where the PNGs go (default: RUN/figures)")
    p.add_argument("--json", metavar="FILE", help="also write report.json here")
    p.add_argument("--no-figures", action="store_true", help="numbers only")


def _load_run(run: Path) -> tuple[dict[str, Any], Path, dict[str, Any]]:
    """(resolved config, latest checkpoint, its metadata) of a run folder, or ValueError (the config
    is checked as ``cli.run`` builds it)."""
    from . import run as run_spec  # noqa: PLC0415

    from ..io import checkpoint  # noqa: PLC0415

    if not (run / "config.toml").is_file():
        raise ValueError(f"{run} is not a run folder of cotsdl train (no config.toml)")
    cfg = run_spec.read(run / "config.toml").config
    ckpt, skipped = checkpoint.latest_verified(run / "checkpoints")
    if ckpt is None:
        raise ValueError(f"{run} has no complete checkpoint" + (f" that verifies ({'; '.join(skipped)})" if skipped
                                                               else " yet: train it first (cotsdl train CONFIG)"))
    for line in skipped:
        print(f"warning: checkpoint {line}", file=sys.stderr)
    return cfg, ckpt, checkpoint.read_index(ckpt)["meta"]


def _input_settings(cfg: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """What a run's network took as input: preprocessing and the input LCN it was trained with."""
    from .run import input_lcn  # noqa: PLC0415

    saved = (meta.get("data") or {}).get("input_lcn", input_lcn(cfg["data"]))  # older checkpoints: the config
    return {"preprocess": cfg["data"]["preprocess"], "std_floor": cfg["data"]["std_floor"], "input_lcn": saved}


#: Names a control run cannot take: the measures the report already has.
RESERVED = ("network", "random_weights", "best_pixel", "mean_face", "linear_probe", "pixels")


def control_runs(values: list[str]) -> list[tuple[str, str]]:
    """(name, run folder) of each ``--control-run [NAME=]RUN``: the first unnamed one is ``no_faces``;
    ValueError for a bad, reserved or repeated name, or a second unnamed run."""
    import re  # noqa: PLC0415

    out: list[tuple[str, str]] = []
    for v in values:
        m = re.fullmatch(r"([a-z][a-z0-9_]*)=(.+)", v)
        name, folder = (m.group(1), m.group(2)) if m else ("no_faces", v)
        if not m and any(n == "no_faces" for n, _ in out):
            raise ValueError(f"--control-run {v}: only one control run may go unnamed (it is no_faces); name the "
                             "others as NAME=RUN, e.g. matched=runs/demo-matched")
        if name in RESERVED:
            raise ValueError(f"--control-run {v}: {name!r} names another measure of the report; choose another name")
        if any(n == name for n, _ in out):
            raise ValueError(f"--control-run {v}: the name {name!r} is given twice")
        out.append((name, folder))
    return out


def _check_args(args) -> str | None:
    if args.splits < 2 or args.stimulus_steps < 0 or args.stimulus_starts < 1:
        return (f"need --splits >= 2, --stimulus-steps >= 0 and --stimulus-starts >= 1, got {args.splits}, "
                f"{args.stimulus_steps} and {args.stimulus_starts}")
    if args.bootstrap < 100:  # the 2.5% tails of fewer resamples rest on two or three values
        return f"need --bootstrap >= 100, got {args.bootstrap}"
    from ..bench.common import check_output_path  # noqa: PLC0415

    return check_output_path(args.json)


def _check_outputs(run: Path, figures: Path | None) -> None:
    """The report, the figures and their folders can be written (rank 0, before the costly part)."""
    import tempfile  # noqa: PLC0415

    for folder in [run] + ([figures] if figures else []):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as e:
            raise ValueError(f"cannot write into {folder}: {e.strerror or e}") from None
    for name in ("report.json", "report.md"):
        if (run / name).is_dir():
            raise ValueError(f"cannot write {run / name}: it is a folder")


def run(args) -> int:
    from mpi4py import MPI  # noqa: PLC0415

    from ..array.collective import agreed  # noqa: PLC0415
    from ..array.grid import ProcessGrid  # noqa: PLC0415
    from ..evaluate import experiment, responses, stages  # noqa: PLC0415
    from ..nn.network import Network  # noqa: PLC0415
    from ..nn.plan import NetworkPlan  # noqa: PLC0415
    from . import run as run_spec  # noqa: PLC0415
    from .train import open_dataset, setup_backend  # noqa: PLC0415

    comm = MPI.COMM_WORLD
    root = comm.Get_rank() == 0
    say = (lambda m: print(m, flush=True)) if root else (lambda m: None)
    t0 = time.perf_counter()
    loaded, err = None, _check_args(args)
    if root and err is None:  # one reading of the files, broadcast
        try:
            run_dir = Path(args.run)
            cfg, ckpt, meta = _load_run(run_dir)
            named = control_runs(args.control_run)
            runs = {name: _load_run(Path(folder)) for name, folder in named}
            folders = dict(named)
            dataset = Path(args.dataset) if args.dataset else Path(cfg["data"]["file"]).parent / "faces.h5"
            if not args.dataset and not dataset.exists():
                raise ValueError(f"no labeled set given and {dataset} does not exist: pass --dataset FILE "
                                 "(e.g. from cotsdl prepare-data faces FILE --size H W)")
            _check_outputs(run_dir, None if args.no_figures else (Path(args.figures) if args.figures
                                                                   else run_dir / "figures"))
            for name, control in runs.items():
                if (control[2]["network"], control[2]["dtype"]) != (meta["network"], meta["dtype"]):
                    raise ValueError(f"--control-run {folders[name]} trained another network or dtype than "
                                     f"{run_dir}: a control run must be the same architecture")
                # all are scored on the images as this run's config prepares them
                mine, theirs = _input_settings(cfg, meta), _input_settings(control[0], control[2])
                if mine != theirs:
                    raise ValueError(f"--control-run {folders[name]} saw other input than {run_dir} "
                                     f"({theirs} against {mine}): a control run must see the same input")
            _check_no_overlap([(str(run_dir), cfg)] + [(folders[n], c[0]) for n, c in runs.items()], dataset)
            controls_loaded = {name: (c[0], str(c[1]), c[2], folders[name]) for name, c in runs.items()}
            loaded = (cfg, str(ckpt), meta, controls_loaded, str(dataset))
        except (ValueError, OSError) as e:
            err = str(e)
    loaded, err = comm.bcast((loaded, err))
    if err:
        raise agreed(ValueError(err))
    cfg, ckpt, meta, control_runs_loaded, dataset = loaded
    network = Network.from_description(meta["network"])
    spec = run_spec.from_config(cfg, str(Path(args.run) / "config.toml"))
    backend_name = setup_backend(spec, comm)
    lcn = _input_settings(cfg, meta)["input_lcn"]  # as the network was trained
    dc = dataclasses.replace(spec.data, prefetch=False, input_lcn=lcn)
    source = open_dataset(comm, "--dataset", dataset, network.input_shape, None, dc, labels=True, shuffle=False)
    try:
        grid = ProcessGrid(comm, None, network.input_shape[:2])
        plan = NetworkPlan(network, grid, min(dc.batch, len(source)), meta["dtype"])
        subject = experiment.Subject("network", f"the trained network (checkpoint {Path(ckpt).name})", plan,
                                     responses.load_params(plan, ckpt, comm))
        controls = [experiment.Subject("random_weights", "the same network with its initial random weights", plan,
                                       responses.to_device(plan.init_params(meta["seed"], meta.get("filter_norm"))))]  # as the trainer began
        for name, control in control_runs_loaded.items():  # the same architecture (checked above): the same plan
            what = _WHAT.get(name, "the architecture trained on other data")
            controls.append(experiment.Subject(name, f"{what} ({control[3]})", plan,
                                               responses.load_params(plan, control[1], comm)))
        say(f"cotsdl evaluate {args.run}: {comm.Get_size()} rank(s), grid {grid.dims[0]}x{grid.dims[1]}, backend "
            f"{backend_name}, dataset {dataset} ({len(source)} images)")
        report, figs = experiment.run(subject, controls, source, k=args.splits, seed=args.seed,
                                      stimulus_steps=args.stimulus_steps, resamples=args.bootstrap,
                                      stimulus_starts=args.stimulus_starts, say=say)
    finally:
        source.close()
    status = 0
    if root:
        report.update(_context(args, cfg, meta, ckpt, dataset, grid, comm.Get_size(), backend_name, network,
                               control_runs_loaded, time.perf_counter() - t0))
        stages.add_training_log(report.get("stages", []), _records(Path(args.run)))
        report["verdict"] = {"selective": report["selective"], "sentence": _sentence(report)}
        try:
            _write(args, Path(args.run), report, figs, say)
        except OSError as e:  # checked before, but a disk can fill up meanwhile
            print(f"cotsdl: error: cannot write the report: {e}", file=sys.stderr, flush=True)
            status = 1
    return comm.bcast(status)  # every rank exits with the same status


_LABEL = {"random_weights": "the random-weight network", "no_faces": "the network trained without faces",
          "matched": "the matched network (LFW non-faces in place of the faces)"}
#: What a control run is, by name (the report's ``what``).
_WHAT = {"no_faces": "the architecture trained without faces",
         "matched": "the architecture trained with LFW non-face views in place of the face views"}


def _label(name: str) -> str:
    return _LABEL.get(name, f"the control run {name}")


def _check_no_overlap(runs: list[tuple[str, dict[str, Any]]], dataset: Path) -> None:
    """No run (the trained one or a control) trained on views of the evaluation's LFW non-faces."""
    from ..io.builders import lfw_overlap  # noqa: PLC0415
    from ..io.dataset import inspect  # noqa: PLC0415

    for folder, cfg in runs:
        try:
            recipe = inspect(cfg["data"]["file"]).recipe
        except (ValueError, OSError):
            continue  # the training file is gone: nothing to compare (the report says so under data)
        seen = lfw_overlap(recipe, dataset) if dataset.exists() else []
        if seen:
            raise ValueError(f"{folder} trained on views of {len(seen)} LFW non-face(s) that {dataset} shows as "
                             f"lfw_nonface distractors (lfw_subset indices {seen[:5]}"
                             f"{'…' if len(seen) > 5 else ''}): "
                             "build both with the same --face-split-seed and --mixable (cotsdl prepare-data faces "
                             "draws its LFW non-faces from the held-out part only)")


def _vs(d: dict[str, Any]) -> str:
    return f"{d['difference']:+.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}]"


def _top_sentence(report: dict[str, Any]) -> str:
    """The best neuron of the last stage against the untrained architecture (when there is more than one stage)."""
    if len(report.get("by_stage") or []) < 2:
        return ""
    top = report["by_stage"][-1]
    iv = top["intervals"]["network"]
    diffs = "; ".join(f"{c['control']} {_vs(c)}" for c in report["comparisons"]
                      if c["measure"] == "best_neuron" and c.get("stage") == top["stage"])
    return (f" Within the last stage (stage {top['stage'] + 1}), the best neuron reaches {iv['score']:.3f} "
            f"[{iv['ci_low']:.3f}, {iv['ci_high']:.3f}]" + (f"; minus the same stage's best neuron of {diffs}" if diffs
                                                          else "") + ".")


def _sentence(report: dict[str, Any]) -> str:
    """The verdict in plain words: the best neuron, its paired differences, and what they decide."""
    net = report["intervals"]["network"]
    b = report["best"]
    where = (f"layer {b['layer']} ({b['kind']} of stage {b['stage'] + 1}), unit {tuple(b['position'])}, "
             f"{'high' if b['polarity'] == 1 else 'low'} for faces")
    diffs = "; ".join(f"{c['control']} {_vs(c)}" for c in report["comparisons"]
                      if c["measure"] == "best_neuron" and "stage" not in c)
    head = (f"The best neuron reaches a held-out balanced accuracy of {net['score']:.3f} (95% interval "
            f"[{net['ci_low']:.3f}, {net['ci_high']:.3f}] over {report['groups']} groups) over "
            f"{report['scores']['network']['splits']} splits (the figures show {where}); best neuron minus "
            f"control, paired, with 95% intervals: {diffs}.")
    names = _and([_label(m) for m in report["must_beat"]])
    head += _top_sentence(report)
    if report["selective"] is None:
        missing = _and([_label(m) for m in report["missing_controls"]])
        return (head + f" Undecided: {missing} was not run as a control (--control-run), so no neuron is called "
                "face-selective." + _kind_sentence(report))
    if report["selective"]:
        return (head + f" It beats {names} (the lower end of each interval is above 0): the network has a "
                "face-selective neuron." + _kind_sentence(report))
    both = "both" if len(report["must_beat"]) == 2 else "all of"
    return (head + f" It does not beat {both} {names} (the lower end of an interval is not above 0): no neuron is "
            "called face-selective." + _kind_sentence(report))


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _kind_sentence(report: dict[str, Any]) -> str:
    """Per kind of distractor: on which kinds it beats every deciding control, and the weakest kind."""
    kinds = report.get("per_kind") or []
    weak = report.get("weakest_kind")
    if not kinds or not weak:
        return ""
    won = [k["kind"] for k in kinds if k.get("selective")]
    lost = [k["kind"] for k in kinds if k.get("selective") is False]
    text = (f" Per kind of distractor, it beats every deciding control on {len(won)} of {len(kinds)} kinds"
            + (f" (not on {', '.join(lost)})" if lost else "") + f"; the weakest kind is {weak['kind']}: network "
            f"{weak['score']:.3f}, minus {weak['control']} {_vs(weak)}")
    return text + (" (above 0)." if weak["beats"] else
                   f": on {weak['kind']} it shows no gain over {_label(weak['control'])}.")


def _context(args, cfg, meta, ckpt, dataset, grid, ranks, backend_name, network, controls,
             seconds) -> dict[str, Any]:
    import numpy as np  # noqa: PLC0415

    from .. import __version__  # noqa: PLC0415
    from ..io.dataset import inspect  # noqa: PLC0415

    def recipe(path):
        try:
            return inspect(path).recipe
        except ValueError as e:
            return {"error": str(e)}
    from ..evaluate import setup  # noqa: PLC0415

    data = {"training": {"file": cfg["data"]["file"], "recipe": recipe(cfg["data"]["file"])},
            "evaluation": {"file": dataset, "recipe": recipe(dataset)}, "input": _input_settings(cfg, meta)}
    trained = {name: {"file": c[0]["data"]["file"], "recipe": recipe(c[0]["data"]["file"]), "step": c[2]["step"],
                      "run": c[3]} for name, c in controls.items()}
    if trained:  # control_training: the first control run's (reports before named control runs had only it)
        data["control_training"] = {k: v for k, v in next(iter(trained.values())).items() if k != "run"}
        data["controls_training"] = trained
    return {"setup": setup.describe(cfg, meta, data["training"]["recipe"]), "network": network.describe(),
            "run": {"folder": str(args.run), "checkpoint": ckpt, "step": meta["step"], "ranks": ranks,
                    "grid": list(grid.dims), "training_grid": meta["grid"], "training_replicas": meta["replicas"],
                    "backend": backend_name, "control_run": next((c[3] for c in controls.values()), None),
                    "control_runs": {name: c[3] for name, c in controls.items()}, "seconds": seconds},
            "data": data,
            "versions": {"cotsdl": __version__, "numpy": np.__version__, "python": sys.version.split()[0]}}


def _write(args, run: Path, report: dict[str, Any], figs: dict[str, Any], say) -> None:
    from ..bench.common import write_json  # noqa: PLC0415
    from ..evaluate import report as writer  # noqa: PLC0415

    paths = {} if args.no_figures else _figures(run, Path(args.figures) if args.figures else run / "figures",
                                                report, figs)
    report["figure_errors"] = {k: v for k, v in paths.items() if isinstance(v, str) and v.startswith("error: ")}
    files = {k: (None if isinstance(v, str) and v.startswith("error: ") else v) for k, v in paths.items()}
    json_path, md_path = writer.write_report(run, report, files)
    if args.json:
        write_json(args.json, json.loads(Path(json_path).read_text()))
    say(report["verdict"]["sentence"])
    say(f"report: {md_path} (numbers: {json_path})")


def _stimulus_note(report: dict[str, Any]) -> str:
    """The network's stimulus: its correlation with the mean face (a line of the figure)."""
    units = (report.get("stimulus") or {}).get("units") or []
    own = units[0].get("own") if units else None
    return "" if not own else f"r with mean face {own['correlation']:+.2f}" + (" (|r|: no sign)" if units[0].get("even")
                                                                              else "")


def _records(run: Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl records ([] when missing or damaged: the report does without)."""
    try:
        with open(run / "metrics.jsonl") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def _figures(run: Path, folder: Path, report: dict[str, Any], figs: dict[str, Any]) -> dict[str, Any]:
    """Draw every figure; one that fails is reported, not fatal (rank 0 only)."""
    from ..evaluate import figures  # noqa: PLC0415

    folder.mkdir(parents=True, exist_ok=True)
    records = _records(run)
    b = report["best"]
    what = f"layer {b['layer']} ({b['kind']}, stage {b['stage'] + 1}) unit {tuple(b['position'])}"
    jobs = {
        "filters": lambda p: figures.filters(figs["filters"], p),
        "curves": lambda p: figures.training_curves(records, p),
        "histograms": lambda p: figures.response_histograms(figs["faces"], figs["distractors"], figs["threshold"], p,
                                                            f"best neuron ({what}) on held-out images"),
        "top_bottom": lambda p: figures.top_bottom(
            figs["top"], figs["bottom"], p, f"held-out images by the response of {what}",
            [f"{r:.2f} {'face' if c else 'other'}" for r, c in zip(figs["top_r"], figs["top_y"])],
            [f"{r:.2f} {'face' if c else 'other'}" for r, c in zip(figs["bottom_r"], figs["bottom_y"])]),
        "stimulus": lambda p: figures.stimulus(figs["stimulus"], p, f"optimal stimulus of {what}", figs["mean_face"],
                                               figs["top"][:9], _stimulus_note(report)),
        "throughput": lambda p: figures.throughput(records, p),
    }
    out: dict[str, Any] = {}
    for name, draw in jobs.items():
        try:
            out[name] = draw(folder / f"{name}.png")
        except Exception as e:  # noqa: BLE001 - a figure is not worth losing the report for
            out[name] = f"error: {type(e).__name__}: {e}"
    return out
