#!/usr/bin/env bash
# Installs the build into a temporary prefix, checks that the installed
# libmend.so exports mend.h's functions alone and needs no LibTorch, then
# builds against it as a user's projects would: the C program of
# tests/capi with the C compiler against the installed mend/mend.h and
# libmend.so, and (built with LibTorch) the out-of-tree CMake consumer with
# find_package(mend) and mend::torch; runs both.
#   consumer_test.sh BUILD_DIR WITH_TORCH(ON|OFF)
set -euo pipefail
build=$1
with_torch=${2:-ON}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
test -f "$work/prefix/lib/cmake/mend/mendConfig.cmake"
test -f "$work/prefix/include/mend/mend.h"
test ! -e "$work/prefix/include/mend/subprocess.h"

"$here/../capi/symbols_test.sh" "$work/prefix/lib/libmend.so" "$work/prefix/include/mend/mend.h"
# (MEND_CONSUMER_FLAGS: a sanitizer build's library needs its runtime in the program too.)
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Wpedantic -Werror ${MEND_CONSUMER_FLAGS:-} -I"$work/prefix/include" \
  "$here/../capi/two_learners.c" -L"$work/prefix/lib" -lmend -o "$work/c_consumer"
LD_LIBRARY_PATH="$work/prefix/lib" "$work/c_consumer"

case "$with_torch" in ON|on|1|TRUE|true) ;; *) exit 0 ;; esac
test -f "$work/prefix/include/mend/reducer.h"
# The public API alone: every installed header finds the mend headers it
# includes, and mend's own (here the outer synchronizer's) are not installed.
test ! -e "$work/prefix/include/mend/outer_sync.h"
for header in "$work"/prefix/include/mend/*.h; do
  while read -r included; do
    test -f "$work/prefix/include/mend/$included" ||
      { echo "consumer_test: installed $(basename "$header") includes mend/$included, not installed" >&2; exit 1; }
  done < <(sed -n 's|^#include "mend/\(.*\)"$|\1|p' "$header")
done
cmake -S "$here/consumer" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
LD_LIBRARY_PATH="$work/prefix/lib" "$work/build/consumer"
