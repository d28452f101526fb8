#!/usr/bin/python3
"""DDP on one GPU: lockstep's DistributedDataParallel against PyTorch's, and
each against its own plain training loop, precisely enough to resolve a few
percent.

Six rows, the same model (default wide-mlp: 6 x Linear(4096, 4096), MSE loss,
SGD), batch per rank and steps in each:
  lockstep, no DDP                    examples/ddp_throughput --no-ddp
  lockstep DDP, 1 rank                the same step under lockstep's DDP, world of one
  lockstep DDP, 2 ranks               two processes sharing the GPU (default
                                      backend: shm, the buckets staged through
                                      pinned host memory)
  PyTorch, no DDP                     bench/pytorch_ddp.py -np 1
  PyTorch DDP nccl, 1 rank            PyTorch's DDP over NCCL, world of one
  PyTorch DDP gloo, 2 ranks           two processes sharing the GPU, Gloo on CUDA tensors
With --lockstep-torch DIR (where lockstep's torch.distributed package, built
for CUDA, is importable), two rows more: PyTorch's own DDP over the backend
"lockstep" in a world of one and with 2 ranks sharing the GPU, each compared
with PyTorch's DDP over NCCL and over Gloo in the same places.
Every configuration is a fresh process (or pair) per run, and the runs are
interleaved: run 1 of every row, then run 2 of every row (each starting one
row further on), and so on, so that a drift of the machine (clocks,
temperature, other load) spreads over all rows instead of landing on one. The
table gives per row the median over the runs of each run's median step, the
spread (max / min - 1 over the runs) and the overhead against the plain loop of
the same library doing the same work (ranks x its step: ranks sharing a GPU
each compute a full batch on it).

Usage: bench/compare_gpu_ddp.py --build build-gpu --python python3 [--runs 5]
           [--steps 10] [--warmup 3] [--model wide-mlp] [--batch N] [--out FILE]
           [--lockstep-torch build-gpu/python]
       bench/compare_gpu_ddp.py --device cpu --runs 2 --steps 3 --batch 4   # checks the driver on a CPU
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys

from compare_ddp import step_ms
from torch_peer import add_python_argument, missing_note, print_table

# ddp_throughput's and pytorch_ddp.py's default batch per rank; the driver
# always passes one, so both sides train on the same.
DEFAULT_BATCH = {"wide-mlp": 2048, "mlp": 64, "convnet": 64}


def peer_torch(python):
    """(torch.__version__, the name of cuda:0 or None) as that python's PyTorch
    sees them, or (None, None) when it has no torch.distributed: one import of
    PyTorch, which takes seconds, rather than torch_peer.torch_version's and
    another."""
    proc = subprocess.run([python, "-c", "import torch.distributed, torch; print(torch.__version__); "
                           "print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None, None
    version, gpu = (proc.stdout.splitlines() + ["", ""])[:2]
    return version.strip(), gpu.strip() or None


def variants(args, lockstep, example, torch_ddp):
    """The rows: name -> (command, ranks on the device, library, environment or None)."""
    common = ["--model", args.model, "--batch", str(args.batch), "--steps", str(args.steps),
              "--warmup", str(args.warmup), "--device", args.device]
    # NCCL is the backend PyTorch users run on a GPU; it takes no CPU tensors.
    one_rank_backend = "nccl" if args.device == "cuda" else "gloo"
    shared = " sharing the GPU" if args.device == "cuda" else ""

    def ours(np, *flags):
        return [lockstep, "run", "--nproc-per-node", str(np), "--", example] + common + list(flags)

    def theirs(np, *flags):
        return torch_ddp + ["-np", str(np)] + common + list(flags)

    rows = {
        "lockstep, no DDP": (ours(1, "--no-ddp"), 1, "lockstep", None),
        "lockstep DDP, 1 rank": (ours(1), 1, "lockstep", None),
        f"lockstep DDP, 2 ranks{shared}": (ours(2), 2, "lockstep", None),
        "PyTorch, no DDP": (theirs(1), 1, "PyTorch", None),
        f"PyTorch DDP {one_rank_backend}, 1 rank": (theirs(1, "--ddp", "--backend", one_rank_backend), 1, "PyTorch", None),
        f"PyTorch DDP gloo, 2 ranks{shared}": (theirs(2, "--backend", "gloo"), 2, "PyTorch", None),
    }
    if args.lockstep_torch:
        # PyTorch's own DDP, its buckets all-reduced by lockstep's backend: the
        # plain loop it is measured against is PyTorch's.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [os.path.abspath(args.lockstep_torch), os.environ.get("PYTHONPATH")])))
        rows["PyTorch DDP over lockstep, 1 rank"] = (theirs(1, "--ddp", "--backend", "lockstep"), 1, "PyTorch", env)
        rows[f"PyTorch DDP over lockstep, 2 ranks{shared}"] = (theirs(2, "--backend", "lockstep"), 2, "PyTorch", env)
    return rows


def compared_with(configs):
    """Row -> the row its last column divides by: lockstep's three rows by
    PyTorch's matching three, PyTorch's DDP over lockstep by PyTorch's DDP
    over its own backends at the same world size."""
    names = list(configs)
    pairs = dict(zip(names[:3], names[3:6]))
    pairs.update(zip(names[6:], names[4:6]))
    return pairs


def measure(configs, runs):
    """Per row, the step time of each run, the runs interleaved (see the
    module's text), and per row that failed, why: the first failure drops
    the row from later runs, so that the other rows are still measured."""
    names = list(configs)
    samples = {name: [] for name in names}
    failed = {}
    for run in range(runs):
        shift = run % len(names)
        for name in names[shift:] + names[:shift]:
            if name in failed:
                continue
            command, _, _, env = configs[name]
            try:
                samples[name].append(step_ms(command, env=env))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                lines = [line.strip() for line in str(e).splitlines() if line.strip()]
                failed[name] = (lines[-1] if lines else type(e).__name__).replace("|", "/")
                print(f"# run {run + 1}/{runs}, {name}: FAILED: {e}", file=sys.stderr, flush=True)
                continue
            print(f"# run {run + 1}/{runs}, {name}: {samples[name][-1]:.2f} ms", file=sys.stderr, flush=True)
    return samples, failed


def table(configs, samples, failed):
    plain = {configs[name][2]: statistics.median(samples[name]) for name in configs
             if name.endswith("no DDP") and samples[name]}
    pairs = compared_with(configs)
    lines = ["| variant | median step (ms) | min–max (ms) | spread | vs plain loop | lockstep / PyTorch |",
             "|---|---|---|---|---|---|"]
    for name, (_, ranks, library, _) in configs.items():
        v = samples[name]
        if name in failed:
            lines.append(f"| {name} | failed: {failed[name]} | | | | |")
            continue
        med = statistics.median(v)
        vs_plain = ("baseline" if name.endswith("no DDP") else
                    f"{100 * (med / (ranks * plain[library]) - 1):+.1f}%" if library in plain else "")
        ratio = (f"{med / statistics.median(samples[pairs[name]]):.3f}"
                 if name in pairs and samples[pairs[name]] else "")
        lines.append(f"| {name} | {med:.2f} | {min(v):.2f}–{max(v):.2f} | {100 * (max(v) / min(v) - 1):.1f}% "
                     f"| {vs_plain} | {ratio} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build", help="lockstep's build directory (lockstep, examples/ddp_throughput)")
    add_python_argument(parser)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda (the benchmark); cpu runs the same rows on the CPU, to check the driver")
    parser.add_argument("--model", choices=list(DEFAULT_BATCH), default="wide-mlp")
    parser.add_argument("--batch", type=int, help="samples per rank per step (default: the model's, wide-mlp 2048)")
    parser.add_argument("--runs", type=int, default=5, help="interleaved runs of every row (5 or more to compare)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first in each run")
    parser.add_argument("--out", help="also write the markdown there")
    parser.add_argument("--lockstep-torch", metavar="DIR",
                        help="where lockstep_torch (python/, built for CUDA) is importable: adds PyTorch's DDP "
                             "over the backend lockstep at 1 and 2 ranks")
    args = parser.parse_args()
    for name in ("batch", "runs", "steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be 1 or more, not {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, not {args.warmup}")
    args.batch = args.batch or DEFAULT_BATCH[args.model]
    args.python = shutil.which(args.python) or args.python  # --python python3: the one on the PATH

    here = os.path.dirname(os.path.abspath(__file__))
    lockstep = os.path.join(args.build, "lockstep")
    example = os.path.join(args.build, "examples", "ddp_throughput")
    for program in (lockstep, example):
        if not os.access(program, os.X_OK):
            sys.exit(f"compare_gpu_ddp: no {program}: build it first "
                     f"(cmake --build {args.build} --target lockstep_cli ddp_throughput)")
    peer_version, gpu = peer_torch(args.python) if os.access(args.python, os.X_OK) else (None, None)
    if not peer_version:
        sys.exit(f"compare_gpu_ddp: {missing_note(args.python)}")
    if args.device == "cuda":
        if not gpu:
            sys.exit(f"compare_gpu_ddp: --device cuda, but PyTorch {peer_version} ({args.python}) sees no CUDA "
                     "device: this benchmark needs a GPU (--device cpu runs the same rows on the CPU, which "
                     "checks the driver but measures nothing of the GPU path)")
    else:
        gpu = "the CPU"

    configs = variants(args, lockstep, example, [args.python, os.path.join(here, "pytorch_ddp.py")])
    samples, failed = measure(configs, args.runs)
    lines = [f"PyTorch {peer_version}, lockstep built in {args.build}, on {gpu}; model {args.model}, batch "
             f"{args.batch} per rank, SGD; per run {args.warmup} warm-up and {args.steps} timed steps, the run's "
             f"step the median of its slowest rank; median of {args.runs} interleaved runs. vs plain loop = step / "
             "(ranks x the same library's step without DDP) - 1; spread = max / min - 1 over the runs.", ""]
    lines += table(configs, samples, failed)
    print_table(lines, args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
