"""For the benchmarks that kill ranks of examples/in_place_recovery under
`lockstep run`: the environment its jobs run in, and what they print about
deaths, re-formed groups and replacements, read back. The times are seconds
since the epoch, one clock for every rank of one host."""
import os
import re

DEATH = r"killing itself at step \d+, \w+, at ([\d.]+)"


def job_env(tmp, **extra):
    """The environment for a job whose temporary directory is `tmp`: the survivors of each death dump
    their flight records there (docs/diagnostics.md), not into the machine's temporary directory."""
    return dict(os.environ, LOCKSTEP_FLIGHT_DIR=tmp, **extra)


def times(output, pattern=DEATH):
    """Every time `pattern`'s group matched in the output, in order: by default the deaths (a victim prints
    the line just before it kills itself)."""
    return sorted(float(t) for t in re.findall(pattern, output))


def first_death(output):
    """The first death's time, or None where nobody died."""
    deaths = times(output)
    return deaths[0] if deaths else None


def reformed(output):
    """The times the survivors' groups re-formed (one line per survivor and death)."""
    return times(output, r"re-formed at ([\d.]+)")


def replacements_training(output):
    """(training at, process started at) for every replacement, in order."""
    return sorted((float(t), float(p)) for t, p in
                  re.findall(r"training at ([\d.]+) \(process started at ([\d.]+)\)", output))
