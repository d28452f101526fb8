#!/usr/bin/env bash
# Downloads, on a Debian 12 machine with its package mirrors, the .deb files
# that a machine without network access needs to build and test lockstep
# against another libtorch (for example the one inside a PyTorch 2.x wheel on
# a GPU machine): GoogleTest, Google Benchmark, fmt, CLI11, nlohmann-json, the
# Fashion-MNIST data set and, for the Open MPI peer in benchmarks, Open MPI
# with the run-time libraries it loads. scripts/gpu-check.sh unpacks them
# into a private prefix there (never into /).
#
# Usage: scripts/fetch-offline-debs.sh [DIR]     (default: .gpu-deps)
set -euo pipefail

dir=${1:-.gpu-deps}
mkdir -p "$dir/mpi"
dir=$(cd "$dir" && pwd)

build=(libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian libfmt-dev libfmt9
       libcli11-dev nlohmann-json3-dev dataset-fashion-mnist)
# Open MPI 4.1 and what its libraries and plugins load that a non-Debian
# machine may lack.
mpi=(libopenmpi3 openmpi-bin openmpi-common libopenmpi-dev libevent-core-2.1-7 libevent-pthreads-2.1-7
     libevent-2.1-7 libfabric1 libhwloc15 libibverbs1 libnl-3-200 libnl-route-3-200 libpmix2
     libpsm-infinipath1 libpsm2-2 librdmacm1 libucx0 libnuma1 libxnvctrl0 libmunge2 libpciaccess0 libltdl7)

# apt-get download writes into the current directory; as root it warns that
# the _apt user cannot write there, which is harmless.
(cd "$dir" && apt-get download "${build[@]}" 2>&1 | grep -v unsandboxed || true)
(cd "$dir/mpi" && apt-get download "${mpi[@]}" 2>&1 | grep -v unsandboxed || true)
echo "fetch-offline-debs: $(ls "$dir"/*.deb "$dir"/mpi/*.deb | wc -l) packages in $dir ($(du -sh "$dir" | cut -f1))"
