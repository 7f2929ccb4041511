#!/usr/bin/env bash
# A real Slurm on this machine, for the cluster stage of the tests:
#   bash tests/cluster/slurm-up.sh        # exit 0: up; 77: skipped (said why); else failed
# Installs Debian's slurmctld, slurmd, slurm-client and munge (apt), writes a munge key
# and /etc/slurm/slurm.conf, starts munged, slurmctld and the slurmds, and waits (at most
# a minute) for every node to be idle.  Two partitions:
#   debug  (default)  this machine itself, one node with all its CPUs (tests/cluster/test_slurm.py)
#   nodes             cotsdl-n3 and cotsdl-n4: simulated nodes of tests/cluster/nodes-up.sh (network
#                     namespaces on a bridge, one core each), one slurmd in each
#                     (tests/cluster/test_slurm_nodes.py).  cotsdl-n1 and cotsdl-n2 are left to the
#                     plain-mpiexec tests.  Where namespaces cannot be made (nodes-up.sh exits 77)
#                     the cluster is the one-node one, and one line says so.
# Debian's Slurm is built with MULTIPLE_SLURMD: one slurmctld (here, in the root namespace,
# reached from the nodes at the bridge address) and one `slurmd -N NODE` per node, each with
# its own spool folder, pid and log file (%n in slurm.conf).  A node's slurmd runs in the
# node's network namespace with its own hostname, /etc/hosts and core (see start_node_slurmd).
# Idempotent: a cluster it brought up before is left as it is (a daemon that is missing,
# say a node's slurmd killed by a test, is started again, and a DOWN node resumed); a
# changed slurm.conf restarts every daemon.  Root only: where apt or root is missing it
# changes nothing and exits 77.  Never run it on a machine whose Slurm you care about: it
# writes /etc/slurm/slurm.conf.
set -euo pipefail
log() { echo "[slurm-up] $*"; }
skip() { log "skipped: $*"; exit 77; }

[ "$(id -u)" = 0 ] || skip "needs root (it installs packages and starts daemons)"
command -v apt-get >/dev/null || skip "no apt-get here (Debian/Ubuntu only)"
conf=/etc/slurm/slurm.conf
marker="# written by cotsdl tests/cluster/slurm-up.sh"
if [ -f "$conf" ] && ! grep -qF "$marker" "$conf"; then
    skip "$conf exists and was not written by this script: this machine has its own Slurm"
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
        || ! command -v munged >/dev/null; then
    log "installing slurmctld slurmd slurm-client munge"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq slurmctld slurmd slurm-client munge >/tmp/slurm-up-apt.log 2>&1; then
        apt-get update -qq >>/tmp/slurm-up-apt.log 2>&1 || true
        apt-get install -y -qq slurmctld slurmd slurm-client munge >>/tmp/slurm-up-apt.log 2>&1 \
            || skip "apt-get install failed (no package mirror?): see /tmp/slurm-up-apt.log"
    fi
fi

host=$(hostname -s)
here=$(cd "$(dirname "$0")" && pwd)
cpus=$(getconf _NPROCESSORS_ONLN)  # not nproc: it obeys OMP_NUM_THREADS (the test runner sets 1)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))

# ---- the simulated nodes of the `nodes` partition
net=${COTSDL_NODES_NET:-10.213.77}
slurm_nodes=(3 4)                    # cotsdl-n3, cotsdl-n4 (n1, n2: the plain-mpiexec tests)
node_ready() {  # I: node cotsdl-nI exists (namespace, core, hosts file); its link is brought up
    local n=cotsdl-n$1
    ip netns list 2>/dev/null | grep -qw "$n" && [ -s "/run/cotsdl-nodes/$n.cpus" ] \
        && [ -s "/etc/netns/$n/hosts" ] || return 1
    # a test that killed the node took its link down
    ip link set "cotsdl-v$1" up 2>/dev/null || true
    ip -n "$n" link set eth0 up 2>/dev/null || true
}
missing=0
for i in "${slurm_nodes[@]}"; do node_ready "$i" || missing=1; done
if [ "$missing" = 1 ]; then
    # Only when a node is missing: nodes-up.sh rewrites every node's files, those of cotsdl-n1
    # and n2 too, while the plain-mpiexec tests may be using them.
    nodes_rc=0
    nodes_out=$(bash "$here/nodes-up.sh" 4 2>&1) || nodes_rc=$?
    if [ "$nodes_rc" = 77 ]; then
        log "one-node cluster only (no 'nodes' partition): ${nodes_out##*skipped: }"
        slurm_nodes=()
    else
        # nodes-up.sh checks every node, n1 and n2 too, whose links the plain-mpiexec tests take
        # down or throttle at times: what matters here is this cluster's nodes (checked below).
        for i in "${slurm_nodes[@]}"; do
            if ! node_ready "$i"; then
                printf '%s\n' "$nodes_out" >&2
                log "no node cotsdl-n$i (nodes-up.sh 4: status $nodes_rc)"
                exit 1
            fi
        done
    fi
fi
for i in "${slurm_nodes[@]}"; do
    # a TCP connection to a closed port of the bridge: refused at once where the link works
    rc=0
    ip netns exec "cotsdl-n$i" timeout 3 bash -c "exec 3<>/dev/tcp/$net.254/9" 2>/dev/null || rc=$?
    [ "$rc" != 124 ] || { log "node cotsdl-n$i does not reach the bridge $net.254"; exit 1; }
done

# ---- slurm.conf
# SlurmdTimeout, MessageTimeout: how soon a node that died is set DOWN and its jobs requeued.
# slurmctld pings a node silent for SlurmdTimeout/3 s, a ping to a dead node fails after
# MessageTimeout, and a node still silent one ping round after SlurmdTimeout is DOWN: measured
# here from a node's death (link down, processes killed) to DOWN, 30-33 s with 10 and 10,
# 14-16 s with 5 and 5 (then KillWait, 10 s, for the job's processes on the other node: a
# rank blocked on the dead one ignores SIGTERM).  5 s is still far above what a slurmd or
# slurmctld on this busy two-core machine takes to answer (milliseconds); a node taken for
# dead by mistake comes back by itself when it answers (ReturnToService=2).
# bf_interval=5: a requeued job waits cred_expire (10 s), then for the next scheduling pass:
# up to 30 s more with the default backfill interval (a requeue took 33 s), 5 s here (15 s).
want="$marker
ClusterName=cotsdl-test
SlurmctldHost=$host${slurm_nodes[0]:+($net.254)}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd.%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.%n.log
SlurmctldTimeout=30
SlurmdTimeout=5
MessageTimeout=5
InactiveLimit=0
MinJobAge=600
KillWait=10
Waittime=0
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
if [ "${#slurm_nodes[@]}" -gt 0 ]; then
    node_mem=$(( mem / 4 ))
    names=
    for i in "${slurm_nodes[@]}"; do
        want="$want
NodeName=cotsdl-n$i NodeAddr=$net.$i CPUs=1 RealMemory=$node_mem State=UNKNOWN"
        names=${names:+$names,}cotsdl-n$i
    done
    want="$want
PartitionName=nodes Nodes=$names Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO"
fi
mkdir -p /etc/slurm /var/spool/slurmctld /var/log/slurm "/var/spool/slurmd.$host"
for i in "${slurm_nodes[@]}"; do mkdir -p "/var/spool/slurmd.cotsdl-n$i"; done
changed=0
if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
    printf '%s\n' "$want" > "$conf"
    changed=1
fi

if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key 2>/dev/null || true
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
if ! munge -n </dev/null >/dev/null 2>&1; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged || /usr/sbin/munged --force
    for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
fi
# one munged serves every node: its socket is a file, the same in every network namespace
munge -n </dev/null | unmunge >/dev/null || { log "munge does not work"; exit 1; }

# ---- the daemons, found by their pid files and namespaces (never by name alone: a slurmd
# of one node must not be taken for another's)
is_daemon() {  # PID NAME: the process PID is alive and is NAME
    [ -n "$1" ] && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]
}
pid_of_file() {  # PIDFILE NAME: the pid in PIDFILE when it is a live NAME
    local p
    p=$(cat "$1" 2>/dev/null) || return 1
    is_daemon "$p" "$2" && echo "$p"
}
node_slurmd() {  # I: the pid of the slurmd running in node cotsdl-nI's network namespace
    local p
    for p in $(ip netns pids "cotsdl-n$1" 2>/dev/null); do
        is_daemon "$p" slurmd && { echo "$p"; return 0; }
    done
    return 1
}
start_node_slurmd() {  # I: slurmd of node cotsdl-nI inside its namespace, detached
    # nsenter --net, not `ip netns exec`: that one remounts /sys, and slurmd then finds no
    # /sys/fs/cgroup.  Its own UTS and mount namespaces give it the node's hostname and
    # /etc/hosts (so the job's processes, its children, see them too), taskset the node's
    # core.  -D: in the foreground of this detached shell, which then is the daemon.
    local n=cotsdl-n$1
    setsid nsenter --net="/run/netns/$n" unshare --uts --mount --propagation private \
        taskset -c "$(cat "/run/cotsdl-nodes/$n.cpus")" \
        sh -c "mount --bind /etc/netns/$n/hosts /etc/hosts && hostname $n && exec /usr/sbin/slurmd -N $n -D" \
        </dev/null >>"/var/log/slurm/slurmd.$n.out" 2>&1 &
}

if [ "$changed" = 1 ]; then
    log "slurm.conf changed: restarting the daemons"
    pids=
    # the pid files of this and of earlier versions of the config (/run/slurmd.pid: one node)
    for f in /run/slurmctld.pid /run/slurmd.pid /run/slurmd.*.pid; do
        p=$(pid_of_file "$f" slurmctld || pid_of_file "$f" slurmd) && pids="$pids $p"
    done
    for i in 3 4; do p=$(node_slurmd "$i") && pids="$pids $p"; done
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    for _ in $(seq 100); do
        alive=0
        for p in $pids; do is_daemon "$p" slurmd || is_daemon "$p" slurmctld && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.2
    done
fi
if ! pid_of_file /run/slurmctld.pid slurmctld >/dev/null; then
    log "starting slurmctld"
    /usr/sbin/slurmctld -i
fi
if ! pid_of_file "/run/slurmd.$host.pid" slurmd >/dev/null; then
    log "starting slurmd ($host)"
    /usr/sbin/slurmd
fi
for i in "${slurm_nodes[@]}"; do
    if ! node_slurmd "$i" >/dev/null; then
        log "starting slurmd (cotsdl-n$i, in its namespace)"
        start_node_slurmd "$i"
    fi
done

all=("$host")
for i in "${slurm_nodes[@]}"; do all+=("cotsdl-n$i"); done
end=$((SECONDS + 60))
while [ "$SECONDS" -lt "$end" ]; do
    ready=0 states=
    for n in "${all[@]}"; do
        state=$(timeout 5 sinfo -h -n "$n" -o %T 2>/dev/null | head -1 || true)
        states="$states $n=${state:-none}"
        case "$state" in
            idle|mixed|allocated) ready=$((ready + 1)) ;;
            # a node left DOWN (killed by a test) or drained: its slurmd runs again, resume it
            down*|drain*|fail*) scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true ;;
        esac
    done
    if [ "$ready" = "${#all[@]}" ]; then
        if [ "${#slurm_nodes[@]}" -gt 0 ]; then
            log "up: partition debug: $host ($cpus CPUs); partition nodes: ${names//,/ } (1 CPU each);$states"
        else
            log "up: node $host ($cpus CPUs):$states"
        fi
        exit 0
    fi
    sleep 1
done
log "not every node became idle within a minute:$states; logs in /var/log/slurm"
exit 1
