"""Starts a world of ranks as separate Python processes (as torchrun would:
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each running a case of
workers.py, with a deadline; every process is reaped, killed if needed.
A process still running at the deadline is first made to show where it
waits: its threads' native stacks (where gdb is installed) and their
Python stacks (faulthandler, on SIGABRT), in its output."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

WORKERS = Path(__file__).resolve().parent / "workers.py"


@dataclass
class Rank:
    returncode: int
    output: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(case: str, world: int, *args: str, deadline_s: float = 120) -> list[Rank]:
    port = free_port()
    procs = []
    # Flight-recorder dumps of the failure tests go to a directory of their own.
    with tempfile.TemporaryDirectory(prefix="lockstep-flight-") as flight_dir:
        for rank in range(world):
            rank_env = dict(os.environ, PYTHONFAULTHANDLER="1", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                            LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                            LOCKSTEP_FLIGHT_DIR=flight_dir)
            procs.append(subprocess.Popen([sys.executable, str(WORKERS), case, *args], env=rank_env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True))
        return reap(procs, deadline_s)


def run_torchrun(case: str, world: int, *args: str, deadline_s: float = 120) -> Rank:
    # torchrun keeps its ranks' logs in a torchelastic_* directory under
    # TMPDIR that it never removes: one of this run's own, removed with it.
    with tempfile.TemporaryDirectory(prefix="lockstep-torchrun-") as tmp:
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}",
                                 f"--master-port={free_port()}", str(WORKERS), case, *args],
                                env=dict(os.environ, TMPDIR=tmp, PYTHONFAULTHANDLER="1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        return reap([proc], deadline_s)[0]


def run_lockstep_run(cli: str, case: str, world: int, *args: str, deadline_s: float = 120) -> Rank:
    """The same under `lockstep run`, which runs a .py file with the python3
    first in PATH: this interpreter's."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", PYTHONFAULTHANDLER="1")
    proc = subprocess.Popen([cli, "run", f"--nproc-per-node={world}", str(WORKERS), case, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return reap([proc], deadline_s)[0]


def reap(procs: list[subprocess.Popen], deadline_s: float) -> list[Rank]:
    end = time.monotonic() + deadline_s
    results = []
    native_stacks: dict[int, str] = {}
    try:
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                native_stacks = native_stacks or show_where_they_wait(procs)
                kill_all(procs)
                out, _ = p.communicate()
                out += f"\n[launch] killed at the {deadline_s:.0f} s deadline"
            results.append(Rank(p.returncode, out + native_stacks.get(p.pid, "")))
    finally:
        kill_all(procs)
    return results


def show_where_they_wait(procs: list[subprocess.Popen]) -> dict[int, str]:
    """For each process still running: its native stacks by gdb, if there is
    one, returned by pid; then SIGABRT, on which faulthandler
    (PYTHONFAULTHANDLER, set for every rank) writes the Python stack of
    each thread to the process's own output. A hang at the deadline is then
    a place in the code, not only a timeout. gdb takes most of a minute to
    read libtorch's symbols: one gdb a process, all at once."""
    running = [p for p in procs if p.poll() is None]
    gdb = shutil.which("gdb")
    readers = {p.pid: subprocess.Popen([gdb, "-p", str(p.pid), "-batch", "-ex", "thread apply all bt 30"],
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
               for p in running} if gdb else {}
    stacks = {}
    end = time.monotonic() + 120
    for pid, reader in readers.items():
        try:
            out, _ = reader.communicate(timeout=max(end - time.monotonic(), 0.1))
            threads = out[out.find("\nThread "):] if "\nThread " in out else out
            stacks[pid] = f"\n[launch] native stacks of pid {pid} at the deadline (gdb):\n{threads[-20000:]}"
        except subprocess.TimeoutExpired:
            reader.kill()
            reader.communicate()
            stacks[pid] = f"\n[launch] gdb could not read the stacks of pid {pid} within 120 s"
    for p in running:
        try:
            os.kill(p.pid, signal.SIGABRT)
        except ProcessLookupError:
            pass
    for p in running:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    return stacks


def kill_all(procs: list[subprocess.Popen]) -> None:
    """Each process leads a group of its own (start_new_session): the group
    goes, with whatever the process started, whether or not it still runs
    (a rank that exited may have left a child behind in it)."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        p.wait()
