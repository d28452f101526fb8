#!/bin/bash
# scripts/run-suite.sh fails a suite that leaves a process running, naming
# it, and passes one that does not; it lists a skipped test with its reason.
# Usage: leftover_processes_test.sh (from anywhere)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LOCKSTEP_TEST_LOGS=$work
fail() { echo "FAIL: $*"; exit 1; }

# A "suite" (pytest's role played by a shell) that leaves a sleep behind.
cat > "$work/leaves.sh" <<'SUITE'
#!/bin/bash
setsid sleep 300 < /dev/null > /dev/null 2>&1 &
SUITE
chmod +x "$work/leaves.sh"
out=$("$root/scripts/run-suite.sh" leaves ctest "$work" "$work/leaves.sh" 2>&1)
rc=$?
[ $rc -ne 0 ] || fail "a suite that left 'sleep 300' running passed: $out"
grep -q "leaves left 1 process(es) running after its last test" <<< "$out" || fail "no count of leftovers: $out"
grep -q "sleep 300" <<< "$out" || fail "the leftover is not named: $out"
pgrep -f "^sleep 300$" > /dev/null && { pkill -f "^sleep 300$"; fail "the leftover was not killed"; }
echo "ok   a leftover is named, killed, and fails its suite"

cat > "$work/clean.sh" <<'SUITE'
#!/bin/bash
sleep 0.2 &
wait
SUITE
chmod +x "$work/clean.sh"
out=$("$root/scripts/run-suite.sh" clean ctest "$work" "$work/clean.sh" 2>&1) || fail "a clean suite failed: $out"
echo "ok   a suite that leaves nothing passes"

# A skip and its reason, from a JUnit file as ctest writes it.
cat > "$work/skips.sh" <<SUITE
#!/bin/bash
cat > "$work/skips.junit.xml" <<'XML'
<testsuite><testcase name="gpu_test.OnGpu.Works" status="notrun"><skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
<system-out>[ RUN      ] OnGpu.Works
gpu_test.cc:12: Skipped
no CUDA device: /dev/nvidiactl is missing
[  SKIPPED ] OnGpu.Works (0 ms)</system-out></testcase></testsuite>
XML
SUITE
chmod +x "$work/skips.sh"
# (run-suite.sh clears NAME.junit.xml before the suite writes it)
out=$("$root/scripts/run-suite.sh" skips ctest "$work" "$work/skips.sh" 2>&1)
grep -q "1 x no CUDA device: /dev/nvidiactl is missing (e.g. gpu_test.OnGpu.Works)" <<< "$out" \
  || fail "the skip is not listed with its reason: $out"
echo "ok   a skipped test is listed with its reason"
