"""torchft over lockstep (lockstep_torch.torchft.ProcessGroupLockstep): torchft's
own Manager, DDP wrapper and optimizer wrapper, its lighthouse, replica
groups that die (before a step's quorum, or inside the gradients'
all-reduce) and a replacement that heals from a peer, run once over lockstep
and once over torchft's Gloo group with the same schedule (see
torchft_replica.py): the same quorum sequence, the same steps committed,
the same final parameters; and every live replica group, the replacement
included, holds the same bytes.

torchft is an optional extra of the package; these tests skip without it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch import free_port, kill_all

pytest.importorskip("torchft", reason="torchft is not installed (pip install torchft: an optional extra)")

REPLICA = Path(__file__).resolve().parent / "torchft_replica.py"
LIGHTHOUSE = Path(sys.executable).parent / "torchft_lighthouse"


def start_replica(group, incarnation, lighthouse_port, args, out):
    env = dict(os.environ, REPLICA_GROUP_ID=str(group), INCARNATION=str(incarnation), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{lighthouse_port}",
               OMP_NUM_THREADS="1")
    log = open(out / f"output.{group}.{incarnation}", "w")
    return subprocess.Popen([sys.executable, str(REPLICA), *args, "--out", str(out)], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def run_job(tmp: Path, pg: str, replicas: int, steps: int, deaths: list[str], replace: int = -1,
            admit_at: int = -1, wrapper: str = "ddp", deadline_s: float = 180) -> Path:
    """Runs the job; restarts replica group `replace` once, when it has died
    and the survivors have reached step `admit_at`.
    Returns the directory of its logs and parameters."""
    out = tmp / pg
    out.mkdir()
    port = free_port()
    # min_replicas 1: the survivors go on alone. A quorum forms once every
    # replica group heartbeating has asked (a dead one stops within 5 s), or
    # after join_timeout: long, so that a replica group slow to ask on a
    # loaded machine is waited for, not left out.
    lighthouse = subprocess.Popen([str(LIGHTHOUSE), "--min_replicas", "1", "--bind", f"127.0.0.1:{port}",
                                   "--join_timeout_ms", "30000"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
    args = ["--pg", pg, "--replicas", str(replicas), "--steps", str(steps), "--admit-at", str(admit_at),
            "--wrapper", wrapper,
            "--deadline", str(deadline_s - 20)] + [a for d in deaths for a in ("--die", d)]
    procs = {(g, 0): start_replica(g, 0, port, args, out) for g in range(replicas)}
    end = time.monotonic() + deadline_s
    try:
        while any(p.poll() is None for p in procs.values()):
            if time.monotonic() > end:
                pytest.fail(f"{pg}: the job passed its {deadline_s:.0f} s deadline:\n{outputs(out)}")
            dead = procs.get((replace, 0))
            if dead is not None and dead.poll() == -signal.SIGKILL and (replace, 1) not in procs \
                    and (out / "admit").exists():
                (out / "replacement").write_text(str(replace))
                procs[(replace, 1)] = start_replica(replace, 1, port, args, out)
            time.sleep(0.05)
    finally:
        kill_all(list(procs.values()) + [lighthouse])
    for (g, inc), p in procs.items():
        died = any(d.startswith(f"{g}:") for d in deaths) and inc == 0
        want = -signal.SIGKILL if died else 0
        assert p.returncode == want, f"{pg}: replica group {g} (incarnation {inc}) exited {p.returncode}:\n" \
                                     f"{outputs(out)}"
    return out


def outputs(out: Path) -> str:
    return "\n".join(f"--- {f.name}\n{f.read_text()[-3000:]}" for f in sorted(out.glob("output.*")))


def step_logs(out: Path) -> dict[str, str]:
    return {f.name: f.read_text() for f in sorted(out.glob("log.*"))}


def params(out: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(out.glob("params.*"))}


def run_both(tmp_path, **job):
    lockstep = run_job(tmp_path, "lockstep", **job)
    gloo = run_job(tmp_path, "gloo", **job)
    assert step_logs(lockstep) == step_logs(gloo), f"lockstep:\n{step_logs(lockstep)}\ngloo:\n{step_logs(gloo)}"
    for run in (lockstep, gloo):
        finals = params(run)
        assert len(set(finals.values())) == 1, f"{run.name}: the live replica groups differ: {list(finals)}"
    return params(lockstep), params(gloo), step_logs(lockstep)


def test_ddp_wrapper_two_replica_groups_one_dies_and_is_replaced_bit_for_bit_as_on_gloo(tmp_path):
    # torchft's DistributedDataParallel; a replica group killed between
    # steps (torchft's own failure model). Two replica groups: every
    # all-reduce sums two values (or one), in the same order on both
    # process groups, so the parameters agree to the bit.
    lockstep, gloo, logs = run_both(tmp_path, replicas=2, steps=10, deaths=["1:3:before_quorum"], replace=1,
                                    admit_at=6)
    assert lockstep == gloo
    assert "step 3 participants 1 committed 1" in logs["log.0.0"], logs
    assert "step 6 participants 1 committed 1" in logs["log.0.0"], logs  # the replacement heals
    assert logs["log.1.1"].startswith("step 6 participants 1 committed 1\nstep 7 participants 2 "), logs


def test_a_replica_group_dies_inside_the_all_reduce_and_the_step_is_retried_as_on_gloo(tmp_path):
    # The Manager's all-reduce of each gradient: lockstep fails the
    # survivors' all-reduce naming the dead replica group, torchft discards
    # the step and retries it with the survivors; the replacement heals and
    # trains from the next step.
    import numpy as np
    lockstep, gloo, logs = run_both(tmp_path, replicas=3, steps=10, deaths=["2:3:in_allreduce"], replace=2,
                                    admit_at=6, wrapper="allreduce")
    for survivor in ("log.0.0", "log.1.0"):
        assert "step 3 participants 3 committed 0\nstep 3 participants 2 committed 1\n" in logs[survivor], logs
        assert "step 6 participants 2 committed 1\nstep 7 participants 3 committed 1\n" in logs[survivor], logs
    assert logs["log.2.1"].startswith("step 6 participants 2 committed 1\nstep 7 participants 3 "), logs
    assert "lost rank 2" in (tmp_path / "lockstep" / "output.0.0").read_text()
    # Three addends: Gloo's ring and lockstep's fixed order may round a sum
    # differently, so the two runs agree to float tolerance.
    a = np.frombuffer(next(iter(lockstep.values())), np.float32)
    b = np.frombuffer(next(iter(gloo.values())), np.float32)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
