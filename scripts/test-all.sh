#!/usr/bin/env bash
# `make test`: every build and every test of the project, in lanes that run
# at once on a machine of few cores:
#   downloads the two PyTorch environments (pip's cache, or PyPI);
#   builds    each build in turn, at the lowest CPU priority (nice 19), so
#             that it takes only the CPU the tests leave and never makes a
#             test late;
#   tests     each suite in turn, once the build it runs is done, its
#             output streamed;
#   networks  the tests of emulated hosts, faults, Slurm and torchrun
#             (make run-net-tests), one at a time: they mostly wait on
#             timeouts and partitions while the other lanes work.
# A lane stops at its first failure, and the others before their next
# phase. Each suite runs under scripts/run-suite.sh, which fails it if it
# leaves a process running and lists what it skipped and why. At the end:
# the skipped tests grouped by reason, every phase's time (also in
# $LOGS/summary.txt), the networks lane's output and that of a failed
# download or build, and the exit status (0 only if every phase passed).
# Usage: scripts/test-all.sh          (make test; LOGS=dir keeps the logs elsewhere)
set -uo pipefail
cd "$(dirname "$0")/.."

LOGS=${LOGS:-build/test-logs}
rm -rf "$LOGS"
mkdir -p "$LOGS/state"
# Each suite's results and skips (scripts/run-suite.sh).
export LOCKSTEP_TEST_LOGS=$(cd "$LOGS" && pwd)
state=$LOGS/state
phases=$LOGS/phases.txt
: > "$phases"
started=$(date +%s)

# record LANE NAME SECONDS OUTCOME: a line of the phase table.
record() {
  printf '%-9s %-20s %5s  %s\n' "$1" "$2" "$(($3 / 60)):$(printf %02d $(($3 % 60)))" "$4" >> "$phases"
}

# phase LANE NAME NEEDS COMMAND...: once every phase in NEEDS (a list) is
# done, runs COMMAND and marks NAME done or failed; skipped if a phase it
# needs failed, or once the run is stopping.
phase() {
  local lane=$1 name=$2 needs=$3 need begin status
  shift 3
  for need in $needs; do
    until [ -e "$state/$need.done" ]; do
      if [ -e "$state/$need.failed" ] || [ -e "$state/$need.skipped" ] || [ -e "$state/stop" ]; then
        touch "$state/$name.skipped"
        record "$lane" "$name" 0 "skipped ($need did not pass)"
        return 1
      fi
      sleep 2
    done
  done
  if [ -e "$state/stop" ]; then
    touch "$state/$name.skipped"
    record "$lane" "$name" 0 "skipped (a phase failed)"
    return 1
  fi
  begin=$(date +%s)
  "$@"
  status=$?
  if [ $status -eq 0 ]; then
    touch "$state/$name.done"
    record "$lane" "$name" $(($(date +%s) - begin)) passed
  else
    touch "$state/$name.failed" "$state/stop"
    record "$lane" "$name" $(($(date +%s) - begin)) "FAILED (exit $status)"
  fi
  return $status
}

make_quiet=(make --no-print-directory)
nice_make() { nice -n 19 "${make_quiet[@]}" "$@"; }

# --- downloads: the two PyTorch environments (pip's cache, or PyPI) ---
downloads() {
  phase downloads venv-torch2 "" nice_make deps-torch2 &&
  phase downloads venv-oldest "" nice_make deps-oldest
}

# --- builds: logged to a file, shown when a build fails; in the order the
# tests can use them soonest (the small ones before build-torch2) ---
builds() {
  phase builds build "" nice_make build &&
  phase builds build-fuzz "" nice_make build-fuzz &&
  phase builds build-python venv-torch2 nice_make build-python &&
  phase builds wheel build-python nice_make wheel &&
  phase builds build-oldest "venv-oldest build-python" nice_make build-python-oldest &&
  phase builds build-torch2 venv-torch2 nice_make build-torch2 &&
  phase builds build-python-cuda build-torch2 nice_make build-python-cuda
}

# ready NEEDS: 0 when every phase named is done, 2 when one of them failed
# or was skipped, 1 while any is still to come.
ready() {
  local need
  for need in $1; do
    [ -e "$state/$need.failed" ] || [ -e "$state/$need.skipped" ] && return 2
    [ -e "$state/$need.done" ] || return 1
  done
  return 0
}

# --- tests: the output CI shows as it comes. Each suite as NAME|NEEDS|TARGET;
# the first whose builds are done runs next, so that the lane never waits
# for one build while another's suite could run ---
test_suites=(
  "cpp-tests|build venv-torch2|run-cpp-tests"
  "fuzz|build-fuzz|run-fuzz"
  "python-tests|build-python|run-python-tests"
  "battery|build-python|run-battery"
  "wheel-test|wheel|run-wheel-test"
  "oldest-tests|build-oldest|run-python-oldest-tests"
  "torch2-tests|build-torch2|run-torch2-tests"
  "python-cuda-tests|build-python-cuda|run-python-cuda-tests"
)
tests() {
  local pending=("${test_suites[@]}") i chosen name needs target status
  while [ ${#pending[@]} -gt 0 ]; do
    chosen=-1
    for i in "${!pending[@]}"; do
      IFS='|' read -r name needs target <<< "${pending[$i]}"
      ready "$needs"
      status=$?
      if [ $status -eq 0 ] || [ $status -eq 2 ] || [ -e "$state/stop" ]; then
        chosen=$i
        break
      fi
    done
    if [ $chosen -lt 0 ]; then
      sleep 2
      continue
    fi
    # (phase records a suite whose build failed, or a stopping run, as skipped.)
    phase tests "$name" "$needs" "${make_quiet[@]}" "$target"
    unset "pending[$chosen]"
    pending=("${pending[@]}")
  done
  ! [ -e "$state/stop" ]
}

# --- networks: logged to a file, shown at the end; after the C++ suite,
# whose timing-sensitive tests then have both cores to themselves ---
networks() {
  phase networks net-tests "build venv-torch2 cpp-tests" "${make_quiet[@]}" run-net-tests
}

downloads > "$LOGS/downloads.log" 2>&1 &
downloads_pid=$!
builds > "$LOGS/builds.log" 2>&1 &
builds_pid=$!
networks > "$LOGS/networks.log" 2>&1 &
networks_pid=$!
tests
wait $downloads_pid $builds_pid $networks_pid

echo
echo "=== the networks lane (make run-net-tests) ==="
cat "$LOGS/networks.log"
for lane in downloads builds; do
  grep -q "^$lane .*FAILED" "$phases" || continue
  echo
  echo "=== the $lane lane, which failed (its last 200 lines; all of it in $LOGS/$lane.log) ==="
  tail -200 "$LOGS/$lane.log"
done
total=$(($(date +%s) - started))
{
  echo
  echo "=== skipped tests, with the reasons they gave (every one in $LOGS/skipped/) ==="
  skipped=("$LOGS"/skipped/*.txt)
  if [ -e "${skipped[0]}" ]; then python3 scripts/skipped-tests.py --summary "${skipped[@]}"; fi
  echo
  printf 'make test: %d:%02d in all, phases by lane (min:s):\n' $((total / 60)) $((total % 60))
  cat "$phases"
} | tee "$LOGS/summary.txt"
! [ -e "$state/stop" ]
