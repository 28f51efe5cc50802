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
while (($#)); do
  case "$1" in
    --rate) rate=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --latency-ms) latency_ms=$2; shift 2 ;;
    --a) command_a=$2; shift 2 ;;
    --b) command_b=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "racks.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ $# -eq 0 && ( -z "$command_a" || -z "$command_b" ) ]]; then
  echo "racks.sh: give a COMMAND after --, or both --a and --b (see --help)" >&2
  exit 2
fi

# Unique per run, so parallel runs (and leftovers of a killed one) never clash.
tag=$$
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
