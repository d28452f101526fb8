#!/bin/bash
# A lockstep program under PyTorch's own launcher, torchrun, on this host:
# build/examples/allreduce_demo (an all-reduce of 3 ranks that checks every
# element) with --nproc_per_node 3, under each torchrun found (PyTorch 1.13,
# Debian's /usr/bin/torchrun; 2.x from the project's virtual environment)
# and each single-node rendezvous:
#   static     plain `torchrun`, default port 29500: the agent hosts a
#              PyTorch TCPStore there (TORCHELASTIC_USE_AGENT_STORE=True) and
#              every rank is its client (before, rank 0 failed with "Address
#              already in use")
#   standalone `--standalone`: c10d rendezvous on a local port (1.13 gives
#              USE_AGENT_STORE=False: rank 0 hosts lockstep's store on the
#              free MASTER_PORT; 2.x shares its rendezvous store: True)
#   c10d       `--rdzv_backend c10d --rdzv_endpoint 127.0.0.1:P --nnodes 1`
#   restart    static with --max_restarts 1 (given tests' rank_program): rank
#              1 exits 5 in attempt 0, before joining, while ranks 0 and 2
#              join; torchrun restarts all three, and attempt 1 (keys under
#              /worker/attempt_1 in the same agent store) completes
# Checks each job's exit code, the result line of all three ranks, and which
# store the ranks used. Skips (77) without any torchrun that imports.
# Usage: torchrun_test.sh path/to/allreduce_demo [path/to/venv/bin] [path/to/rank_program]
set -uo pipefail
program=$(realpath "$1")
venv_bin=${2:-}
rank_program=${3:-}
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

# Debian's torchrun 1.13 runs on Python 3.11, whose IntFlag iteration skips
# Std.NONE and Std.ALL: its default --redirects 0 / --tee 0 crash it
# ("'NoneType' object has no attribute 'get'"). Teeing stdout works around it.
torchruns=()
if [ -x /usr/bin/torchrun ] && timeout 60 /usr/bin/python3 -c "import torch.distributed" 2> /dev/null; then
  torchruns+=("/usr/bin/torchrun --no_python --redirects 1 --tee 1")
fi
if [ -n "$venv_bin" ] && [ -x "$venv_bin/torchrun" ]; then
  torchruns+=("$venv_bin/torchrun --no-python")
fi
[ ${#torchruns[@]} -gt 0 ] || skip "no torchrun with an importable torch (python3-torch, or the project's .venv/torch2)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TMPDIR=$work  # torchrun's torchelastic_* log directories go with it
# Rank 0 says which store torchrun told the ranks to use.
cat > "$work/rank.sh" <<WRAPPER
#!/bin/sh
[ "\$RANK" = 0 ] && echo "rank 0 env: USE_AGENT_STORE=\$TORCHELASTIC_USE_AGENT_STORE MASTER=\$MASTER_ADDR:\$MASTER_PORT"
exec "$program"
WRAPPER
chmod +x "$work/rank.sh"
# rank_program reads the attempt from LOCKSTEP_RESTART_COUNT; torchrun sets TORCHELASTIC_RESTART_COUNT.
cat > "$work/restart.sh" <<WRAPPER
#!/bin/sh
echo "rank \$RANK attempt \$TORCHELASTIC_RESTART_COUNT env: USE_AGENT_STORE=\$TORCHELASTIC_USE_AGENT_STORE"
LOCKSTEP_RESTART_COUNT=\$TORCHELASTIC_RESTART_COUNT exec "$rank_program" restart
WRAPPER
chmod +x "$work/restart.sh"

# A port is free only until someone binds it: between free_port and
# torchrun's bind another process may take it. A shell cannot hand a held
# socket to torchrun, so a job that lost its port (EADDRINUSE) runs again
# with a new one (with_port), at most 3 times.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
lost_its_port() { grep -qE "Address already in use|EADDRINUSE|errno: 98|error code 98" "$1"; }
# with_port LOG CMD...: runs CMD with every @PORT@ replaced by a free port,
# output to LOG; again with another port while it lost the one it had.
with_port() {
  local log=$1 rc attempt
  shift
  for attempt in 1 2 3; do
    local port args=()
    port=$(free_port)
    for a in "$@"; do args+=("${a//@PORT@/$port}"); done
    timeout 150 "${args[@]}" > "$log" 2>&1
    rc=$?
    [ $rc != 0 ] && lost_its_port "$log" && [ $attempt -lt 3 ] && echo "note: port $port was taken meanwhile; again" && continue
    return $rc
  done
}
port_in_use() { (exec 3<> /dev/tcp/127.0.0.1/$1) 2> /dev/null; }

export LOCKSTEP_TIMEOUT=60 LOCKSTEP_CONNECT_TIMEOUT=30
failures=0
# run NAME EXPECTED-USE-AGENT-STORE TORCHRUN-ARGS...
run() {
  local name=$1 agent=$2
  shift 2
  local log="$work/$name.log"
  with_port "$log" "$@" --nproc_per_node 3 "$work/rank.sh"
  local rc=$?
  local ok=1
  [ $rc = 0 ] || ok=0
  for rank in 0 1 2; do
    grep -q "rank $rank/3 (.* backend): averaged 4194304 floats 10 times, every element 2.00 (expected 2.00), 0 wrong" \
      "$log" || ok=0
  done
  grep -q "rank 0 env: USE_AGENT_STORE=$agent " "$log" || ok=0
  if [ $ok = 1 ]; then
    echo "ok   $name (exit 0, 3 correct ranks, USE_AGENT_STORE=$agent)"
  else
    echo "FAIL $name: exit $rc, expected 3 correct ranks and USE_AGENT_STORE=$agent; output:"
    tail -n 40 "$log"
    failures=$((failures + 1))
  fi
}

for torchrun in "${torchruns[@]}"; do
  read -r -a cmd <<< "$torchrun"
  version=$("$(dirname "$(readlink -f "${cmd[0]}")")/python3" -c "import torch; print(torch.__version__)" 2> /dev/null ||
    /usr/bin/python3 -c "import torch; print(torch.__version__)")
  echo "== torchrun of PyTorch $version"
  v2=False
  [[ $version == 1.* ]] || v2=True
  if port_in_use 29500; then
    echo "note: port 29500 is in use here; the static job takes a free one with --master_port"
    run "static-$version" True "${cmd[@]}" --master_port @PORT@
  else
    run "static-$version" True "${cmd[@]}"
  fi
  run "standalone-$version" $v2 "${cmd[@]}" --standalone
  run "c10d-$version" $v2 "${cmd[@]}" --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:@PORT@" --nnodes 1
  if [ -n "$rank_program" ]; then
    log="$work/restart-$version.log"
    with_port "$log" "${cmd[@]}" --master_port @PORT@ --max_restarts 1 --nproc_per_node 3 "$work/restart.sh"
    rc=$?
    ok=1
    [ $rc = 0 ] || ok=0
    grep -q "rank 1 attempt 0 env: USE_AGENT_STORE=True" "$log" || ok=0
    for rank in 0 1 2; do
      grep -q "rank $rank attempt 1 env" "$log" || ok=0
      grep -q "rank $rank of 3 sum 6" "$log" || ok=0
    done
    if [ $ok = 1 ]; then
      echo "ok   restart-$version (attempt 0 failed, attempt 1: exit 0, 3 correct ranks)"
    else
      echo "FAIL restart-$version: exit $rc, expected attempt 0 to fail and attempt 1 to sum 6 on 3 ranks; output:"
      tail -n 40 "$log"
      failures=$((failures + 1))
    fi
  fi
done
[ $failures = 0 ] || fail "$failures job(s) failed"
echo "PASS"
