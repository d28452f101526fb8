#!/usr/bin/python3
"""Across hosts: lockstep against Open MPI and Gloo on the emulated cluster.

Brings up tests/netns/cluster.sh's cluster (hosts as network namespaces
through a bridge, each link shaped with tc tbf, each host's ranks pinned to
its share of the cores) for every combination of link rate and ranks per
host, and measures on the same links:
  all-reduce busbw (float32 sum, in place), one table per configuration:
    lockstep tcp          `lockstep run` per host, `lockstep bench --backend tcp`
    lockstep auto, hier   the same with --backend auto / hier (when the build has hier)
    Open MPI              mpirun on host 0 reaching the others through
                          tests/netns/host_agent.sh, build/bench/mpi_allreduce
    Open MPI ring         the same with coll_tuned's ring algorithm forced
                          (against its own choice of algorithm)
    Gloo                  bench/gloo_allreduce.py per host (torch.distributed)
  the DDP MLP step time (examples/ddp_throughput against bench/pytorch_ddp.py,
  PyTorch's DDP over Gloo), and lockstep's under no_sync: the same compute on
  the same cores without communication, the floor of any DDP's step.
Needs root (namespaces, tc). Prints markdown tables for docs/performance.md.

Usage: sudo bench/compare_cluster.py [--build build] [--quick] [--rates 1gbit,10gbit]
           [--ranks 1,2] [--hosts 2] [--python PYTHON] [--bucket-view]
           [--ddp-only] [--out FILE]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

from torch_peer import add_python_argument, missing_note, torch_version

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER_SH = os.path.join(HERE, "..", "tests", "netns", "cluster.sh")
HOST_AGENT = os.path.join(HERE, "..", "tests", "netns", "host_agent.sh")


class Cluster:
    """The emulated cluster for as long as the `with` block runs: a bash
    session that sourced cluster.sh holds it and tears it down (its exit
    trap) when its stdin closes, which also happens should this script die."""

    def __init__(self, hosts, rate):
        script = ('set -u; skip() { echo "SKIP: $*"; exit 77; }; work=$(mktemp -d); '
                  f'source "{CLUSTER_SH}"; cluster_up "$1" "$2"; echo "work $work"; cat "$work/cluster-hosts"; '
                  'echo ready; read -r _')
        self.session = subprocess.Popen(["bash", "-c", script, "cluster", str(hosts), rate], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.hosts = []  # (address, holder pid, cores)
        self.work = None
        for line in self.session.stdout:
            fields = line.split()
            if fields == ["ready"]:
                return
            if fields and fields[0] == "work":
                self.work = fields[1]
            elif len(fields) == 3:
                self.hosts.append(tuple(fields))
            else:
                print(f"# cluster: {line.rstrip()}", file=sys.stderr)
        raise SystemExit(f"the emulated cluster did not come up (exit {self.session.wait()}); see above")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.session.stdin.close()
        try:
            self.session.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.session.kill()

    def address(self, i):
        return self.hosts[i][0]

    def on_host(self, i, cmd):
        _, holder, cores = self.hosts[i]
        return ["nsenter", "-t", holder, "--net", "--uts", "taskset", "-c", cores] + cmd


class OneRankPerHost:
    """For the validation scripts: one rank per host on the emulated cluster,
    over tcp across the shaped links (`a`: their arguments, with build and
    hosts); the cluster stays up for as long as the `with` block runs."""

    def __init__(self, a, rate):
        self.a, self.rate = a, rate
        self.name = f"{a.hosts} hosts x 1 rank, {rate}"
        self.tag = f"{a.hosts}hosts-{rate}"  # the folder of its files
        self.local = False
        self.ranks_per_host = 1
        self.runner = Runner(a)

    def __enter__(self):
        self.cluster = Cluster(self.a.hosts, self.rate).__enter__()
        return self

    def __exit__(self, *exc):
        self.cluster.__exit__(*exc)

    def run_ranks(self, ranks, program, env=None):
        """`program` on every host (`ranks` must be the hosts); host 0's output."""
        assert ranks == self.a.hosts, "one rank per host"
        out = self.runner.lockstep_run(self.cluster, 1, program, env)
        if out is None:
            raise RuntimeError(f"{' '.join(program)} failed across the hosts (see above)")
        return out

    def bench(self, flags, busy=0, ranks=None):
        """`lockstep bench` across the hosts (`ranks`, where given, must be
        the hosts); with `busy`, that many spinning processes on each host's
        cores beside its rank."""
        self.run_ranks(ranks or self.a.hosts,
                       [os.path.join(self.a.build, "lockstep"), "bench", "--backend", "tcp"] + flags +
                       (["--busy", str(busy)] if busy else []))


class Runner:
    def __init__(self, args):
        self.args = args
        self.port = 29700
        # The store listens beyond loopback: every node needs the job's
        # secret (the ranks inherit it through on_every_host's environment).
        os.environ.setdefault("LOCKSTEP_STORE_TOKEN", os.urandom(16).hex())

    def next_port(self):
        self.port += 1
        return self.port

    def on_every_host(self, cluster, command_for, env=None, timeout=900):
        """Runs command_for(i) on every host i at once; host 0's output, or
        None (with the reason on stderr) if any host failed."""
        procs = [subprocess.Popen(cluster.on_host(i, command_for(i)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=dict(os.environ, **(env or {})))
                 for i in range(len(cluster.hosts))]
        outputs, failed = [], False
        for p in procs:
            try:
                out, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                out, _ = p.communicate()
                p.returncode = "timeout"
            outputs.append(out)
            failed = failed or p.returncode != 0
        if failed:
            print(f"# failed: {' '.join(command_for(0))}\n" + "\n".join(o[-1500:] for o in outputs), file=sys.stderr)
            return None
        return outputs[0]

    def lockstep_run(self, cluster, ranks, program, env=None):
        a, port, hosts = self.args, self.next_port(), len(cluster.hosts)
        return self.on_every_host(cluster, lambda i: [
            os.path.join(a.build, "lockstep"), "run", "--nnodes", str(hosts), "--node-rank", str(i), "--master-addr",
            cluster.address(0), "--master-port", str(port), "--nproc-per-node", str(ranks), "--"] + program, env)

    def bench_args(self):
        a = self.args
        return ["-b", "1M", "-e", a.max_size, "-f", "4", "-n", str(a.iters), "-w", "1", "-c", "0"]

    def lockstep_bench(self, cluster, ranks, backend):
        return self.lockstep_run(cluster, ranks, [os.path.join(self.args.build, "lockstep"), "bench", "--backend",
                                                  backend] + self.bench_args())

    def mpi_bench(self, cluster, ranks, algorithm=None):
        """Open MPI's MPI_Allreduce; with `algorithm`, coll_tuned's algorithm
        of that number instead of its own choice (4 is the ring)."""
        hosts = len(cluster.hosts)
        tuned = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm",
                 str(algorithm)] if algorithm else []
        # More ranks than the host has cores: Open MPI's ranks must yield
        # while they poll, or they take the core from the one with work.
        first, last = cluster.hosts[0][2].split("-")
        if ranks > int(last) - int(first) + 1:
            tuned += ["--mca", "mpi_yield_when_idle", "1"]
        mpirun = ["mpirun"] + tuned + ["--mca", "plm_rsh_agent", HOST_AGENT,
                  "--mca", "oob_tcp_if_include", "eth0", "--mca", "btl_tcp_if_include", "eth0",
                  "--mca", "btl", "self,vader,tcp", "--mca", "btl_vader_single_copy_mechanism", "none",
                  "--mca", "pml", "ob1", "--bind-to", "none",
                  "--host", ",".join(f"{cluster.address(i)}:{ranks}" for i in range(hosts)), "-np", str(hosts * ranks),
                  os.path.join(self.args.build, "bench", "mpi_allreduce")] + self.bench_args()
        env = dict(os.environ, LOCKSTEP_CLUSTER_HOSTS=os.path.join(cluster.work, "cluster-hosts"),
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PMIX_MCA_gds="hash")
        proc = subprocess.run(cluster.on_host(0, mpirun), capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0:
            print(f"# Open MPI failed: {proc.stdout[-800:]} {proc.stderr[-800:]}", file=sys.stderr)
            return None
        return proc.stdout

    def gloo_bench(self, cluster, ranks):
        a, port, hosts = self.args, self.next_port(), len(cluster.hosts)
        bench = [a.python, os.path.join(HERE, "gloo_allreduce.py"), "-np", str(ranks), "--nnodes", str(hosts),
                 "--master-addr", cluster.address(0), "--master-port", str(port)] + self.bench_args()[:-2]
        return self.on_every_host(cluster, lambda i: bench + ["--node-rank", str(i)], {"GLOO_SOCKET_IFNAME": "eth0"})

    def ddp_step(self, cluster, ranks, which):
        """The median step (ms) of lockstep's DDP, of lockstep's under no_sync
        (the same compute without communication: the floor), or PyTorch's."""
        a = self.args
        model = ["--model", "mlp", "--batch", "32", "--steps", str(a.steps)] + (["--bucket-view"] if a.bucket_view else [])
        if which in ("lockstep", "lockstep no_sync"):
            program = [os.path.join(a.build, "examples", "ddp_throughput")] + model
            out = self.lockstep_run(cluster, ranks, program + (["--no-sync"] if which != "lockstep" else []))
        else:
            port, hosts = self.next_port(), len(cluster.hosts)
            ddp = [a.python, os.path.join(HERE, "pytorch_ddp.py"), "-np", str(ranks), "--nnodes", str(hosts),
                   "--master-addr", cluster.address(0), "--master-port", str(port)] + model
            out = self.on_every_host(cluster, lambda i: ddp + ["--node-rank", str(i)], {"GLOO_SOCKET_IFNAME": "eth0"})
        match = out and re.search(r"step_ms ([0-9.]+)", out)
        return float(match.group(1)) if match else None


def parse_table(output, world):
    """{bytes: busbw in GB/s} from a lockstep-bench-style table (launcher
    prefixes removed). busbw is recomputed from the time column: the tables
    round it to 0.01 GB/s, too coarse for a 1 Gbit/s link."""
    rows = {}
    for line in (output or "").splitlines():
        fields = re.sub(r"^\[\d+\] ", "", line).split()
        if len(fields) == 9 and fields[0].isdigit():
            size, us = int(fields[0]), float(fields[5])
            rows[size] = size / (us * 1e3) * 2 * (world - 1) / world
    return rows


def rate_gbytes(rate):
    n, unit = re.fullmatch(r"(\d+)([gmk]?bit)", rate.lower()).groups()
    return int(n) * {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1}[unit] / 8e9


def backends_in_build(build):
    out = subprocess.run([os.path.join(build, "lockstep"), "bench", "--backend", "hier", "-b", "4", "-e", "4", "-n", "1",
                          "-w", "0"], capture_output=True, text=True, timeout=60)
    return ["tcp", "auto", "hier"] if "unknown backend" not in out.stdout + out.stderr else ["tcp"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--quick", action="store_true", help="1 Gbit/s only, sizes to 64 MiB, fewer iterations")
    parser.add_argument("--rates", help="comma-separated tc rates (default 1gbit,10gbit)")
    parser.add_argument("--ranks", default="1,2", help="ranks per host, comma-separated")
    parser.add_argument("--hosts", type=int, default=2)
    add_python_argument(parser)
    parser.add_argument("--max-size", help="largest all-reduce (default 256M, 64M with --quick)")
    parser.add_argument("--bucket-view", action="store_true",
                        help="DDP with gradient_as_bucket_view (both lockstep and PyTorch): no bucket copies")
    parser.add_argument("--ddp-only", action="store_true", help="the DDP step only, no all-reduce tables")
    parser.add_argument("--out", help="also write the markdown here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces and tc)", file=sys.stderr)
        return 77
    args.build = os.path.abspath(args.build)
    args.rates = args.rates or ("1gbit" if args.quick else "1gbit,10gbit")
    args.max_size = args.max_size or ("64M" if args.quick else "256M")
    args.iters = 3 if args.quick else 5
    args.steps = 5 if args.quick else 10
    have_mpi = shutil.which("mpirun") and os.path.exists(os.path.join(args.build, "bench", "mpi_allreduce"))
    have_torch = torch_version(args.python) is not None
    if not have_torch:
        print(f"# note: {missing_note(args.python)}; PyTorch not measured", file=sys.stderr)
    backends = backends_in_build(args.build)
    runner = Runner(args)

    lines = [f"{args.hosts} hosts (network namespaces through a bridge, tc tbf on each link, both ways), ranks pinned "
             f"to their host's share of {os.cpu_count()} cores; float32 sum in place, busbw in GB/s (mean of "
             f"{args.iters} iterations after 1 warm-up); DDP: MLP 6x2048, batch 32 per rank, median step of "
             f"{args.steps}.", ""]
    ddp_rows = []
    for rate in args.rates.split(","):
        for ranks in (int(r) for r in args.ranks.split(",")):
            with Cluster(args.hosts, rate) as cluster:
                print(f"# {rate}, {args.hosts} hosts x {ranks} rank(s)", file=sys.stderr)
                world = args.hosts * ranks
                tables = {f"lockstep {b}": parse_table(runner.lockstep_bench(cluster, ranks, b), world)
                          for b in ([] if args.ddp_only else backends)}
                if have_mpi and not args.ddp_only:
                    tables["Open MPI"] = parse_table(runner.mpi_bench(cluster, ranks), world)
                    tables["Open MPI ring"] = parse_table(runner.mpi_bench(cluster, ranks, algorithm=4), world)
                if have_torch and not args.ddp_only:
                    tables["Gloo"] = parse_table(runner.gloo_bench(cluster, ranks), world)
                ours = runner.ddp_step(cluster, ranks, "lockstep")
                theirs = runner.ddp_step(cluster, ranks, "torch") if have_torch else None
                compute = runner.ddp_step(cluster, ranks, "lockstep no_sync")
            link = rate_gbytes(rate)
            names = list(tables)
            ratio = f"{ours / theirs:.2f}" if ours and theirs else "n/a"
            ddp_rows.append(f"| {rate} | {args.hosts} × {ranks} | {ours or 'n/a'} | {theirs or 'n/a'} | {ratio} | "
                            f"{compute or 'n/a'} |")
            if not names:
                continue
            lines += [f"**{rate}, {args.hosts} hosts × {ranks} rank(s)** (link {link:.3f} GB/s)", "",
                      "| size | " + " | ".join(names) + " | lockstep tcp / link |", "|---|" + "---|" * (len(names) + 1)]
            for size in sorted(set().union(*tables.values())):
                cells = [f"{tables[n][size]:.3f}" if size in tables[n] else "n/a" for n in names]
                tcp = tables["lockstep tcp"].get(size)
                share = f"{tcp / link:.2f}" if tcp else "n/a"
                lines.append(f"| {size >> 20} MiB | " + " | ".join(cells) + f" | {share} |")
            lines.append("")
    lines += [f"DDP MLP step time (ms, lower is better){', gradient_as_bucket_view' if args.bucket_view else ''}:", "",
              "| link | hosts × ranks | lockstep | PyTorch DDP (Gloo) | lockstep / PyTorch | lockstep under no_sync "
              "(compute alone) |", "|---|---|---|---|---|---|"]
    lines += ddp_rows
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
