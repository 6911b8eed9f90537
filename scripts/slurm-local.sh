#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for trying and testing hvdtrain's Slurm
# launches (docs/clusters.md, "On a Slurm cluster"). Debian's slurm-wlm and munge; needs root.
#
#   scripts/slurm-local.sh start DIR   write DIR/slurm.conf, start munged (unless one
#                                      runs), slurmctld and slurmd; wait until the node
#                                      takes jobs; print `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm-local.sh stop DIR    stop the daemons started by `start DIR`
#
# State, spool, logs and pid files live in DIR. Then, for example:
#   export SLURM_CONF=DIR/slurm.conf
#   srun -n 2 --mpi=pmix .venv/bin/python examples/torch_train.py
set -euo pipefail

die() { printf 'slurm-local: %s\n' "$*" >&2; exit 1; }

usage() { die "usage: $0 start DIR | stop DIR"; }

[ $# -eq 2 ] || usage
ACTION="$1"
DIR="$(mkdir -p "$2" && cd "$2" && pwd)"
CONF="$DIR/slurm.conf"

require() {
    [ "$(id -u)" -eq 0 ] || die "needs root (slurmd runs jobs as their users; munged's key is root's to read)"
    local tool
    for tool in slurmctld slurmd munged srun scontrol sinfo; do
        command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] \
            || die "$tool not found: install Debian's slurm-wlm and munge (scripts/setup.sh does)"
    done
    [ -r /etc/munge/munge.key ] || die "/etc/munge/munge.key is missing: reinstall munge (apt-get install --reinstall munge)"
}

write_config() {
    local node
    node="$(hostname -s)"
    mkdir -p "$DIR/state" "$DIR/spool"
    cat >"$CONF" <<EOF
# A one-node cluster for hvdtrain (scripts/slurm-local.sh).
ClusterName=hvdtrain
SlurmctldHost=$node
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
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
NodeName=$node CPUs=$(nproc) State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
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
    write_config
    start_munged
    /usr/sbin/slurmctld -f "$CONF" -i
    /usr/sbin/slurmd -f "$CONF"
    local waited=0
    until SLURM_CONF="$CONF" sinfo -h -o '%t' 2>/dev/null | grep -Eq '^(idle|mix|alloc)'; do
        waited=$((waited + 1))
        if [ "$waited" -gt 60 ]; then
            tail -n 20 "$DIR/slurmctld.log" "$DIR/slurmd.log" >&2 || true
            die "the node did not come up within 30 s (logs above, in $DIR)"
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
    stop_pid_file "$DIR/slurmd.pid"
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
