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

--single measures one process only, three rows per model: PyTorch's plain
training loop (pytorch_ddp.py -np 1), lockstep's (ddp_throughput --no-ddp)
and lockstep's DDP in a world of one, each run starting one row further on,
and gives each ratio as the median of the per-run ratios (the three
processes of a run ran back to back, so a machine that changes speed for a
minute moves all three). On a 16-core machine --single --runs 5 --steps 10
takes about 90 s.

Both sides run one process per rank through a launcher that pins it to a
core (lockstep's through `lockstep run`, PyTorch's pins itself), and under
the same malloc settings (--malloc steady, the default): glibc returns the
top of its heap to the kernel when more than a threshold of it is free, and
whether a step's freed activations and gradients lie at the top depends on
what else the process allocated (a Python process's interpreter objects
may hold it, a C++ program's seldom do; and it moves from run to run), so
either side could fault tens of MiB back in on every step, and the other
not, by the accident of its heap.
`steady` sets the mmap and trim thresholds (GLIBC_TUNABLES) so that neither
does; --malloc default keeps glibc's defaults.

Usage: bench/compare_ddp.py [--runs 3] [--steps 20] [--build build] [--out FILE]
           [--ranks 2] [--bucket-view] [--python PYTHON] [--malloc steady|default]
       bench/compare_ddp.py --single --runs 5 --steps 10 --build build-gpu --python python3
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

from torch_peer import add_python_argument, missing_note, print_table, torch_version

# glibc's malloc keeps what a step frees: allocations up to 32 MiB (its
# largest mmap threshold; the MLP's gradients are 16 MiB each) come from the
# heap, and the heap is never trimmed. Setting either threshold turns off
# glibc's adaptive mmap threshold, so both are set.
STEADY_MALLOC = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=68719476736"


def malloc_environment(mode):
    """The environment every measured process runs in, the same for both sides."""
    env = dict(os.environ)
    if mode == "steady":
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES"), STEADY_MALLOC]))
    return env


def step_ms(cmd, timeout=900, env=None):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
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


def measure(configs, runs, env, model):
    """Per configuration, the step time of each run; run r starts r rows further
    on, so no configuration always follows the same one."""
    names = list(configs)
    samples = {name: [] for name in names}
    for run in range(runs):
        shift = run % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(step_ms(configs[name], env=env))
            print(f"# {model}, {name}: {samples[name][-1]:.1f} ms", file=sys.stderr, flush=True)
        print(f"# {model}: run {run + 1}/{runs} done", file=sys.stderr)
    return samples


def single_table(model, samples, runs, steps, malloc):
    """The one-process rows: PyTorch's plain loop, lockstep's, lockstep's DDP at world 1."""
    names = list(samples)  # PyTorch, lockstep --no-ddp, lockstep DDP world 1

    def ratio(a, b):  # median over the runs of run i's a / run i's b
        return statistics.median(x / y for x, y in zip(samples[a], samples[b]))

    med = {name: statistics.median(v) for name, v in samples.items()}
    return [f"### {model}, one process", "",
            f"Median of {runs} interleaved runs of {steps} steps each; batch 64, SGD, one intra-op thread, "
            f"pinned to one core, malloc {malloc}. Ratios are the median of the per-run ratios.", "",
            "| PyTorch plain loop (ms) | lockstep --no-ddp (ms) | lockstep DDP, world of 1 (ms) "
            "| --no-ddp / PyTorch | DDP world 1 / PyTorch | DDP world 1 / --no-ddp |",
            "|---|---|---|---|---|---|",
            f"| {med[names[0]]:.1f} | {med[names[1]]:.1f} | {med[names[2]]:.1f} | {ratio(names[1], names[0]):.3f} "
            f"| {ratio(names[2], names[0]):.3f} | {ratio(names[2], names[1]):.3f} |",
            "", "Per run (ms): " + "; ".join(f"{name} " + " ".join(f"{x:.1f}" for x in v)
                                           for name, v in samples.items()), ""]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--ranks", default="2", help="comma-separated world sizes, e.g. 1,2,4,8,16")
    parser.add_argument("--bucket-view", action="store_true",
                        help="also measure both with gradient_as_bucket_view")
    parser.add_argument("--single", action="store_true",
                        help="one process only: PyTorch's plain loop, lockstep's, lockstep's DDP at world 1")
    parser.add_argument("--malloc", choices=["steady", "default"], default="steady",
                        help="steady: both sides keep the memory a step frees (see above); default: glibc's")
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
    env = malloc_environment(args.malloc)
    steps = ["--steps", str(args.steps)]
    world_sizes = [int(n) for n in args.ranks.split(",")]
    variants = [("", [])] + ([(", bucket view", ["--bucket-view"])] if args.bucket_view else [])

    def ours(np, *flags):
        return [lockstep, "run", "--nproc-per-node", str(np), "--", example] + list(flags) + steps

    lines = [f"PyTorch {peer_version}, lockstep built in {args.build}, {len(os.sched_getaffinity(0))} cores, "
             f"malloc {args.malloc}.", ""]
    for model in args.models.split(","):
        # The single-process baselines: both without DDP, each pinned by its
        # launcher; then for each world size and variant: synchronised and
        # under no_sync, for both.
        configs = {
            "PyTorch, 1 process": torch_ddp + ["--model", model, "-np", "1"] + steps,
            "lockstep, 1 process": ours(1, "--model", model, "--no-ddp"),
        }
        if args.single:
            configs["lockstep DDP, world of 1"] = ours(1, "--model", model)
            lines += single_table(model, measure(configs, args.runs, env, model), args.runs, args.steps, args.malloc)
            continue
        for np in world_sizes:
            if np == 1:
                continue
            for suffix, flags in variants:
                for sync in ("", ", no_sync"):
                    extra = flags + (["--no-sync"] if sync else [])
                    configs[f"PyTorch DDP, {np} ranks{suffix}{sync}"] = (
                        torch_ddp + ["--model", model, "-np", str(np)] + extra + steps)
                    configs[f"lockstep DDP, {np} ranks{suffix}{sync}"] = ours(np, "--model", model, *extra)
        samples = measure(configs, args.runs, env, model)
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
