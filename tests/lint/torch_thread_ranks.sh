#!/bin/bash
# Every libtorch test runs thread ranks through TorchThreadWorld
# (tests/torch/thread_ranks.h), which fails a test whose ranks draw from
# libtorch's process-wide generator; a plain ThreadWorld or run_threads()
# there would let that pass unnoticed, as it did in the companions' first
# CPU twin. Lists each such use and fails.
# Usage: torch_thread_ranks.sh TESTS_DIR
set -uo pipefail
tests=${1:?usage: torch_thread_ranks.sh TESTS_DIR}
uses=$(grep -nE '(^|[^A-Za-z_])(ThreadWorld|run_threads)[^A-Za-z_]' \
         $(grep -lE '#include <torch/' "$tests"/torch/*.cc "$tests"/examples/*.cc) |
       grep -v '^[^:]*thread_ranks\.' | grep -vE 'TorchThreadWorld' || true)
if [ -n "$uses" ]; then
  echo "FAIL: libtorch tests with thread ranks outside TorchThreadWorld (tests/torch/thread_ranks.h):"
  echo "$uses"
  exit 1
fi
echo "every libtorch test's thread ranks go through TorchThreadWorld"
