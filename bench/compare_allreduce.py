#!/usr/bin/python3
"""All-reduce on one host: lockstep against Open MPI, Intel oneCCL and PyTorch's Gloo.

Runs every contender on the same sizes, pinned one rank per core, float32
sum, in place, and repeats the whole set several times, interleaved, so that
drift in the machine's speed hits all of them alike. Reports the median per
size (time for small sizes, busbw for large ones) and lockstep's ratio to
each peer, as a markdown table for docs/performance.md.

Contenders (skipped with a note when unavailable):
  lockstep shm            build/lockstep bench --backend shm
  lockstep shm, shared    ... --shared-buffers (single copy)
  lockstep tcp            ... --backend tcp
  lockstep shm, spin S µs ... with LOCKSTEP_SHM_SPIN_US=S (--spins S,...): the wait policy's candidates
  lockstep shm, slots / single copy  ... with LOCKSTEP_SHM_ORDINARY_PATH=slots / single-copy
                          (--single-copy-rows): ordinary buffers through the shared slots, or read and
                          written by cross-memory attach, whatever "lockstep shm" (auto) chooses
  lockstep shm, streaming never  ... with LOCKSTEP_SHM_STREAMING_STORES=never (--streaming-never):
                          the slots written with ordinary stores whatever the cores' placement
  Open MPI                mpirun --bind-to core build/bench/mpi_allreduce
  Open MPI, malloc tuned  the same with glibc's mmap threshold raised
  oneCCL                  VENV/bin/mpiexec (Intel MPI) BUILD/bench/ccl_allreduce: ccl::allreduce over
                          CCL_ATL_TRANSPORT=mpi; built here from bench/ccl_allreduce.cc against the
                          environment that scripts/install-oneccl.sh makes (bench/oneccl_peer.py)
  Gloo                    PYTHON bench/gloo_allreduce.py (PyTorch's torch.distributed)

Usage: bench/compare_allreduce.py [--np 2] [--runs 3] [--build build] [--out FILE]
           [--sizes 4,4K,1M,16M,64M] [--python PYTHON] [--oneccl VENV] [--spins 20,200] [--skip NAMES]
           [--busy N] [--streaming-never] [--single-copy-rows]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys

import oneccl_peer
from busy import add_busy_argument, busy_load
from torch_peer import add_python_argument, missing_note, print_table, torch_version

SIZES = "4,4K,1M,16M,64M"
SMALL_BYTES = 4096  # sizes up to this are reported as latency (us); the rest as busbw (GB/s)


def iterations(size, gloo):
    """Enough for a stable mean of sub-microsecond operations, few enough for
    the largest sizes. Gloo's small messages take milliseconds: it gets fewer."""
    n = size_bytes(size)
    if n <= 64:
        return 500 if gloo else 20000
    if n <= 4096:
        return 300 if gloo else 5000
    return max(5, min(200 if gloo else 1000, (256 << 20) // n // 2 * 2 or 5))


def size_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def small(size):
    return size_bytes(size) <= SMALL_BYTES


def parse_table(output):
    """Rows of a lockstep-bench-style table: {bytes: (time_us, busbw, wrong)}."""
    rows = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 9 and fields[0].isdigit():
            rows[int(fields[0])] = (float(fields[5]), float(fields[7]), fields[8])
    return rows


def contenders(args):
    lockstep = os.path.join(args.build, "lockstep")
    mpi_bench = os.path.join(args.build, "bench", "mpi_allreduce")
    common = ["-np", str(args.np), "-w", str(args.warmup), "-c", "1"]
    out = [
        ("lockstep shm", [lockstep, "bench", "--op", "allreduce", "--backend", "shm"] + common, {}),
        ("lockstep shm, shared buffers",
         [lockstep, "bench", "--op", "allreduce", "--backend", "shm", "--shared-buffers"] + common, {}),
        ("lockstep tcp", [lockstep, "bench", "--op", "allreduce", "--backend", "tcp"] + common, {}),
    ]
    # The shm wait policy's candidates: "lockstep shm" spins adaptively
    # (src/comm/shm/spin_budget.h); these fix the spin instead.
    for spin in filter(None, args.spins.split(",")):
        out.append((f"lockstep shm, spin {spin} µs", [lockstep, "bench", "--op", "allreduce", "--backend", "shm"] + common,
                    {"LOCKSTEP_SHM_SPIN_US": spin}))
    if args.single_copy_rows:
        for name, choice in (("slots", "slots"), ("single copy", "single-copy")):
            out.append((f"lockstep shm, {name}", [lockstep, "bench", "--op", "allreduce", "--backend", "shm"] + common,
                        {"LOCKSTEP_SHM_ORDINARY_PATH": choice}))
    if args.streaming_never:
        out.append(("lockstep shm, streaming never", [lockstep, "bench", "--op", "allreduce", "--backend", "shm"] + common,
                    {"LOCKSTEP_SHM_STREAMING_STORES": "never"}))
    if os.path.exists(mpi_bench) and shutil.which("mpirun"):
        # More ranks than cores: Open MPI must be told it may oversubscribe
        # (it then yields when idle instead of spinning) and share cores.
        oversubscribed = args.np > len(os.sched_getaffinity(0))
        binding = ["--oversubscribe", "--bind-to", "core:overload-allowed"] if oversubscribed else ["--bind-to", "core"]
        mpirun = ["mpirun", "--allow-run-as-root", "-np", str(args.np)] + binding + ["--mca", "btl", "self,vader"]
        mpi_args = ["-w", str(args.warmup), "-c", "1"]
        out.append(("Open MPI", mpirun + [mpi_bench] + mpi_args, {}))
        # glibc hands large allocations back to the kernel on free, so a
        # library that mallocs a temporary per call pays page faults every
        # time; raising the threshold (its maximum is 32 MiB) avoids that.
        tuned = ["-x", "MALLOC_MMAP_THRESHOLD_=33554432", "-x", "MALLOC_TRIM_THRESHOLD_=4294967295"]
        out.append(("Open MPI, malloc tuned", mpirun[:1] + tuned + mpirun[1:] + [mpi_bench] + mpi_args, {}))
    else:
        print(f"# note: {mpi_bench} or mpirun missing; Open MPI not measured", file=sys.stderr)
    if "oneCCL" not in args.skipped:
        ccl_bench, why = oneccl_peer.build(args.oneccl, args.build)
        if ccl_bench:
            launch, ccl_env = oneccl_peer.command(args.oneccl, ccl_bench, args.np, os.sched_getaffinity(0))
            print(f"# oneCCL: {oneccl_peer.version(args.oneccl)} ({args.oneccl}), {oneccl_peer.settings(ccl_env)}",
                  file=sys.stderr)
            out.append(("oneCCL", launch + ["-w", str(args.warmup), "-c", "1"], ccl_env))
        else:
            print(f"# note: {why}; oneCCL not measured", file=sys.stderr)
    gloo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gloo_allreduce.py")
    python = args.python
    version = torch_version(python)
    if version:
        print(f"# Gloo from PyTorch {version} ({python})", file=sys.stderr)
        out.append(("Gloo", [python, gloo, "-np", str(args.np), "-w", str(args.warmup)], {}))
    else:
        print(f"# note: {missing_note(python)}; Gloo not measured", file=sys.stderr)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", help="also write the markdown table here")
    parser.add_argument("--sizes", default=SIZES, help="comma-separated sizes in bytes (K/M/G suffixes)")
    add_python_argument(parser)
    oneccl_peer.add_oneccl_argument(parser)
    parser.add_argument("--spins", default="", help="also lockstep shm with these fixed spins before a sleep, in "
                        "microseconds, comma-separated (LOCKSTEP_SHM_SPIN_US), e.g. 20,200")
    parser.add_argument("--skip", default="", help="contender names to leave out, separated by ';', e.g. "
                        "'lockstep tcp;Open MPI, malloc tuned'")
    parser.add_argument("--single-copy-rows", action="store_true", help="also lockstep shm with ordinary buffers "
                        "always through the slots and always by cross-memory attach (LOCKSTEP_SHM_ORDINARY_PATH)")
    parser.add_argument("--streaming-never", action="store_true", help="also lockstep shm with the slots "
                        "written with ordinary stores only (LOCKSTEP_SHM_STREAMING_STORES=never)")
    add_busy_argument(parser)
    args = parser.parse_args()
    args.skipped = set(n.strip() for n in args.skip.split(";")) if args.skip else set()
    with busy_load(args.busy):
        compare(args)


def compare(args):
    sizes = args.sizes.split(",")
    skipped = args.skipped

    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    results = {}  # name -> size -> list of (time, busbw)
    names = []
    # Found once: probing the peers (torch's import takes seconds) is the
    # same for every run.
    everyone = contenders(args)
    for run in range(args.runs):
        for name, cmd, extra in everyone:
            if name in skipped:
                continue
            if name not in names:
                names.append(name)
            for size in sizes:
                # One size per invocation keeps every contender's buffers
                # fresh and its warm-up identical.
                iters = iterations(size, name == "Gloo")
                full = cmd + ["-b", size, "-e", size, "-n", str(iters)]
                proc = subprocess.run(full, capture_output=True, text=True, env=dict(env, **extra), timeout=600)
                rows = parse_table(proc.stdout)
                row = rows.get(size_bytes(size)) or (rows and list(rows.values())[0])
                if proc.returncode != 0 or not row:
                    print(f"# {name} {size}: failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}",
                          file=sys.stderr)
                    continue
                if row[2] not in ("0", "N/A"):
                    print(f"# {name} {size}: {row[2]} wrong elements!", file=sys.stderr)
                results.setdefault(name, {}).setdefault(size, []).append((row[0], row[1]))
            print(f"# run {run + 1}/{args.runs}: {name} done", file=sys.stderr)

    def median(name, size):
        samples = results.get(name, {}).get(size)
        if not samples:
            return None
        return statistics.median(s[0] if small(size) else s[1] for s in samples)

    cores = len(os.sched_getaffinity(0))
    placement = (f"{args.np} ranks pinned one per core" if args.np <= cores
                 else f"{args.np} ranks on {cores} cores (oversubscribed)")
    if args.busy:
        placement += f", {args.busy} busy process(es) beside them"
    lines = [f"Median of {args.runs} interleaved runs, {placement}, float32 sum, in place; "
             "time in µs for 4 B and 4 KiB (lower is better), busbw in GB/s otherwise (higher is better).", "",
             "| size | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for size in sizes:
        cells = []
        for name in names:
            v = median(name, size)
            cells.append("n/a" if v is None else (f"{v:.2f} µs" if small(size) else f"{v:.2f} GB/s"))
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    lines += ["", "lockstep shm relative to each peer (>1 means lockstep is better):", "",
              "| size | " + " | ".join(n for n in names if not n.startswith("lockstep")) + " |",
              "|---|" + "---|" * len([n for n in names if not n.startswith("lockstep")])]
    for size in sizes:
        ours = median("lockstep shm", size)
        ours_shared = median("lockstep shm, shared buffers", size)
        cells = []
        for name in names:
            if name.startswith("lockstep"):
                continue
            peer = median(name, size)
            if ours is None or peer is None:
                cells.append("n/a")
            elif not peer:
                cells.append("peer below 0.01")
            elif small(size):
                cells.append(f"{peer / ours:.2f}×")
            else:
                cells.append(f"{ours / peer:.2f}× (shared: {ours_shared / peer:.2f}×)" if ours_shared else f"{ours / peer:.2f}×")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    print_table(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
