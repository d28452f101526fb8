# Hosts for the netns tests, sourced by them: each host is a process
# holding its own network and UTS namespaces. No named namespaces, so
# nothing is mounted (this also works in a chroot). The sourcing script
# defines skip() and sets $work (a temporary directory) first; cleanup()
# kills every host's processes and removes $work, on exit (kept with
# KEEP_WORK=1, to read the logs of a failure).
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
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
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

# until_true SECONDS WHAT COMMAND...: waits for COMMAND to succeed; past
# SECONDS, shows the end of every log in $work and fails (the sourcing
# script's fail()).
until_true() {
  local seconds=$1 what=$2 f
  shift 2
  for _ in $(seq $((seconds * 2))); do "$@" && return 0; sleep 0.5; done
  for f in "$work"/*.log; do echo "--- $f"; tail -15 "$f"; done
  fail "$what: not within $seconds s"
}

# no_processes_left HOLDER NAME: fails (the sourcing script's fail()),
# naming them, if processes still run on that host 10 s on. A killed
# process is gone only once the kernel has torn it down, which for a large
# process (an AddressSanitizer build maps terabytes), or on a loaded
# machine, takes a moment after its parent saw it end.
no_processes_left() {
  local left
  for _ in $(seq 100); do
    left=$(in_host_pids "$1")
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  fail "processes left on $2: $(ps -o pid,ppid,stat,args -p $(echo $left | tr ' ' ,))"
}

# on_host HOLDER COMMAND...: runs COMMAND on that host.
on_host() {
  local holder=$1
  shift
  nsenter -t "$holder" --net --uts "$@"
}

# two_linked_hosts SUBNET [SECONDS]: two new hosts, host0 and host1 (their
# holders in $host0 and $host1, their names host0 and host1), joined by a
# veth pair (v0-$$ on host0 at SUBNET.1, v1-$$ on host1 at SUBNET.2).
two_linked_hosts() {
  local subnet=$1
  new_host "${2:-900}"; host0=${holders[-1]}
  new_host "${2:-900}"; host1=${holders[-1]}
  ip link add v0-$$ type veth peer name v1-$$ || fail "cannot create a veth pair"
  ip link set v0-$$ netns $host0
  ip link set v1-$$ netns $host1
  local i h
  for i in 0 1; do
    h=$([ $i = 0 ] && echo $host0 || echo $host1)
    on_host $h hostname host$i
    on_host $h ip addr add $subnet.$((i + 1))/24 dev v$i-$$
    on_host $h ip link set lo up
    on_host $h ip link set v$i-$$ up
  done
}

# switched_hosts COUNT SUBNET: a switch (a bridge in a namespace of its own,
# so the machine's own network is left alone) and COUNT hosts on it, their
# holders in the array hosts; host i is named host$i and has SUBNET.(i+1) on
# its veth h$i-$$.
switched_hosts() {
  local count=$1 subnet=$2 i h
  new_host; switch=${holders[-1]}
  on_host $switch ip link add br-$$ type bridge || fail "cannot create a bridge"
  on_host $switch ip link set br-$$ up
  hosts=()
  for ((i = 0; i < count; i++)); do
    new_host; h=${holders[-1]}; hosts+=("$h")
    ip link add h$i-$$ type veth peer name s$i-$$ || fail "cannot create a veth pair"
    ip link set h$i-$$ netns $h
    ip link set s$i-$$ netns $switch
    on_host $switch ip link set s$i-$$ master br-$$ up
    on_host $h hostname host$i
    on_host $h ip addr add $subnet.$((i + 1))/24 dev h$i-$$
    on_host $h ip link set lo up
    on_host $h ip link set h$i-$$ up
  done
}
