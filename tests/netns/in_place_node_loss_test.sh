#!/bin/bash
# A whole node lost under --on-rank-failure continue (docs/faults.md): two
# hosts on one machine (network namespaces joined by a veth pair), a node
# of two ranks on each, examples/in_place_recovery over the hier backend.
# Checks that
#   1. the clean run ends with every rank in the group;
#   2. when node 1 is killed, launcher and ranks at once (SIGKILL), node 0
#      names it lost once it stops beating, its two ranks go on alone and
#      end with the clean run's parameters byte for byte, and its launcher
#      exits 0 without waiting for node 1;
#   3. when node 1 is cut off (its link goes down: no FIN, no RST), node 0,
#      which hosts the store, goes on alone with the same result, and
#      node 1, which cannot reach the store, stops: the two sides never
#      both go on;
#   4. when node 1 is killed and the same `lockstep run` is started again
#      on its host, the new launcher takes the lost node's place and its
#      ranks join the running group, fed by their peers; killed again and
#      started again, the same; every rank of the end ends with the clean
#      run's parameters byte for byte.
# Needs root (network namespaces); skips (exit 77) elsewhere. Every step has
# a deadline, and the hosts' processes are killed on exit.
# Usage: in_place_node_loss_test.sh path/to/lockstep path/to/in_place_recovery
set -uo pipefail
cli=$(realpath "$1")
program=$(realpath "$2")
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (CI runs as root)"
for tool in ip unshare nsenter cmp; do command -v $tool > /dev/null || skip "needs $tool (iproute2, util-linux, diffutils)"; done
[ -d /usr/share/datasets/fashion-mnist ] || skip "needs Fashion-MNIST (dataset-fashion-mnist)"

work=$(mktemp -d)
export LOCKSTEP_FLIGHT_DIR=$work
source "$(dirname "$0")/hosts.sh"
two_linked_hosts 10.214.0 600

# start_node NODE NAME [PROGRAM OPTIONS...]: node NODE's launcher trains in
# the background; node0 or node1 holds it. Log: $work/NAME<node>.log;
# parameters: $work/NAME.params.
start_node() {
  local node=$1 name=$2 holder
  shift 2
  holder=$([ $node = 0 ] && echo $host0 || echo $host1)
  on_host $holder timeout 240 "$cli" run --nnodes 2 --node-rank $node --master-addr 10.214.0.1 \
    --master-port 29541 --nproc-per-node 2 --grace-period 1 --on-rank-failure continue -- \
    "$program" --steps 200 --batch 64 --subset 2400 --window 10 --save-params "$work/$name.params" "$@" \
    > "$work/$name$node.log" 2>&1 &
  [ $node = 0 ] && node0=$! || node1=$!
}

# start_job NAME [PROGRAM OPTIONS...]: both nodes.
start_job() {
  start_node 0 "$@"
  start_node 1 "$@"
}

# Returns once node 0's first rank has committed step 50.
wait_for_step_50() { until_true 180 "$1: step 50" grep -q "step 50: loss" "$work/${1}0.log"; }

echo "== 1. the clean run"
start_job clean
wait $node0; rc0=$?
wait $node1; rc1=$?
[ $rc0 = 0 ] && [ $rc1 = 0 ] || { tail -20 "$work/clean0.log" "$work/clean1.log"; fail "launchers exited $rc0 and $rc1"; }
grep -q "4 ranks at the end" "$work/clean0.log" || { cat "$work/clean0.log"; fail "the clean run did not end with 4 ranks"; }
[ -s "$work/clean.params" ] || fail "the clean run wrote no parameters"

echo "== 2. node 1 killed, launcher and ranks: node 0 finishes alone"
start_job killed
wait_for_step_50 killed
start=$(date +%s%N)
kill -9 $(in_host_pids $host1)
wait $node0; rc0=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
wait $node1 2> /dev/null
cat "$work/killed0.log"
[ $rc0 = 0 ] || fail "node 0's launcher exited $rc0"
grep -q "node 1 (ranks 2-3) has not been heard from" "$work/killed0.log" || fail "node 0 did not name node 1 lost"
[ "$(grep -c '200 steps in .* 2 ranks at the end' "$work/killed0.log")" = 2 ] || fail "node 0's two ranks did not finish alone"
cmp "$work/clean.params" "$work/killed.params" || fail "the parameters differ from the clean run's"
[ -z "$(in_host_pids $host0)" ] || fail "processes left on node 0: $(in_host_pids $host0)"
echo "node 0 finished ${elapsed_ms} ms after node 1 was killed"

echo "== 3. node 1 cut off: the side with the store goes on, the other stops"
export LOCKSTEP_TIMEOUT=4
start_job cut
wait_for_step_50 cut
on_host $host1 ip link set v1-$$ down
wait $node0; rc0=$?
wait $node1; rc1=$?
cat "$work/cut0.log"
echo "--- node 1"
tail -15 "$work/cut1.log"
[ $rc0 = 0 ] || fail "node 0's launcher exited $rc0"
[ $rc1 != 0 ] || fail "node 1's launcher exited 0: both sides went on"
[ $rc1 != 124 ] || fail "node 1's launcher did not stop by itself (killed at its 240 s deadline)"
grep -q "node 1 (ranks 2-3) has not been heard from" "$work/cut0.log" || fail "node 0 did not name node 1 lost"
[ "$(grep -c '200 steps in .* 2 ranks at the end' "$work/cut0.log")" = 2 ] || fail "node 0's two ranks did not finish alone"
if grep -q "200 steps in" "$work/cut1.log"; then fail "node 1's ranks finished too: split brain"; fi
cmp "$work/clean.params" "$work/cut.params" || fail "the parameters differ from the clean run's"
[ -z "$(in_host_pids $host1)" ] || fail "processes left on node 1: $(in_host_pids $host1)"
unset LOCKSTEP_TIMEOUT
on_host $host1 ip link set v1-$$ up

echo "== 4. node 1 killed twice, and each time started again: it takes its own place"
# 100 ms a step (a pause: the same bytes) leaves the replacements time to join.
# both_trained LOG: each of the node's ranks said it trains (the two may
# join at two steps).
both_trained() { [ "$(grep -c "(replacement [0-9]*): joined at step" "$1")" = 2 ]; }
each=(--step-ms 100 --save-params-of-each-rank "$work/replaced.params")
start_job replaced "${each[@]}"
wait_for_step_50 replaced
for again in 1 2; do
  kill -9 $(in_host_pids $host1)
  wait $node1 2> /dev/null
  start=$(date +%s%N)
  start_node 1 "replaced-again$again" "${each[@]}"
  until_true 60 "the new node 1's ranks joined ($again)" both_trained "$work/replaced-again${again}1.log"
  echo "node 1 started again ($again) and its ranks training $((($(date +%s%N) - start) / 1000000)) ms later"
  grep -q "this launcher takes its place (generation $again)" "$work/replaced-again${again}1.log" ||
    { cat "$work/replaced-again${again}1.log"; fail "the new node 1 did not say it took the lost node's place"; }
done
wait $node0; rc0=$?
wait $node1; rc1=$?
cat "$work/replaced0.log" "$work/replaced-again21.log" | grep -v "step [0-9]*: loss"
[ $rc0 = 0 ] && [ $rc1 = 0 ] || fail "the launchers of node 0 and of the last node 1 exited $rc0 and $rc1"
[ "$(grep -c '200 steps in .* 4 ranks at the end' "$work/replaced0.log")" = 2 ] || fail "node 0's ranks did not end with 4"
[ "$(grep -c 'steps in .* 4 ranks at the end' "$work/replaced-again21.log")" = 2 ] ||
  fail "the last node 1's ranks did not end in the group"
for rank in 0 1 2 3; do
  cmp "$work/clean.params" "$work/replaced.params.$rank" || fail "rank $rank's parameters differ from the clean run's"
done
no_processes_left $host0 "node 0"
no_processes_left $host1 "node 1"
echo PASS
