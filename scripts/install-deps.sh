#!/usr/bin/env bash
# Installs the Debian packages lockstep needs, and only the ones missing.
# Idempotent and non-interactive: a second run installs nothing and does not
# touch the network. Uses sudo when not root. Nothing is downloaded from
# anywhere but the system's configured Debian mirrors.
#
# Usage: scripts/install-deps.sh            # everything `make test` and `make run` need
#        scripts/install-deps.sh --run      # only what `make run` needs (build the CLI and the example, train)
#        scripts/install-deps.sh --check    # only report what is missing (exit 1 if any)
#        scripts/install-deps.sh --run --check
set -euo pipefail

# What `make run` needs: the toolchain, the libraries the library, the CLI
# and the example link, libtorch with a fast BLAS, and the data set.
run_packages=(
  g++ make cmake ninja-build pkg-config
  libfmt-dev libcli11-dev nlohmann-json3-dev zlib1g-dev
  # HTTP and TLS for the launcher's etcd rendezvous (--rdzv-backend etcd)
  libcurl4-openssl-dev
  # libtorch frontend; OpenBLAS so libtorch does not fall back to the reference BLAS
  libtorch-dev libopenblas0-pthread
  dataset-fashion-mnist
)
# What only the tests, the benchmarks and `lockstep doctor`'s plots add. A
# newcomer's first `make run` skips these (a third of the download: clang
# and Open MPI are large); `make test` installs them.
test_packages=(
  # the fuzz targets: clang with libFuzzer and the sanitizers' run-time
  clang libclang-rt-14-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # the allocators users preload, under which the shm backend's promises
  # about the program's memory are tested (tests/comm/user_memory_test.cc)
  libjemalloc2 libtcmalloc-minimal4
  # the MPI backend and the Open MPI peer in benchmarks
  libopenmpi-dev openmpi-bin
  # plots in `lockstep doctor`, PyTorch DDP peer in benchmarks
  gnuplot-nox python3-torch
  # the virtual environment PyTorch 2.x goes into (scripts/install-torch2.sh),
  # and Python's headers for the torch.distributed backend's extension (python/)
  python3-venv python3-dev
  # network namespaces for the multi-host tests, nftables for their
  # network faults (packet loss, partitions), and iptables' NFQUEUE with
  # libnetfilter_queue for delay and reordering (tests/netns/net_delay.cc)
  iproute2 procps nftables iptables libnetfilter-queue-dev
  # a real Slurm started by the tests (tests/slurm/slurm-cluster.sh)
  slurmctld slurmd slurm-client munge
  # a real etcd cluster for the etcd rendezvous' tests, and openssl for
  # their certificates
  etcd-server etcd-client openssl
)

only_run=false
check=false
for arg in "$@"; do
  case "$arg" in
    --run) only_run=true ;;
    --check) check=true ;;
    *) echo "install-deps: unknown argument '$arg' (expected --run and/or --check)" >&2; exit 2 ;;
  esac
done
packages=("${run_packages[@]}")
$only_run || packages+=("${test_packages[@]}")

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
if $check; then
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
