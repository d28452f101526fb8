#!/usr/bin/env bash
# Runs one test suite of `make test` so that what it leaves behind and what
# it skips are seen:
#   - every process the suite starts inherits LOCKSTEP_TEST_RUN, fresh for
#     this run; once the suite ends, scripts/leftover-processes.sh finds any
#     still running, names and kills them, and the suite fails;
#   - the flight-recorder dumps its failure tests write (every group that
#     fails writes one per rank) go to $LOCKSTEP_TEST_LOGS/flight/NAME,
#     emptied when the suite starts, where a failed test's can be read
#     beside its log, not to /tmp, where every run's would pile up; a test
#     that names its own directory keeps it;
#   - its results go to $LOCKSTEP_TEST_LOGS/NAME.junit.xml (ctest's
#     --output-junit, pytest's --junitxml), from which every skipped test is
#     listed with its reason (scripts/skipped-tests.py) in
#     $LOCKSTEP_TEST_LOGS/skipped/NAME.txt and on the output.
# KIND is ctest or pytest: COMMAND... is `ctest ARGS...` or `PYTHON -m pytest
# ARGS...`, run in DIR. The suite's exit status is the command's, or 1 for
# what it left running.
# Usage: scripts/run-suite.sh NAME KIND DIR COMMAND...
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=$1 kind=$2 dir=$3
shift 3
logs=${LOCKSTEP_TEST_LOGS:-$here/../build/test-logs}
mkdir -p "$logs/skipped"
logs=$(cd "$logs" && pwd)
junit=$logs/$name.junit.xml
rm -f "$junit"
case $kind in
  ctest) extra=(--output-junit "$junit") ;;
  pytest) extra=(-rs "--junitxml=$junit") ;;
  *) echo "run-suite: KIND must be ctest or pytest, not '$kind'" >&2; exit 2 ;;
esac

flight=$logs/flight/$name
rm -rf "$flight" && mkdir -p "$flight"

token=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
(cd "$dir" && LOCKSTEP_TEST_RUN=$token LOCKSTEP_FLIGHT_DIR=${LOCKSTEP_FLIGHT_DIR:-$flight} "$@" "${extra[@]}")
status=$?

python3 "$here/skipped-tests.py" "$name" "$junit" > "$logs/skipped/$name.txt"
python3 "$here/skipped-tests.py" --summary "$logs/skipped/$name.txt"
"$here/leftover-processes.sh" "$token" "$name" || status=1
exit $status
