#!/bin/bash
# Two hosts on one machine: two network namespaces joined by a veth pair,
# each with its own host name (so lockstep sees two hosts of two ranks and
# picks the hier backend), each running one `lockstep run` node of two ranks. Checks that
#   1. an all-reduce across the hosts is correct (lockstep bench -c 1), and
#   2. when one host's ranks are killed, the other host's ranks name the lost
#      rank within seconds and its launcher exits non-zero;
#   3. when one host drops off the network (no FIN, no RST: its link goes
#      down), the other host's ranks time out and the watchdog names the
#      silent ranks.
# Needs root (network namespaces); skips (exit 77) elsewhere. Every step has
# a deadline, and the hosts' processes are killed on exit.
# Usage: two_hosts_test.sh path/to/lockstep
set -uo pipefail
cli=$(realpath "$1")
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (CI runs as root)"
for tool in ip unshare nsenter; do command -v $tool > /dev/null || skip "needs $tool (iproute2, util-linux)"; done

work=$(mktemp -d)
export LOCKSTEP_FLIGHT_DIR=$work  # dumps of the failure scenarios go away with it
source "$(dirname "$0")/hosts.sh"
two_linked_hosts 10.213.0 600

# start_node NODE_RANK HOLDER LOG PROGRAM...: one launcher in the background.
start_node() {
  local rank=$1 holder=$2 log=$3
  shift 3
  on_host "$holder" timeout 120 "$cli" run --nnodes 2 --node-rank "$rank" --master-addr 10.213.0.1 \
    --master-port 29533 --nproc-per-node 2 --grace-period 1 -- "$@" > "$log" 2>&1 &
}

# start_endless_job NAME: both nodes all-reducing until stopped; sets node0
# and node1 and returns once the ranks are at work. Logs: $work/NAME<node>.log.
start_endless_job() {
  start_node 0 $host0 "$work/${1}0.log" "$cli" bench -b 64K -e 64K -n 1000000 -w 2
  node0=$!
  start_node 1 $host1 "$work/${1}1.log" "$cli" bench -b 64K -e 64K -n 1000000 -w 2
  node1=$!
  for _ in $(seq 100); do
    [ "$(in_host_pids $host1 | wc -l)" -ge 3 ] && grep -q "store" "$work/${1}0.log" && break
    sleep 0.1
  done
  sleep 2
}

echo "== 1. all-reduce across two hosts"
start_node 0 $host0 "$work/node0.log" "$cli" bench -b 4 -e 4M -f 32 -n 20 -w 2 -c 1
node0=$!
start_node 1 $host1 "$work/node1.log" "$cli" bench -b 4 -e 4M -f 32 -n 20 -w 2 -c 1
node1=$!
wait $node0; rc0=$?
wait $node1; rc1=$?
cat "$work/node0.log"
[ $rc0 = 0 ] && [ $rc1 = 0 ] || { cat "$work/node1.log"; fail "launchers exited $rc0 and $rc1"; }
grep -q "4 ranks, backend hier" "$work/node0.log" || fail "expected 4 ranks over the hier backend"
# The table's rows (without the launcher's "[rank] " prefix); #wrong is 0.
table=$(sed -E 's/^\[[0-9]+\] //' "$work/node0.log" | awk '$1 ~ /^[0-9]+$/ && NF == 9')
wrong=$(echo "$table" | awk '$9 != 0')
[ -z "$wrong" ] || fail "wrong elements: $wrong"
rows=$(echo "$table" | wc -l)
[ "$rows" -ge 5 ] || fail "expected at least 5 sizes, got $rows"

echo "== 2. a host's ranks die: the other host names them"
start_endless_job kill
start=$(date +%s%N)
kill -9 $(in_host_pids $host1)
wait $node0; rc0=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
wait $node1 2> /dev/null
cat "$work/kill0.log"
[ $rc0 != 0 ] || fail "node 0's launcher exited 0 after node 1 died"
grep -Eq "lost rank [23]" "$work/kill0.log" || fail "node 0 did not name a rank of node 1"
echo "node 0 stopped ${elapsed_ms} ms after node 1 was killed"
[ $elapsed_ms -lt 15000 ] || fail "took ${elapsed_ms} ms (more than 15 s)"
[ -z "$(in_host_pids $host0)" ] || fail "processes left in node 0's namespace: $(in_host_pids $host0)"
wait $node1 2> /dev/null

echo "== 3. a host drops off the network: the watchdog names its ranks"
export LOCKSTEP_TIMEOUT=4 LOCKSTEP_WATCHDOG_SETTLE=2
start_endless_job drop
start=$(date +%s%N)
on_host $host1 ip link set v1-$$ down
wait $node0; rc0=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
kill -9 $(in_host_pids $host1) 2> /dev/null
wait $node1 2> /dev/null
cat "$work/drop0.log"
[ $rc0 != 0 ] || fail "node 0's launcher exited 0 after node 1 dropped off"
grep -q "timed out after 4.0 s" "$work/drop0.log" || fail "node 0's ranks did not time out"
grep -q "rank(s) 2, 3 did not answer the watchdog" "$work/drop0.log" || fail "the watchdog did not name ranks 2 and 3"
echo "node 0 stopped ${elapsed_ms} ms after node 1's link went down"
[ $elapsed_ms -lt 20000 ] || fail "took ${elapsed_ms} ms (more than 20 s)"
echo PASS
