#!/usr/bin/env bash
# Two "racks" on one machine: network namespaces joined by a veth pair whose
# both ends are shaped by the kernel (tc tbf), for cross-rack experiments.
# Run as root. Cleans up after itself (also on Ctrl-C or failure).
#
#   scripts/racks.sh [--rate 1gbit] [--burst 512kb] [--latency-ms 50] -- COMMAND...
#       builds the racks, runs COMMAND in this namespace with
#         RACK_A_NS / RACK_B_NS      the namespace names
#         RACK_A_ADDR / RACK_B_ADDR  each rack's address on the link
#         RACK_RATE                  the shaped rate as given
#       in its environment (place processes with `ip netns exec "$RACK_A_NS" ...`),
#       then tears everything down and exits with COMMAND's status.
#   scripts/racks.sh [options] --a "COMMAND A" --b "COMMAND B"
#       the same, but runs COMMAND A in rack A and COMMAND B in rack B at once.
#
#   scripts/racks.sh --racks N --hosts H [--rate 1gbit] -- COMMAND...
#       hosts instead: N racks of H hosts, one namespace per host, all on one
#       bridge in this namespace (198.19.0.1, where a lighthouse can listen);
#       host h of rack k is 198.19.k.h. What a host sends to another rack
#       is shaped to --rate (its cross-rack link: an htb class chosen by
#       destination); inside its rack it is not. COMMAND runs here with
#         HOST_NS_<k>_<h> / HOST_ADDR_<k>_<h>   each host (k, h from 1)
#         RACKS_BRIDGE_ADDR                     this namespace's address
#         RACK_RATE                             the shaped rate as given
#
# Where namespaces cannot be made (no root, no CAP_NET_ADMIN, a container
# without them) it says so and exits 77, the conventional "skipped" status.
# Shaping is tbf only: netem (delay, loss) is not available everywhere; the
# data plane's own link emulation (LinkEmulation) adds latency.
set -euo pipefail

rate=1gbit
burst=512kb
latency_ms=50
command_a=""
command_b=""
racks=0
hosts=0
while (($#)); do
  case "$1" in
    --racks) racks=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --latency-ms) latency_ms=$2; shift 2 ;;
    --a) command_a=$2; shift 2 ;;
    --b) command_b=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "racks.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ $# -eq 0 && ( -z "$command_a" || -z "$command_b" ) ]]; then
  echo "racks.sh: give a COMMAND after --, or both --a and --b (see --help)" >&2
  exit 2
fi

# Unique per run, so parallel runs (and leftovers of a killed one) never clash.
tag=$$

if ((hosts > 0)); then
  if ((racks < 1 || racks > 9 || hosts > 9 || $# == 0)); then
    echo "racks.sh: --racks 1..9 and --hosts 1..9, then -- COMMAND (see --help)" >&2
    exit 2
  fi
  if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "racks.sh: skipped: 'ip' and 'tc' (Debian package iproute2) are not installed" >&2
    exit 77
  fi
  bridge="mbr$tag"
  if ! ip link add "$bridge" type bridge 2>/dev/null; then
    echo "racks.sh: skipped: cannot create a bridge here (needs root / CAP_NET_ADMIN)" >&2
    exit 77
  fi
  namespaces=()
  cleanup_hosts() {
    for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    ip link del "$bridge" 2>/dev/null || true
  }
  trap cleanup_hosts EXIT INT TERM
  ip addr add 198.19.0.1/16 dev "$bridge"
  ip link set "$bridge" up
  export RACKS_BRIDGE_ADDR=198.19.0.1 RACK_RATE="$rate"
  for ((k = 1; k <= racks; k++)); do
    for ((h = 1; h <= hosts; h++)); do
      ns="mend-host-$tag-$k-$h"
      outer="mh$tag$k$h"
      inner="mhi$tag$k$h"
      ip netns add "$ns"
      namespaces+=("$ns")
      ip link add "$outer" type veth peer name "$inner"
      ip link set "$inner" netns "$ns"
      ip link set "$outer" master "$bridge" up
      ip -n "$ns" link set lo up
      ip -n "$ns" addr add "198.19.$k.$h/16" dev "$inner"
      ip -n "$ns" link set "$inner" up
      ip netns exec "$ns" ethtool -K "$inner" gso off tso off gro off >/dev/null 2>&1 || true
      # Class 1:20 is the host's cross-rack link ($rate), 1:10 everything else.
      tc -n "$ns" qdisc add dev "$inner" root handle 1: htb default 10
      tc -n "$ns" class add dev "$inner" parent 1: classid 1:10 htb rate 100gbit quantum 60000
      tc -n "$ns" class add dev "$inner" parent 1: classid 1:20 htb rate "$rate" burst "$burst" quantum 60000
      for ((other = 1; other <= racks; other++)); do
        ((other == k)) && continue
        tc -n "$ns" filter add dev "$inner" parent 1: protocol ip prio 1 u32 \
          match ip dst "198.19.$other.0/24" flowid 1:20
      done
      export "HOST_NS_${k}_${h}=$ns" "HOST_ADDR_${k}_${h}=198.19.$k.$h"
    done
  done
  echo "racks.sh: $racks racks x $hosts hosts on bridge $bridge (198.19.0.1), cross-rack $rate per host" >&2
  status=0
  "$@" || status=$?
  exit "$status"
fi
ns_a="mend-rack-a-$tag"
ns_b="mend-rack-b-$tag"
veth_a="mra$tag"
veth_b="mrb$tag"
# A /30 from the benchmarking range; it exists only inside the two namespaces.
addr_a="198.18.$((tag % 250)).1"
addr_b="198.18.$((tag % 250)).2"

if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "racks.sh: skipped: 'ip' and 'tc' (Debian package iproute2) are not installed" >&2
  exit 77
fi
if ! ip netns add "$ns_a" 2>/dev/null; then
  echo "racks.sh: skipped: cannot create network namespaces here (needs root / CAP_NET_ADMIN)" >&2
  exit 77
fi

cleanup() {
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
  ip link del "$veth_a" 2>/dev/null || true
}
trap cleanup EXIT INT TERM

ip netns add "$ns_b"
ip link add "$veth_a" type veth peer name "$veth_b"
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
for side in a b; do
  ns_var="ns_$side"; veth_var="veth_$side"; addr_var="addr_$side"
  ns=${!ns_var}; veth=${!veth_var}; addr=${!addr_var}
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$addr/30" dev "$veth"
  ip -n "$ns" link set "$veth" up
  # Each end shapes what it sends: the link is $rate in both directions.
  # GSO/TSO off so that tbf sees wire-sized packets, as a real link would.
  ip netns exec "$ns" ethtool -K "$veth" gso off tso off gro off >/dev/null 2>&1 || true
  tc -n "$ns" qdisc add dev "$veth" root tbf rate "$rate" burst "$burst" latency "${latency_ms}ms"
done

export RACK_A_NS="$ns_a" RACK_B_NS="$ns_b" RACK_A_ADDR="$addr_a" \
  RACK_B_ADDR="$addr_b" RACK_RATE="$rate"
echo "racks.sh: $ns_a ($addr_a) <-> $ns_b ($addr_b), tbf $rate each way" >&2

status=0
if [[ -n "$command_a" ]]; then
  ip netns exec "$ns_a" bash -c "$command_a" &
  pid_a=$!
  ip netns exec "$ns_b" bash -c "$command_b" &
  pid_b=$!
  wait "$pid_a" || status=$?
  wait "$pid_b" || status=$?
else
  "$@" || status=$?
fi
exit "$status"
