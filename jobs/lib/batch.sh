# Shared by the cluster training jobs (jobs/slurm/train.sbatch, jobs/pbs/train.pbs),
# which source it after they cd to the repository root.  Functions and the
# variables they share; sourcing it runs nothing.  tests/test_jobs.py calls them.
#
#   cotsdl_trap_signals        handle SIGUSR1/SIGTERM from here on (see below)
#   cotsdl_setup_env           site modules, then activate .venv (jobs/env.sh, installing nothing;
#                              COTSDL_SKIP_ENV=1: neither)
#   cotsdl_report_mpi          print the MPI library; warn when it is the MPICH wheel
#   cotsdl_launch CMD...       run the launcher in the background (beside a node watch that names
#                              a rank or node lost mid-run), forward the checkpoint request to it,
#                              set COTSDL_STATUS to its real status
#   cotsdl_finish REQUEUE_FN   report COTSDL_STATUS and exit (75: call REQUEUE_FN)
#   cotsdl_duration_seconds D  [[[days:]hours:]minutes:]seconds -> seconds
#   cotsdl_pbs_walltime        the PBS job's walltime in seconds (PBS_WALLTIME or qstat -f)
#   cotsdl_signal_delay W L E  seconds to wait before the lead-time signal
#   cotsdl_start_timer D LEAD  send SIGUSR1 to this script after D seconds
#   cotsdl_stop_timer          (when the launcher has exited)
#   cotsdl_clean_shm WORLD...  remove this node's stale MPICH shared-memory files of the MPI
#                              worlds named (a killed start's), before a launch
#   cotsdl_slurm_worlds        the MPI world names the srun steps of this Slurm job get
#   cotsdl_count_tasks LIST    tasks in a SLURM_TASKS_PER_NODE list ("2(x3),1" -> 7)
#
# Signals.  The program checkpoints on SIGUSR1 or SIGTERM received by any rank and
# exits with 75; a *second* signal makes it exit at once, without a checkpoint.  So
# the batch script passes on exactly one checkpoint request, as SIGUSR1 (the signal
# every launcher forwards to its ranks rather than acting on it: srun, Hydra's
# mpiexec):
#   - SIGUSR1 to the batch script (Slurm's --signal=B:USR1@T, `scancel --batch
#     --signal=USR1`, `qsig -s USR1`, the PBS lead-time timer) is forwarded to the
#     launcher, the first one only; later ones are logged and dropped.
#   - SIGTERM to the batch script is not forwarded: at the time limit, on scancel,
#     qdel or preemption the scheduler sends SIGTERM to every process of the job
#     itself, the launcher and the ranks included, and one more signal would stop the
#     ranks before their checkpoint.  It is recorded (COTSDL_GOT_TERM, COTSDL_TERM_AT:
#     seconds since the script started), and the job script decides whether a 75
#     after it is requeued.  COTSDL_FORWARD_TERM=1 forwards it (as SIGUSR1) for a site
#     whose scheduler signals only the batch script.
# cotsdl_launch returns the launcher's real exit status however many signals came;
# it looks at the launcher every COTSDL_POLL_SECONDS (1) seconds, so a signal is
# forwarded within that time.

COTSDL_STATUS=
COTSDL_FORWARDED=
COTSDL_GOT_TERM=
COTSDL_TERM_AT=
COTSDL_NO_REQUEUE=
_cotsdl_child=
_cotsdl_timer=

cotsdl_log() {      # (printf's own clock: no command substitution in a signal handler)
    printf '[cotsdl] %(%F %T)T %s\n' -1 "$*"
}

cotsdl_trap_signals() {
    trap '_cotsdl_on_signal USR1' USR1
    trap '_cotsdl_on_signal TERM' TERM
}

_cotsdl_on_signal() {
    if [ "$1" = TERM ]; then
        COTSDL_GOT_TERM=1
        COTSDL_TERM_AT=${COTSDL_TERM_AT:-$SECONDS}
        if [ "${COTSDL_FORWARD_TERM:-0}" = 1 ]; then
            _cotsdl_forward TERM
        else
            cotsdl_log "SIGTERM to the batch script: not forwarded (the scheduler signals every" \
                       "process of the job itself; set COTSDL_FORWARD_TERM=1 where it does not)"
        fi
    else
        _cotsdl_forward "$1"
    fi
    return 0
}

_cotsdl_forward() {
    if [ -n "$COTSDL_FORWARDED" ]; then
        cotsdl_log "SIG$1 to the batch script: a checkpoint was already requested (SIG$COTSDL_FORWARDED);" \
                   "not forwarded again (a second signal stops the ranks without a checkpoint;" \
                   "cancel the job to stop at once)"
        return 0
    fi
    COTSDL_FORWARDED=$1
    if [ -z "$_cotsdl_child" ]; then
        cotsdl_log "SIG$1 to the batch script before the launch: the run will not be started"
    elif kill -USR1 "$_cotsdl_child" 2>/dev/null; then
        cotsdl_log "SIG$1 to the batch script: forwarded as SIGUSR1 to the launcher (pid $_cotsdl_child);" \
                   "the ranks checkpoint at the next step and exit with status 75"
    else
        cotsdl_log "SIG$1 to the batch script: the launcher (pid $_cotsdl_child) has already exited"
    fi
    return 0
}

cotsdl_setup_env() {
    if [ "${COTSDL_SKIP_ENV:-0}" = 1 ]; then
        cotsdl_log "COTSDL_SKIP_ENV=1: no module loads, no jobs/env.sh; python is $(command -v python || echo '(none)')"
        return 0
    fi
    local m
    for m in ${COTSDL_MODULES-}; do
        if ! command -v module >/dev/null 2>&1; then
            cotsdl_log "note: no 'module' command here; not loading ${COTSDL_MODULES} (using the MPI on PATH)"
            break
        fi
        # Environment-modules and Lmod functions are not written for `set -u`.
        set +u
        module load "$m" || cotsdl_log "note: 'module load $m' failed; using the MPI on PATH"
        set -u
    done
    # Activate only: the environment is made once on the login node (compute nodes
    # often have no network); a missing one ends the job with how to make it.
    # shellcheck disable=SC1091
    COTSDL_NO_INSTALL=1 . jobs/env.sh || exit 2
}

cotsdl_report_mpi() {
    local lib ver
    lib=$(python -m mpi4py --mpi-library 2>/dev/null) || lib=
    ver=$(python -m mpi4py --mpi-lib-version 2>/dev/null) || ver=
    ver=${ver%%$'\n'*}
    cotsdl_log "MPI library: ${lib:-unknown (python -m mpi4py --mpi-library failed)}${ver:+ ($ver)}"
    if [ -n "$lib" ] && [ -n "${VIRTUAL_ENV:-}" ] && [ "${lib#"$VIRTUAL_ENV"/}" != "$lib" ]; then
        cotsdl_log "WARNING: that is the MPICH wheel inside $VIRTUAL_ENV, not the site MPI: it does not" \
                   "know the interconnect or GPU memory. Remove it ('python -m pip uninstall mpich')" \
                   "or use a separate COTSDL_VENV for cluster jobs (jobs/README.md)."
    fi
}

# COTSDL_STATUS := the exit status of the exited child $1.  A trapped signal during `wait` makes
# it return 128 + the signal at once, before it collects the status, even when the child has
# already exited (bash longjmps out of the builtin; CI saw 143 for a launcher that exited 5).
# So 138 and 143 are asked again: the real status comes, or 127 where the first wait had
# collected it (then that one was real).
_cotsdl_wait_status() {
    local s
    COTSDL_STATUS=
    while :; do
        if wait "$1"; then s=0; else s=$?; fi
        if [ "$s" = 127 ] && [ -n "$COTSDL_STATUS" ]; then break; fi
        COTSDL_STATUS=$s
        case $s in 138|143) ;; *) break ;; esac
    done
}

cotsdl_launch() {
    if [ -n "$COTSDL_FORWARDED" ]; then
        cotsdl_log "not launched: a checkpoint request arrived during the setup"
        COTSDL_STATUS=75
        return 0
    fi
    if [ -n "$COTSDL_GOT_TERM" ]; then
        cotsdl_log "not launched: SIGTERM arrived during the setup"
        COTSDL_STATUS=143
        return 0
    fi
    # cotsdl train records where this session started and stopped (for the requeue guard)
    export COTSDL_SESSION_FILE="${TMPDIR:-/tmp}/cotsdl-session-$(_cotsdl_job_key)-$$.json"
    rm -f "$COTSDL_SESSION_FILE"
    _cotsdl_start_nodewatch
    cotsdl_log "launch: $*"
    "$@" &
    _cotsdl_child=$!
    # Poll rather than block in `wait`: a trapped signal cuts a blocking wait short,
    # and bash (5.2) then sometimes loses the child's exit status (the next wait
    # returns -1).  A signal that arrives during the short foreground sleep is
    # handled when it ends; the shell reaps the launcher when it exits, and the
    # one wait below, which no longer blocks, collects its status.
    while kill -0 "$_cotsdl_child" 2>/dev/null; do
        sleep "${COTSDL_POLL_SECONDS:-1}" || true
    done
    _cotsdl_wait_status "$_cotsdl_child"
    _cotsdl_child=
    cotsdl_log "the launcher exited with status $COTSDL_STATUS"
    _cotsdl_stop_nodewatch
}

# The node watch (python -m cotsdl.cli.nodewatch): a small process beside the launcher that every
# rank connects to, so that a rank or node lost mid-run is named in the job's output even when the
# launcher ends the job at once (Hydra: status 255).  COTSDL_NODEWATCH=0 turns it off;
# COTSDL_NODEWATCH_HOST: the address the ranks reach this host at (default: its host name);
# COTSDL_NODEWATCH_EVENTS=FILE: every connection's end as JSON there, when the job ends.
_cotsdl_nodewatch=
_cotsdl_start_nodewatch() {
    [ "${COTSDL_NODEWATCH-}" != 0 ] || { unset COTSDL_NODEWATCH; return 0; }
    local ready="${TMPDIR:-/tmp}/cotsdl-nodewatch-$(_cotsdl_job_key)-$$"
    rm -f "$ready"
    python -m cotsdl.cli.nodewatch --ready "$ready" ${COTSDL_NODEWATCH_EVENTS:+--events "$COTSDL_NODEWATCH_EVENTS"} &
    _cotsdl_nodewatch=$!
    local i
    for i in $(seq 50); do [ -s "$ready" ] && break; sleep 0.1; done
    if [ -s "$ready" ]; then
        COTSDL_NODEWATCH=$(cat "$ready")
        export COTSDL_NODEWATCH
        cotsdl_log "node watch at $COTSDL_NODEWATCH (pid $_cotsdl_nodewatch): names a rank or node lost mid-run"
    else
        cotsdl_log "note: the node watch did not start; a rank or node lost mid-run will not be named"
        kill "$_cotsdl_nodewatch" 2>/dev/null || true
        wait "$_cotsdl_nodewatch" 2>/dev/null || true
        unset COTSDL_NODEWATCH
        _cotsdl_nodewatch=
    fi
    rm -f "$ready"
}

_cotsdl_stop_nodewatch() {
    [ -n "$_cotsdl_nodewatch" ] || return 0
    kill -TERM "$_cotsdl_nodewatch" 2>/dev/null || true
    wait "$_cotsdl_nodewatch" 2>/dev/null || true
    _cotsdl_nodewatch=
}

cotsdl_finish() {
    local s=$COTSDL_STATUS
    case $s in
        0)
            cotsdl_log "status 0: the run is complete"
            exit 0 ;;
        2)
            cotsdl_log "status 2: bad command line, config or data; not requeued (fix it and submit again)"
            exit 2 ;;
        75)
            if [ -n "$COTSDL_NO_REQUEUE" ]; then
                cotsdl_log "status 75: checkpointed; not requeued: $COTSDL_NO_REQUEUE"
                exit 75
            fi
            if ! _cotsdl_progress_guard; then
                exit 75
            fi
            cotsdl_log "status 75: checkpointed on a signal; requeueing to resume from the checkpoint"
            if "$1"; then
                exit 0
            fi
            cotsdl_log "could not requeue: submit the same job again to resume from the checkpoint"
            exit 75 ;;
        *)
            if [ "$s" = 255 ] && [ -n "${COTSDL_NODEWATCH:-}" ]; then
                cotsdl_log "status 255: the launcher ended the job (MPICH's mpiexec does so when it loses a rank" \
                           "or a node: the node watch's lines above name it); not requeued; the last complete" \
                           "checkpoint is intact: resume on the nodes that are left by running the job again"
            elif [ "$s" -gt 128 ]; then
                cotsdl_log "status $s (signal $((s - 128))): stopped without a checkpoint of this" \
                           "session (a second signal, a kill, or a launcher failure); not requeued;" \
                           "the last complete checkpoint is intact"
            else
                cotsdl_log "status $s: training failed; not requeued (the last complete checkpoint is" \
                           "intact; see the output above and the run folder's log.txt)"
            fi
            exit "$s" ;;
    esac
}

_cotsdl_job_key() {  # the job's id, the same in every start of a requeued job
    local k=${SLURM_JOB_ID:-${PBS_JOBID:-$$}}
    echo "${k%%.*}"
}

# Requeue loops without progress: a start that checkpoints on the signal before it has
# trained a step (a signal lead longer than the time a start gets, a node that keeps
# failing early) would be requeued for ever.  After COTSDL_MAX_IDLE_STARTS (3) such
# starts in a row the job is not requeued again, and says why.  The count is kept in
# COTSDL_STATE_DIR (default .cotsdl-jobs/ in the submission folder: it must outlive the
# start) and reset by any start that trains.  submitit caps its requeues the same way
# (slurm_max_num_timeout).
_cotsdl_progress_guard() {
    local dir=${COTSDL_STATE_DIR:-.cotsdl-jobs} max=${COTSDL_MAX_IDLE_STARTS:-3} start= stop= idle=0
    local file
    file="$dir/$(_cotsdl_job_key).idle"
    if [ -n "${COTSDL_SESSION_FILE:-}" ] && [ -f "$COTSDL_SESSION_FILE" ]; then
        read -r start stop < "$COTSDL_SESSION_FILE" || true   # "START STOP" (global steps)
        rm -f "$COTSDL_SESSION_FILE"
    fi
    mkdir -p "$dir" 2>/dev/null || true
    if [[ $start =~ ^[0-9]+$ && $stop =~ ^[0-9]+$ ]] && [ "$stop" -gt "$start" ]; then
        rm -f "$file"
        cotsdl_log "this start trained global steps $start..$stop"
        return 0
    fi
    idle=$(( $(cat "$file" 2>/dev/null || echo 0) + 1 ))
    echo "$idle" > "$file" 2>/dev/null || true
    if [ "$idle" -ge "$max" ]; then
        cotsdl_log "status 75: checkpointed; not requeued: $idle start(s) in a row stopped on the signal" \
                   "before a training step (COTSDL_MAX_IDLE_STARTS=$max). Is the signal lead longer than the" \
                   "time a start gets? Lower it (--signal=B:USR1@T, COTSDL_SIGNAL_BEFORE) or raise the time" \
                   "limit, then submit again: the run resumes from its last checkpoint"
        rm -f "$file"
        return 1
    fi
    cotsdl_log "this start made no training step ($idle of at most $max in a row)"
    return 0
}

cotsdl_duration_seconds() {
    local v=${1//[[:space:]]/}
    v=${v%%.*}
    [[ $v =~ ^[0-9]+(:[0-9]+){0,3}$ ]] || return 1
    local -a parts
    IFS=: read -r -a parts <<< "$v"
    local total=0 p
    local -a mult=(1 60 3600 86400)
    local n=${#parts[@]} i
    for ((i = 0; i < n; i++)); do
        p=${parts[n - 1 - i]}
        total=$((total + 10#$p * mult[i]))
    done
    echo "$total"
}

cotsdl_pbs_walltime() {
    local w=${PBS_WALLTIME:-} out line
    if [ -z "$w" ] && [ -n "${PBS_JOBID:-}" ] && command -v qstat >/dev/null 2>&1; then
        out=$(qstat -f "$PBS_JOBID" 2>/dev/null) || out=
        while IFS= read -r line; do
            if [[ $line =~ ^[[:space:]]*Resource_List\.walltime[[:space:]]*=[[:space:]]*(.*)$ ]]; then
                w=${BASH_REMATCH[1]}
                break
            fi
        done <<< "$out"
    fi
    [ -n "$w" ] || return 1
    cotsdl_duration_seconds "$w"
}

cotsdl_signal_delay() {
    local wall=$1 lead=$2 elapsed=$3
    [ "$lead" -gt 0 ] || return 1
    [ "$wall" -gt "$lead" ] || return 1
    local d=$((wall - lead - elapsed))
    [ "$d" -ge 0 ] || d=0
    echo "$d"
}

cotsdl_start_timer() {
    local delay=$1 lead=$2 self=$$
    (
        trap 'kill "$s" 2>/dev/null; exit 0' TERM
        sleep "$delay" &
        s=$!
        wait "$s"
        cotsdl_log "lead-time timer: ${lead} s before the walltime; requesting a checkpoint (SIGUSR1)"
        kill -USR1 "$self" 2>/dev/null
    ) &
    _cotsdl_timer=$!
}

cotsdl_stop_timer() {
    if [ -n "$_cotsdl_timer" ]; then
        kill "$_cotsdl_timer" 2>/dev/null || true
        wait "$_cotsdl_timer" 2>/dev/null || true
        _cotsdl_timer=
    fi
}

# ---- stale shared memory of a killed start
# MPICH (4.x, 5.x: the MPICH wheel, and the MPICH-derived MPIs that keep its shared-memory
# code) keeps each node's shared-memory segment of an MPI world in /dev/shm/mpich_shm_<H>_<N>
# (and mpich_vci_<H>_<N>): H is the FNV-1a hash of the world's PMI name, N the node's index in
# the world.  The last process removes them at MPI_Finalize; a killed start (SIGKILL, a node
# that died) leaves them.  Under srun the PMI name is JOBID.STEPID ("slurm.pmix.JOBID.STEPID"
# with PMIx), and a requeued job counts its steps from 0 again: the next start's ranks find
# the old segment, attach to it and fail in MPI_Init (MPIDI_POSIX_comm_bootstrap ... "Out of
# memory").  cotsdl_clean_shm removes, before the launch, the files of the worlds it is given
# (this job's, from cotsdl_slurm_worlds) that no live process on this node has open or
# mapped: never another job's (other names), never a live one's (in use), only the caller's
# own (-O).  It says what it removed; nothing when there was nothing.  COTSDL_SHM_DIR: the
# folder (/dev/shm).  It sees the node it runs on only: the batch script's, the first node of
# the job; jobs/README.md has a Prolog that cleans every node.  Under PBS, Hydra's mpiexec names
# each world after its own pid: a rerun never meets a killed run's segments (they only take
# memory, until a Prolog or Epilog removes them), so jobs/pbs/train.pbs needs no call.

_cotsdl_fnv1a() {   # FNV-1a, 32 bits, in hex without leading zeros (MPICH's HASH_FNV, printed %x)
    local s=$1 h=2166136261 i c
    for ((i = 0; i < ${#s}; i++)); do
        printf -v c '%d' "'${s:i:1}"
        h=$(( ((h ^ c) * 16777619) & 0xffffffff ))
    done
    printf '%x\n' "$h"
}

cotsdl_slurm_worlds() {  # the PMI names of steps 0..7 of this job (the launch is the first step)
    local s
    [ -n "${SLURM_JOB_ID:-}" ] || return 0
    for s in 0 1 2 3 4 5 6 7; do
        echo "$SLURM_JOB_ID.$s" "slurm.pmix.$SLURM_JOB_ID.$s"
    done
}

_cotsdl_in_use() {  # DIR: the files under DIR that a process on this node has open or mapped
    # /proc/PID/maps and fd/ of processes one may not read (another user's) are skipped: their
    # files are not one's own either, and cotsdl_clean_shm removes only its own.
    cat /proc/[0-9]*/maps 2>/dev/null | awk -v d="$1/" 'index($6, d) == 1 {print $6}'
    find /proc/[0-9]*/fd -maxdepth 1 -lname "$1/*" -printf '%l\n' 2>/dev/null
    return 0
}

cotsdl_clean_shm() {
    local dir=${COTSDL_SHM_DIR:-/dev/shm} w f h used
    local -a found=() removed=() kept=()
    [ -d "$dir" ] || return 0
    for w in "$@"; do
        h=$(_cotsdl_fnv1a "$w")
        for f in "$dir/mpich_shm_${h}_"* "$dir/mpich_vci_${h}_"*; do
            [ -e "$f" ] && found+=("$f")
        done
    done
    [ "${#found[@]}" -gt 0 ] || return 0
    used=$(_cotsdl_in_use "$dir" | sort -u)
    for f in "${found[@]}"; do
        if [ ! -O "$f" ]; then
            kept+=("${f##*/} (another user's)")
        elif grep -qxF -- "$f" <<< "$used"; then
            kept+=("${f##*/} (in use by a live process)")
        elif rm -f -- "$f"; then
            removed+=("${f##*/}")
        fi
    done
    if [ "${#removed[@]}" -gt 0 ]; then
        cotsdl_log "removed stale MPI shared memory of this job on $(hostname) (left by a killed start;" \
                   "no process uses it): ${removed[*]}"
    fi
    if [ "${#kept[@]}" -gt 0 ]; then
        cotsdl_log "warning: MPI shared memory of this job left in place on $(hostname): ${kept[*]};" \
                   "MPI start-up may fail on it"
    fi
    return 0
}

cotsdl_count_tasks() {  # SLURM_TASKS_PER_NODE ("2(x3),1") -> 7; fails on anything else
    local total=0 part n r
    local -a parts
    IFS=, read -r -a parts <<< "$1"
    [ "${#parts[@]}" -gt 0 ] || return 1
    for part in "${parts[@]}"; do
        if [[ $part =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
            n=${BASH_REMATCH[1]} r=${BASH_REMATCH[2]}
        elif [[ $part =~ ^[0-9]+$ ]]; then
            n=$part r=1
        else
            return 1
        fi
        total=$((total + 10#$n * 10#$r))
    done
    echo "$total"
}
