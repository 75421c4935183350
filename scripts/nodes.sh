#!/usr/bin/env bash
# Emulated nodes on one box: one network namespace per "machine" (host nodes and their DPUs), each
# with its own hostname and address, joined by one switch (a bridge; with a link delay, a userspace
# delay line), so `dpurun` runs in cluster mode over real TCP, as on a cluster where every DPU is a
# machine of its own. Needs root (ip netns).
#
#   bash scripts/nodes.sh up h0 h1 d0 d1        # 4 machines: 10.77.0.1 .. 10.77.0.4, named h0 .. d1
#   bash scripts/nodes.sh dpurun --hosts h0:1,h1:1 --dpus d0:1,d1:1 --host-ranks 2 --dpu-ranks 2 \
#       -- --preset debug --data /tmp/dpudata/cifar10 --mode da
#   bash scripts/nodes.sh down h0 h1 d0 d1      # (also after a failed `up`: removes what exists)
#   DPUOFFLOAD_NETNS_DELAY=2ms bash scripts/nodes.sh up h0 d0   # links with a one-way delay (see below)
#   bash scripts/nodes.sh run h1 hostname       # a command on one machine
#   bash scripts/nodes.sh mpi-flags             # the mpirun flags these machines need (for your own mpirun)
#   DPUOFFLOAD_VENV=.venv-mpich bash scripts/nodes.sh dpurun ...   # the same under MPICH (Hydra's mpiexec,
#                                               # told by HYDRA_* variables to start its proxies the same way)
#   bash scripts/nodes.sh up h0 d0:aarch64      # d0 is an aarch64 machine (a real DPU's architecture, via qemu)
#
# `dpurun` here runs `dpurun` on the first machine `up` named, with the Open MPI settings that the
# emulation needs (see ../shared/notes/platform.md and the README's "Emulated nodes"):
# - remote daemons start through scripts/nodes-agent.sh (Open MPI's rsh agent), which enters the
#   machine's namespace and gives it its own hostname (with one hostname for all, Open MPI takes the
#   ranks for co-located and hangs);
# - MPI messages and the runtime's own wire-up both use the machines' subnet (btl tcp, prte_if_include).
# Every machine shares this box's file system (data, venv, logs, checkpoints), like a cluster's
# shared file system, except /dev/shm: each machine sees its own (/run/PREFIX-shm/NAME, bound there in
# a mount namespace of its own), as each node and each DPU has its own RAM; so the DPU memory a
# machine keeps checkpoints in is its alone, and emptying that directory emulates the machine's loss. Knobs: DPUOFFLOAD_NETNS_PREFIX (default dpuo), DPUOFFLOAD_NETNS_SUBNET
# (default 10.77.0; a /24 that nothing else on this box uses), and the links (default: unshaped):
# - DPUOFFLOAD_NETNS_RATE (e.g. 25gbit): a tbf qdisc on every machine's eth0, so each direction of a
#   host<->DPU path crosses one;
# - DPUOFFLOAD_NETNS_DELAY (e.g. 200us, 2ms, 1.5ms): a one-way delay between the machines of one node
#   (h0 and d0: equal names without their leading letters), and DPUOFFLOAD_NETNS_NODE_DELAY between
#   machines of different nodes (default: the same). This kernel has no sch_netem, so with a delay the
#   machines are not joined by veth pairs and a bridge but by scripts/delayline.py: a userspace switch
#   over TAP devices (each machine's eth0, MTU 65521) that holds every frame for its path's delay. It
#   runs in the background (pid and log: /run/PREFIX-delayline.pid, .log) until `down`. Measured on
#   the 2-core box: a TCP stream of 0.65-1.8 GB/s through it (veth: 2-3.4 GB/s), and each frame held
#   its delay plus ~30-80 us (the line's wake-up and copy).
# aarch64 machines: a name written NAME:aarch64 in `up` (not the first one: it runs mpirun) is a machine
# whose programs are aarch64 builds run through qemu-user (bash scripts/aarch64.sh setup first; `up`
# registers its binfmt handler if none is, and leaves it registered: bash scripts/aarch64.sh binfmt off).
# What runs there (by `run`, and Open MPI's daemons through scripts/nodes-agent.sh) sees, in a mount
# namespace of its own, the aarch64 venv (DPUOFFLOAD_AARCH64_VENV, default .venv-aarch64) at the x86
# venv's path (DPUOFFLOAD_VENV, default .venv), as on a cluster where each machine has its own install
# at the same path: the prted and python that mpirun names are aarch64 ones there, QEMU_LD_PREFIX
# (the sysroot) and QEMU_CPU (DPUOFFLOAD_AARCH64_CPU, default neoverse-n1) set. The aarch64 machines
# and those paths are kept in /run/PREFIX-aarch64 until `down`; the other names stay plain everywhere
# (`run d0 ...`, `down h0 d0`, `--dpus d0:1`).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=${DPUOFFLOAD_NETNS_PREFIX:-dpuo}
SUBNET=${DPUOFFLOAD_NETNS_SUBNET:-10.77.0}
SWITCH=$PREFIX-sw
RATE=${DPUOFFLOAD_NETNS_RATE:-}
DELAY=${DPUOFFLOAD_NETNS_DELAY:-}
NODE_DELAY=${DPUOFFLOAD_NETNS_NODE_DELAY:-$DELAY}
STATE=/run/$PREFIX-nodes   # the machine names, in `up` order (the first one runs mpirun)
DELAYLINE=/run/$PREFIX-delayline   # .pid and .log of the delay line, while links have a delay
ARM=/run/$PREFIX-aarch64   # the aarch64 machines and their venv, sysroot, CPU (read by nodes-agent.sh)
SHM=/run/$PREFIX-shm       # SHM/NAME: machine NAME's own /dev/shm (its RAM file system: DPU memory; read by nodes-agent.sh)
VENV=${DPUOFFLOAD_VENV:-$ROOT/.venv}
AVENV=${DPUOFFLOAD_AARCH64_VENV:-$ROOT/.venv-aarch64}
ASYSROOT=${DPUOFFLOAD_AARCH64_ROOT:-$ROOT/.cache/aarch64}/sysroot
AGENT=$ROOT/scripts/nodes-agent.sh
# stdlib only, so any python3 runs it (the venv may not exist yet)
DELAYLINE_CMD=("$(command -v python3 || echo "$ROOT/.venv/bin/python")" "$ROOT/scripts/delayline.py"
               --link "${DELAY:-0}" --network "${NODE_DELAY:-0}" --netns-prefix "$PREFIX")

die() { echo "nodes.sh: error: $*" >&2; exit 1; }

up() {
  [ "$(id -u)" = 0 ] || die "emulated nodes need root (ip netns); run as root, or run dpurun on one box"
  [ $# -ge 2 ] || die "name at least 2 machines, e.g. up h0 h1 d0 d1"
  [ ! -e "$STATE" ] || die "nodes are up already ($(tr '\n' ' ' < "$STATE")); run: bash scripts/nodes.sh down"
  local arg names=() arm=()
  for arg in "$@"; do
    case "$arg" in
      *:aarch64) names+=("${arg%:aarch64}"); arm+=("${arg%:aarch64}") ;;
      *:*) die "$arg: the only machine kind is aarch64 (NAME:aarch64)" ;;
      *) names+=("$arg") ;;
    esac
  done
  set -- "${names[@]}"
  [ ${#arm[@]} = 0 ] || check_aarch64 "$1" "${arm[@]}"
  [ -z "$DELAY$NODE_DELAY" ] || "${DELAYLINE_CMD[@]}" --plan "$@" > /dev/null || exit 1  # (a bad delay: says why)
  MADE=("$@")
  trap 'down "${MADE[@]}"' EXIT  # a failed `up` (a command failing, or die) takes down what it made
  local i=0 name ns
  for name in "$@"; do ip netns add "$PREFIX-$name"; done
  if [ -n "$DELAY$NODE_DELAY" ]; then start_delay_line "$@"; else bridge "$@"; fi
  for name in "$@"; do
    i=$((i + 1)); ns=$PREFIX-$name
    ip -n "$ns" addr add "$SUBNET.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    if [ -n "$RATE" ]; then
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst "$(burst_for "$RATE")" latency 50ms
    fi
  done
  for name in "$@"; do  # `ip netns exec` shows /etc/netns/NS/hosts as /etc/hosts: the names resolve
    mkdir -p "/etc/netns/$PREFIX-$name"
    { echo "127.0.0.1 localhost"; i=0
      for other in "$@"; do i=$((i + 1)); echo "$SUBNET.$i $other"; done; } > "/etc/netns/$PREFIX-$name/hosts"
  done
  for name in "$@"; do mkdir -p "$SHM/$name" && chmod 1777 "$SHM/$name"; done
  printf '%s\n' "$@" > "$STATE"
  if [ ${#arm[@]} -gt 0 ]; then
    { printf 'machine %s\n' "${arm[@]}"; echo "venv $AVENV"; echo "sysroot $ASYSROOT"
      echo "cpu ${DPUOFFLOAD_AARCH64_CPU:-neoverse-n1}"; echo "over $(realpath "$VENV")"; } > "$ARM"
  fi
  trap - EXIT
  local delays=""
  [ -z "$DELAY$NODE_DELAY" ] || delays=", delay ${DELAY:-0} within a node, ${NODE_DELAY:-0} across nodes (delay line)"
  [ ${#arm[@]} = 0 ] || delays="$delays; aarch64 (qemu ${DPUOFFLOAD_AARCH64_CPU:-neoverse-n1}): ${arm[*]}"
  echo "nodes.sh: up: $* on $SUBNET.0/24 (namespaces $PREFIX-*)${RATE:+, links at $RATE}$delays"
}

check_aarch64() {  # before `up` makes anything: aarch64 machines can run (args: the first machine, the aarch64 ones)
  local first=$1; shift
  local name
  for name in "$@"; do
    [ "$name" != "$first" ] || die "$first:aarch64: the first machine runs mpirun and dpurun (x86-64 here); name an x86 machine first"
  done
  [ -x "$AVENV/bin/python" ] && [ -x "$ASYSROOT/usr/bin/python3.11" ] \
    || die "aarch64 machines need the aarch64 venv $AVENV and sysroot $ASYSROOT: run bash scripts/aarch64.sh setup"
  [ -x "$VENV/bin/python" ] || die "no venv at $VENV to show the aarch64 venv in place of (bash scripts/setup.sh)"
  command -v unshare > /dev/null || die "aarch64 machines need util-linux's unshare (a mount namespace each)"
  bash "$ROOT/scripts/aarch64.sh" binfmt on > /dev/null  # (says why when it cannot)
}

burst_for() {  # tbf's bucket, in bytes: 4 ms at the rate (a 250 Hz tick), at least 256 KB (a few GSO frames).
  # A fixed 2 MB bucket let a training step's 1 MB allreduce leave at the veth's speed after every step's
  # compute, whatever the rate (benchmarks/netmodel.py); the bucket must stay small against such messages.
  awk -v r="$1" 'BEGIN {
    n = r + 0; u = tolower(substr(r, length(n "") + 1))
    m = (u == "kbit") ? 1e3 : (u == "mbit") ? 1e6 : (u == "gbit") ? 1e9 : (u == "tbit") ? 1e12 : (u == "bit" || u == "") ? 1 : -1
    if (m < 0 || n <= 0) { print "nodes.sh: error: DPUOFFLOAD_NETNS_RATE=" r ": write it as tc does, e.g. 400mbit or 25gbit" > "/dev/stderr"; exit 1 }
    b = n * m / 8 * 0.004; if (b < 262144) b = 262144; printf "%d\n", b }'
}

bridge() {  # each machine's eth0: one end of a veth pair whose other end sits on br0 in the switch namespace
  ip netns add "$SWITCH"
  ip -n "$SWITCH" link add br0 type bridge
  ip -n "$SWITCH" link set br0 up
  local i=0 name ns
  for name in "$@"; do
    i=$((i + 1)); ns=$PREFIX-$name
    ip link add "${PREFIX}v$i" type veth peer name "${PREFIX}p$i"
    ip link set "${PREFIX}v$i" netns "$ns"
    ip link set "${PREFIX}p$i" netns "$SWITCH"
    ip -n "$SWITCH" link set "${PREFIX}p$i" master br0 up
    ip -n "$ns" link set "${PREFIX}v$i" name eth0
  done
}

start_delay_line() {  # each machine's eth0: a TAP of scripts/delayline.py, started here in the background
  "${DELAYLINE_CMD[@]}" "$@" > "$DELAYLINE.log" 2>&1 < /dev/null &
  local pid=$! waited=0
  echo "$pid" > "$DELAYLINE.pid"
  until grep -q "^delayline: ready" "$DELAYLINE.log"; do  # every eth0 in its namespace
    if ! alive "$pid" || [ $waited -ge 150 ]; then
      die "the delay line (scripts/delayline.py) did not come up in 15 s: $(tail -n 3 "$DELAYLINE.log" | tr '\n' ' ')" \
        "(DPUOFFLOAD_NETNS_DELAY needs the kernel's TUN/TAP driver; unset it for unshaped veth links)"
    fi
    waited=$((waited + 1)); sleep 0.1
  done
}

alive() {  # a process that runs (a zombie that its parent, a failing `up`, has not reaped yet counts as gone)
  [ -r "/proc/$1/stat" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]
}

stop_delay_line() {  # before the namespaces go: its TAPs go with it
  local pid waited=0
  pid=$(cat "$DELAYLINE.pid" 2>/dev/null) || return 0
  if grep -qs "delayline.py" "/proc/$pid/cmdline"; then  # (not a pid that another program got since)
    kill "$pid" 2>/dev/null || true
    while alive "$pid" && [ $waited -lt 50 ]; do waited=$((waited + 1)); sleep 0.1; done
    ! alive "$pid" || kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$DELAYLINE.pid" "$DELAYLINE.log"
}

down() {
  local names=("${@%:aarch64}")
  [ ${#names[@]} -gt 0 ] || [ ! -e "$STATE" ] || mapfile -t names < "$STATE"
  local name
  stop_delay_line
  for name in "${names[@]}"; do
    ip netns pids "$PREFIX-$name" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$PREFIX-$name" 2>/dev/null || true
    rm -rf "/etc/netns/$PREFIX-$name"
  done
  ip netns del "$SWITCH" 2>/dev/null || true
  for name in "${names[@]}"; do rm -rf "${SHM:?}/$name"; done
  rmdir "$SHM" 2>/dev/null || true
  rm -f "$STATE" "$ARM"
}

is_aarch64() { [ -f "$ARM" ] && grep -qx "machine $1" "$ARM"; }

run_on() {
  local name=$1; shift
  grep -q "^$PREFIX-$name\b" <<<"$(ip netns list)" || die "no machine $name (bash scripts/nodes.sh up ... first)"
  # (the agent knows how to enter a machine: its hostname, its own /dev/shm, an aarch64 venv; one place for it)
  DPUOFFLOAD_AGENT_ARGV=1 DPUOFFLOAD_NETNS_PREFIX=$PREFIX exec sh "$AGENT" "$name" "$@"
}

mpi_flags() {  # what mpirun needs across these machines (the ranks' environment comes from mpirun's)
  echo "--mca plm_rsh_agent $AGENT --mca btl tcp,self" \
    "--mca btl_tcp_if_include $SUBNET.0/24 --prtemca prte_if_include $SUBNET.0/24 -x PATH${PYTHONPATH:+ -x PYTHONPATH}"
}

hydra_env() {  # what MPICH's Hydra needs across these machines (mpiexec reads these variables)
  echo "HYDRA_LAUNCHER=rsh HYDRA_LAUNCHER_EXEC=$AGENT HYDRA_IFACE=eth0"
}

is_mpich() {  # whether VENV's mpirun is MPICH's Hydra (the output is read whole: `| grep -q` under
  # pipefail fails at random when grep exits before mpirun has written everything and mpirun dies of SIGPIPE)
  local version
  version=$("$1/bin/mpirun" --version 2>/dev/null || true)
  [[ $version == *HYDRA* ]]
}

dpurun_on_first() {
  [ -e "$STATE" ] || die "no nodes are up (bash scripts/nodes.sh up h0 h1 d0 d1 first)"
  local first venv
  first=$(head -n1 "$STATE")
  venv=$VENV
  if [ -f "$ARM" ]; then  # aarch64 machines show the aarch64 venv at the path of the venv `up` saw
    local over
    over=$(sed -n 's/^over //p' "$ARM")
    if is_mpich "$venv"; then
      die "aarch64 machines run Open MPI (scripts/aarch64.sh makes no aarch64 MPICH venv): leave DPUOFFLOAD_VENV=$venv out"
    fi
    [ "$(realpath "$venv")" = "$over" ] || die "the aarch64 machines show their venv at $over (the venv at \`up\`)," \
      "not at $venv: take the nodes down and up again with DPUOFFLOAD_VENV=$venv"
  fi
  if is_mpich "$venv"; then  # MPICH (DPUOFFLOAD_VENV=.venv-mpich)
    # shellcheck disable=SC2046
    run_on "$first" env PATH="$venv/bin:$PATH" $(hydra_env) "$venv/bin/dpurun" "$@"
  else
    run_on "$first" env PATH="$venv/bin:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      "$venv/bin/dpurun" --mpirun-arg="$(mpi_flags)" "$@"
  fi
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) shift; down "$@" ;;
  run) shift; [ $# -ge 2 ] || die "usage: run MACHINE COMMAND..."; run_on "$@" ;;
  dpurun) shift; dpurun_on_first "$@" ;;
  mpi-flags) mpi_flags ;;
  *) die "usage: bash scripts/nodes.sh up NAME... | dpurun [dpurun args] | run NAME CMD... | mpi-flags | down [NAME...]" ;;
esac
