"""``cotsdl train CONFIG``: train a network from a config into a run folder, resumably.

A run folder holds ``config.toml`` (the resolved config), ``checkpoints/``,
``metrics.jsonl``, ``log.txt`` and, once every stage is trained, ``summary.json``.
Running the same command again on the folder resumes from its last complete
checkpoint (on any number of ranks), or says that the run is complete.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from ..io.atomic import as_error, write_atomic
from . import config as cfgmod
from . import run as run_spec
from .run import DataSpec, RunSpec
from .runfolder import Tee, acquire_lock, inspect_run, report, stage_lines, trim_metrics
from .signals import EXIT_REQUEUE, PreemptionGuard

def add_parser(sub) -> None:
    p = sub.add_parser(
        "train", help="train a network from a TOML config into its run folder (re-run to resume)",
        description="Train the stages of a network greedily from a TOML config. Run under MPI as "
                    "'mpiexec -n P python -m mpi4py -m cotsdl train CONFIG'. Re-running the same command resumes "
                    f"from the run folder's last checkpoint. On SIGTERM/SIGUSR1 every rank checkpoints at the next "
                    f"step and exits {EXIT_REQUEUE} (requeue). Exit statuses: 0 done, 2 bad config or data, "
                    f"{EXIT_REQUEUE} checkpointed on a signal, 1 training failed.",
        epilog=_registries())
    p.add_argument("config", help="TOML config (see README.md, 'Config files')")
    p.add_argument("--watchdog", type=float, default=600.0, metavar="SECONDS",
                   help="end the job, naming the ranks that stopped responding, when no training step completes "
                        "for this long (default 600; 0: off)")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config key, e.g. --set train.steps=[50,50,50] --set network.stages[0].filter.channels=8")


def _registries() -> str:
    """The optimizers and schedules a config may name (from their registries)."""
    from ..train import optim, schedules  # noqa: PLC0415 - no MPI

    def keys(table):
        return "; ".join(f"{name} ({', '.join(params) or 'no keys'})" for name, (_, params) in table.items())

    return (f"train.optimizer.kind: {keys(optim.OPTIMIZERS)}; every optimizer also takes "
            f"{', '.join(optim.COMMON)}. train.schedule.kind: {keys(schedules.SCHEDULES)}; every schedule also "
            f"takes {', '.join(schedules.COMMON)}.")


#: Settings the trainer compares with the checkpoint on resume (and logs, once each).
RESUME_KEYS = ("train.lam:", "train.filter_norm:", "train.optimizer.", "train.schedule.")


def setup_backend(spec: RunSpec, comm) -> str:
    from .. import backend, ops  # noqa: PLC0415
    from ..array.collective import raise_collectively, yield_waits  # noqa: PLC0415
    from ..array.grid import node_local_size, use_node_local_gpu  # noqa: PLC0415

    if spec.backend != "auto":
        backend.use(spec.backend)
    name = backend.name()
    if name == "cuda":
        err = None
        try:
            backend.cupy_module()
        except ImportError as e:
            err = f"run.backend = \"cuda\": {e}"
        raise_collectively(comm, err)
        use_node_local_gpu(comm)
    threads = spec.threads
    here = node_local_size(comm)
    if not threads:  # share the node's cores among its ranks (oversubscribed BLAS is many times slower)
        threads = max(1, ops.available_cores() // here)
    ops.set_num_threads(threads)
    # more ranks than cores on a node: a rank waiting for a message gives the core to the one that sends it
    yield_waits(here > ops.available_cores())
    return name


def _agreed(err: str | OSError | None) -> None:
    """Raise an error every rank holds (it was broadcast) on every rank: bad input (a message) or the
    machine's failure (an OSError, exit 1)."""
    from ..array.collective import agreed  # noqa: PLC0415 - MPI only for commands that use it

    if err:
        raise agreed(OSError(str(err)) if isinstance(err, OSError) else ValueError(err))


def run(args, guard: PreemptionGuard | None = None) -> int:
    """Run a parsed ``train`` command on every rank; returns the exit status (the same on every rank).

    ``guard``: the signal guard, installed by the caller before any stop signal could be delivered
    (``cotsdl.cli.main`` does); made here otherwise.  It is restored on return either way."""
    if guard is None:
        guard = PreemptionGuard()  # from the start: a signal during setup stops at the first step, checkpointed
    try:
        return _run(args, guard)
    finally:
        guard.restore()


def _run(args, guard: PreemptionGuard) -> int:
    from mpi4py import MPI  # noqa: PLC0415

    comm = MPI.COMM_WORLD  # the program's world; the library takes it as an argument
    t_start = time.perf_counter()
    # Everything the config alone decides is checked before any file is touched (one
    # reading on rank 0, broadcast: every rank trains the same config).
    spec = run_spec.read_agreed(comm, args.config, args.set)
    _agreed(spec.parallel.error(comm.Get_size(), spec.source))
    backend_name = setup_backend(spec, comm)
    from ..io.runlock import RunLock  # noqa: PLC0415

    lock = RunLock(spec.folder) if comm.Get_rank() == 0 else None  # rank 0 holds it for the run's life
    try:
        meta, err = None, None
        if lock is not None:
            err, meta = inspect_run(spec)
            if err is None and spec.folder.is_dir():
                err = acquire_lock(lock)
                if err is None:  # again, under the lock: what no other run can change any more
                    err, meta = inspect_run(spec)
        meta, err = comm.bcast((meta, err))
        _agreed(err)
        data = open_dataset(comm, "data.file", spec.data.file, spec.network.input_shape, spec.global_batch, spec.data)
        try:
            return _train(spec, data, meta, backend_name, guard, comm, t_start, lock, args.watchdog)
        finally:
            data.close()
    finally:
        if lock is not None:
            lock.release()


def open_dataset(comm, what: str, path, input_shape, batch: int | None, dc: DataSpec, labels: bool = False,
                 shuffle: bool | None = None):
    """Every rank opens the dataset and checks it against the network; one collective verdict."""
    from ..array.collective import raise_collectively  # noqa: PLC0415
    from ..io.dataset import check_for_network  # noqa: PLC0415
    from ..io.reader import HDF5Source  # noqa: PLC0415

    data, err = None, None
    try:
        data = HDF5Source(path, seed=dc.seed, shuffle=dc.shuffle if shuffle is None else shuffle,
                          preprocess=dc.preprocess, std_floor=dc.std_floor, prefetch=dc.prefetch)
        lcn = dc.input_lcn
        if lcn:  # whitening: the network sees locally contrast-normalized images
            from ..io.input_lcn import InputLCN  # noqa: PLC0415

            data = InputLCN(data, lcn["size"], lcn["sigma"], lcn["eps"])
        problems = check_for_network(data.info, input_shape, batch)
        if labels and data.info.labels is None:
            problems.append("no 'labels' (1 = face, 0 = distractor): make one with cotsdl prepare-data faces")
        if problems:
            err = f"{what} {path}: " + "; ".join(problems)
    except (ValueError, OSError) as e:
        err = f"{what}: {e}"
    if err is None:
        err = _same_file(comm, what, path)
    if err and data is not None:
        data.close()
    raise_collectively(comm, err)
    return data


def _same_file(comm, what: str, path) -> str | None:
    """Every rank must read the same file: its resolved path and content identity (size, mtime, a hash
    of its first MiB) agree, else the ranks and the difference are named (one allgather)."""
    import hashlib  # noqa: PLC0415

    from ..array.collective import differences  # noqa: PLC0415

    try:
        p = Path(path).resolve()
        st = p.stat()
        with open(p, "rb") as f:
            head = hashlib.sha256(f.read(1 << 20)).hexdigest()[:16]
        mine = (str(p), st.st_size, st.st_mtime_ns, head)
    except OSError as e:
        mine = (str(path), f"unreadable: {e.strerror or e}", None, None)
    said = differences(comm, mine, lambda e: f"{e[0]} (size {e[1]}, mtime_ns {e[2]}, first-MiB hash {e[3]})")
    return None if said is None else (f"{what}: the ranks do not read the same file ({said}); give every rank the same file (an absolute path, "
            "on a filesystem every node sees)")


def _train(spec: RunSpec, data, meta, backend_name, guard, comm, t_start, lock=None, watchdog: float = 0.0) -> int:
    from mpi4py import MPI  # noqa: PLC0415

    from ..array.collective import raise_collectively  # noqa: PLC0415

    root = comm.Get_rank() == 0
    tc, pc, network, source = spec.train, spec.parallel, spec.network, spec.source
    folder = spec.folder
    ckdir = folder / "checkpoints"
    global_batch = spec.global_batch
    if tc.steps is not None:
        steps = list(tc.steps)
    else:  # a resumed run keeps counting steps of the batch it started with
        gb = meta["batch"] * meta["replicas"] if meta else global_batch
        steps = [int(math.ceil(e * len(data) / gb)) for e in tc.epochs]
    last = len(network.stages) - 1
    if meta is not None and meta["stage"] == last and meta["stage_step"] >= steps[last]:
        if root:
            print(f"run {folder} is already complete: {len(network.stages)} stage(s) trained, global step "
                  f"{meta['step']} (checkpoint {meta['_path']}). To train longer raise train.steps; to start over "
                  "use a new run.folder.", flush=True)
            try:
                for line in stage_lines(json.loads((folder / "summary.json").read_text())):
                    print(line, flush=True)
            except (OSError, ValueError, KeyError):
                pass  # the summary is a courtesy: the checkpoint says the run is complete
        return 0

    err, log, old = None, sys.stdout, None
    if root:
        try:
            ckdir.mkdir(parents=True, exist_ok=True)
            if lock is not None and not lock.held:  # a new run folder: locked as soon as it exists
                err = acquire_lock(lock)
        except OSError as e:
            err = as_error(e, f"run.folder {folder}: cannot write: {e.strerror or e}")
    raise_collectively(comm, err)
    if root:
        try:
            old = (folder / "config.toml").read_text() if (folder / "config.toml").exists() else None
            trim_metrics(folder / "metrics.jsonl", meta["step"] if meta else 0)
            header = f"resolved config of the run in {folder} (from {source}); written by cotsdl train"
            write_atomic(folder / "config.toml", cfgmod.dumps(spec.config, header))
            log = Tee(folder / "log.txt")
        except OSError as e:
            err = as_error(e, f"run.folder {folder}: cannot write: {e.strerror or e}")
    raise_collectively(comm, err)
    say = (lambda m: print(m, file=log, flush=True)) if root else (lambda m: None)
    from .nodewatch import announce  # noqa: PLC0415

    herald = announce(comm.Get_rank(), comm.Get_size(), str(folder))  # where the job script runs a node watch
    if herald is not None:
        guard.on_exit = herald.bye  # a second signal is a chosen end, not a lost rank

    def abort(status: int) -> None:  # the watchdog's way out: said to the node watch first (not a lost node)
        if herald is not None:
            herald.bye(status)
        MPI.COMM_WORLD.Abort(status)

    dog, status = None, 1
    try:
        if watchdog > 0:
            from .watchdog import Watchdog  # noqa: PLC0415

            dog = Watchdog(folder / ".watchdog", comm.Get_rank(), comm.Get_size(), watchdog, abort,
                           say=lambda m: print(m, file=sys.stderr, flush=True)).start()

        def should_stop() -> bool:  # after every step, on every rank
            if dog is not None:
                dog.progress()
            return guard.requested()

        common = dict(checkpoint_every=tc.checkpoint_every, keep=tc.keep, log_every=tc.log_every,
                      metrics_file=str(folder / "metrics.jsonl"), max_bad_steps=tc.max_bad_steps, log=log,
                      should_stop=should_stop, overlap=pc.overlap, reduction=pc.reduction, fuse=pc.fuse,
                      fuse_filter=pc.fuse_filter, graph=spec.graph)
        status = _train_on(spec, data, meta, backend_name, guard, comm, t_start, log, say, common, steps, old)
        return status
    finally:
        if dog is not None:
            dog.stop()
        if herald is not None:
            herald.bye(status)


def _train_on(spec, data, meta, backend_name, guard, comm, t_start, log, say, common, steps, old) -> int:
    """The training itself, once the run folder is ready (``old``: its previous config.toml text)."""
    from mpi4py import MPI  # noqa: PLC0415

    from ..train import GreedyTrainer, TrainingInterrupted  # noqa: PLC0415

    root = comm.Get_rank() == 0
    dc, tc, pc, network, source, folder = spec.data, spec.train, spec.parallel, spec.network, spec.source, spec.folder
    ckdir, global_batch = folder / "checkpoints", spec.global_batch
    grid = pc.grid
    from ..array.grid import describe_nodes, node_names  # noqa: PLC0415

    layout = node_names(comm)  # (collective) which ranks share a node
    say(f"cotsdl train {source}: {comm.Get_size()} rank(s), backend {backend_name}, data {dc.file} "
        f"({len(data)} images {'x'.join(map(str, data.image_shape))}), global batch {global_batch}, "
        f"steps per stage {steps}, run folder {folder}")
    from ..array.collective import waits_yield  # noqa: PLC0415

    say(f"on {describe_nodes(layout)}" + ("; more ranks than cores on rank 0's node: waits for messages give the core away"
                                          if waits_yield() else ""))
    if root and meta is not None and old is not None:
        try:
            changed = cfgmod.diff(cfgmod.tomllib.loads(old), cfgmod.tomllib.loads(cfgmod.dumps(spec.config)))
        except cfgmod.tomllib.TOMLDecodeError:  # a hand-edited file: the note is not worth failing for
            changed = ["(the previous config.toml is not valid TOML)"]
        changed = [c for c in changed if not c.startswith(RESUME_KEYS)]  # the trainer reports those
        if changed:
            say("the config differs from the run's previous config.toml; from here on:\n  " + "\n  ".join(changed))
    try:
        if meta is None:
            tr = GreedyTrainer(network, data, tc.make_optimizer(), comm=comm, batch=dc.batch, replicas=pc.replicas,
                               grid=grid, lam=tc.lam, tied=tc.tied, seed=tc.seed, filter_norm=tc.filter_norm,
                               dtype=tc.dtype, checkpoint_dir=str(ckdir), **common)
        else:
            tr = GreedyTrainer.resume(str(ckdir), data, tc.make_optimizer(), comm=comm, batch=dc.batch,
                                      replicas=pc.replicas, grid=grid, lam=tc.lam, filter_norm=tc.filter_norm,
                                      changes_from="config", **common)
        say(f"grid {tr.decomposition.grid.dims[0]}x{tr.decomposition.grid.dims[1]} x {tr.replicas} replica(s); "
            f"overlap {'on' if tr.plan.overlap else 'off'} "
            + (f"(auto: {tr.overlap_reason})" if tr.overlap_reason else "(set in the config)")
            + (f"; gradient reduction {tr.reduction_reason}" if tr.replicas > 1 else "")
            + (f"; pool and LCN fused in stage(s) {', '.join(map(str, tr.plan.fuse))}" if tr.plan.fuse else "")
            + (f" (with the filter, frozen: {', '.join(map(str, tr.plan.fuse_filter))})" if tr.plan.fuse_filter else "")
            + (f"; fuse auto: {tr.fuse_reason}" if tr.fuse_reason and tr.decomposition.grid.comm.Get_size() > 1 else "")
            + (f"; steps launched: {tr.graph.describe()}" if spec.graph and tr.graph.reason else ""))
        tr.train(steps)
    except TrainingInterrupted as e:
        sig = comm.allreduce(guard.received or 0, op=MPI.MAX)
        import signal  # noqa: PLC0415

        say(f"stopped by {signal.Signals(sig).name if sig else 'a signal'} at global step {e.step}; "
            f"checkpoint {e.checkpoint}. Exit {EXIT_REQUEUE}: re-run the same command to resume.")
        if root:
            _session_record(meta["step"] if meta else 0, e.step)
        return EXIT_REQUEUE
    if spec.graph:  # how the steps went: a capture may have failed on some rank (then that rank ran eagerly)
        launched = comm.gather(tr.graph.describe(), root=0)
        say("steps launched: " + ("; ".join(f"rank {r}: {d}" for r, d in enumerate(launched))
                                  if root and len(set(launched)) > 1 else launched[0] if root else ""))
    if root:
        report(folder, network, tr, backend_name, comm.Get_size(), time.perf_counter() - t_start, say)
        log.close()
    return 0


def _session_record(start: int, stop: int) -> None:
    """For a job script (``COTSDL_SESSION_FILE``): the global steps where this session started and
    stopped, so that it can stop requeueing starts that make no progress (jobs/lib/batch.sh)."""
    import os  # noqa: PLC0415

    path = os.environ.get("COTSDL_SESSION_FILE")
    if path:
        try:
            write_atomic(path, f"{int(start)} {int(stop)}\n")  # one line a shell reads: START STOP
        except OSError as e:  # the job script then counts a start without progress: say why
            print(f"warning: cannot write COTSDL_SESSION_FILE {path}: {e}", file=sys.stderr, flush=True)
