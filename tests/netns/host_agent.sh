#!/bin/bash
# Open MPI's remote-shell agent for the emulated cluster (mpirun
# --mca plm_rsh_agent): where mpirun would ssh to HOST and run COMMAND, this
# enters HOST's namespaces instead, pinned to the host's cores.
# $LOCKSTEP_CLUSTER_HOSTS names a file of "address holder-pid cores" lines
# (cluster.sh writes it).
# Usage (by mpirun): host_agent.sh HOST COMMAND...
set -u
host=$1
shift
read -r holder cores < <(awk -v host="$host" '$1 == host { print $2, $3 }' "$LOCKSTEP_CLUSTER_HOSTS")
[ -n "${holder:-}" ] || { echo "host_agent.sh: no emulated host $host in $LOCKSTEP_CLUSTER_HOSTS" >&2; exit 255; }
# Like ssh: the words make one command line for a shell on the host.
exec nsenter -t "$holder" --net --uts taskset -c "$cores" /bin/sh -c "$*"
