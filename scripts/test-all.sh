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
# phase. At the end: every phase's time (also in $LOGS/summary.txt), the
# networks lane's output and that of a failed download or build, and the
# exit status (0 only if every phase passed).
# Usage: scripts/test-all.sh          (make test; LOGS=dir keeps the logs elsewhere)
set -uo pipefail
cd "$(dirname "$0")/.."

LOGS=${LOGS:-build/test-logs}
rm -rf "$LOGS"
mkdir -p "$LOGS/state"
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

# --- builds: logged to a file, shown when a build fails ---
builds() {
  phase builds build "" nice_make build &&
  phase builds build-torch2 venv-torch2 nice_make build-torch2 &&
  phase builds build-fuzz "" nice_make build-fuzz &&
  phase builds build-python venv-torch2 nice_make build-python &&
  phase builds wheel build-python nice_make wheel &&
  phase builds build-python-cuda build-torch2 nice_make build-python-cuda &&
  phase builds build-oldest "venv-oldest build-python" nice_make build-python-oldest
}

# --- tests: the output CI shows as it comes ---
tests() {
  phase tests cpp-tests "build venv-torch2" "${make_quiet[@]}" run-cpp-tests &&
  phase tests torch2-tests build-torch2 "${make_quiet[@]}" run-torch2-tests &&
  phase tests fuzz build-fuzz "${make_quiet[@]}" run-fuzz &&
  phase tests python-tests build-python "${make_quiet[@]}" run-python-tests &&
  phase tests battery build-python "${make_quiet[@]}" run-battery &&
  phase tests wheel-test wheel "${make_quiet[@]}" run-wheel-test &&
  phase tests python-cuda-tests build-python-cuda "${make_quiet[@]}" run-python-cuda-tests &&
  phase tests oldest-tests build-oldest "${make_quiet[@]}" run-python-oldest-tests
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
  printf 'make test: %d:%02d in all, phases by lane (min:s):\n' $((total / 60)) $((total % 60))
  cat "$phases"
} | tee "$LOGS/summary.txt"
! [ -e "$state/stop" ]
