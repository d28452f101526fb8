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
#   3. when both ranks of node 1 die while its launcher lives, node 0's
#      two ranks go on alone with the same result, and node 1's launcher,
#      which keeps beating, waits for the job's outcome and exits 0 (it
#      used to report its round failed, which stopped node 0's ranks too);
#   4. when node 1 is cut off (its link goes down: no FIN, no RST), node 0,
#      which hosts the store, goes on alone with the same result, and
#      node 1, which cannot reach the store, stops: the two sides never
#      both go on;
#   5. when node 1 is killed and the same `lockstep run` is started again
#      on its host, the new launcher takes the lost node's place and its
#      ranks join the running group, fed by their peers; killed again and
#      started again, the same; every rank of the end ends with the clean
#      run's parameters byte for byte;
#   6. the same in an elastic job (--nnodes 2:2) whose rendezvous is the
#      c10d store on node 0: the round is not re-formed for the lost node,
#      and the launcher started again, which has no --node-rank, takes the
#      lost node's place in the running round;
#   7. the same with the rendezvous in etcd (a member on node 0's host),
#      where the ranks' store is the round's own.
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
# How the nodes meet: a fixed job (each its --node-rank) unless the
# sections below set `rendezvous` to an elastic one.
rendezvous=()
start_node() {
  local node=$1 name=$2 holder
  shift 2
  holder=$([ $node = 0 ] && echo $host0 || echo $host1)
  local meet=(--nnodes 2 --node-rank $node --master-addr 10.214.0.1 --master-port 29541)
  [ ${#rendezvous[@]} = 0 ] || meet=("${rendezvous[@]}")
  on_host $holder timeout 240 "$cli" run "${meet[@]}" --nproc-per-node 2 --grace-period 1 --on-rank-failure continue -- \
    "$program" --steps 200 --batch 64 --subset 2400 --window 10 --save-params "$work/$name.params" "$@" \
    > "$work/$name$node.log" 2>&1 &
  [ $node = 0 ] && node0=$! || node1=$!
}

# start_job NAME [PROGRAM OPTIONS...]: both nodes; node 1 once node 0 has
# joined an elastic rendezvous, which numbers the nodes as they come.
start_job() {
  start_node 0 "$@"
  [ ${#rendezvous[@]} = 0 ] || until_true 60 "node 0 to join the rendezvous" grep -q "as its node 0" "$work/${1}0.log"
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

echo "== 3. both ranks of node 1 die, its launcher lives: node 0 finishes alone, node 1 waits for it"
start_job emptied --kill 2:60:reduce --kill 3:60:reduce
wait $node0; rc0=$?
wait $node1; rc1=$?
cat "$work/emptied1.log"
[ $rc0 = 0 ] && [ $rc1 = 0 ] || { tail -20 "$work/emptied0.log"; fail "launchers exited $rc0 and $rc1"; }
grep -q "the other nodes finished the job without this node's ranks" "$work/emptied1.log" ||
  fail "node 1's launcher did not wait for the job's outcome"
[ "$(grep -c '200 steps in .* 2 ranks at the end' "$work/emptied0.log")" = 2 ] || fail "node 0's two ranks did not finish alone"
cmp "$work/clean.params" "$work/emptied.params" || fail "the parameters differ from the clean run's"
no_processes_left $host0 "node 0"
no_processes_left $host1 "node 1"

echo "== 4. node 1 cut off: the side with the store goes on, the other stops"
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

# killed_twice_and_taken_over NAME: node 1 killed twice, and each time
# started again; every rank ends with the clean run's parameters.
# 100 ms a step (a pause: the same bytes) leaves the replacements time to join.
# both_trained LOG: each of the node's ranks said it trains (the two may
# join at two steps).
both_trained() { [ "$(grep -c "(replacement [0-9]*): joined at step" "$1")" = 2 ]; }
killed_twice_and_taken_over() {
  local name=$1 again rank
  local each=(--step-ms 100 --save-params-of-each-rank "$work/$name.params")
  start_job $name "${each[@]}"
  wait_for_step_50 $name
  for again in 1 2; do
    kill -9 $(in_host_pids $host1)
    wait $node1 2> /dev/null
    start=$(date +%s%N)
    start_node 1 "$name-again$again" "${each[@]}"
    until_true 60 "the new node 1's ranks joined ($again)" both_trained "$work/$name-again${again}1.log"
    echo "node 1 started again ($again) and its ranks training $((($(date +%s%N) - start) / 1000000)) ms later"
    grep -q "this launcher takes its place (generation $again)" "$work/$name-again${again}1.log" ||
      { cat "$work/$name-again${again}1.log"; fail "the new node 1 did not say it took the lost node's place"; }
  done
  wait $node0; rc0=$?
  wait $node1; rc1=$?
  cat "$work/${name}0.log" "$work/$name-again21.log" | grep -v "step [0-9]*: loss"
  [ $rc0 = 0 ] && [ $rc1 = 0 ] || fail "the launchers of node 0 and of the last node 1 exited $rc0 and $rc1"
  [ "$(grep -c '200 steps in .* 4 ranks at the end' "$work/${name}0.log")" = 2 ] || fail "node 0's ranks did not end with 4"
  [ "$(grep -c 'steps in .* 4 ranks at the end' "$work/$name-again21.log")" = 2 ] ||
    fail "the last node 1's ranks did not end in the group"
  if grep -q "round 1" "$work/${name}0.log"; then fail "the job re-formed its round: it did not go on in place"; fi
  for rank in 0 1 2 3; do
    cmp "$work/clean.params" "$work/$name.params.$rank" || fail "rank $rank's parameters differ from the clean run's"
  done
}

echo "== 5. node 1 killed twice, and each time started again: it takes its own place"
killed_twice_and_taken_over replaced
no_processes_left $host0 "node 0"
no_processes_left $host1 "node 1"

echo "== 6. the same in an elastic job, the c10d store on node 0"
rendezvous=(--nnodes 2:2 --rdzv-backend c10d --rdzv-endpoint 10.214.0.1:29542 --rdzv-id elastic-$$
  --rdzv-conf last_call_timeout=1)
killed_twice_and_taken_over elastic
no_processes_left $host0 "node 0"
no_processes_left $host1 "node 1"

echo "== 7. the same with the rendezvous in etcd"
if [ -x /usr/bin/etcd ]; then
  on_host $host0 timeout 300 /usr/bin/etcd --data-dir "$work/etcd" --listen-client-urls http://10.214.0.1:23791 \
    --advertise-client-urls http://10.214.0.1:23791 --listen-peer-urls http://127.0.0.1:23801 \
    --log-level warn > "$work/etcd.log" 2>&1 &
  etcd_pid=$!
  rendezvous=(--nnodes 2:2 --rdzv-backend etcd --rdzv-endpoint 10.214.0.1:23791 --rdzv-id etcd-$$
    --rdzv-conf last_call_timeout=1)
  killed_twice_and_taken_over elastic-etcd
  # The launchers have ended: what runs on node 0's host now is etcd.
  kill $(in_host_pids $host0) 2> /dev/null
  wait $etcd_pid 2> /dev/null
else
  echo "skipped: etcd-server is not installed (apt-get install etcd-server)"
fi
no_processes_left $host0 "node 0"
no_processes_left $host1 "node 1"
echo PASS
