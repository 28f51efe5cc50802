#!/usr/bin/env bash
# ThreadSanitizer over mend's threaded parts that build without LibTorch:
# the coordinator (lighthouse core, server and agents over gRPC and UDP:
# tests/coordinator), the data plane (the communicator among threads, and
# peers SIGKILLed or SIGSTOPped in their own processes: tests/dataplane), and
# the round driver and its runner (also on a fake clock over fake services;
# a connect called off and left behind), heal stream,
# learner groups and their round services (tests/reducer; its
# LibTorch tests are not built here). Builds only those tests, with
# -DMEND_SANITIZE=thread, in build-tsan, and runs their unit, integration and
# multiprocess tests.
#
# Fails on a test that fails twice (a test may run once more: TSan slows the
# timing-bound ones several fold; the plain build's suite runs them without
# a retry) and on any TSan report, from any process, even one whose test
# passed on its second run: reports go to files (log_path), counted at the
# end. The runtime's options and the suppressions for libraries outside
# mend: tests/sanitizers/default_options.c and tests/sanitizers/tsan.supp.
#
#   scripts/tsan-tests.sh               build, then run
#   scripts/tsan-tests.sh --build-only  build (the test command does this
#                                       beside the other stages' tests)
# Environment: MEND_TSAN_BUILD_DIR (build-tsan), MEND_BUILD_TYPE
# (RelWithDebInfo), MEND_CMAKE_ARGS (extra configure arguments).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${MEND_TSAN_BUILD_DIR:-build-tsan}
build_only=false
case "${1:-}" in
  "") ;;
  --build-only) build_only=true ;;
  *) echo "tsan-tests.sh: unknown argument '$1' (known: --build-only)" >&2; exit 2 ;;
esac

# shellcheck disable=SC2086
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="${MEND_BUILD_TYPE:-RelWithDebInfo}" -DMEND_WITH_TORCH=OFF \
  -DMEND_BUILD_BENCH=OFF -DMEND_BUILD_PYTHON=OFF -DMEND_SANITIZE=thread ${MEND_CMAKE_ARGS:-} > /dev/null
# (dataplane_process_test brings mend-lighthouse and dataplane_member.)
cmake --build "$dir" --target coordinator_state_test lighthouse_server_test communicator_test \
  dataplane_process_test heal_stream_test round_driver_test learner_group_test group_pulse_test \
  round_driver_clock_test group_round_services_test store_test control_handler_test \
  made_all_reduce_test round_scale_test round_runner_test secure_dataplane_test
if $build_only; then
  exit 0
fi

reports=$(mktemp -d)
trap 'rm -rf "$reports"' EXIT
status=0
# Every test of the binaries built above; the others registered in this
# tree (those of binaries not built, the C ABI's, the installed package's)
# are left out, and so is CommunicatorTest.AbortAmidCompletingTransfers...:
# it aborts while data flows, so receives are called off mid-write, and
# Gloo's wait for its device thread to let go of such a buffer is invisible
# to TSan (tests/sanitizers/tsan.supp, section 3). About 1 run in 60 TSan
# then cannot restore the device thread's stack, and the suppression cannot
# match. (Run alone under TSan it found the race in Wait that it guards:
# 2 reports in 50 runs before the fix, none of that kind after.)
# (A hang prints its stacks before the 600 s timeout: tests/test_util/hang_dump.cc.)
HANG_DUMP_AFTER_S=540 TSAN_OPTIONS="log_path=$reports/tsan" ctest --test-dir "$dir" --output-on-failure -j2 --timeout 600 \
  --repeat until-pass:2 -E '_NOT_BUILT|^CApi\.|^InstalledPackage\.|^CommunicatorTest\.AbortAmidCompletingTransfers' || status=$?

shopt -s nullglob
found=("$reports"/tsan.*)
if ((${#found[@]} > 0)); then
  cat "${found[@]}"
  echo "tsan-tests.sh: ${#found[@]} process(es) with ThreadSanitizer reports (above)" >&2
  exit 1
fi
if ((status != 0)); then
  echo "tsan-tests.sh: tests failed (ctest exit $status)" >&2
  exit "$status"
fi
echo "tsan-tests.sh: no ThreadSanitizer reports"
