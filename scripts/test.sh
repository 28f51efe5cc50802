#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs the whole
# suite; then builds mend without LibTorch (libmend.so with its C ABI,
# mend-lighthouse, the Python package) in build-core and runs its suite, so
# that nothing outside the LibTorch front ends comes to need LibTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${MEND_BUILD_DIR:-build}" --output-on-failure -j2 --timeout 300
core=${MEND_CORE_BUILD_DIR:-build-core}
# shellcheck disable=SC2086
cmake -S . -B "$core" -G Ninja -DCMAKE_BUILD_TYPE="${MEND_BUILD_TYPE:-RelWithDebInfo}" -DMEND_WITH_TORCH=OFF \
  -DMEND_BUILD_BENCH=OFF ${MEND_CMAKE_ARGS:-} > /dev/null
cmake --build "$core"
ctest --test-dir "$core" --output-on-failure -j2 --timeout 300
