#!/usr/bin/env bash
# Installs lockstep from the build tree into a temporary prefix, then uses it
# as an outside project would: the installed `lockstep` CLI starts with no
# LD_LIBRARY_PATH (its RUNPATH finds liblockstep), both libraries carry one
# SONAME scheme, the exported targets name no library by absolute path, a
# separate project finds the package with find_package(lockstep), and, when
# the torch component was built, another finds it with COMPONENTS torch and
# runs under the installed `lockstep run` on 2 ranks. A prefix without the
# torch component makes COMPONENTS torch fail with a message saying why.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
unset LD_LIBRARY_PATH
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
test -f "$prefix/include/lockstep/process_group.h"
libdir=$(dirname "$(find "$prefix" -name 'liblockstep.so.*' -type f | head -1)")
config=$(dirname "$(find "$prefix" -name lockstepConfig.cmake | head -1)")

# The installed CLI starts.
"$prefix/bin/lockstep" --help > "$work/cli.log"
echo "installed CLI starts"

# One SONAME scheme.
soname() { readelf -d "$1" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'; }
lib_soname=$(soname "$libdir/liblockstep.so")
echo "liblockstep SONAME: $lib_soname"
[[ $lib_soname =~ ^liblockstep\.so\.[0-9]+\.[0-9]+$ ]]

# A consumer of lockstep::lockstep.
cmake -S "$src/tests/install/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" > "$work/configure.log"
cmake --build "$work/consumer" > "$work/build.log"
"$work/consumer/consumer"

if [[ -f $config/lockstepTorchTargets.cmake ]]; then
  torch_soname=$(soname "$libdir/liblockstep_torch.so")
  echo "liblockstep_torch SONAME: $torch_soname"
  [[ $torch_soname == "liblockstep_torch.so.${lib_soname#liblockstep.so.}" ]]
  if grep -n '/libc10\|/libtorch' "$config"/lockstepTorchTargets*.cmake; then
    echo "the exported torch targets name libraries by absolute path" >&2
    exit 1
  fi
  cmake -S "$src/tests/install/torch_consumer" -B "$work/torch_consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
    > "$work/torch_configure.log"
  cmake --build "$work/torch_consumer" > "$work/torch_build.log"
  "$prefix/bin/lockstep" run --nproc-per-node 2 -- "$work/torch_consumer/torch_consumer"
  # Without the component's files, asking for it fails and says why.
  rm "$config"/lockstepTorchTargets*.cmake
fi
if cmake -S "$src/tests/install/torch_consumer" -B "$work/no_torch" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  > "$work/no_torch.log" 2>&1; then
  echo "find_package(lockstep REQUIRED COMPONENTS torch) succeeded without the torch component" >&2
  exit 1
fi
grep -q "torch component (lockstep::torch) is not available" "$work/no_torch.log" || { cat "$work/no_torch.log" >&2; exit 1; }
echo "COMPONENTS torch without the component fails clearly"
