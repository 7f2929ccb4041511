"""``cotsdl study CONFIG --vary KEY=V1,V2,... --dataset FACES.h5 --out DIR``: a grid of runs with controls.

Every combination of the ``--vary`` values is a cell: a normal run folder ``DIR/runs/CELL``
trained by ``cotsdl train`` and scored by ``cotsdl evaluate`` on FACES.h5 (each a child process
under ``mpiexec``, or ``srun`` in a Slurm job), against the random weights of the same seed and,
with ``--control-data`` or ``--control-nofaces``, the no-face network of the same settings
(``DIR/controls/...``).  Data sets a recipe key names (``data.face_fraction``) are built once into
``DIR/data/``, named by their recipe.  Results: ``DIR/study.json``, ``DIR/study.md``,
``DIR/study.png`` (``cotsdl.evaluate.study``).  Re-running the same command resumes: finished
cells are skipped, an interrupted one resumes from its checkpoint.  ``--print-array`` and
``--submit`` run the cells as a Slurm job array instead (``jobs/slurm/study.sbatch``).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..evaluate import study as grid
from ..io.atomic import write_atomic
from . import config as cfgmod
from . import run as run_spec

ROOT = Path(__file__).resolve().parents[2]  # the checkout (jobs/slurm/study.sbatch)
EXIT_REQUEUE = 75


def add_parser(sub) -> None:
    p = sub.add_parser(
        "study", help="train and evaluate a grid of runs (--vary KEY=V1,V2,...) with controls; a table and a figure",
        description="Expand every --vary into a grid of runs, train each (cotsdl train, under mpiexec on --ranks "
                    "ranks, one after another, or as a Slurm job array with --submit), evaluate each on --dataset "
                    "against the random weights of the same seed and, with --control-data/--control-nofaces, the "
                    "no-face network of the same settings, and write OUT/study.json, OUT/study.md and "
                    "OUT/study.png. Re-run the same command to resume. Exit statuses: 0 done, 2 bad input, "
                    f"{EXIT_REQUEUE} interrupted after a checkpoint (re-run to resume), else that of the failed step.")
    p.add_argument("config", help="TOML config of every run (see README.md, 'Config files')")
    p.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2,...", required=True,
                   help="a config key (train.seed=0,1,2) or a recipe key of the training data "
                        f"({', '.join(grid.RECIPE_KEYS)}) and its values; repeat for a grid")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (or a recipe key) in every run, as cotsdl train --set")
    p.add_argument("--dataset", required=True, metavar="FACES.h5", help="labeled evaluation set (cotsdl prepare-data faces)")
    p.add_argument("--out", required=True, metavar="DIR", help="the study's folder: runs/, controls/, data/, study.*")
    ctl = p.add_mutually_exclusive_group()
    ctl.add_argument("--control-data", metavar="NOFACES.h5",
                     help="train a no-face control of each cell's settings (the same seed) on this data set")
    ctl.add_argument("--control-nofaces", action="store_true",
                     help="as --control-data, on a data set built from the cells' recipe with --no-faces")
    p.add_argument("--ranks", type=int, default=2, help="MPI ranks of each training and evaluation (default 2)")
    p.add_argument("--data-dir", metavar="DIR", help="where recipe data sets are built (default OUT/data)")
    p.add_argument("--data-count", type=int, default=4096, help="images of a recipe data set (default 4096)")
    p.add_argument("--data-seed", type=int, default=0, help="seed of a recipe data set (default 0)")
    p.add_argument("--splits", type=int, default=20, help="cotsdl evaluate --splits (default 20)")
    p.add_argument("--bootstrap", type=int, default=1000, help="cotsdl evaluate --bootstrap (default 1000)")
    p.add_argument("--stimulus-steps", type=int, default=100, help="cotsdl evaluate --stimulus-steps (default 100)")
    p.add_argument("--no-figures", action="store_true", help="no figures (the runs' nor the study's)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--print-array", action="store_true",
                      help="build the data sets and print the sbatch commands of the job arrays (run nothing)")
    mode.add_argument("--submit", action="store_true",
                      help="build the data sets and submit the cells as a Slurm job array (controls first)")
    p.add_argument("--job-name", default=None, help="Slurm job name (default cotsdl-study-<OUT's name>)")
    p.add_argument("--sbatch-option", action="append", default=[], metavar="OPT",
                   help="an extra sbatch option for both arrays, e.g. --sbatch-option=--time=02:00:00")
    p.add_argument("--array-part", choices=["cells", "controls"], help="(the job array's own) which part")
    p.add_argument("--array-index", type=int, help="(the job array's own) which element")


@dataclass
class Job:
    """One run to train: a cell's (``cell``, and its no-face ``control``) or a control's; ``sets``:
    its ``--set`` assignments for ``cotsdl train`` (``data.file`` and ``run.folder`` included)."""

    name: str
    folder: Path
    sets: list[str]
    control: "Job | None" = None
    cell: grid.Cell | None = None


@dataclass
class Plan:
    cells: list[Job]
    controls: list[Job]
    keys: list[str]
    out: Path
    recipes: dict[Path, dict[str, Any]]


def _fail(msg: str) -> None:
    raise ValueError(msg)


def _split_sets(sets: list[str]) -> tuple[list[str], dict[str, Any]]:
    """The config assignments of ``--set`` and its recipe keys (checked)."""
    config, recipe = [], {}
    for s in sets:
        key = s.split("=", 1)[0].strip()
        if key in grid.RECIPE_KEYS and "=" in s:
            value = grid.parse_value(s.split("=", 1)[1].strip())
            problem = grid.check_recipe_value(key, value)
            if problem:
                _fail(f"--set {s}: {problem}")
            recipe[grid.RECIPE_KEYS[key]] = value
        else:
            config.append(s)
    return config, recipe


def plan(args) -> Plan:
    """Everything checked before anything is built or trained: ValueError naming the key and value."""
    if args.ranks < 1:
        _fail(f"--ranks must be a positive integer, got {args.ranks}")
    if args.data_count < 1:
        _fail(f"--data-count must be a positive integer, got {args.data_count}")
    axes = [grid.parse_vary(v) for v in args.vary]
    cells = grid.expand(axes)
    keys = [a.key for a in axes]
    base_sets, base_recipe = _split_sets(args.set)
    for k in keys + [s.split("=", 1)[0].strip() for s in args.set]:
        if k == "run.folder" or (k == "data.file" and (base_recipe or any(x in grid.RECIPE_KEYS for x in keys))):
            _fail(f"{k} is the study's to choose (runs go into --out, recipe data into --data-dir); do not set or vary it")
    if not Path(args.config).is_file():
        _fail(f"config {args.config}: no such file")
    faces = Path(args.dataset)
    if not faces.is_file():
        _fail(f"--dataset {faces}: no such file")
    from ..io.dataset import inspect  # noqa: PLC0415

    info = inspect(faces)
    if info.labels is None:
        _fail(f"--dataset {faces}: no 'labels' (1 = face, 0 = distractor): make one with cotsdl prepare-data faces")
    if args.control_data and not Path(args.control_data).is_file():
        _fail(f"--control-data {args.control_data}: no such file")
    out = Path(args.out)
    data_dir = Path(args.data_dir) if args.data_dir else out / "data"
    recipes: dict[Path, dict[str, Any]] = {}
    jobs, controls = [], {}
    for cell in cells:
        sets = base_sets + cell.config_sets()
        folder = out / "runs" / cell.name
        try:
            spec = run_spec.read(args.config, sets + [f"run.folder={_toml(folder)}"])
        except cfgmod.ConfigError as e:
            raise ValueError(f"cell {cell.name}: {e}") from None
        h, w, c = spec.network.input_shape
        if tuple(info.image_shape) != (h, w, c):
            _fail(f"--dataset {faces}: images {'x'.join(map(str, info.image_shape))}, the network of cell {cell.name} "
                  f"takes {h}x{w}x{c} (cotsdl prepare-data faces --size {h} {w})")
        recipe = None
        if base_recipe or cell.recipe_settings():
            recipe = {"count": args.data_count, "size": [h, w], "channels": c, "seed": args.data_seed,
                      "face_fraction": 0.0, **base_recipe, **cell.recipe_settings()}
            data = data_dir / grid.recipe_name(recipe["count"], (h, w), c, recipe["seed"], recipe["face_fraction"])
            recipes[data] = recipe
        else:
            data = Path(spec.data.file)
            if not data.is_file():
                _fail(f"data.file {data} (cell {cell.name}): no such file")
        sets = sets + [f"data.file={_toml(data)}", f"run.folder={_toml(folder)}"]
        try:
            spec = run_spec.read(args.config, sets)
        except cfgmod.ConfigError as e:
            raise ValueError(f"cell {cell.name}: {e}") from None
        err = spec.parallel.error(args.ranks, f"cell {cell.name}")
        if err:
            _fail(err + " (--ranks)")
        job = Job(cell.name, folder, sets, cell=cell)
        if args.control_data or args.control_nofaces:
            job.control = _control(args, cell, base_sets, recipe, data_dir, (h, w, c), controls, recipes, out)
        jobs.append(job)
    return Plan(jobs, list(controls.values()), keys, out, recipes)


def _control(args, cell, base_sets, recipe, data_dir, shape, controls, recipes, out) -> Job:
    """The no-face control of ``cell``: its settings but the data's recipe, trained on face-free data."""
    h, w, c = shape
    if args.control_data:
        data = Path(args.control_data)
    else:
        r = recipe or {"count": args.data_count, "seed": args.data_seed}
        rec = {"count": r["count"], "size": [h, w], "channels": c, "seed": r["seed"], "no_faces": True}
        data = data_dir / grid.recipe_name(rec["count"], (h, w), c, rec["seed"], no_faces=True)
        recipes[data] = rec
    model = cell.model_texts()
    name = grid.slug(model) + "__" + data.stem
    if name not in controls:
        folder = out / "controls" / name
        sets = base_sets + [f"{k}={t}" for k, t in model.items()] + [f"data.file={_toml(data)}",
                                                                       f"run.folder={_toml(folder)}"]
        try:
            run_spec.read(args.config, sets)
        except cfgmod.ConfigError as e:
            raise ValueError(f"control {name}: {e}") from None
        controls[name] = Job(name, folder, sets)
    return controls[name]


def _toml(path: Path) -> str:
    return json.dumps(str(path))  # a TOML basic string


# -- running ---------------------------------------------------------------------------------------

def _launcher(ranks: int, slurm: bool) -> list[str]:
    """The MPI launcher of a child command: srun inside a Slurm job's element, else mpiexec."""
    if slurm:
        return ["srun", f"--mpi={os.environ.get('COTSDL_SRUN_MPI', 'pmi2')}", "--kill-on-bad-exit=0",
                f"--ntasks={ranks}", f"--cpus-per-task={os.environ.get('SLURM_CPUS_PER_TASK', '1')}",
                sys.executable, "-m", "mpi4py", "-m", "cotsdl"]
    beside = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(beside) if beside.exists() else shutil.which("mpiexec")
    if mpiexec is None:
        raise ValueError("no mpiexec beside python or on PATH: install the [mpich] extra or load your MPI")
    return [mpiexec, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "cotsdl"]


def _child(cmd: list[str]) -> int:
    """Run ``cmd``, passing a first SIGTERM/SIGUSR1 on as SIGUSR1 (its ranks checkpoint and exit 75);
    a second one ends it.  Returns its exit status."""
    proc = subprocess.Popen(cmd)
    got: list[int] = []

    def forward(signum, frame):
        got.append(signum)
        try:
            proc.send_signal(signal.SIGUSR1 if len(got) == 1 else signal.SIGTERM)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        while True:
            try:
                status = proc.wait()
                break
            except KeyboardInterrupt:  # Ctrl-C reached the child too (same process group): wait for it
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return status if status >= 0 else 128 - status


def _trained(job: Job) -> bool:
    return (job.folder / "summary.json").is_file()


def _train(job: Job, args, slurm: bool, say) -> tuple[int, float]:
    t0 = time.perf_counter()
    cmd = _launcher(args.ranks, slurm) + ["train", args.config] + [x for s in job.sets for x in ("--set", s)]
    say(f"  {shlex.join(cmd)}")
    return _child(cmd), time.perf_counter() - t0


def _evaluate(job: Job, args, slurm: bool, say) -> tuple[int, float]:
    t0 = time.perf_counter()
    cmd = _launcher(args.ranks, slurm) + ["evaluate", str(job.folder), "--dataset", args.dataset,
                                          "--splits", str(args.splits), "--bootstrap", str(args.bootstrap),
                                          "--stimulus-steps", str(args.stimulus_steps)]
    if job.control is not None:
        cmd += ["--control-run", str(job.control.folder)]
    if args.no_figures:
        cmd.append("--no-figures")
    say(f"  {shlex.join(cmd)}")
    return _child(cmd), time.perf_counter() - t0


def _record_path(p: Plan, job: Job) -> Path:
    return p.out / "cells" / f"{job.name}.json"


def _evaluation(args) -> dict[str, Any]:
    """The evaluation settings a cell's record keeps (a change evaluates it again)."""
    return {"dataset": str(Path(args.dataset).resolve()), "splits": args.splits, "bootstrap": args.bootstrap,
            "stimulus_steps": args.stimulus_steps}


def _finished(p: Plan, job: Job, args) -> bool:
    """The cell was evaluated as this command asks (the same settings, control and evaluation)
    after its training ended."""
    try:
        rec = json.loads(_record_path(p, job).read_text())
        report = json.loads((job.folder / "report.json").read_text())
    except (OSError, ValueError):
        return False
    want = str(job.control.folder) if job.control else None
    return (rec.get("control_run") == want and report["run"].get("control_run") == want
            and rec.get("sets") == job.sets and rec.get("evaluation") == _evaluation(args))


def _build_data(p: Plan, say) -> None:
    from ..io import builders  # noqa: PLC0415

    for path, recipe in p.recipes.items():
        if path.is_file():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        builders.natural(path, **recipe)
        say(f"[study] built {path} ({', '.join(f'{k}={v}' for k, v in recipe.items())}) in "
            f"{time.perf_counter() - t0:.1f} s")


def _check_data(p: Plan) -> None:
    missing = [str(d) for d in p.recipes if not d.is_file()]
    if missing:
        _fail(f"the study's data sets are not built: {', '.join(missing)} (cotsdl study --submit builds them)")


def _run_cell(p: Plan, job: Job, args, slurm: bool, say) -> int:
    """Train the cell (and its control when it is not trained), evaluate it, record it, aggregate."""
    t0 = time.perf_counter()
    record: dict[str, Any] = {"run": str(job.folder), "control_run": str(job.control.folder) if job.control else None,
                              "settings": job.cell.settings, "sets": job.sets, "evaluation": _evaluation(args)}
    if job.control is not None and not _trained(job.control):
        if slurm:
            _fail(f"control {job.control.folder} is not trained: the controls array did not finish")
        say(f"[study] control {job.control.name}: training (the no-face network of this cell's settings)")
        status, record["control_seconds"] = _train(job.control, args, slurm, say)
        if status:
            return _stopped(status, f"control {job.control.name}", job.control.folder, say)
    status, record["train_seconds"] = _train(job, args, slurm, say)
    if status:
        return _stopped(status, f"cell {job.name}", job.folder, say)
    status, record["evaluate_seconds"] = _evaluate(job, args, slurm, say)
    if status:
        return _stopped(status, f"cell {job.name} (evaluate)", job.folder, say)
    record["wall_seconds"] = time.perf_counter() - t0
    _record_path(p, job).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(_record_path(p, job), json.dumps(record, indent=2, default=str) + "\n")
    return 0


def _stopped(status: int, what: str, folder: Path, say) -> int:
    if status == EXIT_REQUEUE:
        say(f"[study] {what}: stopped after a checkpoint; run the same command again to resume")
    else:
        say(f"[study] {what}: failed with status {status} (see {folder / 'log.txt'} and the output above)")
    return status


def aggregate(p: Plan, args) -> dict[str, Path]:
    """Rewrite study.json, study.md and study.png from every finished cell (under a lock: the
    elements of a job array finish at any time)."""
    import fcntl  # noqa: PLC0415

    rows = []
    p.out.mkdir(parents=True, exist_ok=True)
    with open(p.out / ".study.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for job in p.cells:
            if _finished(p, job, args):
                rec = json.loads(_record_path(p, job).read_text())
                rows.append(grid.row(job.cell, json.loads((job.folder / "report.json").read_text()), rec))
        meta = {"config": args.config, "set": args.set, "dataset": args.dataset, "ranks": args.ranks,
                "control": args.control_data or ("nofaces recipe" if args.control_nofaces else None),
                "data_sets": {str(k): v for k, v in p.recipes.items()},
                "evaluate": {"splits": args.splits, "bootstrap": args.bootstrap}}
        return grid.write(p.out, rows, p.keys, len(p.cells), meta, figures=not args.no_figures)


def run(args) -> int:
    """Run a parsed ``study`` command (one process; its children are the MPI jobs)."""
    say = lambda m: print(m, flush=True)  # noqa: E731
    p = plan(args)
    if args.array_part is not None:
        return _element(p, args, say)
    if args.print_array or args.submit:
        _build_data(p, say)
        return _array(p, args, say)
    _build_data(p, say)
    t_all = time.perf_counter()
    for k, job in enumerate(p.cells, 1):
        if _finished(p, job, args):
            say(f"[study] cell {k}/{len(p.cells)} {job.name}: finished before, skipped")
            continue
        say(f"[study] cell {k}/{len(p.cells)} {job.name}: started")
        t0 = time.perf_counter()
        status = _run_cell(p, job, args, False, say)
        if status:
            return status
        paths = aggregate(p, args)
        say(f"[study] cell {k}/{len(p.cells)} {job.name}: finished in {time.perf_counter() - t0:.1f} s "
            f"({_summary(job)}; {time.perf_counter() - t_all:.0f} s since the study started)")
    paths = aggregate(p, args)
    say(f"[study] {len(p.cells)} cell(s) done: {paths['md']} (numbers: {paths['json']}"
        + (f"; figure: {paths['figure']})" if "figure" in paths else ")"))
    return 0


def _summary(job: Job) -> str:
    r = json.loads((job.folder / "report.json").read_text())
    iv = r["intervals"]["network"]
    return f"best neuron {iv['score']:.3f} [{iv['ci_low']:.3f}, {iv['ci_high']:.3f}]"


# -- Slurm job arrays --------------------------------------------------------------------------------

def _study_args(args) -> list[str]:
    """This command's study options for the array's elements, with absolute paths (they run from the checkout)."""
    a = lambda s: str(Path(s).resolve())  # noqa: E731
    out = [a(args.config)] + [x for v in args.vary for x in ("--vary", v)] + [x for s in args.set for x in ("--set", s)]
    out += ["--dataset", a(args.dataset), "--out", a(args.out), "--ranks", str(args.ranks),
            "--data-dir", a(args.data_dir or Path(args.out) / "data"), "--data-count", str(args.data_count),
            "--data-seed", str(args.data_seed), "--splits", str(args.splits), "--bootstrap", str(args.bootstrap),
            "--stimulus-steps", str(args.stimulus_steps)]
    if args.control_data:
        out += ["--control-data", a(args.control_data)]
    if args.control_nofaces:
        out.append("--control-nofaces")
    if args.no_figures:
        out.append("--no-figures")
    return out


def _sbatch(p: Plan, args, part: str, n: int, depend: str | None) -> list[str]:
    """The sbatch command of one job array (submitted from the checkout, ``ROOT``)."""
    name = args.job_name or f"cotsdl-study-{p.out.resolve().name}"
    logs = p.out.resolve() / "slurm"
    cmd = ["sbatch", "--parsable", f"--job-name={name}-{part}", f"--array=0-{n - 1}", "--nodes=1",
           f"--ntasks={args.ranks}", f"--output={logs}/%x-%A_%a.out"]
    if depend:
        cmd.append(f"--dependency=afterok:{depend}")
    cmd += args.sbatch_option + [str(ROOT / "jobs" / "slurm" / "study.sbatch")] + _study_args(args)
    return cmd + ["--array-part", part]


def _array(p: Plan, args, say) -> int:
    script = ROOT / "jobs" / "slurm" / "study.sbatch"
    if not script.is_file():
        _fail(f"{script} not found: --print-array/--submit need a checkout of cotsdl (jobs/slurm/study.sbatch)")
    (p.out / "slurm").mkdir(parents=True, exist_ok=True)
    ctl = _sbatch(p, args, "controls", len(p.controls), None) if p.controls else None
    cells = _sbatch(p, args, "cells", len(p.cells), "$CONTROLS" if ctl else None)
    if args.print_array:  # from the checkout: the job script runs in its submission folder
        say(f"cd {shlex.quote(str(ROOT))}")
        if ctl:
            say("CONTROLS=$(" + shlex.join(ctl) + ")")
        say(shlex.join(cells).replace("'--dependency=afterok:$CONTROLS'", '"--dependency=afterok:$CONTROLS"'))
        return 0
    depend = None
    if ctl:
        depend = _submit(ctl, say)
        cells = [c.replace("$CONTROLS", depend) for c in cells]
    job = _submit(cells, say)
    say(f"[study] submitted: {len(p.controls)} control(s){f' (job {depend})' if depend else ''} and "
        f"{len(p.cells)} cell(s) (job {job}); logs in {p.out / 'slurm'}; each finished cell rewrites "
        f"{p.out / 'study.json'}")
    return 0


def _submit(cmd: list[str], say) -> str:
    say(f"[study] {shlex.join(cmd)}")
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    except FileNotFoundError:
        raise ValueError("sbatch not found: --submit needs Slurm (--print-array prints the commands)") from None
    if res.returncode:
        raise RuntimeError(f"sbatch failed ({res.returncode}): {res.stderr.strip()}")
    return res.stdout.strip().split(";")[0]


def _element(p: Plan, args, say) -> int:
    """One element of a job array: train a control, or train and evaluate a cell."""
    jobs = p.cells if args.array_part == "cells" else p.controls
    k = args.array_index
    if k is None or not 0 <= k < len(jobs):
        _fail(f"--array-index {k}: the {args.array_part} part has {len(jobs)} element(s) (0..{len(jobs) - 1})")
    _check_data(p)
    job = jobs[k]
    slurm = "SLURM_JOB_ID" in os.environ
    t0 = time.perf_counter()
    say(f"[study] {args.array_part} element {k} {job.name}: started")
    if args.array_part == "cells" and _finished(p, job, args):  # a requeued element, or a second --submit
        say(f"[study] cells element {k} {job.name}: finished before, skipped")
        aggregate(p, args)
        return 0
    if args.array_part == "controls":
        status, _ = _train(job, args, slurm, say)
        if status:
            return _stopped(status, f"control {job.name}", job.folder, say)
    else:
        status = _run_cell(p, job, args, slurm, say)
        if status:
            return status
        aggregate(p, args)
    say(f"[study] {args.array_part} element {k} {job.name}: finished in {time.perf_counter() - t0:.1f} s")
    return 0
