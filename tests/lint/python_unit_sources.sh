#!/bin/bash
# The Python extension compiles chosen src/torch sources into one unit of
# its own (python/lockstep_torch/csrc/frontend.cc includes them) instead of
# linking lockstep_torch. A source it takes that includes a private header
# of src/torch whose definitions live in a sibling .cc (receivers.h and
# receivers.cc) needs that .cc in the unit too, or `import lockstep_torch`
# fails on an undefined symbol, found only after the Python build. Lists
# each missing source and fails.
# Usage: python_unit_sources.sh SOURCE_DIR
set -uo pipefail
root=${1:?usage: python_unit_sources.sh SOURCE_DIR}
unit=$root/python/lockstep_torch/csrc/frontend.cc
taken=$(sed -nE 's|^#include "torch/([a-z_0-9]+\.cc)"|\1|p' "$unit")
if [ -z "$taken" ]; then
  echo "FAIL: $unit includes no torch/*.cc source: has the unit moved?"
  exit 1
fi
missing=""
for source in $taken; do
  for header in $(sed -nE 's|^#include "([a-z_0-9]+)\.h"|\1|p' "$root/src/torch/$source"); do
    if [ -f "$root/src/torch/$header.cc" ] && ! grep -qx "$header.cc" <<<"$taken"; then
      missing+="  src/torch/$source includes $header.h, defined in src/torch/$header.cc: add #include \"torch/$header.cc\""$'\n'
    fi
  done
done
if [ -n "$missing" ]; then
  echo "FAIL: the Python extension's unit ($unit) lacks sources its sources call:"
  printf '%s' "$missing"
  exit 1
fi
echo "the Python extension's unit includes every src/torch source its sources call: $(echo $taken)"
