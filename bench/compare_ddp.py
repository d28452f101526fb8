#!/usr/bin/python3
"""DDP step time: lockstep's DistributedDataParallel against PyTorch's (Gloo).

For each model (the 25M-parameter MLP and the Fashion-MNIST convnet) runs,
interleaved and repeated, on the same machine:
  - one process without communication (PyTorch, and lockstep's world of one),
  - N ranks (--ranks, default 2) synchronised and under no_sync, for
    lockstep and for PyTorch DDP (and both with gradient_as_bucket_view when
    --bucket-view is given),
and reports median step times, weak-scaling efficiency (1-process step /
N-rank step), the exposed communication (step - no_sync step), and the
ratio lockstep / PyTorch, as markdown for docs/performance.md.

Usage: bench/compare_ddp.py [--runs 3] [--steps 20] [--build build] [--out FILE]
           [--ranks 2] [--bucket-view] [--python PYTHON]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

from torch_peer import add_python_argument, missing_note, print_table, torch_version


def step_ms(cmd, timeout=900):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    match = re.search(r"step_ms ([0-9.]+)", proc.stdout)
    if not match:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-500:]}")
    if proc.returncode != 0:
        # PyTorch 2.11's DDP on the convnet at 2 ranks (nearly always under
        # no_sync, now and then synchronised) aborts at exit ("terminate
        # called without an active exception"): the steps were timed and
        # reported by then.
        last = proc.stderr.strip().splitlines()[-1:] or [""]
        print(f"# note: exit {proc.returncode} after reporting its step time: {' '.join(cmd)}: {last[0]}",
              file=sys.stderr)
    return float(match.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--ranks", default="2", help="comma-separated world sizes, e.g. 1,2,4,8,16")
    parser.add_argument("--bucket-view", action="store_true",
                        help="also measure both with gradient_as_bucket_view")
    parser.add_argument("--build", default="build")
    add_python_argument(parser)
    parser.add_argument("--out")
    args = parser.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    lockstep = os.path.join(args.build, "lockstep")
    example = os.path.join(args.build, "examples", "ddp_throughput")
    torch_ddp = [args.python, os.path.join(here, "pytorch_ddp.py")]
    peer_version = torch_version(args.python)
    if not peer_version:
        sys.exit(f"compare_ddp: {missing_note(args.python)}")
    steps = ["--steps", str(args.steps)]
    world_sizes = [int(n) for n in args.ranks.split(",")]
    variants = [("", [])] + ([(", bucket view", ["--bucket-view"])] if args.bucket_view else [])

    def ours(np, *flags):
        return [lockstep, "run", "--nproc-per-node", str(np), "--", example] + list(flags) + steps

    lines = [f"PyTorch {peer_version}, lockstep built in {args.build}, {len(os.sched_getaffinity(0))} cores.", ""]
    for model in args.models.split(","):
        # The single-process baselines, then for each world size and variant:
        # synchronised and under no_sync, for both.
        configs = {
            "PyTorch, 1 process": torch_ddp + ["--model", model, "-np", "1"] + steps,
            "lockstep, 1 process": ours(1, "--model", model),
        }
        for np in world_sizes:
            if np == 1:
                continue
            for suffix, flags in variants:
                for sync in ("", ", no_sync"):
                    extra = flags + (["--no-sync"] if sync else [])
                    configs[f"PyTorch DDP, {np} ranks{suffix}{sync}"] = (
                        torch_ddp + ["--model", model, "-np", str(np)] + extra + steps)
                    configs[f"lockstep DDP, {np} ranks{suffix}{sync}"] = ours(np, "--model", model, *extra)
        samples = {name: [] for name in configs}
        for run in range(args.runs):
            for name, cmd in configs.items():
                samples[name].append(step_ms(cmd))
                print(f"# {model}, {name}: {samples[name][-1]:.1f} ms", file=sys.stderr, flush=True)
            print(f"# {model}: run {run + 1}/{args.runs} done", file=sys.stderr)
        med = {name: statistics.median(v) for name, v in samples.items()}
        lines += [f"### {model}", "",
                  f"Median of {args.runs} interleaved runs of {args.steps} steps each (the step time of a run is the "
                  "median step of its slowest rank); batch 64 per rank (weak scaling), SGD, one intra-op thread "
                  "per rank, ranks pinned one per core. Efficiency = 1-process step / N-rank step; exposed "
                  "communication = step - no_sync step.", "",
                  "| ranks | variant | PyTorch DDP step (ms) | lockstep step (ms) | lockstep / PyTorch "
                  "| PyTorch efficiency | lockstep efficiency | PyTorch exposed comm (ms) | lockstep exposed comm (ms) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        lines.append(f"| 1 | no DDP | {med['PyTorch, 1 process']:.1f} | {med['lockstep, 1 process']:.1f} | "
                     f"{med['lockstep, 1 process'] / med['PyTorch, 1 process']:.2f} | 1.00 | 1.00 | | |")
        for np in world_sizes:
            if np == 1:
                continue
            for suffix, _ in variants:
                theirs, ours_ = med[f"PyTorch DDP, {np} ranks{suffix}"], med[f"lockstep DDP, {np} ranks{suffix}"]
                theirs_ns = med[f"PyTorch DDP, {np} ranks{suffix}, no_sync"]
                ours_ns = med[f"lockstep DDP, {np} ranks{suffix}, no_sync"]
                lines.append(
                    f"| {np} | {suffix.lstrip(', ') or 'default'} | {theirs:.1f} | {ours_:.1f} | {ours_ / theirs:.2f} | "
                    f"{med['PyTorch, 1 process'] / theirs:.2f} | {med['lockstep, 1 process'] / ours_:.2f} | "
                    f"{theirs - theirs_ns:.1f} | {ours_ - ours_ns:.1f} |")
        lines.append("")
    print_table(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
