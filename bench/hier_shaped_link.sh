#!/bin/bash
# hier against flat tcp where it matters: two hosts (network namespaces
# joined by a veth pair, each direction rate-limited with tc tbf) with two
# ranks each, and lockstep bench's all-reduce busbw over the tcp backend and
# over hier (shm inside each host, tcp across). With 2 hosts x 2 ranks each
# host's link carries 1.5x less under hier, so ~1.5x is the bound. Needs root.
# Usage: bench/hier_shaped_link.sh BUILD_DIR [RATE] [MINBYTES] [MAXBYTES]
#   e.g. bench/hier_shaped_link.sh build 1gbit 1M 64M
set -uo pipefail
build=$(realpath "$1")
rate=${2:-1gbit}
min_bytes=${3:-1M}
max_bytes=${4:-64M}
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, tc)"; exit 77; }

holders=()
cleanup() {
  for h in "${holders[@]}"; do kill -9 "$h" 2> /dev/null; done
  wait 2> /dev/null
  rm -f /tmp/hier-shaped-$$-*.log
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
new_host; host0=${holders[0]}
new_host; host1=${holders[1]}
ip link add h0-$$ type veth peer name h1-$$
ip link set h0-$$ netns "$host0"
ip link set h1-$$ netns "$host1"
for i in 0 1; do
  h=${holders[$i]}
  on_host "$h" hostname "host$i"
  on_host "$h" ip addr add 10.215.0.$((i + 1))/24 dev h$i-$$
  on_host "$h" ip link set lo up
  on_host "$h" ip link set h$i-$$ up
  on_host "$h" tc qdisc add dev h$i-$$ root tbf rate "$rate" burst 512kb latency 100ms
done

run_bench() {
  local backend=$1 port=$2 nodes=()
  for i in 0 1; do
    on_host "${holders[$i]}" timeout 300 "$build/lockstep" run --nnodes 2 --node-rank $i --master-addr 10.215.0.1 \
      --master-port "$port" --nproc-per-node 2 -- "$build/lockstep" bench --op allreduce --backend "$backend" \
      -b "$min_bytes" -e "$max_bytes" -f 4 -n 5 -w 2 -c 1 > "/tmp/hier-shaped-$$-$i.log" 2>&1 &
    nodes+=("$!")
  done
  wait "${nodes[@]}"
  sed -E 's/^\[[0-9]+\] //' "/tmp/hier-shaped-$$-0.log" | grep -E "^#|^ *[0-9]"
}

echo "link: veth, tbf $rate each way; 2 hosts x 2 ranks"
run_bench tcp 29621
run_bench hier 29622
