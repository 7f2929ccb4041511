"""cotsdl: large locally-connected sparse autoencoders trained by model parallelism over MPI.

The usual path: ``prepare-data`` (HDF5 images), ``inspect`` (is a file valid for a
config?), ``train CONFIG`` (a resumable run folder), ``evaluate RUN`` (face selectivity
with controls, figures and a report).

Run multi-rank commands as ``mpiexec -n P python -m mpi4py -m cotsdl ...`` so that
an exception on one rank aborts every rank instead of leaving the others waiting.
"""
from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    from .. import __version__  # noqa: PLC0415
    from . import evaluate, inspect_cmd, prepare, train  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="cotsdl", description=__doc__.split("\n\n")[0] + " " + " ".join(
        __doc__.split("\n\n")[1].split()).replace("``", "") + " Multi-rank: mpiexec -n P python -m mpi4py -m cotsdl COMMAND ...")
    p.add_argument("--version", action="version", version=f"cotsdl {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    prepare.add_parser(sub)
    inspect_cmd.add_parser(sub)
    train.add_parser(sub)
    evaluate.add_parser(sub)
    for name, issue, what in (("plan", "performance", "per-rank memory, FLOPs, halo bytes and predicted step time"),):
        sp = sub.add_parser(name, help=f"{what} (not implemented yet)",
                            description=f"cotsdl {name}: {what}. Not implemented in this version (it comes with "
                                        f"the {issue} work); it exits with status 2.")
        sp.add_argument("args", nargs="*", help="reserved")
    sub.add_parser("info", help="versions, MPI library, CUDA-aware MPI, kernel folder")
    ck = sub.add_parser("check-kernels", help="compile every CUDA kernel with NVRTC for sm_70/80/90; fail on errors or spills")
    from .. import check_kernels  # noqa: PLC0415 - no MPI, no GPU needed

    check_kernels.add_arguments(ck)
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
    la.add_argument("--backend", choices=["numpy", "cuda", "cuda-emu"], default="numpy",
                    help="numpy (CPU), cuda (GPU kernels through CuPy) or cuda-emu (the kernels on the emulator)")
    la.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    la.add_argument("--threads", type=int, help="threads of the numpy backend (default: all cores)")
    la.add_argument("--min-time", type=float, default=0.2, help="seconds of repeats per operation at least (default 0.2)")
    la.add_argument("--json", metavar="FILE", help="write the results as JSON")
    return p


def _info() -> int:
    from mpi4py import MPI  # noqa: PLC0415

    from .. import __version__, backend  # noqa: PLC0415
    from ..array.cudampi import cuda_aware_mpi  # noqa: PLC0415

    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 0:
        print(f"cotsdl {__version__}")
        print(f"MPI: {MPI.Get_library_version().splitlines()[0].strip()} ({comm.Get_size()} rank(s))")
        print(f"CUDA-aware MPI: {cuda_aware_mpi()}")
        print(f"kernel sources: {backend.cuda_dir()}")
        print(f"backend: {backend.name()} ({backend.device_count()} CUDA device(s))")
    return 0


def _bench_exchange(args) -> int:
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


def _bench_layers(args) -> int:
    import numpy as np  # noqa: PLC0415

    from .. import ops  # noqa: PLC0415
    from ..bench import common, layers  # noqa: PLC0415

    err = common.check_output_path(args.json)
    if err is None and args.repeats < 1:
        err = f"--repeats must be >= 1, got {args.repeats}"
    if err:
        raise ValueError(err)
    if args.threads is not None:
        ops.set_num_threads(args.threads)
    from .. import backend  # noqa: PLC0415

    backend.use(args.backend)
    res = layers.run(args.repeats, np.dtype(args.dtype), min_time=args.min_time, backend_name=args.backend)
    if args.json:
        common.write_json(args.json, res)
        print(f"wrote {args.json}")
    return 0


def _bench_emulator(args) -> int:
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "plan":
            raise ValueError(f"'cotsdl {args.command}' is not implemented in this version")
        if args.command == "evaluate":
            from . import evaluate  # noqa: PLC0415

            return _agreed_exit(evaluate.run(args))
        if args.command == "prepare-data":
            from . import prepare  # noqa: PLC0415

            return prepare.run(args)
        if args.command == "inspect":
            from . import inspect_cmd  # noqa: PLC0415

            return inspect_cmd.run(args)
        if args.command == "train":
            from . import train  # noqa: PLC0415

            return _agreed_exit(train.run(args))  # every rank returns the same status
        if args.command == "info":
            return _info()
        if args.command == "check-kernels":
            from .. import check_kernels  # noqa: PLC0415

            return check_kernels.run_args(args)
        if args.command == "bench" and args.bench == "exchange":
            return _bench_exchange(args)
        if args.command == "bench" and args.bench == "emulator":
            return _bench_emulator(args)
        if args.command == "bench" and args.bench == "layers":
            return _bench_layers(args)
    except (ValueError, RuntimeError, OSError) as e:
        # Validation is collective, so every rank arrives here with the same error:
        # report it once and let every rank exit non-zero (no rank is left waiting).
        rank, collective = _rank(), getattr(e, "collective", False)
        if rank == 0:
            print(f"cotsdl: error: {e}", file=sys.stderr, flush=True)
        elif not collective:  # raised on this rank alone: nobody else can say it
            print(f"cotsdl: error on rank {rank}: {e}", file=sys.stderr, flush=True)
        status = 2 if isinstance(e, ValueError) else 1
        return _agreed_exit(status) if collective else status
    return 1  # pragma: no cover - argparse rejects unknown commands


def _rank() -> int:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 0
    return mpi.COMM_WORLD.Get_rank()


def _agreed_exit(status: int) -> int:
    """End MPI cleanly for a status every rank reached together (a collective error, the
    checkpoint-and-requeue exit): under ``python -m mpi4py`` a non-zero exit otherwise
    aborts the job, which is right for an error on one rank but adds MPI_Abort noise to a
    planned stop.  Only call it when every rank returns the same status."""
    mpi = sys.modules.get("mpi4py.MPI")
    if status and mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Barrier()
        mpi.Finalize()
    return status


if __name__ == "__main__":
    raise SystemExit(main())
