#!/usr/bin/python3
"""all_to_all and gather on one host: lockstep against Open MPI.

Runs `lockstep bench --op OP` (shm, and tcp unless skipped) and the plain
MPI peer bench/mpi_blocks (MPI_Alltoall / MPI_Gather, mpirun --bind-to core,
shared-memory transport) on the same sizes, float32, one rank per core,
repeating the whole set several times, interleaved, so that drift in the
machine's speed hits all of them alike. Reports the median per size (time
for sizes up to 4 KiB, busbw otherwise) and lockstep shm's ratio to Open
MPI, as markdown for docs/performance.md. Size is the whole buffer (n
blocks), as in nccl-tests.

Usage: bench/compare_blocks.py [--ops all_to_all,gather] [--np 2] [--runs 3]
           [--build build] [--sizes 64,1K,16K,256K,4M,64M] [--skip 'lockstep tcp'] [--out FILE]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peer import print_table  # noqa: E402
from compare_allreduce import iterations, parse_table, size_bytes, small  # noqa: E402

SIZES = "64,1K,16K,256K,4M,64M"


def contenders(args, op):
    lockstep = os.path.join(args.build, "lockstep")
    mpi_bench = os.path.join(args.build, "bench", "mpi_blocks")
    common = ["--op", op, "-np", str(args.np), "-w", str(args.warmup), "-c", "1"]
    out = [("lockstep shm", [lockstep, "bench", "--backend", "shm"] + common),
           ("lockstep tcp", [lockstep, "bench", "--backend", "tcp"] + common)]
    if os.path.exists(mpi_bench) and shutil.which("mpirun"):
        oversubscribed = args.np > len(os.sched_getaffinity(0))
        binding = ["--oversubscribe", "--bind-to", "core:overload-allowed"] if oversubscribed else ["--bind-to", "core"]
        mpirun = ["mpirun", "--allow-run-as-root", "-np", str(args.np)] + binding + ["--mca", "btl", "self,vader"]
        out.append(("Open MPI", mpirun + [mpi_bench, "--op", op, "-w", str(args.warmup), "-c", "1"]))
    else:
        print(f"# note: {mpi_bench} or mpirun missing; Open MPI not measured", file=sys.stderr)
    return out


def measure(args, op, sizes, skipped, env):
    results = {}  # name -> size -> [(time, busbw)]
    names = []
    for run in range(args.runs):
        for name, cmd in contenders(args, op):
            if name in skipped:
                continue
            if name not in names:
                names.append(name)
            for size in sizes:
                full = cmd + ["-b", size, "-e", size, "-n", str(iterations(size, False))]
                proc = subprocess.run(full, capture_output=True, text=True, env=env, timeout=600)
                rows = parse_table(proc.stdout)
                row = rows.get(size_bytes(size)) or (rows and list(rows.values())[0])
                if proc.returncode != 0 or not row:
                    print(f"# {op} {name} {size}: failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}",
                          file=sys.stderr)
                    continue
                if row[2] not in ("0", "N/A"):
                    print(f"# {op} {name} {size}: {row[2]} wrong elements!", file=sys.stderr)
                results.setdefault(name, {}).setdefault(size, []).append((row[0], row[1]))
            print(f"# {op} run {run + 1}/{args.runs}: {name} done", file=sys.stderr)
    return names, results


def table(op, names, results, sizes):
    def median(name, size):
        samples = results.get(name, {}).get(size)
        if not samples:
            return None
        return statistics.median(s[0] if small(size) else s[1] for s in samples)

    lines = [f"**{op}**", "", "| size | " + " | ".join(names) + " | lockstep shm vs Open MPI |",
             "|---|" + "---|" * (len(names) + 1)]
    for size in sizes:
        cells = []
        for name in names:
            v = median(name, size)
            cells.append("n/a" if v is None else (f"{v:.2f} µs" if small(size) else f"{v:.2f} GB/s"))
        ours, peer = median("lockstep shm", size), median("Open MPI", size)
        if ours is None or peer is None or not ours or not peer:
            ratio = "n/a"
        else:
            ratio = f"{peer / ours:.2f}×" if small(size) else f"{ours / peer:.2f}×"
        lines.append(f"| {size} | " + " | ".join(cells) + f" | {ratio} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default="all_to_all,gather")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", help="also write the markdown here")
    parser.add_argument("--sizes", default=SIZES, help="comma-separated sizes in bytes (K/M/G suffixes)")
    parser.add_argument("--skip", default="", help="contender names to leave out, separated by ';'")
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    skipped = set(n.strip() for n in args.skip.split(";")) if args.skip else set()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cores = len(os.sched_getaffinity(0))
    placement = (f"{args.np} ranks pinned one per core" if args.np <= cores
                 else f"{args.np} ranks on {cores} cores (oversubscribed)")
    lines = [f"Median of {args.runs} interleaved runs, {placement}, float32; time in µs up to 4 KiB (lower is "
             "better), busbw in GB/s above (higher is better); the ratio is >1 where lockstep is better.", ""]
    for op in args.ops.split(","):
        names, results = measure(args, op, sizes, skipped, env)
        lines += table(op, names, results, sizes) + [""]
    print_table(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
