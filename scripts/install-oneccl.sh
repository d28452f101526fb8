#!/usr/bin/env bash
# Installs Intel oneCCL (CPU build) and Intel MPI, pinned in
# scripts/oneccl-requirements.txt, into the project's own virtual
# environment (never the system Python), for the "oneCCL" peer of
# bench/compare_allreduce.py. Benchmark only: `make test` needs none of it.
#
#   - Debian's libfabric1 (oneCCL's OFI transport loads the system
#     libfabric.so.1: the impi-rt wheel ships none) and python3-venv, with
#     apt-get, only where missing.
#   - the wheels with pip --no-deps --require-hashes: their declared
#     dependencies are Intel's SYCL and compiler runtimes, which the CPU
#     build does not need.
#   - libccl.so.2, which oneccl-cpu's libccl.so.1 needs (NEEDED) but only
#     the full `oneccl` wheel ships: that wheel is downloaded (hash-checked)
#     and just lib/libccl.so.2* copied out of it into VENV/lib.
#
# Idempotent: when the environment already holds exactly these pins (and
# libfabric is there) it touches nothing and uses no network.
#
# Usage: scripts/install-oneccl.sh [VENV]     (default .venv/oneccl)
# Then:  bench/compare_allreduce.py [--oneccl VENV] builds
#        BUILD/bench/ccl_allreduce from bench/ccl_allreduce.cc and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${1:-.venv/oneccl}
requirements=scripts/oneccl-requirements.txt
stamp=$venv/lockstep-requirements.txt   # the pins this environment was made from

missing_debs() {
  local pkg
  for pkg in libfabric1 python3-venv; do
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null)" = installed ] || echo "$pkg"
  done
}

installed() {
  [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp" && [ -x "$venv/bin/mpiexec" ] \
    && [ -e "$venv/lib/libccl.so.1" ] && [ -e "$venv/lib/libccl.so.2" ] && [ -e "$venv/lib/libmpi.so.12" ] \
    && [ -e "$venv/include/oneapi/ccl.hpp" ] && [ -e "$venv/include/mpi.h" ]
}

debs=$(missing_debs | xargs)
if [ -z "$debs" ] && installed; then
  echo "install-oneccl: oneCCL $(grep -oP '^oneccl-cpu==\K\S+' "$requirements"), Intel MPI $(grep -oP '^impi-rt==\K\S+' "$requirements") present in $venv"
  exit 0
fi

if [ -n "$debs" ]; then
  echo "install-oneccl: installing Debian's $debs"
  sudo=
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -q
  # shellcheck disable=SC2086  # $debs: one word per package
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $debs
fi

# Debian's interpreter, not whatever python3 comes first on PATH.
python=/usr/bin/python3
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "install-oneccl: $python cannot make virtual environments; install python3-venv" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
grep -E '^oneccl==' "$requirements" >"$tmp/full.txt"
grep -vE '^oneccl==' "$requirements" >"$tmp/installed.txt"

echo "install-oneccl: installing $(grep -oE '^[a-z-]+==[^ ]+' "$tmp/installed.txt" | xargs) into $venv (--no-deps)"
rm -f "$stamp"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)
"${pip[@]}" install --progress-bar off -q --no-deps --require-hashes -r "$tmp/installed.txt"

echo "install-oneccl: copying libccl.so.2 out of $(grep -oE '^[a-z-]+==[^ ]+' "$tmp/full.txt") (about 90 MB to download)"
"${pip[@]}" download --progress-bar off -q --no-deps --require-hashes -r "$tmp/full.txt" -d "$tmp/wheel"
"$venv/bin/python" - "$tmp"/wheel/oneccl-*.whl "$venv/lib" <<'EOF'
import os, sys, zipfile
wheel, lib = sys.argv[1:]
copied = []
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        base = os.path.basename(name)
        # .data/data/lib/libccl.so.2 and libccl.so.2.0 (plain files: a zip keeps no links)
        if name.endswith("/data/lib/" + base) and (base == "libccl.so.2" or base.startswith("libccl.so.2.")):
            with z.open(name) as src, open(os.path.join(lib, base), "wb") as dst:
                dst.write(src.read())
            os.chmod(os.path.join(lib, base), 0o755)
            copied.append(base)
if "libccl.so.2" not in copied:
    sys.exit(f"install-oneccl: no lib/libccl.so.2 in {wheel}")
EOF

# Everything libccl.so.1 and libmpi.so.12 load at start must resolve now
# (libfabric is loaded later, with dlopen: checked by name).
if ldd "$venv/lib/libccl.so.1" "$venv/lib/libmpi.so.12" | grep 'not found'; then
  echo "install-oneccl: unresolved libraries above" >&2
  exit 1
fi
ldconfig -p | grep -q 'libfabric\.so\.1 ' || { echo "install-oneccl: libfabric.so.1 not found by the loader" >&2; exit 1; }
cp "$requirements" "$stamp"
echo "install-oneccl: oneCCL $(grep -oP '^oneccl-cpu==\K\S+' "$requirements"), Intel MPI $(grep -oP '^impi-rt==\K\S+' "$requirements") in $venv"
