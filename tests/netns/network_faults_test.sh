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
#                  fails naming the silent ranks (or the silent node, whose
#                  launcher's beats did not arrive); never a hang, never
#                  other parameters
#   partition      every packet dropped for good (LOCKSTEP_TIMEOUT=5): host 0's
#                  ranks name ranks 2 and 3 within 20 s and its launcher fails
#   delay          every packet held 50 ms +- 20 ms (uniform, in order) each
#                  way, all run long: the same parameters as a clean run of
#                  as many steps (8: at a 100 ms round trip a step takes
#                  seconds)
#   reorder        every packet held 10 ms, but 25% of them sent at once,
#                  overtaking those held: likewise
#                  net_delay (tests/netns/net_delay.cc) holds the packets an
#                  iptables NFQUEUE rule gives it, as netem would where the
#                  kernel has it; both skipped without NET_DELAY or iptables.
# Prints a table: fault, backend, outcome, seconds, slowdown against the
# clean run. Needs root (network namespaces) and nft (Debian's nftables);
# skips (exit 77) otherwise.
# With a Python that has torch (PYTHON), PyTorch's DDP over Gloo runs under
# the same faults too, for the comparison (bench/pytorch_ddp.py).
# FAULTS="delay partition" runs only those (default: all of them).
# Usage: network_faults_test.sh path/to/lockstep path/to/fashion_mnist [BACKENDS [PYTHON]]
set -uo pipefail
cli=$(realpath "$1")
trainer=$(realpath "$2")
backends=${3-hier tcp}
peer_python=${4:-}
peer_program=$(realpath "$(dirname "$0")/../../bench/pytorch_ddp.py")
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
# delay_each_way NET-DELAY-OPTIONS...: each host holds what it sends
# (net_delay); --queue-bypass lets packets through should it not run.
delayer=${NET_DELAY:-}
delay_each_way() {
  local i h
  rm -f "$work"/delay.?.report
  for i in 0 1; do
    h=$([ $i = 0 ] && echo $host0 || echo $host1)
    # As on a cluster tuned for a long round trip: the window a connection
    # grew survives the compute between steps.
    on_host $h sysctl -qw net.ipv4.tcp_slow_start_after_idle=0
    on_host $h "$delayer" --queue 0 "$@" --seed $((i + 1)) --report "$work/delay.$i.report" > /dev/null 2>&1 &
    on_host $h iptables -A OUTPUT -o "v$i-$$" -j NFQUEUE --queue-num 0 --queue-bypass
  done
}
heal() {
  local h p
  for h in $host0 $host1; do
    on_host $h nft flush chain inet faults out
    [ -n "$delayer" ] || continue
    # The rule first, then the delayer, which lets what it holds go.
    on_host $h iptables -F OUTPUT 2> /dev/null
    on_host $h sysctl -qw net.ipv4.tcp_slow_start_after_idle=1
    for p in $(in_host_pids $h); do
      [ "$(cat /proc/$p/comm 2> /dev/null)" = net_delay ] && kill -TERM $p
    done
  done
  # Gone, its report written, before the next run binds the queue again.
  for _ in $(seq 50); do
    pgrep -x net_delay > /dev/null || break
    sleep 0.1
  done
}

# --- one training job over both hosts ---
# run_nodes NAME FAULT-FUNCTION START-FUNCTION: START-FUNCTION NODE HOST LOG
# starts one node's processes in the background; FAULT-FUNCTION (may be
# empty) runs in the background once node 0's log says it trains. Sets rc0,
# rc1, node0_ended and seconds.
run_nodes() {
  local name=$1 fault=$2 start_node=$3 node start
  heal
  start=$(date +%s%N)
  for node in 0 1; do
    "$start_node" $node "$([ $node = 0 ] && echo $host0 || echo $host1)" "$work/$name.$node.log"
    eval "pid$node=$!"
  done
  local faulter=""
  rm -f "$work/fault_at"
  if [ -n "$fault" ]; then
    # Once the ranks have formed their group and begun to train.
    for _ in $(seq 600); do grep -qE "training a|training \(" "$work/$name.0.log" 2> /dev/null && break; sleep 0.1; done
    "$fault" & faulter=$!
  fi
  wait $pid0; rc0=$?
  node0_ended=$(date +%s%N)
  wait $pid1; rc1=$?
  [ -n "$faulter" ] && { kill $faulter 2> /dev/null; wait $faulter 2> /dev/null; }
  heal
  seconds=$(awk -v ns=$(($(date +%s%N) - start)) 'BEGIN { printf "%.1f", ns / 1e9 }')
}

steps=64
slow_steps=8  # under delay and reordering
# run_job NAME BACKEND [FAULT-FUNCTION]: lockstep's trainer, 2 ranks per host,
# $steps steps.
run_job() {
  job_name=$1 job_backend=$2
  # The archive names its records after the file: one name for every run.
  mkdir -p "$work/$job_name"
  run_nodes "$1" "${3:-}" start_trainer
}
start_trainer() {
  local args=(--epochs 1 --subset $((64 * 128)) --test-subset 256 --batch-size 32 --max-steps $steps --seed 3
              --progress 0 --backend "$job_backend" --checkpoint "$work/$job_name.ckpt"
              --save-params "$work/$job_name/params.pt")
  on_host "$2" timeout 240 "$cli" run --nnodes 2 --node-rank $1 --master-addr 10.214.0.1 --master-port 29541 \
    --nproc-per-node 2 --grace-period 1 -- "$trainer" "${args[@]}" > "$3" 2>&1 &
}

# The faults. Rules stay until the job ends (run_job heals after it); none
# sleeps past it, so nothing outlives the job.
drop_1() { drop 1; }
drop_5() { drop 5; }
blip() { sleep 1; drop 100; sleep 3; heal; }
flap() { local k; for k in $(seq 6); do drop 100; sleep 1; heal; sleep 1; done; }
partition() { sleep 1; drop 100; date +%s%N > "$work/fault_at"; }
delay() { delay_each_way --delay-ms 50 --jitter-ms 20; }
reorder() { delay_each_way --delay-ms 10 --reorder-percent 25; }

faults=" ${FAULTS:-loss1 loss5 blip flap delay reorder partition} "
if [ -z "$delayer" ] || [ ! -x "$delayer" ]; then
  echo "note: no NET_DELAY given (tests/netns/net_delay.cc needs libnetfilter-queue-dev): delay and reordering not tried"
  faults=${faults/ delay reorder / }
elif ! command -v iptables > /dev/null || ! on_host $host0 iptables -L OUTPUT > /dev/null 2>&1; then
  echo "note: no iptables here: delay and reordering not tried"
  faults=${faults/ delay reorder / }
elif [[ $(on_host $host0 timeout 1 "$delayer" --queue 0 --delay-ms 1 2>&1) != "net_delay: queue 0"* ]]; then
  echo "note: net_delay cannot bind a queue here (no nfnetlink_queue?): delay and reordering not tried"
  faults=${faults/ delay reorder / }
fi
wanted() { [[ $faults == *" $1 "* ]]; }

failures=0
rows=()
report() { rows+=("| $1 | $2 | $3 | $4 s | $5 |"); echo "$1 $2: $3 ($4 s)"; }
# same_params RUN REFERENCE-RUN
same_params() { cmp -s "$work/$2/params.pt" "$work/$1/params.pt"; }
# slowdown [CLEAN-SECONDS]: this run's time against the clean run's.
slowdown() { awk -v a=$seconds -v b=${1:-$clean} 'BEGIN { printf "%.2fx", a / b }'; }
# Seconds from the partition to node 0's end (-1: no partition recorded).
since_partition() {
  awk -v a="$(cat "$work/fault_at" 2> /dev/null || echo 0)" -v b=$node0_ended \
    'BEGIN { printf "%.1f", (a > 0 ? (b - a) / 1e9 : -1) }'
}
first_error() { grep -m1 -oE "(Error|Timed out|timed out|Connection)[^|]{0,150}" "$1" || echo "no error printed"; }

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
  same_params "again-$backend" "clean-$backend" || fail "two clean runs over $backend ended with different parameters"

  if wanted delay || wanted reorder; then
    steps=$slow_steps run_job "clean$slow_steps-$backend" "$backend"
    [ $rc0 = 0 ] && [ $rc1 = 0 ] || fail "the clean run of $slow_steps steps over $backend exited $rc0 and $rc1"
    clean_slow=$seconds
    report "clean, $slow_steps steps" "$backend" "trained $slow_steps steps" "$clean_slow" "1.00x"
  fi
  for fault in loss1 loss5 blip flap delay reorder; do
    wanted $fault || continue
    reference=clean-$backend
    case $fault in
      loss1) run_job "$fault-$backend" "$backend" "drop_1" ;;
      loss5) run_job "$fault-$backend" "$backend" "drop_5" ;;
      delay | reorder)
        steps=$slow_steps run_job "$fault-$backend" "$backend" "$fault"
        reference=clean$slow_steps-$backend ;;
      *) LOCKSTEP_TIMEOUT=30 run_job "$fault-$backend" "$backend" "$fault" ;;
    esac
    slowdown=$(slowdown "$([ $reference = clean-$backend ] && echo $clean || echo $clean_slow)")
    if [ $fault = reorder ] && ! grep -qE ", [1-9][0-9]* released after" "$work"/delay.?.report; then
      report "$fault" "$backend" "FAILED: no packet overtook another ($(cat "$work"/delay.?.report 2> /dev/null))" \
        "$seconds" ""
      failures=$((failures + 1))
    elif [ $rc0 = 0 ] && [ $rc1 = 0 ]; then
      if same_params "$fault-$backend" "$reference"; then
        report "$fault" "$backend" "same parameters as the clean run" "$seconds" "$slowdown"
      else
        report "$fault" "$backend" "FAILED: ended with other parameters" "$seconds" "$slowdown"
        failures=$((failures + 1))
      fi
    elif [ $fault = flap ] && grep -qE "did not answer|lost rank|timed out|has not been heard from" "$work/$fault-$backend.0.log"; then
      report "$fault" "$backend" "stopped, naming the silent ranks" "$seconds" ""
    else
      tail -20 "$work/$fault-$backend.0.log" "$work/$fault-$backend.1.log"
      report "$fault" "$backend" "FAILED: exited $rc0 and $rc1" "$seconds" ""
      failures=$((failures + 1))
    fi
  done

  # For good: host 0's ranks must name ranks 2 and 3 and stop within 20 s
  # of the partition (a 5 s timeout, the watchdog's 2 s, the launcher's stop).
  wanted partition || continue
  LOCKSTEP_TIMEOUT=5 LOCKSTEP_WATCHDOG_SETTLE=2 run_job "partition-$backend" "$backend" partition
  named=$(since_partition)
  if [ $rc0 != 0 ] && grep -qE "rank\(s\) 2, 3|lost rank [23]" "$work/partition-$backend.0.log" &&
     awk -v s=$named 'BEGIN { exit !(s >= 0 && s < 20) }'; then
    report partition "$backend" "host 0 named ranks 2 and 3 and stopped $named s after the partition" "$seconds" ""
  else
    tail -20 "$work/partition-$backend.0.log"
    report partition "$backend" "FAILED: exit $rc0, $named s after the partition; ranks 2 and 3 named?" "$seconds" ""
    failures=$((failures + 1))
  fi
done
# --- the peer: PyTorch's DDP over Gloo under the same faults ---
# bench/pytorch_ddp.py's convnet on synthetic batches, 2 ranks per host, Gloo
# given lockstep's timeouts. Not a pass or fail of lockstep's: the time
# against Gloo's own clean run, and what Gloo says when the partition lasts.
peer_steps=62
start_peer() {
  on_host "$2" env GLOO_SOCKET_IFNAME=v$1-$$ timeout 120 "$peer_python" "$peer_program" --model convnet -np 2 \
    --batch 32 --nnodes 2 --node-rank $1 --master-addr 10.214.0.1 --master-port $peer_port --steps $peer_steps \
    --warmup 2 --backend gloo --timeout-s $peer_timeout --announce > "$3" 2>&1 &
}
# run_peer NAME TIMEOUT-SECONDS [FAULT-FUNCTION]
run_peer() {
  peer_port=$((peer_port + 1)) peer_timeout=$2
  run_nodes "$1" "${3:-}" start_peer
}
if [ -n "$peer_python" ] && timeout 60 "$peer_python" -c "import torch.distributed" 2> /dev/null; then
  echo "== gloo: PyTorch $("$peer_python" -c 'import torch; print(torch.__version__)')'s DDP"
  peer_port=29560
  run_peer clean-gloo 30
  [ $rc0 = 0 ] && [ $rc1 = 0 ] || { tail -20 "$work/clean-gloo.0.log"; fail "the clean run over gloo exited $rc0 and $rc1"; }
  clean=$seconds
  report clean gloo "trained $peer_steps steps" "$clean" "1.00x"
  if wanted delay || wanted reorder; then
    peer_steps=$((slow_steps - 2)) run_peer "clean$slow_steps-gloo" 30
    clean_slow=$seconds
    report "clean, $slow_steps steps" gloo "trained $((slow_steps - 2)) steps" "$clean_slow" "1.00x"
  fi
  for fault in loss1 loss5 blip flap delay reorder; do
    wanted $fault || continue
    reference=$clean
    case $fault in loss1) run_peer "$fault-gloo" 30 drop_1 ;; loss5) run_peer "$fault-gloo" 30 drop_5 ;;
                   delay | reorder) peer_steps=$((slow_steps - 2)) run_peer "$fault-gloo" 30 "$fault"
                                    reference=$clean_slow ;;
                   *) run_peer "$fault-gloo" 30 "$fault" ;; esac
    if [ $rc0 = 0 ] && [ $rc1 = 0 ]; then
      report "$fault" gloo "trained" "$seconds" "$(slowdown $reference)"
    else
      report "$fault" gloo "exited $rc0 and $rc1: $(first_error "$work/$fault-gloo.0.log")" "$seconds" ""
    fi
  done
  if wanted partition; then
    run_peer partition-gloo 5 partition
    report partition gloo "node 0 exited $rc0 $(since_partition) s after the partition: $(first_error \
      "$work/partition-gloo.0.log")" "$seconds" ""
  fi
else
  echo "note: no PyTorch given (or it does not import): Gloo not run under the same faults"
fi
for report in "$work"/delay.?.report; do
  [ -e "$report" ] && echo "net_delay, host ${report: -8:1}, last run: $(cat "$report")"
done

echo
echo "| fault | backend | outcome | time | vs clean |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
[ $failures = 0 ] || fail "$failures fault case(s) failed"
echo PASS
