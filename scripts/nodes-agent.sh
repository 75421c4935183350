#!/bin/sh
# Open MPI's remote-start agent for the emulated nodes of scripts/nodes.sh (`--mca plm_rsh_agent`):
# called as `AGENT [ssh options] MACHINE COMMAND...`, it runs COMMAND in MACHINE's namespace under
# MACHINE's own hostname, as ssh would on a real node.
PREFIX=${DPUOFFLOAD_NETNS_PREFIX:-dpuo}
while [ "${1#-}" != "$1" ]; do shift; done  # (Open MPI passes no options to a non-ssh agent; ssh-style ones are skipped)
machine=$1
shift
exec ip netns exec "$PREFIX-$machine" unshare --uts sh -c 'hostname "$0" && exec sh -c "$*"' "$machine" "$@"
