"""One replica group (one process) of a torchft job: torchft's Manager, its
DistributedDataParallel and optimizer wrapper, on the process group named
by --pg (ProcessGroupLockstep or torchft's ProcessGroupGloo). Started by
test_torchft.py, which restarts a replica group that died (a replacement,
as a scheduler would).

Made so that a schedule of deaths gives one quorum sequence whatever the
process group: the replica groups meet at a file gate before their first
quorum; a replacement writes its own gate file and the survivors, at step
--admit-at, wait for its quorum request to be at the lighthouse before they
ask for that step's quorum; a death is
at a named point of a named step (--die GROUP:STEP:POINT; only the first
incarnation dies). Each step's sample is a function of the step and the
replica group, so every run trains on the same data.

Writes, into --out: the log of every step it took (step, participants,
committed) and its final parameters as raw bytes."""

import argparse
import faulthandler
import os
import re
import signal
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import torch

import lockstep_torch  # noqa: F401  registers "lockstep"


def wait_for(path: Path, deadline_s: float, what: str) -> None:
    end = time.monotonic() + deadline_s
    while not path.exists():
        if time.monotonic() > end:
            sys.exit(f"{what}: {path} did not appear within {deadline_s:.0f} s")
        time.sleep(0.02)


def wait_for_the_replacements_request(deadline_s: float) -> None:
    """Until the lighthouse holds a quorum request. The survivors ask only
    after this, so the first request it holds is the replacement's; from
    then on a quorum needs every survivor (a quorum without one waits for
    it: the last quorum's members are all heartbeating), and forms with
    the replacement."""
    url = os.environ["TORCHFT_LIGHTHOUSE"] + "/status"
    end = time.monotonic() + deadline_s
    while True:
        with urllib.request.urlopen(url, timeout=10) as page:
            pending = re.search(r"\[\d+/(\d+) participants healthy\]", page.read().decode())
        if pending and int(pending.group(1)) >= 1:
            return
        if time.monotonic() > end:
            sys.exit(f"the replacement's quorum request did not reach the lighthouse within {deadline_s:.0f} s")
        time.sleep(0.02)


def make_pg(name: str, timeout: timedelta):
    if name == "lockstep":
        from lockstep_torch.torchft import ProcessGroupLockstep
        return ProcessGroupLockstep(timeout=timeout)
    from torchft import ProcessGroupGloo
    return ProcessGroupGloo(timeout=timeout)


def die(group: int, step: int, point: str) -> None:
    print(f"replica group {group}: dying at step {step}, {point}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pg", choices=["lockstep", "gloo"], required=True)
    parser.add_argument("--replicas", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--die", action="append", default=[], help="GROUP:STEP:POINT, POINT before_quorum "
                        "(before the step's quorum) or in_allreduce (after it, before the gradients' all-reduce)")
    parser.add_argument("--wrapper", choices=["ddp", "allreduce"], default="ddp",
                        help="torchft's DistributedDataParallel, or the Manager's all-reduce of each gradient "
                        "after the backward (torchft 0.2's DDP wrapper ends the process when an all-reduce fails)")
    parser.add_argument("--admit-at", type=int, default=-1, help="the step whose quorum admits the replacement")
    parser.add_argument("--out", required=True)
    parser.add_argument("--deadline", type=float, default=150)
    o = parser.parse_args()
    faulthandler.dump_traceback_later(o.deadline, exit=True)  # a hang shows where

    from torchft import DistributedDataParallel, Manager, Optimizer

    group = int(os.environ["REPLICA_GROUP_ID"])
    incarnation = int(os.environ.get("INCARNATION", "0"))
    out = Path(o.out)
    deaths = {}
    for spec in o.die:
        g, s, point = spec.split(":")
        if int(g) == group and incarnation == 0:
            deaths[int(s)] = point

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def load_state(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    store = torch.distributed.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=True,
                                       wait_for_workers=False)
    manager = Manager(pg=make_pg(o.pg, timedelta(seconds=30)), min_replica_size=1, load_state_dict=load_state,
                      state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
                      replica_id=f"replica_{group}", rank=0, world_size=1, store_addr="127.0.0.1",
                      store_port=int(os.environ["MASTER_PORT"]), timeout=timedelta(seconds=30),
                      quorum_timeout=timedelta(seconds=60))
    ddp = DistributedDataParallel(manager, model) if o.wrapper == "ddp" else model
    optimizer = Optimizer(manager, inner)

    # The gate: every first incarnation waits for the others before the first
    # quorum; a replacement announces its first quorum.
    (out / f"ready.{group}.{incarnation}").touch()
    if incarnation == 0:
        for g in range(o.replicas):
            wait_for(out / f"ready.{g}.0", 60, f"replica group {group}")
    admitted = False

    log = open(out / f"log.{group}.{incarnation}", "w")
    while manager.current_step() < o.steps:
        step = manager.current_step()
        if step == o.admit_at and incarnation == 0 and not admitted:
            # The test starts the replacement once it sees "admit" (a
            # replacement heartbeating to the lighthouse long before its first
            # quorum would hold back a survivors' quorum that is not more than
            # half of the replica groups alive), names it in "replacement",
            # and the replacement announces its first quorum with ready.<group>.1.
            (out / "admit").touch()
            wait_for(out / "replacement", 60, f"replica group {group}")
            wait_for(out / f"ready.{(out / 'replacement').read_text().strip()}.1", 60, f"replica group {group}")
            wait_for_the_replacements_request(60)
            admitted = True
        if deaths.get(step) == "before_quorum":
            die(group, step, "before its quorum")
        gen = torch.Generator().manual_seed(1000 * step + group)
        x = torch.randn(8, 32, generator=gen)
        y = torch.randint(0, 4, (8,), generator=gen)
        optimizer.zero_grad()  # asks for the step's quorum
        manager.wait_quorum()  # a replacement's step is then the one it healed to
        trained = manager.current_step()
        if deaths.get(step) == "in_allreduce":
            die(group, step, "after its quorum, before the all-reduce")
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        if o.wrapper == "allreduce":
            # The Manager's own fault-tolerant all-reduce: a failure is
            # reported to it, and the step is then not committed.
            for work in [manager.allreduce(p.grad) for p in model.parameters()]:
                work.wait()
        optimizer.step()  # commits the step where every participant's all-reduce succeeded
        committed = manager.current_step() > step
        log.write(f"step {trained} participants {manager.num_participants()} committed {int(committed)}\n")
        log.flush()
    with open(out / f"params.{group}.{incarnation}", "wb") as f:
        for p in model.parameters():
            f.write(p.detach().contiguous().numpy().tobytes())
    print(f"replica group {group}: {o.steps} steps", flush=True)
    manager.shutdown(wait=False)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
