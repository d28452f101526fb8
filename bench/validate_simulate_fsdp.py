#!/usr/bin/python3
"""`lockstep simulate --strategy fsdp` against measurement on this machine:
predict the fully sharded step first, then run it.

1. Calibrates the two collectives a fully sharded step uses with `lockstep
   simulate --calibrate` from `lockstep bench --op allgather` and `--op
   reduce_scatter` (ordinary buffers, as fully_shard's, at --bench-ranks
   ranks over shm, 256 KiB to 64 MiB in steps of sqrt(2)) beside the
   all-reduce.
2. Profiles each configuration's compute with LOCKSTEP_TRACE
   (examples/ddp_throughput --fsdp, resharding or not as it will run,
   --profile-repeats runs of twice --steps steps): each unit's own forward
   and backward compute and the time between steps, on N ranks sharing
   the machine as they will when measured (fully_shard's timeline;
   docs/fsdp.md).
3. Predicts with `lockstep simulate --sharded-trace <rank 0's trace of
   every profiled run> --cluster <calibration> --world-sizes N`, for
   resharding after forward and without it: the step of the median run and
   the interval over the runs. Writes every prediction down before anything
   is measured.
4. Runs every configuration --repeats times, interleaved, and compares the
   median measured step with the prediction and its interval.

With --random N (and --seed S) it validates instead N distinct
configurations drawn at random from every combination of the model
(--models), the batch per rank (--batches), the world size (--ranks) and
whether units reshard after forward; each is profiled as above, and the
draw is written down with the predictions.

Prints a markdown table (for docs/performance.md) with each error and the
mean absolute error; the files are kept in --out.

Usage: bench/validate_simulate_fsdp.py [--build build-torch2] [--ranks 2,4] [--model deep-mlp]
           [--steps 15] [--repeats 3] [--profile-repeats 3] [--bench-ranks 2] [--out DIR]
       bench/validate_simulate_fsdp.py --random 6 --seed 20261203 --ranks 2,3,4
           [--models mlp,deep-mlp] [--batches 16,32,64] ...
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def run(cmd, env=None, timeout=900):
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout + done.stderr


def step_ms(text):
    return float(re.search(r"step_ms ([0-9.]+)", text).group(1))


def keep_flag(reshard):
    return [] if reshard else ["--keep-after-forward"]


def configurations(a, worlds):
    """(model, batch or None for the program's default, ranks, reshard) of each
    configuration: every world size both ways, or --random ones from --seed."""
    if not a.random:
        return [(a.model, None, n, reshard) for n in worlds for reshard in (True, False)]
    import random
    rng = random.Random(a.seed)
    models, batches = a.models.split(","), [int(b) for b in a.batches.split(",")]
    every = [(m, b, n, r) for m in models for b in batches for n in worlds for r in (True, False)]
    return rng.sample(every, min(a.random, len(every)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build-torch2")
    parser.add_argument("--ranks", default="2,4", help="world sizes on this machine")
    parser.add_argument("--model", default="deep-mlp")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile-repeats", type=int, default=3)
    parser.add_argument("--bench-ranks", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--random", type=int, default=0,
                        help="validate this many configurations drawn at random instead")
    parser.add_argument("--seed", type=int, default=1, help="the draw of --random")
    parser.add_argument("--models", default="mlp,deep-mlp", help="models --random draws from")
    parser.add_argument("--batches", default="16,32,64", help="batches per rank --random draws from")
    a = parser.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="validate-fsdp-")
    os.makedirs(out, exist_ok=True)
    lockstep = os.path.join(a.build, "lockstep")
    worlds = [int(n) for n in a.ranks.split(",")]
    configs = configurations(a, worlds)

    def program(model, batch):
        return ([os.path.join(a.build, "examples", "ddp_throughput"), "--model", model, "--fsdp"] +
                ([] if batch is None else ["--batch", str(batch)]))

    def ranks(n, args, env=None):
        return run([lockstep, "run", "--nproc-per-node", str(n), "--"] + args, env=env)

    # 1. Calibration: the all-reduce and the two halves a sharded step uses.
    bench = []
    for op in ("allreduce", "allgather", "reduce_scatter"):
        path = os.path.join(out, f"bench-{op}.json")
        run([lockstep, "bench", "--np", str(a.bench_ranks), "--backend", "shm", "--op", op, "-b", "256K", "-e", "64M",
             "-f", "1.41421356", "-n", "10", "-w", "3", "--json", path])
        bench.append(path)
    print(run([lockstep, "simulate", "--calibrate", ",".join(bench), "--out", out]).strip(), file=sys.stderr)
    cluster = os.path.join(out, "cluster.json")

    # 2. Profiles: the compute of each configuration, traced as it will run
    # (resharding or not), every run kept.
    traces = {}
    for model, batch, n, reshard in configs:
        if (model, batch, n, reshard) in traces:
            continue
        runs = []
        for repeat in range(a.profile_repeats):
            prefix = os.path.join(out, f"profile-{model}-{batch or 'default'}-{n}ranks-"
                                       f"{'reshard' if reshard else 'keep'}-{repeat}")
            ranks(n, program(model, batch) + ["--steps", str(2 * a.steps)] + keep_flag(reshard),
                  env=dict(os.environ, LOCKSTEP_TRACE=prefix))
            runs.append(prefix + ".rank0.json")
        traces[(model, batch, n, reshard)] = ",".join(runs)

    # 3. Predictions, all before the first measured run.
    predicted = []
    for i, (model, batch, n, reshard) in enumerate(configs):
        path = os.path.join(out, f"predict-{i}-{model}-{batch or 'default'}-{n}-{'reshard' if reshard else 'keep'}.json")
        run([lockstep, "simulate", "--sharded-trace", traces[(model, batch, n, reshard)], "--cluster", cluster,
             "--world-sizes", str(n), "--ranks-per-host", str(max(worlds)), "--out", os.path.join(out, "simulate"),
             "--json", path] + ([] if reshard else ["--no-reshard-after-forward"]))
        with open(path) as f:
            predicted.append(json.load(f)["fsdp"]["predictions"][0])
    with open(os.path.join(out, "predictions.json"), "w") as f:
        json.dump({"seed": a.seed if a.random else None,
                   "configs": [{"model": m, "batch": b, "ranks": n, "reshard_after_forward": r, "predicted": p}
                               for (m, b, n, r), p in zip(configs, predicted)]}, f, indent=1)

    # 4. Measurements, interleaved.
    measured = [[] for _ in configs]
    for _ in range(a.repeats):
        for i, (model, batch, n, reshard) in enumerate(configs):
            measured[i].append(step_ms(ranks(n, program(model, batch) + ["--steps", str(a.steps)] + keep_flag(reshard))))
    print("| model | batch | ranks | after forward | predicted step (ms) | interval over the profiled runs (ms) "
          "| measured step (ms) | error |")
    print("|---|---|---|---|---|---|---|---|")
    errors = []
    inside = 0
    for (model, batch, n, reshard), q, runs in zip(configs, predicted, measured):
        step = statistics.median(runs)
        p = q["step_ms"]
        errors.append(abs(p - step) / step)
        inside += q["step_ms_low"] <= step <= q["step_ms_high"]
        print(f"| {model} | {batch or 'default'} | {n} | {'resharded' if reshard else 'kept'} | {p:.1f} | "
              f"{q['step_ms_low']:.1f} to {q['step_ms_high']:.1f} | {step:.1f} | {100 * (p - step) / step:+.0f}% |")
    print(f"\n{f'seed {a.seed}, ' if a.random else ''}measured inside the interval {inside} of {len(configs)}; "
          f"mean absolute error {100 * statistics.mean(errors):.0f}%, largest {100 * max(errors):.0f}%; "
          f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"{time.strftime('%Y-%m-%d %H:%M')}; files in {out}")


if __name__ == "__main__":
    main()
