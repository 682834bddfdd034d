#!/usr/bin/env bash
# Runs every Cairn test: installs what is missing, builds with CMake and with
# Bazel, builds the container images (deploy/image/build.sh), runs the fuzzers for a bounded time (scripts/fuzz.sh: a clang build
# of fuzz/, FUZZ_TIME seconds per target, default 15), `bazel test //...` and
# ctest (which includes every benchmark's smoke run, label bench-smoke).
# Bazel keeps a disk cache in $CAIRN_BAZEL_DISK_CACHE (default
# ~/.cache/cairn-bazel-disk, emptied when over $CAIRN_BAZEL_DISK_CACHE_MB,
# default 8192). The images and their build layers go to a podman store of
# their own, $CAIRN_CONTAINER_STORE (default ~/.cache/cairn-containers,
# emptied when over $CAIRN_CONTAINER_STORE_MB, default 20480), so a rerun on a
# machine that keeps ~/.cache rebuilds only the layers whose inputs changed;
# a CONTAINERS_STORAGE_CONF already set is used instead.
# Exits non-zero on any failure. ctest's summary is printed last, then each
# phase's wall time.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase's wall time, printed as it ends and summed up at exit.
T0=$SECONDS
PHASE_START=$SECONDS PHASE_NAME="install_deps" PHASES=()
phase() {
  PHASES+=("$(printf '%-28s %5d s' "$PHASE_NAME" $((SECONDS - PHASE_START)))")
  PHASE_NAME=$1 PHASE_START=$SECONDS
  echo "== $1"
}
summary() {
  PHASES+=("$(printf '%-28s %5d s' "$PHASE_NAME" $((SECONDS - PHASE_START)))")
  echo "== phase times (total $((SECONDS - T0)) s)"
  printf '  %s\n' "${PHASES[@]}"
}
trap summary EXIT

scripts/install_deps.sh

phase "CMake build"
scripts/build.sh

phase "Container images"
if [[ -z "${CONTAINERS_STORAGE_CONF:-}" ]]; then
  STORE=${CAIRN_CONTAINER_STORE:-$HOME/.cache/cairn-containers}
  if [[ -d "$STORE/storage" ]] &&
     (($(du -sm "$STORE/storage" | cut -f1) > ${CAIRN_CONTAINER_STORE_MB:-20480})); then
    echo "test.sh: emptying $STORE (over ${CAIRN_CONTAINER_STORE_MB:-20480} MB)"
    findmnt -rn -o TARGET | grep "^$STORE/" | xargs -r umount -l || true
    rm -rf "$STORE/storage"
  fi
  mkdir -p "$STORE/storage"
  printf '[storage]\ndriver = "overlay"\ngraphroot = "%s"\nrunroot = "%s"\n' \
    "$STORE/storage" /run/cairn-containers > "$STORE/storage.conf"
  # Exported: the image tests (ctest) run their containers from this store.
  export CONTAINERS_STORAGE_CONF="$STORE/storage.conf"
fi
deploy/image/build.sh

phase "Fuzz (bounded)"
scripts/fuzz.sh --time "${FUZZ_TIME:-15}"

phase "Bazel build"
BAZEL_FLAGS=()
if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then BAZEL_FLAGS+=(--define=cairn_cuda=off); fi
# Bazel's disk cache, like ccache for the CMake build: a rerun on the same
# machine recompiles and retests only what changed. Emptied past its cap
# (this Bazel has no disk-cache GC).
BAZEL_DISK_CACHE=${CAIRN_BAZEL_DISK_CACHE:-$HOME/.cache/cairn-bazel-disk}
if [[ -d "$BAZEL_DISK_CACHE" ]] &&
   (($(du -sm "$BAZEL_DISK_CACHE" | cut -f1) > ${CAIRN_BAZEL_DISK_CACHE_MB:-8192})); then
  echo "test.sh: emptying $BAZEL_DISK_CACHE (over ${CAIRN_BAZEL_DISK_CACHE_MB:-8192} MB)"
  rm -rf "$BAZEL_DISK_CACHE"
fi
BAZEL_FLAGS+=(--disk_cache="$BAZEL_DISK_CACHE")
bazel build "${BAZEL_FLAGS[@]}" //...
phase "Bazel test"
bazel test "${BAZEL_FLAGS[@]}" //...

phase "ctest"
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 900
