# Hosts for the netns tests, sourced by them: each host is a process
# holding its own network and UTS namespaces. No named namespaces, so
# nothing is mounted (this also works in a chroot). The sourcing script
# defines skip() and sets $work (a temporary directory) first; cleanup()
# kills every host's processes and removes $work, on exit.
holders=()
# The store listens beyond loopback: every node needs the job's secret.
export LOCKSTEP_STORE_TOKEN=${LOCKSTEP_STORE_TOKEN:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}

cleanup() {
  # Quietly: bash reports each holder it reaps as "Killed".
  exec 2> /dev/null
  for holder in "${holders[@]}"; do
    kill -9 $(in_host_pids "$holder") 2> /dev/null
    kill -9 "$holder" 2> /dev/null
  done
  wait 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# in_host_pids HOLDER: the processes in that host's network namespace,
# other than the holder itself. (test -ef compares the namespaces' inodes
# without a readlink process per entry: this runs on loaded machines.)
in_host_pids() {
  local p
  [ -e /proc/$1/ns/net ] || return
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" != "$1" ] && [ $p/ns/net -ef /proc/$1/ns/net ] && echo "${p#/proc/}"
  done
}

# new_host [SECONDS]: a new host, appended to holders. Should the test
# itself be killed without cleanup, the holder dies with it (parent-death
# signal) or, at the latest, after SECONDS (default 900).
new_host() {
  setpriv --pdeathsig KILL unshare --net --uts sleep "${1:-900}" &
  local holder=$!
  holders+=("$holder")
  for _ in $(seq 50); do
    [ "$(readlink /proc/$holder/ns/net)" != "$(readlink /proc/self/ns/net)" ] && return 0
    sleep 0.02
  done
  skip "cannot create network namespaces here"
}

# on_host HOLDER COMMAND...: runs COMMAND on that host.
on_host() {
  local holder=$1
  shift
  nsenter -t "$holder" --net --uts "$@"
}
