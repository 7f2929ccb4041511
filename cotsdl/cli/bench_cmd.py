"""``cotsdl bench …``: the benchmarks' options and entry points.

The options are declared here (building the parser must not start MPI); each benchmark's
work is in :mod:`cotsdl.bench`.  ``bench scaling`` reads a config file, so its entry
point is here too (the command line is the only reader of config files).
"""
from __future__ import annotations

import argparse

from ..backend import BACKENDS


def add_parser(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks (print a table; --json writes the numbers)")
    bsub = bench.add_subparsers(dest="bench", required=True)
    ex = bsub.add_parser("exchange", help="halo exchange vs MPI ping-pong of the same message sizes")
    ex.add_argument("--shape", type=int, nargs=4, metavar=("H", "W", "C", "N"), default=[256, 256, 16, 32],
                    help="global array shape (default: 256 256 16 32)")
    ex.add_argument("--halos", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="halo widths (default: 1 2 4 8 16)")
    ex.add_argument("--grid", type=int, nargs=2, metavar=("PY", "PX"), help="process grid (default: chosen for the shape)")
    ex.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ex.add_argument("--repeats", type=int, default=20)
    ex.add_argument("--warmup", type=int, default=3)
    ex.add_argument("--json", metavar="FILE", help="write the results as JSON (rank 0)")
    em = bsub.add_parser("emulator", help="fiber switches per second of the CUDA emulator (assembly vs ucontext)")
    em.add_argument("--blocks", type=int, default=8)
    em.add_argument("--threads", type=int, default=256)
    em.add_argument("--iters", type=int, default=200)
    em.add_argument("--json", metavar="FILE", help="write the results as JSON")
    la = bsub.add_parser("layers", help="filter/pool/LCN speed of the numpy backend vs the same run's sgemm")
    la.add_argument("--repeats", type=int, default=10)
    la.add_argument("--backend", choices=list(BACKENDS), default="numpy",
                    help="numpy (CPU), cuda (GPU kernels through CuPy) or cuda-emu (the kernels on the emulator)")
    la.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    la.add_argument("--threads", type=int, help="threads of the numpy backend (default: all cores)")
    la.add_argument("--min-time", type=float, default=0.2, help="seconds of repeats per operation at least (default 0.2)")
    la.add_argument("--shapes", metavar="NAMES", help="comma-separated shape names (default: all of the backend's, "
                    "e.g. A,B,C,D-blocks,P-paper for numpy)")
    la.add_argument("--peer", action="store_true",
                    help="also time the PyTorch (eager and compiled) and JAX formulations when importable, after "
                         "checking they compute the same function, and print speed ratios")
    la.add_argument("--json", metavar="FILE", help="write the results as JSON")
    sc = bsub.add_parser("scaling", help="training steps of a config on this many ranks: step time, images/s, "
                                         "compute vs exchange, overlap on and off (run under mpiexec -n P)")
    sc.add_argument("config", help="a training config (TOML); its network and batch are used")
    sc.add_argument("--steps", type=int, default=12, help="timed steps per setting (default 12)")
    sc.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    sc.add_argument("--rounds", type=int, default=6,
                    help="the timed steps of a setting in this many rounds, its overlap settings interleaved "
                         "(default 6)")
    sc.add_argument("--stage", type=int, default=0, help="the stage whose training step is timed (default 0)")
    sc.add_argument("--grid", type=int, nargs=2, metavar=("PY", "PX"), help="model grid (default: chosen)")
    sc.add_argument("--replicas", type=int, default=1, help="data-parallel replicas (default 1)")
    sc.add_argument("--overlap", choices=["on", "off", "both", "auto"], default="both",
                    help="halo/compute overlap (default: both, measured in the same run; every row also says what "
                         "parallel.overlap = \"auto\" chooses and, with both, how its step time compares with the "
                         "faster; auto: only what auto chooses)")
    sc.add_argument("--machine", metavar="FILE|PRESET", help="also print the planner's predicted step time "
                                                             "for this machine (a calibration file or a preset); "
                                                             "\"auto\" decides with it (default: ./machine.json "
                                                             "if there is one, as cotsdl train)")
    sc.add_argument("--json", metavar="FILE", help="write the results as JSON (rank 0)")
    ca = bsub.add_parser("calibrate", help="measure this machine (link latency and bandwidth, exchange, layer "
                                           "passes) and write the machine file `cotsdl plan` reads "
                                           "(run under mpiexec -n 2)")
    ca.add_argument("--repeats", type=int, default=5)
    ca.add_argument("--quick", action="store_true", help="fewer shapes and repeats (for tests)")
    ca.add_argument("--json", metavar="FILE", help="write the machine file here (default: print it only)")


def run(args: argparse.Namespace) -> int:
    return {"exchange": _exchange, "emulator": _emulator, "layers": _layers, "scaling": _scaling,
            "calibrate": _calibrate}[args.bench](args)


def _exchange(args) -> int:
    import numpy as np  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    from ..array.collective import agree, raise_collectively  # noqa: PLC0415
    from ..bench import common, exchange  # noqa: PLC0415

    comm = MPI.COMM_WORLD  # the program's world: the library itself always takes a communicator
    agree(comm, shape=args.shape, halos=args.halos, grid=args.grid, dtype=args.dtype, repeats=args.repeats,
          warmup=args.warmup, json=args.json)
    raise_collectively(comm, common.check_output_path(args.json) if comm.Get_rank() == 0 else None)
    res = exchange.run(comm, args.shape, args.halos, args.grid, np.dtype(args.dtype), args.repeats, args.warmup)
    if args.json and comm.Get_rank() == 0:
        common.write_json(args.json, res)
        print(f"wrote {args.json}")
    return 0


def _layers(args) -> int:
    import numpy as np  # noqa: PLC0415

    from .. import backend, ops  # noqa: PLC0415
    from ..bench import common, layers  # noqa: PLC0415

    err = common.check_output_path(args.json)
    if err is None and args.repeats < 1:
        err = f"--repeats must be >= 1, got {args.repeats}"
    if err:
        raise ValueError(err)
    if args.threads is not None:
        ops.set_num_threads(args.threads)
    backend.use(args.backend)
    res = layers.run(args.repeats, np.dtype(args.dtype), min_time=args.min_time, backend_name=args.backend,
                     peer=args.peer, shapes=args.shapes.split(",") if args.shapes else None)
    if args.json:
        common.write_json(args.json, res)
        print(f"wrote {args.json}")
    return 0


def _emulator(args) -> int:
    from ..bench import common, emulator  # noqa: PLC0415

    err = common.check_output_path(args.json)
    if err is None and (args.blocks < 1 or not 1 <= args.threads <= 1024 or args.iters < 1):
        err = f"need --blocks >= 1, 1 <= --threads <= 1024, --iters >= 1; got {args.blocks}, {args.threads}, {args.iters}"
    if err:
        raise ValueError(err)
    res = emulator.run(args.blocks, args.threads, args.iters)
    if args.json:
        common.write_json(args.json, res)
        print(f"wrote {args.json}")
    return 0


def _scaling(args) -> int:
    from mpi4py import MPI  # noqa: PLC0415

    from ..array.collective import agree, raise_collectively  # noqa: PLC0415
    from ..bench import common, scaling  # noqa: PLC0415
    from . import run as run_spec  # noqa: PLC0415
    from .train import setup_backend  # noqa: PLC0415

    comm = MPI.COMM_WORLD  # the program's world: the library itself always takes a communicator
    agree(comm, config=args.config, steps=args.steps, warmup=args.warmup, rounds=args.rounds, stage=args.stage,
          grid=args.grid, replicas=args.replicas, overlap=args.overlap, machine=args.machine, json=args.json)
    spec = run_spec.read_agreed(comm, args.config)
    network, tc = spec.network, spec.train
    err = common.check_output_path(args.json) if comm.Get_rank() == 0 else None
    if err is None and not (args.steps >= 1 and args.warmup >= 0 and args.replicas >= 1 and args.rounds >= 1):
        err = (f"need --steps >= 1, --warmup >= 0, --replicas >= 1, --rounds >= 1; got {args.steps}, {args.warmup}, "
               f"{args.replicas}, {args.rounds}")
    elif err is None and not 0 <= args.stage < len(network.stages):
        err = f"--stage must be in [0, {len(network.stages)}) for {args.config}, got {args.stage}"
    raise_collectively(comm, err)
    setup_backend(spec, comm)
    predict, err = None, None
    if args.machine:
        try:
            predict = _predictor(spec, args.machine, args.stage)
        except ValueError as e:  # every rank reads the same file: one agreed message
            err = str(e)
    raise_collectively(comm, err)
    decide = _decider(spec, args.machine, args.stage)
    warning = _load_warning(comm, args.machine)
    res = scaling.run(comm, network, tc.make_optimizer, batch=spec.global_batch,
                      stage=args.stage, steps=args.steps, warmup=args.warmup, rounds=args.rounds,
                      replicas=args.replicas, grid=tuple(args.grid) if args.grid else None,
                      overlaps={"on": (True,), "off": (False,), "both": (True, False),
                                "auto": ("auto",)}[args.overlap],
                      predict=predict, decide=decide, lam=tc.lam, tied=tc.tied, seed=tc.seed, dtype=tc.dtype)
    res["config"], res["machine"], res["load_warning"] = str(args.config), args.machine, warning
    if args.json and comm.Get_rank() == 0:
        common.write_json(args.json, res)
        print(f"wrote {args.json}")
    return 0


def _predictor(spec, machine_arg: str, stage: int):
    """The planner's step-time prediction for a setting, as ``scaling.run`` asks for it."""
    try:
        from .. import planner  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover - the planner ships with the package
        raise ValueError(f"--machine needs the run planner (cotsdl.planner), which does not import: {e}") from None
    machine = planner.load_machine(machine_arg)

    def predict(p, replicas, dims, overlap, ranks_per_node):
        return planner.predict_step(spec.network, spec.global_batch // replicas, p, dims, replicas, machine,
                                    stage=stage, dtype=spec.train.dtype.name,
                                    optimizer_slots=spec.train.optimizer_slots, ranks_per_node=ranks_per_node,
                                    tied=spec.train.tied, overlap=overlap)["seconds"]
    return predict


def _decider(spec, machine_arg: str | None, stage: int):
    """What ``parallel.overlap = "auto"`` chooses for a setting, as ``scaling.run`` asks for it: with
    ``--machine`` (checked already), else the machine ``cotsdl train`` decides with."""
    from .. import planner  # noqa: PLC0415
    from ..planner.overlap import model_machine  # noqa: PLC0415

    machine, why = (planner.load_machine(machine_arg), "") if machine_arg else model_machine()

    def decide(p, replicas, dims, ranks_per_node, group_on_one_node):  # as the trainer decides on those ranks
        return planner.choose_overlap(spec.network, spec.global_batch // replicas, p, dims, replicas, machine,
                                      stages=[stage], dtype=spec.train.dtype.name,
                                      optimizer_slots=spec.train.optimizer_slots, ranks_per_node=ranks_per_node,
                                      tied=spec.train.tied, no_machine=why, group_on_one_node=group_on_one_node)
    return decide


def _load_warning(comm, machine_arg: str | None) -> str | None:
    """The machine's load warning (``--machine``, else the one "auto" decides with), printed by rank 0
    before the steps are timed (collective; rank 0 measures the load for 0.5 s, the run's ranks not counted)."""
    from .. import planner  # noqa: PLC0415
    from ..array.collective import wait_idle  # noqa: PLC0415
    from ..planner import load  # noqa: PLC0415
    from ..planner.machine import load_warning  # noqa: PLC0415
    from ..planner.overlap import model_machine  # noqa: PLC0415

    pids, cpus = load.job_on_host(comm)
    warning = None
    if comm.Get_rank() == 0:
        machine = planner.load_machine(machine_arg) if machine_arg else model_machine()[0]
        warning = load_warning(machine, pids=pids, cpus=cpus, ranks_per_node=len(pids)) if machine else None
        if warning:
            print(warning, flush=True)
    wait_idle(comm)  # the others sleep: polling in a blocking call would take the cores rank 0 measures
    return comm.bcast(warning, root=0)


def _calibrate(args) -> int:
    from mpi4py import MPI  # noqa: PLC0415

    from ..array.collective import agree, raise_collectively  # noqa: PLC0415
    from ..bench import calibrate, common  # noqa: PLC0415

    comm = MPI.COMM_WORLD  # the program's world: the library itself always takes a communicator
    agree(comm, repeats=args.repeats, quick=args.quick, json=args.json)
    err = common.check_output_path(args.json) if comm.Get_rank() == 0 else None
    if err is None and args.repeats < 1:
        err = f"--repeats must be >= 1, got {args.repeats}"
    raise_collectively(comm, err)
    machine = calibrate.run(comm, args.repeats, args.quick)
    if comm.Get_rank() == 0:
        if args.json:
            common.write_json(args.json, machine)
            print(f"wrote {args.json}")
        else:
            import json  # noqa: PLC0415

            print(json.dumps(machine, indent=2))
    return 0
