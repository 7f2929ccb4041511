# Source me: make sure the project's virtual environment exists and is current,
# then activate it.  Creates .venv with `python3 -m venv` and installs
# `.[mpich,test,data,viz]` (editable) on first use and whenever setup.cfg changes.
# COTSDL_VENV overrides the location; COTSDL_EXTRAS the extras (a cluster job
# sets COTSDL_EXTRAS=cuda12 or "" to keep the site MPI, see README.md).
_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_venv=${COTSDL_VENV:-$_root/.venv}
_extras=${COTSDL_EXTRAS-mpich,test,data,viz}
_stamp="$_venv/.cotsdl-installed"
_want="$(cat "$_root/setup.cfg" "$_root/pyproject.toml" | sha256sum | cut -c1-16) $_extras"
if [ ! -x "$_venv/bin/python" ]; then
    echo "[cotsdl] creating virtual environment $_venv" >&2
    python3 -m venv "$_venv" || return 1 2>/dev/null || exit 1
fi
if [ "$(cat "$_stamp" 2>/dev/null)" != "$_want" ]; then
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
