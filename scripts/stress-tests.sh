#!/usr/bin/env bash
# The suite on a loaded machine: with `stress-ng --cpu 4` beside it, every
# test of the suites in SUITES runs REPEAT times (ctest -j2, one pass of
# them after another), then the whole suite FULL times. Prints passes / runs
# per suite and every failure's test, and writes the counts as CSV.
#
#   scripts/stress-tests.sh                    # 20 x the three suites, 3 x the whole suite
#   REPEAT=5 FULL=1 scripts/stress-tests.sh    # shorter
#
# Needs a built tree (MEND_BUILD_DIR, default build) and stress-ng (Debian).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${MEND_BUILD_DIR:-build}
repeat=${REPEAT:-20}
full=${FULL:-3}
suites=${SUITES:-LearnerGroupTest ReducerTest RoundDriverTest}
out=${OUT:-bench-results/stress-tests}
load=${LOAD:-4}
mkdir -p "$(dirname "$out")"
logs=$(mktemp -d /tmp/mend-stress.XXXXXX)

command -v stress-ng > /dev/null || { echo "stress-ng is not installed (apt-get install stress-ng)" >&2; exit 2; }
[ -d "$build" ] || { echo "no build tree at $build" >&2; exit 2; }
stress-ng --cpu "$load" --quiet &
stress=$!
trap 'kill $stress 2> /dev/null; wait $stress 2> /dev/null' EXIT

declare -A runs passes
failures=()
# One ctest pass over `regex`; counts per suite from ctest's summary lines.
pass() {
  local label=$1 regex=$2 log=$3
  ctest --test-dir "$build" -j2 --timeout 300 --output-on-failure -R "$regex" > "$log" 2>&1
  local rc=$?
  while read -r name result; do
    local suite=${name%%.*}
    [ "$label" = full ] && suite=full
    runs[$suite]=$(( ${runs[$suite]:-0} + 1 ))
    if [ "$result" = Passed ]; then
      passes[$suite]=$(( ${passes[$suite]:-0} + 1 ))
    else
      failures+=("$label: $name ($result; log $log)")
    fi
  done < <(sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) .*\.{3} *\**(Passed|Failed|Timeout|Not Run|Exception|Subprocess aborted).*/\1 \2/p' "$log")
  return $rc
}

begin=$(date +%s)
regex="^($(echo "$suites" | tr ' ' '|'))\\."
for i in $(seq "$repeat"); do
  pass suites "$regex" "$logs/suites-$i.log"
  echo "suites pass $i/$repeat: rc $? ($(( $(date +%s) - begin )) s)"
done
for i in $(seq "$full"); do
  pass full "." "$logs/full-$i.log"
  echo "full suite $i/$full: rc $? ($(( $(date +%s) - begin )) s)"
done

echo
echo "with stress-ng --cpu $load beside it ($(nproc) cores), $(( $(date +%s) - begin )) s:"
printf '%-20s %8s %8s\n' suite passes runs
echo "suite,passes,runs" > "$out.csv"
for suite in $suites full; do
  printf '%-20s %8s %8s\n' "$suite" "${passes[$suite]:-0}" "${runs[$suite]:-0}"
  echo "$suite,${passes[$suite]:-0},${runs[$suite]:-0}" >> "$out.csv"
done
if [ ${#failures[@]} -gt 0 ]; then
  echo "failures:"
  printf '  %s\n' "${failures[@]}"
  exit 1
fi
echo "no failures (logs in $logs, counts in $out.csv)"
