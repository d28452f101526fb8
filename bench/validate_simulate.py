#!/usr/bin/python3
"""`lockstep simulate` against measurement: predict first, then run.

1. Calibrates the cluster from `lockstep bench -np N --shared-buffers` on
   this machine (all-reduce, 256 KiB to 128 MiB in steps of sqrt(2), 30
   iterations; shared buffers because DDP's buckets are) with
   `lockstep simulate --calibrate`.
2. Profiles each model with LOCKSTEP_TRACE (examples/ddp_throughput, twice
   --steps steps, medians): once on one rank at the default bucket cap (the
   bucket timeline), and on N ranks under no_sync (compute while the ranks
   share the machine, without communication).
3. Predicts, with `lockstep simulate --trace ... --cluster ...` (and
   `--compute-trace` for the N-rank compute), the step time of every
   configuration (model x world size x bucket cap) and writes the
   predictions down before any configuration is measured.
4. Runs every configuration under `lockstep run` and compares the measured
   median step time with the prediction.

Prints a markdown table (for docs/performance.md) with the mean and the
largest absolute error; the files are kept in --out.

Usage: bench/validate_simulate.py [--build build] [--ranks 1,2] [--caps 1,5,25,100]
           [--models mlp,convnet] [--steps 15] [--repeats 3] [--bench-ranks 2]
           [--calibrate-min-bytes 8M] [--out DIR]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time


def run(cmd, env=None, timeout=900):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-800:]}\n{proc.stderr[-800:]}")
    return proc.stdout


def throughput_cmd(a, model, ranks, cap, steps=None, no_sync=False):
    return [f"{a.build}/lockstep", "run", "--nproc-per-node", str(ranks), "--",
            f"{a.build}/examples/ddp_throughput", "--model", model, "--steps", str(steps or a.steps),
            "--bucket-cap-mb", str(cap)] + (["--no-sync"] if no_sync else [])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--caps", default="1,5,25,100")
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of every configuration, interleaved; the median is compared")
    parser.add_argument("--bench-ranks", type=int, default=2)
    parser.add_argument("--calibrate-min-bytes", default="8M",
                        help="fit the bench rows of the buckets' sizes (larger than the caches)")
    parser.add_argument("--out", default="validate-simulate")
    a = parser.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ranks = [int(n) for n in a.ranks.split(",")]
    caps = [float(c) if "." in c else int(c) for c in a.caps.split(",")]
    models = a.models.split(",")

    # 1. Calibration.
    bench_json = os.path.join(a.out, f"bench-{a.bench_ranks}ranks.json")
    # --shared-buffers: DDP allocates its buckets with allocate_shared, so on
    # the shm backend they are reduced in place (single copy); ordinary
    # buffers are copied in and out, and measure a slower algorithm.
    run([f"{a.build}/lockstep", "bench", "-np", str(a.bench_ranks), "-b", "256K", "-e", "128M", "-f", "1.4142",
         "-n", "30", "--shared-buffers", "--json", bench_json])
    print(run([f"{a.build}/lockstep", "simulate", "--calibrate", bench_json, "--calibrate-min-bytes",
               a.calibrate_min_bytes, "--out", a.out]).strip(), file=sys.stderr)
    cluster = os.path.join(a.out, "cluster.json")

    # 2. Profiles: the bucket timeline from one rank at the default bucket
    # cap; compute also from N ranks under no_sync (no communication, but
    # the ranks share the cores and memory as they will when synchronised).
    traces, compute_traces = {}, {}
    for model in models:
        prefix = os.path.join(a.out, f"profile-{model}")
        run(throughput_cmd(a, model, 1, 25, steps=2 * a.steps), env=dict(os.environ, LOCKSTEP_TRACE=prefix))
        traces[model] = prefix + ".rank0.json"
        for n in ranks:
            if n == 1:
                continue
            prefix = os.path.join(a.out, f"profile-{model}-{n}ranks-nosync")
            run(throughput_cmd(a, model, n, 25, steps=2 * a.steps, no_sync=True),
                env=dict(os.environ, LOCKSTEP_TRACE=prefix))
            compute_traces[(model, n)] = prefix + ".rank0.json"

    # 3. Predictions, all written before the first measured run: from the
    # one-rank profile alone, and with the N-rank compute.
    configs = [(m, n, c) for m in models for n in ranks for c in (caps if n > 1 else [25])]
    predicted, predicted_n = {}, {}
    for model, n, cap in configs:
        for extra, table, tag in (([], predicted, "1rank"),
                                  (["--compute-trace", compute_traces.get((model, n), "")], predicted_n, "nrank")):
            if tag == "nrank" and n == 1:
                table[(model, n, cap)] = predicted[(model, n, cap)]
                continue
            out = os.path.join(a.out, f"predict-{model}-{n}-{cap}-{tag}.json")
            run([f"{a.build}/lockstep", "simulate", "--trace", traces[model], "--model", model, "--cluster", cluster,
                 "--world-sizes", str(n), "--bucket-cap-mb", str(cap), "--out", os.path.join(a.out, "simulate"),
                 "--json", out] + extra)
            with open(out) as f:
                table[(model, n, cap)] = json.load(f)["predictions"][0]
    with open(os.path.join(a.out, "predictions.json"), "w") as f:
        json.dump({f"{m} {n} {c}": [predicted[(m, n, c)], predicted_n[(m, n, c)]] for (m, n, c) in configs}, f,
                  indent=1)

    # 4. Measurements: every configuration in turn, --repeats times, so that
    # a slow spell of the machine touches them all alike.
    measured = {c: [] for c in configs}
    for _ in range(a.repeats):
        for model, n, cap in configs:
            text = run(throughput_cmd(a, model, n, cap))
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
        rows.append(f"| {model} | {n} | {cap} | {p['buckets']} | {p['step_ms']:.1f} | {q['step_ms']:.1f} | "
                    f"{step:.1f} | {q['exposed_ms']:.1f} | {exposed:.1f} | {100 * error:+.0f}% | {100 * error_n:+.0f}% |")
    load = os.getloadavg()[0]
    print(f"Load average at the end: {load:.1f} on {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M')}")
    print()
    print("| model | ranks | bucket cap (MB) | buckets | predicted, 1-rank profile (ms) | predicted, N-rank compute (ms) | "
          "measured step (ms) | predicted exposed (ms) | measured exposed (ms) | error, 1-rank | error, N-rank |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    for name, e in (("1-rank profile", errors), ("N-rank compute", errors_n)):
        print(f"{name}: mean absolute error {100 * statistics.mean(e):.1f}%, largest {100 * max(e):.1f}% "
              f"over {len(e)} configurations.")


if __name__ == "__main__":
    main()
