#!/usr/bin/python3
"""`lockstep simulate --strategy fsdp` against measurement: predict the
fully sharded step first, then run it, on this machine and (with
--cluster-rates, as root) on the emulated cluster of tests/netns/cluster.sh
(hosts as network namespaces joined by links shaped with tc, one rank per
host over tcp, each host pinned to its share of the cores).

1. Calibrates the two collectives a fully sharded step uses with `lockstep
   simulate --calibrate` from `lockstep bench --op allgather` and `--op
   reduce_scatter` (ordinary buffers, as fully_shard's, 256 KiB to 64 MiB
   in steps of sqrt(2)) beside the all-reduce: on this machine at
   --bench-ranks ranks over shm, on the cluster one rank per host over tcp.
   With --busy N the two are measured again with N processes spinning
   beside the ranks (`lockstep bench --busy N`; on the cluster N on each
   host): their rate beside compute,
   which a second calibration adds, so that every configuration is
   predicted both ways from the same profiles.
2. Profiles each configuration's compute with LOCKSTEP_TRACE
   (examples/ddp_throughput --fsdp, resharding or not as it will run,
   --profile-repeats runs of twice --steps steps): each unit's own forward
   and backward compute and the time between steps, on N ranks placed as
   they will be when measured (fully_shard's timeline; docs/fsdp.md).
3. Predicts with `lockstep simulate --sharded-trace <rank 0's trace of
   every profiled run> --cluster <calibration> --world-sizes N`, for
   resharding after forward and without it: the step of the median run and
   the interval over the runs. Writes every prediction down before anything
   is measured.
4. Runs every configuration --repeats times, interleaved, and compares the
   median measured step with the prediction and its interval.

With --random N (and --seed S) it validates instead N distinct
configurations drawn at random from every combination of the model
(--models), the batch per rank (--batches), the world size (--ranks; on the
cluster, --hosts) and whether units reshard after forward; each is profiled
as above, and the draw is written down with the predictions.

Prints a markdown table (for docs/performance.md) with each error and the
mean absolute error; the files are kept in --out.

Usage: bench/validate_simulate_fsdp.py [--build build-torch2] [--ranks 2,4] [--model deep-mlp]
           [--steps 15] [--repeats 3] [--profile-repeats 3] [--bench-ranks 2] [--busy 2] [--out DIR]
       bench/validate_simulate_fsdp.py --random 6 --seed 20261203 --ranks 2,3,4
           [--models mlp,deep-mlp] [--batches 16,32,64] ...
       sudo bench/validate_simulate_fsdp.py --no-local --cluster-rates 1gbit,10gbit [--hosts 2] ...
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

from compare_cluster import OneRankPerHost


def run(cmd, env=None, timeout=900):
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout + done.stderr


def step_ms(text):
    return float(re.search(r"step_ms ([0-9.]+)", text).group(1))


def after_forward(reshard):
    return "resharded" if reshard else "kept"


def configurations(a, worlds):
    """(model, batch or None for the program's default, ranks, reshard) of each
    configuration: every world size both ways, or --random ones from --seed."""
    if not a.random:
        return [(a.model, None, n, reshard) for n in worlds for reshard in (True, False)]
    rng = random.Random(a.seed)
    models, batches = a.models.split(","), [int(b) for b in a.batches.split(",")]
    every = [(m, b, n, r) for m in models for b in batches for n in worlds for r in (True, False)]
    return rng.sample(every, min(a.random, len(every)))


def bench_args(op):
    return ["--op", op, "-b", "256K", "-e", "64M", "-f", "1.41421356", "-n", "10", "-w", "3"]


class ThisMachine:
    """Every rank on this machine, over shm."""

    def __init__(self, a):
        self.a = a
        self.name = "this machine"
        self.tag = "local"
        self.local = True
        self.worlds = [int(n) for n in a.ranks.split(",")]
        self.ranks_per_host = max(self.worlds)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def run_ranks(self, n, program, env=None):
        return run([os.path.join(self.a.build, "lockstep"), "run", "--nproc-per-node", str(n), "--"] + program, env=env)

    def bench(self, flags, busy=0):
        run([os.path.join(self.a.build, "lockstep"), "bench", "--np", str(self.a.bench_ranks), "--backend", "shm"] +
            flags + (["--busy", str(busy)] if busy else []))


class EmulatedCluster(OneRankPerHost):
    """One rank per host on the emulated cluster, over tcp across the shaped
    links."""

    def __init__(self, a, rate):
        super().__init__(a, rate)
        self.worlds = [a.hosts]


def validate(a, place):
    """Calibrates, profiles, predicts and measures on `place`: the table's
    rows, the absolute errors, and how many measured steps fell inside their
    intervals."""
    out = os.path.join(a.out, place.tag)
    os.makedirs(out, exist_ok=True)
    lockstep = os.path.join(a.build, "lockstep")
    configs = configurations(a, place.worlds)

    def program(model, batch):
        return ([os.path.join(a.build, "examples", "ddp_throughput"), "--model", model, "--fsdp"] +
                ([] if batch is None else ["--batch", str(batch)]))

    def keep_flag(reshard):
        return [] if reshard else ["--keep-after-forward"]

    # 1. Calibration: the all-reduce and the two halves a sharded step uses,
    # idle, and with --busy the two halves beside compute as well.
    def calibrate(paths, where):
        print(run([lockstep, "simulate", "--calibrate", ",".join(paths), "--ranks-per-host",
                   str(place.ranks_per_host), "--out", where]).strip(), file=sys.stderr)
        return os.path.join(where, "cluster.json")

    bench = []
    for op in ("allreduce", "allgather", "reduce_scatter"):
        path = os.path.join(out, f"bench-{op}.json")
        place.bench(bench_args(op) + ["--json", path])
        bench.append(path)
    clusters = [calibrate(bench, out)]
    if a.busy:
        busy = []
        for op in ("allgather", "reduce_scatter"):
            path = os.path.join(out, f"bench-{op}-busy{a.busy}.json")
            place.bench(bench_args(op) + ["--json", path], busy=a.busy)
            busy.append(path)
        clusters.append(calibrate(bench + busy, os.path.join(out, "beside-compute")))

    # 2. Profiles: the compute of each configuration, traced as it will run
    # (resharding or not), every run kept.
    traces = {}
    for model, batch, n, reshard in configs:
        if (model, batch, n, reshard) in traces:
            continue
        runs = []
        for repeat in range(a.profile_repeats):
            prefix = os.path.join(out, f"profile-{model}-{batch or 'default'}-{n}ranks-{after_forward(reshard)}-{repeat}")
            place.run_ranks(n, program(model, batch) + ["--steps", str(2 * a.steps)] + keep_flag(reshard),
                            env=dict(os.environ, LOCKSTEP_TRACE=prefix))
            runs.append(prefix + ".rank0.json")
        traces[(model, batch, n, reshard)] = ",".join(runs)

    # 3. Predictions, all before the first measured run: one per calibration
    # (idle; beside compute).
    predicted = []
    for i, (model, batch, n, reshard) in enumerate(configs):
        ways = []
        for c, cluster in enumerate(clusters):
            path = os.path.join(out, f"predict-{i}-{model}-{batch or 'default'}-{n}-{after_forward(reshard)}-{c}.json")
            run([lockstep, "simulate", "--sharded-trace", traces[(model, batch, n, reshard)], "--cluster", cluster,
                 "--world-sizes", str(n), "--ranks-per-host", str(place.ranks_per_host),
                 "--out", os.path.join(out, "simulate"), "--json", path] +
                ([] if reshard else ["--no-reshard-after-forward"]))
            with open(path) as f:
                ways.append(json.load(f)["fsdp"]["predictions"][0])
        predicted.append(ways)
    with open(os.path.join(out, "predictions.json"), "w") as f:
        json.dump({"where": place.name, "seed": a.seed if a.random else None, "clusters": clusters,
                   "configs": [{"model": m, "batch": b, "ranks": n, "reshard_after_forward": r, "predicted": p}
                               for (m, b, n, r), p in zip(configs, predicted)]}, f, indent=1)

    # 4. Measurements, interleaved.
    measured = [[] for _ in configs]
    for _ in range(a.repeats):
        for i, (model, batch, n, reshard) in enumerate(configs):
            text = place.run_ranks(n, program(model, batch) + ["--steps", str(a.steps)] + keep_flag(reshard))
            measured[i].append(step_ms(text))
    rows, errors, inside = [], [[] for _ in clusters], [0 for _ in clusters]
    for (model, batch, n, reshard), ways, runs in zip(configs, predicted, measured):
        step = statistics.median(runs)
        cells = []
        for c, q in enumerate(ways):
            p = q["step_ms"]
            errors[c].append(abs(p - step) / step)
            inside[c] += q["step_ms_low"] <= step <= q["step_ms_high"]
            cells.append(f"{p:.1f} | {q['step_ms_low']:.1f} to {q['step_ms_high']:.1f} | {100 * (p - step) / step:+.0f}%")
        rows.append(f"| {place.name} | {model} | {batch or 'default'} | {n} | {after_forward(reshard)} | "
                    f"{step:.1f} | " + " | ".join(cells) + " |")
    return rows, errors, inside


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build-torch2")
    parser.add_argument("--ranks", default="2,4", help="world sizes on this machine")
    parser.add_argument("--model", default="deep-mlp")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile-repeats", type=int, default=3)
    parser.add_argument("--bench-ranks", type=int, default=2)
    parser.add_argument("--busy", type=int, default=0,
                        help="also calibrate the collectives beside compute with this many spinning processes "
                             "(lockstep bench --busy) and predict both ways")
    parser.add_argument("--out", default=None)
    parser.add_argument("--random", type=int, default=0,
                        help="validate this many configurations drawn at random instead")
    parser.add_argument("--seed", type=int, default=1, help="the draw of --random")
    parser.add_argument("--models", default="mlp,deep-mlp", help="models --random draws from")
    parser.add_argument("--batches", default="16,32,64", help="batches per rank --random draws from")
    parser.add_argument("--local", action=argparse.BooleanOptionalAction, default=True,
                        help="validate on this machine (default on)")
    parser.add_argument("--cluster-rates", default="",
                        help="also validate on the emulated cluster at these link rates, e.g. 1gbit,10gbit (root)")
    parser.add_argument("--hosts", type=int, default=2, help="hosts of the emulated cluster (one rank each)")
    a = parser.parse_args()
    a.build = os.path.abspath(a.build)
    a.out = os.path.abspath(a.out or tempfile.mkdtemp(prefix="validate-fsdp-"))
    rates = [r for r in a.cluster_rates.split(",") if r]
    if rates and os.geteuid() != 0:
        print("--cluster-rates needs root (network namespaces and tc)", file=sys.stderr)
        return 77

    ways = ["idle"] + ([f"beside compute (--busy {a.busy})"] if a.busy else [])
    rows, errors, inside = [], [[] for _ in ways], [0 for _ in ways]
    places = ([ThisMachine(a)] if a.local else []) + [EmulatedCluster(a, rate) for rate in rates]
    for place in places:
        with place:
            r, e, i = validate(a, place)
        rows += r
        errors = [mine + theirs for mine, theirs in zip(errors, e)]
        inside = [mine + theirs for mine, theirs in zip(inside, i)]
    columns = "".join(f" predicted, {w} (ms) | interval over the profiled runs (ms) | error |" for w in ways)
    print("| where | model | batch | ranks | after forward | measured step (ms) |" + columns)
    print("|---|---|---|---|---|---|" + "---|---|---|" * len(ways))
    print("\n".join(rows))
    print()
    for w, e, i in zip(ways, errors, inside):
        print(f"{f'seed {a.seed}, ' if a.random else ''}calibrated {w}: measured inside the interval {i} of "
              f"{len(rows)}; mean absolute error {100 * statistics.mean(e):.0f}%, largest {100 * max(e):.0f}%")
    print(f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"{time.strftime('%Y-%m-%d %H:%M')}; files in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
