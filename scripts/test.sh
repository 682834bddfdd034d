#!/usr/bin/env bash
# Runs every Cairn test: installs what is missing, builds with CMake and with
# Bazel, runs `bazel test //...` and ctest. Exits non-zero on any failure.
# ctest's summary is printed last.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh

echo "== CMake build"
scripts/build.sh

echo "== Bazel build and test"
BAZEL_FLAGS=()
if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then BAZEL_FLAGS+=(--define=cairn_cuda=off); fi
bazel build "${BAZEL_FLAGS[@]}" //...
bazel test "${BAZEL_FLAGS[@]}" //...

echo "== ctest"
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 900
