#!/usr/bin/env bash
# The test command, in stages (each prints its time):
#   1. setup-and-build: installs what is missing, builds mend in build
#      (scripts/setup.sh);
#   2. format: clang-format --dry-run -Werror over the C and C++ sources;
#   3. thread-safety: clang's thread-safety analysis over the LibTorch-free
#      sources, findings are errors (scripts/thread-safety.sh, build-tsa);
#   4. tests: the whole suite in build (the Python tests under Debian's
#      torch 1.13 among them);
#   5. torch2: the Python tests again under torch 2.x, in the venv of
#      requirements/torch2.txt (scripts/torch2-venv.sh: made once, about
#      5 GB from PyPI, cached outside the clone by the file's content);
#   5b. torch2-wheel: the wheel (scripts/wheel.sh) installed with pip
#      --target into a fresh folder, run from the torch 2 venv: a two-learner
#      job (tests/python/wheel_job.py) and tests/python/test_allocators.py
#      (jemalloc, tcmalloc and glibc's checker preloaded);
#   6. asan: builds the LibTorch-free part (libmend.so with its C ABI,
#      mend-lighthouse and their tests) without LibTorch, with ASan and
#      UBSan, in build-asan, and runs its unit, integration and
#      multiprocess tests: nothing outside the LibTorch front ends may come
#      to need LibTorch, and the sanitizers must report nothing;
#   7. tsan: the coordinator, data plane, round driver and group tests
#      built with TSan (scripts/tsan-tests.sh, build-tsan): no report.
# Environment: MEND_BUILD_DIR (build), MEND_ASAN_BUILD_DIR (build-asan),
# MEND_BUILD_TYPE, MEND_CMAKE_ARGS (see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
stage_start=$started
stage() {
  local now
  now=$(date +%s)
  echo "test.sh: stage '$1' took $((now - stage_start)) s (total $((now - started)) s)"
  stage_start=$now
}

scripts/setup.sh  # (its apt step installs clang-format too)
stage setup-and-build
sources=$(find src include tests bench examples fuzz -name '*.cc' -o -name '*.h' -o -name '*.c' | sort)
# shellcheck disable=SC2086
clang-format --dry-run -Werror $sources
stage format

scripts/thread-safety.sh
stage thread-safety

ctest --test-dir "${MEND_BUILD_DIR:-build}" --output-on-failure -j2 --timeout 300
stage tests

torch2=$(scripts/torch2-venv.sh)
stage torch2-venv
PYTHONPATH="$PWD/${MEND_BUILD_DIR:-build}/python" PYTHONDONTWRITEBYTECODE=1 \
  "$torch2/bin/python" -m pytest -q -p no:cacheprovider tests/python
stage torch2-tests
wheel_dir=$(mktemp -d)
trap 'rm -rf "$wheel_dir"' EXIT
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
)
rm -rf "$wheel_dir"
stage torch2-wheel

asan=${MEND_ASAN_BUILD_DIR:-build-asan}
# shellcheck disable=SC2086
cmake -S . -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE="${MEND_BUILD_TYPE:-RelWithDebInfo}" -DMEND_WITH_TORCH=OFF \
  -DMEND_BUILD_BENCH=OFF -DMEND_BUILD_PYTHON=OFF -DMEND_SANITIZE=address ${MEND_CMAKE_ARGS:-} > /dev/null
cmake --build "$asan"
stage asan-build
HANG_DUMP_AFTER_S=540 ctest --test-dir "$asan" --output-on-failure -j2 --timeout 600
stage asan-tests

scripts/tsan-tests.sh
stage tsan
