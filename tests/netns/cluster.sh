# An emulated cluster on one machine, sourced by the netns tests and the
# cluster benchmarks: H hosts (each a process holding its own network and
# UTS namespaces, see hosts.sh), each named node<i>, joined through a
# bridge in a further namespace ("the switch"), each host's link shaped
# with tc in both directions (tbf for the rate; netem for delay and loss,
# only where the kernel has it). Host i has the address 10.$net.0.(i+1) on
# its eth0. $work/cluster-hosts lists "address holder-pid cores" per host.
#
# Everything lives inside namespaces that die with their holder processes:
# killing the holders removes the bridge, the veth pairs and their qdiscs.
# The holders die with the script (parent-death signal), so even a script
# killed with SIGKILL leaves nothing once its ranks end; cleanup() (on exit,
# SIGINT, SIGTERM, SIGHUP) kills the ranks as well.
#
# The sourcing script defines skip() and sets $work (a temporary directory)
# first. Functions:
#   cluster_up H RATE [DELAY [LOSS]]  make the hosts; RATE as tc writes it
#                                     (1gbit, 10gbit, 0 = unshaped)
#   cluster_host I                    host I's holder pid
#   cluster_ip I                      host I's address
#   cluster_cores I                   host I's share of the cores (taskset list)
#   cluster_node I LOG ARGS...        `lockstep run --nnodes H --node-rank I ARGS`
#                                     on host I, pinned to its cores, in the
#                                     background; its pid in $cluster_node_pid
#   cluster_link_down I               host I's link goes down (no FIN, no RST)
#   cluster_has_netem                 true where netem exists
#   cluster_mpirun I ARGS...          mpirun (or $cluster_mpirun_path) on host I
#                                     reaching every host through
#                                     host_agent.sh (foreground)
# Needs $cli (path of the lockstep binary) for cluster_node.

source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

cluster_hosts=()
cluster_switch=
cluster_size=0
# 10.<net>.0.0/24: a subnet per script, so that clusters of concurrent
# scripts never share addresses (they are in separate namespaces anyway).
cluster_net=$((200 + $$ % 50))
cluster_tag=$$

cluster_has_netem() {
  unshare --net tc qdisc add dev lo root netem delay 1ms > /dev/null 2>&1
}

# shape DEV RATE DELAY LOSS (run inside the namespace holding DEV): tbf
# for the rate, under netem when delay or loss are asked for. The bucket
# holds 10 ms at the rate (at least 256 KiB), so that a timer tick of the
# kernel does not cap the rate below what was asked.
cluster_shape() {
  local dev=$1 rate=$2 delay=$3 loss=$4 parent=root
  if [ "$delay" != 0 ] || [ "$loss" != 0 ]; then
    tc qdisc add dev "$dev" root handle 1: netem delay "$delay" loss "$loss" limit 100000 || return 1
    parent="parent 1:1"
  fi
  [ "$rate" = 0 ] && return 0
  local bits burst
  bits=$(tc_rate_bits "$rate") || return 1
  burst=$((bits / 8 / 100))
  [ $burst -lt 262144 ] && burst=262144
  tc qdisc add dev "$dev" $parent handle 10: tbf rate "$rate" burst "$burst" latency 100ms
}

# tc_rate_bits RATE: 1gbit -> 1000000000 (the units tc takes for bits/s).
tc_rate_bits() {
  local rate=${1,,} n unit
  n=${rate%%[a-z]*}
  unit=${rate#$n}
  case $unit in
    gbit) echo $((n * 1000000000)) ;;
    mbit) echo $((n * 1000000)) ;;
    kbit) echo $((n * 1000)) ;;
    bit | "") echo "$n" ;;
    *) echo "unknown rate unit in $1 (use bit, kbit, mbit or gbit)" >&2; return 1 ;;
  esac
}

cluster_up() {
  local size=$1 rate=$2 delay=${3:-0} loss=${4:-0}
  if { [ "$delay" != 0 ] || [ "$loss" != 0 ]; } && ! cluster_has_netem; then
    skip "delay or loss asked for, but this kernel has no netem qdisc (sch_netem)"
  fi
  cluster_size=$size
  new_host; cluster_switch=${holders[-1]}
  on_host $cluster_switch ip link set lo up
  on_host $cluster_switch ip link add br-$cluster_tag type bridge || skip "cannot create a bridge"
  on_host $cluster_switch ip link set br-$cluster_tag up
  local i h host_dev switch_dev
  for ((i = 0; i < size; i++)); do
    new_host; h=${holders[-1]}; cluster_hosts+=("$h")
    host_dev=h$i-$cluster_tag switch_dev=s$i-$cluster_tag
    ip link add $host_dev type veth peer name $switch_dev || skip "cannot create a veth pair"
    ip link set $host_dev netns $h
    ip link set $switch_dev netns $cluster_switch
    # Inside the host its link is eth0, as on a real one (programs that
    # are told an interface, such as Gloo, find it under one name).
    host_dev=eth0
    on_host $h ip link set h$i-$cluster_tag name $host_dev
    on_host $cluster_switch ip link set $switch_dev master br-$cluster_tag up
    on_host $h hostname node$i
    on_host $h ip addr add "$(cluster_ip $i)/24" dev $host_dev
    on_host $h ip link set lo up
    on_host $h ip link set $host_dev up
    echo "$(cluster_ip $i) $h $(cluster_cores $i)" >> "$work/cluster-hosts"
    # Both directions: the host's egress and the switch port's (the
    # host's ingress).
    on_host $h bash -c "$(declare -f cluster_shape tc_rate_bits); cluster_shape $host_dev $rate $delay $loss" \
      || skip "cannot shape $host_dev with tc (rate $rate, delay $delay, loss $loss)"
    on_host $cluster_switch bash -c "$(declare -f cluster_shape tc_rate_bits); cluster_shape $switch_dev $rate $delay $loss" \
      || skip "cannot shape $switch_dev with tc (rate $rate, delay $delay, loss $loss)"
  done
}

cluster_host() { echo "${cluster_hosts[$1]}"; }
cluster_ip() { echo "10.$cluster_net.0.$(($1 + 1))"; }

cluster_cores() {
  local cores per first
  cores=$(nproc)
  if [ "$cores" -lt "$cluster_size" ]; then
    echo "0-$((cores - 1))"
    return
  fi
  per=$((cores / cluster_size))
  first=$(($1 * per))
  echo "$first-$((first + per - 1))"
}

cluster_node() {
  local i=$1 log=$2
  shift 2
  # The launcher dies with its timeout, which dies with this script (so
  # nsenter is started directly, not through on_host: a function in the
  # background would be a subshell, and the subshell the parent); the
  # launcher's ranks die with the launcher.
  nsenter -t "${cluster_hosts[$i]}" --net --uts taskset -c "$(cluster_cores $i)" setpriv --pdeathsig KILL \
    timeout "${cluster_node_timeout:-300}" setpriv --pdeathsig KILL "$cli" run --nnodes "$cluster_size" --node-rank "$i" --master-addr "$(cluster_ip 0)" \
    --master-port "${cluster_port:-29555}" "$@" > "$log" 2>&1 &
  cluster_node_pid=$!
}

cluster_link_down() {
  on_host "${cluster_hosts[$1]}" ip link set eth0 down
}

# mpirun as on a real cluster: started on host I, it reaches the others
# through host_agent.sh (its remote-shell agent, where it would use ssh).
# Between hosts its daemons and ranks use TCP on the cluster's subnet only;
# ranks on one host share memory (vader), as they would on real hosts.
cluster_mpirun() {
  local i=$1
  shift
  LOCKSTEP_CLUSTER_HOSTS=$work/cluster-hosts OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    PMIX_MCA_gds=hash on_host "${cluster_hosts[$i]}" setpriv --pdeathsig KILL "${cluster_mpirun_path:-mpirun}" \
    --mca plm_rsh_agent "$(realpath "$(dirname "${BASH_SOURCE[0]}")")/host_agent.sh" \
    --mca oob_tcp_if_include "10.$cluster_net.0.0/24" --mca btl_tcp_if_include "10.$cluster_net.0.0/24" \
    --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none --mca pml ob1 \
    --bind-to none "$@"
}
