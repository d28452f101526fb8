#!/bin/bash
# An elastic job whose rendezvous lives in etcd loses its node 0 and
# finishes: three emulated hosts on a switch (network namespaces), each
# running one member of a three-member etcd cluster (Debian's etcd-server)
# and one `lockstep run --nnodes 2:3 --rdzv-backend etcd` node of one rank,
# training Fashion-MNIST with checkpoints. Once training is under way and
# a checkpoint exists, everything on the host of node 0 is killed: its
# launcher (which hosts the ranks' store of the round), its rank and its
# etcd member. Checks that
#   1. the launchers on the other two hosts, whose etcd keeps a quorum,
#      re-form a world of 2 and resume from the last checkpoint;
#   2. the job finishes there with at least 87% test accuracy (the same
#      training undisturbed on three hosts reached 88.4%; it is not rerun
#      here, to keep the test short), and nothing is left running.
# With the c10d rendezvous the store dies with node 0 and the survivors
# stop (docs/launcher.md). Needs root (network namespaces) and etcd;
# skips (exit 77) elsewhere. Every step has a deadline, and the hosts'
# processes are killed on exit.
# Usage: etcd_rendezvous_test.sh path/to/lockstep path/to/fashion_mnist
set -uo pipefail
cli=$(realpath "$1")
trainer=$(realpath "$2")
data=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (CI runs as root)"
for tool in ip unshare nsenter etcd; do
  command -v $tool > /dev/null || skip "needs $tool (iproute2, util-linux, etcd-server)"
done
[ -e "$data/train-images-idx3-ubyte.gz" ] || [ -e "$data/train-images-idx3-ubyte" ] || skip "Fashion-MNIST is not in $data"
built=$("$cli" run --rdzv-backend etcd --rdzv-endpoint 127.0.0.1:1 --rdzv-id x --rdzv-timeout 1 -- true 2>&1)
grep -q "without libcurl" <<<"$built" && skip "this lockstep was built without libcurl (no etcd rendezvous)"

work=$(mktemp -d)
export LOCKSTEP_FLIGHT_DIR=$work
source "$(dirname "$0")/hosts.sh"
switched_hosts 3 10.216.0
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }

# The etcd cluster: member i on host i.
cluster=etcd0=http://10.216.0.1:2380,etcd1=http://10.216.0.2:2380,etcd2=http://10.216.0.3:2380
endpoints=10.216.0.1:2379,10.216.0.2:2379,10.216.0.3:2379
for i in 0 1 2; do
  ip=10.216.0.$((i + 1))
  on_host "${hosts[$i]}" timeout 900 etcd --name etcd$i --data-dir "$work/etcd$i" \
    --listen-client-urls http://$ip:2379 --advertise-client-urls http://$ip:2379 \
    --listen-peer-urls http://$ip:2380 --initial-advertise-peer-urls http://$ip:2380 \
    --initial-cluster $cluster --initial-cluster-state new --initial-cluster-token lockstep-test \
    > "$work/etcd$i.log" 2>&1 &
done
healthy() { on_host "${hosts[1]}" etcdctl --endpoints $endpoints endpoint health > /dev/null 2>&1; }
for _ in $(seq 60); do healthy && break; sleep 0.5; done
healthy || { tail -5 "$work"/etcd?.log; fail "the etcd cluster did not become healthy within 30 s"; }
echo "etcd cluster of 3 healthy after $(elapsed) s"

# A 5 s collective timeout and a 3 s keep-alive limit: the loss is named quickly.
export LOCKSTEP_TIMEOUT=5
# run_job ID TAG: the job on all three hosts, logs in $work/TAG<i>.log.
run_job() {
  local id=$1 tag=$2 i
  pids=()
  train=("$trainer" --data "$data" --epochs 1 --subset 60000 --checkpoint "$work/$tag.ckpt" --fresh
    --checkpoint-every 20 --progress-every 5)
  for i in 0 1 2; do
    on_host "${hosts[$i]}" timeout 600 "$cli" run --nnodes 2:3 --rdzv-backend etcd --rdzv-endpoint $endpoints \
      --rdzv-id $id --nproc-per-node 1 --grace-period 2 --max-restarts 5 \
      --rdzv-conf last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3 -- "${train[@]}" \
      > "$work/$tag$i.log" 2>&1 &
    pids+=($!)
  done
}
accuracy_of() {
  grep -h "epoch 1/1: train loss" "$work/$1"?.log 2> /dev/null | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/' | tail -1
}

run_job lose-node0 fm
until_true 300 "training on three hosts" eval '[ -e "$work/fm.ckpt" ] && grep -q "samples/s" "$work"/fm?.log'
sleep 2
victim=$(grep -l "rank(s) on node 0 of 3" "$work"/fm?.log | head -1 | sed -E 's/.*fm([0-9])\.log/\1/')
[ -n "$victim" ] || fail "no launcher says it is node 0 of 3"
survivors=($(printf '%s\n' 0 1 2 | grep -vx "$victim"))
kill -9 $(in_host_pids ${hosts[$victim]})
killed_at=$(date +%s)
echo "killed everything on host$victim, node 0 (launcher, its rank, etcd member) after $(elapsed) s"
until_true 120 "the survivors re-form a world of 2" grep -q "world size 2" "$work/fm${survivors[0]}.log"
echo "hosts ${survivors[*]} re-formed a world of 2 $(($(date +%s) - killed_at)) s after the kill"
rcs=()
for i in "${survivors[@]}"; do
  wait "${pids[$i]}"
  rcs+=($?)
done
for i in "${survivors[@]}"; do
  echo "--- host$i"
  grep -v "samples |" "$work/fm$i.log" | grep -E "lockstep run|resuming|stopped beating|timed out|epoch 1/1:|^\[0\]" |
    cut -c1-220
done
[ "${rcs[*]}" = "0 0" ] || fail "the survivors' launchers exited ${rcs[*]}"
grep -hq "now on 2 rank(s)" "$work"/fm?.log || fail "the world of 2 did not resume from the checkpoint"
accuracy=$(accuracy_of fm)
[ -n "$accuracy" ] || fail "no final accuracy"
echo "after losing node 0: test accuracy ${accuracy}%, $(elapsed) s in all"
awk -v a="$accuracy" 'BEGIN { exit !(a >= 87) }' || fail "accuracy ${accuracy}% is below 87%"
for i in "${survivors[@]}"; do
  # What is left is the etcd member (and the timeout over it), nothing else.
  left=$(in_host_pids ${hosts[$i]} | while read -r p; do
    command=$(tr '\0' ' ' < /proc/$p/cmdline 2> /dev/null)
    [ -n "$command" ] || continue  # gone meanwhile
    [[ $command =~ ^(timeout\ [0-9]+\ )?etcd\  ]] || echo "$p $command"
  done)
  [ -z "$left" ] || fail "processes other than etcd left on host$i: $left"
done
echo PASS
