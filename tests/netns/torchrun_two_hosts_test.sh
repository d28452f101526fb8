#!/bin/bash
# A lockstep program under PyTorch's torchrun on two hosts: two network
# namespaces joined by a veth pair, each running one torchrun node of two
# ranks of build/examples/allreduce_demo (4 ranks; every element must come
# out 2.50, and each rank checks all of them), with PyTorch 1.13 (Debian's
# torchrun) and 2.x (the project's virtual environment, where it exists):
#   static  --nnodes 2 --node_rank K --master_addr HOST0 --master_port P
#           --rdzv_backend static: node 0's agent hosts a PyTorch TCPStore on
#           P and every rank on both hosts is its client
#           (TORCHELASTIC_USE_AGENT_STORE=True)
#   c10d    --nnodes 2 --rdzv_backend c10d --rdzv_endpoint HOST0:P
#           --rdzv_id ID: 1.13 gives USE_AGENT_STORE=False (rank 0 hosts
#           lockstep's store on a free port, guarded by LOCKSTEP_STORE_TOKEN,
#           which hosts.sh exports); 2.x shares its rendezvous store (True)
# Checks both torchruns' exit codes and every rank's result line. torchrun
# names node 0 by its host name (MASTER_ADDR=host0 under c10d), so each
# torchrun sees an /etc/hosts (bind-mounted in its own mount namespace) that
# resolves host0 and host1.
# Needs root (network namespaces); skips (exit 77) elsewhere. Every job has
# a deadline, and the hosts' processes are killed on exit.
# Usage: torchrun_two_hosts_test.sh path/to/allreduce_demo [path/to/venv/bin]
set -uo pipefail
program=$(realpath "$1")
venv_bin=${2:-}
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (CI runs as root)"
for tool in ip unshare nsenter mount; do command -v $tool > /dev/null || skip "needs $tool (iproute2, util-linux)"; done
# Debian's torchrun 1.13 on Python 3.11 crashes with its default --redirects
# 0 / --tee 0 (IntFlag iteration skips Std.NONE); teeing stdout avoids it.
torchruns=()
if [ -x /usr/bin/torchrun ] && timeout 60 /usr/bin/python3 -c "import torch.distributed" 2> /dev/null; then
  torchruns+=("1.13|/usr/bin/torchrun --no_python --redirects 1 --tee 1")
fi
if [ -n "$venv_bin" ] && [ -x "$venv_bin/torchrun" ]; then
  torchruns+=("2.x|$venv_bin/torchrun --no-python")
fi
[ ${#torchruns[@]} -gt 0 ] || skip "no torchrun with an importable torch (python3-torch, or the project's .venv/torch2)"

work=$(mktemp -d)
export TMPDIR=$work  # torchrun's torchelastic_* log directories go with it
source "$(dirname "$0")/hosts.sh"
two_linked_hosts 10.218.0 900
printf '127.0.0.1 localhost\n10.218.0.1 host0\n10.218.0.2 host1\n' > "$work/hosts"
cat > "$work/rank.sh" <<WRAPPER
#!/bin/sh
echo "rank \$RANK env: USE_AGENT_STORE=\$TORCHELASTIC_USE_AGENT_STORE MASTER=\$MASTER_ADDR:\$MASTER_PORT"
exec "$program"
WRAPPER
chmod +x "$work/rank.sh"

# run_job NAME TORCHRUN-ARGS...: one torchrun per host (node 0 on host0, NODE
# in the arguments replaced by the node's rank), both waited for; exit codes
# in rc0 and rc1, output in $work/NAME<node>.log.
run_job() {
  local name=$1 i
  shift
  local pids=()
  for i in 0 1; do
    local holder=$([ $i = 0 ] && echo $host0 || echo $host1)
    local args=("${@//NODE/$i}")
    on_host "$holder" unshare --mount sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$work/hosts" \
      env LOCKSTEP_TIMEOUT=60 LOCKSTEP_CONNECT_TIMEOUT=60 \
      timeout 180 "${args[@]}" --nproc_per_node 2 "$work/rank.sh" > "$work/$name$i.log" 2>&1 &
    pids+=($!)
    sleep 0.3  # node 0 (the store's host) first
  done
  wait ${pids[0]}; rc0=$?
  wait ${pids[1]}; rc1=$?
}

# check_job NAME USE-AGENT-STORE: both exited 0; four correct ranks, two per host.
failures=0
check_job() {
  local name=$1 agent=$2 ok=1 rank
  [ $rc0 = 0 ] && [ $rc1 = 0 ] || ok=0
  for rank in 0 1 2 3; do
    grep -q "rank $rank/4 (.* backend): averaged 4194304 floats 10 times, every element 2.50 (expected 2.50), 0 wrong" \
      "$work/${name}0.log" "$work/${name}1.log" || ok=0
    grep -q "rank $rank env: USE_AGENT_STORE=$agent " "$work/${name}0.log" "$work/${name}1.log" || ok=0
  done
  if [ $ok = 1 ]; then
    echo "ok   $name (both torchruns exit 0, 4 correct ranks on 2 hosts, USE_AGENT_STORE=$agent)"
  else
    echo "FAIL $name: torchruns exited $rc0 and $rc1; expected 4 correct ranks and USE_AGENT_STORE=$agent. host0:"
    tail -n 30 "$work/${name}0.log"
    echo "host1:"
    tail -n 30 "$work/${name}1.log"
    failures=$((failures + 1))
  fi
}

port=29571
for entry in "${torchruns[@]}"; do
  version=${entry%%|*}
  read -r -a cmd <<< "${entry#*|}"
  echo "== torchrun of PyTorch $version, two hosts of two ranks"
  run_job "static-$version" "${cmd[@]}" --nnodes 2 --node_rank NODE --master_addr 10.218.0.1 --master_port $port \
    --rdzv_backend static
  check_job "static-$version" True
  port=$((port + 1))
  agent=True
  [ "$version" = 1.13 ] && agent=False
  run_job "c10d-$version" "${cmd[@]}" --nnodes 2 --rdzv_backend c10d --rdzv_endpoint 10.218.0.1:$port \
    --rdzv_id "lockstep-torchrun-$port"
  check_job "c10d-$version" $agent
  port=$((port + 1))
done
[ $failures = 0 ] || fail "$failures job(s) failed"
echo "PASS"
