#!/usr/bin/python3
"""`lockstep simulate` against measurement: predict first, then run.

On this machine (always) and on the emulated cluster of
tests/netns/cluster.sh (with --cluster-rates, as root: hosts as network
namespaces, each link shaped with tc tbf, each host's rank pinned to its
share of the cores), for every place:

1. Calibrates the all-reduce with `lockstep simulate --calibrate` from
   `lockstep bench` (256 KiB to 128 MiB in steps of sqrt(2)): here
   `-np N --shared-buffers` over shm (shared buffers because DDP's buckets
   are), on the cluster `--backend tcp` with one rank per host, across the
   shaped links.
2. Profiles each model with LOCKSTEP_TRACE (examples/ddp_throughput, twice
   --steps steps, medians): once on one rank at the default bucket cap (the
   bucket timeline; on the cluster, alone on host 0), and on N ranks under
   no_sync (compute while the ranks share the machine, without
   communication, and how much it varies from rank to rank and step to
   step).
3. Predicts, with `lockstep simulate --trace ... --cluster ...` (and
   `--compute-trace` and `--jitter-from` for the N-rank compute and its
   spread, which makes stragglers), the step time of every
   configuration (model x world size x bucket cap) and writes the
   predictions down before any configuration of that place is measured.
4. Runs every configuration (under `lockstep run`, across the hosts on the
   cluster) and compares the measured median step time with the prediction.

Prints a markdown table per place (for docs/performance.md) with the mean
and the largest absolute error, and the mean over all places; the files are
kept in --out.

With --random N (and --seed S) it validates instead N configurations drawn
at random on this machine, at --bench-ranks ranks over shm (or at a
world size drawn from --random-ranks, e.g. 2,3,4: more ranks than cores,
each world calibrated and profiled at its own size), and with
--cluster-rates (as root) the same draw on the emulated cluster, one rank
per host over tcp (--no-local: only there): model, batch per rank, bucket
cap, hook (none, fp16, bf16) and gradient_as_bucket_view. It follows
docs/scaling.md's quick start: one calibration from `lockstep bench --json`
in fp32 on shared buffers, in place and out of place
(--out-of-place: the default reducer's all-reduce), and in half and bfloat16
on ordinary buffers (the hooks' own memory); for every (model, batch) drawn,
a one-rank trace (the buckets) and an N-rank no_sync trace (the compute),
given with --trace-batch; every one of the --profile-repeats no_sync runs
is a --compute-trace, so each prediction carries the range of the steps
predicted from each run's compute (the table's interval, and how many
measured steps fell inside it). Every configuration is predicted before any is
measured (predictions-<time>.json), then each is measured --repeats times,
interleaved; it prints the table, the mean and largest error, and the
signed error per value of each option, so that a term charged in the wrong
direction shows.

Usage: bench/validate_simulate.py --random 12 --seed 7 [--steps 10] [--repeats 3] [--random-ranks 2,3,4]
           [--cluster-rates 1gbit,10gbit [--no-local]]
       bench/validate_simulate.py [--build build] [--ranks 1,2] [--caps 1,5,25,100]
           [--models mlp,convnet] [--steps 15] [--repeats 3] [--bench-ranks 2]
           [--calibrate-min-bytes 8M] [--profile-repeats 3] [--cluster-rates 1gbit,10gbit] [--hosts 2]
           [--cluster-caps 5,25,100] [--local/--no-local] [--out DIR]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

from compare_cluster import OneRankPerHost


def run(cmd, env=None, timeout=900):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-800:]}\n{proc.stderr[-800:]}")
    return proc.stdout


def parse_caps(text):
    """Bucket caps in MB as given ("1,5,25" or "0.5"), for the command lines."""
    return [float(c) if "." in c else int(c) for c in text.split(",")]


def bench_sizes():
    return ["-b", "256K", "-e", "128M", "-f", "1.4142"]


def throughput_program(a, model, cap, steps=None, no_sync=False):
    return [f"{a.build}/examples/ddp_throughput", "--model", model, "--steps", str(steps or a.steps),
            "--bucket-cap-mb", str(cap)] + (["--no-sync"] if no_sync else [])


class ThisMachine:
    """Ranks on this machine, over shm."""
    name = "this machine"
    tag = "local"
    local = True

    def __init__(self, a):
        self.a = a
        self.world_sizes = [int(n) for n in a.ranks.split(",")]
        self.caps = parse_caps(a.caps)
        # Every rank runs on this one host, whatever the calibration's bench
        # ran on it (--bench-ranks): beyond its cores they take turns.
        self.ranks_per_host = max(self.world_sizes)

    def run_ranks(self, ranks, program, env=None):
        return run([f"{self.a.build}/lockstep", "run", "--nproc-per-node", str(ranks), "--"] + program, env=env)

    def run_alone(self, program, env=None):
        return self.run_ranks(1, program, env)

    def bench(self, flags, busy=0, ranks=None):
        run([f"{self.a.build}/lockstep", "bench", "-np", str(ranks or self.a.bench_ranks)] + flags +
            (["--busy", str(busy)] if busy else []))


class EmulatedCluster(OneRankPerHost):
    """One rank per host on the emulated cluster, over tcp across the shaped
    links, at the bucket caps of --cluster-caps."""

    def __init__(self, a, rate):
        super().__init__(a, rate)
        self.world_sizes = [a.hosts]
        self.caps = parse_caps(a.cluster_caps)

    def run_alone(self, program, env=None):
        return run(self.cluster.on_host(0, [f"{self.a.build}/lockstep", "run", "--nproc-per-node", "1", "--"] +
                                        program), env=env)


def validate(a, place, models):
    """Calibrates, profiles, predicts and measures on `place`; the table rows
    and the absolute errors (N-rank compute) of its configurations."""
    out_dir = os.path.join(a.out, place.tag)
    os.makedirs(out_dir, exist_ok=True)
    simulate = [f"{a.build}/lockstep", "simulate"]
    per_host = ["--ranks-per-host", str(place.ranks_per_host)] if place.ranks_per_host else []

    # 1. Calibration.
    bench_json = os.path.join(out_dir, "bench.json")
    # --shared-buffers: DDP allocates its buckets with allocate_shared, so on
    # the shm backend they are reduced in place (single copy); ordinary
    # buffers are copied in and out, and measure a slower algorithm. Across
    # the hosts (tcp) fewer iterations: each row of the shaped link is slow.
    local = place.local
    place.bench(bench_sizes() + (["-n", "30", "--shared-buffers"] if local else ["-n", "5"]) + ["--json", bench_json])
    print(run(simulate + ["--calibrate", bench_json, "--calibrate-min-bytes", a.calibrate_min_bytes, "--out", out_dir] +
              per_host).strip(), file=sys.stderr)
    cluster = os.path.join(out_dir, "cluster.json")

    # 2. Profiles: the bucket timeline from one rank at the default bucket
    # cap; compute also from N ranks under no_sync (no communication, but
    # the ranks share the cores and memory as they will when synchronised).
    # Each is traced --profile-repeats times, the runs interleaved, and the
    # run with the median step is the profile: a VM's speed drifts by 10-20%
    # from one minute to the next, more than any term of the model.
    profiles = {}  # (model, ranks) -> [(median step in ms, trace prefix)]
    kinds = [(m, k) for m in models for k in [1] + [w for w in place.world_sizes if w > 1]]
    for repeat in range(a.profile_repeats):
        for model, k in kinds:
            prefix = os.path.join(out_dir, f"profile-{model}" + (f"-{k}ranks-nosync" if k > 1 else "") + f"-{repeat}")
            program = throughput_program(a, model, 25, steps=2 * a.steps, no_sync=k > 1)
            env = dict(os.environ, LOCKSTEP_TRACE=prefix)
            text = place.run_alone(program, env=env) if k == 1 else place.run_ranks(k, program, env=env)
            profiles.setdefault((model, k), []).append((float(re.search(r"step_ms ([0-9.]+)", text).group(1)), prefix))
    traces, compute_traces = {}, {}
    for (model, n), runs in profiles.items():
        runs.sort()
        prefix = runs[len(runs) // 2][1]
        if n == 1:
            traces[model] = prefix + ".rank0.json"
        else:
            compute_traces[(model, n)] = [f"{prefix}.rank{r}.json" for r in range(n)]

    # 3. Predictions, all written before the first measured run: from the
    # one-rank profile alone, and with the N-rank compute.
    configs = [(m, n, c) for m in models for n in place.world_sizes for c in (place.caps if n > 1 else [25])]
    predicted, predicted_n = {}, {}
    for model, n, cap in configs:
        for extra, table, kind in (([], predicted, "1rank"),
                                   (["--compute-trace", compute_traces.get((model, n), [""])[0],
                                     "--jitter-from", ",".join(compute_traces.get((model, n), []))],
                                    predicted_n, "nrank")):
            if kind == "nrank" and n == 1:
                table[(model, n, cap)] = predicted[(model, n, cap)]
                continue
            out = os.path.join(out_dir, f"predict-{model}-{n}-{cap}-{kind}.json")
            run(simulate + ["--trace", traces[model], "--model", model, "--cluster", cluster, "--world-sizes", str(n),
                            "--bucket-cap-mb", str(cap), "--out", os.path.join(out_dir, "simulate"), "--json", out] +
                per_host + extra)
            with open(out) as f:
                table[(model, n, cap)] = json.load(f)["predictions"][0]
    with open(os.path.join(out_dir, "predictions.json"), "w") as f:
        json.dump({f"{m} {n} {c}": [predicted[(m, n, c)], predicted_n[(m, n, c)]] for (m, n, c) in configs}, f,
                  indent=1)

    # 4. Measurements: every configuration in turn, --repeats times, so that
    # a slow spell of the machine touches them all alike.
    measured = {c: [] for c in configs}
    for _ in range(a.repeats):
        for model, n, cap in configs:
            text = place.run_ranks(n, throughput_program(a, model, cap))
            measured[(model, n, cap)].append((float(re.search(r"step_ms ([0-9.]+)", text).group(1)),
                                               float(re.search(r"exposed_comm_ms ([0-9.]+)", text).group(1))))
    rows, errors, errors_n = [], [], []
    for model, n, cap in configs:
        step = statistics.median(s for s, _ in measured[(model, n, cap)])
        exposed = statistics.median(e for _, e in measured[(model, n, cap)])
        p, q = predicted[(model, n, cap)], predicted_n[(model, n, cap)]
        error, error_n = (p["step_ms"] - step) / step, (q["step_ms"] - step) / step
        errors.append(abs(error))
        errors_n.append(abs(error_n))
        rows.append(f"| {place.name} | {model} | {n} | {cap} | {p['buckets']} | {p['step_ms']:.1f} | {q['step_ms']:.1f} | "
                    f"{step:.1f} | {q['exposed_ms']:.1f} | {exposed:.1f} | {100 * error:+.0f}% | {100 * error_n:+.0f}% |")
    load = os.getloadavg()[0]
    print(f"{place.name}: load average at the end {load:.1f} on {os.cpu_count()} cores; "
          f"{time.strftime('%Y-%m-%d %H:%M')}", file=sys.stderr)
    return rows, errors, errors_n


def random_configs(a):
    """--random configurations from --seed: every option drawn independently."""
    import random
    rng = random.Random(a.seed)
    choices = {"model": a.models.split(","), "batch": [int(b) for b in a.batches.split(",")],
               "cap": parse_caps(a.random_caps), "hook": a.hooks.split(","), "view": [False, True]}
    configs = [{k: rng.choice(v) for k, v in choices.items()} for _ in range(a.random)]
    # The world size from a stream of its own, so that a seed's other
    # options are what they were before world sizes were drawn.
    ranks = [int(r) for r in (a.random_ranks or str(a.bench_ranks)).split(",")]
    rng_ranks = random.Random(f"{a.seed}-ranks")
    for c in configs:
        c["ranks"] = rng_ranks.choice(ranks)
    return configs


def config_name(c):
    return f"{c['model']} b{c['batch']} cap{c['cap']} {c['hook']}{' view' if c['view'] else ''} x{c['ranks']}"


def calibrate_world(a, place, n, out_dir, per_host):
    """The clusters to predict `n` ranks with: idle, and with --busy beside
    compute too."""
    local = place.local
    lockstep = f"{a.build}/lockstep"
    os.makedirs(out_dir, exist_ok=True)
    # fp32 on shared buffers (DDP's buckets) in place
    # (gradient_as_bucket_view) and out of place (the default reducer),
    # 16-bit on ordinary ones (the hooks reduce a copy in memory of their own).
    benches = []
    for dtype, flags in (("float", ["--shared-buffers"]), ("float", ["--shared-buffers", "--out-of-place"]),
                         ("half", []), ("bfloat16", [])):
        path = os.path.join(out_dir, f"bench-{dtype}{'-out-of-place' if '--out-of-place' in flags else ''}.json")
        place.bench(bench_sizes() + ["-n", "20" if local else "5", "-d", dtype, "--json", path] + flags, ranks=n)
        benches.append(path)
    def calibrate(paths, where):
        proc = subprocess.run([lockstep, "simulate", "--calibrate", ",".join(paths), "--calibrate-min-bytes",
                               a.calibrate_min_bytes, "--out", where] + per_host, capture_output=True, text=True)
        print(proc.stdout.strip() + "\n" + proc.stderr.strip(), file=sys.stderr)
        if proc.returncode != 0:
            raise RuntimeError("calibration failed")
        return os.path.join(where, "cluster.json")

    clusters = [calibrate(benches, out_dir)]
    if a.busy:
        # The all-reduce again with --busy spinning processes beside the
        # ranks (on the cluster, on each host): its rate beside compute,
        # on the buckets' buffers; every configuration is predicted both ways.
        busy = os.path.join(out_dir, f"bench-float-busy{a.busy}.json")
        place.bench(bench_sizes() + ["-n", "20" if local else "5", "--shared-buffers", "--json", busy], busy=a.busy,
                    ranks=n)
        clusters.append(calibrate(benches + [busy], os.path.join(out_dir, "beside-compute")))
    return clusters


def validate_random(a, place):
    """Predicts every drawn configuration on `place`, then measures them all."""
    local = place.local
    out_dir = os.path.join(a.out, f"random-seed{a.seed}" + ("" if local else f"-{place.tag}"))
    os.makedirs(out_dir, exist_ok=True)
    lockstep = f"{a.build}/lockstep"
    configs = random_configs(a)
    if not local:
        for c in configs:
            c["ranks"] = a.hosts  # one rank per host
    for c in configs:
        print(config_name(c), file=sys.stderr)
    worlds = sorted({c["ranks"] for c in configs})
    # Every rank of a world on this one host; on the cluster one per host.
    per_host = {n: ["--ranks-per-host", str(n if local else 1)] for n in worlds}
    # 1. A calibration per world size (one directory each where there are
    # several): the all-reduce's rows at the size the configurations run.
    clusters = {n: calibrate_world(a, place, n, out_dir if len(worlds) == 1 else os.path.join(out_dir, f"ranks{n}"),
                                   per_host[n])
                for n in worlds}

    # 2. Profiles per (model, batch, world): one rank (buckets) and N ranks
    # under no_sync (compute), --profile-repeats times interleaved, the
    # median run.
    # (The one-rank profile of a model and batch serves every world.)
    profiled = sorted({(c["model"], c["batch"], k) for c in configs for k in (1, c["ranks"])})
    runs = {}
    for repeat in range(a.profile_repeats):
        for model, batch, k in profiled:
            prefix = os.path.join(out_dir, f"profile-{model}-b{batch}-{k}-{repeat}")
            program = throughput_program(a, model, 25, steps=2 * a.steps, no_sync=k > 1) + ["--batch", str(batch)]
            env = dict(os.environ, LOCKSTEP_TRACE=prefix)
            text = place.run_alone(program, env=env) if k == 1 else place.run_ranks(k, program, env=env)
            runs.setdefault((model, batch, k), []).append(
                (float(re.search(r"step_ms ([0-9.]+)", text).group(1)), prefix))
    profile = {key: sorted(v)[len(v) // 2][1] for key, v in runs.items()}
    profiled_step = {key: sorted(v)[len(v) // 2][0] for key, v in runs.items()}

    # 3. Every prediction, written down before the first measurement: one
    # per calibration (idle; with --busy, beside compute too).
    predicted, beside = {}, {}
    for i, c in enumerate(configs):
        n = c["ranks"]
        one, many = profile[(c["model"], c["batch"], 1)], profile[(c["model"], c["batch"], n)]
        for k, cluster in enumerate(clusters[n]):
            out = os.path.join(out_dir, f"predict-{i}{'-beside-compute' if k else ''}.json")
            # Every profiled run's compute: the prediction's run-to-run interval.
            computes = ",".join(prefix + ".rank0.json" for _, prefix in runs[(c["model"], c["batch"], n)])
            run([lockstep, "simulate", "--trace", one + ".rank0.json", "--model", c["model"], "--trace-batch",
                 str(c["batch"]), "--compute-trace", computes,
                 "--jitter-from", ",".join(f"{many}.rank{r}.json" for r in range(n)), "--cluster", cluster,
                 "--world-sizes", str(n), "--bucket-cap-mb", str(c["cap"]), "--hook", c["hook"],
                 "--out", os.path.join(out_dir, "simulate"), "--json", out] + per_host[n] +
                (["--bucket-view"] if c["view"] else []))
            with open(out) as f:
                (beside if k else predicted)[i] = json.load(f)["predictions"][0]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with open(os.path.join(out_dir, f"predictions-{stamp}.json"), "w") as f:
        json.dump({"time": stamp, "seed": a.seed, "clusters": clusters,
                   "configs": [dict(c, predicted=predicted[i], beside_compute=beside.get(i))
                               for i, c in enumerate(configs)]}, f, indent=1)

    # 4. Measurements, interleaved. Right before each, its control: the
    # N-rank no_sync run its compute profile came from. On a shared machine
    # the control's drift from its profiled step (other jobs starting or
    # stopping) is a measurement of how much of a miss is the machine's.
    measured = {i: [] for i in range(len(configs))}
    control = {i: [] for i in range(len(configs))}
    for _ in range(a.repeats):
        for i, c in enumerate(configs):
            n = c["ranks"]
            batch = ["--batch", str(c["batch"])]
            text = place.run_ranks(n, throughput_program(a, c["model"], 25, no_sync=True) + batch)
            control[i].append(float(re.search(r"step_ms ([0-9.]+)", text).group(1)))
            program = throughput_program(a, c["model"], c["cap"]) + batch + ["--hook", c["hook"]]
            text = place.run_ranks(n, program + (["--bucket-view"] if c["view"] else []))
            measured[i].append(float(re.search(r"step_ms ([0-9.]+)", text).group(1)))
    errors, corrected = {}, {}
    print(f"seed {a.seed}, {len(configs)} configurations, {place.name}, "
          f"{'/'.join(str(n) for n in worlds)} ranks, {a.steps} steps x {a.repeats} runs; "
          f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average at the end {os.getloadavg()[0]:.1f}")
    print()
    print("| model | batch | cap (MB) | hook | bucket view | ranks | buckets | predicted (ms) | interval (ms) | "
          "measured (ms) | runs (ms) | control: profiled, measured (ms) | drift | error | "
          "error at the control's speed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    inside = 0
    for i, c in enumerate(configs):
        step = statistics.median(measured[i])
        p = predicted[i]
        # Each run against its own control (the machine's speed at that
        # moment), the median over the runs.
        profiled = profiled_step[(c["model"], c["batch"], c["ranks"])]
        drift = statistics.median(ctl / profiled for ctl in control[i])
        errors[i] = (p["step_ms"] - step) / step
        corrected[i] = statistics.median((p["step_ms"] * ctl / profiled - m) / m for ctl, m in zip(control[i], measured[i]))
        inside += p["step_ms_low"] <= step <= p["step_ms_high"]
        print(f"| {c['model']} | {c['batch']} | {c['cap']} | {c['hook']} | {'yes' if c['view'] else 'no'} | "
              f"{c['ranks']} | "
              f"{p['buckets']} | {p['step_ms']:.1f} | {p['step_ms_low']:.1f}-{p['step_ms_high']:.1f} | {step:.1f} | {', '.join(f'{m:.0f}' for m in measured[i])} | "
              f"{profiled:.0f}, {', '.join(f'{m:.0f}' for m in control[i])} | {drift:.2f} | {100 * errors[i]:+.1f}% | "
              f"{100 * corrected[i]:+.1f}% |")
    print()
    print(f"Measured inside the interval predicted from the {a.profile_repeats} profiled runs' compute: {inside} of "
          f"{len(configs)}.")
    if beside:
        print()
        print(f"Calibrated beside compute as well (bench --busy {a.busy}): predicted (ms), error:")
        for i, c in enumerate(configs):
            step = statistics.median(measured[i])
            q = beside[i]["step_ms"]
            print(f"- {config_name(c)}: {q:.1f}, {100 * (q - step) / step:+.1f}% (idle: {100 * errors[i]:+.1f}%)")
        e = [abs(beside[i]["step_ms"] - statistics.median(measured[i])) / statistics.median(measured[i])
             for i in range(len(configs))]
        print(f"beside compute: mean absolute error {100 * statistics.mean(e):.1f}%, largest {100 * max(e):.1f}%")
        print()
    for label, table in (("as predicted", errors), ("at the control's speed", corrected)):
        e = [abs(x) for x in table.values()]
        print(f"{label}: mean absolute error {100 * statistics.mean(e):.1f}%, largest {100 * max(e):.1f}% over {len(e)} "
              f"configurations (mean signed {100 * statistics.mean(table.values()):+.1f}%).")
    print()
    print("Per option, at the control's speed (signed: + predicted slower than measured): value: mean signed error, "
          "mean |error|, count")
    for key in ("model", "batch", "cap", "hook", "view", "ranks"):
        values = sorted({c[key] for c in configs}, key=str)
        parts = []
        for v in values:
            es = [corrected[i] for i, c in enumerate(configs) if c[key] == v]
            parts.append(f"{v}: {100 * statistics.mean(es):+.1f}%, {100 * statistics.mean(abs(x) for x in es):.1f}%, "
                         f"{len(es)}")
        print(f"- {key}: " + "; ".join(parts))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--ranks", default="1,2", help="world sizes on this machine")
    parser.add_argument("--caps", default="1,5,25,100", help="bucket caps (MB) on this machine")
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of every configuration, interleaved; the median is compared")
    parser.add_argument("--bench-ranks", type=int, default=2)
    parser.add_argument("--profile-repeats", type=int, default=3,
                        help="traces of every profile, interleaved; the one with the median step is used")
    parser.add_argument("--calibrate-min-bytes", default="8M",
                        help="fit the bench rows of the buckets' sizes (larger than the caches)")
    parser.add_argument("--local", action=argparse.BooleanOptionalAction, default=True,
                        help="validate on this machine (default on)")
    parser.add_argument("--cluster-rates", default="",
                        help="also validate on the emulated cluster at these link rates, e.g. 1gbit,10gbit (root)")
    parser.add_argument("--hosts", type=int, default=2, help="hosts of the emulated cluster (one rank each)")
    parser.add_argument("--cluster-caps", default="5,25,100", help="bucket caps (MB) on the emulated cluster")
    parser.add_argument("--out", default="validate-simulate")
    parser.add_argument("--random", type=int, default=0,
                        help="validate this many configurations drawn at random instead (here, and on the "
                             "cluster with --cluster-rates)")
    parser.add_argument("--seed", type=int, default=1, help="the draw of --random")
    parser.add_argument("--batches", default="32,64,128", help="batches per rank --random draws from")
    parser.add_argument("--random-caps", default="2,5,25,50", help="bucket caps (MB) --random draws from")
    parser.add_argument("--hooks", default="none,fp16,bf16", help="hooks --random draws from")
    parser.add_argument("--random-ranks", default="",
                        help="world sizes --random draws from on this machine, e.g. 2,3,4 (default: --bench-ranks); "
                             "each calibrated and profiled at its own size")
    parser.add_argument("--busy", type=int, default=0,
                        help="with --random: also calibrate the all-reduce beside compute with this many spinning "
                             "processes (lockstep bench --busy; on the cluster, on each host) and predict both ways")
    a = parser.parse_args()
    a.build = os.path.abspath(a.build)
    a.out = os.path.abspath(a.out)
    os.makedirs(a.out, exist_ok=True)
    models = a.models.split(",")
    rates = [r for r in a.cluster_rates.split(",") if r]
    if rates and os.geteuid() != 0:
        print("--cluster-rates needs root (network namespaces and tc)", file=sys.stderr)
        return 77
    if a.random:
        if a.local:
            validate_random(a, ThisMachine(a))
        for rate in rates:
            with EmulatedCluster(a, rate) as place:
                validate_random(a, place)
        return 0

    results = []  # (place name, rows, errors 1-rank, errors N-rank)
    if a.local:
        results.append((ThisMachine.name,) + validate(a, ThisMachine(a), models))
    for rate in rates:
        with EmulatedCluster(a, rate) as place:
            results.append((place.name,) + validate(a, place, models))

    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average at the end "
          f"{os.getloadavg()[0]:.1f}")
    print()
    print("| where | model | ranks | bucket cap (MB) | buckets | predicted, 1-rank profile (ms) | "
          "predicted, N-rank compute (ms) | measured step (ms) | predicted exposed (ms) | measured exposed (ms) | "
          "error, 1-rank | error, N-rank |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for _, rows, _, _ in results:
        print("\n".join(rows))
    print()
    summaries = [(name, e, e_n) for name, _, e, e_n in results]
    if len(summaries) > 1:
        summaries.append(("all", [x for _, e, _ in summaries for x in e], [x for _, _, e_n in summaries for x in e_n]))
    for name, e, e_n in summaries:
        for kind, errors in (("1-rank profile", e), ("N-rank compute", e_n)):
            print(f"{name}, {kind}: mean absolute error {100 * statistics.mean(errors):.1f}%, "
                  f"largest {100 * max(errors):.1f}% over {len(errors)} configurations.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
