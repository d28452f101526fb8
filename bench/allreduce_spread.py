#!/usr/bin/python3
"""The ordinary-buffer path's spread: a 96 MiB all-reduce at 2 ranks over
shm, on ordinary buffers (the caller's memory, copied through the shared
slots: what PyTorch's DDP buckets get) and on shared buffers
(allocate_shared, single copy), interleaved, --runs times each, --pause
seconds apart, so that a slow stretch of the machine shows as a slow run
of one path beside a normal run of the other.

Each run is `lockstep bench --np 2 --backend shm -b 96M -e 96M -n 10 -w 2
[--shared-buffers] --json`; beside its time it records what the kernel's
memory management did during the run (/proc/vmstat deltas: page faults,
compaction, transparent huge pages, migration, reclaim), so that a slow
run can be lined up with an event of the VM.

Prints a row per run, then per path the median, the spread (slowest /
fastest) and the median ratio, against docs/performance.md's goals: the
ordinary path's 8 runs within 1.3x of each other, its median at least 0.8x
the shared-buffer path's (in time: at most 1.25x).

Usage: bench/allreduce_spread.py [--build build] [--runs 8] [--pause 3] [--size 96M] [--out FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# What the VM did that could slow a memory-bound run down.
VMSTAT = ("pgfault", "pgmajfault", "compact_stall", "compact_migrate_scanned", "compact_success",
          "thp_fault_alloc", "thp_collapse_alloc", "thp_split_page", "pgmigrate_success", "numa_hint_faults",
          "pgscan_kswapd", "pgsteal_kswapd", "pgscan_direct", "workingset_refault_anon", "pgdemote_kswapd")


def vmstat():
    values = {}
    with open("/proc/vmstat") as f:
        for line in f:
            name, value = line.split()
            values[name] = int(value)
    return values


def run_once(a, shared):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [os.path.join(a.build, "lockstep"), "bench", "--np", "2", "--backend", "shm", "-b", a.size, "-e", a.size,
               "-n", "10", "-w", "2", "--json", out.name] + (["--shared-buffers"] if shared else [])
        before = vmstat()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        after = vmstat()
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
        result = json.load(open(out.name))["results"][0]
    deltas = {k: after.get(k, 0) - before.get(k, 0) for k in VMSTAT if k in after}
    return result["time_us"] / 1000, result["busbw"], deltas


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--pause", type=float, default=3)
    parser.add_argument("--size", default="96M")
    parser.add_argument("--out", default=None, help="also write every run as JSON here")
    a = parser.parse_args()
    rows = []
    for r in range(a.runs):
        # Alternate which path goes first, so neither always follows the other.
        for shared in ((False, True) if r % 2 == 0 else (True, False)):
            ms, busbw, deltas = run_once(a, shared)
            rows.append({"run": r, "path": "shared" if shared else "ordinary", "ms": ms, "busbw": busbw, **deltas})
            time.sleep(a.pause)
    keys = [k for k in VMSTAT if any(row.get(k) for row in rows)]
    print(f"| run | path | time (ms) | busbw (GB/s) | {' | '.join(keys)} |")
    print("|---" * (4 + len(keys)) + "|")
    for row in rows:
        print(f"| {row['run']} | {row['path']} | {row['ms']:.1f} | {row['busbw']:.2f} | "
              + " | ".join(str(row.get(k, 0)) for k in keys) + " |")
    medians = {}
    for path in ("ordinary", "shared"):
        times = [row["ms"] for row in rows if row["path"] == path]
        medians[path] = statistics.median(times)
        print(f"\n{path}: median {medians[path]:.1f} ms, fastest {min(times):.1f}, slowest {max(times):.1f}, "
              f"spread {max(times) / min(times):.2f}x", end="")
    ratio = medians["shared"] / medians["ordinary"]
    ordinary = [row["ms"] for row in rows if row["path"] == "ordinary"]
    print(f"\n\nordinary path: spread {max(ordinary) / min(ordinary):.2f}x (goal <= 1.3), "
          f"median speed {ratio:.2f}x the shared-buffer path's (goal >= 0.8); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M')}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
