#!/usr/bin/env bash
# A real Slurm cluster on this machine, for trying and testing hvdtrain's Slurm launches
# (docs/clusters.md, "On a Slurm cluster"). Debian's slurm-wlm and munge; needs root.
#
#   scripts/slurm-local.sh start DIR   write DIR/slurm.conf, start munged (unless one
#                                      runs), slurmctld and slurmd; wait until the node
#                                      takes jobs; print `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm-local.sh start DIR NODE=NETNS [NODE=NETNS ...]
#                                      several nodes: one slurmd per network namespace
#                                      NETNS, named NODE (its host name there; its first
#                                      IPv4 address is the node's address); slurmctld
#                                      runs in the first one
#   scripts/slurm-local.sh stop DIR    stop the daemons started by `start DIR`
#
# State, spool, logs and pid files live in DIR. Then, for example:
#   export SLURM_CONF=DIR/slurm.conf
#   srun -n 2 --mpi=pmix .venv/bin/python examples/torch_train.py
# With several nodes, run the clients in a node's namespace, where the nodes are reachable:
#   ip netns exec NETNS srun -N 2 -n 2 --mpi=pmix .venv/bin/python examples/torch_train.py
# The namespaces are yours to make: each with an address on a network the others reach
# and /etc/netns/NETNS/hosts naming every node (tests/ssh_hosts.py makes such hosts, with
# sshd for `horovodrun -H`).
set -euo pipefail

die() { printf 'slurm-local: %s\n' "$*" >&2; exit 1; }

usage() { die "usage: $0 start DIR [NODE=NETNS ...] | stop DIR"; }

[ $# -ge 2 ] || usage
ACTION="$1"
DIR="$(mkdir -p "$2" && cd "$2" && pwd)"
CONF="$DIR/slurm.conf"
shift 2
NODES=()       # several nodes: their names, and by index their namespaces and addresses
NAMESPACES=()
ADDRESSES=()
for pair in "$@"; do
    [[ "$pair" == ?*=?* ]] || die "a node is NODE=NETNS, got '$pair'"
    NODES+=("${pair%%=*}")
    NAMESPACES+=("${pair#*=}")
done

require() {
    [ "$(id -u)" -eq 0 ] || die "needs root (slurmd runs jobs as their users; munged's key is root's to read)"
    local tool
    for tool in slurmctld slurmd munged srun scontrol sinfo; do
        command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] \
            || die "$tool not found: install Debian's slurm-wlm and munge (scripts/setup.sh does)"
    done
    [ -r /etc/munge/munge.key ] || die "/etc/munge/munge.key is missing: reinstall munge (apt-get install --reinstall munge)"
}

find_addresses() {
    local i address
    for i in "${!NODES[@]}"; do
        ip netns pids "${NAMESPACES[$i]}" >/dev/null 2>&1 \
            || die "no network namespace '${NAMESPACES[$i]}' (for node ${NODES[$i]}): make it first (ip netns add)"
        address="$(ip -n "${NAMESPACES[$i]}" -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -n 1)"
        [ -n "$address" ] || die "namespace ${NAMESPACES[$i]} has no IPv4 address for node ${NODES[$i]}"
        ADDRESSES+=("$address")
    done
}

node_lines() {  # the NodeName lines: this machine, or each node at its address
    local i
    if [ "${#NODES[@]}" -eq 0 ]; then
        echo "NodeName=$(hostname -s) CPUs=$(nproc) State=UNKNOWN"
        return
    fi
    for i in "${!NODES[@]}"; do
        echo "NodeName=${NODES[$i]} NodeAddr=${ADDRESSES[$i]} CPUs=$(nproc) State=UNKNOWN"
    done
}

write_config() {
    local controller kind="A one-node cluster"
    controller="$(hostname -s)"
    if [ "${#NODES[@]}" -gt 0 ]; then
        controller="${NODES[0]}(${ADDRESSES[0]})"
        kind="A cluster of ${#NODES[@]} nodes in network namespaces"
    fi
    mkdir -p "$DIR/state" "$DIR/spool"
    cat >"$CONF" <<EOF
# $kind for hvdtrain (scripts/slurm-local.sh).
ClusterName=hvdtrain
SlurmctldHost=$controller
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
TmpFS=$DIR/tmp/%n
$(node_lines)
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

# What a node runs before its daemon: its host name, and this machine's cgroup file
# systems mounted again (as in /proc/1/mounts) over the /sys that `ip netns exec` mounts
# afresh without them, since slurmd stops without them. Only in that mount namespace.
NODE_SETUP='hostname "$0" && grep " /sys/fs/cgroup" /proc/1/mounts | while read -r _ path type options _; do mkdir -p "$path" && mount -t "$type" -o "$options" "$type" "$path" || exit 1; done'

on_node() {  # on_node INDEX COMMAND...: COMMAND in node INDEX's namespace, under its name
    local index="$1"
    shift
    ip netns exec "${NAMESPACES[$index]}" unshare --uts sh -c "$NODE_SETUP"' && exec "$@"' \
        "${NODES[$index]}" "$@"
}

client() {  # a Slurm client where the controller is reachable
    if [ "${#NODES[@]}" -eq 0 ]; then
        SLURM_CONF="$CONF" "$@"
    else
        SLURM_CONF="$CONF" ip netns exec "${NAMESPACES[0]}" "$@"
    fi
}

start_munged() {
    if pgrep -x munged >/dev/null; then
        return
    fi
    mkdir -p /run/munge
    chown munge:munge /run/munge
    runuser -u munge -- /usr/sbin/munged
    echo started >"$DIR/munged.ours"
}

start() {
    require
    if [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
        die "a cluster from $DIR already runs; stop it first: $0 stop $DIR"
    fi
    find_addresses
    write_config
    start_munged
    local i wanted=1 waited=0
    if [ "${#NODES[@]}" -eq 0 ]; then
        mkdir -p "$DIR/spool/$(hostname -s)" "$DIR/tmp/$(hostname -s)"
        /usr/sbin/slurmctld -f "$CONF" -i
        /usr/sbin/slurmd -f "$CONF"
    else
        wanted="${#NODES[@]}"
        on_node 0 /usr/sbin/slurmctld -f "$CONF" -i
        for i in "${!NODES[@]}"; do
            mkdir -p "$DIR/spool/${NODES[$i]}" "$DIR/tmp/${NODES[$i]}"
            on_node "$i" /usr/sbin/slurmd -f "$CONF" -N "${NODES[$i]}"
        done
    fi
    until [ "$(client sinfo -h -N -o '%t' 2>/dev/null | grep -Ec '^(idle|mix|alloc)')" -ge "$wanted" ]; do
        waited=$((waited + 1))
        if [ "$waited" -gt 60 ]; then
            tail -n 20 "$DIR"/slurm*.log >&2 || true
            die "the nodes did not come up within 30 s (logs above, in $DIR)"
        fi
        sleep 0.5
    done
    echo "export SLURM_CONF=$CONF"
}

stop_pid_file() {  # stop_pid_file FILE: SIGTERM, then SIGKILL after 10 s
    local file="$1" pid waited=0
    [ -f "$file" ] || return 0
    pid="$(cat "$file")"
    kill "$pid" 2>/dev/null || { rm -f "$file"; return 0; }
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 20 ]; do
        sleep 0.5
        waited=$((waited + 1))
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$file"
}

stop() {
    local file
    for file in "$DIR"/slurmd-*.pid; do
        stop_pid_file "$file"
    done
    stop_pid_file "$DIR/slurmctld.pid"
    if [ -f "$DIR/munged.ours" ]; then
        pkill -x munged || true
        rm -f "$DIR/munged.ours"
    fi
}

case "$ACTION" in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
