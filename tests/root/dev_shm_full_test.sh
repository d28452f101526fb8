#!/bin/bash
# A /dev/shm too small for the shm backend's shared buffers (as in a
# container started with docker's default 64 MiB) must give a clear error
# naming /dev/shm and the ways out, never a bare SIGBUS. Runs the single-copy
# all-reduce benchmark (buffers from allocate_shared) in a private mount
# namespace whose /dev/shm is a fresh tmpfs: first a large one, where it must
# work (so the setup itself is sound), then a 16 MiB one, where it must fail
# with that message.
# Needs root (mount namespaces); skips (exit 77) elsewhere.
# Usage: dev_shm_full_test.sh path/to/lockstep
set -uo pipefail
cli=$(realpath "$1")
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to mount a tmpfs in a private mount namespace (CI runs as root)"
command -v unshare > /dev/null || skip "needs unshare (util-linux)"
# In the new mount namespace /dev/shm itself is made private before the
# tmpfs goes over it, so nothing propagates back to the machine's /dev/shm.
# (Not "--propagation private": that remounts /, which is not a mount point
# inside a chroot.)
private_dev_shm='mount --make-rprivate /dev/shm && mount -t tmpfs -o size="$0" tmpfs /dev/shm'
unshare --mount --propagation unchanged sh -c "$private_dev_shm" 1m 2> /dev/null ||
  skip "cannot mount a tmpfs over /dev/shm in a private mount namespace here"

# with_dev_shm SIZE COMMAND...: runs COMMAND with a fresh /dev/shm of SIZE.
with_dev_shm() {
  local size=$1
  shift
  timeout -k 5 60 unshare --mount --propagation unchanged sh -c "$private_dev_shm"' && exec "$@"' "$size" "$@"
}

bench=("$cli" bench --np 2 --backend shm --shared-buffers -b 64M -e 64M -n 2 -w 1)

out=$(with_dev_shm 1g "${bench[@]}" 2>&1) || fail "with a 1 GiB /dev/shm the benchmark failed:
$out"
echo "1 GiB /dev/shm: the benchmark ran"

out=$(with_dev_shm 16m "${bench[@]}" 2>&1)
rc=$?
echo "$out" | tail -5
[ $rc -ne 0 ] || fail "a 16 MiB /dev/shm cannot hold 2 x 64 MiB, yet the benchmark exited 0"
[ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "the benchmark hung instead of failing"
grep -q "SIGBUS" <<< "$out" && fail "a rank died of SIGBUS instead of reporting the full /dev/shm"
grep -q "/dev/shm has no room" <<< "$out" || fail "no message naming /dev/shm"
grep -q -- "--shm-size" <<< "$out" || fail "the message does not say how to make room"
echo "16 MiB /dev/shm: a clear error (exit $rc)"
