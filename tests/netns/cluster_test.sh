#!/bin/bash
# The emulated cluster (cluster.sh): two hosts of two ranks each, joined
# through a bridge, each link shaped to 10 Gbit/s. Checks that
#   1. every collective is correct across the hosts, on the whole world and
#      on a sub-group spanning them (cluster_sweep), for each cross-host
#      backend lockstep accepts (tcp, hier) started by
#      `lockstep run`, and for mpi started by mpirun through the hosts'
#      namespaces;
#   2. a host whose link goes down in the middle of a long all-reduce loop
#      is named by the other host's ranks within the timeout, and nothing
#      is left running;
#   3. over a lossy (1%) link and a 20 ms link the all-reduce is still
#      correct and does not hang (only where the kernel has netem; skipped
#      with a message elsewhere);
#   4. a cluster script killed with SIGTERM, or SIGKILL, leaves no host,
#      rank, namespace or link behind.
# Needs root (namespaces, tc); skips (exit 77) elsewhere. Every step has a
# deadline, and the hosts' processes are killed on exit.
# Usage: cluster_test.sh path/to/lockstep path/to/cluster_sweep [path/to/mpirun]
set -uo pipefail
cli=$(realpath "$1")
sweep=$(realpath "$2")
mpirun=${3:-}
here=$(dirname "$(realpath "$0")")
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (CI runs as root)"
for tool in ip tc unshare nsenter setpriv taskset; do
  command -v $tool > /dev/null || skip "needs $tool (iproute2, util-linux)"
done

work=$(mktemp -d)
export LOCKSTEP_FLIGHT_DIR=$work  # dumps of the failure scenarios go away with it
export LOCKSTEP_CONNECT_TIMEOUT=20
source "$here/cluster.sh"
cluster_up 2 10gbit
cluster_node_timeout=100

# run_pair NAME ARGS...: one `lockstep run` node of two ranks on each host,
# both waited for; logs in $work/NAME<i>.log; returns non-zero if either
# launcher did.
run_pair() {
  local name=$1 rc=0 pids=()
  shift
  for i in 0 1; do
    cluster_node $i "$work/$name$i.log" --nproc-per-node 2 --grace-period 1 "$@"
    pids+=("$cluster_node_pid")
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  cluster_port=$((cluster_port + 1))
  return $rc
}
cluster_port=29571

# The backends that run across hosts (mpi is swept under mpirun below).
backends=(tcp hier)

# expect_sweep LOG BACKEND GROUPS: every rank of LOG reports 0 failures, for
# the world and, on ranks 1..3, the sub-group.
expect_sweep() {
  local log=$1 backend=$2 want=$3 got
  got=$(grep -c "backend $backend: [0-9]* cases, 0 failed" "$log")
  [ "$got" = "$want" ] || { cat "$log"; fail "$backend: $got of $want sweeps passed in $log"; }
}

echo "== 1. the collective sweep across 2 hosts x 2 ranks"
for backend in "${backends[@]}"; do
  start=$(date +%s)
  LOCKSTEP_BACKEND=$backend run_pair sweep-$backend -- "$sweep"
  rc=$?
  grep -h "cluster sweep" "$work/sweep-${backend}0.log" "$work/sweep-${backend}1.log"
  [ $rc = 0 ] || { cat "$work"/sweep-${backend}?.log; fail "the $backend sweep's launchers failed ($rc)"; }
  # Host 0: ranks 0 and 1 (the sub-group has rank 1); host 1: ranks 2, 3.
  expect_sweep "$work/sweep-${backend}0.log" $backend 3
  expect_sweep "$work/sweep-${backend}1.log" $backend 4
  echo "$backend: correct across hosts ($(($(date +%s) - start)) s)"
done
if [ -n "$mpirun" ]; then
  start=$(date +%s)
  cluster_mpirun_path=$mpirun
  # Under `make test-asan` (ASAN_OPTIONS set) LeakSanitizer's own tracer
  # crashes now and then (SIGSEGV in its stop-the-world) when these ranks
  # exit under an mpirun that spans the namespaces, failing the sweep with
  # no leak reported. The leak check of the mpi backend is the mpi.* tests'
  # job (same code, no namespaces); here it is off. Without ASan the
  # variable means nothing.
  cluster_mpirun 0 --timeout 100 --host "$(cluster_ip 0):2,$(cluster_ip 1):2" -np 4 -x LOCKSTEP_BACKEND=mpi \
    -x ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    -x LOCKSTEP_STORE_TOKEN -x MASTER_ADDR="$(cluster_ip 0)" -x MASTER_PORT=$cluster_port -x LOCKSTEP_CONNECT_TIMEOUT "$sweep" \
    > "$work/sweep-mpi.log" 2>&1 || { cat "$work/sweep-mpi.log"; fail "the mpi sweep failed"; }
  cluster_port=$((cluster_port + 1))
  grep "cluster sweep" "$work/sweep-mpi.log"
  expect_sweep "$work/sweep-mpi.log" mpi 7
  echo "mpi: correct across hosts ($(($(date +%s) - start)) s)"
else
  echo "(no mpirun in this build: the mpi backend is not swept)"
fi

echo "== 2. a host's link goes down mid-all-reduce: the other host names its ranks"
export LOCKSTEP_TIMEOUT=4 LOCKSTEP_WATCHDOG_SETTLE=2
cluster_node 0 "$work/drop0.log" --nproc-per-node 2 --grace-period 1 -- "$cli" bench --backend tcp -b 4M -e 4M -n 1000000 -w 1
node0=$cluster_node_pid
cluster_node 1 "$work/drop1.log" --nproc-per-node 2 --grace-period 1 -- "$cli" bench --backend tcp -b 4M -e 4M -n 1000000 -w 1
node1=$cluster_node_pid
# The ranks' output is buffered, so the loop is known to run only once
# the ranks exist: then they are given two seconds to get into it.
for _ in $(seq 200); do
  [ "$(in_host_pids "$(cluster_host 1)" | wc -l)" -ge 4 ] && grep -q "store" "$work/drop0.log" && break
  sleep 0.1
done
sleep 2
start=$(date +%s%N)
cluster_link_down 1
wait $node0; rc0=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
kill -9 $(in_host_pids "$(cluster_host 1)") 2> /dev/null
wait $node1 2> /dev/null
cat "$work/drop0.log"
[ $rc0 != 0 ] || fail "node 0's launcher exited 0 after node 1's link went down"
grep -q "timed out after 4.0 s" "$work/drop0.log" || fail "node 0's ranks did not time out"
grep -q "rank(s) 2, 3 did not answer the watchdog" "$work/drop0.log" || fail "the watchdog did not name ranks 2 and 3"
echo "node 0 stopped ${elapsed_ms} ms after node 1's link went down"
[ $elapsed_ms -lt 20000 ] || fail "took ${elapsed_ms} ms (more than 20 s)"
for i in 0 1; do no_processes_left "$(cluster_host $i)" "host $i"; done
unset LOCKSTEP_TIMEOUT LOCKSTEP_WATCHDOG_SETTLE

echo "== 3. lossy and slow links"
if cluster_has_netem; then
  for link in "0 1%" "20ms 0"; do
    # A fresh cluster per link: the script below runs it in its own process.
    LOCKSTEP_CLUSTER_LINK=$link timeout 120 bash -c '
      set -uo pipefail
      cli=$1; work=$(mktemp -d); skip() { echo "SKIP: $*"; exit 77; }
      source "$2/cluster.sh"
      cluster_up 2 1gbit $LOCKSTEP_CLUSTER_LINK
      for i in 0 1; do
        cluster_node $i "$work/n$i.log" --nproc-per-node 2 -- "$cli" bench --backend tcp -b 4 -e 4M -f 16 -n 5 -w 1 -c 1
        pids+=("$cluster_node_pid")
      done
      wait "${pids[0]}" && wait "${pids[1]}" || { cat "$work"/n?.log; exit 1; }
      sed -E "s/^\[[0-9]+\] //" "$work/n0.log" | awk "\$1 ~ /^[0-9]+\$/ && NF == 9 && \$9 != 0" | grep . && exit 1
      exit 0' lossy "$cli" "$here" || fail "all-reduce over a link with delay/loss '$link' failed or hung"
    echo "delay/loss '$link': correct, no hang"
  done
else
  echo "SKIP (this case only): this kernel has no netem qdisc (sch_netem), so no lossy or delayed links"
fi

echo "== 4. a killed cluster script leaves nothing behind"
for signal in TERM KILL; do
  # The script brings up a cluster with a job on it, lists what it made,
  # and waits to be killed.
  timeout 60 setpriv --pdeathsig KILL bash -c '
    set -uo pipefail
    cli=$1; work=$(mktemp -d); skip() { echo "SKIP: $*"; exit 77; }
    source "$2/cluster.sh"
    cluster_up 2 1gbit
    for i in 0 1; do
      cluster_node $i "$work/n$i.log" --nproc-per-node 2 -- "$cli" bench --backend tcp -b 64K -e 64K -n 1000000 -w 1
    done
    for _ in $(seq 200); do [ "$(in_host_pids ${cluster_hosts[1]} | wc -l)" -ge 4 ] && break; sleep 0.1; done
    { echo "$work $cluster_tag"; echo $cluster_switch; for h in "${cluster_hosts[@]}"; do echo $h; in_host_pids $h; done; } > "$3.tmp"
    mv "$3.tmp" "$3"
    while :; do sleep 1; done' killed "$cli" "$here" "$work/made-$signal" &
  script=$!
  for _ in $(seq 300); do [ -e "$work/made-$signal" ] && break; sleep 0.1; done
  [ -e "$work/made-$signal" ] || fail "the cluster script did not start its job"
  made=$(tail -n +2 "$work/made-$signal" | tr '\n' ' ')
  read -r script_work tag < "$work/made-$signal"
  [ "$(echo $made | wc -w)" -ge 9 ] || fail "expected 3 holders and 6 launcher/rank processes, got: $made"
  kill -$signal $script
  wait $script 2> /dev/null
  for _ in $(seq 100); do
    left=$(for p in $made; do [ -d /proc/$p ] && echo $p; done)
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || fail "after SIG$signal of the cluster script, processes left: $left"
  links=$(ip -o link show | grep -- "-$tag" || true)
  [ -z "$links" ] || fail "links left after SIG$signal: $links"
  [ "$signal" = KILL ] && rm -rf "$script_work"  # its own cleanup never ran
  echo "SIG$signal: $(echo $made | wc -w) processes, all gone"
done
echo PASS
