#!/usr/bin/env bash
# Installs every Debian 12 package mend needs, builds it in ./build and
# installs it under /usr/local: the executables, libmend.so with
# include/mend/ and its CMake package (find_package(mend)), and the Python
# package into /usr/local/lib/python3.X/dist-packages.
# Idempotent and non-interactive; run as root on a fresh machine.
#   scripts/setup.sh            install + configure + build (Release with debug info)
# Environment: MEND_BUILD_DIR (default build), MEND_BUILD_TYPE (default RelWithDebInfo),
#              MEND_CMAKE_ARGS (extra arguments for cmake, e.g. -DMEND_SANITIZE=address).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config ccache git openssl clang clang-format lld
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev libssl-dev
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcpp-httplib-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev libxxhash-dev iproute2
  libtorch-dev libopenblas0-pthread fortunes gnuplot-nox
  python3-torch python3-numpy python3-pytest python3-venv python3-pip patchelf
  gdb stress-ng linux-perf
  libjemalloc2 libtcmalloc-minimal4  # (tests/python/test_allocators.py preloads them)
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

build_dir=${MEND_BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${MEND_BUILD_TYPE:-RelWithDebInfo}" \
  ${MEND_CMAKE_ARGS:-}
cmake --build "$build_dir"
# The mend and mend-lighthouse executables and the Python package `mend`
# (into the system's local site directory, so that /usr/bin/python3 -c
# "import mend" works from any directory).
cmake --install "$build_dir" > /dev/null
ldconfig
echo "setup: built $build_dir/mend; installed mend, mend-lighthouse, libmend with its headers and CMake package, and the Python package mend"
