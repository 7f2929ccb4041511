#!/usr/bin/env bash
# The GPU checks in one go, on a machine with a CUDA device and CuPy but no network
# (a lent GPU machine, a cluster's GPU node):  bash tests/gpu/on_device.sh [STEP ...]
# Runs from a source checkout without installing (PYTHONPATH), with the python3 that holds
# CuPy (and PyTorch, for the peers).  Default steps, in order of importance, each under its
# own time limit and all within $BUDGET seconds (default 560: a step gets what is left, so a
# slow one costs only the steps after it):
#   env        the device, driver, CuPy, PyTorch, MPI
#   gemm       cotsdl bench gemm: the filter GEMM's variants (registers, cp.async pipelines)
#              against each other and the planner's model -> gemm.json
#   kernels    the GPU suite, tests/gpu/test_gpu_kernels.py (every kernel and variant vs numpy)
#   layers     cotsdl bench layers --backend cuda --peer: every pass beside PyTorch on the same
#              GPU, the paper layer first (its JSON is written after each shape) -> layers.json
#   step       cotsdl bench step: the demo's training step (stage 0) eager and as a CUDA graph
#              -> step-demo0.json
#   step-paper the 185M-parameter config's stage-0 step time and memory against cotsdl plan
#              -> step-paper0.json
#   racecheck  compute-sanitizer racecheck on the cp.async pipelines (where it works): a case of
#              13 chunks through the stage ring, and the 128 x 128 tile with a partial M tile
# Not by default: profile (the 185M network's stage-0 step under cProfile with every launch
# synchronous: which of the trainer's functions take its time; the top 60 in the log), evaluate
# (tests/gpu/test_evaluate_gpu.py), mpi (the two-rank exchange of
# CuPy arrays, tests/mpi/test_gpu_exchange.py), memcheck, and demo (the main job's training and
# evaluation on the GPU, one rank; $DEMO_SET: more `cotsdl train` options).
# COTSDL_COMMIT: the commit (and whether the tree was dirty) the caller sent, printed by env (a
# copied checkout's .git can name an older commit than the files it holds).
# Output: $OUT (default ./gpu-out) gets the JSON files, summary.txt and logs.tgz (one log per
# step), few files, so that a lent machine's limit on returned files keeps them all; the last
# lines printed are one status per step.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
LOGS=${LOGS:-/tmp/cotsdl-gpu-logs}
BUDGET=${BUDGET:-560}
mkdir -p "$OUT" "$LOGS"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
# The numpy references run the numpy path: no native C++ build on this machine.
export COTSDL_NATIVE=${COTSDL_NATIVE:-0} COTSDL_KERNEL_CACHE=${COTSDL_KERNEL_CACHE:-/tmp/cotsdl-kernels}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MPIEXEC_TIMEOUT=60
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(env gemm kernels step step-paper layers racecheck)
summary=()
step() {  # step NAME SECONDS COMMAND...: run with min(SECONDS, what the budget leaves), log to $LOGS/NAME.log
    local name=$1 limit=$2 t0=$SECONDS rc left
    shift 2
    left=$((BUDGET - SECONDS - 15))
    if [ "$left" -lt 20 ]; then
        summary+=("$(printf '%-12s skipped: the budget of %ss is spent' "$name" "$BUDGET")")
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name (limit ${limit}s, at ${SECONDS}s): $*"
    timeout -k 5 "$limit" "$@" > >(tee "$LOGS/$name.log") 2>&1
    rc=$?
    summary+=("$(printf '%-12s status %3d  %4ds' "$name" "$rc" $((SECONDS - t0)))")
}
KCASES='float32 and (case0 or case3 or case7)'
for s in "${steps[@]}"; do
    case $s in
    env) step env 40 bash -c "nvidia-smi; $PY -c 'import sys, numpy, cupy; print(sys.version); \
print(\"numpy\", numpy.__version__, \"cupy\", cupy.__version__, \"CUDA runtime\", cupy.cuda.runtime.runtimeGetVersion(), \
\"driver\", cupy.cuda.runtime.driverGetVersion())'; $PY -c 'import torch; print(\"torch\", torch.__version__, torch.cuda.is_available())'; \
$PY -c 'from mpi4py import MPI; print(MPI.Get_library_version())'; \
echo \"source: \${COTSDL_COMMIT:-unknown: set COTSDL_COMMIT, as a copied .git may be stale}\"; \
command -v mpiexec compute-sanitizer g++ || true" ;;
    gemm) step gemm 120 "$PY" -m cotsdl bench gemm --backend cuda --json "$OUT/gemm.json" ;;
    kernels) step kernels 100 "$PY" -m pytest tests/gpu/test_gpu_kernels.py -q -rfE -n 8 --timeout 100 ;;
    layers) step layers 240 "$PY" -m cotsdl bench layers --backend cuda --peer --peer-compile-budget 20 \
                --shapes paper,A,B,C,D-blocks --json "$OUT/layers.json" ;;
    step) step step-demo0 80 "$PY" -m cotsdl bench step jobs/configs/demo.toml --backend cuda --stage 0 \
              --graph both --machine h200-ndr --json "$OUT/step-demo0.json" ;;
    step-paper) step step-paper0 120 "$PY" -m cotsdl bench step jobs/configs/paper-185m.toml --backend cuda \
              --stage 0 --graph both --steps 21 --check-steps 4 --machine h200-ndr --json "$OUT/step-paper0.json" ;;
    profile) # where the 185M network's stage-0 step goes: every launch synchronous, so that the Python
             # profile charges each function with the device time of the kernels it launches
        step profile 150 env CUDA_LAUNCH_BLOCKING=1 "$PY" -m cProfile -o "$LOGS/step.prof" -m cotsdl bench step \
            jobs/configs/paper-185m.toml --backend cuda --stage 0 --graph off --steps 7 --rounds 7 --check-steps 1
        step profile-top 30 "$PY" -c "import pstats; s = pstats.Stats('$LOGS/step.prof'); s.sort_stats('cumulative'); \
s.print_stats('cotsdl/(train|nn|ops|array)', 60)" ;;
    racecheck) if command -v compute-sanitizer > /dev/null; then
            step racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 9 "$PY" -m pytest \
                tests/gpu/test_gpu_kernels.py -q -rfE -n 0 --timeout 55 -k "gemm_variants and (case0 or case1)"
        else summary+=("racecheck    skipped: no compute-sanitizer"); fi ;;
    evaluate) step evaluate 200 "$PY" -m pytest tests/gpu/test_evaluate_gpu.py -q -rfE -n 0 ;;
    mpi) if command -v mpiexec > /dev/null; then
            step mpi 90 mpiexec -n 2 "$PY" -m mpi4py tests/mpi_pytest.py tests/mpi/test_gpu_exchange.py -q -rfE
        else summary+=("mpi          skipped: no mpiexec"); fi ;;
    memcheck) if command -v compute-sanitizer > /dev/null; then
            step memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$PY" -m pytest \
                tests/gpu/test_gpu_kernels.py -q -rfE -n 0 --timeout 110 -k "$KCASES"
        else summary+=("memcheck     skipped: no compute-sanitizer"); fi ;;
    demo) mkdir -p data/demo
        [ -f data/demo/natural.h5 ] || "$PY" -m cotsdl prepare-data natural data/demo/natural.h5 --count 4096 \
            --size 32 32 --seed 0 --face-fraction 0.5
        [ -f data/demo/faces.h5 ] || "$PY" -m cotsdl prepare-data faces data/demo/faces.h5 --size 32 32 --seed 0
        [ -f data/demo/natural-nofaces.h5 ] || "$PY" -m cotsdl prepare-data natural data/demo/natural-nofaces.h5 \
            --count 4096 --size 32 32 --seed 0 --no-faces
        # shellcheck disable=SC2086
        step demo-train 240 "$PY" -m cotsdl train jobs/configs/demo.toml --set run.backend=cuda \
            --set run.folder=runs/gpu-demo ${DEMO_SET:-}
        # shellcheck disable=SC2086
        step demo-control 240 "$PY" -m cotsdl train jobs/configs/demo.toml --set run.backend=cuda \
            --set run.folder=runs/gpu-demo-nofaces --set data.file=data/demo/natural-nofaces.h5 ${DEMO_SET:-}
        step demo-eval 240 "$PY" -m cotsdl evaluate runs/gpu-demo --dataset data/demo/faces.h5 \
            --control-run runs/gpu-demo-nofaces
        cp runs/gpu-demo/report.md "$OUT/demo-report.md" 2>/dev/null || true ;;
    *) echo "unknown step $s" >&2; exit 2 ;;
    esac
done
tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
