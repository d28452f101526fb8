#!/bin/sh
# run_fuzzer.sh FUZZER CORPUS SECONDS
# Fuzzes for SECONDS, starting from the committed corpus. New inputs go to a
# temporary directory, so the committed corpus is never changed; an input
# that crashes the target is kept in the current directory (the build's
# tests/ folder under ctest) and named in the output, to be added to the
# corpus once fixed.
set -eu
fuzzer=$1
corpus=$2
seconds=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
  -artifact_prefix="$PWD/$(basename "$fuzzer")-" "$work" "$corpus"
