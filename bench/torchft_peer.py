#!/usr/bin/env python3
"""torchft's DDP on Gloo (or, with --pg lockstep, on lockstep_torch.torchft's
process group), the peer of bench/in_place_recovery.py: the same
MLP (784-H-10, H=--hidden, 128 by default; dropout 0.1, SGD with momentum 0.9) on Fashion-MNIST,
--replicas replica groups of one process each on this machine, a global
batch cut evenly between them, and, with --kill R:S, replica group R killed
(SIGKILL) before the forward of step S. The survivors go on, as torchft
does, with the replica groups left: the failed step is discarded and every
later step averages fewer samples.

With --kill-every T --kills N instead, replica group 1 is killed every T
seconds of wall time (SIGKILL at its next step boundary, where torchft
0.2.0 survives a death), N times, and started again at once, as torchrun would restart its replica group: the new process joins
the next quorum and heals from a peer's state over torchft's transport
(the steady schedule of bench/replacements.py).

Prints the wall time of the whole run (processes, lighthouse, quorum
included), replica group 0's time per step over the second half of the
steps (the steady state), and writes replica group 0's final parameters (raw bytes) to
--save-params, to compare a killed run with a clean one.

torchft is a benchmark peer only (pip install torchft==0.2.0 into the
project's PyTorch environment: `make deps-torch2`), never a dependency.

Usage: .venv/torch2/bin/python bench/torchft_peer.py [--replicas 4]
           [--steps 400] [--batch 256] [--hidden 128] [--kill 1:200 | --kill-every 30 --kills 4]
           [--save-params F] [--pg gloo|lockstep [--python-dir build-torch2/python]]
"""
import argparse
import gzip
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np

DATA = "/usr/share/datasets/fashion-mnist"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_images(subset):
    with gzip.open(os.path.join(DATA, "train-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(os.path.join(DATA, "train-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    if subset:
        images, labels = images[:subset], labels[:subset]
    return images.astype(np.float32) / 255.0, labels.astype(np.int64)


def replica(o):
    """One replica group of one process: torchft's Manager, DDP and optimizer."""
    import faulthandler
    faulthandler.dump_traceback_later(o.timeout - 10, exit=True)  # a hang shows where
    import torch
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
    if o.pg == "lockstep":
        sys.path.insert(0, o.python_dir)
        from lockstep_torch.torchft import ProcessGroupLockstep

    torch.set_num_threads(1)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, o.hidden), torch.nn.ReLU(),
                                torch.nn.Dropout(0.1), torch.nn.Linear(o.hidden, 10))
    inner = torch.optim.SGD(model.parameters(), lr=o.lr, momentum=0.9)
    images, labels = load_images(o.subset)
    group = int(os.environ["REPLICA_GROUP_ID"])
    per_replica = o.batch // o.replicas
    state = lambda: {"model": model.state_dict(), "optim": inner.state_dict()}

    def load(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    # The replica group's store, which torchrun would host: one process a group.
    store = torch.distributed.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=True,
                                       wait_for_workers=False)
    pg = ProcessGroupLockstep() if o.pg == "lockstep" else ProcessGroupGloo()
    manager = Manager(pg=pg, min_replica_size=1, load_state_dict=load, state_dict=state,
                      replica_id=f"replica_{group}", rank=0, world_size=1)
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    kill = tuple(int(x) for x in o.kill.split(":")) if o.kill else None
    # --kill-every: SIGUSR1 from the parent asks for a death at the next
    # step boundary. torchft 0.2.0's DDP wrapper fails an assertion on the
    # survivors when a peer dies inside the all-reduce (docs/faults.md), so
    # its deaths come between steps, where it survives them.
    asked_to_die = []
    signal.signal(signal.SIGUSR1, lambda *_: asked_to_die.append(True))
    per_epoch = len(images) // o.batch
    half_time = None
    while manager.current_step() < o.steps:
        step = manager.current_step()
        if step == o.steps // 2 and half_time is None:
            half_time = time.perf_counter()
        if asked_to_die or (kill and kill == (group, step)):
            print(f"replica group {group}: killing itself at step {step}, at {time.time():.6f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        first = (step % per_epoch) * o.batch + group * per_replica
        x = torch.from_numpy(images[first:first + per_replica])
        y = torch.from_numpy(labels[first:first + per_replica])
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
    if group == 0 and o.save_params:
        with open(o.save_params, "wb") as f:
            for p in model.parameters():
                f.write(p.detach().contiguous().numpy().tobytes())
    if group == 0:
        per_step = (time.perf_counter() - half_time) / (o.steps - o.steps // 2)
        print(f"replica group 0: {per_step * 1e3:.2f} ms per step over steps {o.steps // 2}-{o.steps - 1}")
    print(f"replica group {group}: {o.steps} steps committed", flush=True)
    manager.shutdown(wait=False)
    sys.stdout.flush()
    os._exit(0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--subset", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--pg", choices=["gloo", "lockstep"], default="gloo")
    parser.add_argument("--python-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                              "build-torch2", "python"),
                        help="where lockstep_torch is installed (make build-python)")
    parser.add_argument("--kill", default="", help="R:S: replica group R dies before step S")
    parser.add_argument("--kill-every", type=float, default=0,
                        help="seconds between kills of replica group 1, each restarted at once")
    parser.add_argument("--kills", type=int, default=0, help="how many, with --kill-every")
    parser.add_argument("--save-params", default="")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--replica", action="store_true", help=argparse.SUPPRESS)
    o = parser.parse_args()
    if o.replica:
        return replica(o)
    lighthouse_port = free_port()
    bindir = os.path.dirname(sys.executable)
    lighthouse = subprocess.Popen([os.path.join(bindir, "torchft_lighthouse"), "--min_replicas", "1",
                                   "--bind", f"127.0.0.1:{lighthouse_port}", "--join_timeout_ms", "10000"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    start = time.monotonic()

    def start_replica(group):
        env = dict(os.environ, REPLICA_GROUP_ID=str(group), NUM_REPLICA_GROUPS=str(o.replicas),
                   TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{lighthouse_port}", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", OMP_NUM_THREADS="1")
        return subprocess.Popen([sys.executable, __file__, "--replica"] + sys.argv[1:], env=env,
                                start_new_session=True)

    procs = []
    killed = []  # replica group 1's processes killed by --kill-every
    try:
        procs = [start_replica(group) for group in range(o.replicas)]
        for k in range(o.kills if o.kill_every > 0 else 0):
            next_kill = start + (k + 1) * o.kill_every
            while time.monotonic() < next_kill and procs[1].poll() is None:
                time.sleep(0.05)
            if procs[1].poll() is not None:
                break  # the run ended first
            print(f"torchft_peer: killing replica group 1 at {time.time():.6f} (kill {k + 1} of {o.kills})",
                  flush=True)
            procs[1].send_signal(signal.SIGUSR1)  # it kills itself (SIGKILL) at its next step boundary
            procs[1].wait()
            killed.append(procs[1])
            procs[1] = start_replica(1)
        codes = [p.wait(timeout=max(o.timeout - (time.monotonic() - start), 1)) for p in procs]
    finally:
        for p in procs + killed + [lighthouse]:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    wall = time.monotonic() - start
    survivors = [c for c in codes if c == 0]
    print(f"torchft ({o.pg}): {len(survivors)} of {o.replicas} replica groups finished {o.steps} steps in {wall:.2f} s")
    return 0 if survivors and all(c == 0 or c == -signal.SIGKILL for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
