#!/usr/bin/env bash
# The halo-exchange benchmark job on this machine: sets up .venv (first run
# only), then runs `cotsdl bench exchange` on RANKS (default 2) MPI ranks with the
# CPU backend and writes out/exchange.json.  (The training job is jobs/local.sh;
# the cluster versions of this benchmark are jobs/slurm/bench-exchange.sbatch and
# jobs/pbs/bench-exchange.pbs, see jobs/README.md.)
#   bash jobs/bench-exchange.sh [RANKS] [extra `cotsdl bench exchange` options]
set -euo pipefail
cd "$(dirname "$0")/.."
. jobs/env.sh
ranks=${1:-2}
shift || true
mkdir -p out
export MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-600}
echo "[cotsdl] mpiexec -n $ranks: cotsdl bench exchange --json out/exchange.json $*"
mpiexec -n "$ranks" python -m mpi4py -m cotsdl bench exchange --json out/exchange.json "$@"
