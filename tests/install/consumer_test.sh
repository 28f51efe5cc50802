#!/usr/bin/env bash
# Installs the build into a temporary prefix, builds the out-of-tree consumer
# against it with find_package(mend), and runs it.
#   consumer_test.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
test -f "$work/prefix/lib/cmake/mend/mendConfig.cmake"
test -f "$work/prefix/include/mend/reducer.h"
test ! -e "$work/prefix/include/mend/subprocess.h"
cmake -S "$here/consumer" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
LD_LIBRARY_PATH="$work/prefix/lib" "$work/build/consumer"
