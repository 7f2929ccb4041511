#!/usr/bin/env bash
# The whole test suite on a fresh machine with only Python 3:
#   bash tests/run.sh [extra pytest args]
# sets up .venv (jobs/env.sh), runs the serial suite with pytest, then the
# multi-rank suite under mpiexec -n 1, 2, 3, 4.  Every test has a timeout: a serial
# test past it fails alone (pytest-timeout, signal method) and the run goes on; under
# MPI the thread method ends a deadlocked rank and MPIEXEC_TIMEOUT bounds every
# mpiexec, so a deadlock fails that rank count in seconds instead of hanging.  Last, python -m tests.reliability.run injects faults
# (bad input, damaged checkpoints, kill -9, signals, a full disk, NaN gradients) and prints
# one summary line.  Then the nodes stage: ranks on 2 simulated nodes (network namespaces,
# tests/cluster/nodes-up.sh; root only, skipped with a line elsewhere) train like one node, and
# a node that dies mid-run is named and survived.  Then the cluster stage: a real Slurm (root and
# apt only; skipped with a line elsewhere) runs jobs/slurm/train.sbatch with requeues.
set -euo pipefail
cd "$(dirname "$0")/.."
. jobs/env.sh
export MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-900}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
status=0
echo "== compile check of every CUDA kernel (NVRTC, sm_70/80/90)"
python -m cotsdl check-kernels || status=1
echo "== native CPU kernels (built once here, so no suite pays the first build; cached per CPU)"
COTSDL_NATIVE=1 python -c "from cotsdl.ops.cpu import native; native.library()" || status=1
echo "== serial suite"
# in parallel worker processes (pytest-xdist; COTSDL_TEST_WORKERS=0 runs them in this process):
# most tests wait on subprocesses, so two workers on two cores nearly halve the wall time
python -m pytest tests --ignore=tests/mpi --ignore=tests/cluster --ignore=tests/nodes -n "${COTSDL_TEST_WORKERS:-auto}" "$@" || status=1
for P in 1 2 3 4; do
    echo "== multi-rank suite on $P rank(s)"
    mpiexec -n "$P" python -m mpi4py tests/mpi_pytest.py tests/mpi "$@" || status=1
done
echo "== reliability suite (fault injection under mpiexec on 2 and 4 ranks)"
python -m tests.reliability.run || status=1
# A stage whose setup script brings something up first: its exit 77 skips the stage (it said why).
pytest_args=("$@")
setup_stage() {  # setup_stage NAME TESTS SCRIPT [ARGS...]
    local name=$1 tests=$2 up=0
    shift 2
    bash "$@" || up=$?
    if [ "$up" -eq 77 ]; then
        echo "== $name skipped (the line above says why)"
    elif [ "$up" -ne 0 ]; then
        echo "$1 failed (status $up)" >&2
        status=1
    else
        python -m pytest "$tests" -n 0 "${pytest_args[@]}" || status=1
    fi
}
echo "== nodes stage (ranks on 2 simulated nodes: network namespaces on a bridge, tests/cluster/nodes-up.sh)"
setup_stage "nodes stage" tests/nodes tests/cluster/nodes-up.sh 2
echo "== cluster stage (jobs/slurm/train.sbatch on a real Slurm of one node and of two: tests/cluster/slurm-up.sh)"
setup_stage "cluster stage" tests/cluster tests/cluster/slurm-up.sh
if [ "$status" -ne 0 ]; then echo "== FAILED" >&2; else echo "== all suites passed"; fi
exit "$status"
