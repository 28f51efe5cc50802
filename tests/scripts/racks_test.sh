#!/usr/bin/env bash
# scripts/racks.sh end to end: the two racks exist with tbf on their link, a
# lighthouse in rack B answers a client in rack A across it, and nothing is
# left behind afterwards. Exits 77 (skipped) where namespaces cannot be made.
#   tests/scripts/racks_test.sh MEND_BINARY
set -uo pipefail
mend=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "racks-test-token-0123456789" > "$work/token"

# Starts a lighthouse bound to $2 (in namespace $1, or here when empty) and
# asks it for its status from namespace $3; $4 names the files.
lighthouse_answers() {
  local where=$1 bind=$2 client=$3 tag=$4
  local run=()
  [[ -n "$where" ]] && run=(ip netns exec "$where")
  # The file exists before the loop reads it: the background job opens its
  # redirection only once it has been forked, which may come after the first read.
  : > "$work/$tag.out"
  "${run[@]}" "$mend" lighthouse --bind "$bind:0" --http "" --token-file "$work/token" --log-level warn \
    > "$work/$tag.out" 2>&1 &
  local lighthouse=$!
  local address=""
  for _ in $(seq 100); do
    address=$(sed -n 's/.*grpc=\([^ ]*\).*/\1/p' "$work/$tag.out")
    [[ -n "$address" ]] && break
    sleep 0.1
  done
  [[ -n "$address" ]] || { echo "lighthouse did not start"; cat "$work/$tag.out"; return 1; }
  ip netns exec "$client" "$mend" status --lighthouse "$address" --token-file "$work/token" \
    > "$work/$tag.json" || { echo "$client could not reach the lighthouse at $bind"; return 1; }
  kill "$lighthouse"
  wait "$lighthouse" 2>/dev/null || true
  grep -q '"learners"' "$work/$tag.json" || { echo "no status document"; return 1; }
}

inside() {
  set -e
  ip netns list | grep -q "^$RACK_A_NS" || { echo "no namespace $RACK_A_NS"; return 1; }
  ip netns list | grep -q "^$RACK_B_NS" || { echo "no namespace $RACK_B_NS"; return 1; }
  ip netns exec "$RACK_A_NS" tc qdisc show | grep -q "tbf" || { echo "no tbf in rack A"; return 1; }
  ip netns exec "$RACK_B_NS" tc qdisc show | grep -q "tbf" || { echo "no tbf in rack B"; return 1; }
  lighthouse_answers "$RACK_B_NS" "$RACK_B_ADDR" "$RACK_A_NS" rack-b
  echo "$RACK_A_NS $RACK_B_NS" > "$work/names"
}
export -f inside lighthouse_answers
export mend work

"$here/scripts/racks.sh" --rate 100mbit -- bash -c inside
status=$?
[[ $status -eq 77 ]] && exit 77
[[ $status -eq 0 ]] || { echo "racks.sh or the checks failed ($status)"; exit 1; }
read -r a b < "$work/names"
if ip netns list | grep -q -e "^$a" -e "^$b"; then
  echo "namespaces left behind: $a $b"
  exit 1
fi

# Host mode: 2 racks x 2 hosts on a bridge, each host's cross-rack traffic
# in a shaped htb class; a lighthouse on the bridge answers a host.
hosts_inside() {
  set -e
  for host in 1_1 1_2 2_1 2_2; do
    ns_var="HOST_NS_$host"
    ns=${!ns_var}
    ip netns list | grep -q "^$ns" || { echo "no namespace $ns"; return 1; }
    tc -n "$ns" class show dev "$(ip -n "$ns" -o link show | sed -n 's/^[0-9]*: \(mhi[^@:]*\).*/\1/p')" \
      | grep -q "1:20.*rate 100Mbit" || { echo "no shaped cross-rack class on $ns"; return 1; }
  done
  lighthouse_answers "" "$RACKS_BRIDGE_ADDR" "$HOST_NS_2_2" bridge
  echo "$HOST_NS_1_1 $HOST_NS_2_2" > "$work/host_names"
}
export -f hosts_inside lighthouse_answers
"$here/scripts/racks.sh" --racks 2 --hosts 2 --rate 100mbit -- bash -c hosts_inside 2> "$work/hosts.err"
status=$?
[[ $status -eq 0 ]] || { echo "racks.sh --hosts or its checks failed ($status)"; cat "$work/hosts.err"; exit 1; }
read -r a2 b2 < "$work/host_names"
if ip netns list | grep -q -e "^$a2" -e "^$b2"; then
  echo "host namespaces left behind: $a2 $b2"
  exit 1
fi
echo "racks test passed: $a <-> $b, lighthouse reached across the shaped link; 2 x 2 hosts with shaped" \
  "cross-rack classes; cleaned up"
