#!/usr/bin/env bash
# The laptop job: sets up .venv (first run only), then runs the distributed
# halo-exchange benchmark on 2 MPI ranks with the CPU backend and writes
# out/exchange.json.  Until the training job lands this is the main job.
#   bash jobs/local.sh [RANKS] [extra `cotsdl bench exchange` options]
set -euo pipefail
cd "$(dirname "$0")/.."
. jobs/env.sh
ranks=${1:-2}
shift || true
mkdir -p out
export MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-600}
echo "[cotsdl] mpiexec -n $ranks: cotsdl bench exchange --json out/exchange.json $*"
mpiexec -n "$ranks" python -m mpi4py -m cotsdl bench exchange --json out/exchange.json "$@"
