#!/usr/bin/env bash
# The main job, on a laptop or any one machine: sets up .venv (first run only), builds
# the datasets, trains the 2-stage network of jobs/configs/demo.toml on 2 MPI ranks
# with the CPU backend into runs/demo/, trains the same network on images without
# faces into runs/demo-nofaces/ and on images whose face views are LFW non-face views
# made the same way into runs/demo-matched/ (the evaluation's controls), then evaluates:
# which neuron detects faces best on held-out images, against the controls -> runs/demo/report.md.
#   bash jobs/local.sh [--fresh] [--ranks N] [--no-control] [extra `cotsdl train` options, e.g. --set train.steps=100]
# Run it again and it says the runs are complete (or resumes an interrupted one);
# --fresh deletes runs/demo*/ first.  Exit status: that of the failing command (README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
fresh=0
ranks=2
control=1
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --fresh) fresh=1 ;;
        --no-control) control=0 ;;
        --ranks) ranks=${2:?--ranks needs a number}; shift ;;
        --ranks=*) ranks=${1#--ranks=} ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) extra+=("$1") ;;
    esac
    shift
done
case "$ranks" in ''|*[!0-9]*|0) echo "jobs/local.sh: --ranks must be a positive integer, got '$ranks'" >&2; exit 2 ;; esac
t0=$(date +%s)
. jobs/env.sh
config=jobs/configs/demo.toml
run=runs/demo
nofaces=runs/demo-nofaces
matched=runs/demo-matched
mkdir -p data/demo
# The datasets: built once (deterministic; `rm data/demo/*.h5` to rebuild).
# Half of the training images are augmented views of 50 LFW faces; the evaluation's 400
# faces are views of the 50 other identities, which training never sees.
[ -f data/demo/natural.h5 ] ||
    cotsdl prepare-data natural data/demo/natural.h5 --count 4096 --size 32 32 --seed 0 --face-fraction 0.5
# Its LFW non-faces are the half that no training set uses (a faces.h5 from before the
# non-face split showed all 100, some of which the matched control trains on: rebuilt).
if [ -f data/demo/faces.h5 ] && ! python -c "import sys; from cotsdl.io.dataset import inspect
sys.exit('nonface_split' not in inspect('data/demo/faces.h5').recipe)"; then
    echo "[cotsdl] data/demo/faces.h5 predates the LFW non-face split: rebuilding it"; rm data/demo/faces.h5
fi
[ -f data/demo/faces.h5 ] ||
    cotsdl prepare-data faces data/demo/faces.h5 --size 32 32 --seed 0
if [ "$control" = 1 ] && [ ! -f data/demo/natural-nofaces.h5 ]; then
    cotsdl prepare-data natural data/demo/natural-nofaces.h5 --count 4096 --size 32 32 --seed 0 --no-faces
fi
# The matched control: the same crops as natural-nofaces.h5 but where natural.h5 has its
# face views, views of the other 50 LFW non-faces, with the same augmentation and draws.
if [ "$control" = 1 ] && [ ! -f data/demo/natural-matched.h5 ]; then
    cotsdl prepare-data natural data/demo/natural-matched.h5 --count 4096 --size 32 32 --seed 0 --no-faces \
        --nonface-fraction 0.5
fi
if [ "$fresh" = 1 ]; then
    for d in "$run" "$nofaces" "$matched"; do
        if [ -e "$d" ]; then echo "[cotsdl] --fresh: removing $d"; rm -rf "$d"; fi
    done
fi
export MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-1800}
train() {  # train RUN_FOLDER DATA_FILE: the demo network
    echo "[cotsdl] mpiexec -n $ranks python -m mpi4py -m cotsdl train $config --set data.file=$2 --set run.folder=$1 ${extra[*]:-}"
    local status=0
    mpiexec -n "$ranks" python -m mpi4py -m cotsdl train "$config" --set "data.file=$2" --set "run.folder=$1" \
        "${extra[@]}" || status=$?
    if [ "$status" = 75 ]; then
        echo "[cotsdl] interrupted after a checkpoint: run 'bash jobs/local.sh' again to resume"
    fi
    return "$status"
}
train "$run" data/demo/natural.h5
evaluate=(--dataset data/demo/faces.h5)
if [ "$control" = 1 ]; then
    train "$nofaces" data/demo/natural-nofaces.h5
    train "$matched" data/demo/natural-matched.h5
    evaluate+=(--control-run "$nofaces" --control-run "matched=$matched")
fi
echo "[cotsdl] mpiexec -n $ranks python -m mpi4py -m cotsdl evaluate $run ${evaluate[*]}"
mpiexec -n "$ranks" python -m mpi4py -m cotsdl evaluate "$run" "${evaluate[@]}"
echo "[cotsdl] job finished in $(( $(date +%s) - t0 )) s"
echo "[cotsdl] datasets: data/demo/natural.h5 (training), data/demo/faces.h5 (labeled, for evaluation)$(
    [ "$control" = 1 ] && echo ", data/demo/natural-nofaces.h5 and natural-matched.h5 (the controls' training sets)")"
echo "[cotsdl] runs: $run$([ "$control" = 1 ] && echo ", $nofaces and $matched") (config.toml, checkpoints/, metrics.jsonl, log.txt, summary.json)"
echo "[cotsdl] open $run/report.md first (figures in $run/figures/); bash jobs/local.sh --fresh trains again from the start"
