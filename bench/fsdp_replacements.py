#!/usr/bin/python3
"""How fast a fully sharded replacement is fed (lockstep run --on-rank-failure
continue --max-replacements 1, examples/fully_sharded --resilient): its
shard (parameters and Adam's two moments) against `lockstep bench --op
broadcast` at the shard's size, measured right after each run, on the same
transport. The goal of docs/performance.md's "Feeding a replacement": the
feeding's rate at least half the broadcast's bus bandwidth.

For each --width (the blocks' width: the shard grows with its square),
rank 1 is killed (SIGKILL) in the forward of step --kill-step, its
replacement joins at a step boundary, and the example prints the shard's
bytes and the feeding's time (from the survivors starting to send to the
replacement's digest compared). Each run's ratio is taken against the
broadcast measured right after it (this machine's speed moves between runs
by more than the ratio's margin); the table has the medians and every
run's ratio.

Usage: bench/fsdp_replacements.py [--build build] [--ranks 4] [--width 1024 2048]
           [--blocks 8] [--runs 3]
"""
import argparse
import os
import re
import statistics
import sys

import replacements


def fed_run(o, width):
    """One run: (the shard's bytes, the feeding's seconds, the kill to the replacement training)."""
    out = replacements.run(
        [os.path.join(o.build, "lockstep"), "run", "--nproc-per-node", str(o.ranks), "--grace-period", "2",
         "--on-rank-failure", "continue", "--max-replacements", "1", "--",
         os.path.join(o.build, "examples", "fully_sharded"), "--resilient", "--blocks", str(o.blocks), "--width",
         str(width), "--steps", "30", "--batch-size", "16", "--subset", "6000", "--kill",
         f"1:{o.kill_step}:forward"], 900)
    fed = re.search(r"fed its shard \(([\d.]+) MB\) by its peers in ([\d.]+) s.*training at ([\d.]+)", out)
    killed = re.search(r"rank 1: killed at step \d+, forward, at ([\d.]+)", out)
    if fed is None or killed is None:
        sys.exit(f"fsdp_replacements.py: no replacement fed at width {width}:\n{out[-3000:]}")
    return float(fed.group(1)) * 1e6, float(fed.group(2)), float(fed.group(3)) - float(killed.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--width", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--kill-step", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    o = parser.parse_args()
    print(f"### A fully sharded replacement's feeding ({o.ranks} ranks, {o.blocks} blocks, rank 1 killed at step "
          f"{o.kill_step}; medians of {o.runs} runs)\n")
    print("| width | shard fed (MB) | feeding (s) | feeding's rate (GB/s) | `lockstep bench` broadcast busbw (GB/s) "
          "| rate / busbw | each run's rate / busbw | kill to training (s) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    med = statistics.median
    for width in o.width:
        size, fed, busbw, ratio, to_train = 0, [], [], [], []
        for _ in range(o.runs):
            size, seconds, training = fed_run(o, width)
            fed.append(seconds)
            to_train.append(training)
            busbw.append(replacements.broadcast_bus_gbps(o, int(size)))
            ratio.append(size / seconds / 1e9 / busbw[-1])
        print(f"| {width} | {size / 1e6:.1f} | {med(fed):.3f} | {size / med(fed) / 1e9:.2f} | {med(busbw):.2f} "
              f"| {med(ratio):.2f} | {', '.join(f'{r:.2f}' for r in ratio)} | {med(to_train):.2f} |", flush=True)
    print()


if __name__ == "__main__":
    main()
