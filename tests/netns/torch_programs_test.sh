#!/bin/bash
# A torch.distributed program (gloo, env://) under `lockstep run` on two
# hosts, as under torchrun: two network namespaces joined by a veth pair,
# each running one node of two ranks, with PyTorch 1.13 (Debian's python3)
# and 2.x (the project's virtual environment, where it exists). Checks that
#   1. a fixed job (--nnodes 2 --node-rank K) and an elastic one (--nnodes
#      2:2 --rdzv-endpoint ... --rdzv-id ...) all-reduce correctly across
#      the hosts: MASTER_ADDR is node 0's address, MASTER_PORT a port free
#      there, TORCHELASTIC_USE_AGENT_STORE=False;
#   2. a rank that raises under @record is quoted on both hosts (its error
#      file, and the other node's report);
#   3. without LOCKSTEP_STORE_TOKEN a launcher whose store other hosts can
#      reach does not start.
# Needs root (network namespaces); skips (exit 77) elsewhere. Every step has
# a deadline, and the hosts' processes are killed on exit.
# Usage: torch_programs_test.sh path/to/lockstep path/to/gloo_allreduce.py [path/to/venv/python]
set -uo pipefail
cli=$(realpath "$1")
program=$(realpath "$2")
venv_python=${3:-}
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (CI runs as root)"
for tool in ip unshare nsenter; do command -v $tool > /dev/null || skip "needs $tool (iproute2, util-linux)"; done
pythons=()
for python in /usr/bin/python3 $venv_python; do
  [ -x "$python" ] && timeout 60 "$python" -c "import torch.distributed" 2> /dev/null && pythons+=("$python")
done
[ ${#pythons[@]} -gt 0 ] || skip "no Python with torch here (python3-torch, or make torch2)"

work=$(mktemp -d)
source "$(dirname "$0")/hosts.sh"
two_linked_hosts 10.217.0 600

# run_job NAME PYTHON LAUNCHER-ARGS... -- PROGRAM-ARGS...: one launcher per
# host (node 0 on host0), both waited for; exit codes in rc0 and rc1, logs
# in $work/NAME<node>.log. Gloo finds its address by interface name (the
# hosts' names do not resolve here), as on machines without DNS.
run_job() {
  local name=$1 python=$2 i
  shift 2
  local launcher_args=() program_args=()
  while [ "$1" != -- ]; do launcher_args+=("$1"); shift; done
  shift
  program_args=("$@")
  local pids=()
  for i in 0 1; do
    local node_args=("${launcher_args[@]//NODE/$i}")
    on_host "${holders[$i]}" env PATH="$(dirname "$python"):$PATH" GLOO_SOCKET_IFNAME=v$i-$$ \
      timeout 180 "$cli" run "${node_args[@]}" --nproc-per-node 2 --grace-period 2 \
      "$program" "${program_args[@]}" > "$work/$name$i.log" 2>&1 &
    pids+=($!)
    sleep 0.3  # node 0 (the store's host) first
  done
  wait ${pids[0]}; rc0=$?
  wait ${pids[1]}; rc1=$?
}

port=29561
for python in "${pythons[@]}"; do
  version=$("$python" -c "import torch; print(torch.__version__)")
  echo "== 1. PyTorch $version: a fixed job and an elastic one across two hosts"
  fixed=(--nnodes 2 --node-rank NODE --master-addr 10.217.0.1 --master-port $port)
  elastic=(--nnodes 2:2 --rdzv-endpoint 10.217.0.1:$((port + 1)) --rdzv-id torch-programs)
  for form in fixed elastic; do
    declare -n args=$form
    run_job "$form" "$python" "${args[@]}" --
    cat "$work/${form}0.log" "$work/${form}1.log"
    [ $rc0 = 0 ] && [ $rc1 = 0 ] || fail "$form job with PyTorch $version: launchers exited $rc0 and $rc1"
    for rank in 0 1 2 3; do
      grep -q "rank $rank of 4: sum 10 (MASTER_ADDR=10.217.0.1 MASTER_PORT=[0-9]* USE_AGENT_STORE=False)" \
        "$work/${form}0.log" "$work/${form}1.log" || fail "$form job with PyTorch $version: no correct line from rank $rank"
    done
    grep -q "protected by LOCKSTEP_STORE_TOKEN" "$work/${form}0.log" || fail "the launcher did not say what protects its store"
  done
  port=$((port + 2))

  echo "== 2. PyTorch $version: a rank's @record error reaches both hosts"
  run_job failing "$python" --nnodes 2 --node-rank NODE --master-addr 10.217.0.1 --master-port $port -- --fail-rank 3
  port=$((port + 2))
  cat "$work/failing0.log" "$work/failing1.log"
  [ $rc0 != 0 ] && [ $rc1 != 0 ] || fail "a failing rank left launchers exiting $rc0 and $rc1"
  grep -q "rank 3 recorded its error (.*/attempt_0/1/error.json): RuntimeError: rank 3 failing on purpose" \
    "$work/failing1.log" || fail "host1's report does not quote rank 3's error file"
  grep -q "another node reported: rank 3 on node 1 failed: exit code 1: RuntimeError: rank 3 failing on purpose" \
    "$work/failing0.log" || fail "host0's report does not quote rank 3's error"
done

echo "== 3. no LOCKSTEP_STORE_TOKEN: a store other hosts can reach does not start"
out=$(on_host $host0 env -u LOCKSTEP_STORE_TOKEN timeout 30 "$cli" run --nnodes 2 --node-rank 0 \
  --master-addr 10.217.0.1 --master-port $port --rdzv-id guessable -- "$program" 2>&1)
rc=$?
echo "$out"
[ $rc = 2 ] || fail "expected exit code 2 without a token, got $rc"
grep -q "reachable from other hosts and nothing would protect it: set LOCKSTEP_STORE_TOKEN" <<<"$out" ||
  fail "the refusal does not say what to do"
echo "PASS"
