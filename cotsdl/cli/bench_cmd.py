"""``cotsdl bench …``: the benchmarks' options and entry points.

The options are declared here (building the parser must not start MPI); each benchmark's
work is in :mod:`cotsdl.bench`.  ``bench scaling`` reads a config file, so its entry
point is here too (the command line is the only reader of config files).
"""
from __future__ import annotations

import argparse
import functools
from dataclasses import replace
from pathlib import Path

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
                    "e.g. A,B,C,D-blocks,P-paper for numpy; also P-185m: the 185M-parameter paper network's first "
                    "layer on one rank, about a minute and 3 GB)")
    la.add_argument("--machine", metavar="FILE|PRESET",
                    help="also the run planner's time of every pass on this machine (a calibration file, e.g. "
                         "machine.json from `cotsdl bench calibrate`, or a preset), for a rank of this run's threads")
    la.add_argument("--peer", action="store_true",
                    help="also time the PyTorch (eager, F.unfold, compiled) and JAX formulations when importable, "
                         "after checking they compute the same function, and print speed ratios (with --backend "
                         "cuda: PyTorch on the same GPU, no JAX)")
    la.add_argument("--peer-compile", choices=["all", "filter", "none"],
                    help="the passes torch.compile runs for --peer: all, filter (the filter passes and the training "
                         "step) or none (default: all on the CPU, filter with --backend cuda)")
    la.add_argument("--peer-compile-budget", type=float, metavar="S",
                    help="no more torch.compile on a shape once its compiles took S seconds (default: no limit on "
                         "the CPU, 30 with --backend cuda)")
    la.add_argument("--json", metavar="FILE", help="write the results as JSON")
    gm = bsub.add_parser("gemm", help="the filter kernels' GEMM variants (registers, cp.async pipelines) against each "
                                      "other and the planner's model of each, on a GPU (--backend cuda)")
    gm.add_argument("--backend", choices=["cuda", "cuda-emu"], default="cuda",
                    help="cuda (a GPU through CuPy) or cuda-emu (two tiny shapes on the emulator: proves the path)")
    gm.add_argument("--shapes", metavar="NAMES", help="comma-separated shape names (default: paper,A,B,C,D-blocks; "
                    "also P-185m, the 185M-parameter network's first layer on one rank)")
    gm.add_argument("--variants", metavar="NAMES", help="comma-separated variants (default: all of "
                    "cotsdl.ops.cuda.filter.VARIANTS)")
    gm.add_argument("--repeats", type=int, default=8, help="interleaved rounds (default 8)")
    gm.add_argument("--min-time", type=float, default=0.1, help="seconds of calls per variant at least (default 0.1)")
    gm.add_argument("--json", metavar="FILE", help="write the results as JSON")
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
    st = bsub.add_parser("step", help="one stage's training step on one rank, eager and as a CUDA graph: step time, "
                                      "images/s, peak memory, beside the planner's prediction")
    st.add_argument("config", help="a training config (TOML); its network, batch and training settings are used "
                                   "(synthetic images: its data file is not read)")
    st.add_argument("--stage", type=int, default=0, help="the stage whose training step is timed (default 0)")
    st.add_argument("--steps", type=int, default=42, help="timed steps per setting (default 42)")
    st.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3, at least 3: the graph is "
                                                          "captured within them)")
    st.add_argument("--rounds", type=int, default=7, help="the timed steps in this many rounds, the settings "
                                                          "interleaved (default 7)")
    st.add_argument("--check-steps", type=int, default=5, help="steps both settings train from the same start "
                                                               "before the timing, their weights compared (default 5)")
    st.add_argument("--graph", choices=["on", "off", "both"], default="both",
                    help="the step's device work as a captured CUDA graph (cuda backend only; elsewhere reported "
                         "as not available), eagerly, or both (default)")
    st.add_argument("--backend", choices=list(BACKENDS), help="the backend (default: the config's run.backend)")
    st.add_argument("--machine", metavar="FILE|PRESET", help="the planner's step time and memory on this machine "
                    "(default: h100-ndr on the cuda backend, else ./machine.json if there is one)")
    st.add_argument("--json", metavar="FILE", help="write the results as JSON")
    fu = bsub.add_parser("fuse", help="one halo exchange per pool and LCN (parallel.fuse) against one per layer, "
                                      "in one run: step time, messages, prediction, break-even latency "
                                      "(run under mpiexec -n P)")
    fu.add_argument("config", help="a training config (TOML); its network and batch are used")
    fu.add_argument("--stage", type=int, help="the stage whose step is timed: the stages below it are fused "
                                              "(default: the top stage)")
    fu.add_argument("--steps", type=int, default=12, help="timed steps per setting (default 12)")
    fu.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    fu.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default 6)")
    fu.add_argument("--overlap", choices=["on", "off"], default="off", help="halo/compute overlap (default off)")
    fu.add_argument("--machine", metavar="FILE|PRESET",
                    help="also the planner's prediction of both and its break-even latency on this machine")
    fu.add_argument("--json", metavar="FILE", help="write the results as JSON (rank 0)")
    rd = bsub.add_parser("reduction", help="the replicas' gradient sum, flat vs two-level (parallel.reduction), "
                                           "alternating in one run (run under mpiexec -n P, P ranks on nodes)")
    rd.add_argument("--replicas", type=int, nargs="+", metavar="R",
                    help="replica counts, each splitting the ranks as training does (default: every divisor >= 2)")
    rd.add_argument("--mb", type=float, nargs="+", default=[], metavar="MB",
                    help="gradient sizes per rank in MB (10^6 bytes); default 1 and 16 without --config")
    rd.add_argument("--config", nargs="+", default=[], metavar="CONFIG",
                    help="also each stage's gradient per rank of these training configs, on the split")
    rd.add_argument("--stages", type=int, nargs="+", metavar="K", help="the configs' stages (default: all)")
    rd.add_argument("--rounds", type=int, default=8, help="rounds, flat and two-level alternating (default 8)")
    rd.add_argument("--calls", type=int, default=3, help="timed calls of each per round (default 3)")
    rd.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    rd.add_argument("--json", metavar="FILE", help="write the results as JSON (rank 0)")
    rr = bsub.add_parser("reader", help="the HDF5 reader's images/s per rank alone, and whether training steps "
                                        "wait for it, prefetch on and off (under mpiexec -n P)")
    rr.add_argument("config", help="a training config (TOML): its data, network, batch and parallel split")
    rr.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                    help="override a config key (e.g. data.file=..., run.backend=numpy)")
    rr.add_argument("--grid-ranks", type=int, metavar="Q",
                    help="the reader alone reads the windows of a Q-rank grid, world ranks 0..Q-1 at once "
                         "(default: the world's size)")
    rr.add_argument("--batches", type=int, default=6, help="minibatches read alone per rank (default 6)")
    rr.add_argument("--steps", type=int, default=0,
                    help="also this many training steps per stage and setting (prefetch on, off; default 0: none)")
    rr.add_argument("--rounds", type=int, default=2, help="rounds of the steps, the settings alternating (default 2)")
    rr.add_argument("--stages", type=int, nargs="+", metavar="K", help="stages whose steps are timed (default: all)")
    rr.add_argument("--json", metavar="FILE", help="write the results as JSON (rank 0)")
    ca = bsub.add_parser("calibrate", help="measure this machine (link latency and bandwidth, exchange, layer "
                                           "passes) and write the machine file `cotsdl plan` reads "
                                           "(run under mpiexec -n 2)")
    ca.add_argument("--repeats", type=int, default=5)
    ca.add_argument("--quick", action="store_true", help="fewer shapes and repeats (for tests)")
    ca.add_argument("--json", metavar="FILE", help="write the machine file here (default: print it only)")
    ca.add_argument("--config", metavar="CONFIG", action="append", default=[],
                    help="also time the passes of this config's network at its batch per replica, so that the "
                         "planner takes its layers' efficiencies from their own shapes (repeatable)")


def run(args: argparse.Namespace) -> int:
    return {"exchange": _exchange, "emulator": _emulator, "layers": _layers, "scaling": _scaling, "fuse": _fuse,
            "calibrate": _calibrate, "reduction": _reduction, "reader": _reader, "gemm": _gemm,
            "step": _step}[args.bench](args)


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
    return _written(args, res, comm)


def _layers(args) -> int:
    import numpy as np  # noqa: PLC0415

    from .. import ops  # noqa: PLC0415
    from ..bench import common, layers  # noqa: PLC0415

    err = common.check_output_path(args.json)
    if err is None and args.repeats < 1:
        err = f"--repeats must be >= 1, got {args.repeats}"
    if err is None and args.peer_compile_budget is not None and not args.peer_compile_budget >= 0:
        err = f"--peer-compile-budget must be >= 0 seconds, got {args.peer_compile_budget}"
    if err:
        raise ValueError(err)
    if args.threads is not None:
        ops.set_num_threads(args.threads)
    _use_backend(args.backend)
    machine = None
    if args.machine:
        from ..planner import load_machine  # noqa: PLC0415

        machine = load_machine(args.machine)
    res = layers.run(args.repeats, np.dtype(args.dtype), min_time=args.min_time, backend_name=args.backend,
                     peer=args.peer, shapes=args.shapes.split(",") if args.shapes else None, machine=machine,
                     peer_compile=args.peer_compile, peer_compile_budget=args.peer_compile_budget,
                     # each shape's results written at once: a device run stopped by its time limit keeps them
                     on_shape=(lambda partial: common.write_json(args.json, partial)) if args.json else None)
    return _written(args, res)


def _use_backend(name: str) -> None:
    """The bench's backend, and a one-line error (not a traceback) where it cannot run here."""
    from .. import backend  # noqa: PLC0415

    backend.use(name)
    if name == "cuda":
        try:
            backend.cupy_module()
        except ImportError as e:
            raise ValueError(f"--backend cuda: {e}") from None


def _gemm(args) -> int:
    from ..bench import common, gemm  # noqa: PLC0415
    from ..bench.layers import CPU_PAPER_185M, PAPER, SHAPES, TINY, _shape  # noqa: PLC0415
    from ..bench.gemm import EMU_PIPELINE  # noqa: PLC0415

    err = common.check_output_path(args.json)
    if err is None and args.repeats < 1:
        err = f"--repeats must be >= 1, got {args.repeats}"
    if err:
        raise ValueError(err)
    _use_backend(args.backend)
    known = [PAPER, CPU_PAPER_185M, TINY, EMU_PIPELINE] + SHAPES
    shapes = [_shape(s, known) for s in args.shapes.split(",")] if args.shapes else None
    res = gemm.run(args.backend, shapes, args.repeats, args.min_time,
                   variants=args.variants.split(",") if args.variants else None)
    return _written(args, res)


def _emulator(args) -> int:
    from ..bench import common, emulator  # noqa: PLC0415

    err = common.check_output_path(args.json)
    if err is None and (args.blocks < 1 or not 1 <= args.threads <= 1024 or args.iters < 1):
        err = f"need --blocks >= 1, 1 <= --threads <= 1024, --iters >= 1; got {args.blocks}, {args.threads}, {args.iters}"
    if err:
        raise ValueError(err)
    res = emulator.run(args.blocks, args.threads, args.iters)
    return _written(args, res)


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
    return _written(args, res, comm)


def _step(args) -> int:
    import os  # noqa: PLC0415

    from mpi4py import MPI  # noqa: PLC0415

    from ..array.collective import agree, raise_collectively  # noqa: PLC0415
    from ..bench import common, step  # noqa: PLC0415
    from . import run as run_spec  # noqa: PLC0415
    from .train import setup_backend  # noqa: PLC0415

    comm = MPI.COMM_WORLD  # the program's world: the library itself always takes a communicator
    agree(comm, config=args.config, stage=args.stage, steps=args.steps, warmup=args.warmup, rounds=args.rounds,
          check_steps=args.check_steps, graph=args.graph, backend=args.backend, machine=args.machine, json=args.json)
    spec = run_spec.read_agreed(comm, args.config)
    if args.backend:
        spec = replace(spec, backend=args.backend)
    network, tc = spec.network, spec.train
    err = common.check_output_path(args.json) if comm.Get_rank() == 0 else None
    if err is None and comm.Get_size() != 1:
        err = f"bench step runs on 1 rank, not {comm.Get_size()} (several ranks' step: cotsdl bench scaling)"
    elif err is None and not (args.steps >= 1 and args.warmup >= 0 and args.rounds >= 1 and args.check_steps >= 1):
        err = (f"need --steps >= 1, --warmup >= 0, --rounds >= 1, --check-steps >= 1; got {args.steps}, "
               f"{args.warmup}, {args.rounds}, {args.check_steps}")
    elif err is None and not 0 <= args.stage < len(network.stages):
        err = f"--stage must be in [0, {len(network.stages)}) for {args.config}, got {args.stage}"
    raise_collectively(comm, err)
    name = setup_backend(spec, comm)
    machine_arg = args.machine or ("h100-ndr" if name == "cuda" else "this" if os.path.isfile("machine.json") else None)
    predict, err = None, None
    if machine_arg:
        try:  # the whole prediction (time and memory) of one rank, one replica
            predict = functools.partial(_step_predictor(spec, machine_arg, args.stage), 1, 1, (1, 1), False, 1)
        except ValueError as e:  # a bad --machine: one agreed message
            err = str(e)
    raise_collectively(comm, err)
    res = step.run(comm, network, tc.make_optimizer, batch=spec.global_batch, stage=args.stage, steps=args.steps,
                   warmup=args.warmup, rounds=args.rounds, check_steps=args.check_steps, graph=args.graph,
                   predict=predict, machine=machine_arg, lam=tc.lam, tied=tc.tied, seed=tc.seed, dtype=tc.dtype,
                   filter_norm=tc.filter_norm)
    res["config"] = str(args.config)
    return _written(args, res, comm)


def _fuse(args) -> int:
    from mpi4py import MPI  # noqa: PLC0415

    from ..array.collective import agree, raise_collectively  # noqa: PLC0415
    from ..array.grid import placement, rank_nodes  # noqa: PLC0415
    from ..bench import common, fuse  # noqa: PLC0415
    from . import run as run_spec  # noqa: PLC0415
    from .train import setup_backend  # noqa: PLC0415

    comm = MPI.COMM_WORLD  # the program's world: the library itself always takes a communicator
    agree(comm, config=args.config, steps=args.steps, warmup=args.warmup, rounds=args.rounds, stage=args.stage,
          overlap=args.overlap, machine=args.machine, json=args.json)
    spec = run_spec.read_agreed(comm, args.config)
    network, tc = spec.network, spec.train
    stage = len(network.stages) - 1 if args.stage is None else args.stage
    err = common.check_output_path(args.json) if comm.Get_rank() == 0 else None
    if err is None and not (args.steps >= 1 and args.warmup >= 0 and args.rounds >= 1):
        err = f"need --steps >= 1, --warmup >= 0, --rounds >= 1; got {args.steps}, {args.warmup}, {args.rounds}"
    elif err is None and not 1 <= stage < len(network.stages):
        err = (f"--stage must be in [1, {len(network.stages)}) for {args.config} (the stages below it are fused), "
               f"got {stage}")
    machine = None
    if err is None and args.machine:
        try:
            from .. import planner  # noqa: PLC0415

            machine = planner.load_machine(args.machine)
        except ValueError as e:  # every rank reads the same file: one agreed message
            err = str(e)
    raise_collectively(comm, err)
    setup_backend(spec, comm)
    per_node, together = placement(rank_nodes(comm), comm.Get_size(), 1)  # (collective)

    def predict_on(m, fused, filters=()):  # the planner's step of ``stage`` on ``m``, ``fused`` stages (``filters``)
        from .. import planner  # noqa: PLC0415

        return planner.predict_step(network, spec.global_batch, comm.Get_size(), None, 1, m, stage=stage,
                                    dtype=tc.dtype.name, optimizer_slots=tc.optimizer_slots,
                                    ranks_per_node=per_node, tied=tc.tied, overlap=args.overlap == "on",
                                    fuse=fused, fuse_filter=filters)
    predict = None if machine is None else functools.partial(predict_on, machine)
    res = fuse.run(comm, network, tc.make_optimizer, batch=spec.global_batch, stage=stage, steps=args.steps,
                   warmup=args.warmup, rounds=args.rounds, overlap=args.overlap == "on", predict=predict,
                   lam=tc.lam, tied=tc.tied, seed=tc.seed, dtype=tc.dtype)
    if machine is not None and comm.Get_rank() == 0:
        below = tuple(range(stage))
        for key, filters, what in (("break_even", (), "fusing"), ("break_even_filter", below, "fusing the filter too")):
            be = res[key] = fuse.break_even(predict_on, machine, below, across=not together, filters=filters)
            alpha = be["break_even_alpha_s"]
            print(f"planner on {machine['name']}: {what} would win above {alpha * 1e6:.1f} us per message on its "
                  f"{be['link']} (now {be['alpha_s'] * 1e6:.1f} us)" if alpha and not be["wins_now"] else
                  f"planner on {machine['name']}: {what} wins already" if be["wins_now"] else
                  f"planner on {machine['name']}: {what} saves no message here; no latency makes it win")
    res["config"], res["machine"] = str(args.config), args.machine
    return _written(args, res, comm)


def _step_predictor(spec, machine_arg: str, stage: int):
    """The planner's prediction (``planner.predict_step``'s dict) for a setting
    ``(p, replicas, dims, overlap, ranks_per_node)`` of the config's step of ``stage``."""
    try:
        from .. import planner  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover - the planner ships with the package
        raise ValueError(f"--machine needs the run planner (cotsdl.planner), which does not import: {e}") from None
    machine = planner.load_machine(machine_arg)

    def predict(p, replicas, dims, overlap, ranks_per_node):
        return planner.predict_step(spec.network, spec.global_batch // replicas, p, dims, replicas, machine,
                                    stage=stage, dtype=spec.train.dtype.name,
                                    optimizer_slots=spec.train.optimizer_slots, ranks_per_node=ranks_per_node,
                                    tied=spec.train.tied, overlap=overlap)
    return predict


def _predictor(spec, machine_arg: str, stage: int):
    """The planner's step time for a setting, as ``scaling.run`` asks for it."""
    full = _step_predictor(spec, machine_arg, stage)
    return lambda *setting: full(*setting)["seconds"]


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


def _reduction(args) -> int:
    import numpy as np  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    from ..array.collective import agree, raise_collectively  # noqa: PLC0415
    from ..bench import common, reduction  # noqa: PLC0415
    from . import run as run_spec  # noqa: PLC0415

    comm = MPI.COMM_WORLD  # the program's world: the library itself always takes a communicator
    agree(comm, replicas=args.replicas, mb=args.mb, config=args.config, stages=args.stages, rounds=args.rounds,
          calls=args.calls, dtype=args.dtype, json=args.json)
    size = comm.Get_size()
    err = common.check_output_path(args.json) if comm.Get_rank() == 0 else None
    if err is None and any(not mb > 0 for mb in args.mb):
        err = f"--mb must be positive, got {args.mb}"
    raise_collectively(comm, err)
    itemsize = np.dtype(args.dtype).itemsize
    sizes: list = [(f"{mb:g} MB", int(mb * 1e6)) for mb in (args.mb or ([] if args.config else [1, 16]))]
    for path in args.config:
        spec = run_spec.read_agreed(comm, path)
        stages = args.stages if args.stages is not None else range(len(spec.network.stages))
        bad = [k for k in stages if not 0 <= k < len(spec.network.stages)]
        raise_collectively(comm, f"--stages {bad}: {path} has {len(spec.network.stages)} stage(s)" if bad else None)
        for k in stages:
            sizes.append((f"{Path(path).stem} stage {k}",
                          lambda group, index, net=spec.network, k=k, tied=spec.train.tied:
                          reduction.gradient_bytes(net, k, group, index, itemsize, tied)))
    replicas = args.replicas or [r for r in range(2, size + 1) if size % r == 0] or [1]
    res = reduction.run(comm, replicas, sizes, rounds=args.rounds, calls=args.calls, dtype=np.dtype(args.dtype))
    res["configs"] = list(args.config)
    return _written(args, res, comm)


def _reader(args) -> int:
    from mpi4py import MPI  # noqa: PLC0415

    from ..array.collective import agree, raise_collectively  # noqa: PLC0415
    from ..bench import common, reader  # noqa: PLC0415
    from . import run as run_spec  # noqa: PLC0415
    from .train import open_dataset, setup_backend  # noqa: PLC0415

    comm = MPI.COMM_WORLD  # the program's world: the library itself always takes a communicator
    agree(comm, config=args.config, set=args.set, grid_ranks=args.grid_ranks, batches=args.batches,
          steps=args.steps, rounds=args.rounds, stages=args.stages, json=args.json)
    spec = run_spec.read_agreed(comm, args.config, args.set)
    err = common.check_output_path(args.json) if comm.Get_rank() == 0 else None
    if err is None and args.steps:
        err = spec.parallel.error(comm.Get_size(), spec.source)
    raise_collectively(comm, err)
    setup_backend(spec, comm)
    dc, pc, tc = spec.data, spec.parallel, spec.train
    q = args.grid_ranks or comm.Get_size()
    dims = pc.grid if pc.grid is not None and pc.grid[0] * pc.grid[1] == q else None

    def source(prefetch: bool):  # as cotsdl train opens it (one collective verdict)
        return open_dataset(comm, "data.file", dc.file, spec.network.input_shape, dc.batch,
                            replace(dc, prefetch=prefetch))

    res = reader.run(comm, spec.network, source, dc.batch, grid_ranks=q, dims=dims, batches=args.batches,
                     steps=args.steps, rounds=args.rounds, stages=args.stages, make_optimizer=tc.make_optimizer,
                     replicas=pc.replicas, grid=pc.grid,
                     kw=dict(lam=tc.lam, tied=tc.tied, seed=tc.seed, dtype=tc.dtype, filter_norm=tc.filter_norm,
                             overlap=pc.overlap, reduction=pc.reduction))
    res["config"], res["set"] = str(args.config), list(args.set)
    return _written(args, res, comm)


def _calibrate(args) -> int:
    from mpi4py import MPI  # noqa: PLC0415

    from ..array.collective import agree, raise_collectively  # noqa: PLC0415
    from ..bench import calibrate, common  # noqa: PLC0415
    from . import run as run_spec  # noqa: PLC0415

    comm = MPI.COMM_WORLD  # the program's world: the library itself always takes a communicator
    agree(comm, repeats=args.repeats, quick=args.quick, json=args.json, config=args.config)
    err = common.check_output_path(args.json) if comm.Get_rank() == 0 else None
    if err is None and args.repeats < 1:
        err = f"--repeats must be >= 1, got {args.repeats}"
    raise_collectively(comm, err)
    extra = []
    for path in args.config:  # every rank reads it: one agreed error naming the file and key
        spec = run_spec.read_agreed(comm, path)
        extra.append(calibrate.config_case(Path(path).stem, spec.network, spec.data.batch))
    machine = calibrate.run(comm, args.repeats, args.quick, extra=tuple(extra))
    if comm.Get_rank() == 0:
        if args.json:
            common.write_json(args.json, machine)
            print(f"wrote {args.json}")
        else:
            import json  # noqa: PLC0415

            print(json.dumps(machine, indent=2))
    return 0


def _written(args, res, comm=None) -> int:
    """``res`` written to ``--json`` (by rank 0 of ``comm``, where the bench ran on several), and the
    command's status."""
    from ..bench import common  # noqa: PLC0415

    if args.json and (comm is None or comm.Get_rank() == 0):
        common.write_json(args.json, res)
        print(f"wrote {args.json}")
    return 0
