#!/bin/bash
# Elastic training across hosts: up to four hosts on one machine, each a
# process holding its own network and UTS namespaces, joined by a bridge in
# a fifth ("the switch"), each running one `lockstep run --nnodes 2:4` node
# of one rank. Checks that
#   1. the minimum not reached: a lone node fails within --rdzv-timeout,
#      naming the minimum, and starts no rank;
#   2. Fashion-MNIST on three hosts: one host's launcher and ranks are
#      killed mid-epoch; the other two re-form the group (world size 2) and
#      resume from the last checkpoint with the rest of the epoch re-dealt;
#      then a fourth host joins and the job grows (world size 3) at the next
#      rendezvous; the job finishes with >= 88% test accuracy, and nothing
#      is left running.
# Needs root (network namespaces); skips (exit 77) elsewhere. Every step has
# a deadline, and the hosts' processes are killed on exit.
# Usage: elastic_test.sh path/to/lockstep path/to/fashion_mnist
set -uo pipefail
cli=$(realpath "$1")
trainer=$(realpath "$2")
data=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (CI runs as root)"
for tool in ip unshare nsenter; do command -v $tool > /dev/null || skip "needs $tool (iproute2, util-linux)"; done
[ -e "$data/train-images-idx3-ubyte.gz" ] || [ -e "$data/train-images-idx3-ubyte" ] || skip "Fashion-MNIST is not in $data"

work=$(mktemp -d)
export LOCKSTEP_FLIGHT_DIR=$work  # the killed host's peers write their dumps here
source "$(dirname "$0")/hosts.sh"
switched_hosts 4 10.214.0
endpoint=10.214.0.1:29541

# start_node I LOG ARGS...: host I's launcher in the background (pid in
# node_pid); hosts 0 holds the endpoint's address, so it hosts the store.
start_node() {
  local i=$1 log=$2
  shift 2
  on_host "${hosts[$i]}" timeout 840 "$cli" run --nnodes 2:4 --rdzv-endpoint $endpoint --rdzv-id fm \
    --nproc-per-node 1 --grace-period 2 "$@" > "$log" 2>&1 &
  node_pid=$!
}

echo "== 1. fewer nodes than the minimum: a clear error within the deadline"
start=$(date +%s%N)
start_node 0 "$work/alone.log" --rdzv-timeout 4 -- /bin/echo started
wait $node_pid; rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
cat "$work/alone.log"
[ $rc = 2 ] || fail "a lone node exited $rc, not 2"
grep -q "only 1 node(s) (host0) joined rendezvous 'fm'.*fewer than the minimum of 2" "$work/alone.log" ||
  fail "the error does not name the minimum"
grep -q started "$work/alone.log" && fail "a rank started although the minimum was not reached"
no_processes_left ${hosts[0]} host0
echo "a lone node gave up after ${elapsed_ms} ms (--rdzv-timeout 4)"
[ $elapsed_ms -lt 10000 ] || fail "took ${elapsed_ms} ms"

echo "== 2. Fashion-MNIST: a host dies mid-epoch, another joins"
train=("$trainer" --data "$data" --epochs 2 --checkpoint "$work/fm.ckpt" --fresh --checkpoint-every 40
  --progress-every 5)
start=$(date +%s)
pids=()
for i in 0 1 2; do
  start_node $i "$work/fm$i.log" --max-restarts 3 --rdzv-conf last_call_timeout=3 -- "${train[@]}"
  pids+=($node_pid)
  sleep 0.5  # host0 first: it hosts the store
done
# Kill host2 (launcher and rank together) once training is under way and
# a mid-epoch checkpoint exists.
for _ in $(seq 600); do
  grep -hq "^\[[0-9]\] epoch 1/2: [0-9]*/60000 samples" "$work"/fm?.log && [ -e "$work/fm.ckpt" ] && break
  sleep 0.5
done
[ -e "$work/fm.ckpt" ] || { cat "$work"/fm?.log; fail "no checkpoint after 5 minutes"; }
sleep 3
echo "killing host2 after $(($(date +%s) - start)) s"
kill -9 $(in_host_pids ${hosts[2]})
for _ in $(seq 300); do
  grep -q "world size 2" "$work/fm0.log" && break
  sleep 0.5
done
grep -q "world size 2" "$work/fm0.log" || { cat "$work"/fm?.log; fail "the survivors did not re-form a world of 2"; }
echo "the survivors re-formed a world of 2 after $(($(date +%s) - start)) s"
# Let the world of 2 resume and train a little before host3 comes.
for _ in $(seq 300); do
  # (grep reads to the end: an early exit would fail the pipe under pipefail)
  for f in "$work"/fm?.log; do sed -n '/now on 2 rank(s)/,$p' "$f"; done | grep "samples/s" > /dev/null && break
  sleep 0.5
done
grep -hq "now on 2 rank(s)" "$work"/fm?.log || { cat "$work"/fm?.log; fail "the job did not resume on 2 ranks"; }
echo "the world of 2 trains after $(($(date +%s) - start)) s; host3 joins"
start_node 3 "$work/fm3.log" --max-restarts 3 --rdzv-conf last_call_timeout=3 -- "${train[@]}"
pids+=($node_pid)
rcs=()
for p in ${pids[0]} ${pids[1]} ${pids[3]}; do
  wait $p
  rcs+=($?)
done
wait ${pids[2]} 2> /dev/null
elapsed=$(($(date +%s) - start))
for i in 0 1 3; do
  echo "--- host$i"
  grep -v "samples |" "$work/fm$i.log" | grep -E "lockstep run|resuming|epoch [12]/2:|^\[0\]" | cut -c1-220
done
[ "${rcs[*]}" = "0 0 0" ] || fail "the launchers of hosts 0, 1 and 3 exited ${rcs[*]}"
grep -q "world size 3" "$work/fm3.log" || fail "host3 did not join a world of 3"
grep -hq "now on 3 rank(s)" "$work"/fm?.log || fail "the job did not resume on 3 ranks"
accuracy=$(grep -h "epoch 2/2: train loss" "$work"/fm?.log | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/' | tail -1)
[ -n "$accuracy" ] || fail "no final accuracy"
echo "final test accuracy ${accuracy}% after ${elapsed} s"
awk -v a="$accuracy" 'BEGIN { exit !(a >= 88) }' || fail "accuracy ${accuracy}% is below 88%"
for i in 0 1 3; do
  no_processes_left ${hosts[$i]} host$i
done
echo PASS
