#!/usr/bin/env bash
# PBS/Torque batch job: the halo-exchange benchmark over the site MPI.
#   qsub jobs/pbs.sh                     (edit the #PBS lines and the module names first)
#PBS -N cotsdl-exchange
#PBS -l select=2:ncpus=16:mpiprocs=4:ngpus=4
#PBS -l walltime=00:15:00
#PBS -j oe
set -euo pipefail
cd "${PBS_O_WORKDIR:-$(dirname "$0")/..}"
module load mvapich2 2>/dev/null || echo "[cotsdl] note: 'module load mvapich2' failed; using the MPI on PATH" >&2
export COTSDL_EXTRAS=${COTSDL_EXTRAS-}
. jobs/env.sh
mkdir -p out
mpiexec -n "$(wc -l < "$PBS_NODEFILE")" python -m mpi4py -m cotsdl bench exchange --json "out/exchange-${PBS_JOBID%%.*}.json"
