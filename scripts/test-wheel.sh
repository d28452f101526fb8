#!/usr/bin/env bash
# Checks the lockstep_torch wheel (`make wheel`) as a Python user meets it:
#   1. it carries liblockstep, and nothing it loads comes from this machine's
#      build or its Debian -dev packages: every library its two shared
#      objects need is in the wheel, in torch's lib/, or in the C and C++
#      run-times every Linux has;
#   2. its metadata names the torch it was built for (version label, and
#      Requires-Dist torch==that release), and torchft only as an extra;
#   3. installed by pip into a fresh virtual environment, with only what pip
#      brings for it (torch and torch's own dependencies), it trains
#      PyTorch's DDP over "lockstep" under torchrun, equal to Gloo
#      (python/tests/workers.py, case ddp), and lockstep_torch.torchft says
#      what to install (torchft is not there).
# Needs the network to PyPI for torch (pip's cache answers when warm).
#
# Usage: scripts/test-wheel.sh WHEEL_DIR      (make test-wheel)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

wheel_dir=${1:?usage: scripts/test-wheel.sh WHEEL_DIR}
wheels=("$wheel_dir"/lockstep_torch-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "test-wheel: expected one wheel in $wheel_dir" >&2; exit 1; }
wheel=$(realpath "${wheels[0]}")
echo "test-wheel: $(basename "$wheel")"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "test-wheel: FAILED: $*" >&2; exit 1; }

# 2. Metadata.
metadata=$(unzip -p "$wheel" '*.dist-info/METADATA')
version=$(sed -n 's/^Version: //p' <<<"$metadata")
# What every install needs, and torchft only under the extra "torchft".
requires=$(sed -n 's/^Requires-Dist: //p' <<<"$metadata" | grep -v '; extra ==' || true)
grep -q '^Requires-Dist: torchft.*; extra == "torchft"$' <<<"$metadata" || fail "no optional extra \"torchft\" in $metadata"
[[ $version =~ \+pt[0-9]+(cpu|cu[0-9]+)$ ]] || fail "version '$version' does not name the torch it was built for"
[[ $requires =~ ^torch==[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "Requires-Dist '$requires' does not pin one torch release"
echo "test-wheel: version $version, requires $requires"
# The listing is read whole first: grep -q leaves at its first match, and
# under pipefail unzip's next write into the closed pipe (SIGPIPE) would
# fail the check.
contents=$(unzip -Z1 "$wheel")
grep -q '^lockstep_torch/liblockstep\.so' <<<"$contents" || fail "the wheel does not carry liblockstep: $contents"

# 3a. A fresh environment: the wheel and what pip installs for it.
/usr/bin/python3 -m venv "$work/venv"
python=$work/venv/bin/python
"$python" -m pip install --disable-pip-version-check --no-input --progress-bar off -q "$wheel"
extra=$("$python" -m pip list --format freeze --disable-pip-version-check | grep -viE '^(lockstep.torch|torch|pip|setuptools)==' |
        grep -viE '^(nvidia-|cuda-|triton|filelock|fsspec|jinja2|markupsafe|mpmath|networkx|sympy|typing.extensions)' || true)
[ -z "$extra" ] || fail "pip installed more than torch and its own dependencies: $extra"

# 1. What the installed shared objects load.
package=$("$python" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("lockstep_torch").origin))')
torch_lib=$("$python" -c 'import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec("torch").origin), "lib"))')
for object in "$package"/_C*.so "$package"/liblockstep.so*; do
  missing=$(LD_LIBRARY_PATH=$torch_lib ldd "$object" | grep 'not found' || true)
  [ -z "$missing" ] || fail "$(basename "$object") needs libraries neither the wheel nor torch has: $missing"
  outside=$(LD_LIBRARY_PATH=$torch_lib ldd "$object" | awk '/=>/ {print $3}' |
            grep -vE "^($package|$torch_lib|$work/venv)/" |
            grep -vE '/lib(c|m|dl|rt|pthread|util|gcc_s|stdc\+\+)\.so' || true)
  [ -z "$outside" ] || fail "$(basename "$object") loads libraries from this machine: $outside"
done
echo "test-wheel: $(basename "$package") loads only itself, torch's libraries and the C/C++ run-times"

# 3b. DDP over lockstep, started by torchrun, from outside the checkout so
# that nothing but the installed package can be imported.
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cd "$work"
# (TMPDIR: torchrun's torchelastic_* log directory goes with $work.)
output=$(TMPDIR=$work timeout 300 "$work/venv/bin/torchrun" --nproc-per-node 2 --master-port "$port" \
           "$repo/python/tests/workers.py" ddp default 2>&1) || fail "DDP over lockstep under torchrun failed:
$output"
# Counted as occurrences: the two ranks' lines may arrive run together.
comparisons=$(grep -oE 'rank [01]: default: max \|lockstep - gloo\| = [^ ]+ after 20 steps' <<<"$output" | sort -u)
[ "$(wc -l <<<"$comparisons")" -eq 2 ] || fail "no comparison with gloo from both ranks (the worker itself fails past 1e-6):
$output"
sed 's/^/test-wheel: /' <<<"$comparisons"

# 3c. Without the extra, lockstep_torch.torchft says what to install.
refusal=$("$python" -c 'import lockstep_torch.torchft' 2>&1) && fail "lockstep_torch.torchft imported without torchft"
grep -q "pip install torchft" <<<"$refusal" || fail "lockstep_torch.torchft without torchft does not name the fix: $refusal"
echo "test-wheel: without torchft, lockstep_torch.torchft names the fix"
echo "test-wheel: passed"
