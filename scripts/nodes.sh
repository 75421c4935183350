#!/usr/bin/env bash
# Emulated nodes on one box: one network namespace per "machine" (host nodes and their DPUs), each
# with its own hostname and address, joined by one bridge, so `dpurun` runs in cluster mode over
# real TCP, as on a cluster where every DPU is a machine of its own. Needs root (ip netns).
#
#   bash scripts/nodes.sh up h0 h1 d0 d1        # 4 machines: 10.77.0.1 .. 10.77.0.4, named h0 .. d1
#   bash scripts/nodes.sh dpurun --hosts h0:1,h1:1 --dpus d0:1,d1:1 --host-ranks 2 --dpu-ranks 2 \
#       -- --preset debug --data /tmp/dpudata/cifar10 --mode da
#   bash scripts/nodes.sh down h0 h1 d0 d1      # (also after a failed `up`: removes what exists)
#   bash scripts/nodes.sh run h1 hostname       # a command on one machine
#   bash scripts/nodes.sh mpi-flags             # the mpirun flags these machines need (for your own mpirun)
#   DPUOFFLOAD_VENV=.venv-mpich bash scripts/nodes.sh dpurun ...   # the same under MPICH (Hydra's mpiexec,
#                                               # told by HYDRA_* variables to start its proxies the same way)
#
# `dpurun` here runs `dpurun` on the first machine `up` named, with the Open MPI settings that the
# emulation needs (see ../shared/notes/platform.md and the README's "Emulated nodes"):
# - remote daemons start through scripts/nodes-agent.sh (Open MPI's rsh agent), which enters the
#   machine's namespace and gives it its own hostname (with one hostname for all, Open MPI takes the
#   ranks for co-located and hangs);
# - MPI messages and the runtime's own wire-up both use the bridge's subnet (btl tcp, prte_if_include).
# Every machine shares this box's file system (data, venv, logs, checkpoints), like a cluster's
# shared file system. Knobs: DPUOFFLOAD_NETNS_PREFIX (default dpuo), DPUOFFLOAD_NETNS_SUBNET
# (default 10.77.0; a /24 that nothing else on this box uses), and a link speed for every machine's
# link (tc on its side of the veth, so each direction of a host<->DPU path crosses one):
# DPUOFFLOAD_NETNS_RATE (e.g. 25gbit: a tbf qdisc) and DPUOFFLOAD_NETNS_DELAY (e.g. 2us: netem, which
# needs the kernel's sch_netem; this box's kernel has tbf but no netem); default: unshaped.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=${DPUOFFLOAD_NETNS_PREFIX:-dpuo}
SUBNET=${DPUOFFLOAD_NETNS_SUBNET:-10.77.0}
SWITCH=$PREFIX-sw
RATE=${DPUOFFLOAD_NETNS_RATE:-}
DELAY=${DPUOFFLOAD_NETNS_DELAY:-}
STATE=/run/$PREFIX-nodes   # the machine names, in `up` order (the first one runs mpirun)

die() { echo "nodes.sh: error: $*" >&2; exit 1; }

up() {
  [ "$(id -u)" = 0 ] || die "emulated nodes need root (ip netns); run as root, or run dpurun on one box"
  [ $# -ge 2 ] || die "name at least 2 machines, e.g. up h0 h1 d0 d1"
  [ ! -e "$STATE" ] || die "nodes are up already ($(tr '\n' ' ' < "$STATE")); run: bash scripts/nodes.sh down"
  trap 'down "$@"' ERR
  ip netns add "$SWITCH"
  ip -n "$SWITCH" link add br0 type bridge
  ip -n "$SWITCH" link set br0 up
  local i=0 name ns
  for name in "$@"; do
    i=$((i + 1)); ns=$PREFIX-$name
    ip netns add "$ns"
    ip link add "${PREFIX}v$i" type veth peer name "${PREFIX}p$i"
    ip link set "${PREFIX}v$i" netns "$ns"
    ip link set "${PREFIX}p$i" netns "$SWITCH"
    ip -n "$SWITCH" link set "${PREFIX}p$i" master br0 up
    ip -n "$ns" link set "${PREFIX}v$i" name eth0
    ip -n "$ns" addr add "$SUBNET.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    if [ -n "$DELAY" ]; then
      ip netns exec "$ns" tc qdisc add dev eth0 root netem ${RATE:+rate $RATE} delay "$DELAY" limit 100000 ||
        { down "$@"; die "DPUOFFLOAD_NETNS_DELAY needs tc's netem qdisc (kernel module sch_netem), missing here; unset it"; }
    elif [ -n "$RATE" ]; then  # (a burst of 2 MB: >= rate / HZ up to ~16 Gbit/s at HZ 1000)
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 2mb latency 50ms
    fi
  done
  for name in "$@"; do  # `ip netns exec` shows /etc/netns/NS/hosts as /etc/hosts: the names resolve
    mkdir -p "/etc/netns/$PREFIX-$name"
    { echo "127.0.0.1 localhost"; i=0
      for other in "$@"; do i=$((i + 1)); echo "$SUBNET.$i $other"; done; } > "/etc/netns/$PREFIX-$name/hosts"
  done
  printf '%s\n' "$@" > "$STATE"
  trap - ERR
  echo "nodes.sh: up: $* on $SUBNET.0/24 (namespaces $PREFIX-*)${RATE:+, links at $RATE}${DELAY:+, delay $DELAY}"
}

down() {
  local names=("$@")
  [ ${#names[@]} -gt 0 ] || [ ! -e "$STATE" ] || mapfile -t names < "$STATE"
  local name
  for name in "${names[@]}"; do
    ip netns pids "$PREFIX-$name" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$PREFIX-$name" 2>/dev/null || true
    rm -rf "/etc/netns/$PREFIX-$name"
  done
  ip netns del "$SWITCH" 2>/dev/null || true
  rm -f "$STATE"
}

run_on() {
  local name=$1; shift
  ip netns list | grep -q "^$PREFIX-$name\b" || die "no machine $name (bash scripts/nodes.sh up ... first)"
  exec ip netns exec "$PREFIX-$name" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

mpi_flags() {  # what mpirun needs across these machines (the ranks' environment comes from mpirun's)
  echo "--mca plm_rsh_agent $ROOT/scripts/nodes-agent.sh --mca btl tcp,self" \
    "--mca btl_tcp_if_include $SUBNET.0/24 --prtemca prte_if_include $SUBNET.0/24 -x PATH${PYTHONPATH:+ -x PYTHONPATH}"
}

hydra_env() {  # what MPICH's Hydra needs across these machines (mpiexec reads these variables)
  echo "HYDRA_LAUNCHER=rsh HYDRA_LAUNCHER_EXEC=$ROOT/scripts/nodes-agent.sh HYDRA_IFACE=eth0"
}

dpurun_on_first() {
  [ -e "$STATE" ] || die "no nodes are up (bash scripts/nodes.sh up h0 h1 d0 d1 first)"
  local first venv
  first=$(head -n1 "$STATE")
  venv=${DPUOFFLOAD_VENV:-$ROOT/.venv}
  if "$venv/bin/mpirun" --version 2>/dev/null | grep -q "HYDRA"; then  # MPICH (DPUOFFLOAD_VENV=.venv-mpich)
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
