#!/usr/bin/python3
"""Fully sharded step time: lockstep's fully_shard against PyTorch's FSDP2
(Gloo), with both sides' DDP on the same model for scale.

The model is ddp_throughput's and pytorch_ddp.py's deep-mlp: 8 x
Linear(1024, 1024) with ReLU (~8.4M parameters), MSE loss, SGD, batch 32
per rank (weak scaling), sharded as FSDP2 shards a model of blocks: each
Linear but the last a unit of its own, then the root, which holds the last;
resharding after forward (both sides' default). For each world size
(--ranks, default 2,4) it runs, interleaved and repeated (run r starts r
rows further on, so no configuration always follows the same one):
  - lockstep fully_shard   (examples/ddp_throughput --fsdp, through `lockstep run`)
  - PyTorch FSDP2          (bench/pytorch_ddp.py --fsdp, Gloo)
  - lockstep DDP           (examples/ddp_throughput)
  - PyTorch DDP            (bench/pytorch_ddp.py, Gloo)
each process one rank with one intra-op thread, pinned to core (local rank
mod cores) by its launcher, under
the same malloc settings (compare_ddp.py's --malloc), and reports the
median step of its slowest rank. The table gives the median over the runs
of each configuration's step, and each ratio as the median of the per-run
ratios (the processes of a run ran back to back, so a machine that changes
speed for a minute moves all of them). Goals: lockstep FSDP / PyTorch FSDP2
at most 0.7; lockstep FSDP / lockstep DDP at most 1.25 at 2 ranks.

Needs PyTorch 2.6 or later for FSDP2 (torch.distributed.fsdp.fully_shard)
and lockstep built against the same libtorch (build-torch2).

Usage: bench/compare_fsdp.py [--runs 5] [--steps 15] [--ranks 2,4] [--build build-torch2]
           [--python PYTHON] [--malloc steady|default] [--out FILE]
"""
import argparse
import os
import statistics
import subprocess
import sys

from compare_ddp import malloc_environment, measure
from torch_peer import add_python_argument, missing_note, print_table, torch_version

MODEL = "deep-mlp"
CONTENDERS = ["lockstep FSDP", "PyTorch FSDP2", "lockstep DDP", "PyTorch DDP"]
# (numerator, denominator, goal or None): the table's ratio columns.
RATIOS = [("lockstep FSDP", "PyTorch FSDP2", "<= 0.7"),
          ("lockstep FSDP", "lockstep DDP", "<= 1.25 at 2 ranks"),
          ("PyTorch FSDP2", "PyTorch DDP", None)]


def has_fsdp2(python):
    probe = "from torch.distributed.fsdp import fully_shard"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


def configurations(args, ranks):
    """The command of each contender at `ranks` ranks."""
    here = os.path.dirname(os.path.abspath(__file__))
    steps = ["--model", MODEL, "--steps", str(args.steps)]
    lockstep = [os.path.join(args.build, "lockstep"), "run", "--nproc-per-node", str(ranks), "--",
                os.path.join(args.build, "examples", "ddp_throughput")] + steps
    pytorch = [args.python, os.path.join(here, "pytorch_ddp.py"), "-np", str(ranks)] + steps
    return {f"lockstep FSDP, {ranks} ranks": lockstep + ["--fsdp"],
            f"PyTorch FSDP2, {ranks} ranks": pytorch + ["--fsdp"],
            f"lockstep DDP, {ranks} ranks": lockstep,
            f"PyTorch DDP, {ranks} ranks": pytorch}


def table(samples, world_sizes):
    def ratio(a, b):  # median over the runs of run i's a / run i's b
        return statistics.median(x / y for x, y in zip(samples[a], samples[b]))

    head = "| ranks | " + " | ".join(f"{name} (ms)" for name in CONTENDERS) + " | " + " | ".join(
        f"{a} / {b}" + (f" (goal {goal})" if goal else "") for a, b, goal in RATIOS) + " |"
    lines = [head, "|" + "---|" * (1 + len(CONTENDERS) + len(RATIOS))]
    for n in world_sizes:
        med = [statistics.median(samples[f"{name}, {n} ranks"]) for name in CONTENDERS]
        ratios = [ratio(f"{a}, {n} ranks", f"{b}, {n} ranks") for a, b, _ in RATIOS]
        lines.append(f"| {n} | " + " | ".join(f"{m:.1f}" for m in med) + " | " +
                     " | ".join(f"{r:.2f}" for r in ratios) + " |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--ranks", default="2,4", help="comma-separated world sizes")
    parser.add_argument("--malloc", choices=["steady", "default"], default="steady",
                        help="steady: both sides keep the memory a step frees (compare_ddp.py); default: glibc's")
    parser.add_argument("--build", default="build-torch2")
    add_python_argument(parser)
    parser.add_argument("--out")
    args = parser.parse_args()
    peer_version = torch_version(args.python)
    if not peer_version:
        sys.exit(f"compare_fsdp: {missing_note(args.python)}")
    if not has_fsdp2(args.python):
        sys.exit(f"compare_fsdp: PyTorch {peer_version} ({args.python}) has no FSDP2 "
                 "(torch.distributed.fsdp.fully_shard, PyTorch 2.6 or later)")
    world_sizes = [int(n) for n in args.ranks.split(",")]
    configs = {}
    for n in world_sizes:
        configs.update(configurations(args, n))
    samples = measure(configs, args.runs, malloc_environment(args.malloc), MODEL)
    lines = [f"PyTorch {peer_version}, lockstep built in {args.build}, {len(os.sched_getaffinity(0))} cores, "
             f"malloc {args.malloc}.", "",
             f"Median of {args.runs} interleaved runs of {args.steps} steps each (a run's step: the median step of "
             "its slowest rank); deep-mlp (8 x Linear(1024, 1024)), batch 32 per rank, SGD, one intra-op thread "
             "per rank, each rank pinned to a core (local rank mod cores). Ratios are the median of the per-run "
             "ratios.", ""]
    lines += table(samples, world_sizes)
    lines += ["", "Per run (ms): " + "; ".join(f"{name} " + " ".join(f"{x:.1f}" for x in v)
                                             for name, v in samples.items()), ""]
    print_table(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
