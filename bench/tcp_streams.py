#!/usr/bin/python3
"""Can one TCP stream fill an emulated link? Throughput from host 0 to
host 1 of the emulated cluster (tests/netns/cluster.sh) with 1, 2 and 4
parallel streams, with the kernel's buffer autotuning and with fixed socket
buffers (SO_SNDBUF/SO_RCVBUF), each process pinned to its host's cores like
the ranks. The question it answers for the tcp backend: whether several
streams per peer, or buffers sized by hand, would carry more than what it
does today (one stream per peer, autotuned buffers).

Usage: sudo bench/tcp_streams.py [--rates 1gbit,10gbit] [--streams 1,2,4] [--buffers 0,4M] [--megabytes 512]
"""
import argparse
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_cluster import Cluster  # noqa: E402

PORT = 29790


def receive(streams, buffer):
    """Host 1: accepts `streams` connections, drains them, prints Gbit/s
    from the first byte to the last."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", PORT))
    listener.listen(streams)
    print("listening", flush=True)
    conns = [listener.accept()[0] for _ in range(streams)]
    total, first = [0], [None]
    lock = threading.Lock()

    def drain(c):
        if buffer:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
        buf = bytearray(4 << 20)
        while True:
            n = c.recv_into(buf)
            if not n:
                return
            with lock:
                first[0] = first[0] or time.perf_counter()
                total[0] += n

    threads = [threading.Thread(target=drain, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"gbit_s {total[0] * 8 / (time.perf_counter() - first[0]) / 1e9:.3f}", flush=True)


def send(address, streams, buffer, megabytes):
    conns = []
    for _ in range(streams):
        c = socket.create_connection((address, PORT))
        if buffer:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
        conns.append(c)
    chunk = bytes(4 << 20)
    each = megabytes // 4 // streams

    def push(c):
        for _ in range(each):
            c.sendall(chunk)
        c.close()

    threads = [threading.Thread(target=push, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def size(text):
    return int(text[:-1]) << 20 if text.endswith("M") else int(text[:-1]) << 10 if text.endswith("K") else int(text)


def measure(cluster, streams, buffer, megabytes):
    me = os.path.abspath(__file__)
    receiver = subprocess.Popen(cluster.on_host(1, [sys.executable, me, "--role", "receive", "--streams", str(streams),
                                                    "--buffers", str(buffer)]), stdout=subprocess.PIPE, text=True)
    receiver.stdout.readline()  # "listening"
    subprocess.run(cluster.on_host(0, [sys.executable, me, "--role", "send", "--streams", str(streams), "--buffers",
                                       str(buffer), "--megabytes", str(megabytes), "--to", cluster.address(1)]),
                   check=True, timeout=300)
    out, _ = receiver.communicate(timeout=60)
    return float(out.split()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="1gbit,10gbit")
    parser.add_argument("--streams", default="1,2,4")
    parser.add_argument("--buffers", default="0,4M", help="socket buffer sizes; 0 = the kernel's autotuning")
    parser.add_argument("--megabytes", type=int, default=512)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--role", choices=["receive", "send"], help=argparse.SUPPRESS)
    parser.add_argument("--to", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "receive":
        return receive(int(args.streams), size(args.buffers))
    if args.role == "send":
        return send(args.to, int(args.streams), size(args.buffers), args.megabytes)
    if os.geteuid() != 0:
        print("needs root (network namespaces and tc)", file=sys.stderr)
        return 77
    print(f"Gbit/s from host 0 to host 1, {args.megabytes} MiB, median of {args.runs} runs "
          f"(buffer 0 = kernel autotuning)\n")
    print("| link | buffer | " + " | ".join(f"{s} stream(s)" for s in args.streams.split(",")) + " |")
    print("|---|---|" + "---|" * len(args.streams.split(",")))
    for rate in args.rates.split(","):
        with Cluster(2, rate) as cluster:
            for buffer in args.buffers.split(","):
                cells = []
                for streams in args.streams.split(","):
                    runs = sorted(measure(cluster, int(streams), size(buffer), args.megabytes) for _ in range(args.runs))
                    cells.append(f"{runs[len(runs) // 2]:.2f}")
                print(f"| {rate} | {buffer} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
