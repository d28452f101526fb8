#!/usr/bin/env bash
# Installs the pinned PyTorch 2.x (scripts/torch2-requirements.txt) from PyPI
# into the project's own virtual environment, never into the system Python,
# and lays out the CUDA compiler that came with it as a toolkit in VENV/cuda
# (bin, include, lib64, nvvm: symbolic links into the wheels) for CMake.
# Idempotent: when the environment already holds exactly these pins it
# touches nothing and uses no network. Needs Debian's python3-venv
# (scripts/install-deps.sh installs it).
#
# Usage: scripts/install-torch2.sh [VENV [REQUIREMENTS]]
#        (default .venv/torch2 and scripts/torch2-requirements.txt; the
#        oldest PyTorch the Python package supports: .venv/torch-oldest and
#        scripts/torch-oldest-requirements.txt, without a CUDA compiler)
# Then:  cmake -DCMAKE_PREFIX_PATH="$(VENV/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" \
#              -DCUDAToolkit_ROOT=VENV/cuda ...   (what `make build-torch2` does)
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${1:-.venv/torch2}
requirements=${2:-scripts/torch2-requirements.txt}
stamp=$venv/lockstep-requirements.txt   # the pins this environment was made from
# The CUDA compiler is laid out only where the pins bring one.
with_nvcc=$(grep -q '^cuda-toolkit\[.*nvcc' "$requirements" && echo 1 || echo 0)

if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp" && { [ "$with_nvcc" = 0 ] || [ -x "$venv/cuda/bin/nvcc" ]; } \
   && "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  echo "install-torch2: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)') present in $venv"
  exit 0
fi

# Debian's interpreter, not whatever python3 comes first on PATH: the
# environment must not depend on a user's pyenv or conda.
python=/usr/bin/python3
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "install-torch2: $python cannot make virtual environments; install python3-venv (scripts/install-deps.sh does)" >&2
  exit 1
fi

echo "install-torch2: installing $(grep -v '^#' "$requirements" | xargs) into $venv (about 5 GB: the CUDA-enabled wheels)"
rm -f "$stamp"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check --no-input --progress-bar off -q -r "$requirements"

if [ "$with_nvcc" = 0 ]; then
  cp "$requirements" "$stamp"
  echo "install-torch2: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)') in $venv (no CUDA compiler)"
  exit 0
fi

# NVIDIA's wheels put the toolkit in site-packages/nvidia/cuNN with lib/
# where nvcc and CMake's FindCUDA look in lib64/, and only versioned shared
# libraries (libcudart.so.13) where find_library wants libcudart.so. bin/ is
# a real directory of links: nvcc finds lib64 through bin/.. (a link to bin
# would resolve to the wheel's directory).
cuda_root=$("$venv/bin/python" -c 'import nvidia, os, torch
print(os.path.join(list(nvidia.__path__)[0], "cu" + torch.version.cuda.split(".")[0]))')
toolkit=$venv/cuda
rm -rf "$toolkit"
mkdir -p "$toolkit/bin" "$toolkit/lib64"
ln -s "$cuda_root/include" "$toolkit/include"
ln -s "$cuda_root/nvvm" "$toolkit/nvvm"
for f in "$cuda_root"/bin/*; do ln -s "$f" "$toolkit/bin/"; done
for f in "$cuda_root"/lib/*; do
  name=$(basename "$f")
  ln -s "$f" "$toolkit/lib64/$name"
  case $name in *.so.*) ln -sf "$f" "$toolkit/lib64/${name%%.so.*}.so" ;; esac
done
"$toolkit/bin/nvcc" --version | tail -1 | sed 's/^/install-torch2: nvcc /'
cp "$requirements" "$stamp"
echo "install-torch2: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)') in $venv"
