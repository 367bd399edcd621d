#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for trying `ablate grid --backend slurm` and for
# the cluster tests. Everything it creates lives under one folder of its own (its slurm.conf,
# its munge key and socket, state, spool, logs) and it listens on its own ports, so it never
# touches a SLURM or munge that is already configured here.
#
#   scripts/slurm-local.sh start     install slurm-wlm + munge if missing (apt, as root), start
#                                    munged, slurmctld and slurmd, wait until the node is idle
#   scripts/slurm-local.sh stop      stop the three daemons again (the folder is kept)
#   scripts/slurm-local.sh status    sinfo of this cluster, or "not running" (exit 1)
#   scripts/slurm-local.sh env       the line to eval so sbatch/squeue/ablate use this cluster:
#                                    eval "$(scripts/slurm-local.sh env)"
#
# Environment: ABLATE_SLURM_DIR (default /tmp/ablate-slurm), ABLATE_SLURM_PORT (slurmctld's
# port, default 16817; slurmd uses the next one), ABLATE_SLURM_MAXTIME (partition MaxTime in
# minutes, default 60). start and stop are idempotent.
set -euo pipefail

DIR=${ABLATE_SLURM_DIR:-/tmp/ablate-slurm}
PORT=${ABLATE_SLURM_PORT:-16817}
MAXTIME=${ABLATE_SLURM_MAXTIME:-60}
CONF=$DIR/slurm.conf
MUNGE_SOCKET=$DIR/munge/munge.socket.2
export SLURM_CONF=$CONF

say() { echo "slurm-local: $*" >&2; }
die() { say "error: $*"; exit 1; }

pid_alive() {  # pid_alive FILE: the process named in FILE is running
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

install_if_missing() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sbatch >/dev/null; then
        return
    fi
    [[ $(id -u) -eq 0 ]] || die "slurmctld, slurmd or munged is missing; run this as root once to install them (apt-get install slurm-wlm munge)"
    command -v apt-get >/dev/null || die "slurmctld, slurmd or munged is missing and there is no apt-get here; install SLURM and munge with this system's package manager"
    say "installing slurm-wlm and munge (apt-get)"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
}

write_config() {
    mkdir -p "$DIR"/{munge,state,spool,log,run}
    chmod 0700 "$DIR/munge"  # munged refuses a key or socket folder that others can write to
    if [[ ! -s $DIR/munge/munge.key ]]; then
        mungekey --create --keyfile="$DIR/munge/munge.key" 2>/dev/null \
            || dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
        chmod 0400 "$DIR/munge/munge.key"
    fi
    local host node
    host=$(hostname -s)
    # This machine's real CPUs, sockets, cores and memory, as slurmd itself detects them.
    node=$(slurmd -C | head -1 | sed -e 's/ UpTime=.*//')
    : >"$DIR/plugstack.conf"
    cat >"$CONF.tmp" <<EOF
# Written by scripts/slurm-local.sh: a one-node cluster for ablate's tests; edit the script, not this.
ClusterName=ablate-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=$(id -un)
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Our own munged; cred_expire also sets how long a requeued job waits before it may start
# again (SLURM's default, 120 s, would make every time-limit requeue idle for two minutes).
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
PlugStackConfig=$DIR/plugstack.conf
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups and no accounting daemon: nothing outside this folder is needed.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=30
MinJobAge=600
InactiveLimit=0
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=$MAXTIME State=UP
EOF
    mv "$CONF.tmp" "$CONF"
}

wait_idle() {
    local state=""
    for _ in $(seq 1 60); do
        state=$(sinfo -h -o %T 2>/dev/null | head -1 || true)
        case $state in
            idle|mixed|allocated) return 0 ;;
            down*|drain*) scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 1
    done
    die "the node is not idle after 60 s (sinfo says '${state:-nothing}'); see $DIR/log/"
}

start() {
    install_if_missing
    if pid_alive "$DIR/run/slurmctld.pid" && pid_alive "$DIR/run/slurmd.pid" && sinfo -h >/dev/null 2>&1; then
        say "already running ($CONF)"
        wait_idle
        sinfo
        return
    fi
    write_config
    if ! pid_alive "$DIR/run/munged.pid"; then
        munged --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" --pid-file="$DIR/run/munged.pid" \
            --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" --force
    fi
    pid_alive "$DIR/run/slurmctld.pid" || slurmctld -f "$CONF"
    pid_alive "$DIR/run/slurmd.pid" || slurmd -f "$CONF"
    wait_idle
    say "running; use it with: export SLURM_CONF=$CONF"
    sinfo
}

stop_pid() {  # stop_pid NAME FILE: SIGTERM the daemon, wait for it to go
    local file=$2
    if pid_alive "$file"; then
        local pid
        pid=$(cat "$file")
        kill "$pid"
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        say "stopped $1 ($pid)"
    fi
    rm -f "$file"
}

stop() {
    stop_pid slurmd "$DIR/run/slurmd.pid"
    stop_pid slurmctld "$DIR/run/slurmctld.pid"
    stop_pid munged "$DIR/run/munged.pid"
}

case ${1:-start} in
    start) start ;;
    stop) stop ;;
    status)
        if pid_alive "$DIR/run/slurmctld.pid" && sinfo 2>/dev/null; then exit 0; fi
        say "not running ($CONF)"; exit 1 ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) die "unknown command '$1'; valid: start, stop, status, env" ;;
esac
