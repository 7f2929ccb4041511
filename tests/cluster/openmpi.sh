#!/usr/bin/env bash
# The multi-rank suite under a second MPI family: Debian's Open MPI (4.1) with mpi4py
# built against it, in its own environment (the MPICH wheel of .venv would shadow it):
#   bash tests/cluster/openmpi.sh [RANKS ...]        # default: 2 4
# Installs openmpi-bin and libopenmpi-dev where apt and root allow (else uses the Open
# MPI on PATH, or exits 77 saying why), makes .venv-openmpi (COTSDL_OMPI_VENV) once,
# builds mpi4py there with Open MPI's mpicc, then runs tests/mpi under
# `mpiexec --oversubscribe -n P` and an MPMD launch whose ranks disagree (it must end
# with one message, not hang).  About 3 minutes for the build, then ~1 and ~2.5
# minutes for 2 and 4 ranks on two cores: longer than CI's budget allows, so it is a
# command, not a CI stage.  tests/README.md lists what differs from MPICH.
set -euo pipefail
cd "$(dirname "$0")/../.."
log() { echo "[openmpi] $*"; }
skip() { log "skipped: $*"; exit 77; }

mpicc=$(command -v mpicc.openmpi || true)
if [ -z "$mpicc" ]; then
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || skip "no Open MPI here, and no root+apt to install it"
    log "installing openmpi-bin libopenmpi-dev"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/tmp/openmpi-apt.log 2>&1 || {
        apt-get update -qq >>/tmp/openmpi-apt.log 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >>/tmp/openmpi-apt.log 2>&1 \
            || skip "apt-get install failed: see /tmp/openmpi-apt.log"; }
    mpicc=$(command -v mpicc.openmpi)
fi
mpiexec=$(dirname "$mpicc")/mpiexec.openmpi
[ -x "$mpiexec" ] || mpiexec=$(command -v mpiexec.openmpi)

venv=${COTSDL_OMPI_VENV:-$PWD/.venv-openmpi}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -m mpi4py --mpi-lib-version 2>/dev/null | grep -q "Open MPI"; then
    log "making $venv: cotsdl[test,data] and mpi4py built with $mpicc"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -e ".[test,data]"
    MPI4PY_BUILD_MPICC=$mpicc "$venv/bin/python" -m pip install --quiet --no-binary=mpi4py --force-reinstall \
        --no-deps "$("$venv/bin/python" -m pip show mpi4py 2>/dev/null | awk '/^Version:/ {print "mpi4py==" $2}')"
fi
. "$venv/bin/activate"
log "MPI: $(python -m mpi4py --mpi-lib-version | tr -d '\0' | head -1)"

# Open MPI refuses to run as root unless told, and refuses more ranks than cores
# unless --oversubscribe (MPICH does both silently).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-900} OMP_NUM_THREADS=1
status=0
for P in "${@:-2 4}"; do
    for p in $P; do
        log "tests/mpi on $p rank(s)"
        timeout 1200 "$mpiexec" --oversubscribe -n "$p" python -m mpi4py tests/mpi_pytest.py tests/mpi -q || status=1
    done
done

log "an MPMD launch whose ranks run different commands ends with one message, not a hang"
tmp=$(mktemp -d)
python - "$tmp" <<'EOF'
import sys
import numpy as np
sys.path.insert(0, "tests")
from testkit import tiny_config
from cotsdl.io.dataset import write_dataset
write_dataset(f"{sys.argv[1]}/tiny.h5", np.random.default_rng(0).integers(0, 256, (40, 12, 12), dtype=np.uint8))
open(f"{sys.argv[1]}/c.toml", "w").write(tiny_config(f"{sys.argv[1]}/tiny.h5", f"{sys.argv[1]}/run", 4, 2))
EOF
set +e
out=$(timeout 120 "$mpiexec" --oversubscribe -n 1 python -m mpi4py -m cotsdl train "$tmp/c.toml" : \
      -n 1 python -m mpi4py -m cotsdl info 2>&1)
rc=$?
set -e
if [ "$rc" -eq 124 ] || ! grep -q "the ranks were started with different commands" <<< "$out"; then
    log "FAILED: status $rc: $out"
    status=1
else
    log "ok: status $rc, $(grep -c 'cotsdl: error' <<< "$out") error line(s)"
fi
rm -rf "$tmp"
[ "$status" -eq 0 ] && log "all passed" || log "FAILED"
exit "$status"
