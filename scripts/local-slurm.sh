#!/usr/bin/env bash
# A real single-machine SLURM cluster with emulated nodes n1..nN (MULTIPLE_SLURMD), for tests and laptops.
#
# Usage: scripts/local-slurm.sh install|start|stop|status|env
#   install  apt-get install --no-install-recommends only the missing packages (slurmctld slurmd slurm-client
#            munge libpmix2 openmpi-bin) and add the unversioned libpmix.so link Debian's pmix plugin needs.
#   start    install, then wipe the scratch dir and start munged, slurmctld and one slurmd per node; waits until
#            every node is idle. Idempotent: when the cluster is already up it only says so.
#   stop     scancel every job, then stop the daemons by their PID files (never by name); removes the links.
#   status   exit 0 when every daemon is alive and sinfo answers, 3 otherwise.
#   env      print the exports that reach this cluster without the /etc and /usr/local links.
#
# All state (configs, munge key and socket, spool, logs, PID files, job-completion log) lives under one scratch
# directory, GYRE_SLURM_DIR (default /tmp/gyre-slurm), wiped on every start (job ids restart at 1).
# Two links make plain `sinfo`, `sbatch` and submitit work without exports; each is created only where nothing
# else is (or an earlier link of ours is), and removed on stop:
#   /etc/slurm/slurm.conf  -> $GYRE_SLURM_DIR/etc/slurm.conf
#   /usr/local/bin/sacct   -> scripts/sacct-standin (accounting is off; submitit needs sacct's answers)
# Settings: GYRE_SLURM_NODES (4), GYRE_SLURM_CPUS (CPUs per node, 4), GYRE_SLURM_MEM (MB per node, 2000),
# GYRE_SLURM_PORT (slurmctld port, 6817; slurmd ports follow it at +100..), GYRE_SLURM_LINKS (1; 0 = no links).
# Facts behind every setting: docs/slurm-local.md and ../shared/notes/slurm-local.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${GYRE_SLURM_DIR:-/tmp/gyre-slurm}"
NODES="${GYRE_SLURM_NODES:-4}"
CPUS="${GYRE_SLURM_CPUS:-4}"
MEM="${GYRE_SLURM_MEM:-2000}"
PORT="${GYRE_SLURM_PORT:-6817}"
LINKS="${GYRE_SLURM_LINKS:-1}"
PACKAGES=(slurmctld slurmd slurm-client munge libpmix2 openmpi-bin)
CONF="$DIR/etc/slurm.conf"
CONF_LINK=/etc/slurm/slurm.conf
SACCT_LINK=/usr/local/bin/sacct
T0=$(date +%s%N)

say() { printf 'local-slurm: %s\n' "$*"; }
die() { printf 'local-slurm: error: %s\n' "$*" >&2; exit 1; }
elapsed() { local ms=$((($(date +%s%N) - T0) / 1000000)); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }
node_names() { local i; for ((i = 1; i <= NODES; i++)); do printf 'n%d\n' "$i"; done; }
alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
slurmd_pid_files() { node_names | sed "s|^|$DIR/run/slurmd-|; s|$|.pid|"; }
pid_files() { echo "$DIR/run/munged.pid" "$DIR/run/slurmctld.pid"; slurmd_pid_files; }
slurm() { SLURM_CONF="$CONF" "$@"; }

# ------------------------------------------------------------------------------------------------ install
install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
        [[ $(id -u) -eq 0 ]] || die "missing packages ${missing[*]}; run as root or apt-get install them"
        say "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >"/tmp/local-slurm-apt.log" 2>&1; then
            say "apt-get install failed; running apt-get update and retrying"
            apt-get update -q >>"/tmp/local-slurm-apt.log" 2>&1
            apt-get install -y -q --no-install-recommends "${missing[@]}" >>"/tmp/local-slurm-apt.log" 2>&1 \
                || die "apt-get install failed; see /tmp/local-slurm-apt.log"
        fi
    fi
    # Debian's mpi_pmix plugin dlopens an unversioned libpmix.so that only libpmix-dev ships.
    local lib
    for lib in /usr/lib/*/pmix2/lib/libpmix.so.2; do
        [[ -e "$lib" && ! -e "${lib%.2}" ]] && ln -s "$(basename "$lib")" "${lib%.2}" && say "linked ${lib%.2}"
    done
    return 0
}

# ------------------------------------------------------------------------------------------------ configs
write_configs() {
    local last=$NODES first_port=$((PORT + 100))
    mkdir -p "$DIR"/{etc,run,log,state,spool,tmp,cgroup,bin}
    touch "$DIR/.gyre-local-slurm"
    node_names | while read -r n; do mkdir -p "$DIR/spool/$n" "$DIR/tmp/$n"; done
    cat >"$CONF" <<EOF
# Written by scripts/local-slurm.sh; wiped on every start.
ClusterName=gyre-local
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket.2
StateSaveLocation=$DIR/state
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmdSpoolDir=$DIR/spool/%n
TmpFS=$DIR/tmp/%n
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=$DIR/etc/task-prolog.sh
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
EnforcePartLimits=ALL
MpiDefault=pmix
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
ReturnToService=2
KillWait=5
MinJobAge=600
# batch jobs are scheduled at submit, not up to batch_sched_delay (3 s by default) later: a 4-node "srun true" job
# took 3.0 s from sbatch to its end, 1.0 s with 0 (the ~30 batch jobs of the test suite wait 2 s less each)
SchedulerParameters=batch_sched_delay=0
InactiveLimit=0
NodeName=n[1-$last] NodeAddr=127.0.0.1 NodeHostname=localhost Port=[$first_port-$((first_port + NODES - 1))] \
    CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=n[1-$last] Default=YES MaxTime=INFINITE State=UP
EOF
    # slurmd 22.05 reads cgroup.conf even with proctrack/linuxproc; nothing is mounted or written there.
    cat >"$DIR/etc/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupMountpoint=$DIR/cgroup
CgroupAutomount=no
EOF
    # Open MPI's shared-memory transport segfaults across emulated nodes of one machine; its TCP stays on
    # loopback (the machine's other interfaces are not ours to use).
    cat >"$DIR/etc/task-prolog.sh" <<'EOF'
#!/bin/sh
echo export OMPI_MCA_btl=self,tcp
echo export OMPI_MCA_btl_tcp_if_include=lo
echo export OMPI_MCA_oob_tcp_if_include=lo
EOF
    chmod +x "$DIR/etc/task-prolog.sh"
    ln -s "$HERE/sacct-standin" "$DIR/bin/sacct"
}

# ------------------------------------------------------------------------------------------------ links
# A link is ours when it points into a directory holding the .gyre-local-slurm marker or at our stand-in.
ours() {
    local t
    t=$(readlink "$1") || return 1
    [[ -e "$(dirname "$(dirname "$t")")/.gyre-local-slurm" || "$(basename "$t")" == sacct-standin ]]
}

link_if_free() {  # link_if_free TARGET LINK: only where nothing else is, or an earlier link of ours
    if [[ ! -e "$2" && ! -L "$2" ]] || ours "$2"; then ln -sfn "$1" "$2"
    else say "warning: $2 exists and is not ours; use: eval \"\$($0 env)\""; fi
}

make_links() {
    [[ "$LINKS" == 1 ]] || return 0
    mkdir -p "$(dirname "$CONF_LINK")"
    link_if_free "$CONF" "$CONF_LINK"
    link_if_free "$HERE/sacct-standin" "$SACCT_LINK"
}

remove_links() {  # only the links of this cluster (the config link points at this $CONF)
    [[ "$LINKS" == 1 && -L "$CONF_LINK" && "$(readlink "$CONF_LINK")" == "$CONF" ]] || return 0
    rm -f "$CONF_LINK"
    [[ -L "$SACCT_LINK" ]] && ours "$SACCT_LINK" && rm -f "$SACCT_LINK"
    return 0
}

# ------------------------------------------------------------------------------------------------ daemons
start_munge() {
    mkdir -p "$DIR/munge"
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    chmod 755 "$DIR/munge" && chmod 400 "$DIR/munge/munge.key"
    chown -R munge:munge "$DIR/munge"
    runuser -u munge -- test -x "$DIR/munge" \
        || die "the munge user cannot reach $DIR/munge: every parent directory of GYRE_SLURM_DIR must be o+x"
    runuser -u munge -- /usr/sbin/munged --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket.2" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" \
        || die "munged failed; see $DIR/munge/munged.log"
    cp "$DIR/munge/munged.pid" "$DIR/run/munged.pid"
}

start_daemons() {
    start_munge
    slurm /usr/sbin/slurmctld -i -f "$CONF" || die "slurmctld failed; see $DIR/log/slurmctld.log"
    local n
    for n in $(node_names); do
        slurm /usr/sbin/slurmd -N "$n" -f "$CONF" || die "slurmd -N $n failed; see $DIR/log/slurmd-$n.log"
    done
}

wait_idle() {
    local deadline=$((SECONDS + 60)) states
    while ((SECONDS < deadline)); do
        states=$(slurm sinfo -h -N -o %t 2>/dev/null | sort -u | tr '\n' ' ')
        [[ "$states" == "idle " ]] && [[ $(slurm sinfo -h -N -o %N | wc -l) -eq $NODES ]] && return 0
        sleep 0.1
    done
    tail -n 20 "$DIR"/log/*.log >&2 || true
    die "nodes not idle after 60 s (states: ${states:-none}); logs above, all under $DIR/log"
}

running() {
    [[ -f "$DIR/.gyre-local-slurm" ]] || return 1
    local f
    for f in $(pid_files); do alive "$f" || return 1; done
    slurm scontrol ping >/dev/null 2>&1
}

stop_pid() {  # stop_pid FILE...: TERM each live PID, wait up to 15 s for all, then KILL the rest
    local f pids=() p
    for f in "$@"; do alive "$f" && pids+=("$(cat "$f")"); done
    ((${#pids[@]})) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
        local left=()
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left+=("$p"); done
        ((${#left[@]})) || return 0
        sleep 0.1
    done
    kill -KILL "${left[@]}" 2>/dev/null || true
}

# ------------------------------------------------------------------------------------------------ commands
cmd_stop() {
    if [[ -f "$DIR/run/slurmctld.pid" ]] && alive "$DIR/run/slurmctld.pid"; then
        slurm scancel --quiet --user="$(id -un)" 2>/dev/null || true
        local deadline=$((SECONDS + 15))  # let slurmstepd end the jobs (KillWait=5) before slurmd goes
        while [[ -n "$(slurm squeue -h -o %i 2>/dev/null)" ]] && ((SECONDS < deadline)); do sleep 0.1; done
    fi
    # All at once: each daemon takes 1.5-2 s to exit, one after another they took 6 s.
    # shellcheck disable=SC2046
    stop_pid $(pid_files)
    remove_links
    say "stopped in $(elapsed) s"
}

cmd_start() {
    [[ $(id -u) -eq 0 ]] || die "start needs root: munged runs as the munge user, the SLURM daemons as root"
    install_packages
    if running; then
        make_links
        say "already running ($NODES nodes, $DIR); checked in $(elapsed) s"
        return 0
    fi
    if [[ -e "$DIR" ]]; then
        [[ -f "$DIR/.gyre-local-slurm" || -z "$(ls -A "$DIR")" ]] \
            || die "$DIR exists and was not made by this script; set GYRE_SLURM_DIR to another directory"
        cmd_stop >/dev/null  # a half-started cluster: stop what is left, by PID
        rm -rf "${DIR:?}"
    fi
    write_configs
    start_daemons
    wait_idle
    make_links
    say "started $NODES nodes x $CPUS CPUs in $(elapsed) s; state under $DIR"
}

cmd_status() {
    if running; then
        slurm sinfo -N -o '%N %t %c'
        return 0
    fi
    local f
    for f in $(pid_files); do alive "$f" || say "not running: $(basename "$f" .pid)"; done
    return 3
}

cmd_env() {
    printf 'export SLURM_CONF=%q\nexport PATH=%q:"$PATH"\n' "$CONF" "$DIR/bin"
}

case "${1:-}" in
    install) install_packages; say "packages present in $(elapsed) s" ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) cmd_env ;;
    *) echo "usage: $0 install|start|stop|status|env" >&2; exit 2 ;;
esac
