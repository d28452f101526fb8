#!/bin/bash
# PowerSGD where it pays: two hosts (network namespaces joined by a veth
# pair, each direction rate-limited with tc tbf) with one rank each, the tcp
# backend between them, and ddp_throughput's step time with the plain
# all-reduce and with the PowerSGD hooks (or the hooks in HOOKS). Needs root.
# Usage: [HOOKS="none fp16 bf16"] bench/powersgd_shaped_link.sh BUILD_DIR [RATE] [MODEL] [BATCH] [STEPS]
#   e.g. bench/powersgd_shaped_link.sh build 1gbit mlp 32
set -uo pipefail
build=$(realpath "$1")
rate=${2:-1gbit}
model=${3:-mlp}
batch=${4:-32}
steps=${5:-10}
subnet=10.214.0 source "$(dirname "$0")/two_shaped_hosts.sh"

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
for hook in ${HOOKS:-none powersgd batched_powersgd}; do
  run_pair $port --model "$model" --batch "$batch" --steps "$steps" --hook "$hook"
  port=$((port + 1))
done
