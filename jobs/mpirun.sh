#!/bin/bash
# Train with a plain mpiexec/mpirun (no scheduler), with what the Slurm and PBS jobs add: a
# node watch that names a rank or node lost mid-run, one checkpoint request passed on to
# the ranks on SIGUSR1/SIGTERM, and the exit status explained:
#   bash jobs/mpirun.sh [LAUNCHER OPTIONS...] -- CONFIG [cotsdl train options...]
#   bash jobs/mpirun.sh -n 8 -f hosts -ppn 4 -- mine.toml --watchdog 120
# MPIEXEC names the launcher (default mpiexec).  Run it from the repository root (or
# anywhere: it changes there); it activates .venv and installs nothing (COTSDL_SKIP_ENV=1:
# the environment is already active).  Exit status: that of `cotsdl train` (0 done, 2 bad
# config, 75 checkpointed: run the same command again to resume), else the launcher's.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=jobs/lib/batch.sh
. jobs/lib/batch.sh
# No scheduler signals the ranks here: a SIGTERM to this script is passed on (as the checkpoint request).
: "${COTSDL_FORWARD_TERM:=1}"
cotsdl_trap_signals

opts=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
if [ $# -lt 2 ]; then
    echo "usage: bash jobs/mpirun.sh [LAUNCHER OPTIONS...] -- CONFIG [cotsdl train options...]" >&2
    exit 2
fi
shift
CONFIG=$1
shift
if [ ! -f "$CONFIG" ]; then
    cotsdl_log "config $CONFIG not found (relative paths start at the repository root)"
    exit 2
fi
COTSDL_MODULES=${COTSDL_MODULES-}
cotsdl_setup_env
export PYTHONUNBUFFERED=1
cotsdl_log "==== cotsdl train with ${MPIEXEC:-mpiexec} on $(hostname): config $CONFIG${*:+ $*}"
cotsdl_report_mpi
# No scheduler requeues here: a checkpointed run (75) is resumed by running the command again.
COTSDL_NO_REQUEUE="no scheduler: run the same command again to resume"
cotsdl_launch "${MPIEXEC:-mpiexec}" "${opts[@]}" python -m mpi4py -m cotsdl train "$CONFIG" "$@"
cotsdl_finish false
