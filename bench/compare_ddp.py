#!/usr/bin/python3
"""DDP step time: lockstep's DistributedDataParallel against PyTorch's (Gloo).

For each model (the 25M-parameter MLP and the Fashion-MNIST convnet) runs,
interleaved and repeated, on the same machine:
  - one process without communication (PyTorch, and lockstep's world of one),
  - 2 ranks synchronised and 2 ranks under no_sync, for lockstep (default
    and gradient_as_bucket_view) and for PyTorch DDP,
and reports median step times, weak-scaling efficiency (1-process step /
2-rank step), the exposed communication (step - no_sync step), and the
ratio lockstep / PyTorch, as markdown for docs/performance.md.

Usage: bench/compare_ddp.py [--runs 3] [--steps 20] [--build build] [--out FILE]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys


def step_ms(cmd, timeout=900):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    match = re.search(r"step_ms ([0-9.]+)", proc.stdout)
    if proc.returncode != 0 or not match:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-500:]}")
    return float(match.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--build", default="build")
    parser.add_argument("--out")
    args = parser.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    lockstep = os.path.join(args.build, "lockstep")
    example = os.path.join(args.build, "examples", "ddp_throughput")
    torch_ddp = ["/usr/bin/python3", os.path.join(here, "pytorch_ddp.py")]
    steps = ["--steps", str(args.steps)]

    def ours(np, *flags):
        return [lockstep, "run", "--nproc-per-node", str(np), "--", example] + list(flags) + steps

    lines = []
    for model in args.models.split(","):
        configs = {
            "PyTorch, 1 process": torch_ddp + ["--model", model, "-np", "1"] + steps,
            "PyTorch DDP, 2 ranks": torch_ddp + ["--model", model, "-np", "2"] + steps,
            "PyTorch DDP, 2 ranks, no_sync": torch_ddp + ["--model", model, "-np", "2", "--no-sync"] + steps,
            "PyTorch DDP, 2 ranks, bucket view": torch_ddp + ["--model", model, "-np", "2", "--bucket-view"] + steps,
            "lockstep, 1 process": ours(1, "--model", model),
            "lockstep DDP, 2 ranks": ours(2, "--model", model),
            "lockstep DDP, 2 ranks, no_sync": ours(2, "--model", model, "--no-sync"),
            "lockstep DDP, 2 ranks, bucket view": ours(2, "--model", model, "--bucket-view"),
        }
        samples = {name: [] for name in configs}
        for run in range(args.runs):
            for name, cmd in configs.items():
                samples[name].append(step_ms(cmd))
            print(f"# {model}: run {run + 1}/{args.runs} done", file=sys.stderr)
        med = {name: statistics.median(v) for name, v in samples.items()}
        lines += [f"### {model}", "",
                  f"Median of {args.runs} interleaved runs of {args.steps} steps each (the step time of a run is the "
                  "median step of its slowest rank); batch 64 per rank, SGD, one intra-op thread per rank, ranks "
                  "pinned one per core.", "",
                  "| configuration | step (ms) | weak-scaling efficiency | exposed communication (ms) |",
                  "|---|---|---|---|"]
        for name in configs:
            base = med["PyTorch, 1 process"] if name.startswith("PyTorch") else med["lockstep, 1 process"]
            eff = f"{base / med[name]:.2f}" if "2 ranks" in name else ""
            nosync = (med["PyTorch DDP, 2 ranks, no_sync"] if name.startswith("PyTorch")
                      else med["lockstep DDP, 2 ranks, no_sync"])
            exposed = f"{med[name] - nosync:.1f}" if "2 ranks" in name and "no_sync" not in name else ""
            lines.append(f"| {name} | {med[name]:.1f} | {eff} | {exposed} |")
        lines += ["", f"lockstep DDP / PyTorch DDP step time, 2 ranks: "
                      f"{med['lockstep DDP, 2 ranks'] / med['PyTorch DDP, 2 ranks']:.2f} (default), "
                      f"{med['lockstep DDP, 2 ranks, bucket view'] / med['PyTorch DDP, 2 ranks, bucket view']:.2f} "
                      "(both with gradient_as_bucket_view)", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
