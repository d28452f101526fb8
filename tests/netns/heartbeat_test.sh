#!/bin/bash
# Rendezvous heartbeats across hosts: three hosts on one machine, each a
# process holding its own network and UTS namespaces, joined by a bridge in
# a fourth ("the switch"), each running one `lockstep run --nnodes 2:3`
# node of one rank with --rdzv-conf keep_alive_interval=1,
# keep_alive_max_attempt=3. The ranks all-reduce once, then sleep outside
# any collective (60 s in a world of 3, half a second otherwise) and
# all-reduce again, so only the heartbeats can tell that a host is gone.
# Checks that
#   1. host2's launcher and rank frozen with SIGSTOP: hosts 0 and 1 name it
#      ("node N (host host2) stopped beating ... for S s") within the
#      documented bound, re-form without it and finish in a world of 2;
#      host2, continued with SIGCONT afterwards, exits within seconds
#      saying that it was stopped and the job went on without it;
#   2. host2 killed with SIGKILL: the same, the survivors finish in a world
#      of 2;
#   3. host2's rank stays 6 s (twice the limit) after its last collective
#      (a last checkpoint) while the others have finished and left: nobody
#      is taken for lost, every launcher exits 0;
#   4. the same, but host2 is frozen then: host0, which hosts the store and
#      waits for every node to finish, stops waiting within the bound,
#      naming host2, and exits 0;
#   5. host2 frozen, and continued while the world of 2 still runs: it stops
#      its rank, says that it was stopped, waits, and the job re-forms with
#      it (a world of 3 again);
# and that nothing is left running on any host.
# Needs root (network namespaces); skips (exit 77) elsewhere. Every step has
# a deadline, and the hosts' processes are killed on exit.
# Usage: heartbeat_test.sh path/to/lockstep path/to/rank_program
set -uo pipefail
cli=$(realpath "$1")
program=$(realpath "$2")
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (CI runs as root)"
for tool in ip unshare nsenter; do command -v $tool > /dev/null || skip "needs $tool (iproute2, util-linux)"; done

work=$(mktemp -d)
export LOCKSTEP_FLIGHT_DIR=$work
# The store listens beyond loopback: every node needs the job's secret.
export LOCKSTEP_STORE_TOKEN=${LOCKSTEP_STORE_TOKEN:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
source "$(dirname "$0")/hosts.sh"

# The switch, and host i at 10.215.0.(i+1) on a veth into its bridge.
new_host 300; switch=${holders[0]}
on_host $switch ip link add br-$$ type bridge || fail "cannot create a bridge"
on_host $switch ip link set br-$$ up
hosts=()
for i in 0 1 2; do
  new_host 300; h=${holders[-1]}; hosts+=("$h")
  ip link add h$i-$$ type veth peer name s$i-$$ || fail "cannot create a veth pair"
  ip link set h$i-$$ netns $h
  ip link set s$i-$$ netns $switch
  on_host $switch ip link set s$i-$$ master br-$$ up
  on_host $h hostname host$i
  on_host $h ip addr add 10.215.0.$((i + 1))/24 dev h$i-$$
  on_host $h ip link set lo up
  on_host $h ip link set h$i-$$ up
done

# The bound the launcher documents (docs/launcher.md, elastic jobs): detection within
# interval x (max_attempt + 1) + 2 x monitor_interval = 1 x 4 + 0.4 s.
bound_ms=4400
slack_ms=2000  # a loaded machine

# start_job PORT TAG [PAUSE [HOST2_LINGER]]: the three launchers, host0
# first (it holds the endpoint's address, so it hosts the store); pids in
# pids[]. Their ranks pause PAUSE s (default 60) in the world of 3; host2's
# rank lingers HOST2_LINGER s (default 0) after its last collective.
start_job() {
  local port=$1 tag=$2 pause=${3:-60} linger=${4:-0}
  pids=()
  for i in 0 1 2; do
    LINGER_SECONDS=$([ $i = 2 ] && echo $linger || echo 0) \
    on_host "${hosts[$i]}" timeout 120 "$cli" run --nnodes 2:3 --rdzv-endpoint 10.215.0.1:$port --rdzv-id hb-$tag \
      --nproc-per-node 1 --grace-period 2 --monitor-interval 0.2 \
      --rdzv-conf keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1 \
      -- "$program" pause $pause 3 > "$work/$tag$i.log" 2>&1 &
    pids+=($!)
    sleep 0.3
  done
  for _ in $(seq 300); do
    [ "$(cat "$work"/$tag?.log | grep -c "of 3 pausing outside any collective")" = 3 ] && return
    sleep 0.1
  done
  cat "$work"/$tag?.log
  fail "the three ranks did not reach their pause within 30 s"
}

# detected TAG: waits until hosts 0 and 1 both name host2; prints the ms.
detected() {
  local tag=$1 start=$(date +%s%N)
  for _ in $(seq 300); do
    grep -q "(host host2) stopped beating" "$work/${tag}0.log" && grep -q "(host host2) stopped beating" "$work/${tag}1.log" &&
      { echo $((($(date +%s%N) - start) / 1000000)); return; }
    sleep 0.05
  done
  cat "$work"/$tag?.log >&2
  fail "hosts 0 and 1 did not name host2 within 15 s"
}

# survivors_finish TAG: hosts 0 and 1 exit 0 in a world of 2, in time.
survivors_finish() {
  local tag=$1 rcs=() i
  for i in 0 1; do
    local deadline=$((SECONDS + 30))
    while kill -0 ${pids[$i]} 2> /dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    kill -0 ${pids[$i]} 2> /dev/null && { cat "$work"/$tag?.log; fail "host$i still runs 30 s after the detection"; }
    wait ${pids[$i]}; rcs+=($?)
  done
  for i in 0 1; do
    echo "--- host$i"
    grep -E "lockstep run|sum" "$work/$tag$i.log" | cut -c1-300
  done
  [ "${rcs[*]}" = "0 0" ] || fail "the launchers of hosts 0 and 1 exited ${rcs[*]}"
  for i in 0 1; do
    grep -q "world size 2" "$work/$tag$i.log" || fail "host$i did not re-form a world of 2"
    grep -q "rank [01] of 2 sum 3" "$work/$tag$i.log" || fail "host$i's rank did not finish in a world of 2"
    no_processes_left ${hosts[$i]} host$i
  done
}

echo "== 1. host2 frozen (SIGSTOP) while its rank sleeps outside any collective"
start_job 29551 stop
frozen=$(in_host_pids ${hosts[2]})
kill -STOP $frozen
echo "froze host2's processes: $frozen"
ms=$(detected stop)
echo "hosts 0 and 1 named host2 ${ms} ms after the freeze (bound ${bound_ms} ms)"
[ "$ms" -le $((bound_ms + slack_ms)) ] || fail "the detection took ${ms} ms, over the bound of ${bound_ms} ms"
grep -h "stopped beating" "$work"/stop[01].log | head -2 | cut -c1-300
survivors_finish stop
kill -CONT $frozen
deadline=$((SECONDS + 20))
while kill -0 ${pids[2]} 2> /dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
kill -0 ${pids[2]} 2> /dev/null && { cat "$work/stop2.log"; fail "host2 still runs 20 s after SIGCONT"; }
wait ${pids[2]}; rc=$?
echo "--- host2 (continued)"
grep "lockstep run" "$work/stop2.log" | cut -c1-400
[ $rc != 0 ] || fail "host2 exited 0 after its job went on without it"
grep -q "this launcher itself was stopped for" "$work/stop2.log" ||
  fail "host2 does not say that it was stopped and the others went on without it"
grep -q "of 2 sum" "$work/stop2.log" && fail "host2's rank took part in the world of 2"
no_processes_left ${hosts[2]} host2

echo "== 2. host2 killed (SIGKILL)"
start_job 29552 kill
kill -9 $(in_host_pids ${hosts[2]})
ms=$(detected kill)
echo "hosts 0 and 1 named host2 ${ms} ms after the kill (bound ${bound_ms} ms)"
[ "$ms" -le $((bound_ms + slack_ms)) ] || fail "the detection took ${ms} ms, over the bound of ${bound_ms} ms"
survivors_finish kill
wait ${pids[2]} 2> /dev/null

# wait_exit I SECONDS: host I's launcher has exited within SECONDS; its code in rc.
wait_exit() {
  local deadline=$((SECONDS + $2))
  while kill -0 ${pids[$1]} 2> /dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  kill -0 ${pids[$1]} 2> /dev/null && { tail -n 20 "$work"/*.log; fail "host$1 still runs after $2 s"; }
  wait ${pids[$1]}; rc=$?
}

echo "== 3. host2's rank stays 6 s after its last collective; the others have left"
start_job 29553 linger 1 6
for i in 0 1 2; do
  wait_exit $i 20
  [ $rc = 0 ] || { cat "$work"/linger?.log; fail "host$i exited $rc"; }
done
grep -h "stopped beating\|is over" "$work"/linger?.log && fail "a node that finished was taken for lost"
grep -q "rank 2 of 3 sum 6" "$work/linger2.log" || fail "host2's rank did not finish"
echo "every launcher exited 0; nobody was taken for lost"

echo "== 4. host2 frozen after its last collective: host0 stops waiting for it"
start_job 29554 late 1 60
for _ in $(seq 200); do grep -q "of 3 sum 6" "$work/late2.log" && break; sleep 0.05; done
wait_exit 1 20
[ $rc = 0 ] || fail "host1 exited $rc"
frozen=$(in_host_pids ${hosts[2]})
kill -STOP $frozen
start=$(date +%s%N)
wait_exit 0 $(((bound_ms + slack_ms) / 1000 + 1))
ms=$((($(date +%s%N) - start) / 1000000))
grep "lockstep run" "$work/late0.log" | cut -c1-300
[ $rc = 0 ] || fail "host0 exited $rc"
grep -q "not waiting for the other nodes to finish: node [0-9] (host host2) stopped beating" "$work/late0.log" ||
  fail "host0 does not name host2"
echo "host0 stopped waiting for the frozen host2 and left ${ms} ms after the freeze"
[ "$ms" -le $((bound_ms + slack_ms)) ] || fail "host0 left ${ms} ms after the freeze, over the bound of ${bound_ms} ms"
kill -9 $frozen
wait ${pids[2]} 2> /dev/null
for i in 0 1 2; do
  no_processes_left ${hosts[$i]} host$i
done

echo "== 5. host2 frozen, then continued while the job runs: it joins again"
pids=()
for i in 0 1 2; do
  on_host "${hosts[$i]}" timeout 120 "$cli" run --nnodes 2:3 --rdzv-endpoint 10.215.0.1:29555 --rdzv-id hb-back \
    --nproc-per-node 1 --grace-period 2 --monitor-interval 0.2 \
    --rdzv-conf keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1 \
    -- "$program" sleep > "$work/back$i.log" 2>&1 &
  pids+=($!)
  sleep 0.3
done
# count_in PATTERN: how many of the three logs hold it.
count_in() { local n=0 i; for i in 0 1 2; do grep -q "$1" "$work/back$i.log" && n=$((n + 1)); done; echo $n; }
for _ in $(seq 300); do [ $(count_in "world size 3), .*round 0") = 3 ] && break; sleep 0.1; done
[ $(count_in "world size 3), .*round 0") = 3 ] || { cat "$work"/back?.log; fail "no world of 3"; }
frozen=$(in_host_pids ${hosts[2]})
kill -STOP $frozen
for _ in $(seq 300); do [ $(count_in "world size 2), .*round 1") = 2 ] && break; sleep 0.05; done
[ $(count_in "world size 2), .*round 1") = 2 ] || { cat "$work"/back?.log; fail "hosts 0 and 1 did not re-form a world of 2"; }
kill -CONT $frozen
for _ in $(seq 300); do [ $(count_in "world size 3), .*round 2") = 3 ] && break; sleep 0.1; done
grep -h "lockstep run" "$work"/back?.log | cut -c1-300
[ $(count_in "world size 3), .*round 2") = 3 ] || fail "host2 did not join again in a world of 3 within 30 s"
grep -q "this launcher itself was stopped for" "$work/back2.log" || fail "host2 does not say that it was stopped"
grep -q "waiting to join its next round" "$work/back2.log" || fail "host2 did not wait to join"
# Ctrl-C for every launcher: SIGTERM to each host's `timeout`, which passes it on.
for i in 0 1 2; do
  for p in $(in_host_pids ${hosts[$i]}); do [ "$(cat /proc/$p/comm 2> /dev/null)" = timeout ] && kill -TERM $p; done
done
for i in 0 1 2; do wait_exit $i 15; done
for i in 0 1 2; do no_processes_left ${hosts[$i]} host$i; done
echo PASS
