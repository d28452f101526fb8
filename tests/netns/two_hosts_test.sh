#!/bin/bash
# Two hosts on one machine: two network namespaces joined by a veth pair,
# each with its own host name (so lockstep sees two hosts and picks the tcp
# backend), each running one `lockstep run` node of two ranks. Checks that
#   1. an all-reduce across the hosts is correct (lockstep bench -c 1), and
#   2. when one host's ranks are killed, the other host's ranks name the lost
#      rank within seconds and its launcher exits non-zero;
#   3. when one host drops off the network (no FIN, no RST: its link goes
#      down), the other host's ranks time out and the watchdog names the
#      silent ranks.
# Needs root (network namespaces); skips (exit 77) elsewhere. Every step has
# a deadline, and the namespaces and their processes are removed on exit.
# Usage: two_hosts_test.sh path/to/lockstep
set -uo pipefail
cli=$(realpath "$1")
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (CI runs as root)"
command -v ip > /dev/null && command -v unshare > /dev/null || skip "needs ip (iproute2) and unshare (util-linux)"

ns0=lockstep-a$$ ns1=lockstep-b$$
work=$(mktemp -d)
export LOCKSTEP_FLIGHT_DIR=$work  # dumps of the failure scenarios go away with it
cleanup() {
  for ns in $ns0 $ns1; do
    pids=$(ip netns pids $ns 2> /dev/null)
    [ -n "$pids" ] && kill -9 $pids 2> /dev/null
    ip netns del $ns 2> /dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add $ns0 2> /dev/null || skip "cannot create network namespaces here"
ip netns add $ns1
ip link add v0-$$ netns $ns0 type veth peer name v1-$$ netns $ns1 || fail "cannot create a veth pair"
ip -n $ns0 addr add 10.213.0.1/24 dev v0-$$
ip -n $ns1 addr add 10.213.0.2/24 dev v1-$$
for ns in $ns0 $ns1; do ip -n $ns link set lo up; done
ip -n $ns0 link set v0-$$ up
ip -n $ns1 link set v1-$$ up

# on_host NAMESPACE HOSTNAME COMMAND...: runs COMMAND on that "host".
on_host() {
  local ns=$1 name=$2
  shift 2
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

# start_node NODE_RANK NAMESPACE LOG PROGRAM...: one launcher in the background.
start_node() {
  local rank=$1 ns=$2 log=$3
  shift 3
  on_host "$ns" "host$rank" timeout 120 "$cli" run --nnodes 2 --node-rank "$rank" --master-addr 10.213.0.1 \
    --master-port 29533 --nproc-per-node 2 --grace-period 1 -- "$@" > "$log" 2>&1 &
}

echo "== 1. all-reduce across two hosts"
start_node 0 $ns0 "$work/node0.log" "$cli" bench -b 4 -e 4M -f 32 -n 20 -w 2 -c 1
node0=$!
start_node 1 $ns1 "$work/node1.log" "$cli" bench -b 4 -e 4M -f 32 -n 20 -w 2 -c 1
node1=$!
wait $node0; rc0=$?
wait $node1; rc1=$?
cat "$work/node0.log"
[ $rc0 = 0 ] && [ $rc1 = 0 ] || { cat "$work/node1.log"; fail "launchers exited $rc0 and $rc1"; }
grep -q "4 ranks, backend tcp" "$work/node0.log" || fail "expected 4 ranks over the tcp backend"
# The table's rows (without the launcher's "[rank] " prefix); #wrong is 0.
table=$(sed -E 's/^\[[0-9]+\] //' "$work/node0.log" | awk '$1 ~ /^[0-9]+$/ && NF == 9')
wrong=$(echo "$table" | awk '$9 != 0')
[ -z "$wrong" ] || fail "wrong elements: $wrong"
rows=$(echo "$table" | wc -l)
[ "$rows" -ge 5 ] || fail "expected at least 5 sizes, got $rows"

echo "== 2. a host's ranks die: the other host names them"
start_node 0 $ns0 "$work/kill0.log" "$cli" bench -b 64K -e 64K -n 1000000 -w 2
node0=$!
start_node 1 $ns1 "$work/kill1.log" "$cli" bench -b 64K -e 64K -n 1000000 -w 2
node1=$!
# Wait until the ranks are all-reducing (both hosts have their two ranks).
for _ in $(seq 100); do
  [ "$(ip netns pids $ns1 | wc -l)" -ge 3 ] && grep -q "store" "$work/kill0.log" && break
  sleep 0.1
done
sleep 2
start=$(date +%s%N)
kill -9 $(ip netns pids $ns1)
wait $node0; rc0=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
wait $node1 2> /dev/null
cat "$work/kill0.log"
[ $rc0 != 0 ] || fail "node 0's launcher exited 0 after node 1 died"
grep -Eq "lost rank [23]" "$work/kill0.log" || fail "node 0 did not name a rank of node 1"
echo "node 0 stopped ${elapsed_ms} ms after node 1 was killed"
[ $elapsed_ms -lt 15000 ] || fail "took ${elapsed_ms} ms (more than 15 s)"
[ -z "$(ip netns pids $ns0)" ] || fail "processes left in node 0's namespace: $(ip netns pids $ns0)"
wait $node1 2> /dev/null

echo "== 3. a host drops off the network: the watchdog names its ranks"
export LOCKSTEP_TIMEOUT=4 LOCKSTEP_WATCHDOG_SETTLE=2
start_node 0 $ns0 "$work/drop0.log" "$cli" bench -b 64K -e 64K -n 1000000 -w 2
node0=$!
start_node 1 $ns1 "$work/drop1.log" "$cli" bench -b 64K -e 64K -n 1000000 -w 2
node1=$!
for _ in $(seq 100); do
  [ "$(ip netns pids $ns1 | wc -l)" -ge 3 ] && grep -q "store" "$work/drop0.log" && break
  sleep 0.1
done
sleep 2
start=$(date +%s%N)
ip -n $ns1 link set v1-$$ down
wait $node0; rc0=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
kill -9 $(ip netns pids $ns1) 2> /dev/null
wait $node1 2> /dev/null
cat "$work/drop0.log"
[ $rc0 != 0 ] || fail "node 0's launcher exited 0 after node 1 dropped off"
grep -q "timed out after 4.0 s" "$work/drop0.log" || fail "node 0's ranks did not time out"
grep -q "rank(s) 2, 3 did not answer the watchdog" "$work/drop0.log" || fail "the watchdog did not name ranks 2 and 3"
echo "node 0 stopped ${elapsed_ms} ms after node 1's link went down"
[ $elapsed_ms -lt 20000 ] || fail "took ${elapsed_ms} ms (more than 20 s)"
echo PASS
