#!/usr/bin/env bash
# Configures and builds Cairn with CMake + Ninja into ${BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
# ccache when installed, with paths hashed relative to the source tree: the
# container image's build stage (deploy/image) shares the cache.
LAUNCHER=()
if command -v ccache >/dev/null && [[ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]]; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export CCACHE_COMPILERCHECK=${CCACHE_COMPILERCHECK:-content}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-RelWithDebInfo} "${LAUNCHER[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
