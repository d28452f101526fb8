#!/bin/bash
# An elastic job across a partition that heals: three emulated hosts on a
# switch (network namespaces), each running one `lockstep run --nnodes 2:3`
# node of one rank, training Fashion-MNIST. Once training is under way and
# a checkpoint exists, nftables in host2's namespace drops everything it
# sends and receives for 30 s: longer than LOCKSTEP_TIMEOUT (5 s) and the
# launchers' keep-alive limit (15 s), as a switch or a link that fails and
# comes back. Checks that
#   1. the two hosts still connected name host2's rank, re-form a world of
#      2 and resume from the last checkpoint;
#   2. host2's launcher, whose requests to the store go unanswered, stops
#      its rank and tries to reach the store again; when the network heals
#      it joins again: the job grows back to a world of 3;
#   3. the job finishes on all three hosts with >= 80% test accuracy, and
#      nothing is left running.
# Needs root (network namespaces) and nft (Debian's nftables); skips
# (exit 77) elsewhere. Every step has a deadline, and the hosts' processes
# are killed on exit.
# (Before the launcher tried to reach a silent store again, host2's
# launcher took the store for gone and stopped for good.)
# Usage: elastic_partition_test.sh path/to/lockstep path/to/fashion_mnist
set -uo pipefail
cli=$(realpath "$1")
trainer=$(realpath "$2")
data=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (CI runs as root)"
for tool in ip unshare nsenter nft; do
  command -v $tool > /dev/null || skip "needs $tool (iproute2, util-linux, nftables)"
done
[ -e "$data/train-images-idx3-ubyte.gz" ] || [ -e "$data/train-images-idx3-ubyte" ] || skip "Fashion-MNIST is not in $data"

work=$(mktemp -d)
export LOCKSTEP_FLIGHT_DIR=$work
source "$(dirname "$0")/hosts.sh"
switched_hosts 3 10.215.0
cut_off=${hosts[2]}
on_host $cut_off nft add table inet faults || skip "nft cannot make a table here (no nf_tables in this kernel)"
on_host $cut_off nft "add chain inet faults out { type filter hook output priority 0; policy accept; }"
on_host $cut_off nft "add chain inet faults in { type filter hook input priority 0; policy accept; }"
partition() {
  on_host $cut_off nft add rule inet faults out oifname h2-$$ drop
  on_host $cut_off nft add rule inet faults in iifname h2-$$ drop
}
heal() {
  on_host $cut_off nft flush chain inet faults out
  on_host $cut_off nft flush chain inet faults in
}

# A 5 s collective timeout: the partition is named quickly.
export LOCKSTEP_TIMEOUT=5
train=("$trainer" --data "$data" --epochs 1 --subset 60000 --checkpoint "$work/fm.ckpt" --fresh
  --checkpoint-every 20 --progress-every 5)
start=$(date +%s)
pids=()
for i in 0 1 2; do
  on_host "${hosts[$i]}" timeout 600 "$cli" run --nnodes 2:3 --rdzv-endpoint 10.215.0.1:29551 --rdzv-id part \
    --nproc-per-node 1 --grace-period 2 --max-restarts 5 --rdzv-conf last_call_timeout=3 -- "${train[@]}" \
    > "$work/fm$i.log" 2>&1 &
  pids+=($!)
  sleep 0.5  # host0 first: it hosts the store
done
elapsed() { echo $(($(date +%s) - start)); }
in_log() { grep -q "$2" "$work/fm$1.log"; }

until_true 300 "training on three hosts" eval '[ -e "$work/fm.ckpt" ] && grep -q "samples/s" "$work"/fm?.log'
sleep 2
partition
cut_at=$(date +%s)
echo "host2 cut off after $(elapsed) s"
until_true 120 "the survivors re-form a world of 2" in_log 0 "world size 2"
echo "hosts 0 and 1 re-formed a world of 2 $(($(date +%s) - cut_at)) s after the cut"
# Whichever notices first names what was lost: host0's ranks (their
# watchdog, or the wait for rank 2's data) or host0's launcher (host2's
# heartbeat stopped; it then stops its ranks before their collective times
# out, which a loaded machine makes the more likely).
until_true 10 "host0 names rank 2 or host2" in_log 0 \
  "rank(s) 2 did not answer\|waiting for data from rank 2\|(host host2) stopped beating"
# On whichever host is node 0 of the new round (the first to join it).
until_true 120 "the world of 2 resumes" eval 'sed -s -n "/now on 2 rank(s)/,\$p" "$work"/fm[01].log | grep -c "samples/s" >/dev/null'
left=$((cut_at + 30 - $(date +%s)))
[ $left -gt 0 ] && sleep $left
heal
echo "the network healed $(($(date +%s) - cut_at)) s after the cut"
# Not round 0's world of 3: one formed after the cut.
until_true 180 "host2 joins again" in_log 2 "(world size 3).*round [1-9]"
in_log 2 "trying to reach the store at 10.215.0.1:29551 again" || fail "host2 does not say that it tries again"
echo "host2 joined a world of 3 after $(elapsed) s"
rcs=()
for p in "${pids[@]}"; do
  wait $p
  rcs+=($?)
done
for i in 0 1 2; do
  echo "--- host$i"
  grep -v "samples |" "$work/fm$i.log" | grep -E "lockstep run|resuming|stopped beating|timed out|epoch 1/1:|^\[0\]" |
    cut -c1-220
done
[ "${rcs[*]}" = "0 0 0" ] || fail "the launchers exited ${rcs[*]}"
grep -hq "now on 3 rank(s)" "$work"/fm?.log || fail "the job did not resume on 3 ranks"
accuracy=$(grep -h "epoch 1/1: train loss" "$work"/fm?.log | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/' | tail -1)
[ -n "$accuracy" ] || fail "no final accuracy"
echo "final test accuracy ${accuracy}% after $(elapsed) s"
awk -v a="$accuracy" 'BEGIN { exit !(a >= 80) }' || fail "accuracy ${accuracy}% is below 80%"
for i in 0 1 2; do
  no_processes_left ${hosts[$i]} host$i
done
echo PASS
