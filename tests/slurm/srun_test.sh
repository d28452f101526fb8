#!/bin/bash
# lockstep under a real Slurm: munged, slurmctld and two slurmds started on
# this machine by tests/slurm/slurm-cluster.sh (two nodes of 4 CPUs), and
# jobs submitted as a user would, with none of MASTER_ADDR, MASTER_PORT,
# RANK or WORLD_SIZE set:
#   srun        `srun -n 4 allreduce_demo`: each task takes its rank, the
#               world and its local rank from SLURM_*, and the store from the
#               step's node list and the job id (ranks that could not find it
#               would fail with "MASTER_ADDR is not set")
#   two nodes   `srun -N 2 -n 4 allreduce_demo` on two slurmds of this machine
#   launcher    `srun -N 1 -n 1 lockstep run --nproc-per-node 3 -- allreduce_demo`:
#               one launcher, its ranks numbered by it; then one launcher per
#               node on two nodes, which take --nnodes, --node-rank and the
#               store from Slurm
#   sbatch      the batch script of docs/cluster.md (srun inside sbatch, the
#               store token made in the script), waited for until it ends
#   killed      `srun -n 2 rank_program die-in-shm-setup`: task 1 kills itself
#               (SIGKILL) while task 0 holds its shared region open for it;
#               nothing of either task may stay in /dev/shm
# Each checks the exit status and every rank's result line (0 wrong). Skips
# (77) unless root with Slurm's daemons installed (scripts/install-deps.sh
# installs them).
# Usage: srun_test.sh path/to/lockstep path/to/allreduce_demo path/to/rank_program
set -uo pipefail
cli=$(realpath "$1")
demo=$(realpath "$2")
rank_program=$(realpath "$3")
here=$(dirname "$(realpath "$0")")
skip() { echo "SKIP: $*"; exit 77; }

[ "$(id -u)" = 0 ] || skip "needs root (slurmd starts the tasks as their user)"
for tool in munged slurmctld slurmd srun sbatch; do
  command -v "$tool" > /dev/null || skip "no $tool (Debian's slurm-wlm and munge: scripts/install-deps.sh)"
done

work=$(mktemp -d)
# munged wants every directory above its socket searchable by all.
chmod 755 "$work"
cluster=$work/cluster
stop_cluster() { "$here/slurm-cluster.sh" stop "$cluster" > /dev/null 2>&1; rm -rf "$work"; }
trap stop_cluster EXIT
# Two nodes of 4 CPUs (two slurmds on this machine, named after it: vm and
# vm-2). Tasks look for their store on the first node by name, so it must
# resolve: where this host's name does not (a chroot without it in
# /etc/hosts), one node named localhost, and the two-node cases are skipped.
nodes=2
if ! getent hosts "$(hostname -s)" > /dev/null 2>&1; then
  getent hosts localhost > /dev/null 2>&1 || skip "neither this host's name nor localhost resolves here (getent hosts)"
  echo "note: this host's name ($(hostname -s)) does not resolve here: one node named localhost, no two-node cases"
  nodes=1
fi
exports=$("$here/slurm-cluster.sh" start "$cluster" 4 $nodes) || { echo "FAIL: the Slurm cluster did not start"; exit 1; }
eval "$exports"
# What a user's shell would not have: the tasks must not find a rendezvous
# that Slurm did not give them.
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE LOCKSTEP_STORE_ADDR LOCKSTEP_STORE_PORT
export LOCKSTEP_TIMEOUT=60 LOCKSTEP_CONNECT_TIMEOUT=30

failures=0
# expect NAME LOG RC RANKS: exit 0 and every rank's result line.
expect() {
  local name=$1 log=$2 rc=$3 ranks=$4 ok=1 rank
  [ "$rc" = 0 ] || ok=0
  for ((rank = 0; rank < ranks; rank++)); do
    grep -q "rank $rank/$ranks (.* backend): averaged 4194304 floats 10 times, every element .* 0 wrong" "$log" || ok=0
  done
  if [ $ok = 1 ]; then
    echo "ok   $name (exit 0, $ranks correct ranks)"
  else
    echo "FAIL $name: exit $rc, expected $ranks correct ranks; output:"
    tail -n 40 "$log"
    failures=$((failures + 1))
  fi
}

timeout 120 srun -n 4 "$demo" > "$work/srun.log" 2>&1
expect "srun -n 4" "$work/srun.log" $? 4

if [ $nodes = 2 ]; then
  timeout 120 srun -N 2 -n 4 "$demo" > "$work/srun-2nodes.log" 2>&1
  expect "srun -N 2 -n 4" "$work/srun-2nodes.log" $? 4
fi

timeout 120 srun -N 1 -n 1 "$cli" run --nproc-per-node 3 -- "$demo" > "$work/launcher.log" 2>&1
expect "srun lockstep run" "$work/launcher.log" $? 3

# One launcher per node: node rank, node count and the store from Slurm.
if [ $nodes = 2 ]; then
  timeout 120 srun -N 2 --ntasks-per-node=1 "$cli" run --nproc-per-node 2 -- "$demo" > "$work/launchers.log" 2>&1
  rc=$?
  grep -q "from Slurm: node 1 of 2, store on" "$work/launchers.log" || rc=1
  expect "srun -N 2 lockstep run" "$work/launchers.log" $rc 4
fi

# The batch script as docs/cluster.md shows it.
cat > "$work/job.sbatch" <<SCRIPT
#!/bin/bash
#SBATCH --job-name=lockstep-test
#SBATCH --ntasks=4
#SBATCH --output=$work/sbatch.log
export LOCKSTEP_STORE_TOKEN=\$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
srun "$demo"
SCRIPT
job=$(sbatch --parsable "$work/job.sbatch") || { echo "FAIL: sbatch refused the job"; exit 1; }
state=""
for _ in $(seq 1 240); do
  state=$(scontrol show job "$job" 2> /dev/null | grep -oE 'JobState=[A-Z_]+' | cut -d= -f2)
  case $state in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac
  sleep 0.5
done
rc=1
[ "$state" = COMPLETED ] && rc=0
[ "$state" = COMPLETED ] || echo "note: batch job $job ended $state"
expect "sbatch" "$work/sbatch.log" $rc 4

# A task killed while the other holds its region open: nothing in /dev/shm.
mkdir -p "$work/pids"
PID_DIR=$work/pids LOCKSTEP_CONNECT_TIMEOUT=10 timeout 120 srun -n 2 --kill-on-bad-exit=1 "$rank_program" \
  die-in-shm-setup > "$work/killed.log" 2>&1
left=()
pids=$(cat "$work"/pids/rank*.pid 2> /dev/null)
for pid in $pids; do
  for f in /dev/shm/*."$pid"; do [ -e "$f" ] && left+=("$f"); done
done
if [ "$(echo $pids | wc -w)" = 2 ] && [ ${#left[@]} = 0 ]; then
  echo "ok   srun, a task killed in set-up: nothing in /dev/shm"
else
  echo "FAIL srun, a task killed in set-up: pids '$pids', left in /dev/shm: ${left[*]:-nothing}; output:"
  tail -n 20 "$work/killed.log"
  failures=$((failures + 1))
fi

[ $failures = 0 ] || exit 1
echo "all Slurm cases passed"
