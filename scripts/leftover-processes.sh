#!/usr/bin/env bash
# The processes a test suite left behind: every process whose environment
# holds LOCKSTEP_TEST_RUN=TOKEN (scripts/run-suite.sh sets it, fresh, for
# one suite, so every process the suite started inherits it), this script
# and the processes it runs under left out. Gives them 10 s to end (one
# killed at a test's deadline may still be dying), then names each (pid,
# how long it has run, its command line), kills it and exits 1; exits 0
# when none is left.
# Usage: scripts/leftover-processes.sh TOKEN SUITE
set -uo pipefail
# Without the token itself, so that nothing this script runs is found.
[ -n "${LOCKSTEP_TEST_RUN:-}" ] && exec env -u LOCKSTEP_TEST_RUN "$0" "$@"
token=$1
suite=$2

# This shell and its ancestors carry the token too.
ancestors=" "
pid=$$
while [ "$pid" -gt 1 ] 2> /dev/null; do
  ancestors+="$pid "
  pid=$(awk '{print $4}' "/proc/$pid/stat" 2> /dev/null) || break
done

left() {
  local environ pid
  # One grep over every environment (a zombie has none any more; its parent
  # reaps it).
  for environ in $(grep -lsxz "LOCKSTEP_TEST_RUN=$token" /proc/[0-9]*/environ 2> /dev/null); do
    pid=${environ#/proc/}
    pid=${pid%/environ}
    [[ "$ancestors" == *" $pid "* ]] || echo "$pid"
  done
}

end=$((SECONDS + 10))
while true; do
  found=$(left)
  [ -z "$found" ] && exit 0
  [ $SECONDS -ge $end ] && break
  sleep 0.2
done
echo "FAIL: $suite left $(echo $found | wc -w) process(es) running after its last test:"
for pid in $found; do
  echo "  pid $pid, running for $(ps -o etime= -p "$pid" 2> /dev/null | tr -d ' ')s: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null)"
  kill -KILL "$pid" 2> /dev/null
done
exit 1
