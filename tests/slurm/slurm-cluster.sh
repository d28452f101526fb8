#!/usr/bin/env bash
# A throwaway Slurm cluster on this machine, for tests that launch ranks
# with `srun`: a munged, a slurmctld and a slurmd (one node by default),
# with every file they write (config, munge key, state, spool, pid files,
# logs) under DIR, so that nothing of a system-wide Slurm or munge is read
# or touched.
#
#   slurm-cluster.sh start DIR [CPUS [NODES]]  start it; print on stdout the
#                                              `export` lines a caller evals
#   slurm-cluster.sh stop DIR                  stop what `start DIR` started
#
#   exports=$(tests/slurm/slurm-cluster.sh start "$dir" 4) || exit 1
#   eval "$exports"      # (eval "$(... start ...)" would hide a failed start)
#   srun -n 4 ...
#   tests/slurm/slurm-cluster.sh stop "$dir"
#
# Why its own munged: Slurm authenticates every message with munge, and the
# system's munged (if any) has another key, socket and lifetime; a private
# one on DIR/munge/munge.socket with a fresh key needs nothing installed
# outside the packages and cannot disturb a real cluster's daemons. Slurm
# finds it through AuthInfo=socket=... in DIR's slurm.conf.
#
# Why no cgroups: containers and chroots rarely let a process create cgroups
# (and there is no systemd to delegate them), so processes are tracked by
# /proc ancestry (proctrack/linuxproc), tasks are not bound (task/none) and
# no usage is gathered (jobacct_gather/none); cgroup.conf points slurmd's
# cgroup plugin at an empty directory, so that it needs no /sys/fs/cgroup.
# Jobs are therefore not confined to their CPUs or memory, which tests do
# not need.
#
# CPUS (default: the cores here) is what each node announces, even beyond
# the real cores (SlurmdParameters=config_overrides), so `srun -n 4` runs on
# a machine of 2 cores when CPUS is 4. The first node is named after this
# host, so that the first host of SLURM_JOB_NODELIST resolves as a real
# node's would. NODES > 1 starts one slurmd per node, each on its own port
# (host, host-2, host-3, ...: all this machine), so that `srun -N 2` spreads
# tasks over "nodes". The ports are picked free at random, so two clusters
# in two DIRs can run side by side. `start` on a DIR whose cluster still
# runs stops it first. Needs root: slurmd runs the tasks as the submitting
# user, which only root may do.
set -euo pipefail

readonly boot_timeout_s=30
readonly stop_timeout_s=10
# The daemons carry this variable in their environment; slurmstepd inherits
# it from slurmd, which is how `stop` finds step daemons that outlive slurmd.
readonly marker_var=SLURM_CLUSTER_SH_DIR

die() {
  echo "slurm-cluster: $*" >&2
  exit 1
}

usage() {
  echo "usage: $0 start DIR [CPUS [NODES]] | stop DIR" >&2
  exit 2
}

# --- ports -------------------------------------------------------------------

# Ports in use by any TCP socket here (hex after the last colon of the
# local address, the second field of /proc/net/tcp*).
used_ports() {
  local local_address
  # No tcp6 where IPv6 is off.
  { cat /proc/net/tcp /proc/net/tcp6 2>/dev/null || true; } |
    while read -r _ local_address _; do
      if [[ $local_address == *:* ]]; then echo $((16#${local_address##*:})); fi
    done | sort -un
}

# A random port in 25000..32767: below Linux's ephemeral range (32768 up,
# where outgoing connections take theirs) and above 15000..24999, where
# lockstep puts a Slurm job's rendezvous store (src/common/slurm.h).
# Prints one not in use and not in $taken (a space-separated list).
pick_port() {
  local taken=$1 used port
  used=" $(used_ports | tr '\n' ' ') $taken "
  for _ in $(seq 100); do
    port=$((25000 + (RANDOM * 32768 + RANDOM) % 7768))
    [[ $used == *" $port "* ]] || { echo "$port"; return 0; }
  done
  die "no free TCP port found in 25000..32767"
}

# --- configuration -----------------------------------------------------------

# The first node takes this host's name, so that it resolves as a real
# node's does; where it does not (a chroot without this host in /etc/hosts),
# localhost, since ranks look for their store on the first node by name.
this_host() {
  local host
  host=$(hostname -s 2>/dev/null || true)
  if [ -z "$host" ] || ! getent hosts "$host" > /dev/null 2>&1; then host=localhost; fi
  echo "$host"
}

# Node I (from 1): this host's name, then host-2, host-3, ...
node_name() {
  local i=$1
  if [ "$i" -eq 1 ]; then this_host; else echo "$(this_host)-$i"; fi
}

# A new munge key, readable only by its owner (munged refuses others).
write_munge_key() {
  local key=$1
  rm -f "$key"
  mungekey --create --keyfile="$key" --bits=1024 ||
    dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
  chmod 0400 "$key"
}

# write_slurm_conf DIR CPUS CTLD_PORT NODE:PORT...
write_slurm_conf() {
  local dir=$1 cpus=$2 ctld_port=$3 host node_port names=""
  shift 3
  host=$(this_host)
  # A random first job id: lockstep derives the rendezvous port from the
  # job id, so two clusters (which would both start at 1) rarely collide.
  local first_job_id=$((1000 + RANDOM % 8000))
  cat > "$dir/slurm.conf" <<EOF
# Written by slurm-cluster.sh; rewritten on every start.
ClusterName=lockstep-test
# The address in parentheses spares a name lookup of this host.
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups (see the script's header).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
# Batch jobs start when submitted, not up to 3 s later.
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The node counts as CPUS CPUs whatever its cores.
SlurmdParameters=config_overrides
ReturnToService=2
# Jobs send no mail; without a valid program slurmctld logs an error.
MailProg=/bin/true
FirstJobId=$first_job_id
# Short waits, so that cancelled jobs and stop end quickly.
KillWait=2
InactiveLimit=0
MinJobAge=300
EOF
  # Each node's slurmd listens on its own port, as they share an address.
  for node_port in "$@"; do
    echo "NodeName=${node_port%:*} NodeAddr=127.0.0.1 Port=${node_port#*:} CPUs=$cpus State=UNKNOWN"
    names+=${names:+,}${node_port%:*}
  done >> "$dir/slurm.conf"
  echo "PartitionName=debug Nodes=$names Default=YES MaxTime=INFINITE State=UP" >> "$dir/slurm.conf"
}

# slurmd loads its cgroup plugin even when no other plugin uses it, and
# fails where /sys/fs/cgroup is missing (a chroot, a bare container) unless
# told which version to use. Version 1 at an empty directory: loaded, never
# used, and blind to the host's cgroups, whatever their version.
write_cgroup_conf() {
  local dir=$1
  mkdir -p "$dir/cgroup"
  printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=%s/cgroup\n' "$dir" > "$dir/cgroup.conf"
}

# --- processes ---------------------------------------------------------------

# Whether PID is alive and was started from DIR (its environment carries
# the marker, or its command line names DIR's files), so that a pid file
# left by a crash never makes us signal an unrelated process reusing the pid.
is_ours() {
  local pid=$1 dir=$2
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  grep -qzxF -- "$marker_var=$dir" "/proc/$pid/environ" 2>/dev/null ||
    grep -qzxF -e "$dir/slurm.conf" -e "--socket=$dir/munge/munge.socket" \
      "/proc/$pid/cmdline" 2>/dev/null
}

# Pids of the processes started from DIR: those of its pid files, and any
# carrying the marker, which finds the slurmstepds that outlive slurmd and
# a daemon whose pid file is not written yet. One grep over every
# environment, not a process for each.
our_pids() {
  local dir=$1 f pid
  {
    for f in "$dir"/run/*.pid; do
      [ -f "$f" ] || continue
      pid=$(head -n1 "$f" 2>/dev/null || true)
      ! is_ours "$pid" "$dir" || echo "$pid"
    done
    # Processes that end meanwhile make grep fail; their absence is the answer.
    { grep -lzxF -- "$marker_var=$dir" /proc/[0-9]*/environ 2>/dev/null || true; } |
      sed -n 's|^/proc/\([0-9]*\)/environ$|\1|p'
  } | sort -un
}

# Pids of DIR's processes named NAME, or all of them for "".
pids_named() {
  local dir=$1 name=$2 pid
  for pid in $(our_pids "$dir"); do
    [ -n "$name" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$name" ] || echo "$pid"
  done
}

# How many daemons named NAME (munged, slurmctld, slurmd) of DIR run.
daemon_count() {
  pids_named "$1" "$2" | wc -l
}

# Cancels the jobs first, so that their steps end their tasks as Slurm
# does (TERM, then KILL after KillWait) while slurmctld and slurmd still run.
cancel_jobs() {
  local dir=$1 deadline
  [ "$(daemon_count "$dir" slurmctld)" -gt 0 ] || return 0
  export SLURM_CONF=$dir/slurm.conf
  timeout 5 scancel --partition=debug > /dev/null 2>&1 || return 0
  deadline=$((SECONDS + 5))
  while [ $SECONDS -lt $deadline ]; do
    [ -z "$(timeout 2 squeue -h -o %i 2>/dev/null || true)" ] && return 0
    sleep 0.2
  done
}

# PIDS and all their descendants.
with_descendants() {
  [ $# -gt 0 ] || return 0
  ps -e -o pid=,ppid= | awk -v roots="$*" '
    BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
    { parent[$1] = $2 }
    END {
      do {
        grew = 0
        for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; grew = 1 }
      } while (grew)
      for (p in keep) print p
    }'
}

# srun clients of this cluster (their environment names its slurm.conf).
client_pids() {
  local dir=$1 f pid
  { grep -lzxF -- "SLURM_CONF=$dir/slurm.conf" /proc/[0-9]*/environ 2>/dev/null || true; } |
    while read -r f; do
      pid=${f#/proc/}
      pid=${pid%/environ}
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != srun ] || echo "$pid"
    done
}

# Steps still there once their jobs are cancelled, or whose slurmctld died
# (scancel cannot reach it), are stuck: slurmstepd ignores TERM, and killing
# it alone would orphan its tasks. So are srun clients still waiting for
# them. Kill each step with its tasks, and the clients.
kill_stuck() {
  local dir=$1 steps=() victims=()
  mapfile -t steps < <(pids_named "$dir" slurmstepd)
  mapfile -t victims < <(with_descendants "${steps[@]}"; client_pids "$dir")
  [ ${#victims[@]} -eq 0 ] || kill -KILL "${victims[@]}" 2>/dev/null || true
}

# TERM to DIR's processes named NAME, KILL to those left after
# $stop_timeout_s; returns once they are gone.
terminate() {
  local dir=$1 name=$2 pids=() deadline
  mapfile -t pids < <(pids_named "$dir" "$name")
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  deadline=$((SECONDS + stop_timeout_s))
  while [ $SECONDS -lt $deadline ]; do
    mapfile -t pids < <(pids_named "$dir" "$name")
    [ ${#pids[@]} -gt 0 ] || return 0
    sleep 0.1
  done
  echo "slurm-cluster: still running after ${stop_timeout_s}s, killing: ${pids[*]}" >&2
  kill -KILL "${pids[@]}" 2>/dev/null || true
  sleep 0.2
}

# In the order that lets each daemon say goodbye to the next: slurmd
# reports its ended jobs to slurmctld (and retries for seconds when that
# is gone), and both need munged to sign their messages.
stop_cluster() {
  local dir=$1 name
  cancel_jobs "$dir"
  kill_stuck "$dir"
  for name in slurmd slurmctld munged ""; do
    terminate "$dir" "$name"
  done
  rm -f "$dir"/run/*.pid
}

show_logs() {
  local dir=$1 f
  for f in "$dir"/log/*.log; do
    [ -f "$f" ] || continue
    echo "--- last lines of $f ---" >&2
    tail -n 20 "$f" >&2
  done
}

# Fails with the logs shown, after stopping whatever had started.
fail_start() {
  local dir=$1
  shift
  echo "slurm-cluster: start failed: $*" >&2
  show_logs "$dir"
  stop_cluster "$dir"
  exit 1
}

# --- start -------------------------------------------------------------------

check_tools() {
  local missing=() t
  for t in munged mungekey slurmctld slurmd slurmstepd srun sinfo scontrol scancel squeue; do
    command -v "$t" > /dev/null || missing+=("$t")
  done
  [ ${#missing[@]} -eq 0 ] ||
    die "missing ${missing[*]}; install: apt-get install --no-install-recommends slurmctld slurmd slurm-client munge"
  [ "$(id -u)" -eq 0 ] || die "must run as root (slurmd starts tasks as their user)"
}

# Unix socket paths hold at most 107 bytes. The longest under DIR is a
# slurmstepd's: DIR/spool/NODE/NODE_JOBID.STEPID, a job id of up to 7
# digits and a step id of up to 10 (munged's is shorter).
check_socket_paths() {
  local dir=$1 nodes=$2 node longest
  node=$(node_name "$nodes")
  longest=$((${#dir} + ${#node} * 2 + 27))
  [ "$longest" -le 107 ] ||
    die "DIR $dir is too long for the Unix sockets under it (${#dir} bytes; at most $((${#dir} + 107 - longest)))"
}

# A fresh state each start: no jobs or node states carried over. slurmd
# wants its spool directory before it would create it.
prepare_dir() {
  local dir=$1 nodes=$2 i
  rm -rf "$dir/state" "$dir/spool" "$dir/run" "$dir/log" "$dir/munge" "$dir/cgroup"
  # munged refuses a socket, key or log directory others may write to, and
  # a socket directory others may not enter (clients of any user use it).
  (umask 022 && mkdir -p "$dir/state" "$dir/run" "$dir/log" "$dir/munge")
  chmod 0755 "$dir/munge"
  for i in $(seq "$nodes"); do
    mkdir -p "$dir/spool/$(node_name "$i")"
  done
}

# The daemons fork into the background themselves and write their pid
# files; their stdout and stderr go to the logs, never to the caller's
# stdout, which `eval "$(... start ...)"` waits to see closed.
start_daemons() {
  local dir=$1 nodes=$2 i node
  # --force: munged refuses a socket below a directory not searchable by
  # all (mktemp -d makes 0700 ones), which matters to other users' clients,
  # never to root's. prepare_dir removed any socket left by an earlier
  # munged, so --force has none to take over.
  env "$marker_var=$dir" munged --force \
    --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed" \
    >> "$dir/log/munged.log" 2>&1 < /dev/null || fail_start "$dir" "munged did not start"
  # -c: a cold start, as the state is new (its log still notes the missing
  # state files as errors; they are expected).
  env "$marker_var=$dir" slurmctld -c -f "$dir/slurm.conf" \
    >> "$dir/log/slurmctld.log" 2>&1 < /dev/null || fail_start "$dir" "slurmctld did not start"
  # -N makes each slurmd the node of that name; Debian's slurmd allows
  # several on one machine when their ports differ.
  for i in $(seq "$nodes"); do
    node=$(node_name "$i")
    env "$marker_var=$dir" slurmd -f "$dir/slurm.conf" -N "$node" \
      >> "$dir/log/slurmd-$node.log" 2>&1 < /dev/null || fail_start "$dir" "slurmd of $node did not start"
  done
}

# Until every node is idle, or a daemon has died, or the time is up.
wait_idle() {
  local dir=$1 nodes=$2 deadline states="" all_idle
  all_idle=$(printf 'idle %.0s' $(seq "$nodes"))
  deadline=$((SECONDS + boot_timeout_s))
  while [ $SECONDS -lt $deadline ]; do
    states=$(timeout 5 sinfo -h -N -o %T 2>/dev/null | tr '\n' ' ' || true)
    [ "$states" = "$all_idle" ] && return 0
    [ "$(daemon_count "$dir" munged)" -eq 1 ] || fail_start "$dir" "munged is not running"
    [ "$(daemon_count "$dir" slurmctld)" -eq 1 ] || fail_start "$dir" "slurmctld is not running"
    [ "$(daemon_count "$dir" slurmd)" -eq "$nodes" ] || fail_start "$dir" "a slurmd is not running"
    sleep 0.2
  done
  fail_start "$dir" "nodes not idle after ${boot_timeout_s}s (states: '${states:-unknown}')"
}

# SLURM_* variables inherited from an enclosing job or cluster: SLURM_JOB_ID
# above all would make srun join that job in this cluster, and others would
# steer the daemons and the commands here.
inherited_slurm_vars() {
  compgen -e | grep '^SLURM_' || true
}

# The caller evals these: it drops what it inherited, as this script did.
print_exports() {
  local dir=$1 v
  shift
  for v in "$@"; do
    [ "$v" = SLURM_CONF ] || echo "unset $v"
  done
  printf 'export SLURM_CONF=%q\n' "$dir/slurm.conf"
}

start() {
  local dir=$1 cpus=$2 nodes=$3 ctld_port port taken i node_ports=() inherited=()
  [[ $cpus =~ ^[1-9][0-9]*$ ]] || die "CPUS must be a positive number, not '$cpus'"
  [[ $nodes =~ ^[1-9][0-9]*$ ]] || die "NODES must be a positive number, not '$nodes'"
  # Slurm takes every node of a cluster whose first is named localhost for
  # localhost itself, and refuses the second as a duplicate.
  if [ "$nodes" -gt 1 ] && [ "$(this_host)" = localhost ]; then
    die "$nodes nodes need this host's name ($(hostname -s 2>/dev/null)) to resolve (getent hosts); it does not here"
  fi
  check_tools
  mapfile -t inherited < <(inherited_slurm_vars)
  unset "${inherited[@]}"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd -P)
  check_socket_paths "$dir" "$nodes"
  stop_cluster "$dir"
  prepare_dir "$dir" "$nodes"
  write_munge_key "$dir/munge/munge.key" > /dev/null
  ctld_port=$(pick_port "")
  taken=$ctld_port
  for i in $(seq "$nodes"); do
    port=$(pick_port "$taken")
    taken+=" $port"
    node_ports+=("$(node_name "$i"):$port")
  done
  write_slurm_conf "$dir" "$cpus" "$ctld_port" "${node_ports[@]}"
  write_cgroup_conf "$dir"
  export SLURM_CONF=$dir/slurm.conf
  start_daemons "$dir" "$nodes"
  wait_idle "$dir" "$nodes"
  echo "slurm-cluster: up in $dir: ${node_ports[*]} (node:slurmd port), $cpus CPUs each; slurmctld port $ctld_port" >&2
  print_exports "$dir" "${inherited[@]}"
}

main() {
  [ $# -ge 2 ] || usage
  local cmd=$1 dir=$2
  case "$cmd" in
    start)
      [ $# -le 4 ] || usage
      start "$dir" "${3:-$(nproc)}" "${4:-1}"
      ;;
    stop)
      [ $# -eq 2 ] || usage
      [ -d "$dir" ] || return 0
      local inherited=()
      mapfile -t inherited < <(inherited_slurm_vars)
      unset "${inherited[@]}"
      stop_cluster "$(cd "$dir" && pwd -P)"
      ;;
    *) usage ;;
  esac
}

main "$@"
