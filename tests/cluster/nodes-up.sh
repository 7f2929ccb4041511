#!/usr/bin/env bash
# Simulated cluster nodes on this one machine, for the nodes stage of the tests and by hand:
#   bash tests/cluster/nodes-up.sh N            # make nodes cotsdl-n1..N (exit 0; 77: skipped, said why)
#   bash tests/cluster/nodes-up.sh down         # take them all down again
#   bash tests/cluster/nodes-up.sh shape I RATE # a token-bucket link for node I (tc tbf), e.g. 100mbit
#   bash tests/cluster/nodes-up.sh shape I off  # back to an unshaped link
#   bash tests/cluster/nodes-up.sh status       # one line per node
# Each node is a network namespace (cotsdl-nI) with a veth pair on one bridge (cotsdlbr0),
# address 10.213.77.I/24 (COTSDL_NODES_NET=A.B.C for another /24 that only these namespaces
# use; the bridge is A.B.C.254, the address mpiexec's -localhost takes), its own /etc/hosts
# (/etc/netns/cotsdl-nI/hosts: `ip netns exec` mounts it over /etc/hosts inside; the host's own
# file is never edited) and its own cores: node I gets the cores listed in
# /run/cotsdl-nodes/cotsdl-nI.cpus (the machine's cores split evenly, round-robin where nodes outnumber
# cores), so a rank there sees the cores its node really has.
#
# Ranks start on the nodes through tests/cluster/node-exec, a launcher for MPICH's Hydra
# (-launcher rsh -launcher-exec), which also gives each node its own hostname and IPC (unshare
# --uts --ipc).  The environment a person needs is printed by `nodes-up.sh env`:
#   eval "$(bash tests/cluster/nodes-up.sh env)"    # COTSDL_NODES_* and MPICH's TCP netmod
#   mpiexec $COTSDL_NODES_MPIEXEC -n 2 -ppn 1 python -m mpi4py -m cotsdl train CONFIG
# MPICH must use its TCP network module across the nodes (MPIR_CVAR_CH4_NETMOD=ofi,
# FI_PROVIDER=tcp): its default, UCX, takes the namespaces for one host and moves every byte
# through shared memory, so nothing would cross the links.  Idempotent; root only.
set -euo pipefail
log() { echo "[nodes] $*"; }
skip() { log "skipped: $*"; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
net=${COTSDL_NODES_NET:-10.213.77}
bridge=cotsdlbr0
prefix=cotsdl-n

nodes() {  # the names of the nodes that exist now, in order
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}[0-9]+\$" | sort -t n -k 2 -n || true
}

cmd=${1:-}
case $cmd in
    down)
        for n in $(nodes); do
            for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
            ip netns del "$n" 2>/dev/null || true
            rm -rf "/etc/netns/$n" "/run/cotsdl-nodes/$n.cpus"
        done
        ip link del "$bridge" 2>/dev/null || true
        log "down"
        exit 0 ;;
    status)
        for n in $(nodes); do
            i=${n#"$prefix"}
            q=$(tc -n "$n" qdisc show dev eth0 2>/dev/null | awk '/tbf/ {for (k = 1; k <= NF; k++) if ($k == "rate") print $(k + 1)}')
            state=$(ip -n "$n" -br link show eth0 2>/dev/null | awk '{print $2}')
            echo "$n $net.$i cpus=$(cat "/run/cotsdl-nodes/$n.cpus" 2>/dev/null) link=${state:-none} rate=${q:-unshaped}"
        done
        exit 0 ;;
    env)
        echo "export COTSDL_NODES_NET=$net"
        echo "export COTSDL_NODES_HOSTFILE=/run/cotsdl-nodes/hosts"
        echo "export COTSDL_NODES_MPIEXEC='-launcher rsh -launcher-exec $here/node-exec -f /run/cotsdl-nodes/hosts -localhost $net.254'"
        echo "export HYDRA_LAUNCHER_AUTOFORK=0 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp"
        exit 0 ;;
    shape)
        n=$prefix${2:?shape: which node (1, 2, ...)}
        rate=${3:?shape: a rate (100mbit, 1gbit) or off}
        ip netns list | grep -w "$n" >/dev/null || { log "no node $n (bash tests/cluster/nodes-up.sh N first)"; exit 1; }
        tc -n "$n" qdisc del dev eth0 root 2>/dev/null || true
        if [ "$rate" != off ]; then
            # burst: the bytes that may pass at line speed before the rate holds (one 64 KiB TSO
            # segment and change); latency: how long a packet may wait in the bucket's queue.
            tc -n "$n" qdisc add dev eth0 root tbf rate "$rate" burst 128kb latency 50ms
        fi
        log "$n: link ${rate/off/unshaped}"
        exit 0 ;;
    ''|*[!0-9]*)
        echo "usage: $0 N | down | shape I RATE | status | env" >&2
        exit 2 ;;
esac

want=$cmd
[ "$want" -ge 1 ] && [ "$want" -le 250 ] || { echo "nodes-up.sh: N must be 1..250, not $want" >&2; exit 2; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces and a bridge)"
for tool in ip tc unshare taskset; do
    command -v "$tool" >/dev/null || skip "no '$tool' here (iproute2, util-linux)"
done
if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge 2>/dev/null || skip "this kernel cannot make a bridge"
    ip addr add "$net.254/24" dev "$bridge"
fi
ip link set "$bridge" up
cpus=$(getconf _NPROCESSORS_ONLN)  # not nproc: it obeys OMP_NUM_THREADS
per=$(( cpus / want )); [ "$per" -ge 1 ] || per=1
hosts="127.0.0.1 localhost"
for i in $(seq "$want"); do hosts="$hosts
$net.$i $prefix$i"; done
mkdir -p /etc/netns /run/cotsdl-nodes
# Hydra's hostfile: one address a line (mpiexec -ppn K puts K consecutive ranks on each node)
for i in $(seq "$want"); do echo "$net.$i"; done > /run/cotsdl-nodes/hosts
for i in $(seq "$want"); do
    n=$prefix$i
    if ! ip netns list | grep -w "$n" >/dev/null; then
        ip netns add "$n" || skip "cannot make network namespaces here (ip netns add failed)"
        ip link add "cotsdl-v$i" type veth peer name eth0 netns "$n" || { ip netns del "$n"; skip "no veth pairs here"; }
        ip link set "cotsdl-v$i" master "$bridge" up
        ip -n "$n" addr add "$net.$i/24" dev eth0
        ip -n "$n" link set eth0 up
        ip -n "$n" link set lo up
    fi
    mkdir -p "/etc/netns/$n"
    printf '%s\n%s\n' "$hosts" "$net.254 cotsdl-head" > "/etc/netns/$n/hosts"
    first=$(( (i - 1) * per % cpus ))
    last=$(( first + per - 1 ))
    if [ "$per" -eq 1 ]; then echo "$first" > "/run/cotsdl-nodes/$n.cpus"; else echo "$first-$last" > "/run/cotsdl-nodes/$n.cpus"; fi
done
# Nodes beyond N from an earlier call stay (down removes them all); every node must answer.
for i in $(seq "$want"); do
    # a TCP connection to a closed port of the bridge: refused at once where the link works,
    # a time-out where it does not (no ping on a minimal machine)
    rc=0; ip netns exec "$prefix$i" timeout 3 bash -c "exec 3<>/dev/tcp/$net.254/9" 2>/dev/null || rc=$?
    [ "$rc" != 124 ] || { log "node $prefix$i does not reach the bridge $net.254"; exit 1; }
done
log "up: $(nodes | tr '\n' ' ')on $bridge ($net.0/24), $per core(s) each; eval \"\$(bash $0 env)\" for mpiexec"
