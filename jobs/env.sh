# Source me: make sure the project's virtual environment exists and is current,
# then activate it.  Creates .venv with `python3 -m venv` and installs
# `.[mpich,test,data,viz]` (editable) on first use and whenever setup.cfg changes.
# COTSDL_VENV overrides the location; COTSDL_EXTRAS the extras (on a cluster's login
# node: COTSDL_EXTRAS=cuda12, or "" for a CPU cluster, keeps the site MPI; see README.md).
# COTSDL_NO_INSTALL=1 (set by the batch jobs: compute nodes often have no network):
# only activate; a missing environment is an error saying how to make it, a stale one
# a warning.
_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_venv=${COTSDL_VENV:-$_root/.venv}
_extras=${COTSDL_EXTRAS-mpich,test,data,viz}
_stamp="$_venv/.cotsdl-installed"
_want="$(cat "$_root/setup.cfg" "$_root/pyproject.toml" | sha256sum | cut -c1-16) $_extras"
if [ "${COTSDL_NO_INSTALL:-0}" = 1 ]; then
    if [ ! -f "$_venv/bin/activate" ]; then
        echo "[cotsdl] error: no environment at $_venv. Jobs install nothing (compute nodes often have no" \
             "network): make it once on the login node, from the repository root: COTSDL_EXTRAS=cuda12 . jobs/env.sh" \
             "(GPU cluster; COTSDL_EXTRAS= for a CPU cluster), then submit again" >&2
        unset _root _venv _extras _stamp _want
        return 1 2>/dev/null || exit 1
    fi
    if [ "$(cut -d' ' -f1 "$_stamp" 2>/dev/null)" != "${_want%% *}" ]; then
        echo "[cotsdl] warning: setup.cfg changed since $_venv was made; if the job lacks a package, run" \
             "'. jobs/env.sh' on the login node again" >&2
    fi
elif [ ! -x "$_venv/bin/python" ]; then
    echo "[cotsdl] creating virtual environment $_venv" >&2
    python3 -m venv "$_venv" || return 1 2>/dev/null || exit 1
fi
if [ "${COTSDL_NO_INSTALL:-0}" != 1 ] && [ "$(cat "$_stamp" 2>/dev/null)" != "$_want" ]; then
    echo "[cotsdl] installing cotsdl${_extras:+[$_extras]} into $_venv" >&2
    "$_venv/bin/python" -m pip install --quiet --upgrade pip >&2 &&
    "$_venv/bin/python" -m pip install --quiet -e "$_root${_extras:+[$_extras]}" >&2 &&
    # Without the mpich extra (a cluster), a MPICH wheel left from an earlier install
    # would shadow the site MPI: remove it.
    { case ",$_extras," in *,mpich,*) ;; *) "$_venv/bin/python" -m pip uninstall --quiet -y mpich >&2 2>/dev/null || true ;; esac; } &&
    echo "$_want" > "$_stamp" || { echo "[cotsdl] installation failed" >&2; return 1 2>/dev/null || exit 1; }
fi
# shellcheck disable=SC1091
. "$_venv/bin/activate"
unset _root _venv _extras _stamp _want
