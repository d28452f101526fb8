#!/usr/bin/env bash
# Installs the Debian packages lockstep needs, and only the ones missing.
# Idempotent and non-interactive: a second run installs nothing and does not
# touch the network. Uses sudo when not root. Nothing is downloaded from
# anywhere but the system's configured Debian mirrors.
#
# Usage: scripts/install-deps.sh            # everything `make test` and `make run` need
#        scripts/install-deps.sh --check    # only report what is missing (exit 1 if any)
set -euo pipefail

packages=(
  # toolchain and build
  g++ make cmake ninja-build pkg-config
  # the fuzz targets: clang with libFuzzer and the sanitizers' run-time
  clang libclang-rt-14-dev
  # libraries the code uses
  libgtest-dev libgmock-dev libbenchmark-dev libfmt-dev libcli11-dev nlohmann-json3-dev zlib1g-dev
  # libtorch frontend; OpenBLAS so libtorch does not fall back to the reference BLAS
  libtorch-dev libopenblas0-pthread
  # the MPI backend and the Open MPI peer in benchmarks
  libopenmpi-dev openmpi-bin
  # the main job's data set, plots in `lockstep doctor`, PyTorch DDP peer in benchmarks
  dataset-fashion-mnist gnuplot-nox python3-torch
  # the virtual environment PyTorch 2.x goes into (scripts/install-torch2.sh)
  python3-venv
  # network namespaces for the multi-host tests
  iproute2 procps
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "install-deps: missing: ${missing[*]}"
  exit 1
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: not root and no sudo; install as root: apt-get install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: done"
