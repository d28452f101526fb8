#!/usr/bin/python3
"""Checks what `lockstep simulate` predicts failures cost against jobs whose
ranks are killed at a known rate (docs/scaling.md, "What failures cost").

examples/in_place_recovery runs under `lockstep run`, --ranks processes on
this machine, a checkpoint every --checkpoint-every steps:
  1. clean: the step time, and the launcher's start-up;
  2. calibration: rank 1 killed just after a checkpoint under
     --on-rank-failure restart (the restart's cost), and killed before the
     first step under continue (a step with a survivor holding two shards:
     the compute share; and the time to re-form), ranks 1..k killed before
     the first step for each k up to --ranks - 1 (the step after k losses:
     where ranks share cores, no per-node rule holds; with --hosts, once for
     each way k random deaths fall on the hosts, weighted by its chance: a
     host that loses every rank leaves the others on fewer hosts, a step of
     another pace), and killed in the run's
     first quarter under continue with --max-replacements (from the death
     to its replacement training);
  3. the prediction: `lockstep simulate --step-ms` with the measured step,
     restart and re-form times, the steps after losses and the same rate,
     written down before the jobs run: each mode's efficiency (a clean
     job's time over its own), and in place also by the compute share's
     rule alone, for comparison;
  4. --runs rounds of one job in each mode, restart, continue and replace
     (continue with --max-replacements; all with --max-restarts 100),
     while a killer sends SIGKILL to a random rank process at random
     times, a Poisson process of --mean-interval seconds per rank divided
     by the ranks running (each rank failing at the same rate), and one
     clean job: the machine's pace drifts between runs by more than a kill
     costs, so the clean reference is measured as often, between them;
  5. each mode's mean wall against the predicted efficiency applied to the
     clean jobs' mean, with the spread the model's simulated jobs give a
     mean of --runs jobs (how many kills a job draws, and when, moves its
     wall more than the model's error may), and what a kill cost against
     what the model says; in place also what the steps measured after
     losses give each job once its kills are known (when, and on which
     host), which tells the model's error from the draw's.
--modes runs some of the three only (a mode's calibration with it): more
runs of one mode in the same time.
The ranks stand for nodes (one rank a node). Prints a markdown table for
docs/scaling.md.

With --hosts (the holders of network namespaces: bench/two_shaped_hosts.sh
makes them; bench/validate_failures_two_hosts.sh runs this so), each job
is one `lockstep run` a host, --ranks / hosts ranks each, meeting at
--master-addr (host 0's address) over the link between them; the killer
picks among every host's ranks.

Usage: bench/validate_failures.py [--build build] [--ranks 4] [--steps 2000]
           [--batch 64] [--hidden 128] [--mean-interval 40] [--checkpoint-every 100]
           [--runs 3] [--seed 1] [--restart-offsets 50,90] [--modes restart,continue,replace]
           [--hosts HOLDER0,HOLDER1 --master-addr ADDR]
"""
import argparse
import itertools
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import recovery_jobs


def children(pid):
    """The launcher's rank processes."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


PORTS = itertools.count(29600)  # a port of its own for each job's store: none waits on the last one's


def launchers(args, options):
    """The `lockstep run` command of each host: one on this machine, or one in each network namespace."""
    cli = os.path.join(args.build, "lockstep")
    if not args.hosts:
        return [[cli, "run", "--nproc-per-node", str(args.ranks)] + options]
    hosts = args.hosts.split(",")
    port = str(next(PORTS))
    # nsenter execs the launcher: the process started is the launcher, whose children are its ranks.
    return [["nsenter", "-t", holder, "--net", "--uts", cli, "run", "--nnodes", str(len(hosts)), "--node-rank",
             str(i), "--master-addr", args.master_addr, "--master-port", port,
             "--nproc-per-node", str(args.ranks // len(hosts))] + options for i, holder in enumerate(hosts)]


def run_job(args, mode, kills=(), killer_rate=None, rng=None, replacements=False, step_times=None):
    """One job: (wall seconds, output, kills sent as [(seconds from the start, the victim's host)]). With
    `step_times` (a list), world rank 0's committed steps (step, wall-clock time) are appended to it."""
    with tempfile.TemporaryDirectory() as tmp:
        command = ["--on-rank-failure", mode, "--max-restarts", "100", "--grace-period", "1"]
        if replacements:
            command += ["--max-replacements", "1000"]
        command += ["--",
                   os.path.join(args.build, "examples", "in_place_recovery"), "--steps", str(args.steps),
                   "--batch", str(args.batch), "--hidden", str(args.hidden), "--subset", "6000", "--window", "5",
                   "--checkpoint", os.path.join(tmp, "job.ckpt"), "--checkpoint-every", str(args.checkpoint_every)]
        for k in kills:
            command += ["--kill", k]
        if step_times is not None:
            command += ["--step-times", os.path.join(tmp, "steps.txt")]
        env = recovery_jobs.job_env(tmp, LOCKSTEP_TIMEOUT="30")
        start = time.monotonic()
        procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                  start_new_session=True) for c in launchers(args, command)]
        sent = []
        done = threading.Event()
        training = threading.Event()  # the first step's loss printed: the job's clock starts
        lines = []

        def reader(proc):
            for line in proc.stdout:
                lines.append(line)
                if "step 0: loss" in line:
                    training.set()

        def ranks_running():
            return [(host, rank) for host, proc in enumerate(procs) for rank in children(proc.pid)]

        def killer():
            # Each running rank fails at `killer_rate` per second: the next
            # failure among n after an exponential time of rate n x rate.
            # From the first step on: the model's job starts there (failures
            # during the restarts' start-up are the model's too).
            while not training.wait(0.05):
                if done.is_set():
                    return
            while not done.is_set():
                ranks = ranks_running()
                if not ranks:
                    if done.wait(0.05):
                        return
                    continue
                if done.wait(rng.expovariate(killer_rate * len(ranks))):
                    return
                ranks = ranks_running()
                if ranks:
                    host, victim = rng.choice(ranks)
                    try:
                        os.kill(victim, 9)
                        sent.append((time.monotonic() - start, host))
                    except ProcessLookupError:
                        pass

        thread = threading.Thread(target=killer, daemon=True) if killer_rate else None
        if thread:
            thread.start()
        reads = [threading.Thread(target=reader, args=(proc,), daemon=True) for proc in procs]
        for read in reads:
            read.start()
        try:
            for proc in procs:
                proc.wait(timeout=max(1.0, args.timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                proc.wait()
            sys.exit(f"validate_failures.py: a {mode} job ran past {args.timeout} s")
        for read in reads:
            read.join()
        output = "".join(lines)
        done.set()
        if thread:
            thread.join()
        wall = time.monotonic() - start
        for proc in procs:
            if proc.returncode != 0:
                sys.exit(f"validate_failures.py: {' '.join(proc.args)} failed ({proc.returncode}):\n"
                         f"{output[-3000:]}")
        if step_times is not None:
            with open(os.path.join(tmp, "steps.txt")) as f:
                step_times += [(int(s), float(at)) for s, at, _ in (line.split() for line in f)]
        return wall, output, sent


def training_seconds(output):
    """The first rank's "N steps in X s" of the last attempt."""
    found = re.findall(r"world rank 0: (\d+) steps in ([0-9.]+) s", output)
    if not found:
        sys.exit("validate_failures.py: no 'world rank 0: N steps in X s' line:\n" + output[-2000:])
    return int(found[-1][0]), float(found[-1][1])


def replacement_cost(output, steps, settle=1.0):
    """One death and its replacement, from the run's own clock (one host): (the death to the replacement
    training, the seconds of training lost from the death to `settle` s after it trained). The loss is the
    window's length less the steps world rank 0 committed in it at the pace of the 2 s before the death;
    it counts the replacement's process start taking CPU from the survivors, which a node of its own
    would not."""
    death = recovery_jobs.first_death(output)
    training = [t for t, _ in recovery_jobs.replacements_training(output) if death is not None and t > death]
    if death is None or not training:
        sys.exit("validate_failures.py: no kill or no replacement training in:\n" + output[-2000:])
    trained = training[0]
    before = [at for _, at in steps if death - 2 <= at < death]
    if len(before) < 5:
        sys.exit("validate_failures.py: too few steps before the death to set the pace")
    pace = (before[-1] - before[0]) / (len(before) - 1)
    end = trained + settle
    done = sum(1 for _, at in steps if death <= at < end)
    return trained - death, (end - death) - done * pace


def check_restart_offsets(args, at, restart_s, step_s):
    """Kills rank 1 `offset` steps after the checkpoint at step `at`, under restart, and prints what the
    death cost on the run's own clock (from the death to the killed step committed again, world rank 0's
    step times) beside what the model charges: the restart and the steps since the checkpoint, at the
    clean run's pace. The runs' walls say less: the machine's pace moves between runs by more."""
    for offset in (int(o) for o in args.restart_offsets.split(",") if o):
        for _ in range(args.runs):
            steps = []
            _, out, _ = run_job(args, "restart", kills=[f"1:{at + offset}:forward"], step_times=steps)
            death = recovery_jobs.first_death(out)
            again = [t for s, t in steps if s == at + offset and death is not None and t > death]
            if not again:
                sys.exit(f"validate_failures.py: no death, or step {at + offset} not committed again:\n" + out[-2000:])
            print(f"restart {offset} steps after the checkpoint: the death to that step committed again "
                  f"{again[0] - death:.2f} s; the model: {restart_s + (offset + 1) * step_s:.2f} s "
                  f"(the restart {restart_s:.2f} s and {offset + 1} steps)", flush=True)


def loss_patterns(ranks, hosts, k):
    """The ways k ranks killed at random fall on the hosts, as [(chance, ranks to kill, lost per host)]: each
    k-set of ranks equally likely, the hosts alike (only how many each loses matters); the ranks to kill
    spare world rank 0, whose step times are read (host 0 loses the fewest, after rank 0)."""
    per = ranks // hosts
    ways = {}
    for lost in itertools.combinations(range(ranks), k):
        counts = tuple(sorted((sum(1 for r in lost if r // per == h) for h in range(hosts)), reverse=True))
        ways[counts] = ways.get(counts, 0) + 1
    total = sum(ways.values())
    patterns = []
    for counts, n in sorted(ways.items()):
        on_host = (counts[-1],) + counts[:-1]
        lost = list(range(1, 1 + on_host[0])) + [h * per + i for h in range(1, hosts) for i in range(on_host[h])]
        patterns.append((n / total, lost, "+".join(str(c) for c in counts)))
    return patterns


def wall_given_kills(kills, hosts, clean_s, start_s, detect_s, pattern_steps):
    """In place: the wall the measured steps give a job once the kills it drew are known ([(seconds from the
    start, the victim's host)]): the clean job's `clean_s`, training from `start_s` on, each stretch after a
    kill at the step measured after the losses so far as they fall on the hosts (`pattern_steps`, {"2+0":
    0.61, ...}: lost per host, most first), each re-forming (`detect_s`) besides. None where every rank was
    lost (the restart). Not a prediction (the kills are drawn as the job runs): it tells the model's error
    from the draw's."""
    lost = [0] * hosts
    now, pace, left = start_s, 1.0, clean_s - start_s  # left: training, in clean seconds
    for at, host in sorted(kills):
        done = max(0.0, at - now) / pace
        if done >= left:
            break
        left -= done
        now = max(at, now) + detect_s
        lost[host] += 1
        key = "+".join(str(c) for c in sorted(lost, reverse=True))
        if key not in pattern_steps:
            return None
        pace = pattern_steps[key]
    return now + left * pace


def predict(args, step_s, compute_share, restart_s, detect_s, replace_s, train_s, after_losses=()):
    """What `lockstep simulate` predicts: {mode: (efficiency, seconds lost per failure, failures, one job's
    spread: the standard deviation of its wall over the mean, from the model's simulated jobs)}.
    `after_losses`: the steps measured after 1, 2, ... losses over the clean one (empty: the rule)."""
    measured = ["--step-after-losses", ",".join(f"{x:.3f}" for x in after_losses)] if after_losses else []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "failures.json")
        subprocess.run([os.path.join(args.build, "lockstep"), "simulate", *measured, "--step-ms", f"{1e3 * step_s:.4f}",
                        "--compute-share", f"{compute_share:.3f}", "--world-sizes", str(args.ranks),
                        "--ranks-per-host", "1", "--node-mtbf-hours", f"{args.mean_interval / 3600:.6f}",
                        "--job-hours", f"{train_s / 3600:.6f}", "--checkpoint-every", str(args.checkpoint_every),
                        "--restart-seconds", f"{restart_s:.3f}", "--detect-seconds", f"{detect_s:.3f}",
                        "--replace-seconds", f"{replace_s:.3f}",
                        "--out", tmp, "--json", out], check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            modes = json.load(f)["failures"][0]["modes"]
        return {m: (v["efficiency"], v["lost_per_failure_s"], v["failures"], v["job_spread"])
                for m, v in modes.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128, help="the MLP's hidden width (4096: a step of tens of ms)")
    p.add_argument("--mean-interval", type=float, default=40, help="seconds between one rank's failures, on average")
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--restart-offsets", default="",
                   help="steps after a checkpoint (comma-separated) to kill a rank at under restart, each --runs "
                        "times, before the rest: what one death costs on the run's own clock against the model's "
                        "restart plus the steps redone")
    p.add_argument("--hosts", default="",
                   help="comma-separated pids holding each host's network namespace (bench/two_shaped_hosts.sh): "
                        "one launcher a host, --ranks divided among them")
    p.add_argument("--master-addr", default="", help="with --hosts: host 0's address, where the job's store listens")
    p.add_argument("--modes", default="restart,continue,replace",
                   help="the recovery modes to run, comma-separated (continue: in place)")
    args = p.parse_args()
    all_modes = (("restart", "restart"), ("continue", "in-place"), ("replace", "replace"))
    asked = [m for m in args.modes.split(",") if m]
    unknown = [m for m in asked if m not in dict(all_modes)]
    if unknown or not asked:
        p.error(f"--modes {args.modes}: name some of restart, continue, replace")
    if args.hosts and (not args.master_addr or args.ranks % len(args.hosts.split(","))):
        p.error("--hosts needs --master-addr, and --ranks a multiple of the hosts")
    rng = random.Random(args.seed)

    clean_wall, out, _ = run_job(args, "continue")
    steps, train_s = training_seconds(out)
    step_s = train_s / steps
    startup_s = clean_wall - train_s
    print(f"clean: {clean_wall:.2f} s, {steps} steps in {train_s:.2f} s ({1e3 * step_s:.2f} ms a step), "
          f"start-up and end {startup_s:.2f} s", flush=True)

    # Just after the checkpoint of the run's middle: almost nothing to redo.
    # The restart's cost on the run's own clock, from the victim's death to
    # the restarted job's first committed step less one step: not against
    # the clean run's wall, nor the pace of the run's two halves, which
    # move by more than a restart costs.
    at = (args.steps // 2 // args.checkpoint_every) * args.checkpoint_every
    restarted_steps = []
    _, out, _ = run_job(args, "restart", kills=[f"1:{at}:forward"], step_times=restarted_steps)
    death = recovery_jobs.first_death(out)
    if death is None or not restarted_steps:
        sys.exit("validate_failures.py: the restart's calibration printed no kill or no steps:\n" + out[-2000:])
    restart_s = max(0.0, min(t for _, t in restarted_steps if t > death) - death - step_s)
    wall, out, _ = run_job(args, "continue", kills=["1:0:forward"])
    _, slowed_s = training_seconds(out)
    compute_share = min(1.0, max(0.0, slowed_s / train_s - 1))
    reformed = [float(x) for x in re.findall(r"re-formed in ([0-9.]+) s", out)]
    detect_s = statistics.median(reformed) if reformed else 0.1
    after_losses = [slowed_s / train_s]
    hosts = len(args.hosts.split(",")) if args.hosts else 1
    pattern_steps = {"+".join(["1"] + ["0"] * (hosts - 1)): after_losses[0]}  # rank 1: on host 0
    for k in range(2, args.ranks):
        step = 0.0
        for chance, lost, counts in loss_patterns(args.ranks, hosts, k):
            _, out, _ = run_job(args, "continue", kills=[f"{r}:0:forward" for r in lost])
            slowed = training_seconds(out)[1] / train_s
            pattern_steps[counts] = slowed
            step += chance * slowed
            print(f"the step after {k} losses, {counts} on the hosts (a chance of {chance:.2f}): {slowed:.2f}x",
                  flush=True)
        after_losses.append(step)
    replace_s, replaced = 0.0, "no replacement asked for (--modes)"
    if "replace" in asked:
        steps_seen = []
        _, out, _ = run_job(args, "continue", kills=[f"1:{args.steps // 4}:forward"], replacements=True,
                            step_times=steps_seen)
        to_training_s, lost_s = replacement_cost(out, steps_seen)
        # The model's replacement: the job a node short (slower by short_by)
        # for replace_s after the detection and half a step. replace_s is set
        # so that one death costs what this one did.
        short_by = 1 - 1 / (1 + compute_share)
        replace_s = max(0.0, (lost_s - detect_s - step_s / 2) / short_by) if short_by > 0 else to_training_s
        replaced = (f"a replacement trains {to_training_s:.2f} s after the death, which cost {lost_s:.2f} s of "
                    f"training (the model's replace time: {replace_s:.2f} s a node short)")
    print(f"calibration: a restart costs {restart_s:.2f} s; a survivor holding two shards makes a step "
          f"{slowed_s / train_s:.2f}x (compute share {compute_share:.2f}); re-formed in {detect_s:.3f} s; "
          f"{replaced}; the step after 1..{args.ranks - 1} "
          f"losses: {', '.join(f'{x:.2f}x' for x in after_losses)}", flush=True)

    check_restart_offsets(args, at, restart_s, step_s)

    by_rule = predict(args, step_s, compute_share, restart_s, detect_s, replace_s, train_s)
    predicted = predict(args, step_s, compute_share, restart_s, detect_s, replace_s, train_s, after_losses)
    print(f"in place by the compute share's rule alone: {startup_s + train_s / by_rule['in-place'][0]:.1f} s "
          f"(efficiency {by_rule['in-place'][0]:.3f}, {by_rule['in-place'][1]:.2f} s a kill)", flush=True)
    expected = {m: startup_s + train_s / e for m, (e, *_) in predicted.items()}
    print("predicted (before the runs): " + ", ".join(f"{m} {t:.1f} s (efficiency {predicted[m][0]:.3f}, one "
                                                        f"job's spread {100 * predicted[m][3]:.1f}%)"
                                                        for m, t in expected.items()), flush=True)

    # Rounds of one job in each mode and a clean one: the VM's pace drifts
    # between runs by several seconds, more than a kill costs, so the clean
    # reference is measured beside the killed runs, as often, and the
    # prediction (an efficiency, written above) applied to it.
    modes = [(mode, model_mode) for mode, model_mode in all_modes if mode in asked]
    walls = {mode: [] for mode, _ in modes}
    kills = {mode: [] for mode, _ in modes}
    drawn = []  # the in-place jobs' kills, as sent
    clean_walls = [clean_wall]
    for _ in range(args.runs):
        for mode, _ in modes:
            wall, _, sent = run_job(args, "continue" if mode == "replace" else mode,
                                    killer_rate=1 / args.mean_interval, rng=rng, replacements=mode == "replace")
            walls[mode].append(wall)
            kills[mode].append(len(sent))
            if mode == "continue":
                drawn.append(sent)
            at = ", ".join(f"{s:.1f} s (host {h})" for s, h in sent)
            print(f"{mode}: {wall:.2f} s, {len(sent)} kill(s){': ' + at if sent else ''}", flush=True)
        wall, _, _ = run_job(args, "continue")
        clean_walls.append(wall)
        print(f"clean: {wall:.2f} s", flush=True)
    clean_ref = statistics.mean(clean_walls)

    def standard_error(xs):
        return statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")

    rows = []
    for mode, model_mode in modes:
        measured = statistics.mean(walls[mode])
        efficiency = predicted[model_mode][0]
        expected_s = startup_s + (clean_ref - startup_s) / efficiency
        # The draw's spread of a mean of this many jobs: the model's
        # simulated jobs' spread, on the training part of the wall.
        draw_s = predicted[model_mode][3] * (expected_s - startup_s) / len(walls[mode]) ** 0.5
        # Per kill, pooled over the runs: what a death cost against the
        # clean runs, beside what the model charges one. Free of how many
        # deaths the Poisson process happened to give.
        per_kill = (sum(walls[mode]) - len(walls[mode]) * clean_ref) / max(1, sum(kills[mode]))
        rows.append((mode, measured, standard_error(walls[mode]), statistics.mean(kills[mode]),
                     predicted[model_mode][2], expected_s, draw_s, expected_s / measured - 1, per_kill,
                     predicted[model_mode][1]))

    on_hosts = f" on {hosts} hosts" if args.hosts else ""
    print(f"\n{args.ranks} ranks{on_hosts}, hidden {args.hidden}, {args.steps} steps of {1e3 * step_s:.1f} ms, a rank killed every "
          f"{args.mean_interval:g} s on average, checkpoint every {args.checkpoint_every} steps, "
          f"{args.runs} run(s) each; clean {clean_ref:.1f} ± {standard_error(clean_walls):.1f} s "
          f"({len(clean_walls)} runs)\n")
    # The wall's error mixes two things: how many kills the Poisson draws
    # gave (beside the model's expected count) and what each cost.
    print(f"| mode | measured wall (mean ± its standard error) | kills (mean) | kills predicted | predicted wall "
          f"(the efficiency predicted, on the clean runs' mean) ± the draw's spread of a mean of {args.runs} | "
          f"error | lost per kill: measured (pooled) | predicted |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, measured, spread, kills, predicted_kills, expected_s, draw_s, error, per_kill, predicted_per_failure in rows:
        print(f"| {mode} | {measured:.1f} ± {spread:.1f} s | {kills:.1f} | {predicted_kills:.1f} | "
              f"{expected_s:.1f} ± {draw_s:.1f} s | {100 * error:+.1f}% | {per_kill:.2f} s | "
              f"{predicted_per_failure:.2f} s |")
    if drawn:
        given = [wall_given_kills(sent, hosts, clean_ref, startup_s, detect_s, pattern_steps) for sent in drawn]
        known = [(g, w) for g, w in zip(given, walls["continue"]) if g is not None]
        if known:
            mean_given = statistics.mean(g for g, _ in known)
            mean_measured = statistics.mean(w for _, w in known)
            print(f"\nIn place, given the kills each job drew (their times and hosts, known only after it ran), the "
                  f"steps measured after losses say {', '.join(f'{g:.1f}' for g, _ in known)} s against "
                  f"{', '.join(f'{w:.1f}' for _, w in known)} measured: a mean of {mean_given:.1f} against "
                  f"{mean_measured:.1f} s ({100 * (mean_given / mean_measured - 1):+.1f}%), the model's error "
                  f"without the draw's.")


if __name__ == "__main__":
    main()
