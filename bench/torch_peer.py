"""Which python runs the PyTorch peers (Gloo, PyTorch's DDP) in the benchmarks.

By default the project's PyTorch 2.x environment (`make deps-torch2` makes
it: .venv/torch2, pinned in scripts/torch2-requirements.txt), the PyTorch
that users run; Debian's 1.13 on request with --python /usr/bin/python3.
Compare lockstep built against the same libtorch as the peer: --build
build-torch2 (`make build-torch2`) with the default, --build build with 1.13.
"""
import os
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH2_PYTHON = os.path.join(REPO, ".venv", "torch2", "bin", "python")
DEBIAN_PYTHON = "/usr/bin/python3"


def add_python_argument(parser):
    parser.add_argument("--python", default=TORCH2_PYTHON,
                        help="a python3 that imports torch: default the project's PyTorch 2.x "
                             f"(.venv/torch2, `make deps-torch2`); {DEBIAN_PYTHON} for Debian's 1.13")


def torch_version(python):
    """torch.__version__ as that python reports it, or None when it has no torch.
    A bare name (--python python3) is looked up on the PATH."""
    if not os.access(shutil.which(python) or python, os.X_OK):
        return None
    proc = subprocess.run([python, "-c", "import torch.distributed, torch; print(torch.__version__)"],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def missing_note(python):
    if python == TORCH2_PYTHON:
        return f"{python} is missing: `make deps-torch2` installs PyTorch 2.x there"
    return f"{python} cannot import torch.distributed"


def print_table(lines, out=None):
    """Prints a comparison's markdown and, with --out, writes it there too."""
    text = "\n".join(lines)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
