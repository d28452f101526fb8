"""The Intel oneCCL peer of the all-reduce benchmark (bench/compare_allreduce.py).

oneCCL (CPU build) and Intel MPI come from PyPI's wheels, installed by
scripts/install-oneccl.sh into the project's environment .venv/oneccl (pinned
in scripts/oneccl-requirements.txt); nothing of them is in the CMake build.
bench/ccl_allreduce.cc is compiled here, on demand, with g++ against that
environment into BUILD/bench/ccl_allreduce, and run under its Intel MPI
mpiexec (Hydra), which starts and pins the ranks.

Transport (CCL_ATL_TRANSPORT): mpi, i.e. oneCCL over Intel MPI, whose
intra-node path is its own shared memory (libfabric is not even loaded).
Measured on the 2-core machine, 2 ranks, against ofi with libfabric's shm
provider (CCL_ATL_TRANSPORT=ofi CCL_ATL_SHM=1 FI_PROVIDER=shm; oneCCL refuses
FI_PROVIDER=shm without CCL_ATL_SHM=1, and tcp/sockets are 2-10x slower),
mpi was faster at 4 B (~7 vs ~8.5 us), 64 KiB (~2x) and 16 MiB (~1.6x); only
at 64 MiB was ofi/shm faster (oneCCL's default algorithm over MPI falls to
~1.4 GB/s there; CCL_ALLREDUCE=ring restores ~2.4). Every variable set here
yields to one already in the environment, so
`CCL_ATL_TRANSPORT=ofi CCL_ATL_SHM=1 FI_PROVIDER=shm bench/compare_allreduce.py`
measures the other transport.

oneCCL's worker thread: with one core per rank oneCCL itself disables it
(CCL_WORKER_OFFLOAD=0: the calling thread drives progress); pinning workers
beside their rank (CCL_WORKER_AFFINITY) costs milliseconds per call.
"""
import os
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONECCL_VENV = os.path.join(REPO, ".venv", "oneccl")
SOURCE = os.path.join(REPO, "bench", "ccl_allreduce.cc")
DEPENDS = [SOURCE, os.path.join(REPO, "bench", "mpi_elements.h"),
           os.path.join(REPO, "tools", "option_checks", "lockstep_option_checks", "option_checks.h")]
# What scripts/install-oneccl.sh leaves in the environment, and its stamp of the pins.
NEEDED = ["bin/mpiexec", "include/oneapi/ccl.hpp", "include/mpi.h", "lib/libccl.so.1", "lib/libccl.so.2",
          "lib/libmpi.so.12"]
STAMP = "lockstep-requirements.txt"


def add_oneccl_argument(parser):
    parser.add_argument("--oneccl", default=ONECCL_VENV,
                        help="the environment with oneCCL and Intel MPI (scripts/install-oneccl.sh; default "
                             ".venv/oneccl); the oneCCL peer is left out when it is missing")


def version(venv):
    """oneCCL's and Intel MPI's pinned versions, as the environment's stamp says."""
    pins = {}
    with open(os.path.join(venv, STAMP)) as f:
        for line in f:
            name, _, rest = line.partition("==")
            if rest:
                pins[name.strip()] = rest.split()[0]
    return f"oneCCL {pins.get('oneccl-cpu', '?')}, Intel MPI {pins.get('impi-rt', '?')}"


def build(venv, build_dir):
    """BUILD/bench/ccl_allreduce, compiled when missing or older than its
    sources or the environment. Returns (path, None), or (None, why not)."""
    venv = os.path.abspath(venv)
    if not os.path.isdir(venv):
        return None, f"{venv} is missing: scripts/install-oneccl.sh installs oneCCL and Intel MPI there"
    absent = [p for p in NEEDED + [STAMP] if not os.path.exists(os.path.join(venv, p))]
    if absent:
        return None, f"{venv} lacks {', '.join(absent)} (scripts/install-oneccl.sh installs oneCCL there)"
    cxx = os.environ.get("CXX", "g++")
    if not shutil.which(cxx):
        return None, f"no C++ compiler {cxx} to build {SOURCE}"
    binary = os.path.join(build_dir, "bench", "ccl_allreduce")
    newest = max(os.path.getmtime(p) for p in DEPENDS + [os.path.join(venv, STAMP)])
    if os.path.exists(binary) and os.path.getmtime(binary) >= newest:
        return binary, None
    os.makedirs(os.path.dirname(binary), exist_ok=True)
    partial = binary + ".partial"
    cmd = [cxx, "-std=c++20", "-O2", "-DMPICH_SKIP_MPICXX",  # Intel MPI's C API only
           "-I", os.path.join(REPO, "bench"), "-I", os.path.join(REPO, "tools", "option_checks"),
           "-I", os.path.join(venv, "include"), SOURCE,
           "-L", os.path.join(venv, "lib"), "-Wl,-rpath," + os.path.join(venv, "lib"), "-lccl", "-lmpi", "-o", partial]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return None, f"building {binary} failed: {proc.stderr.strip()[-400:]}"
    os.replace(partial, binary)
    return binary, None


def command(venv, binary, np, cores):
    """The launch (mpiexec -n NP BINARY) and the environment it adds: ranks
    pinned one per core of `cores` (wrapping round when oversubscribed),
    oneCCL over Intel MPI. Variables already set in the environment win."""
    venv = os.path.abspath(venv)
    env = {
        "I_MPI_ROOT": venv,
        "I_MPI_PIN": "1",
        "I_MPI_PIN_PROCESSOR_LIST": ",".join(str(c) for c in sorted(cores)),
        "CCL_ATL_TRANSPORT": "mpi",
    }
    env = {k: v for k, v in env.items() if k not in os.environ}
    return [os.path.join(venv, "bin", "mpiexec"), "-n", str(np), binary], env


def settings(added):
    """The oneCCL and Intel MPI variables the peer runs with, for the log:
    those `command` added and those already in the environment."""
    effective = dict(added)
    effective.update((k, v) for k, v in os.environ.items() if k.startswith(("CCL_", "FI_", "I_MPI_")))
    effective.pop("I_MPI_ROOT", None)
    return " ".join(f"{k}={v}" for k, v in sorted(effective.items()))
