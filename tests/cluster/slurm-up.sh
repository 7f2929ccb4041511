#!/usr/bin/env bash
# A real one-node Slurm on this machine, for the cluster stage of the tests:
#   bash tests/cluster/slurm-up.sh        # exit 0: up; 77: skipped (said why); else failed
# Installs Debian's slurmctld, slurmd, slurm-client and munge (apt), writes a munge key
# and /etc/slurm/slurm.conf for one node with this machine's CPUs, starts munged,
# slurmctld and slurmd, and waits for the node to be idle.  Idempotent: a cluster it
# brought up before is left as it is.  Root only: where apt or root is missing it
# changes nothing and exits 77.  Never run it on a machine whose Slurm you care about:
# it writes /etc/slurm/slurm.conf.
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
cpus=$(getconf _NPROCESSORS_ONLN)  # not nproc: it obeys OMP_NUM_THREADS (the test runner sets 1)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
want="$marker
ClusterName=cotsdl-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=600
KillWait=10
Waittime=0
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
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
munge -n </dev/null | unmunge >/dev/null || { log "munge does not work"; exit 1; }

running() { pgrep -x "$1" >/dev/null; }
if [ "$changed" = 1 ]; then
    log "slurm.conf changed: restarting the daemons"
    pkill -x slurmd 2>/dev/null || true
    pkill -x slurmctld 2>/dev/null || true
    for _ in $(seq 100); do running slurmctld || running slurmd || break; sleep 0.2; done
fi
if ! running slurmctld; then
    log "starting slurmctld"
    /usr/sbin/slurmctld -i
fi
if ! running slurmd; then
    log "starting slurmd"
    /usr/sbin/slurmd
fi

end=$((SECONDS + 60))
while [ "$SECONDS" -lt "$end" ]; do
    state=$(timeout 5 sinfo -h -n "$host" -o %T 2>/dev/null | head -1 || true)
    case "$state" in
        idle|mixed|allocated) log "up: node $host ($cpus CPUs) is $state"; exit 0 ;;
        down*|drain*) scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 1
done
log "the node never became idle (state: ${state:-none}); logs in /var/log/slurm"
exit 1
