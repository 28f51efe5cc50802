#!/usr/bin/env bash
# The test command, in stages (each prints its time and the CPU time the machine was busy; a table of them all
# at the end):
#   1. setup-and-build: installs what is missing, builds mend in build
#      (scripts/setup.sh);
#   2. format: clang-format --dry-run -Werror over the C and C++ sources;
#   then, in the background at the lowest CPU priority (nice 19), so that
#   they take the cores the tests leave idle (the tests wait on networks,
#   processes and imports):
#      - asan-build: the LibTorch-free part (libmend.so with its C ABI,
#        mend-lighthouse and their tests) without LibTorch, with ASan and
#        UBSan, in build-asan: nothing outside the LibTorch front ends may
#        come to need LibTorch. It is compiled with clang, twice as fast as
#        GCC here, and with clang's thread-safety analysis on: a finding
#        fails the build (what scripts/thread-safety.sh checks on its own);
#      - tsan-build: the coordinator, data plane, round driver and group
#        tests with TSan (scripts/tsan-tests.sh --build-only, build-tsan);
#   while in the foreground:
#   3. tests: the whole suite in build (the Python tests under Debian's
#      torch 1.13 among them);
#   4. torch2: the Python tests again under torch 2.x, in the venv of
#      requirements/torch2.txt (scripts/torch2-venv.sh: made once, about
#      5 GB from PyPI, cached outside the clone by the file's content);
#   4b. torch2-wheel: the wheel (scripts/wheel.sh) installed with pip
#      --target into a fresh folder, run from the torch 2 venv: a two-learner
#      job (tests/python/wheel_job.py) and tests/python/test_allocators.py
#      (jemalloc, tcmalloc and glibc's checker preloaded), then those tests
#      again under Debian's torch 1.13;
#   5. background: waits for the three above; any failure fails the command
#      (with its log);
#   6. asan-tests: build-asan's unit, integration and multiprocess tests:
#      the sanitizers must report nothing;
#   7. tsan-tests: build-tsan's tests (scripts/tsan-tests.sh): no report.
# Environment: MEND_BUILD_DIR (build), MEND_ASAN_BUILD_DIR (build-asan),
# MEND_BUILD_TYPE, MEND_CMAKE_ARGS (see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
stage_start=$started
stages=()
# The machine's busy CPU time so far, in seconds (every process's, the
# background steps' too): /proc/stat's user, nice, system, irq, softirq and
# steal.
busy_seconds() {
  awk -v hz="$(getconf CLK_TCK)" '/^cpu /{print int(($2 + $3 + $4 + $7 + $8 + $9) / hz); exit}' /proc/stat
}
busy_start=$(busy_seconds)
busy_at_start=$busy_start
stage() {
  local now busy
  now=$(date +%s)
  busy=$(busy_seconds)
  echo "test.sh: stage '$1' took $((now - stage_start)) s (total $((now - started)) s), CPU busy $((busy - busy_start)) s"
  stages+=("$1 $((busy - busy_start)) $((now - stage_start))")
  stage_start=$now
  busy_start=$busy
}
work=$(mktemp -d)
background=""
cleanup() {
  if [[ -n $background ]]; then kill -- -"$background" 2>/dev/null || kill "$background" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

scripts/setup.sh  # (its apt step installs clang-format too)
stage setup-and-build
sources=$(find src include tests bench examples fuzz -name '*.cc' -o -name '*.h' -o -name '*.c' | sort)
# shellcheck disable=SC2086
clang-format --dry-run -Werror $sources
stage format

asan=${MEND_ASAN_BUILD_DIR:-build-asan}
# Each step's log and time in $work/background; the first failure ends the
# group (its log is printed when the foreground waits for it).
background_steps() {
  step() {
    local name=$1 began
    shift
    began=$(date +%s)
    if ! "$@" > "$work/background/$name.log" 2>&1; then
      echo "$name" > "$work/background/failed"
      return 1
    fi
    echo "$name $(($(date +%s) - began))" >> "$work/background/times"
  }
  # (A build-asan configured with another compiler is made again: CMake
  # keeps the compiler a build directory was first configured with.)
  if [[ -f $asan/CMakeCache.txt ]] && ! grep -q '^CMAKE_CXX_COMPILER:FILEPATH=.*clang++' "$asan/CMakeCache.txt"; then
    rm -rf "$asan"
  fi
  # shellcheck disable=SC2086
  step asan-configure env CC=clang CXX=clang++ cmake -S . -B "$asan" -G Ninja \
    -DCMAKE_BUILD_TYPE="${MEND_BUILD_TYPE:-RelWithDebInfo}" -DMEND_WITH_TORCH=OFF -DMEND_BUILD_BENCH=OFF \
    -DMEND_BUILD_PYTHON=OFF -DMEND_SANITIZE=address -DMEND_THREAD_SAFETY_ANALYSIS=ON ${MEND_CMAKE_ARGS:-}
  step asan-build cmake --build "$asan"
  step tsan-build scripts/tsan-tests.sh --build-only
}
mkdir -p "$work/background"
set -m  # (the group gets a process group of its own, which cleanup kills whole)
(
  renice -n 19 -p "$BASHPID" > /dev/null  # (what it starts inherits it)
  background_steps
) &
background=$!
set +m

ctest --test-dir "${MEND_BUILD_DIR:-build}" --output-on-failure -j2 --timeout 300
stage tests

torch2=$(scripts/torch2-venv.sh)
stage torch2-venv
# (test_allocators.py runs under torch 2 from the wheel, in torch2-wheel
# below, and under torch 1.13 from the build in the tests stage.)
PYTHONPATH="$PWD/${MEND_BUILD_DIR:-build}/python" PYTHONDONTWRITEBYTECODE=1 \
  "$torch2/bin/python" -m pytest -q -p no:cacheprovider --ignore tests/python/test_allocators.py \
  tests/python
stage torch2-tests
wheel_dir="$work/wheel"
mkdir -p "$wheel_dir"
MEND_DIST_DIR="$wheel_dir/dist" scripts/wheel.sh > /dev/null
"$torch2/bin/python" -m pip install -q --no-deps --no-index --disable-pip-version-check \
  --target "$wheel_dir/site" "$wheel_dir"/dist/mend-*.whl
(
  source=$PWD
  cd "$wheel_dir"
  export PYTHONPATH="$wheel_dir/site" PYTHONDONTWRITEBYTECODE=1
  "$torch2/bin/python" -c 'import mend, sys; assert mend._native.LIBRARY_PATH.startswith(sys.argv[1])' "$wheel_dir/site"
  "$torch2/bin/python" "$source/tests/python/wheel_job.py"
  "$torch2/bin/python" -m pytest -q -p no:cacheprovider "$source/tests/python/test_allocators.py"
  # and under Debian's torch 1.13, whose global scope holds the system's
  # copies of the libraries the wheel bundles (scripts/elf_symbolic.py)
  /usr/bin/python3 -m pytest -q -p no:cacheprovider "$source/tests/python/test_allocators.py"
)
rm -rf "$wheel_dir"
stage torch2-wheel

background_status=0
wait "$background" || background_status=$?
background=""
if [[ -f $work/background/times ]]; then
  while read -r name seconds; do
    echo "test.sh: background '$name' took $seconds s"
    stages+=("($name) - $seconds")
  done < "$work/background/times"
fi
if ((background_status != 0)); then
  failed=$(cat "$work/background/failed" 2>/dev/null || echo "the background group")
  cat "$work/background/$failed.log" 2>/dev/null || true
  echo "test.sh: background step '$failed' failed (its log is above)" >&2
  exit 1
fi
stage background-wait

HANG_DUMP_AFTER_S=540 ctest --test-dir "$asan" --output-on-failure -j2 --timeout 600
stage asan-tests

scripts/tsan-tests.sh
stage tsan-tests

echo "test.sh: every stage passed; seconds by stage (in parentheses: the background steps, beside the"
echo "stages; CPU: the machine's busy CPU seconds during the stage, the background steps' among them):"
printf '  %-20s %8s %6s\n' stage seconds CPU
for entry in "${stages[@]}"; do
  read -r name cpu seconds <<< "$entry"
  printf '  %-20s %8s %6s\n' "$name" "$seconds" "$cpu"
done
printf '  %-20s %8s %6s\n' total "$(($(date +%s) - started))" "$(($(busy_seconds) - ${busy_at_start:-0}))"
