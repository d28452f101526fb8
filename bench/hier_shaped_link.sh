#!/bin/bash
# hier against flat tcp where it matters: two hosts (network namespaces
# joined by a veth pair, each direction rate-limited with tc tbf) with two
# ranks each, and lockstep bench's all-reduce busbw over the tcp backend and
# over hier (shm inside each host, tcp across). With 2 hosts x 2 ranks each
# host's link carries 1.5x less under hier, so ~1.5x is the bound. Needs root.
# allgather and reduce_scatter have the same bound (hier sends each host's
# blocks across once, the flat ring 1.5x as many over each host's link).
# Usage: bench/hier_shaped_link.sh BUILD_DIR [RATE] [MINBYTES] [MAXBYTES] [OP]
#   e.g. bench/hier_shaped_link.sh build 1gbit 1M 64M
#        bench/hier_shaped_link.sh build 1gbit 1M 64M allgather
set -uo pipefail
build=$(realpath "$1")
rate=${2:-1gbit}
min_bytes=${3:-1M}
max_bytes=${4:-64M}
op=${5:-allreduce}
subnet=10.215.0 source "$(dirname "$0")/two_shaped_hosts.sh"

run_bench() {
  local backend=$1 port=$2 nodes=()
  for i in 0 1; do
    on_host "${holders[$i]}" timeout 300 "$build/lockstep" run --nnodes 2 --node-rank $i --master-addr 10.215.0.1 \
      --master-port "$port" --nproc-per-node 2 -- "$build/lockstep" bench --op "$op" --backend "$backend" \
      -b "$min_bytes" -e "$max_bytes" -f 4 -n 5 -w 2 -c 1 > "/tmp/hier-shaped-$$-$i.log" 2>&1 &
    nodes+=("$!")
  done
  wait "${nodes[@]}"
  sed -E 's/^\[[0-9]+\] //' "/tmp/hier-shaped-$$-0.log" | grep -E "^#|^ *[0-9]"
  rm -f /tmp/hier-shaped-$$-*.log
}

echo "$op; link: veth, tbf $rate each way; 2 hosts x 2 ranks"
run_bench tcp 29621
run_bench hier 29622
