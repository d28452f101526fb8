#!/usr/bin/env bash
# Builds and checks lockstep on a machine with PyTorch 2.x (and, where there
# is one, a CUDA GPU), against the libtorch inside that PyTorch, and runs the
# measurements reported in docs/performance.md for such a machine.
#
# The machine needs: a C++20 compiler, CMake, Ninja, and a python3 that
# imports torch. What Debian would install (GoogleTest, fmt, CLI11,
# nlohmann-json, the Fashion-MNIST data set, optionally Open MPI) comes as
# .deb files made on any Debian 12 machine by scripts/fetch-offline-debs.sh,
# so the machine needs no network. They are unpacked into a private prefix
# inside the build directory, never into /.
#
# Usage: scripts/gpu-check.sh STEP...      steps, in the order given, each
#                                          timed (elapsed seconds per step, and in all)
#   loan      everything a loan of a GPU machine is for, in one call of 540 s, most valuable
#             first: gpubuild gputest python pyprobe memcheck staging gpuddp allreduce16 ddp16
#             racecheck (DEADLINE_S=540 OUT=... scripts/gpu-check.sh loan; each step capped,
#             each report in $OUT as soon as it exists; on an H200 about 470 s)
#   figures   a shorter loan: gpubuild gputest python memcheck gpubench
#   build     configure and build everything (build dir: $BUILD, default build-gpu)
#   gpubuild  configure and build only what gputest, gpubench and memcheck run
#   test      every test except those needing network namespaces (netns, root)
#   torchtest only the tests of the libtorch frontend and the examples
#   gpu       gputest and gpubench
#   gputest   the gpu-labelled tests (GPU_TEST_JOBS at a time, default 4)
#   gpubench  staging against pinned cudaMemcpy, 2 ranks sharing the GPU over shm and tcp,
#             nccl in a world of one, DDP's overhead in a world of one (OVERHEAD_MODELS)
#   python    the torch.distributed backend's CUDA build (LOCKSTEP_WITH_CUDA=1 pip install
#             ./python, against $BUILD's liblockstep, into $BUILD/python) and its CUDA tests
#             (python/tests/test_cuda.py, 2 ranks sharing the GPU; needs pytest; estimated 2-3 minutes)
#   pyprobe   where a rank of that CUDA build fails: scripts/python-probe.py at world 2 and 1,
#             CPU and CUDA tensors, every rank with scripts/crash_backtrace.c preloaded (the C++
#             stack of a crash, named by addr2line) and rank 0 with lockstep's debug log (at
#             most 20 s a case: under a minute)
#   memcheck  compute-sanitizer's memcheck over DDP on CUDA in a world of one
#             (at most $MEMCHECK_LIMIT seconds, default 90)
#   sanitize  compute-sanitizer's memcheck and racecheck over every DDP-on-CUDA case (long)
#   racecheck compute-sanitizer's racecheck over DDP on CUDA in a world of one (what is left
#             of a loan)
#   allreduce all-reduce at 2, 4, 8, 16 ranks: lockstep shm vs Gloo (and Open MPI)
#   allreduce16  all-reduce at 16 ranks: lockstep (also with LOCKSTEP_SHM_STREAMING_STORES=never),
#             its shared buffers and Open MPI, then Gloo alone (a table each, the slow Gloo last);
#             first bench/core_to_core from CPU 0 to three others (how far apart the cores are)
#   ddp16     DDP at 16 ranks (CPU tensors): lockstep against PyTorch's DDP over Gloo, one run
#   shmspin   all-reduce at 16 ranks under several LOCKSTEP_SHM_SPIN_US values
#   smallmsg  the shm wait policy's candidates (adaptive, fixed spins) against Open MPI
#             at 4 B, 4 KiB and 64 KiB, 2 to 16 ranks (SMALL_RANKS, SPINS_US, RUNS)
#   staging   one rank's staged all-reduce at several staging chunk sizes (STAGING_CHUNKS, in bytes)
#   gpuddp    DDP on the GPU against PyTorch's: plain loop, world of one, 2 ranks sharing the GPU
#             (bench/compare_gpu_ddp.py; GPUDDP_RUNS, default 5: about 240 s on an H200)
#   single    one process: PyTorch's plain loop, lockstep's, and lockstep's DDP in a world of one
#             (bench/compare_ddp.py --single; about 90 s on 16 cores)
#   ddp       DDP weak scaling at 1..16 ranks: lockstep vs PyTorch DDP (Gloo)
#   doctor    lockstep doctor --ranks 1,2,4,8,16
# Environment: DEBS (default .gpu-deps), BUILD, PYTHON (default python3),
# DEADLINE_S (the seconds all steps may take together: each then runs under
# what is left, at most its cap (CAP_GPUTEST, CAP_PYTHON, CAP_GPUBENCH), and
# the steps after a failed one still run),
# OUT (where reports go; default $BUILD/reports), RANKS (default 1,2,4,8,16).
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=${DEBS:-.gpu-deps}
BUILD=${BUILD:-build-gpu}
PYTHON=${PYTHON:-python3}
RANKS=${RANKS:-1,2,4,8,16}
OUT=${OUT:-$BUILD/reports}
PREFIX=$PWD/$BUILD/offline-prefix
mkdir -p "$BUILD" "$OUT"

log() { echo "gpu-check: $*" >&2; }

unpack_debs() {
  [ -d "$PREFIX/usr" ] && return 0
  [ -d "$DEBS" ] || { log "no $DEBS: run scripts/fetch-offline-debs.sh on a Debian 12 machine and copy it here"; exit 1; }
  for f in "$DEBS"/*.deb; do dpkg -x "$f" "$PREFIX"; done
  if ls "$DEBS"/mpi/*.deb >/dev/null 2>&1; then
    for f in "$DEBS"/mpi/*.deb; do dpkg -x "$f" "$PREFIX"; done
    # dpkg -x runs no maintainer scripts, so Debian's alternatives
    # (mpirun -> mpirun.openmpi, ...) are made here.
    for tool in mpirun mpiexec mpicc mpicxx; do
      [ -e "$PREFIX/usr/bin/$tool.openmpi" ] && ln -sf "$tool.openmpi" "$PREFIX/usr/bin/$tool"
    done
  fi
}

# Environment for the unpacked packages: their libraries, Open MPI relocated
# to the prefix, and the data set where the examples look for it.
offline_env() {
  export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ -x "$PREFIX/usr/bin/mpirun" ]; then
    export OPAL_PREFIX="$PREFIX/usr" PATH="$PREFIX/usr/bin:$PATH"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  local data=/usr/share/datasets/fashion-mnist
  if [ ! -e "$data" ] && [ -d "$PREFIX$data" ] && [ -w /usr/share ]; then
    mkdir -p "$(dirname "$data")" && ln -s "$PREFIX$data" "$data"
  fi
}

configure() {
  unpack_debs
  offline_env
  local torch_prefix
  torch_prefix=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  log "torch $("$PYTHON" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)') at $torch_prefix"
  local mpi_flags=(-DLOCKSTEP_WITH_MPI=OFF)
  if [ -x "$PREFIX/usr/bin/mpicc" ] && "$PREFIX/usr/bin/mpicc" --showme:version >/dev/null 2>&1; then
    mpi_flags=(-DLOCKSTEP_WITH_MPI=ON -DMPI_C_COMPILER="$PREFIX/usr/bin/mpicc")
  fi
  # NCCL: the toolkit's, else the one PyTorch's wheels bring (nvidia/nccl).
  if [ -z "${NCCL_HOME:-}" ]; then
    NCCL_HOME=$("$PYTHON" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null \
      || "$PYTHON" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
    [ -n "$NCCL_HOME" ] && export NCCL_HOME && log "NCCL from $NCCL_HOME"
  fi
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$PREFIX/usr" "${mpi_flags[@]}" > "$BUILD/configure.log" 2>&1 \
    || { cat "$BUILD/configure.log"; exit 1; }
  grep -E "^-- lockstep" "$BUILD/configure.log" || true
}

step_build() {
  configure
  cmake --build "$BUILD" -j "$(nproc)"
}

# The torch.distributed backend "lockstep" built for CUDA tensors (python/,
# docs/python.md, "CUDA tensors") against this build's liblockstep (after
# gpubuild; else only that library is built), and its CUDA tests: every
# collective on CUDA tensors against the same on CPU tensors, the stream
# semantics, and PyTorch's DDP on the GPU against DDP on the CPU over Gloo.
# The CUDA build of the Python package, against this build's liblockstep,
# into $BUILD/python (once).
python_build() {
  [ -e "$BUILD/src/liblockstep.so" ] || { configure; cmake --build "$BUILD" -j "$(nproc)" --target lockstep; }
  offline_env
  ls "$BUILD"/python/lockstep_torch/_C*.so >/dev/null 2>&1 && return 0
  # fmt of the unpacked packages, which the extension links.
  export LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
  local build
  build=$(cd "$BUILD" && pwd)
  LOCKSTEP_WITH_CUDA=1 LOCKSTEP_BUILD_DIR="$build" MAX_JOBS="$(nproc)" "$PYTHON" -m pip install \
    --disable-pip-version-check -q --no-build-isolation --no-deps --upgrade --target "$build/python" ./python
}

step_python() {
  "$PYTHON" -c 'import pytest' 2>/dev/null || { log "python: $PYTHON has no pytest"; exit 1; }
  python_build
  local build
  build=$(cd "$BUILD" && pwd)
  # PYTHONFAULTHANDLER: a rank process that crashes prints where (its Python
  # threads' stacks), not just its signal.
  toolchain_note | tee "$OUT/toolchain.txt"
  # test_library_bindings: where the package's standard-library calls land
  # (the copies of libstdc++ a toolchain may link in, see src/CMakeLists.txt).
  (cd python/tests && PYTHONFAULTHANDLER=1 PYTHONPATH="$build/python" "$PYTHON" -m pytest -q -rs -p no:cacheprovider \
     test_library_bindings.py test_cuda.py 2>&1) | tee "$OUT/python-cuda.log" | tail -30
}

# How this machine's compiler links libstdc++ (shared, or a static copy
# inside each library: what the image of 2026-12-04 did), and what the
# package's libraries then export of it.
toolchain_note() {
  local cxx=${CXX:-c++} lib
  echo "compiler: $("$cxx" --version | head -1); libstdc++.so: $("$cxx" -print-file-name=libstdc++.so)" \
       "libstdc++.a: $("$cxx" -print-file-name=libstdc++.a)"
  for lib in "$BUILD"/src/liblockstep.so "$BUILD"/python/lockstep_torch/_C*.so; do
    [ -e "$lib" ] || continue
    echo "$(basename "$lib"): needs libstdc++.so.6: $(readelf -d "$lib" | grep -c 'libstdc++'), exports" \
         "$(nm -D --defined-only "$lib" | grep -c ' [TW] _Z[NK]*St\| [TW] _ZS') std:: symbols"
  done
}

# Where a rank of the Python package's CUDA build fails: scripts/python-probe.py
# (init_process_group, one all_reduce) at world 2 and 1 on CPU and CUDA
# tensors, each case at most 20 s. Every rank runs with
# scripts/crash_backtrace.c preloaded (built here with the machine's C
# compiler: no debugger needed), which prints the C++ stack of a crash;
# symbolize() names its frames with addr2line. Rank 0 also writes
# lockstep's debug log (how far its group formation got). The ranks' own
# PIDs are waited for: in bash 5.1 a plain `wait` also waits for process
# substitutions.
step_pyprobe() {
  python_build
  local build preload world device port=29611 rank pids
  build=$(cd "$BUILD" && pwd)
  preload=$build/crash_backtrace.so
  cc -shared -fPIC -O1 -o "$preload" scripts/crash_backtrace.c
  for world in 2 1; do
    for device in cpu cuda; do
      port=$((port + 1))
      echo "== pyprobe: world $world, $device tensors"
      pids=()
      for rank in $(seq 0 $((world - 1))); do
        PYTHONPATH="$build/python" LD_PRELOAD="$preload" RANK=$rank WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 \
          MASTER_PORT=$port LOCKSTEP_LOG_LEVEL=$([ "$rank" = 0 ] && echo debug || echo warning) \
          timeout -k 2 20 "$PYTHON" -X faulthandler scripts/python-probe.py "$device" 2>&1 | sed "s/^/[rank $rank] /" &
        pids+=($!)
      done
      wait "${pids[@]}" || true
    done
  done 2>&1 | symbolize | tee "$OUT/python-probe.log"
}

# Passes its input through, and after each frame that crash_backtrace.c
# printed as object(+offset) adds the function and source line addr2line
# finds there.
symbolize() {
  local line
  while IFS= read -r line; do
    printf '%s\n' "$line"
    if [[ $line =~ (/[^\ \(]+)\(\+(0x[0-9a-f]+)\) ]] && command -v addr2line > /dev/null; then
      printf '    = %s\n' "$(addr2line -f -C -p -e "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" 2> /dev/null)"
    fi
  done
}

# What step_gpu and step_memcheck run, and nothing else (a full build is
# most of a short loan): the CLI for the benchmarks, the gpu-labelled tests
# and the DDP step-time example.
# GPU_TARGETS (space-separated) builds others instead, to rerun one program.
step_gpubuild() {
  configure
  local targets
  read -ra targets <<< "${GPU_TARGETS:-lockstep_cli staged_collectives_test nccl_gpu_test ddp_cuda_test companions_cuda_test fully_shard_cuda_test ddp_throughput}"
  # Open MPI's benchmark, for the smallmsg and allreduce steps, where MPI was found.
  grep -q "^LOCKSTEP_WITH_MPI:BOOL=ON" "$BUILD/CMakeCache.txt" && targets+=(mpi_allreduce)
  targets+=(core_to_core)  # the allreduce16 step's placement probe
  cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}"
}

step_test() {
  offline_env
  (cd "$BUILD" && ctest --output-on-failure -j "$(nproc)" -LE 'netns|root' 2>&1 | tee "$OUT/ctest.log" | tail -40)
}

step_torchtest() {
  offline_env
  (cd "$BUILD" && ctest --output-on-failure -j "$(nproc)" -L torch 2>&1 \
     | tee "$OUT/ctest-torch.log" | tail -40)
}

# The gpu-labelled tests (the four programs of GPU_TARGETS but the CLI and
# the example), GPU_TEST_JOBS at a time (default 4: they share the GPU, and
# each is a few rank processes).
step_gputest() {
  offline_env
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  (cd "$BUILD" && ctest --output-on-failure --no-tests=error -j "${GPU_TEST_JOBS:-4}" -L gpu 2>&1 | tee "$OUT/ctest-gpu.log" | tail -40)
}

# Staging alone (one rank: the copies in and out, against cudaMemcpy on
# pinned memory), then two ranks sharing the GPU over shm and tcp, nccl in a
# world of one, and DDP's overhead in a world of one.
step_gpubench() {
  offline_env
  "$BUILD/lockstep" bench --device cuda -np 1 --backend shm -b 1M -e 256M -f 4 -n 20 \
    --json "$OUT/bench-cuda-staging-1.json" | tee "$OUT/bench-cuda-staging-1.txt"
  local backend
  for backend in shm tcp; do
    "$BUILD/lockstep" bench --device cuda -np 2 --backend "$backend" -b 1M -e 256M -f 4 -n 20 \
      --json "$OUT/bench-cuda-$backend-2.json" | tee "$OUT/bench-cuda-$backend-2.txt"
  done
  "$BUILD/lockstep" bench --device cuda -np 1 --backend nccl -b 1M -e 256M -f 4 -n 20 \
    --json "$OUT/bench-cuda-nccl-1.json" | tee "$OUT/bench-cuda-nccl-1.txt"
  step_ddp_overhead
}

step_gpu() {
  step_gputest
  step_gpubench
}

# DDP's overhead in a world of one on the GPU: the same training step with
# and without the DDP wrapper, interleaved, three runs each; the median.
# wide-mlp by default (OVERHEAD_MODELS): its steps of about 24 ms resolve a
# percent, where mlp's and convnet's steps of about 1 ms on a GPU do not.
step_ddp_overhead() {
  offline_env
  local model run variant
  for model in ${OVERHEAD_MODELS:-wide-mlp}; do
    for run in 1 2 3; do
      for variant in --no-ddp ""; do
        echo "$model ${variant:-ddp} $("$BUILD/examples/ddp_throughput" --device cuda --model "$model" \
          --steps "${STEPS:-50}" --warmup 10 $variant | awk '/^step_ms/ {print $2}')"
      done
    done
  done | tee "$OUT/ddp-overhead-raw.txt" | "$PYTHON" -c '
import statistics, sys
runs = {}
for line in sys.stdin:
    model, variant, ms = line.split()
    runs.setdefault(model, {}).setdefault(variant, []).append(float(ms))
for model, v in runs.items():
    plain, ddp = statistics.median(v["--no-ddp"]), statistics.median(v["ddp"])
    print(f"{model}: step {plain:.3f} ms without DDP, {ddp:.3f} ms with (world of one): overhead {100 * (ddp / plain - 1):+.1f}%")
' | tee "$OUT/ddp-overhead.txt"
}

# compute-sanitizer's memcheck (no access out of bounds or to freed memory)
# over DDP on CUDA in a world of one: every bucket kernel and copy of a
# step, in about a minute (the three cases of step_sanitize take several).
step_memcheck() {
  offline_env
  command -v compute-sanitizer >/dev/null || PATH="$PATH:/usr/local/cuda/bin"
  local limit=${MEMCHECK_LIMIT:-90} status=0
  timeout "$limit" compute-sanitizer --tool memcheck --target-processes all --error-exitcode 3 \
    "$BUILD/tests/ddp_cuda_test" --gtest_filter='SharedGpu/OnCuda.*/1ranks_shm' \
    > "$OUT/sanitizer-memcheck-1rank.log" 2>&1 || status=$?
  tail -5 "$OUT/sanitizer-memcheck-1rank.log"
  case $status in
    0) ;;
    3) log "memcheck found errors: $OUT/sanitizer-memcheck-1rank.log"; return 1 ;;
    124) log "memcheck ran past ${limit} s (MEMCHECK_LIMIT): no verdict"; return 1 ;;
    *) log "memcheck failed (exit $status): $OUT/sanitizer-memcheck-1rank.log"; return 1 ;;
  esac
}

# compute-sanitizer over DDP on CUDA: memcheck (no access out of bounds or
# to freed memory) and racecheck, on the world of one and the two ranks
# sharing the GPU (the tool follows the forked rank processes).
step_sanitize() {
  offline_env
  local tool
  command -v compute-sanitizer >/dev/null || PATH="$PATH:/usr/local/cuda/bin"
  for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 3 \
      "$BUILD/tests/ddp_cuda_test" --gtest_filter='SharedGpu/OnCuda.*' 2>&1 | tee "$OUT/sanitizer-$tool.log" | tail -5
  done
}

# The 16-rank all-reduce of a loan: lockstep (ordinary buffers through the
# slots, with and without streaming stores; shared buffers) and Open MPI interleaved, then
# Gloo alone, each table written when done. First how far apart the cores
# are (bench/core_to_core from CPU 0 to a near, a middle and the last CPU):
# what decides the ordinary path's streaming stores (docs/algorithms.md).
step_allreduce16() {
  offline_env
  local last=$(($(nproc) - 1)) cpu
  if [ -x "$BUILD/bench/core_to_core" ] && [ "$last" -gt 0 ]; then
    for cpu in $(printf '%s\n' 1 $((last / 2)) "$last" | sort -un); do
      if [ "$cpu" -gt 0 ]; then "$BUILD/bench/core_to_core" --cpus "0,$cpu" --rounds 500; fi
    done | tee "$OUT/core-to-core.jsonl"
  fi
  local common=(--np 16 --runs "${RUNS:-2}" --build "$BUILD" --python "$PYTHON" --sizes "${SIZES:-4,4K,64K,1M,16M,64M}")
  "$PYTHON" bench/compare_allreduce.py "${common[@]}" --streaming-never \
    --skip "lockstep tcp;Open MPI, malloc tuned;oneCCL;Gloo" --out "$OUT/allreduce-16.md"
  "$PYTHON" bench/compare_allreduce.py "${common[@]}" --runs 1 \
    --skip "lockstep shm;lockstep shm, shared buffers;lockstep tcp;Open MPI;Open MPI, malloc tuned;oneCCL" \
    --out "$OUT/allreduce-16-gloo.md"
}

# DDP at 16 ranks on the CPU, lockstep against PyTorch's DDP over Gloo.
step_ddp16() {
  offline_env
  "$PYTHON" bench/compare_ddp.py --ranks 16 --runs 1 --steps "${STEPS:-10}" --build "$BUILD" --python "$PYTHON" \
    --out "$OUT/ddp-16.md"
}

# compute-sanitizer's racecheck (shared-memory races in the bucket kernels)
# over DDP on CUDA in a world of one.
step_racecheck() {
  offline_env
  command -v compute-sanitizer >/dev/null || PATH="$PATH:/usr/local/cuda/bin"
  compute-sanitizer --tool racecheck --target-processes all --error-exitcode 3 \
    "$BUILD/tests/ddp_cuda_test" --gtest_filter='SharedGpu/OnCuda.*/1ranks_shm' > "$OUT/sanitizer-racecheck-1rank.log" 2>&1
  local status=$?
  tail -5 "$OUT/sanitizer-racecheck-1rank.log"
  return $status
}

step_allreduce() {
  offline_env
  # Each world size writes its table as soon as it is done. The tcp
  # backend and the malloc-tuned Open MPI are measured at 2 ranks only.
  local np skip
  for np in ${ALLREDUCE_RANKS:-2 4 8 16}; do
    [ "$np" -le "$(nproc)" ] || continue
    skip=""
    [ "$np" -gt 2 ] && skip="lockstep tcp;Open MPI, malloc tuned"
    "$PYTHON" bench/compare_allreduce.py --np "$np" --runs "${RUNS:-2}" --build "$BUILD" --python "$PYTHON" \
      --sizes "${SIZES:-4,4K,64K,1M,16M,64M,256M}" --skip "$skip" --out "$OUT/allreduce-$np.md"
  done
}

# The shm backend's wait policy at 16 ranks: the same all-reduce sizes with
# several spin budgets (LOCKSTEP_SHM_SPIN_US), lockstep alone.
step_shmspin() {
  offline_env
  local np=${SPIN_RANKS:-16} spin
  [ "$np" -le "$(nproc)" ] || np=$(nproc)
  for spin in ${SPINS:-20 200 2000 20000}; do
    for size in ${SPIN_SIZES:-4 64K 1M 16M}; do
      local n=200
      case $size in 4) n=20000 ;; 64K) n=2000 ;; 16M) n=20 ;; esac
      echo "spin ${spin}us size $size: $(LOCKSTEP_SHM_SPIN_US=$spin "$BUILD/lockstep" bench --op allreduce \
        --backend shm -np "$np" -b "$size" -e "$size" -n "$n" -w 5 -c 1 | awk '$1 ~ /^[0-9]+$/ {print $6 " us, busbw " $8 " GB/s"}')"
    done
  done | tee "$OUT/shm-spin-$np.txt"
}

# The shm wait policy's candidates, interleaved: lockstep's adaptive spin
# (the default), fixed spins (LOCKSTEP_SHM_SPIN_US), and Open MPI; one
# table per world size.
step_smallmsg() {
  offline_env
  local np
  for np in ${SMALL_RANKS:-2 4 8 16}; do
    [ "$np" -le "$(nproc)" ] || continue
    "$PYTHON" bench/compare_allreduce.py --np "$np" --runs "${RUNS:-2}" --build "$BUILD" --python "$PYTHON" \
      --sizes 4,4K,64K --spins "${SPINS_US:-20}" --out "$OUT/smallmsg-$np.md" \
      --skip "lockstep shm, shared buffers;lockstep tcp;Open MPI, malloc tuned;Gloo"
  done
}

# The staging chunk: one rank's all-reduce of CUDA memory over shm (the
# copies alone) at each chunk size; the bench prints cudaMemcpy's pinned
# rate to compare with.
step_staging() {
  offline_env
  local chunk
  for chunk in ${STAGING_CHUNKS:-1048576 4194304 16777216}; do
    echo "== staging chunk $chunk"
    LOCKSTEP_CUDA_STAGING_CHUNK_BYTES=$chunk "$BUILD/lockstep" bench --device cuda -np 1 --backend shm \
      -b 16M -e 256M -f 4 -n 10 | tee "$OUT/staging-chunk-$chunk.txt"
  done
}

# lockstep's DDP on the GPU against PyTorch's (bench/compare_gpu_ddp.py;
# docs/gpu.md, "DDP step time on one GPU"): six rows, and PyTorch's DDP over
# the backend lockstep at 1 and 2 ranks where the python step built it;
# interleaved runs.
# On an H200 about 240 s at 5 runs (a PyTorch run takes about 10 s to start
# there, the Gloo pair about 16 s); GPUDDP_RUNS=3 takes about 150 s.
step_gpuddp() {
  offline_env
  local with_backend=()
  # PyTorch's DDP over the backend lockstep too, where the python step built it.
  ls "$BUILD"/python/lockstep_torch/_C*.so >/dev/null 2>&1 && with_backend=(--lockstep-torch "$BUILD/python")
  "$PYTHON" bench/compare_gpu_ddp.py --build "$BUILD" --python "$PYTHON" --device cuda "${with_backend[@]}" \
    --runs "${GPUDDP_RUNS:-5}" --steps 10 --warmup 3 --out "$OUT/gpu-ddp.md" 2>&1 | tee "$OUT/gpu-ddp.log"
}

# One process, three loops: PyTorch's plain loop, lockstep's (--no-ddp) and
# lockstep's DDP in a world of one, interleaved, mlp and convnet, both sides
# under the same malloc settings (MALLOC=default keeps glibc's, to see what
# the heap costs each side).
step_single() {
  offline_env
  "$PYTHON" bench/compare_ddp.py --single --runs "${RUNS:-5}" --steps "${STEPS:-10}" --build "$BUILD" \
    --python "$PYTHON" --malloc "${MALLOC:-steady}" --out "$OUT/ddp-single.md"
}

step_ddp() {
  offline_env
  "$PYTHON" bench/compare_ddp.py --ranks "$RANKS" --runs "${RUNS:-2}" --steps "${STEPS:-10}" --build "$BUILD" \
    --python "$PYTHON" --out "$OUT/ddp-scaling.md"
}

step_doctor() {
  offline_env
  "$BUILD/lockstep" doctor --ranks "$RANKS" --out "$OUT/doctor"
}

[ $# -gt 0 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2; }
steps=()
for step in "$@"; do
  case "$step" in
    loan)
      steps+=(gpubuild gputest python pyprobe memcheck staging gpuddp allreduce16 ddp16 racecheck)
      export GPUDDP_RUNS=${GPUDDP_RUNS:-2} MEMCHECK_LIMIT=${MEMCHECK_LIMIT:-40} ;;
    figures) steps+=(gpubuild gputest python memcheck gpubench) ;;
    build|gpubuild|test|torchtest|gpu|gputest|gpubench|python|pyprobe|memcheck|sanitize|racecheck|allreduce|allreduce16|shmspin|smallmsg|staging|gpuddp|single|ddp|ddp16|doctor)
      steps+=("$step") ;;
    *) log "unknown step '$step' (loan, figures, build, gpubuild, test, torchtest, gpu, gputest, gpubench, python, pyprobe," \
           "memcheck, sanitize, racecheck, allreduce, allreduce16, shmspin, smallmsg, staging, gpuddp, single, ddp, ddp16, doctor)"; exit 2 ;;
  esac
done
# With DEADLINE_S (a loan of a GPU machine), every step runs in a process
# of its own under the time that is left, at most its cap below, and a step
# that fails or runs out of time does not stop the next: one broken test
# program must not cost the figures after it. The total and the failures are
# printed at the end.
# The caps of a loan's steps add up to more than 540 s: the last ones get
# what is left. (Times on an H200, 2026-11-28: gpubuild 49 s, gputest 24 s,
# memcheck 3 s, staging 3 s, gpuddp at 2 runs 85 s, the 16-rank all-reduce
# with Gloo over 50 s. 2026-12-04: gpubuild 71 s, gputest 25 s, python
# 67 s, pyprobe 15 s, staging 8 s; the 16-rank all-reduce wrote lockstep's
# and Open MPI's table within its 100 s but not Gloo's, and 16-rank DDP
# reported nothing within 75 s.)
step_cap() {
  case $1 in
    gpubuild) echo "${CAP_GPUBUILD:-150}" ;; gputest) echo "${CAP_GPUTEST:-90}" ;;
    python) echo "${CAP_PYTHON:-150}" ;; pyprobe) echo 90 ;;
    memcheck) echo $((${MEMCHECK_LIMIT:-90} + 15)) ;; staging) echo 45 ;; gpubench) echo "${CAP_GPUBENCH:-150}" ;;
    gpuddp) echo 140 ;; allreduce16) echo 100 ;; ddp16) echo 150 ;;
    *) echo 100000 ;;
  esac
}
started=$SECONDS
failed=()
for step in "${steps[@]}"; do
  log "== $step"
  step_started=$SECONDS
  if [ -n "${DEADLINE_S:-}" ]; then
    left=$((DEADLINE_S - (SECONDS - started)))
    cap=$(step_cap "$step")
    [ "$left" -gt "$cap" ] && left=$cap
    if [ "$left" -lt 10 ]; then
      failed+=("$step (not run: DEADLINE_S=$DEADLINE_S spent)")
      continue
    fi
    status=0
    DEADLINE_S= timeout --kill-after=5 "$left" "$0" "$step" || status=$?
    case $status in
      0) ;;
      124|137) failed+=("$step (stopped after $left s)") ;;
      *) failed+=("$step (exit $status)") ;;
    esac
  else
    "step_$step"
  fi
  log "== $step took $((SECONDS - step_started)) s ($((SECONDS - started)) s in all)"
done
if [ ${#failed[@]} -gt 0 ]; then
  log "failed: ${failed[*]}"
  exit 1
fi
