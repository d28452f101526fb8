# Two hosts for the shaped-link benchmarks, sourced by them: each host is a
# process holding its own network and UTS namespaces (host0, host1), joined
# by a veth pair whose every direction tc tbf limits to $rate. Sets
# holders=(host0's holder, host1's) and defines on_host; everything goes
# away on exit. Needs root.
# Usage: rate=1gbit subnet=10.214.0 source bench/two_shaped_hosts.sh
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, tc)"; exit 77; }

holders=()
# The store listens beyond loopback: every node needs the job's secret.
export LOCKSTEP_STORE_TOKEN=${LOCKSTEP_STORE_TOKEN:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
cleanup() {
  for h in "${holders[@]}"; do kill -9 "$h" 2> /dev/null; done
  wait 2> /dev/null
}
trap cleanup EXIT

new_host() {
  unshare --net --uts sleep 3600 &
  holders+=("$!")
  for _ in $(seq 50); do
    [ "$(readlink /proc/$!/ns/net)" != "$(readlink /proc/self/ns/net)" ] && return 0
    sleep 0.02
  done
  echo "cannot create network namespaces here"
  exit 77
}

on_host() {
  local holder=$1
  shift
  nsenter -t "$holder" --net --uts "$@"
}

new_host
new_host
ip link add s0-$$ type veth peer name s1-$$
for i in 0 1; do
  h=${holders[$i]}
  ip link set s$i-$$ netns "$h"
  on_host "$h" hostname "host$i"
  on_host "$h" ip addr add "$subnet.$((i + 1))/24" dev s$i-$$
  on_host "$h" ip link set lo up
  on_host "$h" ip link set s$i-$$ up
  on_host "$h" tc qdisc add dev s$i-$$ root tbf rate "$rate" burst 512kb latency 100ms
done
