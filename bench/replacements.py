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
     moves per second on this transport), each run's broadcast measured
     right after it; with --runs, medians (the ratio the median of the
     per-run ratios).
  2. A job whose rank 1 is killed every --interval seconds (each
     replacement killed --interval after it joined, by steps: the clean
     run's step time says how many): its steps per second over the whole
     run against the clean run's, with replacements, without (the
     survivors finish alone), and under the restart from a checkpoint
     (--on-rank-failure restart: rank 1 killed the same number of steps
     into each round, every rank resuming from the last checkpoint); and
     beside it torchft 0.2.0's DDP on Gloo (bench/torchft_peer.py) under
     the same schedule in wall time, replica group 1 killed and restarted
     at once, against its own clean run. Medians of --runs.
  3. Where each death's time went in the runs with replacements (world
     rank 0's committed steps, written by the example's --step-times):
     the death to the group re-formed, to the replacement training, and
     --settle seconds after; each phase's loss against the pace of the
     steps before the death. --trace-only runs the replaced run alone.

Usage: bench/replacements.py [--build build] [--ranks 4] [--hidden 128 4096 32768]
           [--interval 30] [--duration 150] [--runs 1] [--skip-rate | --skip-time]
           [--checkpoint-seconds 3] [--skip-torchft] [--trace-only] [--settle 3]
           [--only clean replaced ...]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import recovery_jobs


def run(args, timeout, env=None):
    proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                          start_new_session=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"replacements.py: {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    return proc.stdout


def job(o, example_args, launcher_args, timeout=900, step_times=None):
    """One `lockstep run` of the example: (wall seconds, output). With a list as step_times, world rank
    0's committed steps are appended to it: (step, wall-clock time, ranks in the group)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [os.path.join(o.build, "lockstep"), "run", "--nproc-per-node", str(o.ranks), "--grace-period", "2"]
        args += launcher_args + ["--", os.path.join(o.build, "examples", "in_place_recovery"), "--subset", "1200",
                                 "--batch", str(16 * o.ranks), "--save-params", os.path.join(tmp, "params.bin")]
        if step_times is not None:
            args += ["--step-times", os.path.join(tmp, "steps.txt")]
        start = time.monotonic()
        out = run(args + [a.replace("{tmp}", tmp) for a in example_args], timeout, recovery_jobs.job_env(tmp))
        wall = time.monotonic() - start
        if step_times is not None:
            with open(os.path.join(tmp, "steps.txt")) as f:
                step_times += [(int(a), float(b), int(c)) for a, b, c in (line.split() for line in f)]
        return wall, out


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
    print(f"### A replacement training after a death ({o.ranks} ranks, rank 1 killed at step {o.kill_step}"
          f"{f'; medians of {o.runs} runs' if o.runs > 1 else ''})\n")
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
        size = state_bytes(hidden)
        # Each run's feeding against the broadcast measured right after it:
        # the machine's speed moves between runs by more than the ratio's
        # margin, so the ratio is taken per run and its median reported.
        to_train, fed, busbw, ratio = [], [], [], []
        for _ in range(o.runs):
            _, out = job(o, ["--hidden", str(hidden), "--steps", str(steps), "--kill", f"1:{o.kill_step}:reduce"],
                         ["--on-rank-failure", "continue", "--max-replacements", "1"])
            killed = recovery_jobs.first_death(out)
            training = re.search(r"replacement 1\): joined at step \d+.*training at ([\d.]+)", out)
            if training is None:
                sys.exit(f"replacements.py: the replacement did not join before step {steps}:\n{out[-3000:]}")
            to_train.append(float(training.group(1)) - killed)
            fed.append(float(re.search(r"\[1\] fed a replacement: ([\d.]+) s", out).group(1)))
            busbw.append(broadcast_bus_gbps(o, size))
            ratio.append(size / fed[-1] / 1e9 / busbw[-1])
        med = statistics.median
        print(f"| {hidden} | {size / 1e6:.1f} | {med(to_train):.2f} | {med(fed):.3f} | {size / med(fed) / 1e9:.2f} "
              f"| {med(busbw):.2f} | {med(ratio):.2f} |", flush=True)
        if o.runs > 1:
            print(f"<!-- hidden {hidden}: rate / busbw per run {', '.join(f'{r:.2f}' for r in ratio)} -->", flush=True)
    print()


def deaths(out, pattern=recovery_jobs.DEATH):
    """How many deaths a run printed, and the mean seconds between them (one clock: one host; nan for
    fewer than two)."""
    times = sorted(set(recovery_jobs.times(out, pattern)))
    return len(times), (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else float("nan")


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
    # The restart: every rank stops at each death and all resume from the
    # last checkpoint, written every --checkpoint-seconds of steps.
    checkpoint_every = max(int(o.checkpoint_seconds / step_s), 1)
    restart = ["--steps", str(steps), "--kill-each-round", f"1:{every}:{n_kills}", "--checkpoint",
               "{tmp}/job.ckpt", "--checkpoint-every", str(checkpoint_every)]
    print(f"The restart writes a checkpoint every {checkpoint_every} steps ({o.checkpoint_seconds:g} s).\n")
    print("| run | deaths | seconds between deaths | wall (s) | steps/s | against its clean run |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    runs = {
        "clean": (["--steps", str(steps)], ["--on-rank-failure", "continue"]),
        "replaced": (["--steps", str(steps)] + kills, ["--on-rank-failure", "continue", "--max-replacements", str(n_kills)]),
        "not replaced": (["--steps", str(steps), "--kill", f"1:{first}:reduce"], ["--on-rank-failure", "continue"]),
        "restart from checkpoint": (restart, ["--max-restarts", str(n_kills)]),
    }
    if o.trace_only:
        runs = {"replaced": runs["replaced"]}
    elif o.only:
        runs = {name: runs[name] for name in runs if name in o.only}
    results = {name: [] for name in runs}
    traced = []  # (output, world rank 0's steps) of each run with replacements
    for _ in range(o.runs):
        for name, (example_args, launcher_args) in runs.items():
            steps_seen = [] if name == "replaced" else None
            results[name].append(job(o, example_args, launcher_args, step_times=steps_seen))
            if steps_seen is not None:
                traced.append((results[name][-1][1], steps_seen))
    clean = statistics.median(wall for wall, _ in results.get("clean") or next(iter(results.values())))
    for name, done in results.items():
        wall = statistics.median(w for w, _ in done)
        count = statistics.median(deaths(out)[0] for _, out in done)
        spacing = statistics.median(deaths(out)[1] for _, out in done)
        print(f"| lockstep, {name} | {count:g} | {spacing:.1f} | {wall:.1f} | {steps / wall:.1f} "
              f"| {clean / wall:.3f} |", flush=True)
    if not o.skip_torchft and not o.trace_only:
        torchft_under_kills(o, n_kills)
    print()
    if traced:
        print_trace(o, "\n".join(out for out, _ in traced), [s for _, steps in traced for s in steps])


def lost_between(steps, begin, end, step_s):
    """Seconds of [begin, end) not spent on committed steps at the clean pace: the window's length less
    its steps' worth of clean steps."""
    done = sum(1 for _, at, _ in steps if begin <= at < end)
    return (end - begin) - done * step_s


def trace_deaths(out, steps, settle):
    """Where each death's time went, from world rank 0's committed steps and the times the run printed
    (one host, one clock): the death to the group re-formed (the interrupted step redone), to the
    replacement training (the launcher starting it, libtorch and the data loaded, its ask, the admission
    at a step boundary, the feeding), and `settle` seconds of steps after. Each phase's loss is its
    length less the steps it committed at the pace of the seconds before the death. Returns one row of
    floats per death: (phase lengths..., losses..., the replacement's start after the death, its start
    to training, the pace)."""
    killed = recovery_jobs.times(out)
    reformed = recovery_jobs.reformed(out)
    joined = recovery_jobs.replacements_training(out)
    rows = []
    for death in killed:
        before = [at for _, at, _ in steps if death - 2 <= at < death]
        after_reform = [t for t in reformed if t >= death]
        after_join = [j for j in joined if j[0] >= death]
        if len(before) < 10 or not after_reform or not after_join:
            continue
        step_s = (before[-1] - before[0]) / (len(before) - 1)
        training, started = after_join[0]
        edges = [death, after_reform[0], training, training + settle]
        lengths = [b - a for a, b in zip(edges, edges[1:])]
        lost = [lost_between(steps, a, b, step_s) for a, b in zip(edges, edges[1:])]
        rows.append(lengths + lost + [started - death, training - started, step_s])
    return rows


def print_trace(o, out, steps):
    rows = trace_deaths(out, steps, o.settle)
    if not rows:
        print("No death traced (no replacement trained after a death).\n")
        return
    phases = ["death to re-formed (the step redone)", f"re-formed to the replacement training ({o.ranks - 1} ranks, {o.ranks} shards)",
              f"training to {o.settle:g} s after"]
    print(f"### Where each death's time went ({len(rows)} deaths; means; world rank 0's steps against its pace "
          f"in the 2 s before each death)\n")
    print("| phase | length (s) | time lost (s) |")
    print("| --- | ---: | ---: |")
    for i, name in enumerate(phases):
        print(f"| {name} | {statistics.mean(r[i] for r in rows):.2f} "
              f"| {statistics.mean(r[len(phases) + i] for r in rows):.2f} |")
    total = statistics.mean(sum(r[len(phases):2 * len(phases)]) for r in rows)
    pace = statistics.mean(r[-1] for r in rows) * 1e3
    print(f"| all | {statistics.mean(sum(r[:len(phases)]) for r in rows):.2f} | {total:.2f} |\n")
    print(f"Pace before the deaths: {pace:.2f} ms a step. The replacement's process started "
          f"{statistics.mean(r[-3] for r in rows):.2f} s after the death and trained "
          f"{statistics.mean(r[-2] for r in rows):.2f} s after it started.\n", flush=True)


def torchft(o, args):
    """One bench/torchft_peer.py run on Gloo: (wall seconds, steps, output)."""
    out = run([o.torch2_python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchft_peer.py"),
               "--replicas", str(o.ranks), "--batch", str(16 * o.ranks), "--subset", "1200",
               "--timeout", str(o.duration * 4 + 120)] + args, o.duration * 4 + 180)
    m = re.search(r"torchft \(gloo\): (\d+) of \d+ replica groups finished (\d+) steps in ([\d.]+) s", out)
    if m is None or int(m.group(1)) != o.ranks:
        sys.exit(f"replacements.py: torchft did not finish on every replica group:\n{out[-3000:]}")
    return float(m.group(3)), int(m.group(2)), out


def torchft_under_kills(o, n_kills):
    """The same schedule under torchft 0.2.0 on Gloo: replica group 1 killed every --interval s and
    restarted at once, healing from a peer; its steps sized to last --duration clean."""
    _, _, probe = torchft(o, ["--steps", "400"])
    step_s = float(re.search(r"replica group 0: ([\d.]+) ms per step", probe).group(1)) / 1e3
    steps = int(o.duration / step_s)
    runs = {"clean": [], "replaced": ["--kill-every", str(o.interval), "--kills", str(n_kills)]}
    results = {name: [] for name in runs}
    for _ in range(o.runs):
        for name, args in runs.items():
            wall, _, out = torchft(o, ["--steps", str(steps)] + args)
            results[name].append((wall, out))
    clean = statistics.median(wall for wall, _ in results["clean"])
    for name, done in results.items():
        wall = statistics.median(w for w, _ in done)
        killed = [deaths(out, r"killing replica group 1 at ([\d.]+)") for _, out in done]
        count = statistics.median(k[0] for k in killed)
        spacing = statistics.median(k[1] for k in killed)
        print(f"| torchft 0.2.0 on Gloo, {name} ({steps} steps) | {count:g} | {spacing:.1f} | {wall:.1f} "
              f"| {steps / wall:.1f} | {clean / wall:.3f} |", flush=True)


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
    parser.add_argument("--checkpoint-seconds", type=float, default=3,
                        help="the restart's checkpoint interval, in seconds of clean steps")
    parser.add_argument("--torch2-python", default=".venv/torch2/bin/python",
                        help="the PyTorch environment with torchft (make deps-torch2)")
    parser.add_argument("--skip-torchft", action="store_true", help="no torchft peer")
    parser.add_argument("--trace-only", action="store_true",
                        help="only the run with replacements, and where each death's time went")
    parser.add_argument("--only", nargs="+", choices=["clean", "replaced", "not replaced", "restart from checkpoint"],
                        help="only these of lockstep's runs under kills (each a run of its own in every round)")
    parser.add_argument("--settle", type=float, default=3,
                        help="seconds after a replacement trains that still count as its death's (the trace)")
    parser.add_argument("--skip-rate", action="store_true", help="only the time to train")
    parser.add_argument("--skip-time", action="store_true", help="only the rate under kills")
    o = parser.parse_args()
    if not o.skip_time:
        time_to_train(o)
    if not o.skip_rate:
        rate_under_kills(o)


if __name__ == "__main__":
    main()
