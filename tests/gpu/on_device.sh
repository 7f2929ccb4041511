#!/usr/bin/env bash
# The GPU checks in one go, on a machine with a CUDA device and CuPy but no network
# (a lent GPU machine, a cluster's GPU node):  bash tests/gpu/on_device.sh [STEP ...]
# Runs from a source checkout without installing (PYTHONPATH), with the python3 that holds
# CuPy.  Steps, in order of importance (each under its own time limit, so one hang costs
# only its step): env, kernels (tests/gpu/test_gpu_kernels.py), bench (cotsdl bench
# layers --backend cuda, JSON too), evaluate (tests/gpu/test_evaluate_gpu.py), mpi
# (tests/mpi/test_gpu_exchange.py on 2 ranks, where mpiexec exists), sanitizer
# (compute-sanitizer memcheck and racecheck on a few kernel cases, where installed), and
# demo, not run by default: the main job (jobs/local.sh) on the GPU, one rank: trains
# jobs/configs/demo.toml and its no-faces control with the cuda backend, evaluates, and
# copies report.md (the datasets: data/demo/, built here if missing; $DEMO_SET: more
# `cotsdl train` options).
# Logs go to $OUT (default ./gpu-out); the last lines printed are one status per step.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
# The numpy references run the numpy path: no native C++ build on this machine.
export COTSDL_NATIVE=${COTSDL_NATIVE:-0} COTSDL_KERNEL_CACHE=${COTSDL_KERNEL_CACHE:-/tmp/cotsdl-kernels}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MPIEXEC_TIMEOUT=60
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(env kernels bench evaluate mpi sanitizer)
summary=()
step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, remember the status
    local name=$1 limit=$2 t0=$SECONDS rc
    shift 2
    echo "== $name (limit ${limit}s): $*"
    timeout -k 5 "$limit" "$@" > >(tee "$OUT/$name.log") 2>&1
    rc=$?
    summary+=("$(printf '%-10s status %3d  %4ds' "$name" "$rc" $((SECONDS - t0)))")
}
KCASES='float32 and (case0 or case3 or case7)'
for s in "${steps[@]}"; do
    case $s in
    env) step env 60 bash -c "nvidia-smi; $PY -c 'import sys, numpy, cupy; print(sys.version); \
print(\"numpy\", numpy.__version__, \"cupy\", cupy.__version__, \"CUDA runtime\", cupy.cuda.runtime.runtimeGetVersion(), \
\"driver\", cupy.cuda.runtime.driverGetVersion())'; $PY -c 'from mpi4py import MPI; print(MPI.Get_library_version())'; \
command -v mpiexec compute-sanitizer g++ || true" ;;
    kernels) step kernels 180 "$PY" -m pytest tests/gpu/test_gpu_kernels.py -q -rfE -n 4 --timeout 150 ;;
    bench) step bench 200 "$PY" -m cotsdl bench layers --backend cuda --json "$OUT/layers-cuda.json" ;;
    evaluate) step evaluate 200 "$PY" -m pytest tests/gpu/test_evaluate_gpu.py -q -rfE -n 0 ;;
    mpi) if command -v mpiexec > /dev/null; then
            step mpi 90 mpiexec -n 2 "$PY" -m mpi4py tests/mpi_pytest.py tests/mpi/test_gpu_exchange.py -q -rfE
        else summary+=("mpi        skipped: no mpiexec"); fi ;;
    sanitizer) if command -v compute-sanitizer > /dev/null; then
            for tool in memcheck racecheck; do
                step "$tool" 120 compute-sanitizer --tool "$tool" --error-exitcode 9 "$PY" -m pytest \
                    tests/gpu/test_gpu_kernels.py -q -rfE -n 0 --timeout 110 -k "$KCASES"
            done
        else summary+=("sanitizer  skipped: no compute-sanitizer"); fi ;;
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
echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
