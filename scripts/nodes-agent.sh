#!/bin/sh
# Open MPI's remote-start agent for the emulated nodes of scripts/nodes.sh (`--mca plm_rsh_agent`):
# called as `AGENT [ssh options] MACHINE COMMAND...`, it runs COMMAND in MACHINE's namespace under
# MACHINE's own hostname and its own /dev/shm (/run/PREFIX-shm/MACHINE, bound in a mount namespace of its
# own: a machine's RAM file system is its alone), as ssh would on a real node.
# An aarch64 machine (`nodes.sh up ... d0:aarch64`, listed in /run/PREFIX-aarch64) also gets a mount
# namespace of its own in which the x86 venv's path shows the aarch64 venv (scripts/aarch64.sh), like a
# cluster whose DPUs have their own install at the same path: the prted and python that mpirun names
# by absolute path are aarch64 programs there (run by qemu through binfmt_misc), with QEMU_LD_PREFIX
# and QEMU_CPU exported (prted passes its environment on to the ranks it starts).
# DPUOFFLOAD_AGENT_ARGV=1 (nodes.sh run): COMMAND is run as the argv given, not as one shell line.
PREFIX=${DPUOFFLOAD_NETNS_PREFIX:-dpuo}
ARM=/run/$PREFIX-aarch64
SHM=/run/$PREFIX-shm
argv=${DPUOFFLOAD_AGENT_ARGV:-}
unset DPUOFFLOAD_AGENT_ARGV
while [ "${1#-}" != "$1" ]; do shift; done  # (Open MPI passes no options to a non-ssh agent; ssh-style ones are skipped)
machine=$1
shift
if [ -n "$argv" ]; then run='exec "$@"'; else run='exec sh -c "$*"'; fi
shm=$SHM/$machine
[ -d "$shm" ] || shm=/dev/shm  # (nodes brought up before machines had their own: the box's, bound onto itself)
if [ -f "$ARM" ] && grep -qx "machine $machine" "$ARM"; then
  field() { sed -n "s/^$1 //p" "$ARM"; }
  QEMU_LD_PREFIX=$(field sysroot) QEMU_CPU=$(field cpu)
  export QEMU_LD_PREFIX QEMU_CPU
  exec ip netns exec "$PREFIX-$machine" unshare --uts --mount sh -c \
    'hostname "$0" && mount --bind "$1" /dev/shm && mount --bind "$2" "$3" && shift 3 && '"$run" \
    "$machine" "$shm" "$(field venv)" "$(field over)" "$@"
fi
exec ip netns exec "$PREFIX-$machine" unshare --uts --mount sh -c \
  'hostname "$0" && mount --bind "$1" /dev/shm && shift && '"$run" "$machine" "$shm" "$@"
