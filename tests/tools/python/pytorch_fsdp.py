"""PyTorch's side of tests/torch/pytorch_fsdp_parity.cc: N gloo processes
train an MLP of blocks with FSDP2 (torch.distributed.fsdp.fully_shard: each
block a unit, then the root; reshard_after_forward=True) on the same global
batches, with SGD (momentum) or Adam, and rank 0 writes the final whole
parameters.

    python3 pytorch_fsdp.py OUT_DIR RANKS {sgd,adam}

writes, as raw little-endian float32 (parameters in model order):
  names.txt         the parameters' names, one a line, in that order
  init.bin          the initial parameters
  data.bin          the global batches, each x (GLOBAL_BATCH x 7) then y (GLOBAL_BATCH x 5);
                    rank r trains on rows chunk(RANKS)[r] of each
  fsdp2_<opt>.bin   the parameters after STEPS steps of FSDP2 with <opt>
Exits 3 when torch.distributed cannot be imported, 4 when this PyTorch has
no FSDP2 (it came in 2.4 under torch.distributed._composable.fsdp, public
in torch.distributed.fsdp since 2.6).
"""
import array
import faulthandler
import os
import sys
import tempfile

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError as e:
    print(f"no torch.distributed: {e}", file=sys.stderr)
    sys.exit(3)

def import_fully_shard():
    """FSDP2's fully_shard, or None. Not an ImportError alone: Debian's 1.13
    fails to import torch.distributed.fsdp under Python 3.11 (ValueError)."""
    for where in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            return getattr(__import__(where, fromlist=["fully_shard"]), "fully_shard")
        except Exception:  # noqa: BLE001  (what an old release raises varies)
            continue
    return None


fully_shard = import_fully_shard()
if fully_shard is None:
    print(f"PyTorch {torch.__version__} has no FSDP2 (fully_shard came in PyTorch 2.4)", file=sys.stderr)
    sys.exit(4)
from torch.distributed.device_mesh import init_device_mesh

# Widths chosen so that no block's parameter count, and no dimension, is a
# multiple of 2 or 3: FSDP2 pads its dim-0 shards, lockstep its flat ones.
# A rank still running after this many seconds has hung (a run takes a
# few on a loaded machine): its stacks are printed and it exits (status 1).
HANG_S = float(os.environ.get("LOCKSTEP_REFERENCE_HANG_S", "60"))
WIDTHS = (7, 13, 9, 11)
OUTPUTS = 5
STEPS = 6
GLOBAL_BATCH = 12  # divides among 2 and 3 ranks
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 0.01}),
}


class Block(torch.nn.Module):
    def __init__(self, inputs, outputs):
        super().__init__()
        self.fc = torch.nn.Linear(inputs, outputs)

    def forward(self, x):
        return torch.tanh(self.fc(x))


def make_model():
    torch.manual_seed(7)
    blocks = [Block(a, b) for a, b in zip(WIDTHS, WIDTHS[1:])]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(WIDTHS[-1], OUTPUTS))


def make_batches():
    g = torch.Generator().manual_seed(100)
    return [(torch.randn(GLOBAL_BATCH, WIDTHS[0], generator=g), torch.randn(GLOBAL_BATCH, OUTPUTS, generator=g))
            for _ in range(STEPS)]


def write(path, tensors):
    values = array.array("f")
    for t in tensors:
        values.extend(t.detach().contiguous().view(-1).tolist())
    if sys.byteorder != "little":
        values.byteswap()
    # Written whole, then renamed: the file exists only once training finished.
    with open(path + ".part", "wb") as f:
        f.write(values.tobytes())
    os.replace(path + ".part", path)


def train(rank, world, store_path, out_path, optimizer):
    torch.set_num_threads(1)
    # A rank that hangs prints every thread's stack and exits, so the test
    # says where instead of waiting for its deadline (HANG_S below).
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    net = make_model()
    for block in list(net)[:-1]:
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    fully_shard(net, mesh=mesh, reshard_after_forward=True)
    cls, kwargs = OPTIMIZERS[optimizer]
    opt = cls(net.parameters(), **kwargs)
    for x, y in make_batches():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x.chunk(world)[rank]), y.chunk(world)[rank])
        loss.backward()
        opt.step()
    whole = [p.full_tensor() for p in net.parameters()]  # collective
    if rank == 0:
        write(out_path, whole)
    dist.destroy_process_group()
    # No teardown of what gloo, DDP and the optimizer hold: a rank destroying
    # them as train() returned hung now and then under load (faulthandler:
    # the stack in mp.spawn's _wrap, after train, a gloo thread still
    # running), and its peer had gone; the results are written by now.
    os._exit(0)


def main():
    out, world, optimizer = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    result = os.path.join(out, f"fsdp2_{optimizer}.bin")
    net = make_model()
    with open(os.path.join(out, "names.txt"), "w") as f:
        f.write("".join(f"{name}\n" for name, _ in net.named_parameters()))
    write(os.path.join(out, "init.bin"), net.parameters())
    write(os.path.join(out, "data.bin"), [t for batch in make_batches() for t in batch])
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.spawn(train, nprocs=world, args=(world, os.path.join(tmp, "store"), result, optimizer))
        except mp.ProcessExitedException as e:
            # Now and then a gloo process aborts in its teardown, after its
            # last collective: the results were written by then.
            if not os.path.exists(result):
                raise
            print(f"note: a rank failed after the results were written: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
