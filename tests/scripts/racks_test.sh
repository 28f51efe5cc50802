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

inside() {
  set -e
  ip netns list | grep -q "^$RACK_A_NS" || { echo "no namespace $RACK_A_NS"; return 1; }
  ip netns list | grep -q "^$RACK_B_NS" || { echo "no namespace $RACK_B_NS"; return 1; }
  ip netns exec "$RACK_A_NS" tc qdisc show | grep -q "tbf" || { echo "no tbf in rack A"; return 1; }
  ip netns exec "$RACK_B_NS" tc qdisc show | grep -q "tbf" || { echo "no tbf in rack B"; return 1; }
  ip netns exec "$RACK_B_NS" "$mend" lighthouse --bind "$RACK_B_ADDR:0" --http "" \
    --token-file "$work/token" --log-level warn > "$work/lighthouse.out" 2>&1 &
  local lighthouse=$!
  local address=""
  for _ in $(seq 100); do
    address=$(sed -n 's/.*grpc=\([^ ]*\).*/\1/p' "$work/lighthouse.out")
    [[ -n "$address" ]] && break
    sleep 0.1
  done
  [[ -n "$address" ]] || { echo "lighthouse did not start"; cat "$work/lighthouse.out"; return 1; }
  ip netns exec "$RACK_A_NS" "$mend" status --lighthouse "$address" --token-file "$work/token" \
    > "$work/status.json" || { echo "rack A could not reach the lighthouse in rack B"; return 1; }
  kill "$lighthouse"
  wait "$lighthouse" 2>/dev/null || true
  grep -q '"learners"' "$work/status.json" || { echo "no status document"; return 1; }
  echo "$RACK_A_NS $RACK_B_NS" > "$work/names"
}
export -f inside
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
echo "racks test passed: $a <-> $b, lighthouse reached across the shaped link, cleaned up"
