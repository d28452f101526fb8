"""The per-rank side of the lockstep_torch tests: each case runs in every
rank of a world started by launch.py (or torchrun), over the backend
"lockstep", and checks its results against the same operation over Gloo
(a second group of the same ranks) and against the exact answer computed
from every rank's known inputs. Exits non-zero with the reason on failure."""

import os
import sys
import time

import torch
import torch.distributed as dist

import lockstep_torch  # noqa: F401  registers "lockstep"

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64,
          "bfloat16": torch.bfloat16, "float16": torch.float16}


class Checker:
    def __init__(self, gloo, dtype):
        self.gloo = gloo
        self.dtype = dtype
        self.checks = 0
        self.gloo_checks = 0
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    def input(self, rank, n, small=False):
        """Rank `rank`'s input: small integers, exact in every dtype."""
        base = torch.arange(n, dtype=torch.float64)
        values = (base + rank) % 2 + 1 if small else (base % 5) + rank + 1
        return values.to(self.dtype)

    def close(self, what, got, want, exact=True):
        self.checks += 1
        got64, want64 = got.to(torch.float64), want.to(torch.float64)
        if exact:
            ok = torch.equal(got64, want64)
        else:
            tol = 1e-2 if self.dtype in (torch.float16, torch.bfloat16) else 1e-6
            ok = torch.allclose(got64, want64, rtol=tol, atol=tol)
        if not ok:
            raise AssertionError(f"rank {self.rank}: {what} ({self.dtype}): got {got.tolist()[:8]} "
                                 f"want {want.tolist()[:8]}")

    def against_gloo(self, what, lockstep_result, run_on_gloo):
        """Runs the same operation over Gloo; where Gloo offers it, the
        results must be identical."""
        try:
            gloo_result = run_on_gloo()
        except (RuntimeError, ValueError) as e:  # Gloo lacks this op or dtype
            if "lockstep" in str(e):
                raise
            return
        self.gloo_checks += 1
        self.close(f"{what} vs gloo", lockstep_result, gloo_result,
                   exact=self.dtype not in (torch.float16, torch.bfloat16))


def check_all_reduce(c, n):
    ops = [("SUM", dist.ReduceOp.SUM, lambda xs: sum(xs)),
           ("MIN", dist.ReduceOp.MIN, lambda xs: torch.stack(xs).min(0).values),
           ("MAX", dist.ReduceOp.MAX, lambda xs: torch.stack(xs).max(0).values)]
    for name, op, reference in ops:
        inputs = [c.input(r, n) for r in range(c.world)]
        t = inputs[c.rank].clone()
        dist.all_reduce(t, op=op)
        c.close(f"all_reduce {name}", t, reference([x.to(torch.float64) for x in inputs]))

        def on_gloo(op=op, x=inputs[c.rank]):
            g = x.clone()
            dist.all_reduce(g, op=op, group=c.gloo)
            return g
        c.against_gloo(f"all_reduce {name}", t, on_gloo)
    inputs = [c.input(r, n, small=True) for r in range(c.world)]
    t = inputs[c.rank].clone()
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    c.close("all_reduce PRODUCT", t, torch.stack([x.to(torch.float64) for x in inputs]).prod(0))
    # AVG and PREMUL_SUM: Gloo has neither; against the exact answer.
    inputs = [c.input(r, n) for r in range(c.world)]
    total = sum(x.to(torch.float64) for x in inputs)
    t = inputs[c.rank].clone()
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    want = torch.div(total, c.world, rounding_mode="trunc") if not c.dtype.is_floating_point else total / c.world
    c.close("all_reduce AVG", t, want.to(c.dtype), exact=not c.dtype.is_floating_point)
    if c.dtype.is_floating_point:
        t = inputs[c.rank].clone()
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        c.close("all_reduce PREMUL_SUM", t, total * 0.5, exact=False)
    # Several at once.
    ts = [c.input(c.rank, n), c.input(c.rank, n + 3)]
    work = dist.all_reduce_coalesced(ts, async_op=True)
    work.wait()
    for i, t in enumerate(ts):
        c.close(f"all_reduce_coalesced[{i}]", t, sum(c.input(r, t.numel()).to(torch.float64)
                                                     for r in range(c.world)))


def check_rooted(c, n):
    for root in (0, c.world - 1):
        t = c.input(c.rank, n)
        dist.broadcast(t, src=root)
        c.close(f"broadcast root {root}", t, c.input(root, n))
        t = c.input(c.rank, n)
        dist.reduce(t, dst=root)
        if c.rank == root:
            c.close(f"reduce root {root}", t, sum(c.input(r, n).to(torch.float64) for r in range(c.world)))
        else:
            c.close(f"reduce root {root} (non-root unchanged)", t, c.input(c.rank, n))
        gathered = [torch.empty(n, dtype=c.dtype) for _ in range(c.world)] if c.rank == root else None
        dist.gather(c.input(c.rank, n), gather_list=gathered, dst=root)
        if c.rank == root:
            for r in range(c.world):
                c.close(f"gather root {root} [{r}]", gathered[r], c.input(r, n))
        out = torch.empty(n, dtype=c.dtype)
        pieces = [c.input(r + 10, n) for r in range(c.world)] if c.rank == root else None
        dist.scatter(out, scatter_list=pieces, src=root)
        c.close(f"scatter root {root}", out, c.input(c.rank + 10, n))


def check_gathers(c, n):
    outs = [torch.empty(n, dtype=c.dtype) for _ in range(c.world)]
    dist.all_gather(outs, c.input(c.rank, n))
    for r in range(c.world):
        c.close(f"all_gather [{r}]", outs[r], c.input(r, n))

    def on_gloo():
        g = [torch.empty(n, dtype=c.dtype) for _ in range(c.world)]
        dist.all_gather(g, c.input(c.rank, n), group=c.gloo)
        return torch.cat(g)
    c.against_gloo("all_gather", torch.cat(outs), on_gloo)
    # Uneven: rank r contributes r + 1 elements.
    outs = [torch.empty(r + 1, dtype=c.dtype) for r in range(c.world)]
    dist.all_gather(outs, c.input(c.rank, c.rank + 1))
    for r in range(c.world):
        c.close(f"all_gather uneven [{r}]", outs[r], c.input(r, r + 1))
    flat = torch.empty(n * c.world, dtype=c.dtype)
    dist.all_gather_into_tensor(flat, c.input(c.rank, n))
    c.close("all_gather_into_tensor", flat, torch.cat([c.input(r, n) for r in range(c.world)]))


def check_reduce_scatters(c, n):
    def full(r):
        return torch.cat([c.input(r * 7 + q, n) for q in range(c.world)])

    want = sum(full(r).to(torch.float64) for r in range(c.world)).view(c.world, n)[c.rank]
    out = torch.empty(n, dtype=c.dtype)
    dist.reduce_scatter(out, list(full(c.rank).view(c.world, n).unbind(0)))
    c.close("reduce_scatter", out, want)
    out2 = torch.empty(n, dtype=c.dtype)
    dist.reduce_scatter_tensor(out2, full(c.rank))
    c.close("reduce_scatter_tensor", out2, want)

    def on_gloo():
        g = torch.empty(n, dtype=c.dtype)
        dist.reduce_scatter_tensor(g, full(c.rank), group=c.gloo)
        return g
    c.against_gloo("reduce_scatter_tensor", out2, on_gloo)


def check_all_to_all(c, n):
    def block(src, dst, count):
        return c.input(src * 10 + dst, count)

    inp = torch.cat([block(c.rank, q, n) for q in range(c.world)])
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    c.close("all_to_all_single", out, torch.cat([block(q, c.rank, n) for q in range(c.world)]))

    def on_gloo():
        g = torch.empty_like(inp)
        dist.all_to_all_single(g, inp, group=c.gloo)
        return g
    c.against_gloo("all_to_all_single", out, on_gloo)
    # Split sizes (rows of 2): rank s sends s + q + 1 rows to rank q.
    rows = lambda s, q: s + q + 1  # noqa: E731
    inp = torch.cat([block(c.rank, q, 2 * rows(c.rank, q)) for q in range(c.world)]).view(-1, 2)
    out = torch.empty(sum(rows(s, c.rank) for s in range(c.world)), 2, dtype=c.dtype)
    dist.all_to_all_single(out, inp, output_split_sizes=[rows(s, c.rank) for s in range(c.world)],
                           input_split_sizes=[rows(c.rank, q) for q in range(c.world)])
    c.close("all_to_all_single with splits", out.view(-1),
            torch.cat([block(s, c.rank, 2 * rows(s, c.rank)) for s in range(c.world)]))
    outs = [torch.empty(rows(s, c.rank), dtype=c.dtype) for s in range(c.world)]
    dist.all_to_all(outs, [block(c.rank, q, rows(c.rank, q)) for q in range(c.world)])
    for s in range(c.world):
        c.close(f"all_to_all [{s}]", outs[s], block(s, c.rank, rows(s, c.rank)))


def check_point_to_point(c, n):
    right, left = (c.rank + 1) % c.world, (c.rank - 1) % c.world
    got = torch.empty(n, dtype=c.dtype)
    ops = [dist.P2POp(dist.isend, c.input(c.rank, n), right), dist.P2POp(dist.irecv, got, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    c.close("isend/irecv ring", got, c.input(left, n))
    if c.rank == 0:
        dist.send(c.input(0, n), dst=1, tag=7)
    elif c.rank == 1:
        got = torch.empty(n, dtype=c.dtype)
        dist.recv(got, src=0, tag=7)
        c.close("send/recv", got, c.input(0, n))
    dist.barrier()



def case_collectives(dtype_name):
    dist.init_process_group("lockstep")
    gloo = dist.new_group(backend="gloo")
    c = Checker(gloo, DTYPES[dtype_name])
    for n in (1, 13, 1000, 70000):  # one element, odd, small, past the shm slot
        check_all_reduce(c, n)
        check_rooted(c, n)
        check_gathers(c, n)
        check_reduce_scatters(c, n)
        check_all_to_all(c, n)
        check_point_to_point(c, n)
    sub = dist.new_group(ranks=[0, 1])
    if c.rank in (0, 1):
        t = c.input(c.rank, 10)
        dist.all_reduce(t, group=sub)
        c.close("all_reduce on new_group([0, 1])", t, c.input(0, 10).to(torch.float64) + c.input(1, 10))
    print(f"rank {c.rank}: {c.checks} checks passed, {c.gloo_checks} of them against gloo")
    dist.destroy_process_group()


def case_wrong_input():
    """Operations lockstep cannot do are refused, naming the operation."""
    dist.init_process_group("lockstep")
    failures = []
    for what, call in [("bool", lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool))),
                       ("BAND", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int64), op=dist.ReduceOp.BAND)),
                       ("strided", lambda: dist.all_reduce(torch.ones(8)[::2])),
                       ("sparse MAX", lambda: dist.all_reduce(torch.eye(3).to_sparse(), op=dist.ReduceOp.MAX))]:
        try:
            call()
            failures.append(f"{what}: accepted")
        except (RuntimeError, ValueError) as e:
            if "lockstep backend" not in str(e):
                failures.append(f"{what}: {e}")
            else:
                print(f"refused {what}: {str(e).splitlines()[0]}")
    dist.barrier()
    dist.destroy_process_group()
    if failures:
        sys.exit("; ".join(failures))


def numbered_message(sender, number, n=100):
    """Message `number` of rank `sender`: says both in every element."""
    return torch.arange(n, dtype=torch.float64) + sender * 1e6 + number * 1e3


def case_recv_any_source():
    """Rank 0 receives every other rank's messages without naming a source,
    by dist.recv (which returns the sender) and by dist.irecv (whose work
    says it): each message's content, the sender reported and each sender's
    order are checked. Ranks other than 0 send two numbered messages each."""
    dist.init_process_group("lockstep")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank != 0:
        for number in range(2):
            dist.send(numbered_message(rank, number), dst=0)
    else:
        next_number = {q: 0 for q in range(1, world)}
        for k in range(2 * (world - 1)):
            got = torch.empty(100, dtype=torch.float64)
            if k % 2 == 0:
                sender = dist.recv(got)
            else:
                work = dist.irecv(got)
                work.wait()
                sender = work._source_rank()
            if sender not in next_number:
                sys.exit(f"receive {k}: reported sender {sender}")
            if not torch.equal(got, numbered_message(sender, next_number[sender])):
                sys.exit(f"receive {k}: from rank {sender}, expected its message {next_number[sender]}, "
                         f"got {got[:3].tolist()}")
            next_number[sender] += 1
        if any(n != 2 for n in next_number.values()):
            sys.exit(f"messages taken per sender: {next_number}")
        print(f"received {2 * (world - 1)} messages from any source: senders and contents right")
    dist.barrier()
    dist.destroy_process_group()


def case_recv_any_source_mismatch():
    """The last rank sends 10 elements where rank 0's recv without src
    expects 20: rank 0 raises, naming that rank."""
    dist.init_process_group("lockstep")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        try:
            dist.recv(torch.empty(20))
        except dist.DistBackendError as e:
            print(f"rank 0 raised: {e}")
            os._exit(3)
        print("rank 0: the mismatched recv returned")
        os._exit(0)
    if rank == world - 1:
        dist.send(torch.ones(10), dst=0)
    # Stay in the group until rank 0 has judged the message (a rank that
    # exited meanwhile would be a lost peer to rank 0's wait); the barrier
    # then fails with rank 0's error.
    try:
        dist.barrier()
    except dist.DistBackendError:
        pass
    os._exit(0)


def case_mismatch():
    """Ranks that disagree on a collective's size both fail, naming the
    function called and both sides."""
    dist.init_process_group("lockstep")
    rank = dist.get_rank()
    t = torch.ones(1000 * (rank + 1))
    out = torch.empty(t.numel() * dist.get_world_size())
    try:
        dist.all_gather_into_tensor(out, t)
    except dist.DistBackendError as e:
        print(f"rank {rank} raised: {e}")
        os._exit(3)
    print(f"rank {rank}: the mismatched all_gather_into_tensor returned")
    os._exit(0)


def case_killed_rank():
    """Rank 1 dies before an all_reduce; rank 0's all_reduce raises, naming it."""
    dist.init_process_group("lockstep", timeout=__import__("datetime").timedelta(seconds=60))
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(10))
    if rank == 1:
        os.kill(os.getpid(), 9)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(100000))
    except dist.DistBackendError as e:
        print(f"rank {rank} raised after {time.monotonic() - start:.1f} s: {e}")
        os._exit(3)
    print(f"rank {rank}: the all_reduce returned")
    os._exit(0)


def main():
    case, args = sys.argv[1], sys.argv[2:]
    if case == "ddp":
        import ddp_worker
        ddp_worker.run(*args)
        return
    if case == "cuda":
        import cuda_worker
        cuda_worker.run(*args)
        return
    if case == "sharding":
        import sharding_workers
        sharding_workers.run(*args)
        return
    {"collectives": case_collectives, "wrong_input": case_wrong_input, "mismatch": case_mismatch,
     "killed_rank": case_killed_rank, "recv_any_source": case_recv_any_source,
     "recv_any_source_mismatch": case_recv_any_source_mismatch}[case](*args)


if __name__ == "__main__":
    main()
