#!/usr/bin/python3
"""The ordinary-buffer path's spread: a 96 MiB all-reduce at 2 ranks over
shm, on ordinary buffers (the caller's memory, copied through the shared
slots: what PyTorch's DDP buckets get) and on shared buffers (allocate_shared, single copy), interleaved, --runs times
each, --pause seconds apart, so that a slow stretch of the machine shows as
a slow run of one path beside a normal run of the other.

Each run is `lockstep bench --np 2 --backend shm -b 96M -e 96M -n 10 -w 2
[--shared-buffers] --json`. With --single-copy, ordinary buffers also go
by cross-memory attach (LOCKSTEP_SHM_ORDINARY_PATH=single-copy: peers read
and write each rank's buffer with process_vm_readv/writev, no slots).
With --never, the ordinary path also runs
with LOCKSTEP_SHM_STREAMING_STORES=never (slots written with
ordinary stores whatever the placement: the path before streaming stores),
to show what the default (auto) saves. Beside each run's time it records what the kernel's
memory management did during the run (/proc/vmstat deltas: page faults,
compaction, transparent huge pages, migration, reclaim) and, before each
round of runs, how fast a cache line goes between CPUs 0 and 1 and back
(`bench/core_to_core`, built with the project): on a virtual machine whose
host moves its vCPUs between dies, that round trip tells the placement.

Prints a row per run, then per path the median, the spread (slowest /
fastest) and the median ratio, against docs/performance.md's goals: the
ordinary path's runs within 1.3x of each other, its median at least 0.8x
the shared-buffer path's (in time: at most 1.25x).

Usage: bench/allreduce_spread.py [--build build] [--runs 8] [--pause 3] [--size 96M] [--single-copy] [--never] [--out FILE]
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


def core_to_core(a):
    """The probe's round trip between CPUs 0 and 1, in ns (None where it cannot run)."""
    probe = os.path.join(a.build, "bench", "core_to_core")
    if not os.path.exists(probe) or os.cpu_count() < 2:
        return None
    done = subprocess.run([probe, "--rounds", "500"], capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout)["round_trip_ns"] if done.returncode == 0 else None


def run_once(a, path):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [os.path.join(a.build, "lockstep"), "bench", "--np", "2", "--backend", "shm", "-b", a.size, "-e", a.size,
               "-n", "10", "-w", "2", "--json", out.name] + (["--shared-buffers"] if path == "shared" else [])
        env = dict(os.environ)
        if path == "never":
            env["LOCKSTEP_SHM_STREAMING_STORES"] = "never"
        if path == "single-copy":
            env["LOCKSTEP_SHM_ORDINARY_PATH"] = "single-copy"
        before = vmstat()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
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
    parser.add_argument("--single-copy", action="store_true",
                        help="also run ordinary buffers by cross-memory attach instead of the slots")
    parser.add_argument("--never", action="store_true",
                        help="also run it through the slots with streaming stores never used")
    parser.add_argument("--out", default=None, help="also write every run as JSON here")
    a = parser.parse_args()
    paths = ["ordinary", "shared"] + (["single-copy"] if a.single_copy else []) + (["never"] if a.never else [])
    rows = []
    for r in range(a.runs):
        round_trip = core_to_core(a)
        # Rotate which path goes first, so none always follows another.
        for path in paths[r % len(paths):] + paths[:r % len(paths)]:
            ms, busbw, deltas = run_once(a, path)
            rows.append({"run": r, "path": path, "ms": ms, "busbw": busbw, "round_trip_ns": round_trip, **deltas})
            time.sleep(a.pause)
    keys = [k for k in VMSTAT if any(row.get(k) for row in rows)]
    print(f"| run | core-to-core round trip (ns) | path | time (ms) | busbw (GB/s) | {' | '.join(keys)} |")
    print("|---" * (5 + len(keys)) + "|")
    for row in rows:
        trip = "-" if row["round_trip_ns"] is None else f"{row['round_trip_ns']:.0f}"
        print(f"| {row['run']} | {trip} | {row['path']} | {row['ms']:.1f} | {row['busbw']:.2f} | "
              + " | ".join(str(row.get(k, 0)) for k in keys) + " |")
    medians = {}
    for path in paths:
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
