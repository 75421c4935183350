#!/usr/bin/env bash
# A real Slurm (Debian's slurm-wlm 22.05: slurmctld, one slurmd per machine, munge) on emulated
# machines (scripts/nodes.sh: one network namespace per machine, its own hostname and address), so
# `sbatch` jobs run dpurun across them as on a cluster. Needs root (ip netns, apt-get).
#
#   bash scripts/slurm.sh up                 # machines ctl (the controller), h0 h1 (hosts), h0-bf h1-bf (DPUs)
#   bash scripts/slurm.sh sbatch job.sbatch  # Slurm's commands run on the controller's machine:
#   bash scripts/slurm.sh squeue             #   sbatch, srun, salloc, squeue, scancel, scontrol, sinfo
#   bash scripts/slurm.sh mpi-flags          # dpurun's --mpirun-arg for these machines (in a job script)
#   bash scripts/slurm.sh status             # up | down (and the nodes' states); exit code 0 when up
#   bash scripts/slurm.sh down               # nothing of it left running (also after a failed `up`)
#   bash scripts/slurm.sh install            # only the packages (apt-get, when missing)
#
# The cluster: every machine but the controller is a Slurm node (NodeName = its hostname, NodeAddr =
# its address, 2 CPUs each: the box's). Two partitions, one per kind of site with BlueField DPUs:
# - `all` (the default): host nodes and DPU nodes (names matching `bf`): DPUs as Slurm nodes,
#   `dpurun --dpu-nodes bf`;
# - `hosts`: the host nodes only: DPUs outside Slurm, `dpurun --dpu-name '{host}-bf'` (the DPU
#   machines are up and resolve, but never allocated).
# Settings this box needs, and why (see ../shared/notes/platform.md, "Slurm"):
# - ProctrackType=proctrack/linuxproc, TaskPlugin=task/none: no systemd nor a delegated cgroup tree here
#   (linuxproc finds a job's processes by their parents, so a job's ranks that Open MPI starts on other
#   machines through nodes-agent.sh, children of mpirun, are the job's too);
# - one slurmd per machine, each in its machine's namespace under its own hostname (`slurmd -N NAME`),
#   so the same port (6818) serves every machine; SlurmdSpoolDir, SlurmdPidFile and SlurmdLogFile
#   carry %n (each slurmd its own); state, spool and logs under DPUOFFLOAD_SLURM_DIR (default
#   /run/PREFIX-slurm; the logs in its log/);
# - a munged of its own (key, socket, pid file under that dir; AuthInfo=socket=...), not the system's;
# - each slurmd reads a copy of slurm.conf beside an mpi.conf of its own: Slurm's PMIx plugin (srun
#   --mpi=pmix) makes a directory per job step under PMIxCliTmpDirBase (default: TmpFS, /tmp), and
#   machines that share one /tmp collide on it ("File exists"); each gets DIR/pmix/NAME. (Debian's
#   plugin also needs libpmix-dev, for the unversioned libpmix.so it opens: not installed here, as
#   dpurun starts its ranks with mpirun; `srun --mpi=pmix` works with it, see docs/cluster.md.)
# - SlurmUser=root, no accounting (jobcomp/none, accounting_storage/none), ReturnToService=2.
# Jobs get the submitter's environment (sbatch's default --export=ALL) and run in its directory (this
# box's file system is every machine's: a cluster's shared file system).
# Knobs: DPUOFFLOAD_SLURM_PREFIX (the machines' namespace prefix, default dpslurm),
# DPUOFFLOAD_SLURM_SUBNET (default 10.75.0), DPUOFFLOAD_SLURM_MACHINES (the nodes, default
# "h0 h1 h0-bf h1-bf"), DPUOFFLOAD_SLURM_DIR.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=${DPUOFFLOAD_SLURM_PREFIX:-dpslurm}
SUBNET=${DPUOFFLOAD_SLURM_SUBNET:-10.75.0}
read -r -a MACHINES <<< "${DPUOFFLOAD_SLURM_MACHINES:-h0 h1 h0-bf h1-bf}"
DIR=${DPUOFFLOAD_SLURM_DIR:-/run/$PREFIX-slurm}
CONF=$DIR/slurm.conf
CGROUP=/run/$PREFIX-cgroup   # this box's /sys/fs/cgroup, seen again where `ip netns exec` hides it (see show_cgroups)
CTL=ctl   # the controller's machine (the first one nodes.sh brings up: address SUBNET.1)
NODES=(env DPUOFFLOAD_NETNS_PREFIX="$PREFIX" DPUOFFLOAD_NETNS_SUBNET="$SUBNET" bash "$ROOT/scripts/nodes.sh")
PACKAGES=(slurmctld slurmd slurm-client munge)

die() { echo "slurm.sh: error: $*" >&2; exit 1; }
say() { echo "slurm.sh: $*"; }

install() {  # Debian's packages, when missing (their services are not started: there is no systemd here)
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  [ "$(id -u)" = 0 ] || die "Slurm is not installed (${missing[*]}) and installing it needs root (apt-get)"
  command -v apt-get > /dev/null || die "no apt-get: install ${missing[*]} (Slurm 22.05 and munge) by hand"
  local t0=$SECONDS
  say "apt-get install ${missing[*]}"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > "$DIR.apt.log" 2>&1; then
    apt-get update -qq > /dev/null 2>&1 || true  # (package lists missing or stale)
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > "$DIR.apt.log" 2>&1 \
      || die "apt-get install ${missing[*]} failed (the Debian package archive must be reachable): $(tail -n 3 "$DIR.apt.log" | tr '\n' ' ')"
  fi
  say "installed in $((SECONDS - t0)) s"
  rm -f "$DIR.apt.log"
}

write_conf() {
  local i=1 name nodes=() hosts=()
  for name in "${MACHINES[@]}"; do
    i=$((i + 1))
    nodes+=("NodeName=$name NodeAddr=$SUBNET.$i CPUs=$(nproc) State=UNKNOWN")
    [[ $name == *bf* ]] || hosts+=("$name")
  done
  cat > "$CONF" <<EOF
# Written by scripts/slurm.sh for the emulated machines (namespaces $PREFIX-*); rewritten by each \`up\`.
ClusterName=dpuoffload
SlurmctldHost=$CTL($SUBNET.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
KillWait=30
InactiveLimit=0
SlurmdTimeout=300
$(printf '%s\n' "${nodes[@]}")
PartitionName=all Nodes=$(IFS=,; echo "${MACHINES[*]}") Default=YES MaxTime=INFINITE State=UP
PartitionName=hosts Nodes=$(IFS=,; echo "${hosts[*]}") MaxTime=INFINITE State=UP
EOF
  for name in "${MACHINES[@]}"; do  # each slurmd reads a copy, beside an mpi.conf of its own (see the top)
    mkdir -p "$DIR/etc/$name" "$DIR/pmix/$name"
    cp "$CONF" "$DIR/etc/$name/slurm.conf"
    echo "PMIxCliTmpDirBase=$DIR/pmix/$name" > "$DIR/etc/$name/mpi.conf"
  done
}

show_cgroups() {  # slurmd (22.05) will not start without a cgroup tree at /sys/fs/cgroup, even with
  # proctrack/linuxproc and task/none, and `ip netns exec` mounts a sysfs of the namespace's own over /sys
  # (hiding the cgroup mounts): the tree is bind-mounted here first, then over /sys/fs/cgroup in each
  # slurmd's mount namespace (nothing is written to it: no plugin here uses cgroups)
  mkdir -p "$CGROUP"
  mountpoint -q "$CGROUP" || mount --rbind /sys/fs/cgroup "$CGROUP"
  mount --make-rslave "$CGROUP"
}

hide_cgroups() {
  if mountpoint -q "$CGROUP"; then umount -R "$CGROUP" || umount -R -l "$CGROUP"; fi
  ! mountpoint -q "$CGROUP" || die "cannot unmount $CGROUP"
  rmdir "$CGROUP" 2> /dev/null || true
}

start_munge() {
  mkdir -p "$DIR/munge"
  chmod 0700 "$DIR/munge"
  [ -f "$DIR/munge/munge.key" ] || dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$DIR/munge/munge.key"
  munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" \
    || die "munged did not start: $(tail -n 3 "$DIR/log/munged.log" 2> /dev/null | tr '\n' ' ')"
}

on() {  # on MACHINE CMD...: CMD on that machine (its namespace and hostname), told where slurm.conf is
  local name=$1; shift
  "${NODES[@]}" run "$name" env SLURM_CONF="$CONF" DPUOFFLOAD_NETNS_PREFIX="$PREFIX" "$@"
}

up() {
  [ "$(id -u)" = 0 ] || die "the emulated machines need root (ip netns); run as root"
  if running; then say "up already: $(describe)"; return 0; fi
  if [ -e "$DIR" ] || [ -e "/run/$PREFIX-nodes" ]; then down > /dev/null 2>&1; fi  # what a failed or killed `up` left
  mkdir -p "$DIR/log" "$DIR/state" "$DIR/spool"
  install
  local t0=$SECONDS
  trap 'down > /dev/null 2>&1' EXIT  # a failed `up` takes down what it made
  "${NODES[@]}" up "$CTL" "${MACHINES[@]}" > /dev/null
  write_conf
  show_cgroups
  start_munge
  on "$CTL" slurmctld -f "$CONF" || die "slurmctld did not start: $(tail -n 5 "$DIR/log/slurmctld.log" | tr '\n' ' ')"
  local name
  for name in "${MACHINES[@]}"; do
    on "$name" sh -c 'mount --rbind "$0" /sys/fs/cgroup && exec "$@"' "$CGROUP" slurmd -f "$DIR/etc/$name/slurm.conf" -N "$name" \
      || die "slurmd on $name did not start: $(tail -n 5 "$DIR/log/slurmd-$name.log" | tr '\n' ' ')"
  done
  wait_idle
  trap - EXIT
  say "up in $((SECONDS - t0)) s: $(describe)"
}

wait_idle() {  # until every node registered (idle), at most 30 s
  local waited=0 states
  while :; do
    states=$(on "$CTL" sinfo -h -N -o '%N %t' 2> /dev/null | sort -u || true)
    if [ -n "$states" ] && ! grep -qv ' idle$' <<< "$states"; then return 0; fi
    [ $waited -lt 300 ] || die "the nodes did not all register in 30 s: $(tr '\n' ' ' <<< "$states") (logs: $DIR/log)"
    waited=$((waited + 1)); sleep 0.1
  done
}

running() {  # the controller answers
  [ -f "$CONF" ] && on "$CTL" scontrol ping 2> /dev/null | grep -q "is UP"
}

describe() {
  echo "nodes $(IFS=,; echo "${MACHINES[*]}") (controller $CTL, $SUBNET.1; partitions all, hosts; SLURM_CONF=$CONF, logs $DIR/log)"
}

status() {
  if running; then
    say "up: $(describe)"
    on "$CTL" sinfo -N -o '%N %P %t %c'
  else
    say "down"
    return 3
  fi
}

down() {
  [ "$(id -u)" = 0 ] || die "taking the emulated machines down needs root"
  if [ -f "$CONF" ]; then on "$CTL" scontrol shutdown > /dev/null 2>&1 || true; fi
  # Every process on the machines (slurmctld, slurmd, slurmstepd, jobs) goes with their namespaces
  "${NODES[@]}" down "$CTL" "${MACHINES[@]}"
  local pid
  pid=$(cat "$DIR/munge/munged.pid" 2> /dev/null || true)
  if [ -n "$pid" ] && grep -qs munged "/proc/$pid/cmdline"; then
    kill "$pid" 2> /dev/null || true
    for _ in $(seq 50); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
  fi
  hide_cgroups
  rm -rf "$DIR"
}

case "${1:-}" in
  up) up ;;
  down) down; say "down" ;;
  status) status ;;
  install) mkdir -p "$(dirname "$DIR")"; install ;;
  mpi-flags) "${NODES[@]}" mpi-flags ;;
  sbatch | srun | salloc | squeue | scancel | scontrol | sinfo | sacct) on "$CTL" "$@" ;;
  run) shift; [ $# -ge 2 ] || die "usage: run MACHINE COMMAND..."; on "$@" ;;
  *) die "usage: bash scripts/slurm.sh up | status | down | install | mpi-flags | sbatch|srun|squeue|scancel|scontrol|sinfo ARGS... | run MACHINE CMD..." ;;
esac
