"""The load the comparisons can run under: processes that spin, unpinned,
beside every contender's ranks (as `lockstep bench --busy N` does for
lockstep alone), the cores shared as data-loader workers share them."""
import contextlib
import subprocess
import sys


def add_busy_argument(parser):
    parser.add_argument("--busy", type=int, default=0, help="this many processes spinning beside every contender's "
                        "ranks for the whole comparison (the cores shared, as with data-loader workers)")


@contextlib.contextmanager
def busy_load(processes):
    """Spinners for the duration of the block: the same load for every
    contender, started once and killed after."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()
