#!/bin/bash
# DDP training across two emulated hosts while their network misbehaves:
# two network namespaces joined by a veth pair, one `lockstep run` node of
# two ranks on each (4 ranks), training the Fashion-MNIST convnet for a
# fixed number of steps, over hier and over tcp. Faults are nftables rules in
# the hosts' namespaces, on what each host sends:
#   loss1, loss5   1% and 5% of the packets dropped each way, all run long:
#                  TCP retransmits, the job ends with the same parameters as
#                  the clean run, bit for bit (a fixed reduction order)
#   blip           every packet dropped for 3 s mid-training (a partition
#                  shorter than LOCKSTEP_TIMEOUT=30): the same parameters
#   flap           the link dropping everything for 1 s of every 2, for 12 s:
#                  the job either ends with the clean run's parameters or
#                  fails naming the silent ranks; never a hang, never other
#                  parameters
#   partition      every packet dropped for good (LOCKSTEP_TIMEOUT=5): host 0's
#                  ranks name ranks 2 and 3 within 20 s and its launcher fails
# Delay and reordering need the netem qdisc, which some kernels lack (this
# script says so and goes on without them). Prints a table: fault, backend,
# outcome, seconds, slowdown against the clean run. Needs root (network
# namespaces) and nft (Debian's nftables); skips (exit 77) otherwise.
# Usage: network_faults_test.sh path/to/lockstep path/to/fashion_mnist [BACKENDS]
set -uo pipefail
cli=$(realpath "$1")
trainer=$(realpath "$2")
backends=${3:-hier tcp}
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (CI runs as root)"
for tool in ip unshare nsenter nft; do
  command -v $tool > /dev/null || skip "needs $tool (iproute2, util-linux, nftables)"
done
[ -d /usr/share/datasets/fashion-mnist ] || skip "no Fashion-MNIST (dataset-fashion-mnist)"

work=$(mktemp -d)
export LOCKSTEP_FLIGHT_DIR=$work
source "$(dirname "$0")/hosts.sh"
# KEEP=DIR: the logs and parameters go there before the scratch directory goes.
[ -n "${KEEP:-}" ] && trap 'mkdir -p "$KEEP"; cp -r "$work"/*.log "$work"/*-*/ "$KEEP"/ 2> /dev/null; cleanup' EXIT
two_linked_hosts 10.214.0 900

# --- faults: an nftables table per host, on what it sends over its veth ---
for i in 0 1; do
  h=$([ $i = 0 ] && echo $host0 || echo $host1)
  on_host $h nft add table inet faults || skip "nft cannot make a table here (no nf_tables in this kernel)"
  on_host $h nft "add chain inet faults out { type filter hook output priority 0; policy accept; }"
done
# drop PERCENT: each host drops that share of what it sends (100: all).
drop() {
  local i h
  for i in 0 1; do
    h=$([ $i = 0 ] && echo $host0 || echo $host1)
    if [ "$1" = 100 ]; then
      on_host $h nft add rule inet faults out oifname "v$i-$$" drop
    else
      on_host $h nft add rule inet faults out oifname "v$i-$$" numgen random mod 100 \< "$1" drop
    fi
  done
}
heal() {
  on_host $host0 nft flush chain inet faults out
  on_host $host1 nft flush chain inet faults out
}

# --- one training job over both hosts ---
steps=64
# run_job NAME BACKEND [FAULT-FUNCTION]: trains; sets rc0, rc1 and seconds.
# FAULT-FUNCTION runs in the background once the ranks are training.
run_job() {
  local name=$1 backend=$2 fault=${3:-} node n start
  heal
  # The archive names its records after the file: one name for every run.
  mkdir -p "$work/$name"
  local args=(--epochs 1 --subset $((steps * 128)) --test-subset 256 --batch-size 32 --max-steps $steps --seed 3
              --progress 0 --backend "$backend" --checkpoint "$work/$name.ckpt" --save-params "$work/$name/params.pt")
  start=$(date +%s%N)
  for node in 0 1; do
    on_host "$([ $node = 0 ] && echo $host0 || echo $host1)" timeout 240 "$cli" run --nnodes 2 --node-rank $node \
      --master-addr 10.214.0.1 --master-port 29541 --nproc-per-node 2 --grace-period 1 -- "$trainer" "${args[@]}" \
      > "$work/$name.$node.log" 2>&1 &
    eval "pid$node=$!"
  done
  local faulter=""
  rm -f "$work/fault_at"
  if [ -n "$fault" ]; then
    # Once the ranks have formed their group and begun to train.
    for _ in $(seq 600); do grep -q "training a" "$work/$name.0.log" 2> /dev/null && break; sleep 0.1; done
    "$fault" & faulter=$!
  fi
  wait $pid0; rc0=$?
  node0_ended=$(date +%s%N)
  wait $pid1; rc1=$?
  [ -n "$faulter" ] && { kill $faulter 2> /dev/null; wait $faulter 2> /dev/null; }
  heal
  seconds=$(awk -v ns=$(($(date +%s%N) - start)) 'BEGIN { printf "%.1f", ns / 1e9 }')
}

# The faults. Rules stay until the job ends (run_job heals after it); none
# sleeps past it, so nothing outlives the job.
drop_1() { drop 1; }
drop_5() { drop 5; }
blip() { sleep 1; drop 100; sleep 3; heal; }
flap() { local k; for k in $(seq 6); do drop 100; sleep 1; heal; sleep 1; done; }
partition() { sleep 1; drop 100; date +%s%N > "$work/fault_at"; }

failures=0
rows=()
report() { rows+=("| $1 | $2 | $3 | $4 s | $5 |"); echo "$1 $2: $3 ($4 s)"; }
same_params() { cmp -s "$work/clean-$2/params.pt" "$work/$1/params.pt"; }

for backend in $backends; do
  echo "== $backend"
  run_job "clean-$backend" "$backend"
  if [ $rc0 != 0 ] || [ $rc1 != 0 ] || [ ! -s "$work/clean-$backend/params.pt" ]; then
    tail -20 "$work/clean-$backend.0.log" "$work/clean-$backend.1.log"
    fail "the clean run over $backend exited $rc0 and $rc1"
  fi
  clean=$seconds
  report clean "$backend" "trained $steps steps" "$clean" "1.00x"
  # A second clean run: the parameters are reproducible bit for bit, or the
  # comparisons below would mean nothing.
  run_job "again-$backend" "$backend"
  same_params "again-$backend" "$backend" || fail "two clean runs over $backend ended with different parameters"

  for fault in loss1 loss5 blip flap; do
    case $fault in
      loss1) run_job "$fault-$backend" "$backend" "drop_1" ;;
      loss5) run_job "$fault-$backend" "$backend" "drop_5" ;;
      *) LOCKSTEP_TIMEOUT=30 run_job "$fault-$backend" "$backend" "$fault" ;;
    esac
    slowdown=$(awk -v a=$seconds -v b=$clean 'BEGIN { printf "%.2fx", a / b }')
    if [ $rc0 = 0 ] && [ $rc1 = 0 ]; then
      if same_params "$fault-$backend" "$backend"; then
        report "$fault" "$backend" "same parameters as the clean run" "$seconds" "$slowdown"
      else
        report "$fault" "$backend" "FAILED: ended with other parameters" "$seconds" "$slowdown"
        failures=$((failures + 1))
      fi
    elif [ $fault = flap ] && grep -qE "did not answer|lost rank|timed out" "$work/$fault-$backend.0.log"; then
      report "$fault" "$backend" "stopped, naming the silent ranks" "$seconds" ""
    else
      tail -20 "$work/$fault-$backend.0.log" "$work/$fault-$backend.1.log"
      report "$fault" "$backend" "FAILED: exited $rc0 and $rc1" "$seconds" ""
      failures=$((failures + 1))
    fi
  done

  # For good: host 0's ranks must name ranks 2 and 3 and stop within 20 s
  # of the partition (a 5 s timeout, the watchdog's 2 s, the launcher's stop).
  LOCKSTEP_TIMEOUT=5 LOCKSTEP_WATCHDOG_SETTLE=2 run_job "partition-$backend" "$backend" partition
  named=$(awk -v a="$(cat "$work/fault_at" 2> /dev/null || echo 0)" -v b=$node0_ended \
    'BEGIN { printf "%.1f", (a > 0 ? (b - a) / 1e9 : -1) }')
  if [ $rc0 != 0 ] && grep -qE "rank\(s\) 2, 3|lost rank [23]" "$work/partition-$backend.0.log" &&
     awk -v s=$named 'BEGIN { exit !(s >= 0 && s < 20) }'; then
    report partition "$backend" "host 0 named ranks 2 and 3 and stopped $named s after the partition" "$seconds" ""
  else
    tail -20 "$work/partition-$backend.0.log"
    report partition "$backend" "FAILED: exit $rc0, $named s after the partition; ranks 2 and 3 named?" "$seconds" ""
    failures=$((failures + 1))
  fi
done
if on_host $host0 tc qdisc add dev "v0-$$" root netem delay 1ms 2> /dev/null; then
  on_host $host0 tc qdisc del dev "v0-$$" root
  echo "note: this kernel has netem; delay and reordering are not yet among the faults"
else
  echo "note: no netem qdisc in this kernel: delay (50 ms +- 20 ms) and reordering not tried"
fi

echo
echo "| fault | backend | outcome | time | vs clean |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
[ $failures = 0 ] || fail "$failures fault case(s) failed"
echo PASS
