#!/usr/bin/python3
"""What a replacement costs (lockstep run --on-rank-failure continue
--max-replacements): how soon after a death the replacement trains, and
what a job killed at a steady rate keeps of its clean throughput.

Runs examples/in_place_recovery under `lockstep run`, --ranks processes on
this machine, and prints markdown for docs/performance.md:

  1. For each --hidden width (the MLP's: its state grows with it), rank 1
     is killed (SIGKILL) before the reduction of step --kill-step; its
     replacement starts, joins at a step boundary and is fed by its peers.
     Reported: the state fed (parameters and SGD's momentum), the time
     from the kill (the victim's clock) to the replacement training (its
     clock; one host, one clock), the feeding alone (first broadcast to
     every digest compared, on the replacement), and the feeding's rate
     against `lockstep bench --op broadcast` at the state's size in the
     same run (its bus bandwidth: what one broadcast of that many bytes
     moves per second on this transport).
  2. A job whose rank 1 is killed every --interval seconds (each
     replacement killed --interval after it joined, by steps: the clean
     run's step time says how many): its steps per second over the whole
     run against the clean run's, with replacements and without (the
     survivors finish alone), medians of --runs.

Usage: bench/replacements.py [--build build] [--ranks 4] [--hidden 128 4096 32768]
           [--interval 30] [--duration 150] [--runs 1] [--skip-rate | --skip-time]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def run(args, timeout):
    proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                          start_new_session=True)
    if proc.returncode != 0:
        sys.exit(f"replacements.py: {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    return proc.stdout


def job(o, example_args, launcher_args, timeout=900):
    """One `lockstep run` of the example: (wall seconds, output)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [os.path.join(o.build, "lockstep"), "run", "--nproc-per-node", str(o.ranks), "--grace-period", "2"]
        args += launcher_args + ["--", os.path.join(o.build, "examples", "in_place_recovery"), "--subset", "1200",
                                 "--batch", str(16 * o.ranks), "--save-params", os.path.join(tmp, "params.bin")]
        start = time.monotonic()
        out = run(args + example_args, timeout)
        return time.monotonic() - start, out


def state_bytes(hidden):
    params = 784 * hidden + hidden + 10 * hidden + 10
    return 2 * 4 * params  # float parameters and SGD's momentum


def broadcast_bus_gbps(o, size):
    out = run([os.path.join(o.build, "lockstep"), "bench", "--op", "broadcast", "--np", str(o.ranks), "-b",
               str(size), "-e", str(size), "-n", "5", "-w", "2"], 600)
    rows = [line.split() for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    # nccl-tests' columns: size count type [redop] root time algbw busbw ...; busbw is the 8th from the end
    # only if the layout matches: find it by the header instead.
    header = next(line.split() for line in out.splitlines() if "busbw" in line)
    return float(rows[-1][header.index("busbw") - len(header)]) if rows else float("nan")


def time_to_train(o):
    print(f"### A replacement training after a death ({o.ranks} ranks, rank 1 killed at step {o.kill_step})\n")
    print("| hidden | state fed (MB) | kill to training (s) | feeding (s) | feeding's rate (GB/s) "
          "| `lockstep bench` broadcast busbw (GB/s) | rate / busbw |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for hidden in o.hidden:
        # Long enough after the kill for the replacement to start (a few
        # seconds) and join: the clean step's time says how many steps.
        _, probe = job(o, ["--hidden", str(hidden), "--steps", "30"], ["--on-rank-failure", "continue"])
        m = re.search(r"world rank 0: 30 steps in ([\d.]+) s", probe)
        step_s = float(m.group(1)) / 30
        steps = o.kill_step + max(40, int(o.after_kill / step_s))
        _, out = job(o, ["--hidden", str(hidden), "--steps", str(steps), "--kill", f"1:{o.kill_step}:reduce"],
                     ["--on-rank-failure", "continue", "--max-replacements", "1"])
        killed = float(re.search(r"killing itself at step \d+, \w+, at ([\d.]+)", out).group(1))
        training = re.search(r"replacement 1\): joined at step \d+.*training at ([\d.]+)", out)
        if training is None:
            sys.exit(f"replacements.py: the replacement did not join before step {steps}:\n{out[-3000:]}")
        fed = float(re.search(r"\[1\] fed a replacement: ([\d.]+) s", out).group(1))
        size = state_bytes(hidden)
        busbw = broadcast_bus_gbps(o, size)
        rate = size / fed / 1e9
        print(f"| {hidden} | {size / 1e6:.1f} | {float(training.group(1)) - killed:.2f} | {fed:.3f} | {rate:.2f} "
              f"| {busbw:.2f} | {rate / busbw:.2f} |", flush=True)
    print()


def rate_under_kills(o):
    # The clean run's step time sets the steps between kills.
    probe_steps = 1000
    _, out = job(o, ["--steps", str(probe_steps)], ["--on-rank-failure", "continue"])
    step_s = float(re.search(rf"world rank 0: {probe_steps} steps in ([\d.]+) s", out).group(1)) / probe_steps
    steps = int(o.duration / step_s)
    every = max(int(o.interval / step_s), 1)
    first = every
    kills = ["--kill", f"1:{first}:reduce"]
    n_kills = int(o.duration / o.interval) - 1
    for i in range(1, n_kills):
        kills += ["--kill-replacement", f"1:{i}:{every}:reduce"]
    print(f"### Rank 1 killed every {o.interval:g} s ({o.ranks} ranks, {steps} steps, a kill every {every} steps, "
          f"{n_kills} kills)\n")
    print("| run | wall (s) | steps/s | against clean |")
    print("| --- | ---: | ---: | ---: |")
    results = {"clean": [], "replaced": [], "not replaced": []}
    for _ in range(o.runs):
        results["clean"].append(job(o, ["--steps", str(steps)], ["--on-rank-failure", "continue"])[0])
        results["replaced"].append(job(o, ["--steps", str(steps)] + kills,
                                       ["--on-rank-failure", "continue", "--max-replacements", str(n_kills)])[0])
        results["not replaced"].append(job(o, ["--steps", str(steps), "--kill", f"1:{first}:reduce"],
                                           ["--on-rank-failure", "continue"])[0])
    clean = statistics.median(results["clean"])
    for name, walls in results.items():
        wall = statistics.median(walls)
        print(f"| {name} | {wall:.1f} | {steps / wall:.1f} | {clean / wall:.3f} |", flush=True)
    print()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 4096, 32768])
    parser.add_argument("--kill-step", type=int, default=10)
    parser.add_argument("--after-kill", type=float, default=10, help="seconds of steps after the kill")
    parser.add_argument("--interval", type=float, default=30)
    parser.add_argument("--duration", type=float, default=150)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--skip-rate", action="store_true", help="only the time to train")
    parser.add_argument("--skip-time", action="store_true", help="only the rate under kills")
    o = parser.parse_args()
    if not o.skip_time:
        time_to_train(o)
    if not o.skip_rate:
        rate_under_kills(o)


if __name__ == "__main__":
    main()
