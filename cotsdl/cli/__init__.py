"""cotsdl: large locally-connected sparse autoencoders trained by model parallelism over MPI.

The usual path: ``prepare-data`` (HDF5 images), ``inspect`` (is a file valid for a
config?), ``train CONFIG`` (a resumable run folder), ``evaluate RUN`` (face selectivity
with controls, figures and a report).

Run multi-rank commands as ``mpiexec -n P python -m mpi4py -m cotsdl ...`` so that
an exception on one rank aborts every rank instead of leaving the others waiting.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

from .. import stops


def _parser() -> argparse.ArgumentParser:
    from .. import __version__  # noqa: PLC0415
    from . import bench_cmd, evaluate, inspect_cmd, plan_cmd, prepare, study, train  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="cotsdl", description=__doc__.split("\n\n")[0] + " " + " ".join(
        __doc__.split("\n\n")[1].split()).replace("``", "") + " Multi-rank: mpiexec -n P python -m mpi4py -m cotsdl COMMAND ...")
    p.add_argument("--version", action="version", version=f"cotsdl {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    prepare.add_parser(sub)
    inspect_cmd.add_parser(sub)
    train.add_parser(sub)
    evaluate.add_parser(sub)
    study.add_parser(sub)
    plan_cmd.add_parser(sub)
    sub.add_parser("info", help="versions, MPI library, CUDA-aware MPI, kernel folder")
    ck = sub.add_parser("check-kernels", help="compile every CUDA kernel with NVRTC for sm_70/80/90; fail on errors or spills")
    from ..tools import check_kernels  # noqa: PLC0415 - no MPI, no GPU needed

    check_kernels.add_arguments(ck)
    bench_cmd.add_parser(sub)
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


def _launcher_number(*keys: str) -> int | None:
    """The first of these environment variables a launcher set to a number, without initializing MPI."""
    return next((int(os.environ[k]) for k in keys if os.environ.get(k, "").isdigit()), None)


def _launched_size() -> int:
    """The rank count a launcher announces (mpiexec of MPICH/MVAPICH2/Open MPI, srun); 1 when none does."""
    size = _launcher_number("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "PMIX_SIZE")
    if size is None and os.environ.get("SLURM_PROCID") is not None:
        size = _launcher_number("SLURM_NTASKS")
    return 1 if size is None else size


def _launched_rank() -> int:
    """This process's rank as the launcher announces it (0 when none does): who speaks before MPI starts."""
    rank = _launcher_number("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
    return 0 if rank is None else rank


def stop_on_signals() -> None:
    """The program's own handling of SIGTERM and SIGUSR1 (a scheduler's stop and warning), from its
    first line until a command installs its own (``train`` checkpoints, ``prepare-data`` cleans up):
    one message (rank 0) and status 128 + signal, by an exception, so that every ``finally`` runs and
    a file being written is removed, never left half-written.  Ctrl-C (SIGINT) is main's to report."""
    def stop(signum, frame):
        rank = _launched_rank()
        if rank:  # rank 0, signalled too, says it once and its exit ends the job (python -m mpi4py)
            import time  # noqa: PLC0415

            time.sleep(1.0)  # still here: the signal was this rank's alone, so it speaks for itself
        print(f"cotsdl: stopped by {signal.Signals(signum).name}{f' on rank {rank}' if rank else ''}; nothing "
              "was left half-written", file=sys.stderr, flush=True)
        stops.raise_stop(SystemExit(128 + signum))  # re-raised at the next progress update if a callback swallows it

    stops.clear()  # installed: no stop of an earlier call in this process (main() in a test) is pending
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, stop)
    # Held while the program imports (numpy, h5py, the commands): an exception raised inside an
    # extension module's import comes out as a confusing ImportError.  Delivered at _unblock().
    signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)


_HELD = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def _unblock() -> None:
    """Deliver a stop signal held since the start (it then stops the program here, cleanly)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)


def _same_command(argv: list[str] | None) -> None:
    """Under ``mpiexec`` every rank must run the same command: an MPMD launch (``-n 1 cotsdl train
    … : -n 1 cotsdl info``) would leave some ranks waiting forever.  One allgather at start."""
    if _launched_size() < 2 and "mpi4py.MPI" not in sys.modules:
        return  # not started by a launcher with several ranks: nothing to agree with
    if list(sys.argv[1:] if argv is None else argv)[:1] == ["study"]:
        return  # one process that starts MPI jobs itself (a Slurm batch step has SLURM_NTASKS, not ranks)
    from mpi4py import MPI as mpi  # noqa: PLC0415 - several ranks: MPI is needed to agree at all

    if not mpi.Is_initialized() or mpi.Is_finalized() or mpi.COMM_WORLD.Get_size() == 1:
        return
    from ..array.collective import agreed, differences  # noqa: PLC0415

    said = differences(mpi.COMM_WORLD, list(sys.argv[1:] if argv is None else argv),
                       lambda a: "cotsdl " + " ".join(a))
    if said is None:
        return
    raise agreed(ValueError(f"the ranks were started with different commands ({said}); start every rank "
                            "with the same command (cotsdl is not an MPMD program)"))


def main(argv: list[str] | None = None) -> int:
    """Run one command line; returns the exit status."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C where no command handles it: one line, not a traceback
        if _rank() == 0:
            print("cotsdl: interrupted (Ctrl-C); nothing was left half-written", file=sys.stderr, flush=True)
        return 130


def _main(argv: list[str] | None) -> int:
    try:  # before parsing: a rank whose arguments do not parse must not leave the others waiting
        _same_command(argv)
    except ValueError as e:
        if _rank() == 0:
            print(f"cotsdl: error: {e}", file=sys.stderr, flush=True)
        return _agreed_exit(2)
    args = _parser().parse_args(argv)
    from ..ops.cpu.allocator import tune_allocator  # noqa: PLC0415

    tune_allocator()  # a training process reuses its freed arrays (no page faults every step)
    guard = None
    if args.command == "train":
        # Before the held signals are delivered: a scheduler's SIGUSR1 that came while the ranks
        # started is then a checkpoint request like any other (every rank stops at the first step
        # with 75, and the job requeues) instead of this handler's exit 138, which under
        # ``python -m mpi4py`` aborted the job, so that a time-limit warning ended it unrequeued.
        from . import train  # noqa: PLC0415
        from .signals import PreemptionGuard  # noqa: PLC0415

        guard = PreemptionGuard()
    _unblock()  # the imports are done: a stop signal held until now takes effect here
    try:
        if args.command == "plan":
            from . import plan_cmd  # noqa: PLC0415

            return plan_cmd.run(args)
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
            return _agreed_exit(train.run(args, guard))  # every rank returns the same status
        if args.command == "study":
            from . import study  # noqa: PLC0415

            return study.run(args)  # one process: its training and evaluation are child MPI jobs
        if args.command == "info":
            return _info()
        if args.command == "check-kernels":
            from ..tools import check_kernels  # noqa: PLC0415

            return check_kernels.run_args(args)
        if args.command == "bench":
            from . import bench_cmd  # noqa: PLC0415

            return bench_cmd.run(args)
    except BrokenPipeError:  # `cotsdl plan … | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
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
