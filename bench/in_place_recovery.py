#!/usr/bin/python3
"""What a rank's death costs: in place (--on-rank-failure continue) against
the restart from a checkpoint (today's way), and what the in-place mode
costs a clean run.

Runs examples/in_place_recovery under `lockstep run`, --ranks processes on
this machine, each configuration --runs times, interleaved, and reports
medians as markdown for docs/performance.md:
  - plain: lockstep's DistributedDataParallel, no recovery (--plain);
  - in place, clean: ResilientTrainer, no failure;
  - in place, killed: rank 1 killed (SIGKILL) before the forward of a step
    drawn at random in the middle half of the run, --on-rank-failure
    continue; the survivors finish with 3 ranks;
  - restart, killed: the same kill, --on-rank-failure restart
    --max-restarts 1, every rank started again from the last checkpoint,
    for each --checkpoint-every given (0: no checkpoint, the job starts
    over);
  - with --torchft PYTHON, torchft's DDP on Gloo (bench/torchft_peer.py,
    one replica group a rank), clean and with the same kill.
Each row gives the wall time of the whole `lockstep run` (process start and
rendezvous included), the time lost against the clean run of its kind, and
whether the final parameters equal the clean run's byte for byte (torchft's
against its own first clean run); the
in-place rows also give the time from the kill (the victim's clock) to the
survivors' re-formed group (theirs; one host, one clock), after which the
redone step's first collective runs.

Usage: bench/in_place_recovery.py [--build build] [--ranks 4] [--steps 400]
           [--batch 256] [--runs 3] [--checkpoint-every 0 50] [--seed 1]
           [--torchft .venv/torch2/bin/python] [--clean-only]
"""
import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

import recovery_jobs


def timed(command, timeout):
    """Runs the arguments command(tmp, params) gives: (wall seconds, output, parameters' bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        params = os.path.join(tmp, "params.bin")
        args = command(tmp, params)
        start = time.monotonic()
        proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                              start_new_session=True, env=recovery_jobs.job_env(tmp))
        wall = time.monotonic() - start
        if proc.returncode != 0:
            sys.exit(f"in_place_recovery.py: {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
        with open(params, "rb") as f:
            return wall, proc.stdout, f.read()


def run_job(build, ranks, example_args, launcher_args, timeout):
    """One `lockstep run` of the example."""
    def command(tmp, params):
        args = [os.path.join(build, "lockstep"), "run", "--nproc-per-node", str(ranks), "--grace-period", "2"]
        args += launcher_args + ["--", os.path.join(build, "examples", "in_place_recovery")]
        return args + [a.replace("{tmp}", tmp) for a in example_args] + ["--save-params", params]
    return timed(command, timeout)


def run_torchft(python, o, kill):
    """bench/torchft_peer.py, the same training under torchft."""
    def command(tmp, params):
        return [python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchft_peer.py"), "--replicas",
                str(o.ranks), "--steps", str(o.steps), "--batch", str(o.batch), "--subset", str(o.subset),
                "--save-params", params] + (["--kill", kill] if kill else [])
    return timed(command, o.timeout)


def training_seconds(output):
    """The slowest rank's training loop (the example's own clock)."""
    return max(float(t) for t in re.findall(r"steps in ([0-9.]+) s", output))


def kill_to_reformed(output):
    """Seconds from the victim's death to the last survivor's re-formed group."""
    death = recovery_jobs.first_death(output)
    reformed = recovery_jobs.reformed(output)
    if death is None or not reformed:
        return None
    return max(reformed) - death


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--subset", type=int, default=0, help="training images used (0: all 60000)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--checkpoint-every", type=int, nargs="+", default=[0, 50])
    parser.add_argument("--seed", type=int, default=1, help="for the kill steps")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--clean-only", action="store_true", help="only the clean runs: the mode's cost per step")
    parser.add_argument("--torchft", metavar="PYTHON", help="also run torchft's DDP with this Python (torchft installed)")
    o = parser.parse_args()
    rng = random.Random(o.seed)
    common = ["--steps", str(o.steps), "--batch", str(o.batch), "--subset", str(o.subset)]
    rows = {}  # name -> list of (wall, latency or None, params)

    def record(name, result, latency=None):
        rows.setdefault(name, []).append((result[0], latency, result[2], result[1]))

    for _ in range(o.runs):
        kill = f"1:{rng.randrange(o.steps // 4, 3 * o.steps // 4)}:forward"
        record("plain", run_job(o.build, o.ranks, common + ["--plain"], [], o.timeout))
        record("in place, clean", run_job(o.build, o.ranks, common, [], o.timeout))
        if o.clean_only:
            continue
        killed = run_job(o.build, o.ranks, common + ["--kill", kill], ["--on-rank-failure", "continue"], o.timeout)
        record("in place, killed", killed, kill_to_reformed(killed[1]))
        for every in o.checkpoint_every:
            ckpt = ["--checkpoint", "{tmp}/job.ckpt", "--checkpoint-every", str(every)] if every else []
            if every:
                record(f"restart, clean, checkpoint every {every}",
                       run_job(o.build, o.ranks, common + ckpt, [], o.timeout))
            record(f"restart, killed, checkpoint every {every}" if every else "restart, killed, no checkpoint",
                   run_job(o.build, o.ranks, common + ckpt + ["--kill", kill], ["--max-restarts", "1"], o.timeout))
        if o.torchft:
            record("torchft, clean", run_torchft(o.torchft, o, ""))
            record("torchft, killed", run_torchft(o.torchft, o, kill.rsplit(":", 1)[0]))

    clean = rows["in place, clean"]
    reference = clean[0][2]
    print(f"{o.ranks} ranks, {o.steps} steps of a global batch of {o.batch}, {o.runs} runs; medians\n")
    print("| run | wall s | lost s against its clean run | kill to re-formed s | parameters equal the clean run's |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, results in rows.items():
        wall = statistics.median(r[0] for r in results)
        if name.startswith("restart") and "every" in name and "killed" in name:
            base = rows[name.replace("killed", "clean")]
        elif name == "torchft, killed":
            base = rows["torchft, clean"]
        elif name == "plain" or "clean" in name:
            base = None
        else:
            base = clean
        lost = f"{wall - statistics.median(r[0] for r in base):.2f}" if base else ""
        latencies = [r[1] for r in results if r[1] is not None]
        latency = f"{statistics.median(latencies):.3f}" if latencies else ""
        ref = rows["torchft, clean"][0][2] if name.startswith("torchft") else reference
        equal = "" if name == "plain" else ("yes" if all(r[2] == ref for r in results) else "no")
        print(f"| {name} | {wall:.2f} | {lost} | {latency} | {equal} |")
    plain = statistics.median(training_seconds(r[3]) for r in rows["plain"])
    resilient = statistics.median(training_seconds(r[3]) for r in clean)
    print(f"\nTraining loop, clean: in place {resilient:.3f} s, plain DDP {plain:.3f} s: "
          f"{resilient / plain:.3f}x ({1000 * resilient / o.steps:.2f} against {1000 * plain / o.steps:.2f} ms a step)")


if __name__ == "__main__":
    main()
