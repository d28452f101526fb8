#!/bin/bash
# PowerSGD where it pays: two hosts (network namespaces joined by a veth
# pair, each direction rate-limited with tc tbf) with one rank each, the tcp
# backend between them, and ddp_throughput's step time with the plain
# all-reduce and with the PowerSGD hooks. Needs root.
# Usage: bench/powersgd_shaped_link.sh BUILD_DIR [RATE] [MODEL] [BATCH] [STEPS]
#   e.g. bench/powersgd_shaped_link.sh build 1gbit mlp 32
set -uo pipefail
build=$(realpath "$1")
rate=${2:-1gbit}
model=${3:-mlp}
batch=${4:-32}
steps=${5:-10}
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, tc)"; exit 77; }

holders=()
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
new_host; host0=${holders[0]}
new_host; host1=${holders[1]}
ip link add p0-$$ type veth peer name p1-$$
ip link set p0-$$ netns "$host0"
ip link set p1-$$ netns "$host1"
for i in 0 1; do
  h=${holders[$i]}
  on_host "$h" hostname "host$i"
  on_host "$h" ip addr add 10.214.0.$((i + 1))/24 dev p$i-$$
  on_host "$h" ip link set lo up
  on_host "$h" ip link set p$i-$$ up
  on_host "$h" tc qdisc add dev p$i-$$ root tbf rate "$rate" burst 512kb latency 100ms
done

run_pair() {
  local port=$1 nodes=()
  shift
  for i in 0 1; do
    on_host "${holders[$i]}" timeout 300 "$build/lockstep" run --nnodes 2 --node-rank $i --master-addr 10.214.0.1 \
      --master-port "$port" --nproc-per-node 1 -- "$build/examples/ddp_throughput" "$@" > "/tmp/psgd-shaped-$$-$i.log" 2>&1 &
    nodes+=("$!")
  done
  wait "${nodes[@]}"
  grep -E "model|step_ms|compression" "/tmp/psgd-shaped-$$-0.log"
  rm -f /tmp/psgd-shaped-$$-*.log
}

echo "link: veth, tbf $rate each way; 2 hosts x 1 rank, backend tcp"
port=29611
for hook in none powersgd batched_powersgd; do
  run_pair $port --model "$model" --batch "$batch" --steps "$steps" --hook "$hook"
  port=$((port + 1))
done
