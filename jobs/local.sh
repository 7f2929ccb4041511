#!/usr/bin/env bash
# The main job, on a laptop or any one machine: sets up .venv (first run only), builds
# the datasets, trains the 3-stage network of jobs/configs/demo.toml on 2 MPI ranks
# with the CPU backend into runs/demo/, and prints a summary.
#   bash jobs/local.sh [--fresh] [--ranks N] [extra `cotsdl train` options, e.g. --set train.steps=100]
# Run it again and it says the run is complete (or resumes an interrupted one);
# --fresh deletes runs/demo/ first.  Exit status: that of `cotsdl train` (README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
fresh=0
ranks=2
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --fresh) fresh=1 ;;
        --ranks) ranks=${2:?--ranks needs a number}; shift ;;
        --ranks=*) ranks=${1#--ranks=} ;;
        -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) extra+=("$1") ;;
    esac
    shift
done
case "$ranks" in ''|*[!0-9]*|0) echo "jobs/local.sh: --ranks must be a positive integer, got '$ranks'" >&2; exit 2 ;; esac
t0=$(date +%s)
. jobs/env.sh
config=jobs/configs/demo.toml
run=runs/demo
mkdir -p data/demo
# The datasets: built once (deterministic; `rm data/demo/*.h5` to rebuild).
[ -f data/demo/natural.h5 ] ||
    cotsdl prepare-data natural data/demo/natural.h5 --count 4096 --size 64 64 --seed 0 --mix-faces 40
[ -f data/demo/faces.h5 ] ||
    cotsdl prepare-data faces data/demo/faces.h5 --size 64 64 --seed 0
if [ "$fresh" = 1 ] && [ -e "$run" ]; then
    echo "[cotsdl] --fresh: removing $run"
    rm -rf "$run"
fi
export MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-1800}
echo "[cotsdl] mpiexec -n $ranks python -m mpi4py -m cotsdl train $config ${extra[*]:-}"
status=0
mpiexec -n "$ranks" python -m mpi4py -m cotsdl train "$config" "${extra[@]}" || status=$?
if [ "$status" = 75 ]; then
    echo "[cotsdl] interrupted after a checkpoint: run 'bash jobs/local.sh' again to resume"
elif [ "$status" = 0 ]; then
    if [ "$(stat -c %Y "$run/summary.json" 2>/dev/null || echo 0)" -lt "$t0" ]; then  # nothing trained now
        echo "[cotsdl] (bash jobs/local.sh --fresh trains it again from the start)"
    fi
    echo "[cotsdl] job finished in $(( $(date +%s) - t0 )) s"
    echo "[cotsdl] datasets: data/demo/natural.h5 (training), data/demo/faces.h5 (labeled, for evaluation)"
    echo "[cotsdl] run folder: $run (config.toml, checkpoints/, metrics.jsonl, log.txt, summary.json)"
fi
exit "$status"
