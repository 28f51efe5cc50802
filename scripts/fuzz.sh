#!/usr/bin/env bash
# Builds the libFuzzer targets in ./build-fuzz (clang, ASan+UBSan, coverage in
# mend's libraries) and runs each for SECONDS (default 60), one after another.
#   scripts/fuzz.sh [SECONDS]
# Seeds come from fuzz/corpus/<target>/ (read only); what the fuzzer finds
# goes to build-fuzz/corpus-<target>/, crashes to build-fuzz/artifacts/.
# Replay a crash:  build-fuzz/fuzz/<target> build-fuzz/artifacts/<target>-crash-...
# Environment: MEND_FUZZ_BUILD_DIR (default build-fuzz), MEND_FUZZ_TARGETS (default
#              all five), MEND_FUZZ_ARGS (extra libFuzzer flags, e.g. -jobs=2 -workers=2).
# Exits non-zero when any target crashed, hung or broke an invariant.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
build_dir=${MEND_FUZZ_BUILD_DIR:-build-fuzz}
read -r -a targets <<<"${MEND_FUZZ_TARGETS:-fuzz_config fuzz_requests fuzz_lighthouse_core fuzz_datagram fuzz_codec}"

if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found; install it with: apt-get install clang libfuzzer-14-dev" >&2
  exit 1
fi

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMEND_BUILD_FUZZ=ON -DMEND_BUILD_TESTS=OFF -DMEND_BUILD_BENCH=OFF
cmake --build "$build_dir" --target "${targets[@]}"

# The fuzzers run inside the build directory; the fuzz-N.log files that -jobs
# writes are kept as <target>-fuzz-N.log.
seeds=$PWD/fuzz/corpus
cd "$build_dir"
mkdir -p artifacts
failed=()
for target in "${targets[@]}"; do
  mkdir -p "corpus-$target"
  echo "fuzz: $target for ${seconds}s (corpus $build_dir/corpus-$target)"
  # -timeout: a call that blocks (e.g. a callback run under the core's mutex)
  # is reported as a hang instead of stalling the run.
  # shellcheck disable=SC2086
  if ! "fuzz/$target" "corpus-$target" "$seeds/$target" -max_total_time="$seconds" -timeout=10 \
      -print_final_stats=1 -artifact_prefix="artifacts/$target-" ${MEND_FUZZ_ARGS:-}; then
    failed+=("$target")
  fi
  for log in fuzz-*.log; do
    if [[ -e $log ]]; then mv "$log" "$target-$log"; fi
  done
done

if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (inputs in $build_dir/artifacts/)" >&2
  exit 1
fi
echo "fuzz: every target ran ${seconds}s without a finding"
