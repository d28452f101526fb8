#!/bin/bash
# bench/validate_failures.py on two emulated hosts: network namespaces
# joined by a veth pair shaped to $RATE each way (bench/two_shaped_hosts.sh),
# one `lockstep run` a host, the ranks split between them, killed at the
# rate asked; every other argument goes to validate_failures.py. Needs root.
# Usage: [RATE=10gbit] bench/validate_failures_two_hosts.sh --build build --ranks 4 ...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rate=${RATE:-10gbit}
subnet=10.214.0
source "$here/two_shaped_hosts.sh"
python3 "$here/validate_failures.py" --hosts "${holders[0]},${holders[1]}" --master-addr "$subnet.1" "$@"
