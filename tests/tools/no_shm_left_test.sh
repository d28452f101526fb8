#!/bin/bash
# No file of a rank stays in /dev/shm after the rank dies, however it was
# started: by hand, by `lockstep run`, by torchrun (the project's PyTorch
# 2.x) and by mpirun (Slurm's srun: tests/slurm/srun_test.sh). In each, a
# 2-rank job of tests' rank_program die-in-shm-setup: rank 1 kills itself
# (SIGKILL) as it opens rank 0's region, so rank 0 is caught holding its
# region open for a peer that never maps it, and ends however its launcher
# ends it (by hand: SIGKILL from here). Then /dev/shm must hold nothing
# named for either rank's pid (lockstep's segment names end with their
# creator's pid), whatever the launcher cleans up: torchrun and mpirun know
# nothing of lockstep's segments. A launcher that is not installed is
# named and its case left out; by hand and lockstep run always run.
# Usage: no_shm_left_test.sh path/to/lockstep path/to/rank_program [path/to/venv/bin]
set -uo pipefail
cli=$(realpath "$1")
program=$(realpath "$2")
venv_bin=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
export LOCKSTEP_BACKEND=shm LOCKSTEP_CONNECT_TIMEOUT=20 LOCKSTEP_TIMEOUT=20
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT

# check NAME DIR: no /dev/shm entry of the pids the ranks wrote to DIR.
check() {
  local name=$1 dir=$2 pids=() pid left=()
  for f in "$dir"/rank*.pid; do [ -e "$f" ] && pids+=("$(cat "$f")"); done
  if [ ${#pids[@]} -ne 2 ]; then
    echo "FAIL $name: expected 2 ranks' pids, found ${#pids[@]}"
    failures=$((failures + 1))
    return
  fi
  for pid in "${pids[@]}"; do
    for f in /dev/shm/*."$pid"; do [ -e "$f" ] && left+=("$f"); done
  done
  if [ ${#left[@]} -eq 0 ]; then
    echo "ok   $name: nothing of ranks ${pids[*]} in /dev/shm"
  else
    echo "FAIL $name: left in /dev/shm: ${left[*]}"
    rm -f "${left[@]}"
    failures=$((failures + 1))
  fi
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# By hand: two processes of one world; rank 0 is killed once rank 1 is dead.
dir=$work/by-hand && mkdir -p "$dir"
port=$(free_port)
pids=()
for r in 0 1; do
  PID_DIR=$dir RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$program" die-in-shm-setup > "$dir/rank$r.log" 2>&1 &
  pids+=($!)
done
wait "${pids[1]}"
kill -KILL "${pids[0]}" 2> /dev/null
wait "${pids[0]}" 2> /dev/null
check "by hand" "$dir"

dir=$work/lockstep-run && mkdir -p "$dir"
PID_DIR=$dir timeout 120 "$cli" run --nproc-per-node 2 --grace-period 2 -- "$program" die-in-shm-setup \
  > "$dir/out.log" 2>&1
check "lockstep run" "$dir"

if [ -n "$venv_bin" ] && [ -x "$venv_bin/torchrun" ]; then
  dir=$work/torchrun && mkdir -p "$dir"
  # TMPDIR: torchrun's torchelastic_* log directory goes with the test's.
  TMPDIR=$dir PID_DIR=$dir timeout 180 "$venv_bin/torchrun" --no-python --nproc-per-node 2 --master-port "$(free_port)" \
    "$program" die-in-shm-setup > "$dir/out.log" 2>&1
  check "torchrun" "$dir"
else
  echo "note: no torchrun in '${venv_bin}' (make deps-torch2): its case left out"
fi

if command -v mpirun > /dev/null; then
  dir=$work/mpirun && mkdir -p "$dir"
  # mpirun's own rendezvous only: lockstep finds its rank from OMPI_*.
  PID_DIR=$dir timeout 180 mpirun --allow-run-as-root --oversubscribe -np 2 --mca plm isolated \
    --mca btl self,vader -x PID_DIR -x LOCKSTEP_BACKEND -x LOCKSTEP_CONNECT_TIMEOUT -x LOCKSTEP_TIMEOUT \
    "$program" die-in-shm-setup > "$dir/out.log" 2>&1
  check "mpirun" "$dir"
else
  echo "note: no mpirun (Debian's openmpi-bin): its case left out"
fi

[ $failures = 0 ] || exit 1
echo "no launcher's killed ranks left anything in /dev/shm"
