#!/usr/bin/env bash
# Runs every Cairn test: installs what is missing, builds with CMake and with
# Bazel, builds the container images (deploy/image/build.sh), runs the fuzzers for a bounded time (scripts/fuzz.sh: a clang build
# of fuzz/, FUZZ_TIME seconds per target, default 15), `bazel test //...` and
# ctest (which includes every benchmark's smoke run, label bench-smoke).
# Exits non-zero on any failure. ctest's summary is printed last.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh

echo "== CMake build"
scripts/build.sh

echo "== Container images (deploy/image; the build stage reuses the ccache just filled)"
deploy/image/build.sh

echo "== Fuzz (bounded)"
scripts/fuzz.sh --time "${FUZZ_TIME:-15}"

echo "== Bazel build and test"
BAZEL_FLAGS=()
if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then BAZEL_FLAGS+=(--define=cairn_cuda=off); fi
bazel build "${BAZEL_FLAGS[@]}" //...
bazel test "${BAZEL_FLAGS[@]}" //...

echo "== ctest"
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 900
