#!/usr/bin/python3
"""PyTorch over its own Gloo against PyTorch over lockstep's torch.distributed
backend ("lockstep", python/): the same scripts, only the backend differs,
interleaved and repeated on the same machine.

  - DDP step time (bench/pytorch_ddp.py) for the 25M-parameter MLP and the
    Fashion-MNIST convnet at each world size, synchronised and under no_sync
    (step - no_sync step is the exposed communication);
  - dist.all_reduce latency and busbw (bench/gloo_allreduce.py) from 4 B up.

Needs the package built: `make build-python` (PYTHONPATH is set here).
Prints markdown for docs/performance.md.

Usage: bench/compare_c10d.py [--runs 3] [--steps 20] [--ranks 2,4] [--sizes 4,4K,1M,64M,256M]
           [--skip-ddp] [--skip-allreduce] [--python PYTHON] [--busy N] [--out FILE]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

from busy import add_busy_argument, busy_load
from torch_peer import REPO, add_python_argument, missing_note, print_table, torch_version

HERE = os.path.dirname(os.path.abspath(__file__))
BACKENDS = ["gloo", "lockstep"]


def run(cmd, env, pattern, timeout=900):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    match = re.search(pattern, proc.stdout, re.MULTILINE)
    if not match:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-800:]}")
    return match


def ddp_tables(args, env):
    steps = ["--steps", str(args.steps)]
    samples = {}  # (model, ranks, backend, no_sync) -> [ms]
    for _ in range(args.runs):
        for model in args.models.split(","):
            for ranks in args.ranks:
                for backend in BACKENDS:
                    for no_sync in (False, True):
                        cmd = [args.python, os.path.join(HERE, "pytorch_ddp.py"), "--model", model, "-np",
                               str(ranks), "--backend", backend] + steps + (["--no-sync"] if no_sync else [])
                        ms = float(run(cmd, env, r"step_ms ([0-9.]+)").group(1))
                        samples.setdefault((model, ranks, backend, no_sync), []).append(ms)
        print(f"# ddp run done", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in samples.items()}
    lines = ["| model | ranks | Gloo step | lockstep step | lockstep / Gloo | Gloo exposed comm. | "
             "lockstep exposed comm. |", "|---|---|---|---|---|---|---|"]
    for model in args.models.split(","):
        for ranks in args.ranks:
            g, l = med[(model, ranks, "gloo", False)], med[(model, ranks, "lockstep", False)]
            ge = g - med[(model, ranks, "gloo", True)]
            le = l - med[(model, ranks, "lockstep", True)]
            lines.append(f"| {model} | {ranks} | {g:.1f} ms | {l:.1f} ms | {l / g:.2f}× | {ge:.1f} ms | {le:.1f} ms |")
    return lines


def allreduce_tables(args, env):
    samples = {}  # (ranks, backend, size) -> [(us, busbw)]
    for _ in range(args.runs):
        for ranks in args.ranks:
            for size in args.sizes.split(","):
                for backend in BACKENDS:
                    iters = "2000" if size in ("4", "4K") else ("20" if "M" not in size or int(size[:-1]) < 64 else "5")
                    cmd = [args.python, os.path.join(HERE, "gloo_allreduce.py"), "-np", str(ranks), "--backend",
                           backend, "-b", size, "-e", size, "-n", iters, "-w", "5"]
                    row = run(cmd, env, r"^\s+(\d+)\s+\d+\s+float\s+sum\s+-1\s+([0-9.]+)\s+[0-9.]+\s+([0-9.]+)\s+(\d+)")
                    if row.group(4) != "0":
                        raise RuntimeError(f"{backend} {size}: {row.group(4)} wrong elements")
                    samples.setdefault((ranks, backend, size), []).append((float(row.group(2)), float(row.group(3))))
        print(f"# all_reduce run done", file=sys.stderr)
    lines = ["| ranks | size | Gloo | lockstep | lockstep vs Gloo |", "|---|---|---|---|---|"]
    for ranks in args.ranks:
        for size in args.sizes.split(","):
            us = {b: statistics.median(s[0] for s in samples[(ranks, b, size)]) for b in BACKENDS}
            bw = {b: statistics.median(s[1] for s in samples[(ranks, b, size)]) for b in BACKENDS}
            if size in ("4", "4K"):
                lines.append(f"| {ranks} | {size} | {us['gloo']:.1f} µs | {us['lockstep']:.1f} µs | "
                             f"{us['gloo'] / us['lockstep']:.1f}× faster |")
            else:
                lines.append(f"| {ranks} | {size} | {bw['gloo']:.2f} GB/s | {bw['lockstep']:.2f} GB/s | "
                             f"{bw['lockstep'] / bw['gloo']:.1f}× the busbw |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--ranks", default="2,4", type=lambda s: [int(n) for n in s.split(",")])
    parser.add_argument("--sizes", default="4,4K,1M,16M,64M,256M")
    parser.add_argument("--skip-ddp", action="store_true")
    parser.add_argument("--skip-allreduce", action="store_true")
    parser.add_argument("--package", default=os.path.join(REPO, "build-torch2", "python"),
                        help="where `make build-python` installed lockstep_torch")
    add_python_argument(parser)
    add_busy_argument(parser)
    parser.add_argument("--out")
    args = parser.parse_args()
    version = torch_version(args.python)
    if not version:
        sys.exit(f"compare_c10d: {missing_note(args.python)}")
    if not os.path.isdir(os.path.join(args.package, "lockstep_torch")):
        sys.exit(f"compare_c10d: no lockstep_torch in {args.package}: run `make build-python`")
    env = dict(os.environ, PYTHONPATH=args.package)
    cores = len(os.sched_getaffinity(0))
    load = f", {args.busy} busy process(es) beside the ranks" if args.busy else ""
    lines = [f"PyTorch {version}, {cores} cores{load}, median of {args.runs} interleaved runs; the same script over "
             "each backend.", ""]
    with busy_load(args.busy):
        if not args.skip_ddp:
            lines += ddp_tables(args, env) + [""]
        if not args.skip_allreduce:
            lines += allreduce_tables(args, env)
    print_table(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
